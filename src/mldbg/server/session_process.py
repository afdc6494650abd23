"""Launching a session's process and ending it: the half of a session that owns processes.

A start checks the request before anything exists, reserves the run directory, spawns the
debuggee with its agent, waits for it to connect (the listener also takes its child
processes' connections) and configures it; ending one, whatever state it is in, kills the
script's whole process tree, children that left its process group included.  The state
the session reports (from the debuggee's events) and the commands sent to a live one are
``sessions.Session``'s other half.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from .. import __version__, budget
from .. import results as R
from ..agent import protocol as P
from ..errors import STORE_UNWRITABLE, MldbgError, StartFailed
from ..store.runs import (
    EVENTS,
    OUTPUT_LOG,
    RunDir,
    finalize_run_dir,
    mldbg_home,
    open_private,
    reserve_run_dir,
)
from ..store.size import check_start
from . import live_runs
from .agent_link import AgentLink, AgentListener
from .launcher import LaunchSpec, check_target, resolve_python, spawn
from .process_tree import descendants, kill_tree
from .run_log import RunLog
from .start_checks import check_cwd, check_python, check_request
from .tails import read_tail_bounded

CONNECT_TIMEOUT = 60.0
TERMINATE_GRACE = 3.0


@dataclass
class StartRequest:
    script: str | None = None
    module: str | None = None
    args: list[str] = field(default_factory=list)
    python: str | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    env_overrides: dict[str, str] = field(default_factory=dict)
    breakpoints: list[P.BreakArgs] = field(default_factory=list)
    stop_on_entry: bool = True
    replace: bool = False
    follow: bool = True  # debug the script's child processes too (start --no-follow: False)
    watches: list[str] = field(default_factory=list)


ENV_KEPT = 65_536  # bytes of start's variables kept in run.json (its final update must fit)


def kept_env(added: dict[str, str]) -> dict[str, object]:
    """``env`` for run.json: the variables ``start`` added to its client's environment
    (``env``, the capture settings), which ``mldbg line`` needs to run the script again
    as it was started; ``env_left_out`` counts those past ``ENV_KEPT`` bytes."""
    kept: dict[str, str] = {}
    size = 0
    for key, value in added.items():
        size += len(key) + len(value) + 8
        if size > ENV_KEPT:
            break
        kept[key] = value
    fields: dict[str, object] = {"env": kept}
    if len(kept) < len(added):
        fields["env_left_out"] = len(added) - len(kept)
    return fields


def _make_run_dir(home: Path) -> tuple[RunDir, IO[bytes]]:
    """A reserved run directory and its output.log (0600), or ``store_unwritable``."""
    try:
        run = reserve_run_dir(home)
    except OSError as exc:
        raise StartFailed(
            f"cannot create the run directory under {home}: {exc}",
            code=STORE_UNWRITABLE,
            path=str(home),
        ) from None
    try:
        fd = open_private(run.file(OUTPUT_LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError as exc:
        _discard_reserved(run)
        raise StartFailed(
            f"cannot create {run.file(OUTPUT_LOG)}: {exc}", code=STORE_UNWRITABLE, path=str(home)
        ) from None
    return run, os.fdopen(fd, "ab")


def _discard_reserved(run: RunDir) -> None:
    """Nothing ran: the reserved directory holds nothing worth keeping."""
    with contextlib.suppress(OSError):
        run.file(OUTPUT_LOG).unlink()
    with contextlib.suppress(OSError):
        run.path.rmdir()


class ProcessObserver(Protocol):
    """What a launch tells the session built on it (``sessions.Session``), and the one thing
    it asks: callbacks, so that this half holds no state of the session's and names no
    class of the daemon's."""

    def on_run(self, home: Path, run: RunDir) -> None:
        """The run's store and directory: reserved, then again under its real name."""

    def on_spawned(self, pid: int) -> None:
        """The script's process exists."""

    def on_connected(self, link: AgentLink) -> None:
        """The script's agent proved the secret; the observer starts reading its link."""

    def on_running(self, configured: R.Breakpoints) -> None:
        """Configured (the breakpoints and watches its agent set); the script is told to
        run next."""

    def on_connection(self, link: AgentLink) -> None:
        """A later authenticated connection: a child process, or the script after an
        ``os.exec*`` of Python (same pid)."""

    def on_exit(self, code: int) -> None:
        """The script's process ended with ``code`` (negative: the signal)."""

    def other_processes(self) -> list[int]:
        """Processes of the run outside the script's tree that ending it must end too
        (children that left its process group)."""
        ...


