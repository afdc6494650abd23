"""Every error mldbg raises, in one tree, each saying what to do next.

``code`` is a stable machine-readable name; ``extra`` holds data a client can act on
(the live sessions, the nearest executable lines, ...).  The REST layer turns these into
``{"error": message, "code": code, **extra}`` with ``status``; the CLI into exit code 2
(bad input) or 1.  Standard library only: the debuggee's agent raises these too.

The hierarchy::

    MldbgError                      code "error"
    ├── UsageError                  "usage": a command line argparse refused
    ├── SessionNotFound             "unknown_session" (404)
    ├── SessionBusy                 "session_busy" (409)
    ├── NotPaused                   "not_paused" (409)
    ├── SessionEnded                "session_ended" (409)
    ├── StartFailed                 "start_failed": the script could not be started
    ├── AgentError                  the debuggee refused a command (its own code)
    ├── AgentTimeout                "agent_timeout" (504)
    ├── DaemonError                 the client's view of any error the daemon answered
    ├── StoreFull                   "store_full": the run store is past its limit
    ├── CompareInputError           "bad_compare_input": nothing could be compared
    ├── CorruptTensorFile           "corrupt_tensor_file" (also a ValueError)
    ├── UnsupportedDtype            "unsupported_dtype" (also a TypeError)
    ├── TutorialError               "tutorial": a tutorial step did not go as written
    ├── HttpProtocolError           "http_protocol": the daemon's reply is not HTTP/1.1 (an OSError)
    ├── NotARegularFile             "unreadable": a FIFO, device or socket where a file belongs (an OSError)
    ├── FileTooLarge                "too_large": a file or line past its reader's limit (a ValueError)
    ├── TooSlow                     "too_slow": an analysis past its deadline (deadline.py)
    ├── OutputRefused               "bad_argument": an output path holding what it may not replace (an OSError)
    ├── NoSuchModule                "bad_argument": capture(within=) names no module (a ValueError)
    │
    │   inside the debuggee (the agent), sent to the daemon as a reply's code and extra:
    ├── CommandError                a command refused ("bad_argument", "not_paused", ...)
    │   └── BreakpointError         a breakpoint, watch or filter that cannot be set (a ValueError)
    │       └── TemplateError       a log template that is not an f-string body
    ├── EvalError                   the user's code raised or did not compile ("eval_error")
    ├── InstrumentError             a file the 3.10/3.11 backend cannot instrument
    ├── InterpreterUnsupported      CPython internals this agent does not know (a RuntimeError)
    └── LinkError                   the peer broke the protocol (too big, too slow)

    BaseException (not under MldbgError, on purpose)
    ├── EvalInterrupt               stops the user's evaluation: it must get past the
    │   └── EvalTimeout             ``except Exception`` of the code being evaluated
    │                               (agent/interrupt.py)
    └── DeadlineInterrupt           stops an analysis past its deadline, past a reader's
                                    ``except Exception``; said as TooSlow (deadline.py)
"""

from __future__ import annotations

from collections.abc import Mapping
from errno import EEXIST, EINVAL
from typing import Any

