"""The debugger inside the debuggee: when to stop, and what a stop does.

Tracer backends only deliver events; every decision (breakpoint, condition, hit count,
logpoint, step, pause) is made here, once, for both backends.
"""

from __future__ import annotations

import os
import sys
import threading
from types import CodeType, FrameType
from typing import Any

from .breakpoints import (
    Breakpoint,
    BreakpointError,
    BreakpointTable,
    CheckpointFilter,
    format_log,
    make_breakpoint,
    make_checkpoint_filter,
)
from .paths import canonical_code_file, is_mldbg_file
from .paused import (
    PAUSED_COMMANDS,
    PausedThread,
    Resume,
    exception_info,
    frames_from_stack,
    frames_from_traceback,
)
from .stepping import StepRequest
from .wire import Wire


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

    def on_line(self, frame: FrameType, file: str, line: int) -> bool:
        """Handle a line event; False means this line can stay silent until something changes.

        A bug in here must never surface as an exception in the user's code, so errors are
        reported on stderr and the script goes on.
        """
        if threading.get_ident() in self._busy:
            return True
        try:
            bp = self.breakpoints.at(file, line)
            if bp is not None and _repeat_of_caller_line(frame, line):
                bp = None
            if bp is not None and self._breakpoint_hit(bp, frame):
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

    def _breakpoint_hit(self, bp: Any, frame: FrameType) -> bool:
        """Apply condition, hit count and logpoint; True when this hit stopped the thread."""
        if bp.condition_code is not None:
            try:
                passed = bool(eval(bp.condition_code, frame.f_globals, frame.f_locals))
            except Exception as exc:  # a broken condition stops, so the user sees why
                self.stop(
                    frame,
                    "breakpoint",
                    breakpoint=bp.to_json(),
                    condition_error=f"condition {bp.condition!r} raised {type(exc).__name__}: {exc}",
                )
                return True
            if not passed:
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
                    "event": "log",
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
                self.wire.send({"event": "stopped", **paused.state()})
                resume = paused.serve(self.respond) if not self.wire.closed else Resume()
                self.paused = None
                paused.drain(self.respond)
                self.backend.refresh()  # forget what the previous step or pause armed
                if resume.kind != "continue" and not post_mortem:
                    frame = frames[0][0]
                    self.step = StepRequest.from_frame(
                        resume.kind, me, frame, resume.into_libraries
                    )
                    self.backend.arm_stack(frame)
                self.wire.send({"event": "resumed"})
        finally:
            self._busy.discard(me)

    # -- the daemon's commands (reader thread) ------------------------------------------------

    def respond(
        self, message: dict[str, Any], ok: bool, result: Any, extra: dict[str, Any] | None = None
    ) -> None:
        reply: dict[str, Any] = {"id": message.get("id"), "ok": ok}
        if ok:
            reply["result"] = result
        else:
            reply["error"] = result
            reply["extra"] = extra or {}
        self.wire.send(reply)

    def serve_daemon(self, on_run: threading.Event, config: dict[str, Any]) -> None:
        """The reader thread: route each command to the paused thread or handle it here."""
        me = threading.get_ident()
        self._busy.add(me)
        while True:
            message = self.wire.receive()
            if message is None:
                self.detach()
                on_run.set()
                return
            cmd = message.get("cmd", "")
            if cmd in PAUSED_COMMANDS:
                paused = self.paused
                if paused is None:
                    self.respond(
                        message, False, "the script is not paused; pause it or wait for a stop"
                    )
                else:
                    paused.queue.put(message)
                continue
            handler = getattr(self, f"cmd_{cmd}", None)
            if handler is None:
                self.respond(message, False, f"unknown command {cmd!r}")
                continue
            try:
                result = handler(**(message.get("args") or {}))
            except BreakpointError as exc:
                self.respond(message, False, str(exc), exc.extra)
            except Exception as exc:
                self.respond(
                    message, False, f"internal error in {cmd}: {type(exc).__name__}: {exc}"
                )
            else:
                self.respond(message, True, result)
                if cmd == "run":
                    config.update(message.get("args") or {})
                    on_run.set()

    def cmd_configure(self, breakpoints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Validate and set the start-up breakpoints all at once; any error refuses them all."""
        made = [self._build(spec) for spec in breakpoints or []]
        for item in made:
            self._add(item)
        self.backend.breakpoints_changed()
        return {"breakpoints": [item.to_json() for item in made]}

    def cmd_run(self, **_: Any) -> dict[str, Any]:
        return {"running": True}

    def cmd_set_breakpoint(self, **spec: Any) -> dict[str, Any]:
        item = self._add(self._build(spec))
        self.backend.breakpoints_changed()
        return item.to_json()

    def cmd_remove_breakpoint(
        self, file: str | None = None, line: int | None = None, checkpoint: str | None = None
    ) -> dict[str, Any]:
        if checkpoint:
            return self.breakpoints.remove_checkpoint(checkpoint).to_json()
        if not file or line is None:
            raise BreakpointError("say which breakpoint to remove: FILE:LINE, or --checkpoint NAME")
        bp = self.breakpoints.remove(file, int(line), self.cwd)
        self.backend.breakpoints_changed()
        return bp.to_json()

    def cmd_clear_breakpoints(self) -> dict[str, Any]:
        removed = self.breakpoints.clear()
        self.backend.breakpoints_changed()
        return {"removed": removed}

    def cmd_list_breakpoints(self) -> dict[str, Any]:
        table = self.breakpoints
        items = [bp.to_json() for bp in table.all()] + [
            f.to_json() for f in table.checkpoints.values()
        ]
        return {"breakpoints": items}

    def cmd_pause(self) -> dict[str, Any]:
        if self.paused is not None:
            return {"already_paused": True}
        self.pause_requested = True
        self.backend.refresh()
        self.backend.arm_all_threads()
        return {"pause_requested": True}

    def _build(self, spec: dict[str, Any]) -> Breakpoint | CheckpointFilter:
        if spec.get("checkpoint"):
            return make_checkpoint_filter(spec["checkpoint"], spec.get("condition"))
        return make_breakpoint(
            spec.get("file") or "",
            spec.get("line") or 0,
            condition=spec.get("condition"),
            hits=spec.get("hits"),
            log=spec.get("log"),
            cwd=self.cwd,
        )

    def _add(self, item: Breakpoint | CheckpointFilter) -> Breakpoint | CheckpointFilter:
        if isinstance(item, CheckpointFilter):
            return self.breakpoints.add_checkpoint(item)
        return self.breakpoints.add(item)

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
