"""The script's threads as the user sees them: ``threads`` and ``thread N``.

When one thread stops, the others stop too at their next line of Python (as debugpy
does; ``--this-thread`` on a breakpoint keeps them running).  Each stopped thread
serves commands the way the thread that hit the breakpoint does, so ``thread N``
selects one and ``stack``/``vars``/``eval``/``step`` act on it.  A thread inside a long
call into C (a sleep, a lock, a big tensor op) stops when it returns to Python; until
then ``threads`` lists it as running.

Threads are never held inside the standard library (``threading``, ``queue``, ``logging``
and importlib hold locks between lines that an evaluation may need) nor in the agent's
own code: they are held at their next line outside it.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import threading
from types import FrameType
from typing import TYPE_CHECKING, cast

from ..errors import NO_SUCH_THREAD, NOT_PAUSED
from . import protocol as P
from .paths import canonical_code_file, is_library_file, is_mldbg_file
from .paused import CommandError, PausedThread, frames_from_stack
from .stepping import StepRequest
from .tracer import TracerBackend
from .wire import Wire, reply

if TYPE_CHECKING:
    from .. import results as R

AGENT_THREAD = "mldbg-agent"
MAX_THREADS = 100
_THREADING_FILE = canonical_code_file(threading.__file__)


def _stdlib_root() -> str | None:
    try:
        path = sysconfig.get_path("stdlib")
    except KeyError:
        return None
    return os.path.realpath(path) + os.sep if path else None


_STDLIB = _stdlib_root()


@functools.cache
def may_freeze_in(file: str) -> bool:
    """Can a thread be held at a line of this file without risking a deadlock?

    Not in the standard library: its code holds locks between lines (``queue``,
    ``logging``, ``threading``, importlib) that an evaluation on the stopped thread may need.
    Such a thread is held at its next line outside it.
    """
    if file.startswith("<") or file == _THREADING_FILE or is_mldbg_file(file):
        return False
    if _STDLIB and file.startswith(_STDLIB):
        parts = file.split(os.sep)
        return "site-packages" in parts or "dist-packages" in parts
    return True


def user_threads() -> dict[int, threading.Thread]:
    """The script's threads by ident; read without ``threading``'s lock (a held thread may own it)."""
    active: dict[int, threading.Thread] = dict(threading._active)  # type: ignore[attr-defined]
    return {ident: t for ident, t in active.items() if t.name != AGENT_THREAD}


def where(ident: int, frames: dict[int, FrameType]) -> dict[str, object] | None:
    """A thread's innermost frame outside the agent, preferring the user's code."""
    frame = frames.get(ident)
    first = None
    while frame is not None:
        file = canonical_code_file(frame.f_code.co_filename)
        if not is_mldbg_file(file):
            info = {"file": file, "line": frame.f_lineno, "function": frame.f_code.co_name}
            if first is None:
                first = info
            if not is_library_file(file):
                return info if info is first else {**info, "innermost": first}
        frame = frame.f_back
    return first


def listing(stopped: int | None, held: set[int], selected: int | None) -> R.Threads:
    frames = sys._current_frames()
    threads = user_threads()
    items: list[R.ThreadInfo] = []
    for number, (ident, thread) in enumerate(threads.items(), start=1):
        items.append(
            {
                "number": number,
                "id": ident,
                "native_id": thread.native_id,
                "name": thread.name,
                "daemon": thread.daemon,
                "paused": ident == stopped or ident in held,
                "stopped_here": ident == stopped,
                "selected": ident == (selected if selected is not None else stopped),
                "where": where(ident, frames),
            }
        )
    shown = items[:MAX_THREADS]
    result: R.Threads = {
        "threads": shown,
        "total": len(items),
        "shown": len(shown),
        "truncated": len(items) > len(shown),
        "pid": os.getpid(),
    }
    return result


def resolve(number_or_id: int) -> int | None:
    """``thread N``: N is the number ``threads`` shows, or a thread id."""
    threads = list(user_threads())
    if 1 <= number_or_id <= len(threads):
        return threads[number_or_id - 1]
    return number_or_id if number_or_id in threads else None


class ThreadHolding:
    """The debugger's part that holds the other threads while one is stopped (a mixin of
    :class:`~.debugger.Debugger`, which owns the attributes declared here)."""

    paused: PausedThread | None
    held: dict[int, PausedThread]  # threads held because another one stopped
    selected_thread: int | None  # `thread N`; None: the one that stopped
    freezing: bool  # a thread stopped: the others stop at their next line
    step: StepRequest | None
    wire: Wire
    backend: TracerBackend
    _busy: set[int]
    _stop_lock: threading.Lock

    def _hold(self, frame: FrameType) -> bool:
        """Another thread stopped: this one waits here, serving commands if selected.

        True when it was told to step (the step starts after this line)."""
        me = threading.get_ident()
        stopped = self.paused
        if stopped is not None and stopped.thread.ident == me:
            return False
        if threading.current_thread().name == AGENT_THREAD:
            return False  # the debugger's own helpers (an eval's watchdog) never wait
        frames = frames_from_stack(frame)
        if not frames:
            return False
        self._busy.add(me)
        try:
            held = PausedThread(frames, "thread_stopped", False, {})
            self.held[me] = held
            if not self.freezing:  # released while we were getting here
                self.held.pop(me, None)
                return False
            respond = functools.partial(reply, self.wire)
            resume = held.serve(respond)
            self.held.pop(me, None)
            if resume.kind == "continue" and not resume.released:
                self._resume_stopped()
            elif resume.kind != "continue":
                self._resume_stopped()
                with self._stop_lock:  # the stopped thread has finished resuming
                    self.step = StepRequest.from_frame(
                        resume.kind, me, frames[0][0], resume.into_libraries
                    )
                    self.backend.arm_stack(frames[0][0])
            held.drain(respond)
            return resume.kind != "continue"
        finally:
            self._busy.discard(me)

    def _resume_stopped(self) -> None:
        """A held thread was told to go on: the thread that stopped goes on too."""
        stopped = self.paused
        if stopped is not None:
            stopped.queue.put({"cmd": P.RELEASE})

    def _release_held(self) -> None:
        self.freezing = False
        self.selected_thread = None
        for held in list(self.held.values()):
            held.queue.put({"cmd": P.RELEASE})

    def target(self) -> PausedThread | None:
        """The stopped thread commands go to: the selected one, else the one that stopped."""
        if self.selected_thread is not None:
            held = self.held.get(self.selected_thread)
            if held is not None:
                return held
        return self.paused

    def threads(self) -> R.Threads:
        stopped = self.paused.thread.ident if self.paused is not None else None
        return listing(stopped, set(self.held), self.selected_thread)

    def select_thread(self, number: int) -> R.State:
        if self.paused is None:
            raise CommandError("the script is not paused; pause it first", NOT_PAUSED)
        ident = resolve(int(number))
        if ident is None:
            raise CommandError(f"no thread {number}: `threads` lists them", NO_SUCH_THREAD)
        if ident != self.paused.thread.ident and ident not in self.held:
            raise CommandError(
                f"thread {number} has not stopped (it is inside a call into C, or it was "
                "left running by a --this-thread breakpoint)",
                NOT_PAUSED,
            )
        self.selected_thread = None if ident == self.paused.thread.ident else ident
        target = self.target()
        assert target is not None
        # a stop's keys are State's, whose nested objects results.py types only as dicts
        return {"selected": ident, **cast("R.State", target.state())}
