"""Interrupting user code that runs on a paused thread (an eval, a watch expression).

An evaluation runs on the paused thread itself, so a runaway one (``while True: pass``)
would keep the thread from serving anything else.  It is interrupted from outside by
raising an exception *in that thread* (``PyThreadState_SetAsyncExc``): after a timeout,
or when the user pauses (``mldbg pause`` / Ctrl-C on ``mldbg eval``).  The exception
unwinds only the evaluated code; the paused thread catches it and goes on serving.

Limits: the exception is delivered between bytecodes, so a single long call into C
(``time.sleep(1e6)``, a huge matmul) is interrupted only when it returns to Python.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from ..errors import EVAL_INTERRUPTED, EVAL_TIMEOUT

T = TypeVar("T")

_AGENT_THREAD = "mldbg-agent"  # threads of this name are the debugger's: never traced


_landed = threading.local()  # set in the thread an interrupt was raised in


class EvalInterrupt(BaseException):
    """Raised inside evaluated code; a BaseException so ``except Exception`` lets it pass."""

    code = EVAL_INTERRUPTED
    reason = "interrupted by pause"

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        _landed.value = True  # CPython makes the instance in the thread it is raised in


class EvalTimeout(EvalInterrupt):
    code = EVAL_TIMEOUT
    reason = "ran past its timeout"


def _set_async_exc(ident: int, exc: type[BaseException] | None) -> int:
    """Ask ``ident`` to raise ``exc`` at its next bytecode; ``None`` withdraws the request."""
    api = ctypes.pythonapi
    if exc is None:
        clear = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
            ("PyThreadState_SetAsyncExc", api)
        )
        return int(clear(ident, None))
    send = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
        ("PyThreadState_SetAsyncExc", api)
    )
    return int(send(ident, exc))


def _absorb() -> None:
    """Let an interrupt that was sent but not yet delivered land here, harmlessly.

    Withdrawing it (``PyThreadState_SetAsyncExc(id, NULL)``) would leave the
    interpreter's "async exception pending" flag set with nothing pending (CPython
    3.11), and every thread would then run its pending-calls path forever after.
    """
    try:
        for _ in range(10_000_000):  # bytecodes: the pending exception is raised in here
            pass
    except EvalInterrupt:
        pass


class Interruptible:
    """One thread's guarded region: interrupts land only while it is inside ``running``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ident: int | None = None
        self._sent = False

    @property
    def busy(self) -> bool:
        return self._ident is not None

    @contextlib.contextmanager
    def running(self, timeout: float | None) -> Iterator[None]:
        ident = threading.get_ident()
        _landed.value = False
        stop_timer = threading.Event()
        if timeout is not None and timeout > 0:
            threading.Thread(
                target=self._watchdog,
                args=(stop_timer, float(timeout)),
                name=_AGENT_THREAD,
                daemon=True,
            ).start()
        with self._lock:  # from here on (not while starting the watchdog) it may land
            self._ident, self._sent = ident, False
        try:
            yield
        finally:
            stop_timer.set()
            with self._lock:
                pending = self._sent and not getattr(_landed, "value", False)
                self._ident = None
            if pending:
                _absorb()

    def interrupt(self, kind: type[EvalInterrupt] = EvalInterrupt) -> bool:
        """Raise ``kind`` in the running thread; False when nothing is running."""
        with self._lock:
            if self._ident is None or self._sent:
                return False
            self._sent = _set_async_exc(self._ident, kind) == 1
            return self._sent

    def _watchdog(self, stop: threading.Event, timeout: float) -> None:
        if not stop.wait(timeout):
            self.interrupt(EvalTimeout)


def run_guarded(guard: Interruptible, timeout: float | None, fn: Callable[[], T]) -> T:
    with guard.running(timeout):
        return fn()
