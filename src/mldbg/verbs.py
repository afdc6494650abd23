"""The verb table: every verb of mldbg, declared once.

A verb's declaration is its one name, its arguments (type, default, help, how the CLI
spells it), its result shape (a TypedDict from ``results.py``) and the error codes it can
answer.  Everything else derives from this table:

* the daemon's REST routes and their OpenAPI schema (``server/app.py``),
* the MCP tools, their input and output schemas (``mcp/server.py``),
* the ``mldbg`` command's parser (``cli/main.py``),
* the typed client's argument checks (``client/api.py``).

Adding a verb = one ``Verb(...)`` here + one handler in ``server/handlers.py`` (+ a
renderer in ``text/render.py`` for the human form); a verb that reaches the debugged
process and only passes its arguments on names its agent command (``agent=P.X``) instead
of a handler, and the agent serves it (``docs/architecture.md``, "Adding a verb").  This module is imported by the CLI on
every call, so it imports nothing heavier than ``typing``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from . import capture_options
from . import results as R
from .agent import protocol as P
from .errors import (
    AGENT_TIMEOUT,
    AMBIGUOUS_FILE,
    BAD_ARGUMENT,
    BAD_COMPARE_INPUT,
    BAD_CONDITION,
    BAD_EXPRESSION,
    BAD_HITS,
    BAD_LOG,
    BAD_MAP,
    BAD_RANKS,
    BAD_SESSION_NAME,
    BAD_SHARDS,
    BAD_WEIGHTS_INPUT,
    CONFIRM,
    CORRUPT_CAPTURE,
    CORRUPT_FILE,
    DAEMON_UNREACHABLE,
    EVAL_ERROR,
    EVAL_INTERRUPTED,
    EVAL_TIMEOUT,
    FILE_NOT_FOUND,
    NO_CODE_AT_LINE,
    NO_SUCH_BREAKPOINT,
    NO_SUCH_FRAME,
    NO_SUCH_FUNCTION,
    NO_SUCH_JOB,
    NO_SUCH_RUN,
    NO_SUCH_TENSOR,
    NO_SUCH_THREAD,
    NO_SUCH_WATCH,
    NOT_A_SOURCE_FILE,
    NOT_EDITABLE,
    NOT_PAUSED,
    SCOPE_NOT_REACHED,
    SCRIPT_FAILED,
    SESSION_BUSY,
    SESSION_ENDED,
    START_FAILED,
    STORE_FULL,
    STORE_UNWRITABLE,
    TOO_LONG,
    TOO_MANY_WATCHES,
    TOO_SLOW,
    UNKNOWN_SESSION,
    UNKNOWN_SOURCE,
    UNREADABLE,
)
from .names import SESSION_NAME_MAX

REQUIRED: Any = ...  # marks an argument without a default

# Input limits: every text an agent can send is bounded at the door (the daemon refuses a
# longer one with ``too_long`` before anything sees it), so nothing unbounded is echoed
# into states, events or listings.  Lengths count characters, anywhere in the value (the
# strings of a list, the keys and values of a mapping); items count a list's or mapping's
# entries.  An argument may declare its own (shorter: echoed in every stop; longer: code).
TEXT_LIMIT = 4_096  # a path (PATH_MAX), a name, a glob, a target
ECHOED_LIMIT = 2_000  # text repeated at every stop: a watch, a condition, a log template
CODE_LIMIT = 100_000  # code to run: an evaluation
ENV_LIMIT = 131_072  # an environment variable or a script argument (Linux's MAX_ARG_STRLEN)
ITEMS_LIMIT = 1_000  # entries of a list or mapping argument
SHARD_RULES_LIMIT = 100  # compare's shards: split rules, one per sharded tensor family


@dataclass(frozen=True)
class Arg:
    """One argument of a verb, the same on every surface.

    ``kind`` says how a client must treat the value: ``path`` values are made absolute
    against the client's working directory before they are sent (the daemon runs
    elsewhere); ``source`` values (a breakpoint's file) too, but only where that file
    exists, else they go as typed for the debuggee to find (its cwd, then its import
    path: ``torch/nn/modules/linear.py``); ``text`` may be ``-`` on the CLI to read
    standard input; ``session`` is a session's name (``names.py``: the OpenAPI document
    carries its pattern, so a name it allows is a name).  ``nargs="*"``: on the CLI the
    flag takes zero or more values.
    """

    name: str
    type: Any
    help: str
    default: Any = None
    kind: Literal["plain", "path", "text", "source", "session"] = "plain"
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    # CLI spelling: positional, or a flag (default ``--name-with-dashes``)
    positional: bool = False
    flag: str | None = None  # a bool's flag flips its default: --run sets stop_on_entry False
    short: str | None = None
    aliases: tuple[str, ...] = ()  # more CLI spellings, e.g. pdb/debugpy users' --condition
    cli: bool = True  # False: filled in by the client, never typed by a person
    mcp: bool = True
    nargs: str | None = None
    max_length: int = TEXT_LIMIT  # the longest text anywhere in the value (see TEXT_LIMIT)
    max_items: int = ITEMS_LIMIT  # the most entries of a list or mapping value
    # The CLI flag's help where the flag does not act as the argument reads: a bool flag
    # that flips a true default (``--run`` sets stop_on_entry false) says what the flag does.
    cli_help: str | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Verb:
    """One verb: what it is called, what it takes, what it answers.

    ``scope``: ``session`` verbs act on one named session (REST path
    ``/v1/sessions/{session}/<route>``); ``global`` verbs on the daemon or the run store
    (``/v1/<route>``).  ``waits``: the verb may wait for the script to stop; clients turn
    a long wait into a loop of short ones and report progress between them.
    """

    name: str
    help: str
    result: type  # its answer's TypedDict (results.py): MCP's output type, REST's model
    args: tuple[Arg, ...] = ()
    scope: Literal["session", "global"] = "session"
    method: Literal["GET", "POST", "DELETE"] = "POST"
    route: str | None = None  # default: the verb's name
    legacy_routes: tuple[tuple[str, str], ...] = ()  # (method, route) kept for old clients
    errors: tuple[str, ...] = ()
    waits: bool = False
    store: bool = False  # reads the run store: takes --home and the session's store
    description: str = ""  # longer text for MCP and OpenAPI
    cli: bool = True
    mcp: bool = True
    cli_aliases: tuple[str, ...] = ()
    extra: dict[str, object] = field(default_factory=dict)
    # The agent command this verb only passes its arguments on to (same names, see
    # ``agent/protocol.py``): the daemon's handler for it is generated, not written.
    agent: P.AgentCommand[Any, Any] | None = None
    # A verb that judges (weights): its result's boolean field saying all is well.  The CLI
    # exits as ``compare`` does: 0 when it is true, 1 when false, 2 on the verb's own
    # errors (bad input), so a script can branch on the exit code alone.
    verdict: str | None = None

    @property
    def path(self) -> str:
        route = self.name if self.route is None else self.route
        if self.scope == "session":
            return "/v1/sessions/{name}" + (f"/{route}" if route else "")
        return f"/v1/{route}"

    def arg(self, name: str) -> Arg:
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def all_errors(self) -> tuple[str, ...]:
        common = (BAD_ARGUMENT, TOO_LONG, BAD_SESSION_NAME, DAEMON_UNREACHABLE)
        session = (UNKNOWN_SESSION,) if self.scope == "session" else ()
        return tuple(dict.fromkeys(common + session + self.errors))


# -- shared argument declarations -------------------------------------------------------------

WAIT_HELP = "seconds to wait for the next stop or the end"


def _wait(default: float, help: str = WAIT_HELP) -> Arg:
    return Arg("wait", float, help, default, minimum=0, maximum=3600, flag="--max-wait")


HOME = Arg(
    "home",
    str,
    "run store to read (default: the session's, else $MLDBG_HOME, else ./.mldbg)",
    kind="path",
)
STORE_SESSION = Arg(
    "session",
    str,
    "read the run store of this session (default: none; see home)",
    kind="session",
    max_length=SESSION_NAME_MAX,
    flag="--session",
    short="-s",
)
RUN = Arg("run", str, "run id (or unique prefix), 'latest' (default) or a run directory")
LIMIT_HELP = "at most this many items (the answer says how many there are in all)"
OFFSET = Arg("offset", int, "skip this many items first (paging)", 0, minimum=0)
# which checkpoint records a listing shows (checkpoints, compare-checkpoints)
CHECKPOINT_FILTER = (
    Arg("name", str, "only checkpoints with this name (a glob)"),
    Arg("hit", int, "only the Nth hit of each name", minimum=1),
    OFFSET,
    Arg("limit", int, LIMIT_HELP, 20, minimum=1, maximum=1000),
)

BREAK_ERRORS = (
    FILE_NOT_FOUND,
    NOT_A_SOURCE_FILE,
    NO_CODE_AT_LINE,
    BAD_CONDITION,
    BAD_HITS,
    BAD_LOG,
    SESSION_ENDED,
    AMBIGUOUS_FILE,
    NO_SUCH_FUNCTION,
)
PAUSED_ERRORS = (NOT_PAUSED, SESSION_ENDED, AGENT_TIMEOUT)
RESUME_ERRORS = (NOT_PAUSED, SESSION_ENDED)

# What compare's status filter finds an entry by (compare/report/answer.py, statuses()).
COMPARE_STATUSES = ("failing", "passing", "culprit", "noted", "compensated", "error")

# Zero-edit capture: `start --capture NAME` records the script's models, unmodified.  Each
# option is declared once, in capture_options.Spec; its argument here derives from it.
CAPTURE_ARGS = (
    Arg(
        "capture",
        str,
        "capture the script's models (the outermost modules it calls) as NAME, NAME.2, ...",
    ),
    *(
        Arg(
            capture_options.argument_of(field),
            declared.type,
            declared.help,
            capture_options.argument_default(field),
            choices=declared.choices,
            minimum=declared.minimum,
            flag=declared.flag,
        )
        for field, declared in capture_options.OPTIONS.items()
    ),
)

MAP = Arg(
    "map",
    dict[str, Any] | str,  # a map file, or the same map inline as a JSON object
    "B's names mapped: a map file, or {rename, regex, ignore} inline",
    kind="path",
)
# the codes of a source compare cannot read (compare, line)
SOURCE_ERRORS = (UNKNOWN_SOURCE, CORRUPT_FILE, CORRUPT_CAPTURE, UNREADABLE, BAD_MAP)

# -- the table --------------------------------------------------------------------------------

VERBS: tuple[Verb, ...] = (
    Verb(
        "start",
        "start a script under the debugger (stops before its first line)",
        R.State,
        (
            Arg(
                "script",
                str,
                "the script to run (relative to cwd), then its arguments",
                positional=True,
            ),
            Arg("module", str, "run a module, as python -m does", flag="-m"),
            Arg("args", list[str], "the script's arguments", cli=False, max_length=ENV_LIMIT),
            Arg(
                "python",
                str,
                "interpreter (default: the active virtualenv's, else mldbg's)",
            ),
            Arg("cwd", str, "working directory for the script (default: here)", kind="path"),
            Arg(
                "env",
                dict[str, str],
                "variables added to the environment",
                cli_help="variables added to the environment (K=V; repeatable)",
                max_length=ENV_LIMIT,
            ),
            Arg(
                "base_env",
                dict[str, str],
                "the whole environment the variables are added to (default: the client's)",
                cli=False,
                mcp=False,
                max_length=ENV_LIMIT,
                max_items=10 * ITEMS_LIMIT,
            ),
            Arg(
                "breakpoints",
                list[R.BreakpointSpec],
                "breakpoints set before anything runs (FILE:LINE[:COND] on the CLI)",
                flag="--break",
            ),
            Arg(
                "stop_on_entry",
                bool,
                "pause before the first line",
                True,
                flag="--run",
                cli_help="run at once, without pausing before the first line (it stops at "
                "a breakpoint, or runs to the end)",
            ),
            Arg("replace", bool, "terminate a live session of this name first", False),
            Arg(
                "no_follow",
                bool,
                "do not debug the script's child processes (workers, subprocesses, ranks)",
                False,
            ),
            Arg(
                "require_editable",
                list[str],
                "refuse to start unless these packages are editable installs",
                cli_help="refuse to start unless this package is an editable install for the "
                "script's python (repeatable)",
            ),
            Arg(
                "wait",
                float,
                "seconds to wait for the first stop (entry, breakpoint or end); default 30 "
                "at entry, else 0; at most 30",
                minimum=0,
                cli=False,
            ),
            *CAPTURE_ARGS,
        ),
        errors=(
            START_FAILED,
            STORE_UNWRITABLE,
            STORE_FULL,
            SESSION_BUSY,
            FILE_NOT_FOUND,
            NOT_EDITABLE,
            *BREAK_ERRORS,
        ),
        description="Returns the session's state: `paused` with `location` (file, line, code "
        "around it), or `exited` with `exit_code` and the last output if it ran to the end. "
        "With stop_on_entry false, `wait` s waits for the first stop or the end; `running` "
        "means none came in that time (then call wait).",
    ),
    Verb(
        "break",
        "set a breakpoint (FILE:LINE or FILE LINE), a function, exception or checkpoint one",
        R.BreakpointInfo,
        (
            Arg(
                "file",
                str,
                "path: the client's cwd, else the session's cwd, else the files the script can "
                "import (torch/nn/modules/linear.py, linear.py)",
                kind="source",
            ),
            Arg("line", int, "line number", minimum=1),
            Arg(
                "condition",
                str,
                "stop only when this expression is true",
                flag="--if",
                aliases=("--condition",),
                max_length=ECHOED_LIMIT,
            ),
            Arg(
                "hits",
                str,
                "N: stop on the Nth hit; >=N: from the Nth on; %N: every Nth",
                max_length=32,
            ),
            Arg(
                "log",
                str,
                'print this instead of stopping; an f-string body: "mean={loss.mean():.3f} {x!r}"',
                max_length=ECHOED_LIMIT,
            ),
            Arg("checkpoint", str, "pause only at debug_checkpoint calls so named (a glob)"),
            Arg(
                "function",
                str,
                "stop at every call of this function, by dotted name (pkg.mod.Class.method, "
                "__main__.parse); pending until its module exists",
            ),
            Arg(
                "raised",
                list[str],
                "stop where these exception types are raised, even if caught later (no types: "
                "every exception); library frames are skipped to the first frame of your code",
                nargs="*",
            ),
            Arg(
                "uncaught",
                list[str],
                "stop post-mortem on uncaught exceptions (the default); with types, only those",
                nargs="*",
            ),
            Arg(
                "this_thread",
                bool,
                "stop only the thread that hits it (default: every thread stops)",
                False,
            ),
            Arg(
                "nonfinite",
                bool,
                "tripwire: stop in the first module call (torch or MLX) whose output holds "
                "NaN/Inf while its inputs did not, in the frame that called it",
                False,
            ),
            Arg(
                "max_abs",
                float,
                "tripwire: also stop where an output's finite |x| exceeds this",
                minimum=0,
            ),
            Arg(
                "subnormal",
                bool,
                "tripwire: also stop on subnormal outputs (garbage such as 1.58e-43)",
                False,
            ),
        ),
        route="break",
        legacy_routes=(("POST", "breakpoints"),),
        errors=BREAK_ERRORS,
        description="Also inside installed libraries (transformers, torch): a relative path "
        "not found under the cwd is looked up among the files the script can import "
        "(`ambiguous_file` lists candidates). A line that cannot hold one is refused with "
        "`nearest_lines`. The answer's `id` works wherever FILE:LINE does (remove, until). "
        "`nonfinite` sets the tripwire instead (stop reason and field `tripwire`).",
    ),
    Verb(
        "breaks",
        "list breakpoints and checkpoint filters with their hit counts",
        R.Breakpoints,
        method="GET",
        legacy_routes=(("GET", "breakpoints"),),
        agent=P.BREAKS,
        errors=(SESSION_ENDED,),
    ),
    Verb(
        "remove",
        "remove a breakpoint (FILE:LINE or its id) or a checkpoint filter",
        R.BreakpointInfo,
        (
            Arg("file", str, "the breakpoint's file", kind="source"),
            Arg("line", int, "the breakpoint's line", minimum=1),
            Arg("checkpoint", str, "remove this checkpoint filter"),
            Arg("id", int, "the breakpoint's id (from break or breaks)", minimum=1),
        ),
        legacy_routes=(("POST", "breakpoints/remove"),),
        errors=(NO_SUCH_BREAKPOINT, SESSION_ENDED),
    ),
    Verb(
        "clear",
        "remove all breakpoints",
        R.Removed,
        legacy_routes=(("POST", "breakpoints/clear"),),
        errors=(SESSION_ENDED,),
    ),
    Verb(
        "continue",
        "resume and wait for the next stop or the end",
        R.State,
        (_wait(60.0), Arg("no_wait", bool, "return at once, without waiting", False, mcp=False)),
        waits=True,
        errors=RESUME_ERRORS,
        description="State `running` means it was still going after `wait` s: call wait, or pause.",
    ),
    Verb(
        "step",
        "step over, into or out",
        R.State,
        (
            Arg(
                "kind",
                str,
                "over: next line here; into: into calls; out: back in the caller",
                "over",
                choices=("over", "into", "out"),
                positional=True,
            ),
            Arg("into_libraries", bool, "also stop in library code (torch, transformers)", False),
            _wait(60.0),
        ),
        waits=True,
        errors=RESUME_ERRORS,
    ),
    Verb(
        "wait",
        "wait for a running script to stop or end, resuming nothing",
        R.State,
        (_wait(60.0),),
        waits=True,
        errors=(SESSION_ENDED,),
    ),
    Verb(
        "pause",
        "stop the running script at its next line of Python",
        R.State,
        (_wait(5.0, "seconds to wait for the stop"),),
        errors=(SESSION_ENDED,),
    ),
    Verb("status", "the session's state", R.State, method="GET", route=""),
    Verb(
        "location",
        "where the session is paused, with code",
        R.State,
        method="GET",
        errors=PAUSED_ERRORS,
    ),
    Verb(
        "stack",
        "the paused thread's frames (0 = innermost), just-my-code unless --all",
        R.Stack,
        (
            Arg("limit", int, "at most this many frames", 30, minimum=1, maximum=1000),
            Arg("all", bool, "include library frames (torch, transformers, the stdlib)", False),
        ),
        method="GET",
        agent=P.STACK,
        errors=PAUSED_ERRORS,
    ),
    Verb(
        "frame",
        "select frame N for vars and eval",
        R.FrameSelected,
        (Arg("index", int, "frame number from stack", REQUIRED, minimum=0, positional=True),),
        agent=P.FRAME,
        errors=(*PAUSED_ERRORS, NO_SUCH_FRAME),
    ),
    Verb(
        "up",
        "select the caller's frame (past the outermost: the outermost, with a note)",
        R.FrameSelected,
        (Arg("count", int, "how many frames up", 1, minimum=1, positional=True),),
        errors=(*PAUSED_ERRORS, NO_SUCH_FRAME),
    ),
    Verb(
        "down",
        "select the callee's frame",
        R.FrameSelected,
        (Arg("count", int, "how many frames down", 1, minimum=1, positional=True),),
        errors=(*PAUSED_ERRORS, NO_SUCH_FRAME),
    ),
    Verb(
        "vars",
        "variables of the selected frame, tensors summarized",
        R.Variables,
        (
            Arg("all", bool, "include globals", False),
            Arg("filter", str, "only names matching this glob (e.g. 'attn*')"),
            OFFSET,
            Arg("limit", int, LIMIT_HELP, 50, minimum=1, maximum=500),
        ),
        method="GET",
        legacy_routes=(("GET", "variables"),),
        agent=P.VARS,
        errors=PAUSED_ERRORS,
    ),
    Verb(
        "eval",
        "evaluate code in the selected frame ('-' reads stdin)",
        R.Evaluation,
        (
            Arg(
                "expression",
                str,
                "an expression, or statements ending in one",
                REQUIRED,
                kind="text",
                positional=True,
                max_length=CODE_LIMIT,
            ),
            Arg(
                "timeout",
                float,
                "interrupt the evaluation after this many seconds (the session stays paused)",
                30.0,
                minimum=0.1,
                maximum=3600,
            ),
            Arg(
                "against",
                str,
                "also evaluate it in this paused session (the reference beside the port): "
                "both values and their difference",
                kind="session",
                max_length=SESSION_NAME_MAX,
            ),
        ),
        errors=(*PAUSED_ERRORS, EVAL_ERROR, EVAL_TIMEOUT, EVAL_INTERRUPTED),
        description="Tensors in the result are summarized (shape, dtype, device, stats); "
        "assignments change the script's variables; what the code prints is returned in `output`. "
        "An evaluation past `timeout` (or hit by `pause`) is interrupted inside the script: "
        "`eval_timeout` / `eval_interrupted`, and the session stays paused where it was. "
        "With `against`: the same code there too; adds `against` and `difference`.",
    ),
    Verb(
        "until",
        "run to a line (FILE:LINE, LINE in the current file, or #ID of a breakpoint): a "
        "one-shot breakpoint, then continue",
        R.State,
        (
            Arg(
                "target",
                str,
                "FILE:LINE, LINE (the current file) or #ID (a breakpoint's line)",
                positional=True,
            ),
            Arg("file", str, "the file (instead of target)", kind="source"),
            Arg("line", int, "the line (instead of target)", minimum=1),
            Arg("id", int, "run to this breakpoint's line (instead of target)", minimum=1),
            _wait(60.0),
        ),
        waits=True,
        errors=(*RESUME_ERRORS, *BREAK_ERRORS, NO_SUCH_BREAKPOINT),
        description="The one-shot breakpoint goes away at the next stop, whatever stopped. "
        "Answers like continue, with `until` the breakpoint it set.",
    ),
    Verb(
        "restart",
        "start the session's script again: same script, args, env, cwd, breakpoints and "
        "watches; a new run id",
        R.State,
        (Arg("wait", float, "seconds to wait for the first stop", 30.0, minimum=0, cli=False),),
        errors=(START_FAILED, *BREAK_ERRORS),
        description="The old run ends (terminated) and keeps its record; `restarted_from` "
        "names it.",
    ),
    Verb(
        "watch",
        "evaluate an expression at every stop (shown with the stop, in JSON under `watches`)",
        R.Watches,
        (
            Arg(
                "expression",
                str,
                "a Python expression, evaluated in the stopped frame",
                REQUIRED,
                kind="text",
                positional=True,
                max_length=ECHOED_LIMIT,
            ),
        ),
        errors=(BAD_EXPRESSION, TOO_MANY_WATCHES, SESSION_ENDED),
    ),
    Verb(
        "unwatch",
        "remove a watch expression (by id or text; none given: all)",
        R.Watches,
        (
            Arg("target", str, "the watch's id (#N or N) or its expression", positional=True),
            Arg("id", int, "the watch's id", minimum=1),
        ),
        errors=(NO_SUCH_WATCH, SESSION_ENDED),
    ),
    Verb(
        "threads",
        "the script's threads: id, name, where each is, and whether it is paused",
        R.Threads,
        method="GET",
        agent=P.THREADS,
        errors=(SESSION_ENDED,),
    ),
    Verb(
        "thread",
        "select a paused thread (number from threads, or id) for stack, vars, eval and step",
        R.State,
        (Arg("number", int, "thread number from threads, or its id", REQUIRED, positional=True),),
        errors=(*PAUSED_ERRORS, NO_SUCH_THREAD),
    ),
    Verb(
        "output",
        "the script's captured stdout and stderr (the last 200 lines unless asked)",
        R.Output,
        (
            Arg("tail", int, "only the last N lines (default 200)", minimum=0),
            Arg("offset", int, "read from this byte offset instead (paging)", minimum=0),
            Arg("limit", int, "at most this many bytes", 16384, minimum=1, maximum=1 << 20),
        ),
        method="GET",
    ),
    Verb(
        "terminate",
        "end the script (its run record stays)",
        R.State,
        description="Already ended: `already_ended` true, not an error.",
    ),
    Verb(
        "forget",
        "remove a session from the daemon's list (terminating it first if it runs)",
        R.Forgotten,
        method="DELETE",
        route="",
        cli_aliases=(),
    ),
    Verb(
        "trace",
        "the run's recorded stops: where, the stack and the variables at each",
        R.Trace,
        (
            Arg("last", int, "the last N stops", 10, minimum=1, maximum=1000),
            RUN,
            HOME,
        ),
        method="GET",
        store=True,
        errors=(NO_SUCH_RUN,),
        description="Read back from the run's events.jsonl; works on ended sessions too.",
    ),
    Verb(
        "sessions",
        "list sessions (--prune removes ended ones)",
        R.Sessions,
        (Arg("prune", bool, "first remove every ended session", False),),
        scope="global",
        method="GET",
    ),
    Verb(
        "runs",
        "list the runs in the run store, newest first",
        R.Runs,
        (Arg("limit", int, LIMIT_HELP, 20, minimum=1, maximum=1000), OFFSET, HOME, STORE_SESSION),
        scope="global",
        method="GET",
        store=True,
    ),
    Verb(
        "checkpoints",
        "list checkpoint records of a run",
        R.Checkpoints,
        (
            RUN,
            *CHECKPOINT_FILTER,
            HOME,
            STORE_SESSION,
        ),
        scope="global",
        method="GET",
        store=True,
        errors=(NO_SUCH_RUN,),
    ),
    Verb(
        "compare-checkpoints",
        "two runs' checkpoint records side by side, paired by name and hit",
        R.CheckpointPairs,
        (
            Arg(
                "b",
                str,
                "the other run: a run id (or prefix) or a run directory, e.g. the reference "
                "repository's .mldbg/runs/<id> or .mldbg/latest",
                REQUIRED,
                positional=True,
            ),
            Arg("a", str, "this run (default: latest)", flag="--run"),
            *CHECKPOINT_FILTER,
            HOME,
            STORE_SESSION,
        ),
        scope="global",
        method="GET",
        store=True,
        errors=(NO_SUCH_RUN,),
        description="Per variable: shapes, dtypes, statistics and their differences, first "
        "values side by side; one-sided names in `unpaired_a`/`unpaired_b`. Numbers, no "
        "verdict.",
    ),
    Verb(
        "nonfinite",
        "the first module call of a capture whose outputs hold NaN/Inf from finite inputs",
        R.FirstNonfinite,
        (
            Arg(
                "source",
                str,
                "a capture: name, RUN/NAME, run id, directory or file (what compare takes)",
                REQUIRED,
                positional=True,
            ),
            HOME,
            STORE_SESSION,
        ),
        scope="global",
        method="GET",
        store=True,
        errors=(UNKNOWN_SOURCE, CORRUPT_FILE, UNREADABLE, CORRUPT_CAPTURE, TOO_SLOW),
        description="Calls whose inputs were already bad are `victims`; `first` is null when "
        "every value is finite.",
    ),
    Verb(
        "module-table",
        "a capture's modules as a table: time and dtypes per call; with B, side by side",
        R.ModuleTable,
        (
            Arg(
                "a", str, "a capture: name, RUN/NAME, run id, directory", REQUIRED, positional=True
            ),
            Arg("b", str, "another capture, its same calls set beside A's", positional=True),
            Arg(
                "sort",
                str,
                "row order: execution, A's time (children included), A's own time, B/A time",
                "order",
                choices=("order", "time", "self", "ratio"),
            ),
            OFFSET,
            Arg("limit", int, LIMIT_HELP, 50, minimum=1, maximum=1000),
            HOME,
            STORE_SESSION,
        ),
        scope="global",
        method="GET",
        store=True,
        errors=(UNKNOWN_SOURCE, CORRUPT_FILE, UNREADABLE, CORRUPT_CAPTURE, TOO_SLOW),
        description="Per call and side: `seconds`, `self_seconds`, `in_dtypes`, `out_dtypes`; "
        "with B `dtype_differs` and `time_ratio`; `summary`: totals, slowest calls, first "
        "dtype difference.",
    ),
    Verb(
        "captures",
        "list module captures (mldbg.capture) in the run store, newest first",
        R.Captures,
        (
            Arg("run", str, "only this run's captures"),
            Arg("limit", int, LIMIT_HELP, 50, minimum=1, maximum=1000),
            HOME,
            STORE_SESSION,
        ),
        scope="global",
        method="GET",
        store=True,
        errors=(NO_SUCH_RUN,),
    ),
    Verb(
        "compare",
        "compare two captures/runs/tensor directories; exit 0 agree, 1 diverge, 2 bad input or "
        "no verdict (a capture lost data the other has)",
        R.CompareSummary,
        (
            Arg(
                "a",
                str,
                "reference: capture, run id, RUN/NAME, directory or file",
                REQUIRED,
                positional=True,
            ),
            Arg("b", str, "port: the same kinds", REQUIRED, positional=True),
            Arg("rtol", float, "relative tolerance (default: per dtype)", minimum=0),
            Arg("atol", float, "absolute tolerance (default: per dtype)", minimum=0),
            MAP,
            Arg(
                "layout",
                str,
                "B's image layout where shapes cannot tell",
                choices=("auto", "NCHW", "NHWC"),
            ),
            Arg("replay", str, "a replay capture (mldbg.replay): judge by local errors"),
            Arg("better", str, "a run of A that rounds less (wider dtype): sharper bounds"),
            Arg(
                "shards",
                dict[str, int | str],
                "gather b's ranks (b=tp@rank*): {glob: dim or 'sum'}",
                max_items=SHARD_RULES_LIMIT,
            ),
            Arg("html", str, "also write an HTML report here", kind="path"),
            Arg("passing", bool, "also list the entries that agree", False, flag="--all"),
            Arg("inputs", bool, "also list input entries", False),
            Arg("module", str, "only modules matching this glob (blocks.3.*)"),
            Arg("call", int, "only this call (0: the first)", minimum=0),
            Arg("status", str, "only this status", choices=COMPARE_STATUSES),
            Arg("kind", str, "only outputs or inputs", choices=("out", "in")),
            Arg("limit", int, LIMIT_HELP, 20, minimum=0, maximum=100000),
            OFFSET,
            HOME,
            STORE_SESSION,
        ),
        scope="global",
        store=True,
        cli=False,  # the CLI streams it in-process with a progress bar (cli/compare_cmd.py)
        # the codes of bad input an agent branches on (bad_input and no_such_capture were
        # never raised; not_tensors and nothing_paired are said in docs/verdict.md, the MCP
        # tool list stays agent-sized)
        errors=(*SOURCE_ERRORS, BAD_SHARDS, BAD_RANKS, TOO_SLOW),
        description="Names the first divergence (inputs agree, outputs differ). Culprit and "
        "failures first; filters: module, call, status, kind.",
    ),
    Verb(
        "line",
        "the first wrong line of the port after compare's module or glue verdict (runs both "
        "scripts once more)",
        R.LineStep,
        (
            Arg("a", str, "reference capture, as compare's", REQUIRED, positional=True),
            Arg("b", str, "port capture, as compare's", REQUIRED, positional=True),
            Arg("map", str, "compare's map file", kind="path"),
            Arg("budget", str, "bytes of records per script (default: the captures' budget)"),
            # job, offset, limit: the MCP server follows a running step's next call itself,
            # and its tool list is in every agent's context (kept under 25 KB)
            Arg("job", str, "the step a next call names", mcp=False),
            _wait(600.0),
            Arg(
                "offset",
                int,
                "first port value listed (default: near the wrong one)",
                minimum=0,
                mcp=False,
            ),
            Arg("limit", int, "port values listed", 20, minimum=1, maximum=1000, mcp=False),
            Arg(
                "base_env",
                dict[str, str],
                "the environment the scripts' own variables are added to (default: the client's)",
                cli=False,
                mcp=False,
                max_length=ENV_LIMIT,
                max_items=10 * ITEMS_LIMIT,
            ),
            HOME,
            STORE_SESSION,
        ),
        scope="global",
        store=True,
        waits=True,
        errors=(
            *SOURCE_ERRORS,
            TOO_SLOW,
            BAD_COMPARE_INPUT,
            NO_SUCH_JOB,
            SCRIPT_FAILED,
            SCOPE_NOT_REACHED,
            START_FAILED,
        ),
        description="Answers first_wrong, last_agreeing, skipped, reason.",
    ),
    Verb(
        "weights",
        "audit the port's loaded parameters against the reference's",
        R.WeightAudit,
        (
            Arg(
                "reference",
                str,
                "a capture with saved weights, or tensor files or their directory",
                REQUIRED,
                positional=True,
            ),
            Arg(
                "port", str, "the same kinds; or NAME@rank* with shards", REQUIRED, positional=True
            ),
            Arg("map", str, "{rename, regex, ignore} file, as compare's", kind="path"),
            Arg("fresh", str, "the port as initialized (nothing loaded)", kind="path"),
            Arg("quantization", str, "packed weights': mxfp4 or bits=4,group_size=64"),
            Arg(
                "shards",
                dict[str, int | str],
                "gather ranks: {glob: dim}",
                max_items=SHARD_RULES_LIMIT,
            ),
            Arg("limit", int, "at most this many problems", 50, minimum=0),
            HOME,
            STORE_SESSION,
        ),
        scope="global",
        store=True,
        errors=(
            BAD_COMPARE_INPUT,
            BAD_WEIGHTS_INPUT,
            BAD_MAP,
            BAD_SHARDS,
            BAD_RANKS,
            UNKNOWN_SOURCE,
            CORRUPT_FILE,
            CORRUPT_CAPTURE,
            UNREADABLE,
            TOO_SLOW,
        ),
        description="Per parameter: ok, dtype, quantized, nonfinite, never_loaded, layout, shape, "
        "values, missing, extra, renamed, fused, tied, buffer. Failures first.",
        verdict="ok",
    ),
    Verb(
        "tensors",
        "the debug_save tensor store: list | info NAME | clear [--name NAME] [--yes]",
        R.TensorStore,
        (
            Arg(
                "action",
                str,
                "list, info or clear",
                "list",
                choices=("list", "info", "clear"),
                positional=True,
            ),
            Arg(
                "name",
                str,
                "the tensor (info), or the only one to clear (also --name)",
                positional=True,
            ),
            Arg("yes", bool, "really delete every stored tensor (clear without --name)", False),
            Arg("limit", int, LIMIT_HELP, 100, minimum=1, maximum=10000),
            HOME,
            STORE_SESSION,
        ),
        scope="global",
        store=True,
        errors=(NO_SUCH_TENSOR, CONFIRM),
    ),
    Verb(
        "clean",
        "remove old runs from the run store",
        R.Cleaned,
        (
            Arg("keep", int, "newest runs to keep", 10, minimum=0),
            Arg("dry_run", bool, "only say what would be removed", False),
            HOME,
            STORE_SESSION,
        ),
        scope="global",
        store=True,
    ),
)

BY_NAME: dict[str, Verb] = {verb.name: verb for verb in VERBS}


def get(name: str) -> Verb:
    return BY_NAME[name]


def fix(verb: str, **args: object) -> R.Call:
    """A call that fixes or continues an error, worded by each surface (CLI flag, MCP tool)."""
    return {"verb": verb, "args": {k: v for k, v in args.items() if v is not None}}


Surface = Literal["cli", "mcp", "rest"]


def word(call: R.Call, surface: Surface) -> str:
    """A call to make next (a ``next``, a ``fix``, a hint's ``calls``), as the surface that
    asked would make it: the command line (``cli``), the MCP tool call with its JSON
    arguments (``mcp``), or the route and its JSON body (``rest``).  Every hint, ``next`` and
    ``fix`` an answer carries is a structured call; this is the one place it becomes text."""
    import json

    name = str(call.get("verb"))
    args = dict(call.get("args") or {})
    verb = BY_NAME.get(name)
    if surface == "mcp":
        listed = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in args.items())
        return f"{name}({listed})"
    if surface == "rest":
        session = str(args.pop("session", "default"))
        if verb is None:
            return f"POST /v1/{name}"
        path = verb.path.replace("{name}", session) if verb.scope == "session" else verb.path
        if verb.scope == "global" and session != "default":
            args["session"] = session
        if verb.method == "GET":  # arguments in the query string
            from urllib.parse import urlencode

            return f"GET {path}" + (f"?{urlencode(args)}" if args else "")
        return f"{verb.method} {path}" + (f" {json.dumps(args, default=str)}" if args else "")
    return _command_line(name, verb, args)


def _command_line(name: str, verb: Verb | None, args: dict[str, object]) -> str:
    """The call as one types it: the positional arguments after the verb (``tensors clear
    --yes``), then the flags; start's script last of all, its own arguments after it."""
    flags = ["mldbg", name]
    session = args.pop("session", None)
    if verb is None:
        return " ".join(flags)
    positional: list[str] = []
    trailing: list[str] = []  # start's script arguments: typed after the script
    for key, value in args.items():
        try:
            arg = verb.arg(key)
        except KeyError:
            continue
        if not arg.cli:
            if key == "args" and isinstance(value, list):
                trailing = [_shell_word(item) for item in value]
                if "--" in value:  # after a `--`, every word is the script's, `--` too
                    trailing.insert(0, "--")
        elif arg.positional:
            positional.append(_shell_word(value))
        elif arg.flag == "-m":  # start -m MODULE: in the script's place, its arguments after
            positional += ["-m", _shell_word(value)]
        else:
            flags += _flag_words(arg, value)
    if session and session != "default":
        flags += ["--session", _shell_word(session)]
    if verb.name == "start" and "script" not in args and "module" not in args:
        positional.append("SCRIPT")
    if any(not a.cli and a.name == "args" for a in verb.args):
        # start: everything after the script is the script's, so the script comes last
        return " ".join(flags + positional + trailing)
    return " ".join(flags[:2] + positional + flags[2:])  # `tensors clear --yes`


def _flag_words(arg: Arg, value: object) -> list[str]:
    """One flag argument as typed: a switch only where it differs from its default, a
    repeatable flag once per item."""
    if arg.type is bool:
        return [arg.cli_flag] if bool(value) != bool(arg.default) else []
    if isinstance(value, list) and arg.nargs is None:
        return [_option(arg.cli_flag, item) for item in value]
    if isinstance(value, dict) and arg.type == dict[str, str]:  # start --env K=V, repeated
        return [_option(arg.cli_flag, f"{key}={item}") for key, item in value.items()]
    return [_option(arg.cli_flag, value)]


def _option(flag: str, value: object) -> str:
    """``--flag VALUE``; ``--flag=VALUE`` for a value an option parser would take for an
    option of its own (``-x``)."""
    word = _shell_word(value)
    text = str(value)
    return f"{flag} {word}" if not text.startswith("-") else _shell_word(f"{flag}={text}")


def _shell_word(value: object) -> str:
    """One argument as a shell reads it back: quoted where it must be (a module path may
    hold anything a capture's index held), JSON for a mapping."""
    import json
    import shlex

    text = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return shlex.quote(text)


def fingerprint() -> str:
    """A short digest of what the client, the daemon and the agent must agree on: the verb
    table as the wire sees it (verbs, routes, argument names and types) and the agent
    protocol's messages.  The daemon publishes it in server.json.  A daemon started by an
    mldbg since upgraded (or edited) still runs the old code while the agent it launches
    comes from the new files: a client that sees another digest retires that daemon when
    it holds no live session, and otherwise says so, instead of leaving an agent to puzzle
    over ``no_such_route`` or a debuggee that never connects."""
    import zlib  # not hashlib: this runs in every CLI command, and hashlib costs ~4 ms to import

    from .agent import protocol

    shape = [(v.name, v.method, v.path, [(a.name, str(a.type)) for a in v.args]) for v in VERBS]
    # the protocol's constants: upper-case names only (``_served_by_class``, a cache the
    # agent fills as it serves, would make a process's digest change under it)
    messages = sorted(
        (k, _canonical(v)) for k, v in vars(protocol).items() if k.isupper() and k[0] != "_"
    )
    data = repr((shape, messages)).encode()
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


def _canonical(value: object) -> str:
    """``repr`` that is the same in every process (sets are ordered by string hashing,
    which is salted per process)."""
    if isinstance(value, set | frozenset):
        return "{" + ", ".join(sorted(_canonical(v) for v in value)) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{k!r}: {_canonical(v)}" for k, v in value.items())) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_canonical(v) for v in value) + "]"
    return repr(value)
