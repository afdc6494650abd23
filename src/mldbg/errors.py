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
    └── EvalInterrupt               stops the user's evaluation: it must get past the
        └── EvalTimeout             ``except Exception`` of the code being evaluated
                                    (agent/interrupt.py)
"""

from __future__ import annotations

from typing import Any


class MldbgError(Exception):
    status = 400
    code = "error"

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

    def to_json(self) -> dict[str, Any]:
        return {"error": self.message, "code": self.code, **self.extra}


class UsageError(MldbgError):
    """A command line the CLI cannot run (argparse's complaint, a bad combination)."""

    code = "usage"


class SessionNotFound(MldbgError):
    status = 404
    code = "unknown_session"


class SessionBusy(MldbgError):
    status = 409
    code = "session_busy"


class NotPaused(MldbgError):
    status = 409
    code = "not_paused"


class SessionEnded(MldbgError):
    status = 409
    code = "session_ended"


class AgentError(MldbgError):
    """The debuggee refused a command (bad breakpoint, failing evaluation, ...)."""

    status = 400
    code = "agent_error"


class AgentTimeout(MldbgError):
    status = 504
    code = "agent_timeout"


class StartFailed(MldbgError):
    status = 400
    code = "start_failed"


class DaemonError(MldbgError):
    """The daemon answered with an error; its JSON body is kept whole."""

    def __init__(self, payload: dict[str, Any], status: int) -> None:
        extra = {k: v for k, v in payload.items() if k not in ("error", "code")}
        super().__init__(
            str(payload.get("error", "unknown error")),
            code=str(payload.get("code", "error")),
            status=status,
            **extra,
        )


class StoreFull(MldbgError):
    """The run store is past its limit: nothing more is written (``store_size.py``)."""

    code = "store_full"


class CompareInputError(MldbgError):
    """Bad input to a comparison: exit code 2, nothing compared."""

    code = "bad_compare_input"


class CorruptTensorFile(MldbgError, ValueError):
    """A file that is not a readable safetensors file (truncated, overwritten, not one)."""

    code = "corrupt_tensor_file"


class UnsupportedDtype(MldbgError, TypeError):
    """A well-formed tensor in a dtype numpy cannot hold (``F8_E8M0``, a future format).

    Not a corrupt file: the pair gets an error of its own and the rest still compare.
    """

    code = "unsupported_dtype"


class TutorialError(MldbgError):
    """A tutorial step did not do what the tutorial says it does."""

    code = "tutorial"


class HttpProtocolError(MldbgError, OSError):
    """The reply is not the HTTP/1.1 this client expects (or the peer closed)."""

    code = "http_protocol"


# -- raised inside the debuggee ---------------------------------------------------------------


class CommandError(MldbgError):
    """The agent refuses a command; ``code`` and ``extra`` travel to the daemon."""

    def __init__(self, message: str, code: str = "bad_argument", **extra: Any) -> None:
        super().__init__(message, code=code, **extra)


class BreakpointError(CommandError, ValueError):
    """A breakpoint, watch or exception filter that cannot be set."""


class TemplateError(BreakpointError):
    """A log template that is not a valid f-string body."""


class EvalError(MldbgError):
    """The user's code raised or did not compile; ``details`` is shown to them.

    ``code``: ``eval_error``; ``eval_timeout`` / ``eval_interrupted`` when it was cut short.
    """

    def __init__(self, message: str, details: dict[str, Any], code: str = "eval_error") -> None:
        super().__init__(message, code=code)
        self.details = details


class InstrumentError(MldbgError):
    """The file cannot be instrumented (unreadable, does not compile, does not match)."""

    code = "instrument_failed"


class InterpreterUnsupported(MldbgError, RuntimeError):
    """This interpreter's internals are not the ones the agent knows how to use."""

    code = "interpreter_unsupported"


class LinkError(MldbgError):
    """The peer broke the protocol: a message over its size limit, or too slow to finish."""

    code = "link_broken"
