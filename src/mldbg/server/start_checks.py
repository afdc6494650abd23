"""Everything a start request can get wrong, found before anything is created.

``subprocess`` refuses a NUL byte in an argument or an environment value, and ``=`` or an
empty name in the environment, with a ``ValueError`` raised *after* the daemon has made
the run directory and the session: before these checks that was an HTTP 500 and a
session stuck in ``starting``.  Checking first means a bad request changes nothing, and
the error names the argument to fix (``bad_argument``, HTTP 400).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ..errors import BAD_ARGUMENT, MldbgError, StartFailed


def bad(argument: str, message: str) -> MldbgError:
    return MldbgError(message, code=BAD_ARGUMENT, argument=argument)


def check_text(argument: str, value: str | None) -> None:
    """No NUL bytes: the OS cannot pass them in a path, an argument or the environment."""
    if value is not None and "\0" in value:
        raise bad(argument, f"{argument}: contains a NUL byte (\\0), which no process can receive")


def check_args(args: Sequence[str]) -> None:
    for index, arg in enumerate(args):
        if not isinstance(arg, str):
            raise bad("args", f"args[{index}]: must be a string, not {type(arg).__name__}")
        check_text(f"args[{index}]", arg)


def check_env(env: Mapping[str, str], argument: str = "env") -> None:
    """Names non-empty, without ``=`` or NUL; values without NUL (what ``execve`` can carry)."""
    for name, value in env.items():
        shown = repr(name)[:80]
        if not isinstance(name, str) or not name:
            raise bad(argument, f"{argument}: an environment variable needs a non-empty name")
        if "=" in name:
            raise bad(
                argument, f"{argument}: variable name {shown} contains '=', which ends a name"
            )
        if "\0" in name:
            raise bad(argument, f"{argument}: variable name {shown} contains a NUL byte")
        if not isinstance(value, str):
            raise bad(argument, f"{argument}[{shown}]: the value must be a string")
        if "\0" in value:
            raise bad(argument, f"{argument}[{shown}]: the value contains a NUL byte")


def check_cwd(cwd: str) -> None:
    """The working directory exists, is a directory, and this user may enter and list it."""
    check_text("cwd", cwd)
    if not os.path.exists(cwd):
        raise StartFailed(f"working directory {cwd} does not exist", argument="cwd")
    if not os.path.isdir(cwd):
        raise StartFailed(f"working directory {cwd} is not a directory", argument="cwd")
    if not os.access(cwd, os.R_OK | os.X_OK):
        raise StartFailed(f"working directory {cwd} is not readable by this user", argument="cwd")


def check_python(python: str) -> None:
    """The interpreter the script will run under is an executable file."""
    check_text("python", python)
    if not os.path.isfile(python):
        raise StartFailed(f"python {python}: no such file", argument="python")
    if not os.access(python, os.X_OK):
        raise StartFailed(f"python {python}: not executable", argument="python")


def check_request(
    script: str | None,
    module: str | None,
    args: Sequence[str],
    cwd: str | None,
    python: str | None,
    env: Mapping[str, str] | None,
    env_overrides: Mapping[str, str],
) -> None:
    """What can be checked from the request alone; paths are checked once resolved."""
    check_text("script", script)
    check_text("module", module)
    check_text("cwd", cwd)
    check_text("python", python)
    check_args(args)
    if env is not None:
        check_env(env, "base_env")
    check_env(env_overrides, "env")
