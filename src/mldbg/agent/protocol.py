"""The agent <-> daemon protocol: message names and shapes, shared by both ends.

JSON lines over one loopback socket per process.  The debuggee connects back, sends
``PREAMBLE`` with the session's secret, then ``Hello``; then the daemon sends
``Command`` objects and the agent answers each with a ``Reply``, and sends ``Event``
objects unprompted.

Every command is declared once here, as an :class:`AgentCommand` with its arguments'
TypedDict and its result type: the daemon sends the declaration itself (the type checker
follows the types from the verb's handler to the wire), the agent checks the arguments
against it and serves it with the one method marked ``@serves`` for it.  Every event is
declared once too, as an :class:`AgentEvent` with its fields' TypedDict: the agent sends
the declaration (``P.STOPPED.send(wire, fields)``, its fields held to the TypedDict by the
type checker), the daemon checks each event it reads against it (``AgentEvent.check``)
and hands it to the one session method marked ``@serves`` for it.  Command names
are the verbs' names (``verbs.py``) wherever a verb maps onto one command, and a verb
that only passes its arguments on says so in the verb table (``Verb.agent``): the daemon
then needs no handler of its own for it.

Standard library only: the debuggee imports this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar, cast

if TYPE_CHECKING:  # the result shapes: for the type checker (the agent never imports them)
    from .. import results as R

A = TypeVar("A", bound=Mapping[str, object])  # a command's arguments: a TypedDict below
R_ = TypeVar("R_")  # its result: a TypedDict of ``results.py``
E = TypeVar("E", bound=Mapping[str, object])  # an event's fields: a TypedDict below


class Requester(Protocol):
    """What sends a command and waits for its answer: the daemon's link to one process
    (``AgentLink``), or a session (which also checks that it is paused, and passes
    breakpoint edits on to the script's children)."""

    def ask(
        self,
        command: AgentCommand[Any, Any],
        args: Mapping[str, object] | None = None,
        timeout: float | None = None,
    ) -> object: ...  # the answer as it came over the wire


@dataclasses.dataclass(frozen=True, eq=False)
class AgentCommand(Generic[A, R_]):
    """One command of the link: its name on the wire, its arguments, where it is served.

    Declared once, below.  The daemon sends one with ``P.BREAK.call(session, args)``: the
    type checker holds ``args`` to ``A`` and the answer to ``R_``; the agent checks the
    arguments against ``args`` and serves the command with the one method marked
    ``@serves(P.BREAK)``.  ``paused`` commands are served by the paused thread itself
    (they read its frames); the others by the reader thread at any time (they only edit
    the debugger's tables).
    """

    name: str
    args: type[A]
    paused: bool = False
    resumes: bool = False  # continue / step: answered, then the thread runs on

    def call(self, via: Requester, args: A | None = None, timeout: float | None = None) -> R_:
        """Send this command through ``via`` and return its answer (or raise its error)."""
        # the agent's handler for this command returns R_ (tests/test_protocol.py checks it)
        return cast("R_", via.ask(self, args, timeout))

    def check(self, args: Mapping[str, object]) -> str | None:
        """What is wrong with ``args`` for this command (unknown or missing keys), or None."""
        return _check_keys(self.name, self.args, args, "argument")


class Sender(Protocol):
    """Where the agent sends a message (its ``Wire``, or a forked child's lazy one)."""

    def send(self, message: Mapping[str, object]) -> None: ...


@dataclasses.dataclass(frozen=True, eq=False)
class AgentEvent(Generic[E]):
    """One message the agent sends unprompted: its name on the wire and its fields.

    Declared once, below.  The agent sends one with ``P.STOPPED.send(wire, fields)``: the
    type checker holds ``fields`` to ``E``; the daemon checks each event it reads against
    its declaration (:meth:`check`: an unknown field or a missing one drops it, logged)
    and hands it to the one method of the session marked ``@serves`` for it.
    """

    name: str
    fields: type[E]

    def send(self, via: Sender, fields: E) -> None:
        via.send({**fields, "event": self.name})

    def check(self, message: Mapping[str, object]) -> str | None:
        """What is wrong with ``message`` (this event, ``event`` included) or None."""
        return _check_keys(self.name, self.fields, {**message, "event": self.name}, "field")


def _check_keys(
    name: str, declared: type[Mapping[str, object]], given: Mapping[str, object], what: str
) -> str | None:
    """Unknown or missing keys of a command's arguments or an event's fields."""
    known = set(declared.__annotations__) | ({"event"} if what == "field" else set())
    unknown = sorted(set(given) - known)
    if unknown:
        return f"{name} takes no {what} {unknown[0]!r} (it takes {sorted(known)})"
    required: frozenset[str] = getattr(declared, "__required_keys__", frozenset())
    missing = sorted(k for k in required if k not in given)
    if missing:
        return f"{name} needs the {what} {missing[0]!r}"
    return None


Handler = Callable[..., object]
F = TypeVar("F", bound=Handler)


def serves(message: AgentCommand[Any, Any] | AgentEvent[Any]) -> Callable[[F], F]:
    """Mark the method that serves ``message``: the agent's for a command, the daemon
    session's for an event (collected by :func:`handlers_of`)."""

    def mark(fn: F) -> F:
        fn.__agent_command__ = message  # type: ignore[attr-defined]
        return fn

    return mark


def handlers_of(server: object) -> dict[str, Handler]:
    """The ``@serves`` methods of an object, by command or event name: its dispatch table."""
    names = _served_by_class.get(type(server))
    if names is None:
        names = {}
        for attribute in dir(type(server)):
            message = getattr(getattr(type(server), attribute), "__agent_command__", None)
            if isinstance(message, AgentCommand | AgentEvent):
                names[message.name] = attribute
        _served_by_class[type(server)] = names
    return {message: getattr(server, attribute) for message, attribute in names.items()}


_served_by_class: dict[type, dict[str, str]] = {}  # per class: command name -> method name


# -- arguments --------------------------------------------------------------------------------


class NoArgs(TypedDict):
    pass


class ConfigureArgs(TypedDict, total=False):
    breakpoints: list[BreakArgs]
    watches: list[str]
    main_file: str | None


class RunArgs(TypedDict, total=False):
    stop_on_entry: bool
    run_dir: str
    follow: bool  # debug the script's child processes too


class BreakArgs(TypedDict, total=False):
    """Every kind of breakpoint: a line (file, line), a function, an exception (raised /
    uncaught / exception + types), a checkpoint filter, the non-finite tripwire."""

    file: str | None
    line: int | None
    condition: str | None
    hits: str | None
    log: str | None
    checkpoint: str | None
    function: str | None
    raised: list[str] | None  # type names; [] = every exception
    uncaught: list[str] | None  # type names; [] = every uncaught exception (the default)
    exception: str | None
    types: list[str] | None
    this_thread: bool
    temporary: bool  # until's one-shot breakpoint
    nonfinite: bool
    max_abs: float | None
    subnormal: bool
    id: int  # the id it has in the script's process (the daemon's copies keep it)


class RemoveArgs(TypedDict, total=False):
    file: str | None
    line: int | None
    checkpoint: str | None
    id: int | None


class _Expression(TypedDict):
    expression: str


class WatchArgs(_Expression):
    pass


class UnwatchArgs(TypedDict, total=False):
    id: int | None
    expression: str | None


class ThreadArgs(TypedDict):
    number: int


class StepArgs(TypedDict, total=False):
    kind: str  # over | into | out (STEP_KINDS)
    into_libraries: bool


class StackArgs(TypedDict, total=False):
    limit: int
    all: bool


class FrameArgs(TypedDict, total=False):
    index: int | None
    move: int


class VarsArgs(TypedDict, total=False):
    all: bool
    filter: str | None
    offset: int
    limit: int


class EvalArgs(_Expression, total=False):
    timeout: float | None
    export: str | None  # also write the value to this .npy path (eval --against)


class WatchValuesArgs(TypedDict):
    items: list[dict[str, Any]]  # {"id", "expression"} as ``breaks`` lists the watches


# -- the commands: the one table both ends use --------------------------------------------------

# Served on the agent's reader thread, at any time.
CONFIGURE: AgentCommand[ConfigureArgs, R.Breakpoints] = AgentCommand("configure", ConfigureArgs)
RUN: AgentCommand[RunArgs, dict[str, bool]] = AgentCommand("run", RunArgs)  # start the script
BREAK: AgentCommand[BreakArgs, R.BreakpointInfo] = AgentCommand("break", BreakArgs)
REMOVE: AgentCommand[RemoveArgs, R.BreakpointInfo] = AgentCommand("remove", RemoveArgs)
CLEAR: AgentCommand[NoArgs, R.Removed] = AgentCommand("clear", NoArgs)
BREAKS: AgentCommand[NoArgs, R.Breakpoints] = AgentCommand("breaks", NoArgs)
PAUSE: AgentCommand[NoArgs, dict[str, bool]] = AgentCommand("pause", NoArgs)
WATCH: AgentCommand[WatchArgs, R.Watches] = AgentCommand("watch", WatchArgs)
UNWATCH: AgentCommand[UnwatchArgs, R.Watches] = AgentCommand("unwatch", UnwatchArgs)
THREADS: AgentCommand[NoArgs, R.Threads] = AgentCommand("threads", NoArgs)
THREAD: AgentCommand[ThreadArgs, R.State] = AgentCommand("thread", ThreadArgs)  # select one

# Served only by a paused thread: the reader thread queues them to it.
CONTINUE: AgentCommand[NoArgs, dict[str, bool]] = AgentCommand(
    "continue", NoArgs, paused=True, resumes=True
)
STEP: AgentCommand[StepArgs, dict[str, bool]] = AgentCommand(
    "step", StepArgs, paused=True, resumes=True
)
STACK: AgentCommand[StackArgs, R.Stack] = AgentCommand("stack", StackArgs, paused=True)
FRAME: AgentCommand[FrameArgs, R.FrameSelected] = AgentCommand("frame", FrameArgs, paused=True)
VARS: AgentCommand[VarsArgs, R.Variables] = AgentCommand("vars", VarsArgs, paused=True)
EVAL: AgentCommand[EvalArgs, R.Evaluation] = AgentCommand("eval", EvalArgs, paused=True)
LOCATION: AgentCommand[NoArgs, R.State] = AgentCommand("location", NoArgs, paused=True)
# the watch expressions' values in the selected frame now
WATCH_VALUES: AgentCommand[WatchValuesArgs, R.Watches] = AgentCommand(
    "watch_values", WatchValuesArgs, paused=True
)

COMMANDS: dict[str, AgentCommand[Any, Any]] = {
    c.name: c
    for c in (
        CONFIGURE, RUN, BREAK, REMOVE, CLEAR, BREAKS, PAUSE, WATCH, UNWATCH, THREADS, THREAD,
        CONTINUE, STEP, STACK, FRAME, VARS, EVAL, LOCATION, WATCH_VALUES,
    )
}  # fmt: skip
# Messages the agent puts on a paused thread's own queue (never sent over the wire).
DETACH = "__detach__"  # the daemon is gone: run on untraced
RELEASE = "__release__"  # another thread was selected: let this held one go

STEP_KINDS = ("over", "into", "out")


# -- events: what the agent sends unprompted ------------------------------------------------------


class TraceRecord(TypedDict):
    """A stop as the run's trace keeps it (``R.TraceStep``'s stack and variables)."""

    stack: list[dict[str, object]]  # describe_frame, the user's frames (TRACE_FRAMES)
    variables: list[dict[str, str]]  # {"name", "summary"} (TRACE_VARIABLES)


class ExceptionInfo(TypedDict, total=False):
    """An exception as a stop (``exception``) and the end of a run show it."""

    type: str
    message: str
    traceback: str
    truncated: bool  # the message or the traceback was cut (budget.MESSAGE, TRACEBACK)


class StopDetails(TypedDict, total=False):
    """What stopped the thread, beside the reason: keys of the stop's state (``R.State``)."""

    exception: ExceptionInfo  # an exception breakpoint, or post mortem
    raised: bool  # break --raised: the exception is live
    raised_in: dict[str, object]  # where a library raised it (describe_frame)
    breakpoint: R.BreakpointInfo
    condition_error: str  # the breakpoint's condition (or checkpoint filter) raised this
    checkpoint: dict[str, object]  # the debug_checkpoint call (store/checkpoint.py)
    tripwire: dict[str, object]  # the module call that tripped (tripwire.py)
    note: str
    fix: list[dict[str, object]]  # calls that help from here (step out)


class Stop(StopDetails, total=False):
    """Where a thread stopped and why: the fields of ``R.State`` a stop sets (the daemon
    adds the session's own), as ``location`` and ``thread`` answer them too."""

    reason: str  # entry | breakpoint | step | pause | exception | checkpoint | tripwire
    location: R.Location | None
    frame_index: int
    thread: dict[str, object]  # {"id", "name"}
    memory: dict[str, object]  # memory.snapshot() at this stop
    watches: list[R.Watch]  # every watch expression, evaluated here


class Stopped(Stop, total=False):
    trace: TraceRecord  # for the run's events.jsonl, not shown in the state


class Resumed(TypedDict):
    pass


class Log(TypedDict):
    """A logpoint's line (also written to the script's output)."""

    message: str
    file: str
    line: int
    breakpoint: int  # its id


class Finished(TypedDict, total=False):
    """The script ran to its end (before its process exits)."""

    exit_code: int
    exception: ExceptionInfo | None  # the uncaught one, if any


STOPPED: AgentEvent[Stopped] = AgentEvent("stopped", Stopped)
RESUMED: AgentEvent[Resumed] = AgentEvent("resumed", Resumed)
LOG: AgentEvent[Log] = AgentEvent("log", Log)
FINISHED: AgentEvent[Finished] = AgentEvent("finished", Finished)
EVENTS: dict[str, AgentEvent[Any]] = {e.name: e for e in (STOPPED, RESUMED, LOG, FINISHED)}

# The daemon's first line to a child that asked for it (``Hello.welcome``): it was admitted.
# A child that never gets it (its connection dropped by a full handshake queue) tries again.
WELCOME = "welcome"
# A child that could not reach the daemon at all appends a line to this file of the run
# directory ({"pid", "ppid", "reason", "time"}); the parent's state shows them.
DETACHED_FILE = "detached.jsonl"

# The longest line either end accepts; longer ones end the connection.
MAX_LINE = 32 * 1024 * 1024
# The connection's first bytes: ``PREAMBLE + token + "\n"``, a fixed size, so the daemon
# checks the session's secret before it reads (or buffers) anything a stranger could send.
PREAMBLE = b"MLDBG1 "
TOKEN_BYTES = 32  # secrets.token_hex(TOKEN_BYTES): 64 hex digits
PREAMBLE_SIZE = len(PREAMBLE) + 2 * TOKEN_BYTES + 1
MAX_HELLO = 64 * 1024  # the hello line, read only once the secret matched


class Hello(TypedDict, total=False):
    event: str  # "hello"
    token: str  # kept for older agents; the preamble is what proves the secret now
    child: bool  # a child process of the session's script (forked or started by it)
    ppid: int
    rank: str | None  # RANK (else LOCAL_RANK) of an exec'd child: torchrun ranks
    forked: bool
    python: str
    executable: str
    backend: str
    pid: int
    libraries: dict[str, str]
    welcome: bool  # answer with a WELCOME line once admitted (children wait for it)
    attempts: int  # how many connections this child tried before this one


class Command(TypedDict):
    """A command on the wire: ``cmd`` is an :class:`AgentCommand`'s name."""

    id: int
    cmd: str
    args: dict[str, Any]


class Reply(TypedDict, total=False):
    id: int
    ok: bool
    result: object
    error: str
    code: str  # a stable error code (no_code_at_line, eval_error, ...)
    extra: dict[str, object]


class Event(TypedDict, total=False):
    event: str  # an :class:`AgentEvent`'s name; its other keys are that event's fields
