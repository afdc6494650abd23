"""Named debug sessions: one debuggee process each, its state, and its run directory.

State changes come only from the debuggee's events and from the process ending, so a
status read never races with a stop.  Commands that resume the script mark the session
``running`` before they are sent, and the next ``stopped`` event marks it ``paused``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from .. import budget
from .. import results as R_
from ..agent import protocol as P
from ..errors import MldbgError, NotPaused, SessionEnded, StartFailed
from ..store.runs import OUTPUT_LOG, RunDir
from ..verbs import fix
from . import live_runs
from .agent_link import AgentLink, AgentListener
from .breakpoint_list import BreakpointList
from .run_log import RunLog
from .session_process import TERMINATE_GRACE, SessionProcess, StartRequest
from .tails import read_page, read_tail, read_tail_bounded

A = TypeVar("A", bound=Mapping[str, object])  # a command's arguments (``protocol.AgentCommand``)
Result = TypeVar("Result")  # its result

__all__ = ["ENDED", "Registry", "Session", "StartRequest", "read_page", "read_tail"]

ENDED = ("exited", "crashed")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# After the process exits, how long its last messages may take to be read (its link is
# read on another thread); longer only when a child it forked still holds the socket.
LAST_WORDS_WAIT = 2.0


class Registry(Protocol):
    """What a session needs of the manager that lists it (``manager.SessionManager``):
    the sessions listed now, and a place to list a child process's session."""

    def all(self) -> list[Session]: ...
    def add_child(self, child: Session) -> None: ...


class ChildProcesses(Protocol):
    """What a session needs of its script's child processes (``children.Family``, which
    the manager gives it): adopting their connections, listing them, reaching and ending
    them."""

    closed: bool  # terminated: no process of the run may connect any more

    def adopt(self, link: AgentLink) -> None: ...
    def configure_later(self, session: Session, link: AgentLink) -> None: ...
    def live_children(self) -> Sequence[Session]: ...
    def detached(self) -> R_.DetachedChildren | None: ...
    def broadcast(
        self, command: P.AgentCommand[A, Result], args: Mapping[str, object] | None
    ) -> None: ...
    def close_when_idle(self, listener: AgentListener) -> None: ...
    def end_all(self) -> None: ...


