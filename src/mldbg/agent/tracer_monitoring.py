"""Tracer backend for Python >= 3.12: ``sys.monitoring`` (PEP 669).

With no breakpoint and nothing stepping, no event is enabled at all.  With breakpoints,
PY_START is on globally and answers ``DISABLE`` for every code object that holds none;
LINE events are enabled only on code objects that hold one, and lines that are not
breakpoints answer ``DISABLE``.  Any change re-arms with ``restart_events()``.

Conditional breakpoints are compiled into the code where they can be
(:mod:`.compiled_conditions`): their lines get no LINE event unless the frame is being
stepped or paused, so a hot conditional breakpoint costs the condition, not a callback.
"""

from __future__ import annotations

import sys
import threading
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from .paths import canonical_code_file

if TYPE_CHECKING:
    from .compiled_conditions import CompiledConditions
    from .tracer import TracerClient


class MonitoringBackend:
    name = "monitoring"

    def __init__(self, debugger: TracerClient) -> None:
        self.debugger = debugger
        self._mon: Any = sys.monitoring  # type: ignore[attr-defined]
        self._tool = self._mon.DEBUGGER_ID
        self._events = self._mon.events
        self._disable = self._mon.DISABLE
        self._lined: set[CodeType] = set()  # code objects with LINE enabled locally
        self._lock = threading.RLock()
        self._installed = False  # breakpoints may be set before the script (and tracing) starts
        # Made (and its ast/dis/ctypes imports paid) with the first conditional breakpoint.
        self._compiled: CompiledConditions | None = None

    def install(self) -> None:
        mon = self._mon
        if mon.get_tool(self._tool) is not None:
            self._tool = next(
                (t for t in range(1, 6) if mon.get_tool(t) is None), self._tool
            )  # another debugger holds the slot; take a free one rather than fail
        mon.use_tool_id(self._tool, "mldbg")
        mon.register_callback(self._tool, self._events.PY_START, self._on_start)
        mon.register_callback(self._tool, self._events.LINE, self._on_line)
        mon.register_callback(self._tool, self._events.RAISE, self._on_raise)
        mon.register_callback(self._tool, self._events.PY_UNWIND, self._on_unwind)
        mon.register_callback(self._tool, self._events.PY_RETURN, self._on_return)
        self._installed = True
        self.refresh()

    def prepare_main(self, code: CodeType) -> CodeType:
        """The script's module code, with its conditional breakpoints compiled in."""
        with self._lock:
            compiled = self._compiled_conditions()
            return code if compiled is None else compiled.prepare_main(code)

    def _compiled_conditions(self) -> CompiledConditions | None:
        if self._compiled is None and any(bp.condition for bp in self.debugger.breakpoints.all()):
            from .compiled_conditions import CompiledConditions

            self._compiled = CompiledConditions(self.debugger)
        return self._compiled

    def uninstall(self) -> None:
        if not self._installed:
            return
        self._installed = False
        with self._lock:
            if self._compiled is not None:
                self._compiled.uninstall()
        mon = self._mon
        mon.set_events(self._tool, 0)
        for code in list(self._lined):
            mon.set_local_events(self._tool, code, 0)
        mon.register_callback(self._tool, self._events.PY_START, None)
        mon.register_callback(self._tool, self._events.LINE, None)
        mon.register_callback(self._tool, self._events.RAISE, None)
        mon.register_callback(self._tool, self._events.PY_UNWIND, None)
        mon.register_callback(self._tool, self._events.PY_RETURN, None)
        mon.free_tool_id(self._tool)

    # -- events -----------------------------------------------------------------------------

    def _on_start(self, code: CodeType, offset: int) -> object:  # None, or DISABLE
        debugger = self.debugger
        file = canonical_code_file(code.co_filename)
        if file not in debugger.breakpoints.by_file and not debugger.active:
            # The common answer, first: while breakpoints are set, every code object's
            # first call lands here (thousands during an import), and `code in set`
            # would hash the code object, constants and nested code included, each time.
            return self._disable
        if code in self._lined:
            return None
        compiled = None if self._compiled is None else self._compiled.starts_of(code)
        if (
            compiled is not None
            and not debugger.active
            and not (debugger.breakpoints.lines_in_code(code, file) - compiled.keys())
        ):
            return self._disable  # its breakpoints are compiled in: no LINE events needed
        if debugger.wants_code(code, file):
            self._enable_lines(code)
            return None
        step = debugger.step
        if step is not None and step.kind == "into" and not debugger.pause_requested:
            # Another thread may reach this code while the stepping thread needs it later:
            # DISABLE would silence it for every thread, so only decline this once.
            return None
        return self._disable

    def _on_line(self, code: CodeType, line: int) -> object:
        frame: FrameType = sys._getframe(1)
        conditions = self._compiled
        compiled = None if conditions is None else conditions.starts_of(code)
        if conditions is not None and compiled is not None and line in compiled:
            # The compiled condition reports this breakpoint; a step or a pause must still
            # see the line, once, with the breakpoint taking precedence as usual.
            if not self.debugger.active:
                return self._disable
            if frame.f_lasti == compiled[line]:
                conditions.hooks.line_event(frame, canonical_code_file(code.co_filename), line)
            return None
        if self.debugger.on_line(frame, canonical_code_file(code.co_filename), line):
            return None
        return self._disable

    def _on_return(self, code: CodeType, offset: int, value: object) -> object:
        """Enabled only with the LINE events of code the line step records (mldbg line)."""
        if not self.debugger.active:
            return self._disable
        self.debugger.on_return(sys._getframe(1), value)
        return None

    # -- exception breakpoints (armed only while one is set: see refresh_globals) -----------------

    def _on_raise(self, code: CodeType, offset: int, exc: BaseException) -> None:
        self.debugger.on_exception(sys._getframe(1), exc, True)

    def _on_unwind(self, code: CodeType, offset: int, exc: BaseException) -> None:
        """An exception leaves a frame: its caller receives it (the user's code, perhaps)."""
        caller = sys._getframe(1).f_back
        if caller is not None:
            self.debugger.on_exception(caller, exc, False)

    # -- changes ----------------------------------------------------------------------------

    def _enable_lines(self, code: CodeType) -> None:
        if not self._installed:
            return
        events = self._events.LINE
        if self.debugger.records_thread(threading.get_ident()):
            events |= self._events.PY_RETURN  # the line step records what frames return
        with self._lock:
            self._mon.set_local_events(self._tool, code, events)
            self._lined.add(code)

    def refresh(self) -> None:
        """Re-arm for the debugger's current state and forget every DISABLE answered so far.

        Code objects armed for a finished step or pause lose their LINE events; those
        holding a breakpoint keep them, since one of their frames may be running a loop.
        """
        if not self._installed:
            return
        table = self.debugger.breakpoints
        with self._lock:
            for code in list(self._lined):
                if not table.lines_in_code(code, canonical_code_file(code.co_filename)):
                    self._mon.set_local_events(self._tool, code, 0)
                    self._lined.discard(code)
        self.refresh_globals()

    def breakpoints_changed(self) -> None:
        with self._lock:
            compiled = self._compiled_conditions()
            if compiled is not None:
                compiled.sync()
        self.refresh()
        for frame in self.debugger.breakpoints.running_frames():
            self._enable_lines(frame.f_code)

    def arm_stack(self, frame: FrameType | None) -> None:
        while frame is not None:
            self._enable_lines(frame.f_code)
            frame = frame.f_back
        self.refresh_globals()

    def arm_all_threads(self) -> None:
        """Pausing turns LINE on globally (in refresh); nothing per frame is needed."""

    def arm_recording(self, frame: FrameType | None) -> None:
        """PY_START on again (the code the line step wants gets LINE and PY_RETURN as it
        starts), and ``frame``'s code now, since it runs already."""
        if frame is not None:
            self._enable_lines(frame.f_code)
        self.refresh_globals()

    def refresh_globals(self) -> None:
        """Global events: PY_START while anything could stop, LINE everywhere while pausing."""
        if not self._installed:
            return
        with self._lock:
            wanted = (
                self._events.PY_START if (self.debugger.breakpoints or self.debugger.active) else 0
            )
            if self.debugger.pause_requested:
                wanted |= self._events.LINE
            if self.debugger.breakpoints.exceptions.raising:
                wanted |= self._events.RAISE | self._events.PY_UNWIND
            self._mon.set_events(self._tool, wanted)
            self._mon.restart_events()
