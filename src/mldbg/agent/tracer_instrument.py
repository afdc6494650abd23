"""Tracer backend for Python 3.10 / 3.11 without a global trace function.

``sys.settrace`` makes every Python call of a thread call a Python function, from the
first import on, even with no breakpoint set; that alone costs 4-8x on call-heavy code.
This backend keeps the debuggee untraced (``sys.gettrace()`` is ``None``) except where
something needs it:

* **Breakpoints** are hook calls compiled into the code objects that hold them
  (:mod:`.instrument`).  Function objects using those code objects get the instrumented
  copy (``func.__code__``); modules imported later are instrumented as they load (a
  wrapper around ``SourceLoader.get_code``); a frame that is already running and creates
  functions from its constants (the script's module body, a closure factory) gets the
  instrumented constants in place (:mod:`.cpython`).  Nothing else in the process pays.
* **Frames already running** code that now holds a breakpoint (a loop at module level, a
  long ``forward``) cannot change code: they get ``f_trace`` and their thread gets this
  backend's trace function, through ``_PyEval_SetTrace`` for threads other than the
  caller's, until those frames return.
* **Steps** trace the stepping thread only; **pause** traces every thread until one of
  them stops.  A thread whose reason to be traced is gone removes its own trace function
  at its next event.
* Breakpoints a hook cannot serve exactly (a line holding a lambda or a generator
  expression, a loop header in a generator, a docstring line, a file edited since it was
  imported, a suspended generator created before the breakpoint) make the backend trace
  every thread the old way (the per-code-object decisions of :class:`SettraceBackend`)
  for as long as they exist: slower, never a missed stop.

A line that has a hook is handled by the hook, never by the trace function as well, so
a traced frame (a step, a pause) and a hook never report the same line twice.
"""

from __future__ import annotations

import builtins
import dis
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from ..errors import InterpreterUnsupported
from .cpython import CPython
from .inline_conditions import ConditionHooks, compile_conditions, statement_starts
from .inline_conditions import dynamo_ready as _dynamo_ready
from .instrument import ARM, HOOK, PASSED, InstrumentError, instrument_file
from .live_code import GENERATOR_CODE as _GENERATOR_CODE
from .live_code import Applied, scan
from .live_code import Live as _Live
from .paths import canonical_code_file
from .tracer_settrace import SettraceBackend

if TYPE_CHECKING:
    from importlib._bootstrap_external import SourceLoader

    from .breakpoints import Breakpoint
    from .cpython import TraceFunction
    from .tracer import TracerClient

__all__ = ["InstrumentBackend", "InterpreterUnsupported"]

_AGENT_THREAD = "mldbg-agent"  # the reader thread the runner starts: never traced


def _hook_offsets(code: CodeType) -> frozenset[int]:
    """Offsets where a hook statement begins: a line event there is the hook's to report.

    Only there: the same line can fire again later from other instructions (a decorator
    applied after the ``def`` line ran, a ``with`` line on exit), and those events are
    the trace function's.
    """
    offsets = set()
    previous = None
    for instruction in dis.get_instructions(code):
        if (
            instruction.argval == HOOK
            and instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME")
            # A compiled-in condition's hook is called after the condition, inside the
            # statement: no line event starts there (that line is ConditionHooks' to serve).
            and (instruction.starts_line or previous is not None and previous.starts_line)
        ):
            start = (
                previous if previous is not None and previous.opname == "PUSH_NULL" else instruction
            )
            offsets.add(start.offset)
        previous = instruction
    return frozenset(offsets)


