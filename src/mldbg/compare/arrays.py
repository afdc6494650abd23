"""Open stored tensors as numpy memory maps: nothing is read until a chunk is needed.

safetensors files are mapped from their header's offsets (bf16 and fp8 through
ml_dtypes, which numpy lacks), ``.npy`` files through ``np.load(mmap_mode="r")``.
Mapping instead of loading is what lets a comparison stream a model bigger than memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..capture.safetensors_header import CorruptTensorFile, read_header

_NUMPY_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
    "C64": "<c8",
}
_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def numpy_dtype(name: str) -> Any:
    import numpy as np

    if name in _NUMPY_DTYPES:
        return np.dtype(_NUMPY_DTYPES[name])
    if name in _ML_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, _ML_DTYPES[name]))
    raise CorruptTensorFile(f"unsupported safetensors dtype {name!r}")


def dtype_name(dtype: Any) -> str:
    """The safetensors name of a numpy dtype (``.npy`` sources report the same names)."""
    import numpy as np

    dtype = np.dtype(dtype)
    for name, code in _NUMPY_DTYPES.items():
        if np.dtype(code) == dtype:
            return name
    for name, attr in _ML_DTYPES.items():
        if dtype.name == attr:
            return name
    return str(dtype)


def map_safetensors(path: Path, key: str) -> Any:
    """The tensor ``key`` of a safetensors file, memory-mapped read-only."""
    import numpy as np

    header, start = read_header(path)
    entry = header.get(key)
    if not isinstance(entry, dict):
        raise CorruptTensorFile(f"{path} holds no tensor {key!r}")
    dtype = numpy_dtype(entry["dtype"])
    shape = tuple(int(n) for n in entry["shape"])
    begin, end = (int(n) for n in entry["data_offsets"])
    count = 1
    for n in shape:
        count *= n
    if count * dtype.itemsize != end - begin:
        raise CorruptTensorFile(
            f"{path}: tensor {key!r} has {end - begin} bytes for shape {list(shape)} {entry['dtype']}"
        )
    if count == 0:
        return np.empty(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=shape)


def map_npy(path: Path) -> Any:
    import numpy as np

    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptTensorFile(f"{path} is not a readable .npy file: {exc}") from None
    if array.dtype.hasobject:
        raise CorruptTensorFile(f"{path} holds Python objects, not numbers")
    return array


def npy_header(path: Path) -> dict[str, Any]:
    """Shape and dtype of a ``.npy`` file, from its header only."""
    array = map_npy(path)
    return {"shape": list(array.shape), "dtype": dtype_name(array.dtype)}
