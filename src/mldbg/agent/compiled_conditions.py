"""Conditional breakpoints compiled into the code, for the ``sys.monitoring`` backend (3.12+).

``sys.monitoring`` makes a breakpoint that never stops free, but a *conditional* one on
a hot line still costs a Python callback plus an ``eval`` of the condition in the
frame's locals at every pass (8x on a loop where that line is most of the work).  So
conditional breakpoints on lines a compiled-in condition can serve (a statement's own
line, see :mod:`.instrument`) are handed to this module: the functions of that file get
an instrumented copy of their code where ``if CONDITION: __mldbg_bp__(LINE, 2)`` runs
in the frame itself, and a false condition costs what the expression costs.  Every
other breakpoint, and these lines in frames still running the old code (a loop already
under way, a suspended generator), stay with the monitoring backend's LINE events.

What is changed, and undone exactly when the breakpoints change:

* ``func.__code__`` of the file's functions (found by :func:`.live_code.scan`);
* constants of code objects that running frames create functions from (the script's
  module body, paused at entry), through :func:`.cpython.replace_const`;
* the script's own module code, before it runs (:meth:`prepare_main`).

* the code of modules imported later (a wrapper around ``SourceLoader.get_code``, as
  the 3.10/3.11 backend does), so a condition set at the entry stop in a library file
  not imported yet is compiled in too.
"""

from __future__ import annotations

import builtins
import sys
import weakref
from collections.abc import Callable
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from .cpython import replace_const
from .inline_conditions import ConditionHooks, compile_conditions, dynamo_ready, statement_starts
from .instrument import HOOK, PASSED, RAISED, InstrumentError, instrument_file
from .live_code import GENERATOR_CODE, Applied, Live, scan
from .paths import canonical_code_file

if TYPE_CHECKING:
    from importlib._bootstrap_external import SourceLoader

    from .tracer import TracerClient

_Key = frozenset[tuple[int, str]]  # (line, condition) pairs of one file


