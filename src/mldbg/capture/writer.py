"""Write a capture's files off the forward's critical path, with bounded memory.

A full capture's cost is mostly writing: serializing each call's tensors and putting
them on disk while the model waits.  With a :class:`BackgroundWriter` the model's thread
only takes a private copy of each tensor (on the CPU: the model may change its tensors
in place afterwards) and queues the call; one writer thread writes the files and the
index lines in the order the calls happened, so the index stays the same prefix-readable
log.  The queue is bounded by bytes: when the copies waiting to be written reach
``max_bytes`` the model's thread waits for the writer (back-pressure), so memory never
grows with the model.  ``close()`` waits until everything queued is written.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

DEFAULT_MAX_BYTES = 512 * 1024 * 1024


class BackgroundWriter:
    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
        self._cond = threading.Condition()
        self._jobs: collections.deque[tuple[Callable[[], None], int]] = collections.deque()
        self._pending = 0  # bytes queued or being written
        self._busy = False
        self._closed = False
        self.waits = 0  # times the model's thread waited for room (reported)
        self._thread = threading.Thread(target=self._run, name="mldbg-capture-writer", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None], nbytes: int) -> None:
        """Queue ``job``; waits while the queue holds ``max_bytes`` (a lone large job runs)."""
        with self._cond:
            if self._pending and self._pending + nbytes > self.max_bytes:
                self.waits += 1
                while self._pending and self._pending + nbytes > self.max_bytes:
                    self._cond.wait()
            self._jobs.append((job, nbytes))
            self._pending += nbytes
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job, nbytes = self._jobs.popleft()
                self._busy = True
            try:
                job()  # the recorder's own code catches and records every failure
            except BaseException:  # noqa: S110 - never let the writer thread die silently
                pass
            finally:
                with self._cond:
                    self._busy = False
                    self._pending -= nbytes
                    self._cond.notify_all()

    def close(self) -> None:
        """Write everything queued, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
