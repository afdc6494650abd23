"""Tracer backend for Python 3.10 / 3.11: ``sys.settrace``, decided once per code object.

The global trace function only answers "does this code object need line events?" from a
cache, returning ``None`` for everything else, so a function without breakpoints costs
one dictionary lookup per call and nothing per line.
"""

from __future__ import annotations

import sys
import threading
from types import CodeType, FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from .breakpoints import running_frames
from .paths import canonical_code_file

if TYPE_CHECKING:
    from .cpython import TraceFunction
    from .tracer import TracerClient


class SettraceBackend:
    name = "settrace"

    def __init__(self, debugger: TracerClient) -> None:
        self.debugger = debugger
        self._decisions: dict[CodeType, bool] = {}  # only code in files that hold breakpoints
        self._files: dict[str, bool] = {}
        # One bound method, created once: frames compare their f_trace with it by identity.
        self._local_fn = self._local

    def install(self) -> None:
        threading.settrace(self._global)
        sys.settrace(self._global)

    def uninstall(self) -> None:
        threading.settrace(None)  # type: ignore[arg-type]
        sys.settrace(None)

    # -- events -----------------------------------------------------------------------------

    def _global(self, frame: FrameType, event: str, arg: Any) -> TraceFunction | None:
        local = self._decide(frame)
        if local is None and self.debugger.breakpoints.exceptions.raising:
            # An exception breakpoint needs 'exception' events in every frame, not its lines.
            frame.f_trace_lines = False
            return self._local_fn
        return local

    def _decide(self, frame: FrameType) -> TraceFunction | None:
        debugger = self.debugger
        code = frame.f_code
        if debugger.active:
            if debugger.wants_code(code, canonical_code_file(code.co_filename)):
                return self._local_fn
            return None
        decision = self._decisions.get(code)
        if decision is None:
            # Files first: one entry per file without breakpoints, not one per code object,
            # so code created in a loop (eval, namedtuple, torch.fx) costs no memory.
            file = canonical_code_file(code.co_filename)
            file_has = self._files.get(file)
            if file_has is None:
                file_has = self._files[file] = bool(debugger.breakpoints.by_file.get(file))
            if not file_has:
                return None
            decision = bool(debugger.breakpoints.lines_in_code(code, file))
            self._decisions[code] = decision
        return self._local_fn if decision else None

    def _local(self, frame: FrameType, event: str, arg: Any) -> TraceFunction | None:
        if event == "line":
            code = frame.f_code
            file = canonical_code_file(code.co_filename)
            if not self.debugger.on_line(frame, file, frame.f_lineno) and not (
                self.debugger.breakpoints.lines_in_code(code, file)
            ):
                if self.debugger.breakpoints.exceptions.raising:
                    frame.f_trace_lines = False  # still wanted for its exceptions
                    return self._local_fn
                # Armed for a step or a pause that is over: stop paying for this frame's lines.
                frame.f_trace = None
                return None
        elif event == "exception":
            self._exception(frame, arg)
        elif event == "return":
            self.debugger.on_return(frame, arg)
        return self._local_fn

    def _exception(
        self, frame: FrameType, arg: tuple[type[BaseException], BaseException, TracebackType | None]
    ) -> None:
        """Raised here (the traceback has no deeper entry) or received from a callee."""
        if self.debugger.breakpoints.exceptions.raising:
            tb = arg[2]
            self.debugger.on_exception(frame, arg[1], tb is None or tb.tb_next is None)

    # -- changes ----------------------------------------------------------------------------

    def prepare_main(self, code: CodeType) -> CodeType:
        """Nothing to compile in: conditions are evaluated when their line is traced."""
        return code

    def refresh(self) -> None:
        """Nothing to re-arm: the global function reads the debugger's state on every call."""

    def breakpoints_changed(self) -> None:
        self._decisions = {}
        self._files = {}
        if self.debugger.breakpoints.exceptions.raising:
            for frame in running_frames():  # frames already running see their exceptions too
                if frame.f_trace is None:
                    frame.f_trace = self._local_fn
                    frame.f_trace_lines = False
        # Frames already running (a loop at module level, say) never see a new 'call' event:
        # give those that now hold a breakpoint a local trace function directly.
        for frame in self.debugger.breakpoints.running_frames():
            self._attach(frame)

    def arm_stack(self, frame: FrameType | None) -> None:
        """A step needs line events in the frame it began in and in every caller."""
        while frame is not None:
            self._attach(frame)
            frame = frame.f_back

    def arm_all_threads(self) -> None:
        for frame in running_frames():
            self._attach(frame)

    def arm_recording(self, frame: FrameType | None) -> None:
        """The global trace function already asks about every new frame (``_decide``);
        ``frame``, running already, gets line events too."""
        if frame is not None:
            self._attach(frame)

    def _attach(self, frame: FrameType) -> None:
        if frame.f_trace is None:
            frame.f_trace = self._local_fn
        frame.f_trace_lines = True
