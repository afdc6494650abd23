"""The daemon's registry of live debuggees, kept in the config directory.

A daemon killed with SIGKILL forgets its sessions; this registry does not.  One small
file per debuggee (``live/<pid>.json``: session, run directory, the daemon's pid and the
debuggee's start time, so a reused pid is never taken for it) is written when a session
starts and removed when it ends.  The next daemon reads what is left (``recover``): each
entry belonged to a daemon that died without cleaning up.

Policy (the debuggee's side is ``agent/orphan.py``): a debuggee whose daemon goes away
ends itself — its whole process group — and finalises run.json with
``ended_reason: "daemon_lost"``; a paused script never runs on past its breakpoint.  The
restarted daemon finishes the job: a debuggee still alive is ended, a run.json still
saying ``starting``/``running``/``paused`` is finalised, and the session is listed again,
ended, under its name, with ``recovered`` saying what was found.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import TypedDict, cast

from .. import results as R
from ..store.runs import LIVE_STATES, JsonlWriter, RunDir, write_json_atomic
from .config import config_dir

LIVE_DIR = "live"
DAEMON_LOST = "daemon_lost"


class LiveEntry(TypedDict):
    """One file of the registry, as ``register`` writes it."""

    session: str
    pid: int
    start_time: str | None  # process_start_time
    run_dir: str
    daemon_pid: int
    registered_at: float


def _live_dir() -> Path:
    return config_dir() / LIVE_DIR


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 on (Linux); None where there is no such file."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start_time(pid: int) -> str | None:
    """When ``pid`` started, to tell a reused pid apart: the kernel's count on Linux
    (``/proc``), ``ps -o lstart=`` elsewhere (macOS)."""
    fields = _stat(pid)
    if fields is not None:
        return fields[19] if len(fields) > 19 else None  # field 22 of stat
    try:
        import subprocess

        done = subprocess.run(
            ["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def register(session: str, pid: int, run_dir: Path) -> None:
    """Note a live debuggee; a failure to write is not fatal (recovery is best effort)."""
    entry: LiveEntry = {
        "session": session,
        "pid": pid,
        "start_time": process_start_time(pid),
        "run_dir": str(run_dir),
        "daemon_pid": os.getpid(),
        "registered_at": time.time(),
    }
    old_umask = os.umask(0o077)
    try:
        directory = _live_dir()
        directory.mkdir(mode=0o700, exist_ok=True)
        write_json_atomic(directory / f"{pid}.json", entry)
    except OSError:
        pass
    finally:
        os.umask(old_umask)


def unregister(pid: int) -> None:
    with contextlib.suppress(OSError):
        (_live_dir() / f"{pid}.json").unlink()


def _same_process(entry: LiveEntry) -> bool:
    """Is the debuggee of ``entry`` still running (the same process, not a reused pid)?"""
    try:
        pid = int(entry["pid"])
        os.kill(pid, 0)
    except (KeyError, TypeError, ValueError, OSError):
        return False
    fields = _stat(pid)
    if fields is not None and fields[0] == "Z":  # a zombie has ended; only a wait is left
        return False
    recorded = entry.get("start_time")
    return recorded is not None and recorded == process_start_time(pid)


def _end_process_group(pid: int) -> None:
    """SIGKILL the debuggee's process group (it leads one: it was started in a new session)."""
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
            break
        except OSError:
            continue
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.02)


def recover() -> list[R.Recovered]:
    """What the daemons before this one left behind: ended, finalised, and reported.

    Returns one record per debuggee: ``session``, ``pid``, ``run_dir``, ``run_id``, the
    ``state`` run.json ends with, and ``found``: ``ended_itself`` (the debuggee followed
    the policy), ``ended_now`` (it was still running: this daemon ended it), or
    ``vanished`` (it died without a word: killed with the daemon, or before it knew).
    """
    directory = _live_dir()
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found: list[R.Recovered] = []
    for name in names:
        path = directory / name
        if not name.endswith(".json"):
            continue
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if not isinstance(entry, dict) or entry.get("daemon_pid") == os.getpid():
            continue
        found.append(_recover_one(cast("LiveEntry", entry)))  # as register wrote it
        with contextlib.suppress(OSError):
            path.unlink()
    return found


def _renamed(path: Path, pid: int) -> Path:
    """Where a run registered under its reserved name (``.starting-…``) went: the daemon
    died between giving it its real id (``<stem>-<time>-<pid>``) and noting that."""
    if path.exists() or not path.name.startswith(".starting-") or not pid:
        return path
    with contextlib.suppress(OSError):
        named = [p for p in path.parent.iterdir() if p.name.split(".")[0].endswith(f"-{pid}")]
        if named:
            return max(named, key=lambda p: p.stat().st_mtime)
    return path


def _recover_one(entry: LiveEntry) -> R.Recovered:
    pid = int(entry.get("pid") or 0)
    how = "vanished"
    if pid and _same_process(entry):
        _end_process_group(pid)
        how = "ended_now"
    run = RunDir(_renamed(Path(str(entry.get("run_dir"))), pid))
    meta = run.read_meta()
    if meta.get("ended_reason") == DAEMON_LOST and how == "vanished":
        how = "ended_itself"
    if meta.get("state") in LIVE_STATES or not meta.get("state"):
        note = {
            "ended_now": "it was still running when the next daemon started, which ended it",
            "vanished": "it was gone when the next daemon started (killed with the daemon?)",
        }.get(how, "")
        fields: dict[str, object] = {  # of results.RunMeta
            "state": "exited",
            "terminated": True,
            "ended_reason": DAEMON_LOST,
            "ended_note": f"the mldbg daemon (pid {entry.get('daemon_pid')}) went away; {note}",
            "ended_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if not meta.get("run_id") and not run.path.name.startswith("."):
            fields["run_id"] = run.run_id  # the daemon died between the rename and noting it
        try:
            meta = run.update_meta(**fields)
            writer = JsonlWriter(run.file("events.jsonl"))
            writer.append(
                {"time": time.time(), "event": "ended", "session": entry.get("session"), **fields}
            )
            writer.close()
        except OSError as exc:
            error = f"could not finalise run.json: {exc}"
            meta = cast("R.RunMeta", {**meta, **fields, "store_error": error})
    recovered: R.Recovered = {
        "session": entry.get("session"),
        "pid": pid,
        "run_dir": str(run.path),
        "run_id": run.run_id,
        "state": meta.get("state"),
        "ended_reason": meta.get("ended_reason"),
        "found": how,
    }
    if meta.get("store_error"):
        recovered["store_error"] = meta["store_error"]
    return recovered
