"""Write a safetensors file from raw buffers, without a framework and without copies.

The format is an 8-byte length, a JSON header and the raw little-endian bytes of each
tensor, back to back.  Writing it directly has two uses:

* Summary captures write float64 sketches from torch and MLX processes alike; MLX
  cannot store float64 and the ``safetensors`` package may be missing beside it.
* Full captures write every module's tensors: ``safetensors.torch.save_file`` first
  builds each tensor's bytes as a Python ``bytes`` (a copy made holding the GIL), which
  made the background writer compete with the model's own thread.  Here each tensor is
  handed to ``os.writev`` as a view of its memory: one system call per file, during which
  the GIL is released, so the model runs on while the kernel copies into the page cache.

Tensors are laid out in the order given (readers go by the header's offsets), and the
data starts 8-aligned, as the format recommends.  The same inputs give the same bytes,
whichever thread writes them.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from .records import TensorInfo

if TYPE_CHECKING:
    import numpy as np

_NUMPY = {"float64": "F64", "float32": "F32", "int64": "I64"}
_IOV_MAX = 512  # buffers per writev call (Linux allows 1024)


class _HeaderEntry(TypedDict):
    dtype: str
    shape: list[int]
    data_offsets: list[int]


def write_buffers(
    path: Path,
    # The buffer: numpy's stubs do not declare the buffer protocol, so it binds no type.
    tensors: Sequence[tuple[str, str, list[int], Any]],
) -> dict[str, TensorInfo]:
    """Write ``(key, safetensors dtype, shape, buffer)`` tensors to ``path``.

    ``buffer`` is anything exposing the buffer protocol over exactly the tensor's bytes,
    C-contiguous (a numpy array, a ``memoryview``); it is not copied.  Returns
    ``{key: {"shape", "dtype"}}`` of what was written.
    """
    header: dict[str, _HeaderEntry] = {}
    views: list[memoryview] = []
    offset = 0
    for key, dtype, shape, buffer in tensors:
        view = memoryview(buffer).cast("B")  # raises for a non-contiguous buffer
        header[key] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + view.nbytes],
        }
        views.append(view)
        offset += view.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    pieces = [memoryview(struct.pack("<Q", len(raw)) + raw), *(v for v in views if v.nbytes)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _writev_all(fd, pieces)
    finally:
        os.close(fd)
    return {
        key: {"shape": entry["shape"], "dtype": entry["dtype"]} for key, entry in header.items()
    }


def _writev_all(fd: int, pieces: list[memoryview]) -> None:
    """``os.writev`` until every byte is written (a call may write only part of them)."""
    while pieces:
        batch = pieces[:_IOV_MAX]
        written = os.writev(fd, batch)
        done = 0
        while done < len(batch) and written >= batch[done].nbytes:
            written -= batch[done].nbytes
            done += 1
        rest = pieces[done:]
        if written:
            rest[0] = rest[0][written:]
        pieces = rest


def write_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> dict[str, TensorInfo]:
    """Write ``arrays`` (float64/float32/int64 numpy arrays) to ``path``; returns
    ``{key: {"shape", "dtype"}}`` of what was written."""
    import numpy as np

    tensors = []
    for key, array in arrays.items():
        value = np.ascontiguousarray(array)
        name = _NUMPY.get(str(value.dtype))
        if name is None:
            raise TypeError(f"{key}: cannot write dtype {value.dtype}")
        value = value.astype(value.dtype.newbyteorder("<"), copy=False)
        tensors.append((key, name, list(value.shape), value.reshape(-1).view(np.uint8)))
    return write_buffers(path, tensors)