class Session:
    """One named session: its state from the debuggee's events, and the commands sent to
    it.  Its process is a :class:`SessionProcess` it holds (a root session's; a child
    process's session and one a restarted daemon found have none), which reports through
    the ``on_*`` callbacks below and knows nothing else of the session."""

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
        self.hello: P.Hello = {}
        self.link: AgentLink | None = None
        self.run: RunDir | None = None
        self.log = RunLog(lambda: self.name)  # the session's lines of events.jsonl
        self.started_at = _now()
        self.home: Path | None = None
        self.recovered: R_.Recovered | None = None  # found by a restarted daemon
        self.manager: Registry | None = None  # set by the manager; children register there
        self.family: ChildProcesses | None = (
            None  # the script's child processes (set by the manager)
        )
        self.launch: SessionProcess | None = None  # the script's process, once started
        # what its agent holds, for its child processes and a restart (even after the end)
        self.breakpoints = BreakpointList()

    # -- the process: start, and what it reports (session_process.ProcessObserver) -----------

    def start(self) -> None:
        """Launch the script (``StartFailed`` if it cannot be, the session then ended)."""
        with self.cond:
            if self.terminated:
                raise StartFailed(f"session {self.name!r} was terminated while starting")
            self.launch = launch = SessionProcess(self.name, self.request, self.log, self)
        launch.start(self.started_at)

    def abort_start(self) -> None:
        """End a start that failed in an unexpected way, so it is never left "starting"."""
        if self.launch is not None and not self.ended:
            self.launch.abort()

    def on_run(self, home: Path, run: RunDir) -> None:
        self.home, self.run = home, run

    def on_spawned(self, pid: int) -> None:
        with self.cond:
            self.pid = pid

    def on_connected(self, link: AgentLink) -> None:
        self.link, self.hello = link, link.hello
        link.start(self._on_event, self._on_link_closed)

    def on_running(self, configured: R_.Breakpoints) -> None:
        self.breakpoints.configured(configured)
        with self.cond:
            self.state = "running"

    def on_connection(self, link: AgentLink) -> None:
        """A child process of the script, or the script itself after an ``os.exec*``."""
        if self.family is None:
            link.close()
        elif link.pid == self.pid:
            # the script replaced itself (os.exec* of python): same process, same session
            old, self.link = self.link, link
            if old is not None:
                old.close()
            link.start(self._on_event, self._on_link_closed)
            self.family.configure_later(self, link)
        else:
            self.family.adopt(link)

    def on_exit(self, code: int) -> None:
        link = self.link
        if link is not None:  # the `finished` event (the uncaught exception) first
            link.drained(LAST_WORDS_WAIT)
        self._record_end(code)

    def other_processes(self) -> list[int]:
        if self.family is None:
            return []
        return [c.pid for c in self.family.live_children() if c.pid is not None]

    def terminate(self) -> R_.State:
        """End the session whatever its state: paused, running, or a start in progress
        (with or without a process yet), so nothing is ever stuck."""
        if not self.ended:
            with self.cond:
                self.terminated = True
                launch = self.launch
            process = launch.stop() if launch is not None else None
            if launch is None or process is None:  # a start still checking its request
                with self.cond:
                    if not self.ended:
                        self.state = "exited"
                        self.cond.notify_all()
                return self.snapshot()
            launch.kill()
            if self.family is not None:
                self.family.end_all()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(TERMINATE_GRACE * 2)
            self.wait(TERMINATE_GRACE)
            if not self.ended and process.returncode is not None:
                self._record_end(process.returncode)  # no watcher yet: a start in progress
        elif self.family is not None:
            self.family.closed = True
            if self.launch is not None:
                self.launch.close_listener()
            self.family.end_all()  # the script ended, children it left behind may not have
        return self.snapshot()

    # -- events from the debuggee -----------------------------------------------------------

    def _on_event(self, message: dict[str, Any]) -> None:
        """An event the link checked against its declaration: to the one method for it."""
        handler = P.handlers_of(self).get(str(message.pop("event", "")))
        if handler is not None:
            handler(message)

    @P.serves(P.STOPPED)
    def _on_stopped(self, event: P.Stopped) -> None:
        trace: Mapping[str, object] = event.get("trace") or {}
        stop = {k: v for k, v in event.items() if k != "trace"}
        # Recorded before anyone is told: a stop a client saw is in events.jsonl even if
        # the daemon is killed the moment after (the crash-safe trace).
        self.log.event("stopped", **_brief_stop(stop), **trace)
        with self.cond:
            self.state = "paused"
            self.stop = stop
            self.stop_seq += 1
            self.cond.notify_all()

    @P.serves(P.RESUMED)
    def _on_resumed(self, event: P.Resumed) -> None:
        with self.cond:
            if self.state == "paused":
                self.state = "running"
            self.cond.notify_all()

    @P.serves(P.LOG)
    def _on_log(self, event: P.Log) -> None:
        self.log.event("log", **event)

    @P.serves(P.FINISHED)
    def _on_finished(self, event: P.Finished) -> None:
        exception = event.get("exception")
        self.exception = dict(exception) if exception is not None else None
        self.log.event("finished", **event)

    def _on_link_closed(self) -> None:
        with self.cond:
            self.cond.notify_all()

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
            self.log.event("ended", state=state, exit_code=self.exit_code, signal=self.signal)
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
                    self.log.error = f"could not update {self.run.file('run.json')}: {exc}"
            # Before anyone hears "ended": a daemon shutting down waits for that, then exits,
            # and must not leave the run registered as live for the next daemon to "recover".
            if self.pid is not None:
                live_runs.unregister(self.pid)
            self.state = state
            self.stop = {}
            self.cond.notify_all()
        if self.link is not None:
            self.link.close()
        listener = self.launch.listener if self.launch is not None else None
        if listener is not None:
            if self.terminated or self.family is None:
                listener.close()
            else:  # children it left behind may still be starting: they can still connect
                self.family.close_when_idle(listener)
        self.log.close()

    # -- state ------------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def snapshot(self) -> R_.State:
        with self.cond:
            paused = self.state == "paused"
            stop = self.stop if paused else {}
            state: R_.State = {
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
        # the rest of the stop's own fields (protocol.Stop), as the agent sent them: watch
        # values, a note, the calls that help from there, memory, the tripwire...
        extras = cast("dict[str, object]", state)
        for key in P.Stop.__annotations__:
            if key not in state and stop.get(key) is not None:
                extras[key] = stop[key]
        if self.log.error:
            state["store_error"] = self.log.error
        if self.recovered is not None:
            state["recovered"] = self.recovered
        state["parent"] = getattr(self, "parent", None)  # set on child processes' sessions
        if self.family is not None:  # a worker stopped while the script runs on: say where
            children = [c.name for c in self.family.live_children() if c.state == "paused"]
            if children:
                state["paused_children"] = children[:20]
            detached = self.family.detached()
            if detached:  # children that could not reach the daemon: never silently
                state["detached_children"] = detached
        link = self.link
        if link is not None and link.error:  # the daemon cut the link: say why
            state["warnings"] = [link.error]
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

    def wait(self, timeout: float, after_seq: int | None = None) -> R_.State:
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

    def ask(
        self,
        command: P.AgentCommand[A, Result],
        args: Mapping[str, object] | None = None,
        timeout: float | None = None,
    ) -> Result:
        """One command to the script's agent (typed callers: ``P.X.call(session, args)``).

        A paused command is refused unless the session is paused.  Breakpoint and watch
        edits go through the methods below, which keep the daemon's list and reach the
        script's child processes too.
        """
        if command.paused:
            return self.require_paused().ask(command, args, timeout or 60.0)
        return self._link().ask(command, args, timeout)

    # -- breakpoint and watch edits: the root's agent, the daemon's list, the children -------

    def set_breakpoint(self, spec: P.BreakArgs) -> R_.BreakpointInfo:
        result = P.BREAK.call(self, spec)
        copy = self.breakpoints.set(result)
        if copy is not None:
            self._pass_on(P.BREAK, copy)
        return result

    def remove_breakpoint(self, spec: P.RemoveArgs) -> R_.BreakpointInfo:
        result = P.REMOVE.call(self, spec)
        self.breakpoints.removed(result)
        self._pass_on(P.REMOVE, {"id": result["id"]})  # the same id in every process
        return result

    def clear_breakpoints(self) -> R_.Removed:
        result = P.CLEAR.call(self)
        self.breakpoints.cleared()
        self._pass_on(P.CLEAR, {})
        return result

    def watch(self, expression: str) -> R_.Watches:
        result = P.WATCH.call(self, {"expression": expression})
        self.breakpoints.watches_are(result.get("watches", []))
        self._pass_on(P.WATCH, {"expression": result.get("watch", {}).get("expression", "")})
        return result

    def unwatch(self, spec: P.UnwatchArgs) -> R_.Watches:
        result = P.UNWATCH.call(self, spec)
        self.breakpoints.watches_are(result.get("watches", []))
        for gone in result.get("removed", []):  # by expression: ids are each process's own
            self._pass_on(P.UNWATCH, {"expression": gone["expression"]})
        return result

    def _pass_on(self, command: P.AgentCommand[A, Result], args: Mapping[str, object]) -> None:
        """An edit of the root's breakpoints applies in its running children too."""
        if self.family is not None:
            self.family.broadcast(command, args)

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
        self,
        command: P.AgentCommand[A, dict[str, bool]],
        args: Mapping[str, object] | None = None,
        wait: float = 0.0,
    ) -> R_.State:
        """Continue or step; then wait up to ``wait`` seconds for the next stop or the end.

        ``continue`` on a running script just waits: it is already doing what was asked.
        """
        link = self._link()
        with self.cond:
            if command is P.CONTINUE and self.state == "running":
                seq = self.stop_seq
                running = True
            else:
                running = False
        if running:
            return self.wait(wait, after_seq=seq)
        with self.cond:
            if self.state != "paused":
                raise NotPaused(
                    f"session {self.name!r} is {self.state}; it can only {command.name} when "
                    "paused",
                    session=self.name,
                    state=self.state,
                )
            seq = self.stop_seq
            self.state = "running"
        try:
            link.ask(command, args)
        except MldbgError:
            with self.cond:
                if self.state == "running" and self.stop_seq == seq:
                    self.state = "paused"
            raise
        self.log.event(command.name, **(args or {}))
        return self.wait(wait, after_seq=seq)

    def pause(self, wait: float = 5.0) -> R_.State:
        link = self._link()
        if self.state == "paused":
            # Paused already: the agent interrupts an evaluation that is still running.
            answer = P.PAUSE.call(link, None, 10.0)
            state = self.snapshot()
            if isinstance(answer, dict) and answer.get("interrupted"):
                state["interrupted"] = True
            return state
        seq = self.stop_seq
        link.ask(P.PAUSE)
        self.log.event("pause")
        return self.wait(wait, after_seq=seq)

    def evaluate(
        self, expression: str, timeout: float = 30.0, export: str | None = None
    ) -> R_.Evaluation:
        """``export``: a path the agent writes the value to (``eval --against``)."""
        shown = budget.capped(expression, budget.VALUE)
        args: P.EvalArgs = {"expression": expression, "timeout": timeout}
        if export:
            args["export"] = export
        try:
            result = P.EVAL.call(self, args, timeout + 30.0)
        except MldbgError as exc:
            self.log.event("eval", expression=shown, error=exc.message, code=exc.code)
            raise
        self.log.event(
            "eval", expression=shown, result=result.get("result"), type=result.get("type")
        )
        return result

    def output(
        self, tail: int | None = None, offset: int | None = None, limit: int = budget.OUTPUT
    ) -> R_.Output:
        """A bounded page of the script's output: its tail (default), or ``limit`` bytes
        from ``offset``; ``next`` is the call that reads on."""
        if self.run is None:
            return {"output": "", "path": None, "size": 0, "offset": 0, "truncated": False}
        path = self.run.file(OUTPUT_LOG)
        if offset is not None:
            text, size, end = read_page(path, offset, limit)
            result: R_.Output = {
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
