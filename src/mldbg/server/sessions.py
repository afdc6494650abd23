"""Named debug sessions: one debuggee process each, its state, and its run directory.

State changes come only from the debuggee's events and from the process ending, so a
status read never races with a stop.  Commands that resume the script mark the session
``running`` before they are sent, and the next ``stopped`` event marks it ``paused``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__, budget
from ..errors import MldbgError, NotPaused, SessionBusy, SessionEnded, SessionNotFound, StartFailed
from ..names import check_session_name
from ..runs import (
    EVENTS,
    OUTPUT_LOG,
    JsonlWriter,
    RunDir,
    finalize_run_dir,
    mldbg_home,
    reserve_run_dir,
)
from ..verbs import fix
from .agent_link import AgentLink
from .launcher import LaunchSpec, check_target, resolve_python, spawn

CONNECT_TIMEOUT = 60.0
TERMINATE_GRACE = 3.0
ENDED = ("exited", "crashed")
# What some stops carry besides the fixed fields: watch values, a note (a pause that had to
# stop in library code, an exception raised in a library), the calls that help from there.
STOP_EXTRAS = ("watches", "note", "fix", "raised", "raised_in")


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
    watches: list[str] = field(default_factory=list)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def read_tail_bounded(path: Path, lines: int, limit: int) -> tuple[str, bool]:
    """The last ``lines`` lines of a file, at most ``limit`` bytes of them (a cut is marked)."""
    return budget.cap(read_tail(path, lines, limit * 2), limit, "tail")


def read_page(path: Path, offset: int, limit: int) -> tuple[str, int, int]:
    """``limit`` bytes from ``offset``: (text, size of the file, offset after the page)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(min(offset, size))
            data = fh.read(limit)
    except OSError:
        return "", 0, offset
    return data.decode("utf-8", errors="replace"), size, min(offset, size) + len(data)


