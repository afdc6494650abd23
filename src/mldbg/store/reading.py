"""Reading back a file that a path names, bounded: only regular files, only so many bytes.

Captures, name maps and run records are read from paths an agent types or an index line
names, and a hostile or damaged store can put anything there.  A FIFO where a file
belongs blocks ``open`` until a writer comes (forever: the daemon's worker and the
agent's request with it); ``/dev/zero`` or a symlink to it never ends, and reading it
"whole" takes all memory; a JSON document nested 100,000 levels deep raises
``RecursionError``, which no ``except ValueError`` catches.  Every read of such a file
goes through here: a file that is not regular is refused before the first byte (opened
non-blocking, then checked with ``fstat``), a read stops at a stated size, and JSON too
deep to parse is a ``ValueError`` like any other that does not parse.

Standard library only: the run store's readers run in the CLI, the daemon and scripts.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ..errors import FileTooLarge, NotARegularFile

__all__ = [
    "FileTooLarge",
    "NotARegularFile",
    "lines",
    "loads",
    "open_regular",
    "read_bytes",
    "read_json",
]

# The largest JSON document read whole (a capture.json lists up to 100,000 module paths;
# a map file); larger is refused as not what mldbg wrote.
MAX_JSON_BYTES = 64 * 1024 * 1024
# The longest line of a JSON-lines file (index.jsonl, events.jsonl, checkpoints.jsonl): an
# index line holds at most 256 tensors (capture/flatten.py); the agent's own messages are
# capped at the same 32 MiB (agent/protocol.py MAX_LINE).  A longer line is unreadable.
MAX_LINE_BYTES = 32 * 1024 * 1024


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def open_regular(path: str | os.PathLike[str]) -> IO[bytes]:
    """``path`` opened for binary reading, if it is a regular file (after symlinks);
    :class:`NotARegularFile` (an ``OSError``) otherwise, without blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFile(os.fspath(path), _kind(mode))
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~getattr(os, "O_NONBLOCK", 0))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def is_regular(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file (after symlinks), without opening it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_bytes(path: str | os.PathLike[str], limit: int = MAX_JSON_BYTES) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes (:class:`FileTooLarge`
    past it: the size a header or ``stat`` claims is not trusted, the read is capped)."""
    with open_regular(path) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"{os.fspath(path)} is larger than {limit} bytes")
    return data


def loads(text: str | bytes) -> Any:
    """``json.loads``, with nesting too deep to parse a ``ValueError`` like any bad JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def read_json(path: str | os.PathLike[str], limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON document from a regular file of at most ``limit`` bytes; ``ValueError``
    (:class:`FileTooLarge`, ``UnicodeDecodeError``, ``JSONDecodeError``) when it is not one."""
    return loads(read_bytes(path, limit).decode("utf-8"))


def lines(path: Path, limit: int = MAX_LINE_BYTES) -> Iterator[bytes | None]:
    """Each non-empty line of a regular file (without its newline), or None for a line
    longer than ``limit`` (skipped to its end, never held whole); nothing for a file that
    is not there.  A FIFO or device is :class:`NotARegularFile`."""
    for _number, line in numbered_lines(path, limit):
        yield line


def numbered_lines(path: Path, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes | None]]:
    """``lines``, each with its line number in the file (from 1, blank lines counted), so
    an error about one names the line an editor shows."""
    try:
        fh = open_regular(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    number = 0
    with fh:
        while True:
            line = fh.readline(limit + 1)
            if not line:
                return
            number += 1
            if len(line) > limit and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # the rest of the long line
                    line = fh.readline(1 << 20)
                yield number, None
                continue
            if line.strip():
                yield number, line.rstrip(b"\r\n")
