"""Read a safetensors file's header (names, dtypes, shapes, offsets) without its data.

The format is an 8-byte little-endian length and a JSON header; reading it directly
needs no framework, which lets the daemon and the CLI list and stream captures.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

from .. import dtypes
from ..errors import CorruptTensorFile
from ..store import reading
from .records import TensorInfo

MAX_HEADER = 100_000_000
# Every dtype the safetensors format defines, with its size in bits.  A name outside this
# table is not a format mldbg cannot read yet: the header is corrupt (or not safetensors).
DTYPE_BITS = {d.code: d.bits for d in dtypes.TABLE if d.safetensors}


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header dict and the offset where the data starts."""
    try:
        with reading.open_regular(path) as fh:  # a FIFO would block, /dev/zero never end
            size = os.fstat(fh.fileno()).st_size
            raw = fh.read(8)
            if len(raw) != 8:
                raise CorruptTensorFile(f"{path} is not a safetensors file (only {len(raw)} bytes)")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_HEADER or 8 + length > size:
                raise CorruptTensorFile(
                    f"{path} is not a safetensors file (header length {length}, file {size} bytes)"
                )
            header = reading.loads(fh.read(length))
    except CorruptTensorFile:
        raise
    except ValueError as exc:  # not UTF-8, not JSON, nested too deep
        raise CorruptTensorFile(f"{path} has a corrupt safetensors header: {exc}") from None
    if not isinstance(header, dict):
        raise CorruptTensorFile(f"{path} has a corrupt safetensors header (not an object)")
    data_size = size - 8 - length
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in offsets)
        ):
            raise CorruptTensorFile(f"{path}: tensor {_shown(key)} has corrupt data offsets")
        if offsets[1] > data_size:
            raise CorruptTensorFile(f"{path}: tensor {_shown(key)} lies past the end of the file")
        _check_entry(path, key, entry)
    return header, 8 + length


def _shown(key: str) -> str:
    """A tensor's name as an error message quotes it: a hostile header's name can be
    megabytes long, and the message must stay bounded."""
    return repr(key) if len(key) <= 200 else repr(key[:200]) + f"…({len(key)} characters)"


def _check_entry(path: Path, key: str, entry: dict[str, Any]) -> None:
    """The header's word on a tensor must hold: a dtype the format defines, a shape of
    sizes, and exactly the bytes that shape takes.  A header that lies about its shape
    made ``compare`` report "shapes differ" (a divergence) for what is a corrupt file."""
    dtype, shape, (begin, end) = entry.get("dtype"), entry.get("shape"), entry["data_offsets"]
    if dtype not in DTYPE_BITS:
        raise CorruptTensorFile(
            f"{path}: tensor {_shown(key)} has an unknown dtype {str(dtype)[:40]!r}"
        )
    if not (
        isinstance(shape, list)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
        and isinstance(begin, int)
        and isinstance(end, int)
        and 0 <= begin <= end
    ):
        raise CorruptTensorFile(f"{path}: tensor {_shown(key)} has a corrupt shape or offsets")
    count = 1
    for n in shape:
        count *= n
    if (count * DTYPE_BITS[dtype] + 7) // 8 != end - begin:
        raise CorruptTensorFile(
            f"{path}: tensor {_shown(key)} has {end - begin} bytes, not the "
            f"{(count * DTYPE_BITS[dtype] + 7) // 8} its shape {str(shape)[:200]} of {dtype} takes"
        )


def header_entries(path: Path) -> dict[str, TensorInfo]:
    """``{name: {"shape", "dtype"}}`` for every tensor in the file."""
    header, _ = read_header(path)
    return {
        key: {"shape": list(entry["shape"]), "dtype": entry["dtype"]}
        for key, entry in header.items()
        if key != "__metadata__"
    }