class CompiledConditions:
    """The compiled-in conditional breakpoints of one debugger (3.12+)."""

    def __init__(self, debugger: TracerClient) -> None:
        self.debugger = debugger
        self.hooks = ConditionHooks(debugger)
        self._applied: dict[str, Applied] = {}
        # id(instrumented code) -> {line: offset where its condition's statement begins};
        # every instrumented code object is kept alive, so ids stay unique.
        self._starts: dict[int, dict[int, int]] = {}
        self._origins: dict[int, tuple[CodeType, CodeType]] = {}
        self._hook_fn = self._hook
        self._wrapper_code: CodeType | None = None
        self._published = False
        # SourceLoader.get_code while wrapped (untyped: mypy reads putting it back on the
        # class as assigning a method of a method)
        self._get_code_original: Any = None

    # -- what the monitoring backend asks ---------------------------------------------------

    def starts_of(self, code: CodeType) -> dict[int, int] | None:
        """Lines of ``code`` whose condition is compiled into it (None for most code)."""
        if not self._starts:
            return None
        return self._starts.get(id(code))

    def prepare_main(self, code: CodeType) -> CodeType:
        self.sync()
        applied = self._applied.get(canonical_code_file(code.co_filename))
        if applied is not None and applied.instr.inline and code == applied.instr.plain:
            return applied.instr.module
        return code

    def sync(self) -> None:
        """Bring the compiled-in conditions in line with the breakpoint table."""
        if not compile_conditions():
            return
        table = self.debugger.breakpoints
        with table.lock:
            wanted: dict[str, _Key] = {}
            for file, bps in table.by_file.items():
                key = frozenset((line, bp.condition) for line, bp in bps.items() if bp.condition)
                if key:
                    wanted[file] = key
        current = {
            file: frozenset(applied.instr.conditions.items())
            for file, applied in self._applied.items()
        }
        changed = {f for f in set(wanted) | set(current) if wanted.get(f) != current.get(f)}
        if not changed:
            return
        known = [
            plain
            for file, applied in self._applied.items()
            if file in changed
            for _, plain in applied.instr.origin.values()
        ]
        live = scan(changed, known)
        for file in changed:
            self._undo(file, live)
        for file in changed:
            if file in wanted:
                self._apply(file, wanted[file], live)
        if self._applied:
            self._publish()
        self._update_import_hook()

    def uninstall(self) -> None:
        live = scan(set(self._applied))
        for file in list(self._applied):
            self._undo(file, live)
        self._update_import_hook()
        # The hook stays in builtins: a frame still running instrumented code calls it.

    # -- the hook the compiled code calls ------------------------------------------------------

    def _hook(self, line: int, mode: int = PASSED) -> None:
        try:
            frame: FrameType = sys._getframe(1)
            if frame.f_code is self._wrapper_code and frame.f_back is not None:
                frame = frame.f_back  # called through torch.compiler.disable's wrapper
            if mode in (PASSED, RAISED) and id(frame.f_code) in self._starts:
                self.hooks.hook(frame, line, mode)
            # else: code whose conditions were taken back, still running in this frame:
            # LINE events serve its breakpoints now.
        except Exception as exc:  # never an exception in the user's code
            _report(exc)

    def _publish(self) -> None:
        """The hook in builtins; wrapped in ``torch.compiler.disable`` once torch is loaded
        (dynamo would otherwise try to inline it and warn about ``sys._getframe``)."""
        if self._wrapper_code is not None:
            return
        hook: Callable[..., object] = self._hook_fn
        if dynamo_ready():
            try:
                wrapped = sys.modules["torch.compiler"].disable(self._hook_fn, recursive=True)
                code = getattr(wrapped, "__code__", None)
                if isinstance(code, CodeType):
                    hook, self._wrapper_code = wrapped, code
            except Exception:
                pass
        setattr(builtins, HOOK, hook)
        self._published = True

    # -- modules imported while conditions are compiled in -------------------------------------

    def _instrumented_module(self, code: CodeType) -> CodeType:
        applied = self._applied.get(canonical_code_file(code.co_filename))
        if applied is not None and applied.instr.inline and code == applied.instr.plain:
            return applied.instr.module
        return code

    def _update_import_hook(self) -> None:
        from importlib import _bootstrap_external  # type: ignore[attr-defined]

        loader = _bootstrap_external.SourceLoader
        wanted = any(applied.instr.inline for applied in self._applied.values())
        if wanted and self._get_code_original is None:
            original = loader.get_code
            owner = self

            def get_code(self: SourceLoader, fullname: str) -> CodeType | None:
                code = original(self, fullname)
                if code is not None and owner._applied:
                    try:
                        code = owner._instrumented_module(code)
                    except Exception as exc:  # never break an import
                        _report(exc)
                return code

            get_code.__wrapped__ = original  # type: ignore[attr-defined]
            self._get_code_original = original
            loader.get_code = get_code  # type: ignore[method-assign]
        elif not wanted and self._get_code_original is not None:
            loader.get_code = self._get_code_original  # type: ignore[method-assign]
            self._get_code_original = None

    # -- applying ---------------------------------------------------------------------------

    def _plain_of(self, code: CodeType) -> CodeType:
        entry = self._origins.get(id(code))
        return entry[1] if entry is not None and entry[0] is code else code

    def _apply(self, file: str, key: _Key, live: Live) -> None:
        conditions = dict(key)
        try:
            instr = instrument_file(file, frozenset(conditions), conditions, inline_only=True)
        except InstrumentError:
            return  # LINE events serve them, as before
        applied = Applied(instr)
        self._applied[file] = applied
        if not instr.inline:
            return
        for key_id, pair in instr.origin.items():
            self._origins[key_id] = pair
        for key_id, lines in instr.inline.items():
            self._starts[key_id] = statement_starts(instr.origin[key_id][0], lines)
        for func in live.functions.get(file, []):
            code = func.__code__
            new = instr.changed.get(self._plain_of(code))
            if new is None or new is code:
                continue
            try:
                func.__code__ = new
            except ValueError:  # a closure of another shape: LINE events serve it
                continue
            applied.swapped.append((weakref.ref(func), code, new))
        # Frames already running create their nested functions from their constants.
        holders: dict[int, CodeType] = {}
        for top in sys._current_frames().values():
            frame: FrameType | None = top
            while frame is not None:
                if canonical_code_file(frame.f_code.co_filename) == file:
                    holders[id(frame.f_code)] = frame.f_code
                frame = frame.f_back
        for gen in live.generators.get(file, []):
            code_attr, frame_attr, _ = GENERATOR_CODE[type(gen)]
            if getattr(gen, frame_attr) is not None:
                code = getattr(gen, code_attr)
                holders[id(code)] = code
        for holder in holders.values():
            applied.patch_consts(holder, self._plain_of, replace_const)

    def _undo(self, file: str, live: Live) -> None:
        applied = self._applied.pop(file, None)
        if applied is None:
            return
        applied.undo(live.functions.get(file, []), replace_const)
        for key_id in applied.instr.inline:
            self._starts.pop(key_id, None)


def _report(exc: BaseException) -> None:
    stream = sys.__stderr__
    if stream is not None:
        stream.write(f"mldbg: internal error in compiled conditions: {type(exc).__name__}: {exc}\n")
        stream.flush()