def read_tail(path: Path, lines: int, max_bytes: int | None = None) -> str:
    """The last ``lines`` lines of a file, reading only its end."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            block = min(size, max(4096, lines * 256))
            while True:
                fh.seek(size - block)
                data = fh.read(block)
                if data.count(b"\n") > lines or block == size:
                    break
                if max_bytes is not None and block >= max_bytes:
                    break  # one huge line: the caller only wants its end anyway
                block = min(size, block * 4)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "".join(text.splitlines(keepends=True)[-lines:]) if lines else ""


class Session:
    def __init__(self, name: str, request: StartRequest) -> None:
        self.name = name
        self.request = request
        self.cond = threading.Condition()
        self.state = "starting"
        self.stop: dict[str, Any] = {}
        self.stop_seq = 0
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.signal: str | None = None
        self.exception: dict[str, Any] | None = None
        self.terminated = False
        self.hello: dict[str, Any] = {}
        self.process: subprocess.Popen[bytes] | None = None
        self.link: AgentLink | None = None
        self.run: RunDir | None = None
        self.events: JsonlWriter | None = None
        self.store_error: str | None = None
        self.started_at = _now()
        self.home: Path | None = None
        self.last_breaks: dict[str, Any] | None = None  # for restart after the end

    # -- start ------------------------------------------------------------------------------

    def start(self) -> None:
        req = self.request
        env = dict(req.env) if req.env is not None else dict(os.environ)
        env.update(req.env_overrides)
        cwd = os.path.abspath(os.path.expanduser(req.cwd or os.getcwd()))
        script = check_target(req.script, req.module, cwd)
        python = resolve_python(req.python, env, cwd)
        home = mldbg_home(cwd, env)
        self.home = home
        try:
            run = reserve_run_dir(home)
        except OSError as exc:
            raise StartFailed(f"cannot create the run directory under {home}: {exc}") from None
        output = open(run.file(OUTPUT_LOG), "ab")  # noqa: SIM115 - handed to the child
        link = AgentLink(self._on_event, self._on_link_closed)
        spec = LaunchSpec(python, cwd, env, script, req.module, list(req.args))
        try:
            process = spawn(spec, link.address, link.token, output)
        finally:
            output.close()  # the child holds its own copy of the descriptor
        self.process, self.link, self.pid = process, link, process.pid
        stem = Path(script).stem if script else (req.module or "module").rsplit(".", 1)[-1]
        self.run = run = finalize_run_dir(run, stem, process.pid)
        self.events = JsonlWriter(run.file(EVENTS))
        run.update_meta(
            run_id=run.run_id,
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
        try:
            self.hello = link.accept(process, CONNECT_TIMEOUT)
            run.update_meta(
                python_version=self.hello.get("python"),
                backend=self.hello.get("backend"),
                libraries=self.hello.get("libraries", {}),
            )
            configure: dict[str, Any] = {"breakpoints": req.breakpoints}
            if req.watches:
                configure["watches"] = req.watches
            link.request("configure", configure)
            with self.cond:
                self.state = "running"
            link.request("run", {"stop_on_entry": req.stop_on_entry, "run_dir": str(run.path)})
        except MldbgError as exc:
            self._kill()
            process.wait(10)
            self._record_end(process.returncode)
            tail = read_tail_bounded(run.file(OUTPUT_LOG), 20, budget.OUTPUT_TAIL)[0]
            raise StartFailed(
                exc.message, **exc.extra, output_tail=tail, run_dir=str(run.path)
            ) from None
        self.log_event("started", pid=process.pid, python=python, backend=self.hello.get("backend"))
        with contextlib.suppress(OSError):  # `mldbg runs` shows it live, not "starting"
            run.update_meta(state="running")
        threading.Thread(target=self._watch, name=f"mldbg-watch-{self.name}", daemon=True).start()

    # -- events from the debuggee -----------------------------------------------------------

    def _on_event(self, message: dict[str, Any]) -> None:
        kind = message.pop("event", "")
        if kind == "stopped":
            trace = message.pop("trace", None) or {}
            with self.cond:
                self.state = "paused"
                self.stop = message
                self.stop_seq += 1
                self.cond.notify_all()
            self.log_event("stopped", **_brief_stop(message), **trace)
        elif kind == "resumed":
            with self.cond:
                if self.state == "paused":
                    self.state = "running"
                self.cond.notify_all()
        elif kind == "log":
            self.log_event("log", **message)
        elif kind == "finished":
            self.exception = message.get("exception")
            self.log_event("finished", **message)

    def _on_link_closed(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def _watch(self) -> None:
        assert self.process is not None
        code = self.process.wait()
        self._record_end(code)

    def _record_end(self, code: int) -> None:
        with self.cond:
            if self.state in ENDED:
                return
            if code < 0:
                self.signal = (
                    signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
                )
                state = "exited" if self.terminated else "crashed"
            else:
                self.exit_code = code
                state = "exited"
            # The records first: whoever hears "ended" may read run.json at once.
            self.log_event("ended", state=state, exit_code=self.exit_code, signal=self.signal)
            if self.run is not None:
                try:
                    self.run.update_meta(
                        state=state,
                        exit_code=self.exit_code,
                        signal=self.signal,
                        terminated=self.terminated,
                        ended_at=_now(),
                        exception=self.exception,
                        output_tail=self.output_tail()[0],
                    )
                except OSError as exc:
                    self.store_error = f"could not update {self.run.file('run.json')}: {exc}"
            self.state = state
            self.stop = {}
            self.cond.notify_all()
        if self.link is not None:
            self.link.close()
        if self.events is not None:
            self.events.close()

    # -- the run's event log ----------------------------------------------------------------

    def log_event(self, event: str, /, **fields: Any) -> None:
        """Append to events.jsonl; a full disk is reported in the state, never fatal."""
        if self.events is None:
            return
        try:
            self.events.append(
                {"time": time.time(), **fields, "event": event, "session": self.name}
            )
        except (OSError, ValueError) as exc:
            self.store_error = f"could not write {self.events.path}: {exc}"

    # -- state ------------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def snapshot(self) -> dict[str, Any]:
        with self.cond:
            paused = self.state == "paused"
            stop = self.stop if paused else {}
            state: dict[str, Any] = {
                "session": self.name,
                "state": self.state,
                "reason": stop.get("reason"),
                "location": stop.get("location"),
                "pid": self.pid,
                "exit_code": self.exit_code,
                "signal": self.signal,
                "exception": stop.get("exception") if paused else self.exception,
                "breakpoint": stop.get("breakpoint"),
                "condition_error": stop.get("condition_error"),
                "checkpoint": stop.get("checkpoint"),
                "thread": stop.get("thread"),
                "frame_index": stop.get("frame_index"),
                "run_id": self.run.run_id if self.run else None,
                "run_dir": str(self.run.path) if self.run else None,
                "python": self.hello.get("executable"),
                "python_version": self.hello.get("python"),
                "backend": self.hello.get("backend"),
            }
        for key in STOP_EXTRAS:
            if stop.get(key) is not None:
                state[key] = stop[key]
        if self.store_error:
            state["store_error"] = self.store_error
        if self.ended:
            state["output_tail"], cut = self.output_tail()
            if cut:
                state["output_truncated"] = True
            state["terminated"] = self.terminated
        return state

    def output_tail(self) -> tuple[str, bool]:
        """The last lines of output every ended state carries: 20 lines, a few KB at most."""
        if self.run is None:
            return "", False
        return read_tail_bounded(self.run.file(OUTPUT_LOG), 20, budget.OUTPUT_TAIL)

    def wait(self, timeout: float, after_seq: int | None = None) -> dict[str, Any]:
        """Wait while the script runs, up to ``timeout`` seconds, then report the state."""
        seq = self.stop_seq if after_seq is None else after_seq
        with self.cond:
            self.cond.wait_for(
                lambda: (
                    self.ended
                    or (self.state == "paused" and self.stop_seq > seq)
                    or (after_seq is None and self.state == "paused")
                ),
                timeout=max(0.0, timeout),
            )
        return self.snapshot()

    # -- commands ---------------------------------------------------------------------------

    def _link(self) -> AgentLink:
        if self.ended or self.link is None or self.link.closed:
            raise SessionEnded(
                f"session {self.name!r} has {self.state} (exit code {self.exit_code}, signal "
                f"{self.signal}); start it again",
                session=self.name,
                state=self.state,
                fix=[fix("start", session=self.name)],
            )
        return self.link

    def command(self, cmd: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        return self._link().request(cmd, args, timeout)

    def paused_command(
        self, cmd: str, args: dict[str, Any] | None = None, timeout: float = 60.0
    ) -> Any:
        link = self.require_paused()
        return link.request(cmd, args, timeout)

    def require_paused(self) -> AgentLink:
        link = self._link()
        if self.state != "paused":
            raise NotPaused(
                f"session {self.name!r} is {self.state}, not paused; pause it, or wait for a "
                "breakpoint",
                session=self.name,
                state=self.state,
                fix=[fix("pause", session=self.name), fix("wait", session=self.name)],
            )
        return link

    def resume(
        self, cmd: str, args: dict[str, Any] | None = None, wait: float = 0.0
    ) -> dict[str, Any]:
        """Continue or step; then wait up to ``wait`` seconds for the next stop or the end.

        ``continue`` on a running script just waits: it is already doing what was asked.
        """
        link = self._link()
        with self.cond:
            if cmd == "continue" and self.state == "running":
                seq = self.stop_seq
                running = True
            else:
                running = False
        if running:
            return self.wait(wait, after_seq=seq)
        with self.cond:
            if self.state != "paused":
                raise NotPaused(
                    f"session {self.name!r} is {self.state}; it can only {cmd} when paused",
                    session=self.name,
                    state=self.state,
                )
            seq = self.stop_seq
            self.state = "running"
        try:
            link.request(cmd, args)
        except MldbgError:
            with self.cond:
                if self.state == "running" and self.stop_seq == seq:
                    self.state = "paused"
            raise
        self.log_event(cmd, **(args or {}))
        return self.wait(wait, after_seq=seq)

    def pause(self, wait: float = 5.0) -> dict[str, Any]:
        link = self._link()
        if self.state == "paused":
            # Paused already: the agent interrupts an evaluation that is still running.
            answer = link.request("pause", None, 10.0)
            state = self.snapshot()
            if isinstance(answer, dict) and answer.get("interrupted"):
                state["interrupted"] = True
            return state
        seq = self.stop_seq
        link.request("pause")
        self.log_event("pause")
        return self.wait(wait, after_seq=seq)

    def evaluate(self, expression: str, timeout: float = 30.0) -> dict[str, Any]:
        shown = budget.capped(expression, budget.VALUE)
        try:
            result = self.paused_command(
                "eval", {"expression": expression, "timeout": timeout}, timeout + 30.0
            )
        except MldbgError as exc:
            self.log_event("eval", expression=shown, error=exc.message, code=exc.code)
            raise
        self.log_event(
            "eval", expression=shown, result=result.get("result"), type=result.get("type")
        )
        return result

    def output(
        self, tail: int | None = None, offset: int | None = None, limit: int = budget.OUTPUT
    ) -> dict[str, Any]:
        """A bounded page of the script's output: its tail (default), or ``limit`` bytes
        from ``offset``; ``next`` is the call that reads on."""
        if self.run is None:
            return {"output": "", "path": None, "size": 0, "offset": 0, "truncated": False}
        path = self.run.file(OUTPUT_LOG)
        if offset is not None:
            text, size, end = read_page(path, offset, limit)
            result: dict[str, Any] = {
                "output": text,
                "path": str(path),
                "size": size,
                "offset": min(offset, size),
                "truncated": end < size,
            }
            if end < size:
                result["next"] = {"verb": "output", "args": {"offset": end, "limit": limit}}
            return result
        lines = 200 if tail is None else tail
        text, cut = read_tail_bounded(path, lines, limit)
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        shown = len(text.encode("utf-8", errors="replace"))
        result = {
            "output": text,
            "path": str(path),
            "size": size,
            "offset": max(0, size - shown),
            "truncated": shown < size,
        }
        if shown < size:
            result["next"] = {"verb": "output", "args": {"offset": 0, "limit": limit}}
        return result

    def terminate(self) -> dict[str, Any]:
        if not self.ended:
            self.terminated = True
            self._kill()
            assert self.process is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(TERMINATE_GRACE * 2)
            self.wait(TERMINATE_GRACE)
        return self.snapshot()

    def _kill(self) -> None:
        process = self.process
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


def _brief_stop(stop: dict[str, Any]) -> dict[str, Any]:
    location = stop.get("location") or {}
    brief = {
        "reason": stop.get("reason"),
        "file": location.get("file"),
        "line": location.get("line"),
        "function": location.get("function"),
        "code": location.get("code"),
        "thread": (stop.get("thread") or {}).get("name"),
    }
    for key in ("exception", "breakpoint", "condition_error", "checkpoint"):
        if stop.get(key):
            brief[key] = stop[key]
    return brief


class SessionManager:
    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def start(self, name: str, request: StartRequest) -> Session:
        check_session_name(name)
        with self._lock:
            old = self._sessions.get(name)
            if old is not None and not old.ended and not request.replace:
                raise SessionBusy(
                    f"session {name!r} is still {old.state} (pid {old.pid}); terminate it "
                    "first, replace it, or pick another session name",
                    session=name,
                    fix=[fix("terminate", session=name), fix("start", session=name, replace=True)],
                )
            session = Session(name, request)
            self._sessions[name] = session
        if old is not None and not old.ended:
            old.terminate()
        try:
            session.start()
        except MldbgError:
            with self._lock:
                if self._sessions.get(name) is session and session.process is None:
                    # nothing ran: the previous session of this name (ended) keeps its place
                    if old is not None:
                        self._sessions[name] = old
                    else:
                        del self._sessions[name]
            raise
        return session

    def get(self, name: str) -> Session:
        with self._lock:
            session = self._sessions.get(name)
            if session is None:
                live = sorted(self._sessions)
                shown = ", ".join(live[:20]) + (
                    f" (+{len(live) - 20} more)" if len(live) > 20 else ""
                )
                hint = f"sessions: {shown}" if live else "no sessions exist; start one"
                raise SessionNotFound(
                    f"no session named {name!r}; {hint}",
                    sessions=live[:100],
                    fix=[fix("sessions")] if live else [fix("start", session=name)],
                )
            return session

    def all(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def prune(self) -> list[str]:
        """Forget every ended session; their run records stay in the run store."""
        with self._lock:
            ended = [name for name, s in self._sessions.items() if s.ended]
            for name in ended:
                del self._sessions[name]
        return ended

    def remove(self, name: str) -> None:
        session = self.get(name)
        session.terminate()
        with self._lock:
            self._sessions.pop(name, None)

    def shutdown(self) -> None:
        for session in self.all():
            session.terminate()
