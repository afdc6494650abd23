"""``mldbg kill-all``: end this user's stray Python processes that hold torch or MLX.

A crashed notebook kernel or an orphaned DataLoader worker keeps gigabytes of model
weights (and the GPU) long after anyone needs it.  Which processes hold a framework is
read from their memory maps (``/proc/PID/maps`` on Linux, ``lsof`` elsewhere), never
guessed from command lines.  Never touched: other users' processes, the mldbg daemon,
the calling process and its ancestors (the shell, the agent that asked).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from ..errors import BAD_ARGUMENT, CONFIRMATION_REQUIRED, MldbgError

if TYPE_CHECKING:
    from rich.console import Console

MAX_LISTED = 200
CMDLINE_CHARS = 300
_PYTHON_EXE = re.compile(r"^python[0-9.]*[dmu]?$|^pythonw?$|^ipython[0-9.]*$")
# A shared object of each framework, as it appears in a process's memory map.
MARKERS = {
    "torch": re.compile(r"/libtorch(_cpu|_cuda|_python|_global_deps)?\.(so|dylib)"),
    "mlx": re.compile(r"/libmlx\.(so|dylib)|/mlx/core[^/]*\.(so|dylib)"),
}


class ProcessEntry(TypedDict):
    pid: int
    frameworks: list[str]
    command: str
    age_s: float
    rss_bytes: int | None
    outcome: str | None  # terminated | killed | still_running | gone | error: ... | None (listed)


class KillAllResult(TypedDict):
    dry_run: bool
    framework: str | None
    signal: str | None
    processes: list[ProcessEntry]
    count: int
    skipped: dict[str, int]
    truncated: bool


@dataclass
class MlProcess:
    pid: int
    frameworks: list[str]
    command: str
    start_ticks: int | None
    age_s: float
    rss_bytes: int | None
    outcome: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def entry(self) -> ProcessEntry:
        return {
            "pid": self.pid,
            "frameworks": self.frameworks,
            "command": self.command,
            "age_s": round(self.age_s, 1),
            "rss_bytes": self.rss_bytes,
            "outcome": self.outcome,
        }


# -- reading processes (Linux /proc; lsof + ps elsewhere) --------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    text = _read(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    return text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 0


def _parent(pid: int) -> int | None:
    if os.path.isdir("/proc"):
        fields = _stat_fields(pid)
        return int(fields[1]) if fields else None
    out = subprocess.run(["ps", "-o", "ppid=", "-p", str(pid)], capture_output=True, text=True)
    return int(out.stdout.strip()) if out.stdout.strip().isdigit() else None


def protected_pids() -> set[int]:
    """This process, its ancestors and the mldbg daemon: never signalled."""
    protected = {os.getpid()}
    pid: int | None = os.getppid()
    while pid and pid not in protected and pid > 1:
        protected.add(pid)
        pid = _parent(pid)
    try:
        from ..server.config import read_server_info

        info = read_server_info()
        if info and isinstance(info.get("pid"), int):
            protected.add(info["pid"])
    except Exception:  # an unreadable config never makes kill-all less careful, only blind to it
        pass
    return protected


def _is_python(pid: int, command: list[str]) -> bool:
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        exe = ""
    names = [exe, os.path.basename(command[0]) if command else ""]
    return any(_PYTHON_EXE.match(n) for n in names if n)


def _frameworks_from_maps(text: str) -> list[str]:
    return [name for name, pattern in MARKERS.items() if pattern.search(text)]


def _linux_processes(skipped: dict[str, int]) -> list[MlProcess]:
    uid = os.getuid()
    ticks = os.sysconf("SC_CLK_TCK")
    uptime_text = _read("/proc/uptime") or "0"
    uptime = float(uptime_text.split()[0])
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue  # another user's: not ours to list, let alone kill
        except OSError:
            continue
        raw = _read(f"/proc/{pid}/cmdline")
        if raw is None:
            continue
        command = [part for part in raw.split("\0") if part]
        if not command or not _is_python(pid, command):
            continue
        maps = _read(f"/proc/{pid}/maps")
        if maps is None:
            skipped["unreadable"] = skipped.get("unreadable", 0) + 1
            continue
        frameworks = _frameworks_from_maps(maps)
        if not frameworks:
            continue
        fields = _stat_fields(pid)
        start = int(fields[19]) if fields and len(fields) > 19 else None
        status = _read(f"/proc/{pid}/status") or ""
        rss = re.search(r"VmRSS:\s+(\d+) kB", status)
        found.append(
            MlProcess(
                pid=pid,
                frameworks=frameworks,
                command=" ".join(command)[:CMDLINE_CHARS],
                start_ticks=start,
                age_s=max(0.0, uptime - start / ticks) if start is not None else 0.0,
                rss_bytes=int(rss.group(1)) * 1024 if rss else None,
            )
        )
    return found


def _lsof_processes(skipped: dict[str, int]) -> list[MlProcess]:
    """macOS and other systems without /proc: ps for the list, lsof for mapped libraries."""
    out = subprocess.run(
        ["ps", "-U", str(os.getuid()), "-o", "pid=,etime=,rss=,command="],
        capture_output=True,
        text=True,
    ).stdout
    found = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        pid, etime, rss, command = int(parts[0]), parts[1], parts[2], parts[3]
        if not _PYTHON_EXE.match(os.path.basename(command.split()[0])):
            continue
        mapped = subprocess.run(
            ["lsof", "-p", str(pid), "-Fn"], capture_output=True, text=True
        ).stdout
        frameworks = _frameworks_from_maps(mapped)
        if frameworks:
            found.append(
                MlProcess(
                    pid=pid,
                    frameworks=frameworks,
                    command=command[:CMDLINE_CHARS],
                    start_ticks=None,
                    age_s=_etime_seconds(etime),
                    rss_bytes=int(rss) * 1024 if rss.isdigit() else None,
                )
            )
    return found


def _etime_seconds(text: str) -> float:
    days, _, rest = text.rpartition("-")
    numbers = [int(x) for x in rest.split(":")]
    while len(numbers) < 3:
        numbers.insert(0, 0)
    return (int(days) if days else 0) * 86400 + numbers[0] * 3600 + numbers[1] * 60 + numbers[2]


def find_processes(
    framework: str | None = None, match: str | None = None
) -> tuple[list[MlProcess], dict[str, int]]:
    """This user's Python processes holding ``framework`` (or either), minus protected ones."""
    if framework not in (None, "torch", "mlx"):
        raise MldbgError(f"framework {framework!r}: use torch or mlx", code=BAD_ARGUMENT)
    skipped: dict[str, int] = {}
    found = _linux_processes(skipped) if os.path.isdir("/proc") else _lsof_processes(skipped)
    protected = protected_pids()
    chosen = []
    for process in found:
        if process.pid in protected:
            skipped["protected"] = skipped.get("protected", 0) + 1
            continue
        if framework and framework not in process.frameworks:
            continue
        if match and match not in process.command:
            continue
        chosen.append(process)
    chosen.sort(key=lambda p: -p.age_s)
    return chosen, skipped


