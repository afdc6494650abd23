"""A session's own records in its run directory: the lines of ``events.jsonl``.

One writer per run: a child process's session writes through its root's, each line
carrying the session that wrote it.  A write that fails (a full disk, the store taken away)
never fails the verb that caused it: the last failure is kept as ``error`` and every state
of the session shows it (``store_error``), so nothing is lost silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..store.runs import JsonlWriter


class RunLog:
    def __init__(self, session: Callable[[], str]) -> None:
        self._session = session  # the session's name now (a child's may change once)
        self._writer: JsonlWriter | None = None
        self._owned = False
        self.error: str | None = None

    def open(self, path: Path) -> None:
        """Start the run's events.jsonl (the root session, once its run has its name)."""
        self._writer = JsonlWriter(path)
        self._owned = True

    def join(self, other: RunLog) -> None:
        """Write through another session's log: a child process's, through its root's."""
        self._writer = other._writer

    def event(self, event: str, /, **fields: object) -> None:
        """Append one line; a failure is kept in ``error``, never raised."""
        writer = self._writer
        if writer is None:
            return
        try:
            writer.append(
                {"time": time.time(), **fields, "event": event, "session": self._session()}
            )
        except (OSError, ValueError) as exc:
            self.error = f"could not write {writer.path}: {exc}"

    def close(self) -> None:
        """The run ended: close the writer this log opened (a joined one stays open)."""
        if self._owned and self._writer is not None:
            self._writer.close()
