"""A soak run of the daemon: does anything it holds grow with use?

Three phases against one daemon, in one run, with a private config directory and run store:

1. **stops**: one session stops at a breakpoint in a loop N times (default 10,000); each stop
   gets an ``eval``;
2. **sessions**: M sessions (default 1,000) started, run to their end, and forgotten;
3. **children**: a script that forks a child every iteration; every fifth child stops at a
   breakpoint and becomes a child session, which is continued (the others run through).

Between phases and every so often inside one it samples the daemon's resident memory,
threads, open file descriptors and listening TCP ports (from ``/proc``, Linux only), and
prints the figures with the growth from the first sample after warm-up to the last. Figures
only: nothing here is asserted, and no time is judged (a busy machine is slower, not wrong).

Run: ``.venv/bin/python benchmarks/soak.py [--stops N] [--sessions M] [--forks K] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

LOOP = textwrap.dedent(
    """
    def work(i):
        total = i * 2
        return total  # stop here

    i = 0
    while True:
        work(i)
        i += 1
    """
)

SHORT = "x = sum(range(1000))\nprint(x)\n"

FORKS = textwrap.dedent(
    """
    import os, sys

    def child(i):
        value = i + 1
        return value  # child stops here

    count = int(sys.argv[1])
    for i in range(count):
        pid = os.fork()
        if pid == 0:
            if i % 5 == 0:
                child(i)
            os._exit(0)
        os.waitpid(pid, 0)
    print("forked", count)
    """
)


def line_of(source: str, marker: str) -> int:
    return next(i for i, text in enumerate(source.splitlines(), 1) if marker in text)


def listening_ports(pid: int) -> int:
    """TCP sockets in LISTEN state among the process's file descriptors."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in lines:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:
                count += 1
    return count


def sample(pid: int, label: str) -> dict[str, Any]:
    status = Path(f"/proc/{pid}/status").read_text()
    values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "at": label,
        "rss_mb": round(int(values["VmRSS"].split()[0]) / 1024, 1),
        "threads": int(values["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "listening_ports": listening_ports(pid),
    }


def stops_phase(client: Any, root: Path, stops: int, pid: int) -> list[dict[str, Any]]:
    script = root / "loop.py"
    script.write_text(LOOP)
    session = "soak"
    client.call(
        "start",
        session,
        script=str(script),
        breakpoints=[{"file": str(script), "line": line_of(LOOP, "stop here")}],
        stop_on_entry=False,
        replace=True,
    )
    client.call("wait", session, wait=30)
    samples = []
    every = max(1, stops // 10)
    for n in range(1, stops + 1):
        client.call("eval", session, expression="total + 1")
        client.call("continue", session, wait=30)
        if n % every == 0:
            samples.append(sample(pid, f"stop {n}"))
    client.call("terminate", session)
    client.call("forget", session)
    return samples


def sessions_phase(client: Any, root: Path, count: int, pid: int) -> list[dict[str, Any]]:
    script = root / "short.py"
    script.write_text(SHORT)
    samples = []
    every = max(1, count // 10)
    for n in range(1, count + 1):
        name = f"s{n % 7}"
        client.call("start", name, script=str(script), stop_on_entry=False, replace=True)
        state = client.call("wait", name, wait=30)
        if state.get("state") not in ("exited", "crashed"):
            client.call("terminate", name)
        client.call("forget", name)
        if n % every == 0:
            samples.append(sample(pid, f"session {n}"))
    return samples


def children_phase(client: Any, root: Path, forks: int, pid: int) -> list[dict[str, Any]]:
    script = root / "forks.py"
    script.write_text(FORKS)
    session = "forks"
    client.call(
        "start",
        session,
        script=str(script),
        args=[str(forks)],
        breakpoints=[{"file": str(script), "line": line_of(FORKS, "child stops here")}],
        stop_on_entry=False,
        replace=True,
    )
    samples = []
    released = 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        listing = client.call("sessions")["sessions"]
        children = [s for s in listing if s.get("parent") and s.get("state") == "paused"]
        for child in children:
            client.call("continue", child["session"], wait=5)
            released += 1
            if released % 10 == 0:
                samples.append(sample(pid, f"child {released}"))
        parent = client.call("status", session)
        if parent.get("state") in ("exited", "crashed"):
            break
        if not children:
            time.sleep(0.05)
    for item in client.call("sessions")["sessions"]:
        if item["session"].startswith(session):
            client.call("forget", item["session"])
    samples.append(sample(pid, f"children done ({released} child sessions)"))
    return samples


def growth(samples: list[dict[str, Any]]) -> dict[str, float]:
    first, last = samples[0], samples[-1]
    return {key: last[key] - first[key] for key in ("rss_mb", "threads", "fds", "listening_ports")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--forks", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    if not Path("/proc/self/status").exists():
        print("soak: needs /proc (Linux)", file=sys.stderr)
        return 2

    # the daemon may still be closing files in it as the directory goes: never fail on that
    with tempfile.TemporaryDirectory(prefix="mldbg-soak-", ignore_cleanup_errors=True) as scratch:
        root = Path(scratch)
        config = root / "config"
        config.mkdir()
        os.environ["MLDBG_CONFIG_DIR"] = str(config)
        os.environ["MLDBG_HOME"] = str(root / ".mldbg")
        from mldbg.client.api import connect

        client = connect()
        pid = int(json.loads((config / "server.json").read_text())["pid"])
        started = time.monotonic()
        report: dict[str, Any] = {"baseline": sample(pid, "idle daemon")}
        try:
            phases = (
                ("stops", stops_phase, options.stops),
                ("sessions", sessions_phase, options.sessions),
                ("children", children_phase, options.forks),
            )
            for name, phase, count in phases:
                t0 = time.monotonic()
                samples = phase(client, root, count, pid)
                report[name] = {
                    "count": count,
                    "seconds": round(time.monotonic() - t0, 1),
                    "samples": samples,
                    "growth_first_to_last": growth(samples),
                }
            report["end"] = sample(pid, "end")
            report["seconds"] = round(time.monotonic() - started, 1)
        finally:
            client.request("POST", "/v1/shutdown", body={})

    if options.json:
        print(json.dumps(report, indent=1))
        return 0
    base = report["baseline"]
    print(
        f"idle daemon: {base['rss_mb']} MB, {base['threads']} threads, {base['fds']} fds, "
        f"{base['listening_ports']} listening ports"
    )
    for name in ("stops", "sessions", "children"):
        part = report[name]
        print(f"\n{name} ({part['count']}, {part['seconds']} s)")
        print(f"  {'at':36} {'RSS MB':>8} {'threads':>8} {'fds':>6} {'ports':>6}")
        for row in part["samples"]:
            print(
                f"  {row['at']:36} {row['rss_mb']:8.1f} {row['threads']:8d} "
                f"{row['fds']:6d} {row['listening_ports']:6d}"
            )
        g = part["growth_first_to_last"]
        print(
            f"  growth, first sample to last: {g['rss_mb']:+.1f} MB, {g['threads']:+d} threads, "
            f"{g['fds']:+d} fds, {g['listening_ports']:+d} ports"
        )
    end = report["end"]
    print(
        f"\nend: {end['rss_mb']} MB, {end['threads']} threads, {end['fds']} fds, "
        f"{end['listening_ports']} listening ports ({report['seconds']} s in all)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
