"""Open stored tensors as numpy memory maps: nothing is read until a chunk is needed.

safetensors files are mapped from their header's offsets (bf16 and fp8 through
ml_dtypes, which numpy lacks), ``.npy`` files through ``np.load(mmap_mode="r")``.
Mapping instead of loading is what lets a comparison stream a model bigger than memory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from ... import dtypes
from ...capture.safetensors_header import CorruptTensorFile, read_header
from ...errors import UnsupportedDtype

if TYPE_CHECKING:  # numpy is imported where an array is read, not with this module
    import numpy as np
    import numpy.typing as npt


class TensorHeader(TypedDict):
    """What a file's header says of one tensor, in safetensors dtype names."""

    shape: list[int]
    dtype: str


def numpy_dtype(name: str) -> np.dtype[np.generic]:
    """The numpy dtype of a safetensors code, little-endian as the files store it (bf16 and
    the fp8s through ml_dtypes); formats narrower than a byte cannot be mapped."""
    import numpy as np

    found = dtypes.BY_CODE.get(name)
    if found is not None and found.bits % 8 == 0:
        if hasattr(np, found.numpy):
            return np.dtype(found.numpy).newbyteorder("<")
        import ml_dtypes

        if hasattr(ml_dtypes, found.numpy):
            return np.dtype(getattr(ml_dtypes, found.numpy))
    raise UnsupportedDtype(f"dtype {name} cannot be compared (numpy has no such type)")


def dtype_name(dtype: npt.DTypeLike) -> str:
    """The safetensors name of a numpy dtype (``.npy`` sources report the same names)."""
    import numpy as np

    dtype = np.dtype(dtype)
    found = dtypes.lookup(dtype.name)
    return found.code if found is not None else str(dtype)


def map_safetensors(
    path: Path, key: str, expect: TensorHeader | None = None
) -> npt.NDArray[np.generic]:
    """The tensor ``key`` of a safetensors file, memory-mapped read-only.  ``expect``:
    the shape and dtype an index says the file holds; a file that holds another is
    corrupt (compared as it stands, it would be a divergence, or a crash)."""
    import numpy as np

    header, start = read_header(path)
    entry = header.get(key)
    if not isinstance(entry, dict):
        raise CorruptTensorFile(f"{path} holds no tensor {key[:200]!r}")
    check_expected(path, key, entry, expect)
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


def check_expected(
    path: Path, key: str, entry: dict[str, Any], expect: TensorHeader | None
) -> None:
    """:class:`CorruptTensorFile` when the file's header says another shape or dtype
    than ``expect`` (what the capture's index says of it)."""
    if expect is None:
        return
    found = (list(entry.get("shape", [])), entry.get("dtype"))
    if found != (list(expect["shape"]), expect["dtype"]):
        raise CorruptTensorFile(
            f"{path}: tensor {key[:200]!r} is {str(found[0])[:100]} {found[1]} in the file "
            f"but {str(expect['shape'])[:100]} {expect['dtype'][:20]} in the capture's index"
        )


def header_of(path: Path, key: str) -> dict[str, Any]:
    """What the file's header says of tensor ``key`` (corrupt when it holds none)."""
    header, _ = read_header(path)
    entry = header.get(key)
    if not isinstance(entry, dict):
        raise CorruptTensorFile(f"{path} holds no tensor {key[:200]!r}")
    return entry


def map_npy(path: Path) -> npt.NDArray[np.generic]:
    import numpy as np

    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptTensorFile(f"{path} is not a readable .npy file: {exc}") from None
    if array.dtype.hasobject:
        raise CorruptTensorFile(f"{path} holds Python objects, not numbers")
    return array


def npy_header(path: Path) -> TensorHeader:
    """Shape and dtype of a ``.npy`` file, from its header only."""
    array = map_npy(path)
    return {"shape": list(array.shape), "dtype": dtype_name(array.dtype)}


