"""Reading the end (or a page) of a session's output.log: bounded, and without reading
the whole file (an output of many GB answers as fast as one of a few lines)."""

from __future__ import annotations

import os
from pathlib import Path

from .. import budget


def read_tail_bounded(path: Path, lines: int, limit: int) -> tuple[str, bool]:
    """The last ``lines`` lines of a file, at most ``limit`` bytes of them (a cut is marked)."""
    return budget.cap(read_tail(path, lines, limit * 2), limit, "tail")


def read_page(path: Path, offset: int, limit: int) -> tuple[str, int, int]:
    """``limit`` bytes from ``offset``: (text, size of the file, offset after the page)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(min(offset, size))
            data = fh.read(limit)
    except OSError:
        return "", 0, offset
    return data.decode("utf-8", errors="replace"), size, min(offset, size) + len(data)


def read_tail(path: Path, lines: int, max_bytes: int | None = None) -> str:
    """The last ``lines`` lines of a file, reading only its end."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            block = min(size, max(4096, lines * 256))
            while True:
                fh.seek(size - block)
                data = fh.read(block)
                if data.count(b"\n") > lines or block == size:
                    break
                if max_bytes is not None and block >= max_bytes:
                    break  # one huge line: the caller only wants its end anyway
                block = min(size, block * 4)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "".join(text.splitlines(keepends=True)[-lines:]) if lines else ""
