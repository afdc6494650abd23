"""mldbg: a debugger for PyTorch and MLX model code.

Importing this package must stay cheap and standard-library only: it is imported inside
the debugged process (by the agent, and by every ``debug_checkpoint`` call), whose
interpreter may have nothing of mldbg's dependencies.  So the public names are loaded on
first use (PEP 562): ``import mldbg`` alone imports no submodule.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the submodule that defines it
_PUBLIC = {
    "Capture": "capture",
    "capture": "capture",
    "captured_tensor": "compare.read.load",
    "first_nonfinite": "compare.culprit.nonfinite",
    "first_wrong_line": "client.api",
    "module_table": "compare.report.table",
    "CompareInputError": "compare",
    "Comparison": "compare",
    "ReplayResult": "compare",
    "replay": "compare",
    "compare": "compare",
    "debug_checkpoint": "store.checkpoint",
    "debug_load": "store.tensors",
    "debug_save": "store.tensors",
    "debug_clear": "store.tensors",
    "debug_show_all": "store.tensors",
    "tripped": "agent.tripwire",
}

__all__ = [
    "Capture",
    "CompareInputError",
    "Comparison",
    "ReplayResult",
    "__version__",
    "capture",
    "captured_tensor",
    "compare",
    "debug_checkpoint",
    "debug_clear",
    "debug_load",
    "debug_save",
    "debug_show_all",
    "first_nonfinite",
    "first_wrong_line",
    "module_table",
    "replay",
    "tripped",
]

if TYPE_CHECKING:
    from .agent.tripwire import tripped
    from .capture import Capture, capture
    from .client.api import first_wrong_line
    from .compare import CompareInputError, Comparison, ReplayResult, compare
    from .compare.culprit.nonfinite import first_nonfinite
    from .compare.read.load import captured_tensor
    from .compare.replay import replay
    from .compare.report.table import module_table
    from .store.checkpoint import debug_checkpoint
    from .store.tensors import debug_clear, debug_load, debug_save, debug_show_all


class _Package(types.ModuleType):
    """``mldbg.capture`` and ``mldbg.compare`` are functions named like their submodules.

    Importing a submodule binds the package attribute to the module, after any code of
    ours could rebind it; so the function is looked up here, on access.
    """

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return getattr(value, name)
        return value


_SHADOWED = frozenset({"capture", "compare"})
sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mldbg' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