# -- error codes --
AGENT_ERROR = "agent_error"
AGENT_TIMEOUT = "agent_timeout"
AMBIGUOUS_CAPTURE = "ambiguous_capture"
AMBIGUOUS_FILE = "ambiguous_file"
AMBIGUOUS_RUN = "ambiguous_run"
BAD_ARGUMENT = "bad_argument"
BAD_COMPARE_INPUT = "bad_compare_input"
BAD_CONDITION = "bad_condition"
BAD_EXPRESSION = "bad_expression"
BAD_HITS = "bad_hits"
BAD_INPUT = "bad_input"
BAD_LAYOUT = "bad_layout"
BAD_LOG = "bad_log"
BAD_MAP = "bad_map"
BAD_PATH = "bad_path"
BAD_RANKS = "bad_ranks"
BAD_SESSION_NAME = "bad_session_name"
BAD_SHARDS = "bad_shards"
BAD_STEP = "bad_step"
BAD_TOLERANCE = "bad_tolerance"
BAD_WEIGHTS_INPUT = "bad_weights_input"
BRANCH_EXISTS = "branch_exists"
CONFIRM = "confirm"
CONFIRMATION_REQUIRED = "confirmation_required"
CORRUPT_CAPTURE = "corrupt_capture"
CORRUPT_FILE = "corrupt_file"
CORRUPT_TENSOR_FILE = "corrupt_tensor_file"
DAEMON_BUSY = "daemon_busy"
DAEMON_RUNNING = "daemon_running"
DAEMON_SKEW = "daemon_skew"
DAEMON_START_FAILED = "daemon_start_failed"
DAEMON_STUCK = "daemon_stuck"
DAEMON_UNREACHABLE = "daemon_unreachable"
DIRTY_TREE = "dirty_tree"
ERROR = "error"
EVAL_ERROR = "eval_error"
EVAL_INTERRUPTED = "eval_interrupted"
EVAL_TIMEOUT = "eval_timeout"
FILE_NOT_FOUND = "file_not_found"
GIT_FAILED = "git_failed"
GIT_MISSING = "git_missing"
HTTP_PROTOCOL = "http_protocol"
INSTRUMENT_FAILED = "instrument_failed"
INTERNAL = "internal"
INTERPRETER_UNSUPPORTED = "interpreter_unsupported"
LINK_BROKEN = "link_broken"
NOTHING_COMPARABLE = "nothing_comparable"
NOTHING_PAIRED = "nothing_paired"
NOT_A_CAPTURE = "not_a_capture"
NOT_A_GIT_REPO = "not_a_git_repo"
NOT_A_SOURCE_FILE = "not_a_source_file"
NOT_EDITABLE = "not_editable"
NOT_PAUSED = "not_paused"
NOT_SET_UP = "not_set_up"
NOT_TENSORS = "not_tensors"
NO_CAPTURES = "no_captures"
NO_CODE_AT_LINE = "no_code_at_line"
NO_DAEMON = "no_daemon"
NO_GIT_IDENTITY = "no_git_identity"
NO_INPUTS = "no_inputs"
NO_ROOT_INPUTS = "no_root_inputs"
NO_RUNS = "no_runs"
NO_SUCH_BREAKPOINT = "no_such_breakpoint"
NO_SUCH_CAPTURE = "no_such_capture"
NO_SUCH_FRAME = "no_such_frame"
NO_SUCH_FUNCTION = "no_such_function"
NO_SUCH_JOB = "no_such_job"
NO_SUCH_RUN = "no_such_run"
NO_SUCH_TENSOR = "no_such_tensor"
NO_SUCH_THREAD = "no_such_thread"
NO_SUCH_WATCH = "no_such_watch"
NO_TENSORS = "no_tensors"
OS_ERROR = "os_error"
PROBE_FAILED = "probe_failed"
PROFILE_FAILED = "profile_failed"
REPO_NOT_USED = "repo_not_used"
SCOPE_NOT_REACHED = "scope_not_reached"
SCRIPT_FAILED = "script_failed"
SESSION_BUSY = "session_busy"
SESSION_ENDED = "session_ended"
START_FAILED = "start_failed"
STORE_FULL = "store_full"
STORE_UNWRITABLE = "store_unwritable"
TOO_LARGE = "too_large"
TOO_LONG = "too_long"
TOO_MANY_WATCHES = "too_many_watches"
TOO_SLOW = "too_slow"
TUTORIAL = "tutorial"
UNKNOWN_CAPTURE = "unknown_capture"
UNKNOWN_RUN = "unknown_run"
UNKNOWN_SESSION = "unknown_session"
UNKNOWN_SOURCE = "unknown_source"
UNREADABLE = "unreadable"
UNSUPPORTED_DTYPE = "unsupported_dtype"
USAGE = "usage"
WRONG_BRANCH = "wrong_branch"

# What each code means is said where it is raised; the verb table lists, per verb, the
# codes it can answer (``verbs.Verb.errors``), and clients branch on these values.


