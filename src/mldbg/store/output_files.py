"""Writing a file at a path a user or an agent named (an HTML report, a proposed map).

Such a file is written whole, then renamed over the path, so a reader never sees half of
it.  But a rename replaces whatever the path names: as root, ``--html /dev/full`` turned
the device into a regular file, ``--html fifo`` removed the FIFO, and a typo such as
``--html ref/index.jsonl`` would silently replace a capture's index.  So an existing path
is replaced only when it is a regular file that this kind of output wrote before (its
first bytes say so); anything else is refused with what is there, and nothing is lost.
New files are private (``0600``), like the run store they are computed from: a report
holds tensor values.

Standard library only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import OutputRefused
from . import reading
from .runs import PRIVATE_FILE


def replace_output(path: str | os.PathLike[str], text: str, signature: bytes) -> Path:
    """Write ``text`` to ``path`` (via a private temporary file and a rename).  ``path`` may
    not exist yet, or be a regular file starting with ``signature`` (an earlier report);
    anything else raises :class:`OutputRefused` (an ``OSError``) and is left as it is."""
    target = check_output(path, signature)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def check_output(path: str | os.PathLike[str], signature: bytes) -> Path:
    """``path`` if :func:`replace_output` may write there (checked before a long
    computation whose result would otherwise be lost); :class:`OutputRefused` or the
    ``OSError`` that says why not (a missing directory)."""
    target = Path(path)
    if not target.parent.is_dir():
        raise FileNotFoundError(2, "its directory does not exist", str(target))
    try:
        info = os.stat(target)
    except FileNotFoundError:
        info = None
    if info is not None:
        if not stat.S_ISREG(info.st_mode):
            raise OutputRefused(
                str(target),
                "exists and is not a regular file (a directory, FIFO or device): not replaced",
            )
        with reading.open_regular(target) as existing:
            head = existing.read(len(signature))
        if not head.startswith(signature):
            raise OutputRefused(
                str(target),
                "exists and was not written by mldbg as this kind of file: not replaced "
                "(remove it, or name another file)",
            )
    return target
