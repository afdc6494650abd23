"""One captured tensor by its entry name: ``mldbg.captured_tensor(source, entry)``.

The porting loop compares a port's live value with the reference's captured one, paused
in the port (``eval``) or in a script.  Without this an agent read ``index.jsonl`` to find
the file and key; here the entry name ``compare`` prints (``model.layers.0.self_attn#0.out.0``)
is enough, and ``source`` is anything ``compare`` takes: a capture name, ``RUN/NAME``, a
run id, a capture or run directory (the reference's, in another repository), a tensor file.
"""

from __future__ import annotations

import difflib
import inspect
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

FRAMEWORKS = ("torch", "mlx", "numpy")


def captured_tensor(
    source: str | Path, entry: str, *, to: str | None = None, home: str | Path | None = None
) -> Any:
    """The tensor ``source`` recorded as ``entry``, bit for bit (dtype kept, bf16 too).

    ``to``: ``"torch"``, ``"mlx"`` or ``"numpy"``; left out, the caller's framework (what
    its module imports; both: the capture's own), else numpy.  ``home``: the run store a
    capture name is looked up in (default ``$MLDBG_HOME`` or ``./.mldbg``).  A tuple's
    first element answers to the bare name (``…#0.out`` finds ``…#0.out.0``).  An unknown
    entry raises ``KeyError`` naming the closest ones.
    """
    from ...store.runs import mldbg_home
    from .sources import open_source

    if to is not None and to not in FRAMEWORKS:
        raise ValueError(f"to={to!r}: use 'torch', 'mlx' or 'numpy'")
    store = Path(home).expanduser().resolve() if home is not None else mldbg_home()
    found = open_source(str(source), store)
    by_name = {e.name: e for e in found.entries}
    item = by_name.get(entry) or by_name.get(entry + ".0")
    if item is None:
        close = difflib.get_close_matches(entry, list(by_name), n=8, cutoff=0.5)
        listed = close or sorted(by_name)[:8]
        raise KeyError(
            f"{found.label} ({found.path}) has no entry {entry!r}; "
            f"{'closest' if close else 'some of its'} entries: {', '.join(listed)}"
            f" ({len(by_name)} in all)"
        )
    framework = to or _caller_framework(found.meta.get("framework"))
    # The file's header first, through mldbg's own reader: a FIFO there blocked the
    # framework's loader forever, and a file that holds another shape or dtype than the
    # index says is corrupt (CorruptTensorFile), not the framework's own complaint.
    found.verify(item)
    if item.file.suffix == ".safetensors" and framework == "torch":
        from safetensors import safe_open

        with safe_open(str(item.file), framework="pt") as fh:
            return fh.get_tensor(item.key)
    if item.file.suffix == ".safetensors" and framework == "mlx":
        import mlx.core as mx

        loaded: Any = mx.load(str(item.file))
        return loaded[item.key]
    array = _numpy(found.load(item))
    if framework == "numpy":
        return array
    return _from_numpy(array, framework)


def _numpy(mapped: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    import numpy as np

    return np.array(mapped, copy=True)  # owns its memory: the file may go away


def _from_numpy(array: npt.NDArray[np.generic], framework: str) -> Any:
    """numpy to torch or MLX keeping the bits: 16-bit floats numpy only knows through
    ml_dtypes travel as their raw uint16."""
    raw = array.dtype.name == "bfloat16"
    if framework == "torch":
        import torch

        if raw:
            return torch.from_numpy(array.view("uint16").copy()).view(torch.bfloat16)
        return torch.from_numpy(array)
    import mlx.core as mx

    if raw:
        return mx.array(array.view("uint16")).view(mx.bfloat16)
    return mx.array(array)


def _caller_framework(captured: str | None) -> str:
    """The framework the calling module imports (both: the capture's own), else numpy."""
    frame = inspect.currentframe()
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    found: set[str] = set()
    if frame is not None:
        for value in list(frame.f_globals.values()) + list(frame.f_locals.values()):
            name = getattr(value, "__name__", "") if inspect.ismodule(value) else ""
            root = name.split(".", 1)[0]
            if root in ("torch", "mlx") and root in sys.modules:
                found.add(root)
    if len(found) == 1:
        return found.pop()
    if len(found) == 2:
        return captured if captured in found else "torch"
    return "numpy"
