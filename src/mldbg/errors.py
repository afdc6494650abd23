"""Errors that travel from the daemon to its clients, each saying what to do next.

``code`` is a stable machine-readable name; ``extra`` holds data a client can act on
(the live sessions, the nearest executable lines, ...).  The REST layer turns these into
``{"error": message, "code": code, **extra}`` with ``status``.
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


class BreakpointError(MldbgError, ValueError):
    """Inside the debuggee: a breakpoint, watch or exception filter that cannot be set.

    Raised by the agent (which imports only this standard-library module of the package)
    and sent to the daemon as its ``code`` and ``extra``.
    """

    def __init__(self, message: str, code: str = "bad_argument", **extra: Any) -> None:
        super().__init__(message, code=code, **extra)