class MldbgError(Exception):
    status = 400
    code = ERROR

    def __init__(
        self, message: str, *, code: str | None = None, status: int | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.extra = extra

    def to_json(self) -> dict[str, object]:
        """``{"error", "code"}`` and whatever else the error carries (its ``fix``: a list of
        ``results.Call``; the values it names)."""
        return {"error": self.message, "code": self.code, **self.extra}


class UsageError(MldbgError):
    """A command line the CLI cannot run (argparse's complaint, a bad combination)."""

    code = USAGE


class SessionNotFound(MldbgError):
    status = 404
    code = UNKNOWN_SESSION


class SessionBusy(MldbgError):
    status = 409
    code = SESSION_BUSY


class NotPaused(MldbgError):
    status = 409
    code = NOT_PAUSED


class SessionEnded(MldbgError):
    status = 409
    code = SESSION_ENDED


class AgentError(MldbgError):
    """The debuggee refused a command (bad breakpoint, failing evaluation, ...)."""

    status = 400
    code = AGENT_ERROR


class AgentTimeout(MldbgError):
    status = 504
    code = AGENT_TIMEOUT


class StartFailed(MldbgError):
    status = 400
    code = START_FAILED


class DaemonError(MldbgError):
    """The daemon answered with an error; its JSON body is kept whole."""

    def __init__(self, payload: Mapping[str, object], status: int) -> None:
        extra = {k: v for k, v in payload.items() if k not in ("error", "code")}
        super().__init__(
            str(payload.get("error", "unknown error")),
            code=str(payload.get("code", "error")),
            status=status,
            **extra,
        )


class StoreFull(MldbgError):
    """The run store is past its limit: nothing more is written (``store_size.py``)."""

    code = STORE_FULL


class CompareInputError(MldbgError):
    """Bad input to a comparison: exit code 2, nothing compared."""

    code = BAD_COMPARE_INPUT


class CorruptTensorFile(MldbgError, ValueError):
    """A file that is not a readable safetensors file (truncated, overwritten, not one)."""

    code = CORRUPT_TENSOR_FILE


class UnsupportedDtype(MldbgError, TypeError):
    """A well-formed tensor in a dtype numpy cannot hold (``F8_E8M0``, a future format).

    Not a corrupt file: the pair gets an error of its own and the rest still compare.
    """

    code = UNSUPPORTED_DTYPE


class TutorialError(MldbgError):
    """A tutorial step did not do what the tutorial says it does."""

    code = TUTORIAL


class HttpProtocolError(MldbgError, OSError):
    """The reply is not the HTTP/1.1 this client expects (or the peer closed)."""

    code = HTTP_PROTOCOL


class NotARegularFile(MldbgError, OSError):
    """A FIFO, device, socket or directory where a regular file belongs: never read (a
    FIFO blocks ``open`` forever, ``/dev/zero`` never ends; ``store/reading.py``).  An
    ``OSError`` with ``filename`` and ``strerror``, as the readers' handlers expect."""

    code = UNREADABLE

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(f"{path}: {kind}, not a regular file")
        self.errno = EINVAL
        self.strerror = f"{kind}, not a regular file"
        self.filename = path


class FileTooLarge(MldbgError, ValueError):
    """A file, or one line of it, longer than its reader's limit (``store/reading.py``)."""

    code = TOO_LARGE


class TooSlow(MldbgError):
    """A compare, weight audit, nonfinite or module-table that ran past its deadline
    (``MLDBG_DEADLINE``, ``deadline.py``): stopped, so no input holds a thread for good."""

    code = TOO_SLOW


class NoSuchModule(MldbgError, ValueError):
    """``capture(within=)`` names a module the model does not have (the message lists
    some it has)."""

    code = BAD_ARGUMENT


class OutputRefused(MldbgError, OSError):
    """An output path (``--html``, ``--propose-map``) that holds what the output may not
    replace: a device, a FIFO, a file it did not write (``store/output_files.py``)."""

    code = BAD_ARGUMENT

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.errno = EEXIST
        self.strerror = why
        self.filename = path


# -- raised inside the debuggee ---------------------------------------------------------------


class CommandError(MldbgError):
    """The agent refuses a command; ``code`` and ``extra`` travel to the daemon."""

    def __init__(self, message: str, code: str = BAD_ARGUMENT, **extra: Any) -> None:
        super().__init__(message, code=code, **extra)


class BreakpointError(CommandError, ValueError):
    """A breakpoint, watch or exception filter that cannot be set."""


class TemplateError(BreakpointError):
    """A log template that is not a valid f-string body."""


class EvalError(MldbgError):
    """The user's code raised or did not compile; ``details`` is shown to them.

    ``code``: ``eval_error``; ``eval_timeout`` / ``eval_interrupted`` when it was cut short.
    """

    def __init__(self, message: str, details: dict[str, object], code: str = EVAL_ERROR) -> None:
        super().__init__(message, code=code)
        self.details = details


class InstrumentError(MldbgError):
    """The file cannot be instrumented (unreadable, does not compile, does not match)."""

    code = INSTRUMENT_FAILED


class InterpreterUnsupported(MldbgError, RuntimeError):
    """This interpreter's internals are not the ones the agent knows how to use."""

    code = INTERPRETER_UNSUPPORTED


class LinkError(MldbgError):
    """The peer broke the protocol: a message over its size limit, or too slow to finish."""

    code = LINK_BROKEN
