"""Child processes of a session's script, each its own session once it stops.

Every process the script starts connects back to the session's agent port (see
``agent/follow.py``).  The daemon keeps each connection as a :class:`ChildSession` of
the root session's :class:`Family`, but lists it (``sessions``, every verb by name)
only from its first stop: a DataLoader forks workers every epoch, and workers that
never stop are not worth a line in the listing.

Names extend the parent's (the scheme docs/debugging.md documents):

* a process with a ``RANK`` (else ``LOCAL_RANK``) in a fresh interpreter (torchrun's
  ranks): ``ROOT.rank<N>``;
* any other child: ``PARENT.w<pid>``, where PARENT is the session of the process that
  started it when the daemon knows it (a DataLoader worker of rank 1 is
  ``ddp.rank1.w4242``), else the root session;
* names are at most 64 characters; a longer one falls back to ``ROOT.w<pid>``.

A child session ends when its connection closes, which the kernel does when its
process ends.  Terminating a child ends its process tree; terminating the root ends
every process of the run (its process group, every descendant, every child session).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from .. import results as R
from ..agent import protocol as P
from ..agent.protocol import DETACHED_FILE
from ..errors import AgentError
from ..names import is_session_name
from .agent_link import AgentLink, AgentListener
from .process_tree import KILL_GRACE, kill_tree
from .sessions import ENDED, Session, StartRequest

A = TypeVar("A", bound=Mapping[str, object])  # a command's arguments (``protocol.AgentCommand``)
Result = TypeVar("Result")  # its result

CONFIGURE_TIMEOUT = 15.0
DETACHED_KEYS = ("pid", "ppid", "reason", "time")
LISTEN_AFTER_END = 10.0
BROADCAST_WAIT = 5.0


class Family:
    """The root session's child processes: naming, breakpoints, and the end of all of them."""

    def __init__(self, root: Session) -> None:
        self.root = root
        self.children: dict[int, ChildSession] = {}  # by pid, while connected
        self.lock = threading.Lock()
        self.closed = False  # terminated: no process of the run may connect any more
        self._detached: tuple[int, R.DetachedChildren | None] = (0, None)  # (file size, summary)

    def detached(self) -> R.DetachedChildren | None:
        """Children that could not reach the daemon and run undebugged (they say so in
        the run directory, ``protocol.DETACHED_FILE``): ``{"total", "last": [{"pid",
        "ppid", "reason", "time"}]}`` (the last five), or None."""
        run = self.root.run
        if run is None:
            return None
        path = run.path / DETACHED_FILE
        try:
            size = path.stat().st_size
        except OSError:
            return None
        if size != self._detached[0]:
            records: list[R.DetachedChild] = []
            with contextlib.suppress(OSError), open(path, "rb") as fh:
                for line in fh.read(1 << 20).splitlines():
                    with contextlib.suppress(ValueError):
                        record = json.loads(line)
                        if isinstance(record, dict):  # as agent/follow.py writes it
                            records.append(
                                cast("R.DetachedChild", {k: record.get(k) for k in DETACHED_KEYS})
                            )
            summary: R.DetachedChildren | None = (
                {"total": len(records), "last": records[-5:]} if records else None
            )
            self._detached = (size, summary)
        return self._detached[1]

    # -- a child connects --------------------------------------------------------------------

    def adopt(self, link: AgentLink) -> None:
        """A child proved the secret: make it a (not yet listed) session and start it."""
        pid = link.pid
        if pid is None or self.closed or self.root.terminated:
            link.close()
            return
        with self.lock:
            name = self._name_for(link.hello, pid)
            child = ChildSession(name, self, link)
            self.children[pid] = child
        link.start(child.on_event, child.on_link_closed)
        if not link.hello.get("forked"):  # a forked one has its parent's tables already
            self.configure_later(child, link)

    def configure_later(self, session: Session, link: AgentLink) -> None:
        """Configure and run an exec'd process on a thread of its own (frees the handshake)."""
        threading.Thread(
            target=self._configure,
            args=(session, link),
            name=f"mldbg-child-{link.pid}",
            daemon=True,
        ).start()

    def _name_for(self, hello: P.Hello, pid: int) -> str:
        root = self.root.name
        rank = hello.get("rank")
        taken = self._taken_names()
        if rank is not None and str(rank).isdigit():
            name = f"{root}.rank{int(rank)}"
            if name not in taken:
                return name
        ppid = hello.get("ppid")
        parent = self.children.get(ppid) if isinstance(ppid, int) else None
        base = parent.name if parent is not None else root
        name = f"{base}.w{pid}"
        return name if is_session_name(name) else f"{root}.w{pid}"[-64:]

    def _taken_names(self) -> set[str]:
        names = {c.name for c in self.children.values() if not c.ended}
        manager = self.root.manager
        if manager is not None:
            names |= {s.name for s in manager.all() if not s.ended}
        return names

    def _configure(self, child: Session, link: AgentLink) -> None:
        """An exec'd process: the root's breakpoints and watches now (the daemon's list,
        ``breakpoint_list``), then let it run."""
        configure = self.root.breakpoints.configure_args()
        try:
            try:
                P.CONFIGURE.call(link, configure, CONFIGURE_TIMEOUT)
            except AgentError:  # one it cannot take (a file it cannot see): each on its own
                self._configure_each(child, link, configure)
            run_dir = str(self.root.run.path) if self.root.run is not None else ""
            P.RUN.call(
                link,
                {"stop_on_entry": False, "run_dir": run_dir, "follow": True},
                CONFIGURE_TIMEOUT,
            )
        except Exception as exc:
            child.log.event("child_start_failed", error=str(exc)[:2000])

    @staticmethod
    def _configure_each(child: Session, link: AgentLink, configure: P.ConfigureArgs) -> None:
        """Each breakpoint and watch on its own: the ones the process refuses are logged."""
        for spec in configure.get("breakpoints", []):
            try:
                P.BREAK.call(link, spec, CONFIGURE_TIMEOUT)
            except AgentError as exc:
                child.log.event("child_breakpoint_refused", **spec, error=str(exc.message)[:2000])
        for expression in configure.get("watches", []):
            try:
                P.WATCH.call(link, {"expression": expression}, CONFIGURE_TIMEOUT)
            except AgentError as exc:
                child.log.event(
                    "child_watch_refused", expression=expression, error=str(exc.message)[:2000]
                )

    # -- the family as a whole ---------------------------------------------------------------

    def broadcast(
        self, command: P.AgentCommand[A, Result], args: Mapping[str, object] | None
    ) -> None:
        """A breakpoint or watch edit on the root reaches every connected child before the verb
        answers (so a child cannot run past a breakpoint the user already saw set); a
        child that does not answer within ``BROADCAST_WAIT`` is not waited for, and a
        child's refusal (a file it cannot see) does not fail the root's edit."""
        sent = [
            child.link.send(command, args)
            for child in self.live_children()
            if child.link is not None and not child.link.closed
        ]
        deadline = time.monotonic() + BROADCAST_WAIT
        for future in sent:
            with contextlib.suppress(Exception):
                future.result(max(0.0, deadline - time.monotonic()))

    def live_children(self) -> list[ChildSession]:
        with self.lock:
            return [c for c in self.children.values() if not c.ended]

    def register(self, child: ChildSession) -> None:
        """A child stopped for the first time: list it under its name."""
        manager = self.root.manager
        if manager is not None:
            manager.add_child(child)

    def forget(self, child: ChildSession) -> None:
        with self.lock:
            if child.pid is not None and self.children.get(child.pid) is child:
                del self.children[child.pid]

    def close_when_idle(self, listener: AgentListener) -> None:
        """The script ended: keep its port open while children it left run (and for
        ``LISTEN_AFTER_END`` seconds after the last, for any still starting up)."""

        def watch() -> None:
            idle_since = time.monotonic()
            while not listener.closed:
                if self.live_children():
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > LISTEN_AFTER_END:
                    listener.close()
                    return
                time.sleep(0.5)

        threading.Thread(target=watch, name="mldbg-listen-after-end", daemon=True).start()

    def end_all(self) -> None:
        """The root was terminated: end every process of the run, then every child session."""
        children = self.live_children()
        pids = [c.pid for c in children if c.pid is not None]
        kill_tree(pids)
        for child in children:
            child.wait_ended(KILL_GRACE)
            child.mark_ended()


