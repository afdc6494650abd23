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
from typing import IO, TYPE_CHECKING, Any

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
    breakpoints: list[dict[str, Any]] = field(default_factory=list)
    stop_on_entry: bool = True
    replace: bool = False
    follow: bool = True  # debug the script's child processes too (start --no-follow: False)
    watches: list[str] = field(default_factory=list)


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


class SessionProcess:
    """The process half of a session: launching it and ending it.

    It knows nothing of the session built on it (``sessions.Session``) or of the manager:
    what it needs of them (the state's condition, the run's event log, the end of the
    run, the family of child processes it hands connections to) is declared below and
    given by the session.
    """

    # Set by Session.__init__; declared here for what this half reads and writes.
    name: str
    request: StartRequest
    cond: threading.Condition
    state: str
    pid: int | None
    terminated: bool
    hello: dict[str, Any]
    process: subprocess.Popen[bytes] | None
    link: AgentLink | None
    run: RunDir | None
    log: RunLog  # the session's lines of events.jsonl
    started_at: str
    home: Path | None
    listener: AgentListener | None
    family: Any
    _main: Future[AgentLink]

    if TYPE_CHECKING:  # the state half's methods this half calls

        @property
        def ended(self) -> bool: ...
        def snapshot(self) -> R.State: ...
        def wait(self, timeout: float, after_seq: int | None = None) -> R.State: ...
        def _record_end(self, code: int) -> None: ...
        def _on_event(self, message: dict[str, Any]) -> None: ...
        def _on_link_closed(self) -> None: ...
        def _watch(self) -> None: ...

    # -- start ------------------------------------------------------------------------------

    def start(self) -> None:
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
        self.home = home
        check_start(home, env)  # a store past its limit takes no new run
        run, output = _make_run_dir(home)
        listener = AgentListener(self._on_connection, self.name)
        spec = LaunchSpec(python, cwd, env, script, req.module, list(req.args))
        try:
            with self.cond:  # a terminate now either comes first (no process) or sees it
                if self.terminated:
                    raise StartFailed(f"session {self.name!r} was terminated while starting")
                process = spawn(spec, listener.address, listener.token, output)
                self.process, self.pid, self.listener = process, process.pid, listener
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
        stem = Path(script).stem if script else (req.module or "module").rsplit(".", 1)[-1]
        self.run = run
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
                python=python,
                pid=process.pid,
                state="starting",
                started_at=self.started_at,
                mldbg_version=__version__,
            )
            self.run = run = finalize_run_dir(run, stem, process.pid)
            live_runs.register(self.name, process.pid, run.path)
            self.log.open(run.file(EVENTS))
            run.update_meta(run_id=run.run_id)
        except OSError as exc:  # a full disk, or the store taken away: stop, and say so
            self._abort_start()
            raise StartFailed(
                f"cannot write the run store under {home}: {exc}; the script was stopped",
                code=STORE_UNWRITABLE,
                run_dir=str(run.path),
            ) from None
        try:
            self.link = link = self._await_main(process, CONNECT_TIMEOUT)
            self.hello = link.hello
            link.start(self._on_event, self._on_link_closed)
            run.update_meta(
                python_version=self.hello.get("python"),
                backend=self.hello.get("backend"),
                libraries=self.hello.get("libraries", {}),
            )
            configure: P.ConfigureArgs = {"breakpoints": req.breakpoints}
            if req.watches:
                configure["watches"] = req.watches
            P.CONFIGURE.call(link, configure)
            with self.cond:
                self.state = "running"
            P.RUN.call(
                link,
                {
                    "stop_on_entry": req.stop_on_entry,
                    "run_dir": str(run.path),
                    "follow": req.follow,
                },
            )
        except (MldbgError, OSError) as exc:
            self._abort_start()
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
        self.log.event("started", pid=process.pid, python=python, backend=self.hello.get("backend"))
        with contextlib.suppress(OSError):  # `mldbg runs` shows it live, not "starting"
            run.update_meta(state="running")
        threading.Thread(target=self._watch, name=f"mldbg-watch-{self.name}", daemon=True).start()

    def _abort_start(self) -> None:
        """A start that failed after its process began: end it, and record how it ended."""
        self._kill()
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            self._record_end(self.process.returncode if self.process.returncode is not None else -9)

    def _on_connection(self, link: AgentLink) -> None:
        """An authenticated connection: the script itself (first), or one of its children."""
        if not link.hello.get("child") and not self._main.done():
            self._main.set_result(link)
        elif self.family is not None and self._main.done() and link.pid == self.pid:
            # the script replaced itself (os.exec* of python): same process, same session
            old, self.link = self.link, link
            if old is not None:
                old.close()
            link.start(self._on_event, self._on_link_closed)
            self.family.configure_later(self, link, ask_root=False)
        elif self.family is not None:
            self.family.adopt(link)
        else:
            link.close()

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

    def terminate(self) -> R.State:
        """End the session whatever its state: paused, running, or a start in progress
        (with or without a process yet), so nothing is ever stuck."""
        if not self.ended:
            with self.cond:
                self.terminated = True
                process = self.process
            if process is None:  # a start still checking its request: it will not spawn now
                with self.cond:
                    if not self.ended:
                        self.state = "exited"
                        self.cond.notify_all()
                return self.snapshot()
            self._kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(TERMINATE_GRACE * 2)
            self.wait(TERMINATE_GRACE)
            if not self.ended and process.returncode is not None:
                self._record_end(process.returncode)  # no watcher yet: a start in progress
        elif self.family is not None:
            self.family.closed = True
            if self.listener is not None:
                self.listener.close()
            self.family.end_all()  # the script ended, children it left behind may not have
        return self.snapshot()

    def _kill(self) -> None:
        process = self.process
        if self.family is not None and process is not None:
            # Children that left the process group (torchrun's ranks call setsid), and
            # children of children: found now, while they are still linked to the script.
            family = [c.pid for c in self.family.live_children() if c.pid is not None]
            tree = descendants(process.pid) if process.poll() is None else []
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGTERM)
            kill_tree([p for p in dict.fromkeys(tree + family) if p != process.pid])
            self.family.end_all()
        if process is None or process.poll() is not None:
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
