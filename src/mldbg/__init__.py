"""mldbg: a debugger for PyTorch and MLX model code.

Importing this package must stay cheap and standard-library only: it is imported inside
the debugged process, whose interpreter may have nothing of mldbg's dependencies.
"""

from .capture import Capture, capture
from .checkpoint import debug_checkpoint
from .compare import CompareInputError, Comparison, ReplayResult, compare, replay
from .tensors import debug_load, debug_save

__version__ = "0.1.0"

__all__ = [
    "Capture",
    "CompareInputError",
    "Comparison",
    "ReplayResult",
    "__version__",
    "capture",
    "compare",
    "debug_checkpoint",
    "debug_load",
    "debug_save",
    "replay",
]
