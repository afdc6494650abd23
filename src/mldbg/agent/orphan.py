"""What a debuggee does when its daemon goes away: it ends, cleanly, and says so.

Policy: a debuggee never runs on uncontrolled.  When the link to the daemon closes while
the script lives (the daemon was killed, crashed, or its machine ran out of memory), the
debuggee

1. writes what happened into its run: run.json gets ``state: "exited"``,
   ``terminated: true``, ``ended_reason: "daemon_lost"`` and where it was paused, if it
   was; events.jsonl gets an ``ended`` record; output.log a line saying why;
2. ends its whole process group (it leads one: the daemon starts it in a new session), so
   no child of the script runs on either.

A paused script therefore never resumes past its breakpoint as an orphan.  Staying paused
for a restarted daemon to re-adopt was the alternative; it was not chosen because a
re-adopting daemon would need the old link's secret, and a debuggee that waits forever
for a daemon that never comes holds its memory (often a GPU's) forever.  The restarted
daemon lists such sessions as ended (``server/live_runs.py``).

The daemon itself never closes the link of a live debuggee: it kills the process first
(terminate, shutdown) and closes the link once the process has ended.  So a close seen
here while the script lives means the daemon is gone; the parent pid changing confirms it
(the orphan is re-parented), and decides between ``daemon_lost`` and ``link_lost``.

Standard library only, like the rest of the agent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .. import results as R
    from . import protocol as P
    from .debugger import Debugger

PARENT_GRACE = 2.0  # seconds to let the kernel re-parent us after the daemon's death


def install(debugger: Any, config: P.RunArgs, *, child: bool = False) -> None:
    """Make the debugger's "the daemon is gone" path end the script (see the policy).

    ``child``: this interpreter is a child process of the run (``subprocess``, spawn, a
    rank) with a session of its own: it ends itself too, but the run's files are its
    root's, which records its own end.  A process forked from this one after this call
    inherits the hook and must not take it for its own: a forked child detaches the
    old way (it is in its parent's process group, which its parent ends).
    """
    # ``debugger``: a Debugger, whose ``detach`` method this replaces (hence not typed so)
    daemon_pid = os.getppid()
    installed_in = os.getpid()
    detach = debugger.detach

    def end_instead() -> None:
        if os.getpid() != installed_in:
            detach()
            return
        end(debugger, {} if child else config, daemon_pid)
        detach()  # reached only if ending failed: at least stop debugging

    debugger.detach = end_instead


def _daemon_died(daemon_pid: int) -> bool:
    deadline = time.monotonic() + PARENT_GRACE
    while time.monotonic() < deadline:
        if os.getppid() != daemon_pid:
            return True
        time.sleep(0.02)
    return False


def end(debugger: Debugger, config: P.RunArgs, daemon_pid: int) -> None:
    """Record why, then end the process group; returns only if the group could not be ended."""
    reason = "daemon_lost" if _daemon_died(daemon_pid) else "link_lost"
    location: R.Location | None = None
    paused = getattr(debugger, "paused", None)
    if paused is not None:
        with contextlib.suppress(Exception):
            location = paused.state().get("location")
    note = (
        f"the mldbg daemon (pid {daemon_pid}) went away"
        if reason == "daemon_lost"
        else "the link to the mldbg daemon closed"
    ) + "; the debuggee ended itself and its process group (policy: never run on uncontrolled)"
    with contextlib.suppress(Exception):
        print(f"\nmldbg: {note}", file=sys.stderr, flush=True)
    run_dir = config.get("run_dir")
    if run_dir:
        with contextlib.suppress(Exception):  # a full disk must not keep the script running
            _record(Path(str(run_dir)), reason, note, location)
    _end_group()


def _record(run_dir: Path, reason: str, note: str, location: R.Location | None) -> None:
    from ..store.runs import EVENTS, JsonlWriter, RunDir

    fields = {
        "state": "exited",
        "terminated": True,
        "ended_reason": reason,
        "ended_note": note,
        "ended_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "paused_at": location,
    }
    run = RunDir(run_dir)
    with contextlib.suppress(OSError):
        writer = JsonlWriter(run.file(EVENTS))
        writer.append({"time": time.time(), "event": "ended", **fields})
        writer.close()
    run.update_meta(**fields)


def _end_group() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):
        if os.getpgrp() == os.getpid():  # we lead our group: end it, us included
            os.killpg(os.getpid(), signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), signal.SIGKILL)
