"""The processes of a run as a tree: who descends from whom, and ending them all.

A script's children may leave its process group (torchrun's ranks call ``setsid``) or
outlive it; a session's end finds them from ``/proc`` (``ps`` elsewhere) while they are
still linked to the script, and signals each.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

KILL_GRACE = 3.0


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first), from /proc, else from ``ps``."""
    parents: dict[int, list[int]] = {}
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            # the command name may hold spaces and parentheses: fields follow the last ')'
            fields = stat[stat.rfind(b")") + 2 :].split()
            if len(fields) > 1:
                parents.setdefault(int(fields[1]), []).append(int(entry))
    except OSError:
        with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
            out = subprocess.run(
                ["ps", "-A", "-o", "pid=", "-o", "ppid="],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            for row in out.splitlines():
                child, _, parent = row.strip().partition(" ")
                parents.setdefault(int(parent.strip()), []).append(int(child))
    found: list[int] = []
    todo = [pid]
    while todo:
        for kid in parents.get(todo.pop(), []):
            if kid not in found:
                found.append(kid)
                todo.append(kid)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent's wait() counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_tree(pids: list[int], grace: float = KILL_GRACE) -> None:
    """SIGTERM each process and every descendant (found before any dies, since orphans
    lose their parent link), then SIGKILL what is left after ``grace`` seconds."""
    everyone: list[int] = []
    for pid in pids:
        for member in [pid, *descendants(pid)]:
            if member not in everyone and member != os.getpid():
                everyone.append(member)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for member in everyone:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            everyone = [m for m in everyone if alive(m)]
            if not everyone:
                return
            time.sleep(0.05)
