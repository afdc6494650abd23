"""Write numpy arrays as a safetensors file without a framework.

Summary captures write float64 sketches from torch and MLX processes alike; MLX cannot
store float64 and the ``safetensors`` package may be missing beside it, while the
format is an 8-byte length, a JSON header and the raw little-endian bytes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

_DTYPES = {"float64": "F64", "float32": "F32", "int64": "I64"}


def write_arrays(path: Path, arrays: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Write ``arrays`` (float64/float32/int64 numpy arrays) to ``path``; returns
    ``{key: {"shape", "dtype"}}`` of what was written."""
    import numpy as np

    header: dict[str, Any] = {}
    blobs: list[bytes] = []
    offset = 0
    for key, array in arrays.items():
        value = np.ascontiguousarray(array)
        name = _DTYPES.get(str(value.dtype))
        if name is None:
            raise TypeError(f"{key}: cannot write dtype {value.dtype}")
        data = value.astype(value.dtype.newbyteorder("<"), copy=False).tobytes()
        header[key] = {
            "dtype": name,
            "shape": list(value.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-aligned, as the format recommends
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for blob in blobs:
            fh.write(blob)
    return {
        key: {"shape": entry["shape"], "dtype": entry["dtype"]} for key, entry in header.items()
    }
