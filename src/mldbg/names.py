"""The one pattern a session name must match, checked at every edge that takes one.

A session name ends up in URLs (``/v1/sessions/{name}/...``), file names and log lines,
so anything that could change a path (``/``, ``..``, ``#``, ``?``, whitespace, control
characters) is refused before it reaches any of them.  Child sessions extend their
parent's name with a dot (``default.w1234``), which the pattern allows.
"""

from __future__ import annotations

import re

from .errors import BAD_SESSION_NAME, MldbgError

SESSION_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
_SESSION_NAME = re.compile(SESSION_NAME_PATTERN)
SESSION_NAME_RULE = "1-64 letters, digits, '_', '-' or '.', not starting with '.' or '-', no '..'"


def check_session_name(name: object) -> str:
    """``name`` if it is a valid session name; a ``bad_session_name`` error otherwise."""
    # fullmatch: ``$`` also matches before a final newline, and "name\n" got through
    if isinstance(name, str) and _SESSION_NAME.fullmatch(name) and ".." not in name:
        return name
    shown = repr(name)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise MldbgError(
        f"bad session name {shown}: use {SESSION_NAME_RULE}",
        code=BAD_SESSION_NAME,
        argument="session",
    )


def is_session_name(name: object) -> bool:
    return isinstance(name, str) and bool(_SESSION_NAME.fullmatch(name)) and ".." not in name
