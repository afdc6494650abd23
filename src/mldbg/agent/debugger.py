"""The debugger inside the debuggee: when to stop, and what a stop does.

Tracer backends only deliver events; every decision (breakpoint, condition, hit count,
logpoint, step, pause) is made here, once, for both backends.  The daemon's commands
are served by ``commands.py``; a stopped thread serves its own (``paused.py``).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from types import CodeType, FrameType
from typing import Any

from . import protocol as P
from .breakpoints import BreakpointTable, format_log
from .paths import canonical_code_file, is_mldbg_file
from .paused import PausedThread, Resume, exception_info, frames_from_stack, frames_from_traceback
from .stepping import StepRequest
from .wire import Wire, reply


class Debugger:
    def __init__(self, wire: Wire, cwd: str) -> None:
        self.wire = wire
        self.cwd = cwd
        self.breakpoints = BreakpointTable()
        self.step: StepRequest | None = None
        self.pause_requested = False
        self.paused: PausedThread | None = None
        self.detached = False
        self._stop_lock = threading.Lock()
        self._busy: set[int] = set()  # threads inside the debugger: they never stop again
        self.backend = _choose_backend(self)

    # -- what the tracers ask ---------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Something other than breakpoints needs events: a step or a pause."""
        return self.step is not None or self.pause_requested

    def wants_code(self, code: CodeType, file: str) -> bool:
        """Does a frame starting to run ``code`` need line events?"""
        if self.pause_requested:
            return not is_mldbg_file(file)
        step = self.step
        if step is not None and step.wants_code(code, file):
            return True
        return bool(self.breakpoints.lines_in_code(code, file))

    def on_line(self, frame: FrameType, file: str, line: int, condition: Any = None) -> bool:
        """Handle a line event; False means this line can stay silent until something changes.

        ``condition``: None to evaluate the breakpoint's condition here; otherwise its
        outcome, already known (True/False, or the exception it raised) because the
        backend compiled the condition into the code.
        A bug in here must never surface as an exception in the user's code, so errors are
        reported on stderr and the script goes on.
        """
        if threading.get_ident() in self._busy:
            return True
        try:
            bp = self.breakpoints.at(file, line)
            if bp is not None and _repeat_of_caller_line(frame, line):
                bp = None
            if bp is not None and self._breakpoint_hit(bp, frame, condition):
                return True
            if self.pause_requested:
                if not is_mldbg_file(file):
                    self.stop(frame, "pause")
                return True
            step = self.step
            if step is not None:
                if step.should_stop(frame, file, threading.get_ident()):
                    self.stop(frame, step.reason)
                return True
            return bp is not None
        except Exception as exc:
            _report_internal_error(exc)
            return True

    def _breakpoint_hit(self, bp: Any, frame: FrameType, condition: Any = None) -> bool:
        """Apply condition, hit count and logpoint; True when this hit stopped the thread."""
        if condition is None and bp.condition_code is not None:
            try:
                condition = bool(eval(bp.condition_code, frame.f_globals, frame.f_locals))
            except Exception as exc:
                condition = exc
        if isinstance(condition, BaseException):  # a broken condition stops: the user sees why
            error = f"{type(condition).__name__}: {condition}"
            self.stop(
                frame,
                "breakpoint",
                breakpoint=bp.to_json(),
                condition_error=f"condition {bp.condition!r} raised {error}",
            )
            return True
        if condition is False:
            return False
        if not bp.hit_matches():
            return False
        if bp.log_parts is not None:
            message = format_log(bp, frame)
            stream = sys.__stdout__
            if stream is not None:
                stream.write(message + "\n")
                stream.flush()
            self.wire.send(
                {
                    "event": P.LOG,
                    "message": message,
                    "file": bp.file,
                    "line": bp.line,
                    "breakpoint": bp.id,
                }
            )
            return False
        self.stop(frame, "breakpoint", breakpoint=bp.to_json())
        return True

    def on_checkpoint(self, frame: FrameType, info: dict[str, Any]) -> None:
        """A ``debug_checkpoint(..., skip=False)`` call: pause, unless filters leave it out."""
        if self.detached or threading.get_ident() in self._busy:
            return
        filters = list(self.breakpoints.checkpoints.values())
        if filters:
            try:
                matched = any(f.matches(info["name"], frame, info["hit_count"]) for f in filters)
            except Exception as exc:  # a broken filter condition stops, so the user sees why
                self.stop(
                    frame,
                    "checkpoint",
                    checkpoint=info,
                    condition_error=f"checkpoint filter raised {type(exc).__name__}: {exc}",
                )
                return
            if not matched:
                return
        self.stop(frame, "checkpoint", checkpoint=info)

    # -- stopping ---------------------------------------------------------------------------

    def stop(self, frame: FrameType, reason: str, **details: Any) -> None:
        self._enter_stop(frames_from_stack(frame), reason, False, details)

    def post_mortem(self, exc: BaseException) -> None:
        """Stop on an uncaught exception with the raising frame selected."""
        if self.detached:
            return
        frames = frames_from_traceback(exc.__traceback__)
        if not frames:
            return
        self._enter_stop(frames, "exception", True, {"exception": exception_info(exc)})

    def _enter_stop(
        self, frames: list[Any], reason: str, post_mortem: bool, details: dict[str, Any]
    ) -> None:
        me = threading.get_ident()
        if self.detached or me in self._busy or not frames:
            return
        self._busy.add(me)
        try:
            with self._stop_lock:
                if reason == "pause" and not self.pause_requested:
                    return  # another thread already answered the pause
                self.pause_requested = False
                self.step = None
                paused = PausedThread(frames, reason, post_mortem, details)
                self.paused = paused
                self.backend.refresh()
                self.wire.send(
                    {"event": P.STOPPED, **paused.state(), "trace": paused.trace_record()}
                )
                respond = functools.partial(reply, self.wire)
                resume = paused.serve(respond) if not self.wire.closed else Resume()
                self.paused = None
                paused.drain(respond)
                self.backend.refresh()  # forget what the previous step or pause armed
                if resume.kind != "continue" and not post_mortem:
                    frame = frames[0][0]
                    self.step = StepRequest.from_frame(
                        resume.kind, me, frame, resume.into_libraries
                    )
                    self.backend.arm_stack(frame)
                self.wire.send({"event": P.RESUMED})
        finally:
            self._busy.discard(me)

    def mark_busy(self) -> None:
        """The calling thread works for the debugger: it never stops, whatever it runs."""
        self._busy.add(threading.get_ident())

    def request_pause(self) -> dict[str, Any]:
        if self.paused is not None:
            return {"already_paused": True}
        self.pause_requested = True
        self.backend.refresh()
        self.backend.arm_all_threads()
        return {"pause_requested": True}

    def detach(self) -> None:
        """The daemon is gone: forget breakpoints and let the script run on untraced."""
        self.detached = True
        self.breakpoints.clear()
        self.step = None
        self.pause_requested = False
        paused = self.paused
        if paused is not None:
            paused.queue.put({"cmd": "__detach__"})
        self.backend.refresh()


