"""Read a safetensors file's header (names, dtypes, shapes, offsets) without its data.

The format is an 8-byte little-endian length and a JSON header; reading it directly
needs no framework, which lets the daemon and the CLI list and stream captures.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

MAX_HEADER = 100_000_000


class CorruptTensorFile(ValueError):
    """A file that is not a readable safetensors file (truncated, overwritten, not one)."""


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header dict and the offset where the data starts."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise CorruptTensorFile(f"{path} is not a safetensors file (only {len(raw)} bytes)")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_HEADER or 8 + length > size:
                raise CorruptTensorFile(
                    f"{path} is not a safetensors file (header length {length}, file {size} bytes)"
                )
            header = json.loads(fh.read(length))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptTensorFile(f"{path} has a corrupt safetensors header: {exc}") from None
    if not isinstance(header, dict):
        raise CorruptTensorFile(f"{path} has a corrupt safetensors header (not an object)")
    data_size = size - 8 - length
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and offsets[1] <= data_size):
            raise CorruptTensorFile(f"{path}: tensor {key!r} lies past the end of the file")
    return header, 8 + length


def header_entries(path: Path) -> dict[str, dict[str, Any]]:
    """``{name: {"shape", "dtype"}}`` for every tensor in the file."""
    header, _ = read_header(path)
    return {
        key: {"shape": list(entry["shape"]), "dtype": entry["dtype"]}
        for key, entry in header.items()
        if key != "__metadata__"
    }