class InstrumentBackend(SettraceBackend):
    name = "instrument"

    def __init__(self, debugger: TracerClient) -> None:
        super().__init__(debugger)
        self._native = CPython()  # raises InterpreterUnsupported: the debugger then uses settrace
        self._global_fn = self._global
        self._hook_fn = self._hook
        self._lock = threading.RLock()
        self._installed = False
        self._version = -1  # breakpoint table version last applied
        self._applied: dict[str, Applied] = {}
        self._traced_files: dict[str, _Key] = {}  # served by tracing, not hooks
        self._old_generators: weakref.WeakSet[object] = weakref.WeakSet()
        # Every instrumented code object ever made (kept alive, so ids stay unique):
        # id -> (instrumented, plain); and the offsets where its hooks begin.
        self._origins: dict[int, tuple[CodeType, CodeType]] = {}
        self._hooked: dict[int, frozenset[int]] = {}
        # id(instrumented code) -> {line: offset of its statement} for the lines whose
        # breakpoint condition is compiled into that code
        self._inline_lines: dict[int, dict[int, int]] = {}
        self._conditions = ConditionHooks(debugger)
        # Frames traced for breakpoints, per thread: running old code (found when the
        # breakpoints changed) and armed by a hook (a loop header, say).
        self._old_frames: dict[int, set[FrameType]] = {}
        self._armed_frames: dict[int, set[FrameType]] = {}
        # SourceLoader.get_code while wrapped (untyped: mypy reads putting it back on the
        # class as assigning a method of a method)
        self._get_code_original: Any = None
        self._wrapper_code: CodeType | None = None  # torch.compiler.disable's frame, if any

    # -- lifecycle ----------------------------------------------------------------------------

    def install(self) -> None:
        self._publish_hook()
        self._installed = True
        with self._lock:
            self._sync()
        if self._thread_needed(threading.get_ident()):
            sys.settrace(self._global_fn)  # the entry stop: this thread runs the script
        self._update_new_threads()

    def uninstall(self) -> None:
        with self._lock:
            self._installed = False
            live = self._scan(set(self._applied))
            for file in list(self._applied):
                self._undo(file, live)
            self._traced_files.clear()
            self._old_frames.clear()
            self._armed_frames.clear()
            self._update_import_hook()
        threading.settrace(None)  # type: ignore[arg-type]
        sys.settrace(None)
        # The hook stays in builtins: a frame still running instrumented code calls it.

    def prepare_main(self, code: CodeType) -> CodeType:
        """The code the runner executes as ``__main__``: instrumented if it holds breakpoints."""
        self._publish_hook()
        with self._lock:
            self._sync()
            return self._instrumented_module(code)

    # -- what runs in the debuggee ---------------------------------------------------------------

    def _hook(self, line: int, mode: int = 0) -> None:
        """``__mldbg_bp__(LINE[, mode])``: a line event for this frame, delivered by the code."""
        frame = sys._getframe(1)
        if frame.f_code is self._wrapper_code and frame.f_back is not None:
            frame = frame.f_back  # called through torch.compiler.disable's wrapper
        if mode >= PASSED:
            try:
                current = self._serves(frame.f_code, _file_of(frame.f_code))
                self._conditions.hook(frame, line, mode, current)
            except Exception as exc:  # never an exception in the user's code
                _report(exc)
            return
        self.debugger.on_line(frame, canonical_code_file(frame.f_code.co_filename), line)
        if mode == ARM:
            try:
                self._arm_current(frame)
            except Exception as exc:  # never an exception in the user's code
                _report(exc)

    def _publish_hook(self) -> None:
        """Put the hook in builtins, wrapped for torch's compiler once torch is loaded.

        Dynamo would otherwise inline the hook into a compiled function that holds a
        breakpoint and warn, on the user's stderr, that it cannot trace ``sys._getframe``.
        Wrapped in ``torch.compiler.disable`` it is a clean graph break: the compiled code
        runs eagerly from that line and the breakpoint stops there.
        """
        if self._wrapper_code is not None:
            return
        hook: Callable[..., object] = self._hook_fn
        if _dynamo_ready():
            try:
                wrapped = sys.modules["torch.compiler"].disable(self._hook_fn, recursive=True)
                code = getattr(wrapped, "__code__", None)
                if isinstance(code, CodeType):
                    hook, self._wrapper_code = wrapped, code
            except Exception:  # a torch without it: dynamo then inlines the hook and warns
                pass
        setattr(builtins, HOOK, hook)

    def _global(self, frame: FrameType, event: str, arg: Any) -> TraceFunction | None:
        if not self._thread_needed(threading.get_ident()):
            sys.settrace(None)
            return None
        return super()._global(frame, event, arg)

    def _local(self, frame: FrameType, event: str, arg: Any) -> TraceFunction | None:
        if event == "line":
            code = frame.f_code
            hooked = self._hooked.get(id(code))
            if hooked and frame.f_lasti in hooked:
                return self._local_fn  # the hook that starts here reports this line
            inline = self._inline_lines.get(id(code))
            if inline and frame.f_lineno in inline:
                if frame.f_lasti == inline[frame.f_lineno]:
                    self._conditions.line_event(frame, _file_of(code), frame.f_lineno)
                return self._local_fn
            return super()._local(frame, event, arg)
        if event == "exception":
            self._exception(frame, arg)
            return self._local_fn
        if event == "return":
            self.debugger.on_return(frame, arg)
            ident = threading.get_ident()
            for table in (self._armed_frames, self._old_frames):
                frames = table.get(ident)
                if frames and frame in frames:
                    frames.discard(frame)
                    if not frames:
                        table.pop(ident, None)
            if not self._thread_needed(ident):
                sys.settrace(None)
                return None
        return self._local_fn

    def _thread_needed(self, ident: int) -> bool:
        debugger = self.debugger
        step = debugger.step
        return bool(
            debugger.pause_requested
            or (step is not None and step.thread == ident)
            or ident in self._armed_frames
            or ident in self._old_frames
            or self._traced_files
            or self._old_generators
            or debugger.breakpoints.exceptions.raising
            or debugger.records_thread(ident)
        )

    def _arm_current(self, frame: FrameType) -> None:
        frame.f_trace = self._local_fn
        frame.f_trace_lines = True
        self._armed_frames.setdefault(threading.get_ident(), set()).add(frame)
        if sys.gettrace() is not self._global_fn:
            sys.settrace(self._global_fn)

    # -- the interface the debugger drives ----------------------------------------------------------

    def refresh(self) -> None:
        """Re-apply breakpoints if they changed; drop this thread's tracing if nothing needs it."""
        if self._version != self.debugger.breakpoints.version:
            with self._lock:
                self._sync()
        elif self._applied and self._wrapper_code is None:
            self._publish_hook()
        self._update_new_threads()
        if sys.gettrace() is self._global_fn and not self._thread_needed(threading.get_ident()):
            sys.settrace(None)

    def breakpoints_changed(self) -> None:
        with self._lock:
            self._sync()

    def arm_stack(self, frame: FrameType | None) -> None:
        """A step: line events in the frame it began in and every caller, in this thread only."""
        while frame is not None:
            self._attach(frame)
            frame = frame.f_back
        sys.settrace(self._global_fn)

    def arm_recording(self, frame: FrameType | None) -> None:
        """The line step records on this thread: its new frames are asked about
        (``_decide``) from now on, and ``frame``, running already, gets line events."""
        if frame is not None:
            self._attach(frame)
        sys.settrace(self._global_fn)

    def arm_all_threads(self) -> None:
        """A pause: trace every thread (the reader thread aside) until one of them stops.

        Also when one thread stopped and the others must stop too: the caller is then the
        stopped thread, which needs no tracing (it serves commands, and evaluations there
        run untraced)."""
        self._update_new_threads()
        me = threading.get_ident()
        self._trace_threads([i for i in self._user_threads() if i != me], attach_all=True)

    # -- applying breakpoints ------------------------------------------------------------------

    def _sync(self) -> None:
        """Bring the process in line with the breakpoint table (called under the lock)."""
        table = self.debugger.breakpoints
        with table.lock:
            version = table.version
            wanted = {file: _wanted(bps) for file, bps in table.by_file.items()}
        current = {
            file: (applied.instr.lines, frozenset(applied.instr.conditions.items()))
            for file, applied in self._applied.items()
        }
        current.update(self._traced_files)
        changed = {f for f in set(wanted) | set(current) if wanted.get(f) != current.get(f)}
        # The per-code decisions traced threads use (SettraceBackend._global) are stale now.
        self._decisions = {}
        self._files = {}
        if changed:
            live = self._scan(changed)
            for file in changed:
                self._undo(file, live)
            for file in changed:
                if file in wanted:
                    self._apply(file, wanted[file], live)
        self._version = version
        if self._applied:
            self._publish_hook()
        for ident, frames in list(self._armed_frames.items()):
            for frame in list(frames):
                if not table.lines_in_code(frame.f_code, _file_of(frame.f_code)):
                    frames.discard(frame)
            if not frames:
                self._armed_frames.pop(ident, None)
        self._update_import_hook()
        self._trace_old_frames()
        self._update_new_threads()
        if self._traced_files or self._old_generators:
            self._trace_threads(self._user_threads(), attach_all=False)
        if table.exceptions.raising:
            self._trace_for_exceptions()

    def _scan(self, files: set[str]) -> _Live:
        known = [
            plain
            for file, applied in self._applied.items()
            if file in files
            for _, plain in applied.instr.origin.values()
        ]
        return scan(files, known)

    def _plain_of(self, code: CodeType) -> CodeType:
        entry = self._origins.get(id(code))
        return entry[1] if entry is not None and entry[0] is code else code

    def _apply(self, file: str, key: _Key, live: _Live) -> None:
        lines, conditions = key
        try:
            instr = instrument_file(file, lines, dict(conditions))
        except InstrumentError:
            self._traced_files[file] = key
            return
        if instr.uncovered:
            self._traced_files[file] = key
            return
        for key_id, (code, _) in instr.origin.items():
            self._origins[key_id] = (code, instr.origin[key_id][1])
            self._hooked[key_id] = _hook_offsets(code)
        for key_id, inline in instr.inline.items():
            self._inline_lines[key_id] = statement_starts(instr.origin[key_id][0], inline)
        applied = Applied(instr)
        self._applied[file] = applied
        table = self.debugger.breakpoints
        mismatch = False
        for func in live.functions.get(file, []):
            code = func.__code__
            new = instr.changed.get(self._plain_of(code))
            if new is None:
                if self._origins.get(id(code), (None,))[0] is not code and _tree_holds(code, lines):
                    mismatch = True  # running code that is not this file's text
                continue
            if new is code:
                continue
            try:
                func.__code__ = new
            except ValueError:
                mismatch = True
                continue
            applied.swapped.append((weakref.ref(func), code, new))
        # Frames already running create their nested functions from their constants.
        holders = [frame.f_code for frame in _all_frames() if _file_of(frame.f_code) == file]
        for gen in live.generators.get(file, []):
            code_attr, frame_attr, running_attr = _GENERATOR_CODE[type(gen)]
            code = getattr(gen, code_attr)
            if getattr(gen, frame_attr) is None:
                continue  # finished
            holders.append(code)
            if (
                not getattr(gen, running_attr)
                and not self._serves(code, file)
                and table.lines_in_code(code, file)
            ):
                self._old_generators.add(gen)
        seen: set[int] = set()
        for holder in holders:
            if id(holder) in seen:
                continue
            seen.add(id(holder))
            applied.patch_consts(holder, self._plain_of, self._native.replace_const)
        if mismatch:
            self._undo(file, live)
            self._traced_files[file] = key

    def _undo(self, file: str, live: _Live) -> None:
        self._traced_files.pop(file, None)
        applied = self._applied.pop(file, None)
        if applied is not None:
            applied.undo(live.functions.get(file, []), self._native.replace_const)

    def _serves(self, code: CodeType, file: str) -> bool:
        """Is ``code`` instrumented for the breakpoints set now (its hooks report them)?"""
        applied = self._applied.get(file)
        if applied is None:
            return False
        entry = applied.instr.origin.get(id(code))
        return entry is not None and entry[0] is code

    def _instrumented_module(self, code: CodeType) -> CodeType:
        file = canonical_code_file(code.co_filename)
        applied = self._applied.get(file)
        if applied is not None and code == applied.instr.plain:
            return applied.instr.module
        return code

    # -- threads ---------------------------------------------------------------------------

    def _trace_old_frames(self) -> None:
        """Trace frames running code that holds a breakpoint but no hook for it."""
        table = self.debugger.breakpoints
        old: dict[int, set[FrameType]] = {}
        for ident, top in sys._current_frames().items():
            frame: FrameType | None = top
            while frame is not None:
                code = frame.f_code
                file = _file_of(code)
                if table.lines_in_code(code, file) and not self._serves(code, file):
                    old.setdefault(ident, set()).add(frame)
                frame = frame.f_back
        self._old_frames = old
        for frames in old.values():
            for frame in frames:
                self._attach(frame)
        if old:
            self._native.set_thread_trace(list(old), self._global_fn)

    def _user_threads(self) -> list[int]:
        agents = {t.ident for t in threading.enumerate() if t.name == _AGENT_THREAD}
        return [ident for ident in sys._current_frames() if ident not in agents]

    def _trace_threads(self, idents: Iterable[int], attach_all: bool) -> None:
        idents = list(idents)
        if attach_all:
            frames = sys._current_frames()
            for ident in idents:
                frame: FrameType | None = frames.get(ident)
                while frame is not None:
                    self._attach(frame)
                    frame = frame.f_back
        self._native.set_thread_trace(idents, self._global_fn)

    def _trace_for_exceptions(self) -> None:
        """``break --raised``: every thread traced for 'exception' events, not for lines."""
        frames = sys._current_frames()
        for ident in self._user_threads():
            frame: FrameType | None = frames.get(ident)
            while frame is not None:
                if frame.f_trace is None:
                    frame.f_trace = self._local_fn
                    frame.f_trace_lines = False
                frame = frame.f_back
        self._native.set_thread_trace(self._user_threads(), self._global_fn)

    def _update_new_threads(self) -> None:
        everywhere = bool(
            self.debugger.pause_requested
            or self._traced_files
            or self._old_generators
            or self.debugger.breakpoints.exceptions.raising
        )
        threading.settrace(self._global_fn if everywhere else None)  # type: ignore[arg-type]

    # -- modules imported while breakpoints are set ----------------------------------------------

    def _update_import_hook(self) -> None:
        from importlib import _bootstrap_external  # type: ignore[attr-defined]

        loader = _bootstrap_external.SourceLoader
        if self._applied and self._get_code_original is None:
            original = loader.get_code
            backend = self

            def get_code(self: SourceLoader, fullname: str) -> CodeType | None:
                code = original(self, fullname)
                if code is not None and backend._applied:
                    if backend._wrapper_code is None:
                        backend._publish_hook()  # torch may have been loaded since
                    try:
                        code = backend._instrumented_module(code)
                    except Exception as exc:
                        _report(exc)
                return code

            get_code.__wrapped__ = original  # type: ignore[attr-defined]
            self._get_code_original = original
            loader.get_code = get_code  # type: ignore[method-assign]
        elif not self._applied and self._get_code_original is not None:
            loader.get_code = self._get_code_original  # type: ignore[method-assign]
            self._get_code_original = None


_Key = tuple[frozenset[int], frozenset[tuple[int, str]]]  # lines, (line, condition) pairs


def _wanted(bps: dict[int, Breakpoint]) -> _Key:
    """What a file's instrumentation depends on: its lines and their conditions."""
    if not compile_conditions():
        return frozenset(bps), frozenset()
    conditions = frozenset((line, bp.condition) for line, bp in bps.items() if bp.condition)
    return frozenset(bps), conditions


def _file_of(code: CodeType) -> str:
    return canonical_code_file(code.co_filename)


def _all_frames() -> list[FrameType]:
    frames = []
    for top in sys._current_frames().values():
        frame: FrameType | None = top
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
    return frames


def _tree_holds(code: CodeType, lines: frozenset[int]) -> bool:
    if any(line in lines for _, _, line in code.co_lines()):
        return True
    return any(_tree_holds(c, lines) for c in code.co_consts if isinstance(c, CodeType))


def _report(exc: BaseException) -> None:
    stream = sys.__stderr__
    if stream is not None:
        stream.write(
            f"mldbg: internal error in the instrument backend: {type(exc).__name__}: {exc}\n"
        )
        stream.flush()
