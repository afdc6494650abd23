"""The run this process writes to: the debug session's, or one made on first use.

Checkpoints and captures both land in "the current run".  Under the debugger the agent
attaches the session's run directory; a plain ``python script.py`` gets its own run
directory the first time anything needs one, so records never go nowhere.  Standard
library only: it runs inside the user's script.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from pathlib import Path

from .runs import RunDir, create_run_dir, mldbg_home

_lock = threading.Lock()
_run: RunDir | None = None


def attach(run_dir: str) -> None:
    """Called by the agent: everything this process records goes to the session's run."""
    global _run
    with _lock:
        _run = RunDir(Path(run_dir))


def current_run() -> RunDir:
    """The attached run, or a plain run directory created now (once per process)."""
    global _run
    with _lock:
        if _run is None:
            _run = _plain_run()
        return _run


def _plain_run() -> RunDir:
    script = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    stem = os.path.splitext(os.path.basename(script))[0] or "python"
    run = create_run_dir(mldbg_home(), stem, os.getpid())
    run.update_meta(
        run_id=run.run_id,
        kind="plain",
        script=os.path.abspath(script) if os.path.exists(script) else script,
        argv=sys.argv[1:],
        cwd=os.getcwd(),
        python=sys.executable,
        python_version=sys.version.split()[0],
        pid=os.getpid(),
        state="running",
        started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    atexit.register(_mark_ended, run)
    return run


def _mark_ended(run: RunDir) -> None:
    with contextlib.suppress(OSError):
        run.update_meta(state="exited", ended_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def reset() -> None:
    """Forget the current run: the next record starts a new run directory.

    For long-lived processes (a notebook, a test session) that want one run per experiment.
    """
    global _run
    with _lock:
        _run = None
