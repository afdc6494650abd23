"""Starting a debuggee: which interpreter, which environment, and the agent on its path.

The agent must be importable by any interpreter without installing mldbg there, yet the
daemon's own site-packages (torch, fastapi, ...) must not leak into the script's
environment.  So the debuggee's ``PYTHONPATH`` gets a private directory holding only a
link to the ``mldbg`` package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .. import interpreters
from ..errors import MldbgError, StartFailed

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_shim_dir: str | None = None
UNSET = "__MLDBG_UNSET__"


def agent_path() -> str:
    """A directory whose only entry is ``mldbg`` (a link to this package), made once per daemon."""
    global _shim_dir
    if _shim_dir is None or not os.path.exists(os.path.join(_shim_dir, "mldbg")):
        shim = tempfile.mkdtemp(prefix="mldbg-agent-")
        try:
            os.symlink(_PACKAGE_DIR, os.path.join(shim, "mldbg"), target_is_directory=True)
        except OSError:  # no symlinks here: a copy of the (small, pure-Python) package works too
            shutil.copytree(
                _PACKAGE_DIR,
                os.path.join(shim, "mldbg"),
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        _shim_dir = shim
    return _shim_dir


def remove_agent_path() -> None:
    """At daemon exit: debuggees still running have already imported the agent."""
    global _shim_dir
    if _shim_dir is not None:
        shutil.rmtree(_shim_dir, ignore_errors=True)
        _shim_dir = None


def resolve_python(requested: str | None, env: Mapping[str, str], cwd: str) -> str:
    """The interpreter a session runs (``interpreters.resolve_python``, with the client's
    environment); a bad ``--python`` refuses the start."""
    try:
        return interpreters.resolve_python(requested, cwd, env)
    except MldbgError as exc:
        raise StartFailed(exc.message, argument="python") from None


@dataclass
class LaunchSpec:
    python: str
    cwd: str
    env: dict[str, str]
    script: str | None = None
    module: str | None = None
    args: list[str] = field(default_factory=list)

    @property
    def argv(self) -> list[str]:
        target = ["-m", self.module] if self.module else [str(self.script)]
        return [self.python, "-m", "mldbg.agent", *target, *self.args]


def check_target(script: str | None, module: str | None, cwd: str) -> str | None:
    """Refuse a missing script or working directory before anything starts."""
    if not os.path.isdir(cwd):
        raise StartFailed(f"working directory {cwd} does not exist")
    if bool(script) == bool(module):
        raise StartFailed("give exactly one of a script path or -m MODULE")
    if script:
        path = os.path.join(cwd, os.path.expanduser(script))
        if not os.path.exists(path):
            raise StartFailed(f"no such script: {script} (looked in {cwd})", script=script)
        if os.path.isdir(path) and not os.path.exists(os.path.join(path, "__main__.py")):
            raise StartFailed(f"{script} is a directory without __main__.py")
        return os.path.expanduser(script)
    return None


def spawn(
    spec: LaunchSpec, agent_address: str, agent_token: str, output: IO[bytes]
) -> subprocess.Popen[bytes]:
    env = dict(spec.env)
    original = env.get("PYTHONPATH")
    shim = agent_path()
    env["PYTHONPATH"] = shim + (os.pathsep + original if original else "")
    env["MLDBG_AGENT_PYTHONPATH"] = original if original is not None else UNSET
    env["MLDBG_AGENT_PATH"] = shim
    env["MLDBG_AGENT_ADDR"] = agent_address
    env["MLDBG_AGENT_TOKEN"] = agent_token
    try:
        return subprocess.Popen(
            spec.argv,
            cwd=spec.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C at the client never reaches the script
        )
    except OSError as exc:
        raise StartFailed(f"cannot run {spec.python}: {exc.strerror}") from None
