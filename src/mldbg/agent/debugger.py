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
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from ..own_work import own_work
from . import protocol as P
from . import threads as T
from .breakpoints import (
    Breakpoint,
    BreakpointError,
    BreakpointTable,
    format_log,
    make_breakpoint,
)
from .paths import canonical_code_file, is_library_file, is_mldbg_file
from .paused import (
    PausedThread,
    Resume,
    StopDetails,
    describe_frame,
    exception_info,
    frames_from_stack,
    frames_from_traceback,
)
from .stepping import StepRequest
from .threads import ThreadHolding
from .tracer import ConditionOutcome, TracerBackend, TracerClient
from .watches import Watches
from .wire import Wire, reply

if TYPE_CHECKING:
    from typing import Unpack

    from .functions import ImportWatcher
    from .line_record import LineRecorder
    from .tripwire import Wire as Tripwires

# A pause that lands in library code runs on this long for a line of the user's code
# before it stops where it is (and says so, offering `step out`).
PAUSE_LIBRARY_GRACE = 1.0


class Debugger(ThreadHolding):
    """Every stop decision, for every thread; ``tracer`` makes the backend that feeds it
    events (the runner passes :func:`~.backends.choose_backend`)."""

    def __init__(
        self, wire: Wire, cwd: str, tracer: Callable[[TracerClient], TracerBackend]
    ) -> None:
        self.wire = wire
        self.cwd = cwd
        self.breakpoints = BreakpointTable()
        self.step: StepRequest | None = None
        self._pause_flag = False  # `pause` was asked and no thread has stopped for it yet
        self._pause_since = 0.0
        self.freezing = False  # a thread stopped: the others stop at their next line
        self.paused: PausedThread | None = None
        self.held: dict[int, PausedThread] = {}  # threads stopped because another one did
        self.selected_thread: int | None = None  # `thread N`; None: the one that stopped
        self.detached = False
        self.main_file: str | None = None  # the script, once known: __main__.NAME resolves in it
        self.watches = Watches()
        self._stop_lock = threading.Lock()
        self._busy: set[int] = set()  # threads inside the debugger: they never stop again
        self.following = False  # exec'd child processes are followed (follow.install)
        self._import_watcher: ImportWatcher | None = None
        self._tripwire: Tripwires | None = None  # made on the first break --nonfinite
        self._tripwire_watcher: ImportWatcher | None = None
        self.recorder: LineRecorder | None = None  # the line step's (mldbg line), when asked
        self.backend: TracerBackend = tracer(self)

    @property
    def pause_requested(self) -> bool:
        """Every thread needs line events: a pause is pending, or threads are being stopped."""
        return self._pause_flag or self.freezing

    @pause_requested.setter
    def pause_requested(self, value: bool) -> None:
        self._pause_flag = value

    # -- what the tracers ask ---------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Something other than breakpoints needs events: a step, a pause, the line step."""
        recorder = self.recorder
        return (
            self.step is not None
            or self.pause_requested
            or (recorder is not None and recorder.recording)
        )

    def records_thread(self, ident: int) -> bool:
        recorder = self.recorder
        return recorder is not None and recorder.records_thread(ident)

    def wants_code(self, code: CodeType, file: str) -> bool:
        """Does a frame starting to run ``code`` need line events?"""
        recorder = self.recorder
        if recorder is not None and recorder.wants_code(code, file):
            return True
        if self.pause_requested:
            return not is_mldbg_file(file)
        step = self.step
        if step is not None and step.wants_code(code, file):
            return True
        return bool(self.breakpoints.lines_in_code(code, file))

    def on_line(
        self, frame: FrameType, file: str, line: int, condition: ConditionOutcome = None
    ) -> bool:
        """Handle a line event; False means this line can stay silent until something changes.

        ``condition``: None to evaluate the breakpoint's condition here; otherwise its
        outcome, already known (True/False, or the exception it raised) because the
        backend compiled the condition into the code.
        A bug in here must never surface as an exception in the user's code, so errors are
        reported on stderr and the script goes on.
        """
        if threading.get_ident() in self._busy:
            # While the other threads are being stopped every line has events; the stopped
            # thread's own evaluations should not pay for that (DISABLE until the resume).
            return not self.freezing
        recorder = self.recorder
        recorded = (
            recorder is not None and recorder.recording and recorder.on_line(frame, file, line)
        )
        try:
            if self.freezing and T.may_freeze_in(file) and self._hold(frame):
                return True  # this thread was told to step: from the next line on
            bp = self.breakpoints.at(file, line)
            if bp is not None and _repeat_of_caller_line(frame, line):
                bp = None
            if bp is not None and self._breakpoint_hit(bp, frame, condition):
                return True
            if self._pause_flag:
                if not is_mldbg_file(file):
                    self._pause_at(frame, file)
                return True
            if self.freezing:
                return True
            step = self.step
            if step is not None:
                if step.should_stop(frame, file, threading.get_ident()):
                    self.stop(frame, step.reason)
                return True
            return bp is not None or recorded
        except Exception as exc:
            _report_internal_error(exc)
            return True

    def on_return(self, frame: FrameType, value: object) -> None:
        """A frame returns: the line step records what it returns (nothing else listens)."""
        recorder = self.recorder
        if recorder is not None and recorder.recording:
            recorder.on_return(frame, value)

    def _breakpoint_hit(
        self, bp: Breakpoint, frame: FrameType, condition: ConditionOutcome = None
    ) -> bool:
        """Apply condition, hit count and logpoint; True when this hit stopped the thread."""
        if condition is None and bp.condition_code is not None:
            try:
                with own_work():  # the user's condition, not an operation of the model
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
            with own_work():
                message = format_log(bp, frame)
            stream = sys.__stdout__
            if stream is not None:
                stream.write(message + "\n")
                stream.flush()
            P.LOG.send(
                self.wire,
                {"message": message, "file": bp.file, "line": bp.line, "breakpoint": bp.id},
            )
            return False
        self.stop(frame, "breakpoint", all_threads=not bp.this_thread, breakpoint=bp.to_json())
        return True

    def _pause_at(self, frame: FrameType, file: str) -> None:
        """Stop for ``pause``: in the user's code if it comes soon, else here, saying so."""
        if not is_library_file(file):
            self.stop(frame, "pause")
            return
        waited = time.monotonic() - self._pause_since
        if waited < PAUSE_LIBRARY_GRACE:
            return
        user = next(
            (
                (f, line)
                for f, line in frames_from_stack(frame)
                if not is_library_file(canonical_code_file(f.f_code.co_filename))
            ),
            None,
        )
        note = (
            f"paused in library code ({os.path.basename(file)}); your code's innermost "
            "frame is "
            + (
                f"{describe_frame(user[0], user[1])['function']}() at line {user[1]}"
                if user
                else "not on this thread's stack"
            )
        )
        self.stop(
            frame,
            "pause",
            note=note,
            fix=[{"verb": "step", "args": {"kind": "out"}}, {"verb": "continue", "args": {}}],
        )

    # -- exceptions -------------------------------------------------------------------------

    def on_exception(self, frame: FrameType, exc: BaseException, origin: bool) -> None:
        """An exception was raised in ``frame`` (``origin``) or reached it from a callee.

        Stops in the user's code only (see :mod:`.exceptions`); never raises.
        """
        table = self.breakpoints.exceptions
        if self.detached or not table.raising or threading.get_ident() in self._busy:
            return
        try:
            file = canonical_code_file(frame.f_code.co_filename)
            if is_library_file(file) or is_mldbg_file(file):
                return
            item = table.match("raised", exc)
            if item is None or not table.first_time(exc):
                return
            item.hit_count += 1
            details: StopDetails = {"exception": exception_info(exc), "raised": True}
            if not origin:
                tb = exc.__traceback__
                while tb is not None and tb.tb_next is not None:
                    tb = tb.tb_next
                if tb is not None:
                    where = describe_frame(tb.tb_frame, tb.tb_lineno)
                    details["raised_in"] = where
                    details["note"] = (
                        f"raised in library code at {where['file']}:{where['line']} "
                        f"({where['function']}); stopped at the first frame of your code it reached"
                    )
            details["breakpoint"] = item.to_json()
            self.stop(frame, "exception", **details)
        except Exception as exc2:
            _report_internal_error(exc2)

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

    def stop(
        self,
        frame: FrameType,
        reason: str,
        all_threads: bool = True,
        **details: Unpack[StopDetails],
    ) -> None:
        self._enter_stop(frames_from_stack(frame), reason, False, details, all_threads)

    def post_mortem(self, exc: BaseException) -> None:
        """Stop on an uncaught exception with the raising frame selected."""
        if self.detached or not self.breakpoints.exceptions.uncaught_allows(exc):
            return
        frames = frames_from_traceback(exc.__traceback__)
        if not frames:
            return
        self._enter_stop(frames, "exception", True, {"exception": exception_info(exc)})

    def _enter_stop(
        self,
        frames: list[tuple[FrameType, int]],
        reason: str,
        post_mortem: bool,
        details: StopDetails,
        all_threads: bool = True,
    ) -> None:
        me = threading.get_ident()
        if self.detached or me in self._busy or not frames:
            return
        self._busy.add(me)
        try:
            # what the stop runs on this thread (watches, summaries, every command served
            # while paused: eval, vars...) is the debugger's, never the model's operations
            with self._stop_lock, own_work():
                if reason == "pause" and not self._pause_flag:
                    return  # another thread already answered the pause
                self._pause_flag = False
                self.step = None
                if self.breakpoints.remove_temporary():  # `until`: one shot, whatever stopped
                    self.backend.breakpoints_changed()
                paused = PausedThread(frames, reason, post_mortem, details)
                paused.watch_values = self.watches.evaluate(paused)
                self.paused = paused
                self.selected_thread = None
                if all_threads:
                    self.freezing = True
                self.backend.refresh()
                if all_threads:
                    self.backend.arm_all_threads()
                P.STOPPED.send(self.wire, {**paused.state(), "trace": paused.trace_record()})
                respond = functools.partial(reply, self.wire)
                # Serve until resumed, unless the debugger is already detached.  Not "unless
                # the link closed": the reader sees the daemon die and decides (the orphan
                # policy ends the process; a detach releases this thread), and a stop that
                # resumed on its own when the link closed under it ran past its breakpoint.
                # detach() sets ``detached`` before it reads ``paused``, which is set above.
                resume = paused.serve(respond) if not self.detached else Resume()
                self._release_held()
                self.paused = None
                paused.drain(respond)
                self.backend.refresh()  # forget what the previous step or pause armed
                if resume.kind != "continue" and not post_mortem:
                    frame = frames[0][0]
                    self.step = StepRequest.from_frame(
                        resume.kind, me, frame, resume.into_libraries
                    )
                    self.backend.arm_stack(frame)
                P.RESUMED.send(self.wire, {})
        finally:
            self._busy.discard(me)

    # -- the non-finite tripwire (break --nonfinite) ------------------------------------------

    def arm_tripwire(self) -> None:
        """Install or remove the module hooks after the tripwire setting changed; a framework
        imported later is hooked as soon as its import finishes."""
        rules = list(self.breakpoints.tripwires.values())
        if not rules and self._tripwire is None:
            return
        from .functions import ImportWatcher
        from .tripwire import Wire

        if self._tripwire is None:
            self._tripwire = Wire(self)
        wire = self._tripwire
        wire.arm(rules[0] if rules else None)
        if wire.frameworks_missing():
            if self._tripwire_watcher is None:
                self._tripwire_watcher = ImportWatcher(
                    wire.install_available, wire.frameworks_missing
                )
            self._tripwire_watcher.install()
        elif self._tripwire_watcher is not None:
            self._tripwire_watcher.uninstall()

    # -- function breakpoints whose module comes later -----------------------------------------

    def watch_imports(self) -> None:
        from .functions import ImportWatcher

        if self.breakpoints.pending:
            if self._import_watcher is None:
                self._import_watcher = ImportWatcher(
                    self.retry_pending, lambda: [p.name for p in self.breakpoints.pending.values()]
                )
            self._import_watcher.install()
        elif self._import_watcher is not None:
            self._import_watcher.uninstall()

    def retry_pending(self) -> list[Breakpoint]:
        """Set the pending function breakpoints whose module can now be found."""
        from .functions import resolve

        table = self.breakpoints
        done = []
        for pending in list(table.pending.values()):
            try:
                found = resolve(pending.name, self.cwd, self.main_file)
            except BreakpointError:
                found = None
            if found is None:
                continue
            try:
                bp = make_breakpoint(found[0], found[1], cwd=self.cwd, **pending.spec)
            except BreakpointError:
                continue
            bp.id, bp.function, bp.this_thread = pending.id, pending.name, pending.this_thread
            with table.lock:
                table.pending.pop(pending.id, None)
                table.add(bp)
            done.append(bp)
        if done:
            self.backend.breakpoints_changed()
            self.watch_imports()
        return done

    def mark_busy(self) -> None:
        """The calling thread works for the debugger: it never stops, whatever it runs."""
        self._busy.add(threading.get_ident())

    def request_pause(self) -> dict[str, bool]:
        if self.paused is not None and not self.paused.resumed:
            # Paused already: a pause interrupts whatever evaluation is running.
            interrupted = any(p.interrupt() for p in [self.paused, *self.held.values()])
            return {"already_paused": True, "interrupted": interrupted}
        self._pause_since = time.monotonic()
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
        self.freezing = False
        paused = self.paused
        if paused is not None:
            paused.queue.put({"cmd": P.DETACH})
        for held in list(self.held.values()):
            held.queue.put({"cmd": P.DETACH})
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


def code_file(code: CodeType) -> str:
    return canonical_code_file(code.co_filename)