# -- ending them --------------------------------------------------------------------------------


def _same_process(process: MlProcess) -> bool:
    """Still the process we listed (not a new one that reused its pid)?"""
    if process.start_ticks is None:
        try:
            os.kill(process.pid, 0)
        except OSError:
            return False
        return True
    fields = _stat_fields(process.pid)
    return fields is not None and int(fields[19]) == process.start_ticks and fields[0] != "Z"


def _wait_gone(processes: list[MlProcess], deadline: float) -> None:
    while time.monotonic() < deadline and any(_same_process(p) for p in processes):
        _reap(processes)
        time.sleep(0.05)
    _reap(processes)


def _reap(processes: list[MlProcess]) -> None:
    """Our own children would stay zombies until waited for."""
    for process in processes:
        with contextlib.suppress(OSError):  # ChildProcessError: not ours to wait for
            os.waitpid(process.pid, os.WNOHANG)


def kill_all(
    *,
    dry_run: bool = False,
    framework: str | None = None,
    force: bool = False,
    yes: bool = False,
    match: str | None = None,
    grace_s: float = 5.0,
    confirm: Callable[[list[MlProcess]], bool] | None = None,
) -> KillAllResult:
    """List (``dry_run``) or end this user's torch/MLX Python processes.

    Without ``yes`` the ``confirm`` callback is asked; with neither (a script, an agent,
    a pipe) nothing is sent and the error says to pass ``--yes``.  SIGTERM first; with
    ``force``, SIGKILL for whatever is still there after ``grace_s`` seconds.
    """
    if grace_s < 0:
        raise MldbgError("--grace must be 0 or more seconds", code=BAD_ARGUMENT)
    processes, skipped = find_processes(framework, match)
    result: KillAllResult = {
        "dry_run": dry_run,
        "framework": framework,
        "signal": None if dry_run else ("SIGTERM+SIGKILL" if force else "SIGTERM"),
        "processes": [],
        "count": len(processes),
        "skipped": skipped,
        "truncated": len(processes) > MAX_LISTED,
    }
    if dry_run or not processes:
        result["processes"] = [p.entry() for p in processes[:MAX_LISTED]]
        return result
    if not yes:
        if confirm is None:
            raise MldbgError(
                f"{len(processes)} process(es) would get SIGTERM; nobody can be asked here "
                "(no terminal): add --yes to do it, or --dry-run to only list them",
                code=CONFIRMATION_REQUIRED,
                pids=[p.pid for p in processes[:MAX_LISTED]],
            )
        if not confirm(processes):
            for process in processes:
                process.outcome = "not_asked_to"
            result["signal"] = None
            result["processes"] = [p.entry() for p in processes[:MAX_LISTED]]
            return result
    sent = []
    for process in processes:
        if not _same_process(process):
            process.outcome = "gone"
            continue
        try:
            os.kill(process.pid, signal.SIGTERM)
            sent.append(process)
        except ProcessLookupError:
            process.outcome = "gone"
        except OSError as exc:
            process.outcome = f"error: {exc.strerror}"
    _wait_gone(sent, time.monotonic() + grace_s)
    for process in sent:
        if not _same_process(process):
            process.outcome = "terminated"
        elif force:
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGKILL)
            _wait_gone([process], time.monotonic() + 5)
            process.outcome = "killed" if not _same_process(process) else "still_running"
        else:
            process.outcome = "still_running"
    result["processes"] = [p.entry() for p in processes[:MAX_LISTED]]
    return result


# -- human output -------------------------------------------------------------------------------


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def render_processes(processes: list[MlProcess], console: Console) -> None:
    from rich.markup import escape

    for p in processes:
        rss = f"{p.rss_bytes / 1e9:.2f} GB" if p.rss_bytes is not None else "?"
        console.print(
            f"  {p.pid:>7} {'+'.join(p.frameworks):<9} {_age(p.age_s):>6} {rss:>9}  {escape(p.command[:120])}"
        )


def render_kill_all(result: KillAllResult, console: Console) -> None:
    from rich.markup import escape

    if not result["processes"]:
        console.print("no Python process of yours has torch or MLX loaded")
        return
    head = (
        "would end" if result["dry_run"] else "sent " + str(result["signal"] or "nothing") + " to"
    )
    console.print(f"{head} {result['count']} process(es):")
    for p in result["processes"]:
        rss = f"{p['rss_bytes'] / 1e9:.2f} GB" if p["rss_bytes"] is not None else "?"
        outcome = f" -> {p['outcome']}" if p["outcome"] else ""
        console.print(
            f"  {p['pid']:>7} {'+'.join(p['frameworks']):<9} {_age(p['age_s']):>6} {rss:>9}  "
            f"{escape(p['command'][:120])}{outcome}"
        )