class SessionProcess:
    """The process half of a session: launching the script and ending its process tree.

    It owns what it creates (the run directory's reservation, the listener, the process,
    the watcher of its exit) and reports to its :class:`ProcessObserver`; it reads none
    of the session's state.  ``stop`` and a start in progress agree through the launch's
    own lock: a stopped launch never spawns.
    """

    def __init__(
        self, name: str, request: StartRequest, log: RunLog, observer: ProcessObserver
    ) -> None:
        self.name = name
        self.request = request
        self.log = log  # the run's events.jsonl, opened here once the run has its name
        self.observer = observer
        self.process: subprocess.Popen[bytes] | None = None
        self.listener: AgentListener | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._main: Future[AgentLink] = Future()

    # -- start ------------------------------------------------------------------------------

    def start(self, started_at: str) -> None:
        """Check the request, reserve the run, spawn the script, and see it connected,
        configured and running; any failure ends what began and raises ``StartFailed``."""
        req = self.request
        # Everything the request can get wrong is refused before anything is created.
        check_request(
            req.script, req.module, req.args, req.cwd, req.python, req.env, req.env_overrides
        )
        env = dict(req.env) if req.env is not None else dict(os.environ)
        env.update(req.env_overrides)
        cwd = os.path.abspath(os.path.expanduser(req.cwd or os.getcwd()))
        check_cwd(cwd)
        script = check_target(req.script, req.module, cwd)
        python = resolve_python(req.python, env, cwd)
        check_python(python)
        home = mldbg_home(cwd, env)
        check_start(home, env)  # a store past its limit takes no new run
        run, output = _make_run_dir(home)
        listener = AgentListener(self._on_connection, self.name)
        spec = LaunchSpec(python, cwd, env, script, req.module, list(req.args))
        try:
            with self._lock:  # a stop now either comes first (no process) or sees it
                if self._stopped:
                    raise StartFailed(f"session {self.name!r} was terminated while starting")
                process = spawn(spec, listener.address, listener.token, output)
                self.process, self.listener = process, listener
            # Known to a next daemon from the first moment (the run dir renamed below is
            # found again by the pid in its name).
            live_runs.register(self.name, process.pid, run.path)
        except (StartFailed, ValueError, OSError) as exc:
            listener.close()
            _discard_reserved(run)
            if isinstance(exc, StartFailed):
                raise
            raise StartFailed(f"cannot run {python}: {exc}", argument="python") from None
        finally:
            output.close()  # the child holds its own copy of the descriptor
        self.observer.on_spawned(process.pid)
        self.observer.on_run(home, run)
        stem = Path(script).stem if script else (req.module or "module").rsplit(".", 1)[-1]
        try:
            # What is known before the run gets its real name is written first, so a daemon
            # killed between the rename and the next write still leaves a run.json that says
            # when and what was started (the next daemon only adds how it ended).
            run.update_meta(
                session=self.name,
                script=os.path.join(cwd, script) if script else None,
                module=req.module,
                argv=spec.argv[3:],
                cwd=cwd,
                **kept_env(req.env_overrides),
                python=python,
                pid=process.pid,
                state="starting",
                started_at=started_at,
                mldbg_version=__version__,
            )
            run = finalize_run_dir(run, stem, process.pid)
            self.observer.on_run(home, run)
            live_runs.register(self.name, process.pid, run.path)
            self.log.open(run.file(EVENTS))
            run.update_meta(run_id=run.run_id)
        except OSError as exc:  # a full disk, or the store taken away: stop, and say so
            self.abort()
            raise StartFailed(
                f"cannot write the run store under {home}: {exc}; the script was stopped",
                code=STORE_UNWRITABLE,
                run_dir=str(run.path),
            ) from None
        try:
            link = self._await_main(process, CONNECT_TIMEOUT)
            self.observer.on_connected(link)
            hello = link.hello
            run.update_meta(
                python_version=hello.get("python"),
                backend=hello.get("backend"),
                libraries=hello.get("libraries", {}),
            )
            configure: P.ConfigureArgs = {"breakpoints": req.breakpoints}
            if req.watches:
                configure["watches"] = req.watches
            self.observer.on_running(P.CONFIGURE.call(link, configure))
            P.RUN.call(
                link,
                {
                    "stop_on_entry": req.stop_on_entry,
                    "run_dir": str(run.path),
                    "follow": req.follow,
                },
            )
        except (MldbgError, OSError) as exc:
            self.abort()
            tail = read_tail_bounded(run.file(OUTPUT_LOG), 20, budget.OUTPUT_TAIL)[0]
            if isinstance(exc, MldbgError):
                raise StartFailed(
                    exc.message, **exc.extra, output_tail=tail, run_dir=str(run.path)
                ) from None
            raise StartFailed(
                f"cannot write the run store under {home}: {exc}; the script was stopped",
                code=STORE_UNWRITABLE,
                output_tail=tail,
                run_dir=str(run.path),
            ) from None
        self.log.event("started", pid=process.pid, python=python, backend=hello.get("backend"))
        with contextlib.suppress(OSError):  # `mldbg runs` shows it live, not "starting"
            run.update_meta(state="running")
        threading.Thread(target=self._watch, name=f"mldbg-watch-{self.name}", daemon=True).start()

    def _watch(self) -> None:
        assert self.process is not None
        self.observer.on_exit(self.process.wait())

    def abort(self) -> None:
        """A start that failed after its process began: end it, and report how it ended."""
        process = self.process
        if process is None:
            return
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        self.observer.on_exit(process.returncode if process.returncode is not None else -9)

    def _on_connection(self, link: AgentLink) -> None:
        """An authenticated connection: the script itself (first), or a later one."""
        if not link.hello.get("child") and not self._main.done():
            self._main.set_result(link)
        else:
            self.observer.on_connection(link)

    def _await_main(self, process: subprocess.Popen[bytes], timeout: float) -> AgentLink:
        """The script's own connection; fail fast if its interpreter dies first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._main.result(0.1)
            except FutureTimeout:
                pass
            if process.poll() is not None:
                raise StartFailed(
                    f"the script's interpreter exited (code {process.returncode}) before the "
                    "debugger connected",
                    exit_code=process.returncode,
                )
            if time.monotonic() > deadline:
                raise StartFailed(f"the debuggee did not connect within {timeout:.0f} s")

    # -- end --------------------------------------------------------------------------------

    def stop(self) -> subprocess.Popen[bytes] | None:
        """No process may start from now on; the one that did, if any (to be killed)."""
        with self._lock:
            self._stopped = True
            return self.process

    def kill(self) -> None:
        """End the script's whole process tree: its process group, every descendant
        (found while they are still linked to it), and the observer's other processes."""
        process = self.process
        if process is None:
            return
        others = self.observer.other_processes()
        if others or process.poll() is None:
            # Children that left the process group (torchrun's ranks call setsid), and
            # children of children: found now, while they are still linked to the script.
            tree = descendants(process.pid) if process.poll() is None else []
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGTERM)
            kill_tree([p for p in dict.fromkeys(tree + others) if p != process.pid])
        if process.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, TERMINATE_GRACE), (signal.SIGKILL, TERMINATE_GRACE)):
            try:
                os.killpg(process.pid, sig)
            except (ProcessLookupError, PermissionError):
                try:
                    process.send_signal(sig)
                except ProcessLookupError:
                    return
            try:
                process.wait(grace)
                return
            except subprocess.TimeoutExpired:
                continue

    def close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()
