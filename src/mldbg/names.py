"""The one pattern a session name must match, checked at every edge that takes one.

A session name ends up in URLs (``/v1/sessions/{name}/...``), file names and log lines,
so anything that could change a path (``/``, ``..``, ``#``, ``?``, whitespace, control
characters) is refused before it reaches any of them.  Child sessions extend their
parent's name with a dot (``default.w1234``), which the pattern allows.
"""

from __future__ import annotations

import re
from typing import TypeGuard

from .errors import BAD_SESSION_NAME, MldbgError

# The whole rule but the length, as a pattern the OpenAPI document can carry (no ".."
# written into it: a name the document allowed, "a..b", was refused).
SESSION_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*\.?$"
SESSION_NAME_MAX = 64
_SESSION_NAME = re.compile(SESSION_NAME_PATTERN)
SESSION_NAME_RULE = "1-64 letters, digits, '_', '-' or '.', not starting with '.' or '-', no '..'"


def check_session_name(name: object) -> str:
    """``name`` if it is a valid session name; a ``bad_session_name`` error otherwise."""
    if is_session_name(name):
        return name
    shown = repr(name)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise MldbgError(
        f"bad session name {shown}: use {SESSION_NAME_RULE}",
        code=BAD_SESSION_NAME,
        argument="session",
    )


def is_session_name(name: object) -> TypeGuard[str]:
    # fullmatch: ``$`` also matches before a final newline, and "name\n" got through
    return (
        isinstance(name, str)
        and len(name) <= SESSION_NAME_MAX
        and bool(_SESSION_NAME.fullmatch(name))
    )
