"""A bound on the work of one analysis call: past it the work stops with ``too_slow``.

Reading a capture is bounded in work (its call tree is checked as it is read,
``compare/read/sources.py``; a map's regex rules have a timeout, ``compare/pair/mapping.py``),
so every walk of a comparison ends; what ends can still take hours (millions of calls, a
checkpoint on a slow disk), and a daemon thread must not be held that long by one request
nobody waits for.  :func:`call_bounded` runs the work under a deadline: once it passes, a
watchdog raises :class:`DeadlineInterrupt` inside the work's own thread, once
(``PyThreadState_SetAsyncExc``: delivered between two bytecodes, as the debuggee's
evaluation timeout is; a ``BaseException``, so a reader's ``except Exception`` lets it
pass), never while that thread is importing a module (an import cut short would leave a
module half made for every later request), and the call answers :class:`TooSlow`.  A
single long call into C (a huge reduction) is interrupted when it returns to Python.

One interrupt, never more: wherever it lands (the work, or the few bytecodes of the
cleanup after it) ``call_bounded`` catches it, and nothing is sent once the work is over,
so none reaches whatever the thread runs next (a daemon worker's next request).

The bound is ``MLDBG_DEADLINE`` seconds (default ``DEFAULT_SECONDS``; ``0`` for none), read
where the work runs: the daemon's environment for the verbs it serves (compare, weights,
nonfinite, module-table), the command's for ``mldbg compare``, which runs in its own process.
Standard library only.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from .errors import BAD_ARGUMENT, MldbgError, TooSlow

T = TypeVar("T")

ENV = "MLDBG_DEADLINE"
DEFAULT_SECONDS = 1800.0  # half an hour: a real comparison of a large model fits well within
RETRY = 0.05  # seconds between two looks at a thread that was importing at the deadline

_here = threading.local()  # the watch of the work this thread runs, while it runs it


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
    :func:`call_bounded`, which says :class:`TooSlow` instead."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        watch = getattr(_here, "watch", None)
        if watch is not None:
            watch.landed = True


@dataclass
class _Watch:
    """One bounded call: its thread, and whether its one interrupt was sent and landed."""

    ident: int
    seconds: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)
    active: bool = True
    sent: bool = False
    landed: bool = False  # set by DeadlineInterrupt, in the working thread

    def run(self) -> None:
        """The watchdog: wait out the deadline, then send the one interrupt (as soon as
        the thread is not importing) unless the work ended first."""
        if self.done.wait(self.seconds):
            return
        while not self.done.is_set():
            with self.lock:
                if not self.active:
                    return
                if not _importing(self.ident):
                    self.sent = _set_async_exc(self.ident, DeadlineInterrupt) == 1
                    return
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


def _close(watch: _Watch) -> None:
    """End ``watch`` from its own thread: no interrupt is sent after this, and one already
    sent lands here (never withdrawn: that would leave CPython 3.11's "async exception
    pending" flag set with nothing pending, ``agent/interrupt.py`` says more).  Where it
    lands in here, the caller catches it and calls this again."""
    with watch.lock:
        watch.active = False
    watch.done.set()
    if watch.sent:
        for _ in range(10_000_000):  # bytecodes: the pending interrupt is raised in here
            if watch.landed:
                break
    _here.watch = None


def call_bounded(what: str, seconds: float | None, work: Callable[[], T]) -> T:
    """``work()`` in this thread for at most ``seconds`` (None: no bound); past them,
    :class:`TooSlow` naming ``what`` and the bound (also when the work swallowed the
    interrupt and went on: its answer may lack what was cut)."""
    if seconds is None:
        return work()
    watch = _Watch(threading.get_ident(), seconds)
    _here.watch = watch
    failure: BaseException | None = None
    try:
        threading.Thread(target=watch.run, name="mldbg-deadline", daemon=True).start()
        result = work()
    except DeadlineInterrupt:
        pass
    except BaseException as exc:  # the work's own failure, unless the interrupt made it
        failure = exc
    finally:
        try:
            _close(watch)
        except DeadlineInterrupt:  # the one interrupt, landing in the cleanup: none follows
            _close(watch)
    if watch.landed:
        raise TooSlow(
            f"{what} ran past its deadline of {seconds:g} s and was stopped ({ENV}: the "
            f"seconds one compare, weights, nonfinite or module-table may take; 0 for none)",
            seconds=seconds,
            variable=ENV,
        ) from None
    if failure is not None:
        raise failure
    return result
