"""The daemon's named sessions: starting one under a name, finding it, listing it.

A name is taken by one live session at a time (``replace`` ends the old one first); a
failed start leaves no session behind, and the one it would have replaced keeps its
place.  Each started session gets its :class:`~.children.Family` here, before its script
runs, so that a process the script starts is adopted from its first connection.
"""

from __future__ import annotations

import threading
from pathlib import Path

from .. import results as R
from ..errors import MldbgError, SessionBusy, SessionNotFound
from ..names import check_session_name
from ..store.runs import RunDir
from ..verbs import fix
from .children import ChildSession, Family
from .sessions import Session, StartRequest


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
            session.manager = self
            session.family = Family(session)
            self._sessions[name] = session
        if old is not None and not old.ended:
            old.terminate()
        try:
            session.start()
        except BaseException:
            session.abort_start()  # a bug mid-start must not leave it "starting"
            with self._lock:
                if self._sessions.get(name) is session:
                    # A failed start leaves no session (its error carries the run directory
                    # and the output's tail); the previous one of this name keeps its place.
                    if old is not None:
                        self._sessions[name] = old
                    else:
                        del self._sessions[name]
            raise
        return session

    def add_recovered(self, record: R.Recovered) -> None:
        """List a session a previous daemon left behind (``live_runs.recover``), ended."""
        name = str(record.get("session") or "")
        try:
            check_session_name(name)
        except MldbgError:
            return
        session = Session(name, StartRequest())
        session.run = RunDir(Path(record["run_dir"]))
        session.pid = record.get("pid")
        session.terminated = True
        session.state = "crashed" if record.get("state") == "crashed" else "exited"
        session.recovered = record
        with self._lock:
            if name not in self._sessions:
                self._sessions[name] = session

    def add_child(self, child: Session) -> None:
        """List a child process's session (it stopped); it replaces an ended one of its name."""
        with self._lock:
            old = self._sessions.get(child.name)
            if old is not None and not old.ended and old is not child:
                child.name = f"{child.name}.w{child.pid}"[-64:]
            self._sessions[child.name] = child

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
        """End every session: the scripts all at once, each in a thread of its own, then
        what is left of their children (ended with them, mostly).  A stop is bounded
        (``config.STOP_DEADLINE``); one script after the other, each taking up to a few
        grace periods to end, would add up past it."""
        sessions = self.all()
        roots = [s for s in sessions if not isinstance(s, ChildSession)]
        ending = [
            threading.Thread(target=s.terminate, name=f"mldbg-end-{s.name}", daemon=True)
            for s in roots
        ]
        for thread in ending:
            thread.start()
        for thread in ending:
            thread.join()
        for session in sessions:
            if session not in roots:
                session.terminate()
