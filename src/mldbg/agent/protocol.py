"""The agent <-> daemon protocol: message names and shapes, shared by both ends.

JSON lines over one loopback socket per process.  The debuggee connects back, sends
``PREAMBLE`` with the session's secret, then ``Hello``; then the daemon sends
``Command`` objects and the agent answers each with a ``Reply``, and sends ``Event``
objects unprompted.  Command names are the verbs' names (``verbs.py``) wherever a verb
maps onto one command.

Standard library only: the debuggee imports this.
"""

from __future__ import annotations

from typing import Any, TypedDict

# Commands the agent serves on its reader thread, at any time.
CONFIGURE = "configure"  # the start-up breakpoints, before anything runs
RUN = "run"  # start the script
BREAK = "break"
REMOVE = "remove"
CLEAR = "clear"
BREAKS = "breaks"
PAUSE = "pause"
WATCH = "watch"  # add a watch expression
UNWATCH = "unwatch"
THREADS = "threads"  # list the script's threads
THREAD = "thread"  # select a stopped thread for the paused commands

# Commands only a paused thread can serve: the reader thread queues them to it.
CONTINUE = "continue"
STEP = "step"
STACK = "stack"
FRAME = "frame"
VARS = "vars"
EVAL = "eval"
LOCATION = "location"
WATCH_VALUES = "watch_values"  # evaluate the watch expressions now, in the selected frame
PAUSED_COMMANDS = frozenset({CONTINUE, STEP, STACK, FRAME, VARS, EVAL, LOCATION, WATCH_VALUES})

STEP_KINDS = ("over", "into", "out")

# Events the agent sends unprompted.
STOPPED = "stopped"
RESUMED = "resumed"
LOG = "log"
FINISHED = "finished"
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
    id: int
    cmd: str
    args: dict[str, Any]


class Reply(TypedDict, total=False):
    id: int
    ok: bool
    result: Any
    error: str
    code: str  # a stable error code (no_code_at_line, eval_error, ...)
    extra: dict[str, Any]


class Event(TypedDict, total=False):
    event: str
