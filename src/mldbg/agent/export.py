"""A paused session's value written out, so the daemon can set it beside another one's.

``eval EXPR --against SESSION`` evaluates one expression in two paused processes (the
reference and the port) and answers their difference; the values live in two processes,
so each writes its value as a ``.npy`` file the daemon reads.  Values, not bits: 16-bit
and 8-bit floats are widened to float32 (exactly), so numpy alone can read every file.

Standard library only at import; the value's framework (and numpy) are already loaded
when there is a tensor to write.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..errors import TOO_LARGE, CommandError

MAX_ELEMENTS = 1 << 26  # 64M elements (256 MB as float32): larger values are not exported


def export_value(value: object, path: str) -> dict[str, object]:
    """Write ``value`` (a torch tensor, MLX array or numpy array) to ``path``; what was done."""
    module = type(value).__module__ or ""
    try:
        if module.startswith("torch") and hasattr(value, "detach"):
            array = _from_torch(value)
        elif module.startswith("mlx") and type(value).__name__ == "array":
            array = _from_mlx(value)
        elif module.startswith("numpy") and hasattr(value, "dtype"):
            array = _widened(value)
        else:
            return {"written": False, "reason": "not a tensor"}
    except CommandError as exc:  # too large: the reason is the whole story
        return {"written": False, "reason": exc.message}
    except Exception as exc:
        return {"written": False, "reason": f"{type(exc).__name__}: {exc}"[:500]}
    numpy = sys.modules["numpy"]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        numpy.save(fh, array, allow_pickle=False)
    return {"written": True, "path": path}


def _check_size(count: int) -> None:
    if count > MAX_ELEMENTS:
        raise CommandError(
            f"{count} elements: over the {MAX_ELEMENTS} a side-by-side difference reads",
            TOO_LARGE,
        )


def _from_torch(t: Any) -> Any:
    torch = sys.modules["torch"]
    _check_size(int(t.numel()))
    data = t.detach()
    if data.is_floating_point() and data.element_size() < 4:
        data = data.to(torch.float32)
    elif data.dtype == torch.bool:
        data = data.to(torch.uint8)
    return data.cpu().contiguous().numpy()


def _from_mlx(a: Any) -> Any:
    mx = sys.modules["mlx.core"]
    numpy = __import__("numpy")
    _check_size(int(a.size))
    if mx.issubdtype(a.dtype, mx.floating) and a.dtype.size < 4:
        a = a.astype(mx.float32)
    return numpy.array(a)


def _widened(a: Any) -> Any:
    numpy = sys.modules["numpy"]
    _check_size(int(a.size))
    if a.dtype.kind == "f" and a.dtype.itemsize < 4 or a.dtype.kind == "V":
        return a.astype(numpy.float32)
    return numpy.ascontiguousarray(a)