def _report_internal_error(exc: BaseException) -> None:
    stream = sys.__stderr__
    if stream is not None:
        stream.write(
            f"mldbg: internal error in the tracer (the script goes on): {type(exc).__name__}: {exc}\n"
        )
        stream.flush()


_INLINE_CODE = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>"})


def _repeat_of_caller_line(frame: FrameType, line: int) -> bool:
    """A comprehension or lambda called from the very line that holds the breakpoint.

    It is its own code object on the same line (before 3.12 for comprehensions), so
    without this the breakpoint would stop once more, inside it, on every element.
    """
    code = frame.f_code
    if code.co_name not in _INLINE_CODE:
        return False
    caller = frame.f_back
    return (
        caller is not None
        and caller.f_lineno == line
        and caller.f_code.co_filename == code.co_filename
    )


def _choose_backend(debugger: Debugger) -> Any:
    forced = os.environ.get("MLDBG_BACKEND", "")
    if sys.version_info >= (3, 12) and forced != "settrace":
        from .tracer_monitoring import MonitoringBackend

        return MonitoringBackend(debugger)
    if sys.version_info < (3, 12) and forced != "settrace":
        try:
            from .tracer_instrument import InstrumentBackend

            return InstrumentBackend(debugger)
        except Exception:  # ctypes or the internals it needs are missing: trace globally
            pass
    from .tracer_settrace import SettraceBackend

    return SettraceBackend(debugger)


def code_file(code: CodeType) -> str:
    return canonical_code_file(code.co_filename)