class ChildSession(Session):
    """One child process of a run: every verb of a session, on its own connection."""

    def __init__(self, name: str, family: Family, link: AgentLink) -> None:
        root = family.root
        super().__init__(name, StartRequest(cwd=root.request.cwd, breakpoints=[]))
        self.family_of = family
        self.parent = root.name
        ppid = link.hello.get("ppid")
        parent = family.children.get(ppid) if isinstance(ppid, int) else None
        if parent is not None:
            self.parent = parent.name
        self.manager = root.manager
        self.link = link
        self.hello = link.hello
        self.pid = link.pid
        self.run = root.run
        self.log.join(root.log)  # one events.jsonl per run; records carry the session
        self.home = root.home
        self.state = "running"
        self.listed = False

    # -- events ------------------------------------------------------------------------------

    def on_event(self, message: dict[str, Any]) -> None:
        self._on_event(message)

    @P.serves(P.STOPPED)
    def _on_stopped(self, event: P.Stopped) -> None:
        if not self.listed:  # listed from its first stop on
            self.listed = True
            self.family_of.register(self)
        super()._on_stopped(event)

    @P.serves(P.FINISHED)
    def _on_finished(self, event: P.Finished) -> None:
        if "exit_code" in event:
            self.exit_code = event["exit_code"]
        super()._on_finished(event)

    def on_link_closed(self) -> None:
        self.mark_ended()

    def mark_ended(self) -> None:
        with self.cond:
            if self.state in ENDED:
                return
            self.state = "exited"
            self.stop = {}
            self.cond.notify_all()
        self.log.event("ended", state="exited", pid=self.pid, terminated=self.terminated)
        self.family_of.forget(self)
        if self.link is not None:
            self.link.close()

    def wait_ended(self, timeout: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.ended, timeout=timeout)

    # -- what differs from a root session ----------------------------------------------------

    def start(self) -> None:  # pragma: no cover - children are adopted, never started
        raise RuntimeError("a child session is adopted from its connection, never started")

    def terminate(self) -> R.State:
        """End this child's process tree (its parent and siblings go on)."""
        if not self.ended:
            self.terminated = True
            if self.pid is not None:
                kill_tree([self.pid])
            self.wait_ended(KILL_GRACE * 2)
            self.mark_ended()
        return self.snapshot()
