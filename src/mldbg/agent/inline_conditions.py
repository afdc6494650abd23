"""Breakpoint conditions compiled into the code: who reports the line, exactly once.

A conditional breakpoint whose condition is compiled in (:mod:`.instrument`) is reported
by the code itself: ``__mldbg_bp__(LINE, PASSED)`` when the condition is true,
``__mldbg_bp__(LINE, RAISED)`` from the ``except`` clause when it raised.  A false
condition calls nothing.

A frame can also be *traced* on that line (a step, a pause, a loop header armed
elsewhere in the frame): the tracer's line event comes first and must serve the step
and the breakpoint together, in that order of precedence, as tracing alone would.  So
the line event evaluates the condition itself; when it was true (or raised) the
breakpoint is handled there, and the hook the code calls right after, on the same
frame and line, is told to stay silent.  Standard library only (agent side).
"""

from __future__ import annotations

import dis
import os
import sys
import threading
from types import CodeType, FrameType
from typing import TYPE_CHECKING

from .instrument import PASSED
from .paths import canonical_code_file

if TYPE_CHECKING:
    from .tracer import ConditionOutcome, TracerClient


def compile_conditions() -> bool:
    """``MLDBG_COMPILE_CONDITIONS=0`` evaluates every condition in the debugger instead
    (the reference the tests compare with, and a way out should compiling one misbehave)."""
    return os.environ.get("MLDBG_COMPILE_CONDITIONS", "1") != "0"


def dynamo_ready() -> bool:
    """torch and its compiler are fully imported (never import them, never mid-import)."""
    torch = sys.modules.get("torch")
    dynamo = sys.modules.get("torch._dynamo")
    compiler = sys.modules.get("torch.compiler")
    return (
        torch is not None
        and hasattr(torch, "compile")
        and dynamo is not None
        and hasattr(dynamo, "disable")
        and hasattr(compiler, "disable")
    )


def statement_starts(code: CodeType, lines: frozenset[int]) -> dict[int, int]:
    """Line -> offset where its compiled-in condition's statement begins.

    The only offset where a traced frame's line event on that line is the line's own:
    the ``try`` around the condition can make the interpreter report the same line again
    when the user's statement follows it (a jump from an instruction without a line), an
    event plain code never has.
    """
    starts: dict[int, int] = {}
    for offset, line in dis.findlinestarts(code):
        if line in lines and line not in starts:
            starts[line] = offset
    return starts


class ConditionHooks:
    """The two paths to a line with a compiled-in condition, for one debugger."""

    def __init__(self, debugger: TracerClient) -> None:
        self.debugger = debugger
        # thread -> (frame, line) whose breakpoint a line event already handled
        self._reported: dict[int, tuple[FrameType, int]] = {}

    def hook(self, frame: FrameType, line: int, mode: int, current: bool = True) -> None:
        """The code's own call: the condition passed (or raised, inside the except clause).

        ``current``: False when the frame runs code compiled for breakpoints since changed
        (a loop that was already running): the backend traces such frames, so its line
        event, with the condition set now, has decided; this call only clears the mark.
        """
        ident = threading.get_ident()
        seen = self._reported.pop(ident, None)
        if seen is not None and seen[0] is frame and seen[1] == line:
            return  # the line event of a traced frame handled this breakpoint already
        if not current:
            return
        if mode == PASSED:
            outcome: ConditionOutcome = True
        else:
            outcome = sys.exc_info()[1] or RuntimeError("the condition raised")
        file = canonical_code_file(frame.f_code.co_filename)
        self.debugger.on_line(frame, file, line, condition=outcome)

    def line_event(self, frame: FrameType, file: str, line: int) -> bool:
        """A traced frame reached a line whose condition is compiled in (stepping, pausing)."""
        debugger = self.debugger
        bp = debugger.breakpoints.at(file, line)
        outcome: ConditionOutcome = False
        if bp is not None and bp.condition_code is None:
            # Code compiled for a condition since taken away, still running in this frame:
            # the breakpoint is unconditional now, and on_line applies it.
            outcome = None
        elif bp is not None and bp.condition_code is not None:
            try:
                outcome = bool(eval(bp.condition_code, frame.f_globals, frame.f_locals))
            except Exception as exc:  # reported by on_line, as a raising condition is
                outcome = exc
        if outcome is not False:
            self._reported[threading.get_ident()] = (frame, line)
        return debugger.on_line(frame, file, line, condition=outcome)

    def forget(self) -> None:
        """Drop what line events recorded (breakpoints changed: the code is new)."""
        self._reported.clear()