def _npz_members(path: Path) -> dict[str, Any]:
    """``{key: ZipInfo}`` of an ``.npz`` file's arrays (``np.savez`` names them ``key.npy``)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return {
                info.filename[: -len(".npy")]: info
                for info in archive.infolist()
                if info.filename.endswith(".npy")
            }
    except (OSError, zipfile.BadZipFile) as exc:
        raise CorruptTensorFile(f"{path} is not a readable .npz file: {exc}") from None


def _read_npy_header(handle: Any, where: str) -> tuple[tuple[int, ...], bool, Any]:
    import numpy as np

    try:
        version = np.lib.format.read_magic(handle)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0  # versions 2 and 3 (utf-8 names)
        )
        shape, fortran, dtype = read(handle)
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptTensorFile(f"{where} is not a readable .npy array: {exc}") from None
    if dtype.hasobject:
        raise CorruptTensorFile(f"{where} holds Python objects, not numbers")
    return tuple(shape), bool(fortran), dtype


def npz_headers(path: Path) -> dict[str, TensorHeader]:
    """Shape and dtype of each array of an ``.npz`` file, from the member headers only."""
    import zipfile

    found: dict[str, TensorHeader] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for key, info in _npz_members(path).items():
                with archive.open(info) as member:
                    shape, _, dtype = _read_npy_header(member, f"{path}:{key}")
                found[key] = {"shape": list(shape), "dtype": dtype_name(dtype)}
    except (OSError, zipfile.BadZipFile) as exc:
        raise CorruptTensorFile(f"{path} is not a readable .npz file: {exc}") from None
    return found


def map_npz(path: Path, key: str) -> npt.NDArray[np.generic]:
    """Array ``key`` of an ``.npz`` file: memory-mapped when stored uncompressed (``np.savez``),
    decompressed whole when deflated (``np.savez_compressed`` leaves no other way)."""
    import struct
    import zipfile

    import numpy as np

    info = _npz_members(path).get(key)
    if info is None:
        raise CorruptTensorFile(f"{path} holds no array {key!r}")
    where = f"{path}:{key}"
    try:
        with zipfile.ZipFile(path) as archive, archive.open(info) as member:
            shape, fortran, dtype = _read_npy_header(member, where)
            # Python ints: np.prod in int64 wrapped a huge header shape to 0 or less
            count = math.prod(shape)
            if count * dtype.itemsize > info.file_size:  # more than the member holds
                raise CorruptTensorFile(
                    f"{where}: its header's shape {str(list(shape))[:100]} takes "
                    f"{count * dtype.itemsize} bytes, the member holds {info.file_size}"
                )
            if info.compress_type != zipfile.ZIP_STORED:
                data = np.frombuffer(member.read(count * dtype.itemsize), dtype=dtype)
                if data.size != count:
                    raise CorruptTensorFile(f"{where} is truncated")
                return data.reshape(shape, order="F" if fortran else "C")
            header_size = member.tell()
        with open(path, "rb") as raw:
            raw.seek(info.header_offset)
            local = raw.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            raise CorruptTensorFile(f"{where}: bad zip member header")
        name_length, extra_length = struct.unpack("<HH", local[26:30])
        offset = info.header_offset + 30 + name_length + extra_length + header_size
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise CorruptTensorFile(f"{path} is not a readable .npz file: {exc}") from None
    if count == 0:
        return np.empty(shape, dtype)
    if offset + count * dtype.itemsize > path.stat().st_size:
        raise CorruptTensorFile(f"{where} is truncated")
    return np.memmap(
        path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C"
    )


# -- torch.save files ------------------------------------------------------------------------

_PT_CACHE: dict[str, tuple[float, dict[str, Any]]] = {}


def _pt_tensors(path: Path) -> dict[str, Any]:
    """The tensors of a ``torch.save`` file by dotted key, memory-mapped, loaded with
    ``weights_only=True`` (no pickled code runs).  A bare tensor is keyed ``""``."""
    try:
        import torch
    except ImportError:
        raise CorruptTensorFile(
            f"{path}: reading .pt files needs PyTorch installed where compare runs"
        ) from None
    stamp = path.stat().st_mtime
    cached = _PT_CACHE.get(str(path))
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        try:
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # an unpickling refusal, a truncated zip: not tensors we can read
        raise CorruptTensorFile(
            f"{path} is not a readable torch.save file of tensors (weights_only=True): "
            f"{type(exc).__name__}: {str(exc)[:300]}"
        ) from None
    found: dict[str, Any] = {}

    def walk(value: Any, key: str, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            found[key] = value
        elif depth < 8 and isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k), depth + 1)
        elif depth < 8 and isinstance(value, list | tuple):
            for i, v in enumerate(value):
                walk(v, f"{key}.{i}" if key else str(i), depth + 1)

    walk(data, "", 0)
    if len(_PT_CACHE) > 8:
        _PT_CACHE.clear()
    _PT_CACHE[str(path)] = (stamp, found)
    return found


def pt_headers(path: Path) -> dict[str, TensorHeader]:
    """Shape and dtype of each tensor of a ``.pt`` file."""
    return {
        key: {
            "shape": list(t.shape),
            "dtype": dtypes.code(t.dtype),
        }
        for key, t in _pt_tensors(path).items()
    }


def map_pt(path: Path, key: str) -> npt.NDArray[np.generic]:
    """Tensor ``key`` of a ``.pt`` file as numpy, without a copy where torch allows it
    (bf16 and fp8 through a same-width integer view, as numpy has no such types)."""
    import numpy as np
    import torch

    tensor = _pt_tensors(path).get(key)
    if tensor is None:
        raise CorruptTensorFile(f"{path} holds no tensor {key!r}")
    tensor = tensor.detach().contiguous()
    found = dtypes.lookup(tensor.dtype)
    if found is None:
        raise UnsupportedDtype(f"dtype {tensor.dtype} cannot be compared")
    if not hasattr(np, found.numpy):  # bf16, the fp8s: through an integer of their width
        width = torch.int16 if found.bits == 16 else torch.uint8
        return tensor.view(width).numpy().view(numpy_dtype(found.code))
    return np.asarray(tensor.numpy())
