"""A bound on the work of one analysis call: past it the work stops with ``too_slow``.

Reading a capture is bounded in work (its call tree is checked as it is read,
``compare/read/sources.py``), so every walk of a comparison ends; what ends can still take
hours (millions of calls, a checkpoint on a slow disk, a pathological map), and a daemon
thread must not be held that long by one request nobody waits for.  ``bounded`` runs a
block under a deadline: once it passes, a watchdog raises :class:`~mldbg.errors.TooSlow`
inside the block's own thread (``PyThreadState_SetAsyncExc``: delivered between two
bytecodes, as the debuggee's evaluation timeout is; a ``BaseException``, so a reader's
``except Exception`` lets it pass), again every ``RETRY`` seconds until the block has let
it out, and never while
that thread is importing a module (an import cut short would leave a module half made for
every later request).  A single long call into C (a huge reduction) is interrupted when it
returns to Python.

The bound is ``MLDBG_DEADLINE`` seconds (default ``DEFAULT_SECONDS``; ``0`` for none), read
where the work runs: the daemon's environment for the verbs it serves (compare, weights,
nonfinite, module-table), the command's for ``mldbg compare``, which runs in its own process.
Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .errors import BAD_ARGUMENT, MldbgError, TooSlow

ENV = "MLDBG_DEADLINE"
DEFAULT_SECONDS = 1800.0  # half an hour: a real comparison of a large model fits well within
RETRY = 0.05  # seconds between two interrupts of a block that swallowed the last one

_here = threading.local()  # the watch of the block this thread runs, when it runs one


def seconds_allowed(environ: Mapping[str, str] = os.environ) -> float | None:
    """The bound ``MLDBG_DEADLINE`` sets: its seconds, ``DEFAULT_SECONDS`` when unset,
    None for ``0`` (no bound); anything but a number of seconds is said, with its name."""
    raw = environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if math.isnan(seconds) or seconds < 0:
        raise MldbgError(
            f"{ENV}={raw[:40]!r} is not a number of seconds (0 for no deadline)",
            code=BAD_ARGUMENT,
        )
    return None if seconds == 0 or math.isinf(seconds) else seconds


class DeadlineInterrupt(BaseException):
    """What the watchdog raises in the working thread (made there, without arguments).

    A ``BaseException``, outside the ``MldbgError`` tree on purpose, as the debuggee's
    ``EvalInterrupt`` is: a reader's ``except Exception`` lets it pass.  It never leaves
    ``bounded``, which says :class:`TooSlow` instead."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        watch = getattr(_here, "watch", None)
        if watch is not None:
            watch.landed += 1


@dataclass
class _Watch:
    """One bounded block: its thread, and the interrupts sent to it and landed there."""

    ident: int
    seconds: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)
    active: bool = True
    sent: int = 0
    landed: int = 0  # counted by DeadlineInterrupt, in the working thread

    def run(self) -> None:
        """The watchdog: wait out the deadline, then interrupt until the block ends."""
        if self.done.wait(self.seconds):
            return
        while not self.done.is_set():
            with self.lock:
                # one interrupt pending at a time: CPython keeps only the last one sent
                if self.active and self.sent == self.landed and not _importing(self.ident):
                    self.sent += _set_async_exc(self.ident, DeadlineInterrupt)
            self.done.wait(RETRY)


def _set_async_exc(ident: int, exc: type[BaseException]) -> int:
    """Ask thread ``ident`` to raise ``exc`` at its next bytecode; 1 when it was asked."""
    send = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
        ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
    )
    return int(send(ident, exc))


def _importing(ident: int) -> bool:
    """Whether thread ``ident`` is inside the import machinery right now."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _stop(watch: _Watch) -> None:
    """End ``watch`` from its own thread.  No interrupt is sent once ``active`` is False;
    one already on its way lands here (it may land anywhere in here, hence the retry)
    rather than in whatever this thread runs next.  Never withdrawn: that would leave
    CPython 3.11's "async exception pending" flag set with nothing pending
    (``agent/interrupt.py`` says more)."""
    while True:
        try:
            with watch.lock:
                watch.active = False
            watch.done.set()
            for _ in range(10_000_000):  # bytecodes: a pending interrupt is raised in here
                if watch.sent <= watch.landed:
                    break
            _here.watch = None
            return
        except DeadlineInterrupt:
            continue


@contextlib.contextmanager
def bounded(what: str, seconds: float | None) -> Iterator[None]:
    """Run the block in this thread for at most ``seconds`` (None: no bound); past them,
    :class:`TooSlow` naming ``what`` and the bound.  A block already bounded (a nested
    call) keeps its outer bound."""
    if seconds is None or getattr(_here, "watch", None) is not None:
        yield
        return
    watch = _Watch(threading.get_ident(), seconds)
    _here.watch = watch
    try:
        try:
            threading.Thread(target=watch.run, name="mldbg-deadline", daemon=True).start()
            yield
        finally:
            _stop(watch)  # from here on nothing lands in this thread
    except DeadlineInterrupt:
        pass  # said below, with what ran past the deadline
    except BaseException:
        if not watch.landed:
            raise  # a failure of the work itself
        # else: the interrupt made another error on its way out (a reader wrapped it)
    if watch.landed:  # interrupted, even where the block swallowed it and went on
        raise TooSlow(
            f"{what} ran past its deadline of {seconds:g} s and was stopped ({ENV}: the "
            f"seconds one compare, weights, nonfinite or module-table may take; 0 for none)",
            seconds=seconds,
            variable=ENV,
        )
