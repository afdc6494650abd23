"""What a tracer backend and the debugger need of each other, declared once.

A backend (``sys.monitoring`` on 3.12+, code instrumentation on 3.10/3.11, per-code-object
``sys.settrace`` where neither applies) only *delivers* events: it asks its
:class:`TracerClient` whether a code object needs line events and hands it every line and
exception; the client (the :class:`~.debugger.Debugger`) makes every decision.  The
debugger in turn drives its backend through :class:`TracerBackend` whenever breakpoints,
steps or pauses change.  Neither side imports the other: both are typed against these
protocols, and :mod:`.backends` picks the backend for this interpreter.
"""

from __future__ import annotations

from types import CodeType, FrameType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .breakpoints import BreakpointTable
    from .stepping import StepRequest

# A breakpoint condition's outcome when the backend already knows it (compiled into the
# code): True / False, or the exception the condition raised; None: not known, evaluate it.
ConditionOutcome = bool | BaseException | None


class TracerClient(Protocol):
    """What a backend asks of the debugger it serves."""

    breakpoints: BreakpointTable
    step: StepRequest | None

    @property
    def active(self) -> bool:
        """A step or a pause needs events beyond the breakpoints' lines."""
        ...

    @property
    def pause_requested(self) -> bool: ...

    def wants_code(self, code: CodeType, file: str) -> bool:
        """Does a frame starting to run ``code`` need line events?"""
        ...

    def on_line(
        self, frame: FrameType, file: str, line: int, condition: ConditionOutcome = None
    ) -> bool:
        """A line event; False: this line can stay silent until something changes."""
        ...

    def on_exception(self, frame: FrameType, exc: BaseException, raised: bool) -> None:
        """An exception raised in (``raised``) or unwinding out of ``frame``."""
        ...

    def on_return(self, frame: FrameType, value: object) -> None:
        """``frame`` returns ``value`` (delivered while the line step records)."""
        ...

    def records_thread(self, ident: int) -> bool:
        """Does the line step record on this thread now (it needs call events there)?"""
        ...


class TracerBackend(Protocol):
    """What the debugger and the runner need of a backend."""

    name: str  # "monitoring", "instrument" or "settrace": reported in run.json

    def install(self) -> None:
        """Start delivering events (the script is about to run)."""
        ...

    def uninstall(self) -> None: ...

    def prepare_main(self, code: CodeType) -> CodeType:
        """The script's module code as it should run (breakpoints compiled in, or as is)."""
        ...

    def refresh(self) -> None:
        """Re-arm for the client's current step/pause state."""
        ...

    def breakpoints_changed(self) -> None: ...

    def arm_stack(self, frame: FrameType | None) -> None:
        """Give ``frame`` and its callers line events (a step starts there)."""
        ...

    def arm_all_threads(self) -> None:
        """Line events in every thread's running frames (a pause)."""
        ...

    def arm_recording(self, frame: FrameType | None) -> None:
        """The line step starts recording on this thread: line and return events for the
        code it wants from now on (``wants_code``), and in ``frame``, running already."""
        ...
