"""A soak run: the daemon after thousands of stops and evaluations, a thousand sessions
started and forgotten, and children forking throughout.  Nothing may grow with the work:
the daemon's memory (RSS), threads, open file descriptors and listening ports are sampled
as it goes and reported as figures (nothing is asserted on time).

* one session through ``--stops`` stops (a breakpoint in a loop), an evaluation at each;
  every ``--fork-every`` stops the script forks a child that stops at a breakpoint of its
  own: a child session the run continues and, once ended, prunes;
* ``--sessions`` sessions, each started (a script that ends at once), waited for and
  forgotten.

Run: ``.venv/bin/python benchmarks/soak.py [--stops N] [--sessions N]``.  It uses a
private config directory and run store under a temporary directory, never ``~/.mldbg``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

LOOP = textwrap.dedent(
    """
    import os, sys

    def child_work(n):
        return n * 2  # child stops here

    every = int(sys.argv[1])
    total = 0
    i = 0
    while True:
        i += 1
        total += i  # stop here
        if i % every == 0:
            if os.fork() == 0:
                child_work(i)
                os._exit(0)
        try:
            os.waitpid(-1, os.WNOHANG)  # reap the children that ended
        except ChildProcessError:
            pass
    """
)
ONCE = "x = 1\n"


def sample(pid: int) -> dict[str, int]:
    """The daemon's RSS (KB), threads, open fds and listening TCP ports, from /proc."""
    with open(f"/proc/{pid}/status") as fh:
        status = dict(line.split(":", 1) for line in fh if ":" in line)
    fds = os.listdir(f"/proc/{pid}/fd")
    inodes = set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    listening = 0
    with open("/proc/net/tcp") as fh:
        for row in fh.readlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:
                listening += 1
    return {
        "rss_kb": int(status["VmRSS"].split()[0]),
        "threads": int(status["Threads"]),
        "fds": len(fds),
        "ports": listening,
    }


def soak_stops(client: Any, root: Path, stops: int, fork_every: int, pid: int) -> list[Any]:
    script = root / "loop.py"
    script.write_text(LOOP)
    lines = {t.split("# ")[1]: i for i, t in enumerate(LOOP.splitlines(), 1) if "# " in t}
    breakpoints = [
        {"file": str(script), "line": lines["stop here"]},
        {"file": str(script), "line": lines["child stops here"]},
    ]
    session = "soak"
    client.call(
        "start", session, script=str(script), args=[str(fork_every)], breakpoints=breakpoints
    )
    rows = []
    children = 0
    started = time.perf_counter()
    for stop in range(1, stops + 1):
        state = client.call("continue", session, wait=30)
        assert state["state"] == "paused", state
        client.call("eval", session, expression="total + 1")
        for child in state.get("paused_children") or []:
            client.call("continue", child, wait=10)  # the child returns and ends
            children += 1
        if stop % max(1, stops // 10) == 0:
            client.call("sessions", None, prune=True)  # forget the children that ended
            rows.append(("stops", stop, children, time.perf_counter() - started, sample(pid)))
    client.call("terminate", session)
    client.call("forget", session)
    return rows


def soak_sessions(client: Any, root: Path, count: int, pid: int) -> list[Any]:
    script = root / "once.py"
    script.write_text(ONCE)
    rows = []
    started = time.perf_counter()
    for n in range(1, count + 1):
        name = f"s{n}"
        state = client.call("start", name, script=str(script), stop_on_entry=False, wait=30)
        if state["state"] not in ("exited", "crashed"):
            state = client.call("wait", name, wait=30)
        assert state["state"] == "exited", state
        client.call("forget", name)
        if n % max(1, count // 10) == 0:
            rows.append(("sessions", n, 0, time.perf_counter() - started, sample(pid)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, default=10_000)
    parser.add_argument("--fork-every", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="mldbg-soak-") as scratch:
        root = Path(scratch)
        config = root / "config"
        config.mkdir()
        os.environ["MLDBG_CONFIG_DIR"] = str(config)
        os.environ["MLDBG_HOME"] = str(root / ".mldbg")
        from mldbg.cli.client import connect

        client = connect()
        pid = int(client.request("GET", "/v1/health")["pid"])
        rows: list[Any] = [("start", 0, 0, 0.0, sample(pid))]
        try:
            rows += soak_stops(client, root, options.stops, options.fork_every, pid)
            rows += soak_sessions(client, root, options.sessions, pid)
        finally:
            client.request("POST", "/v1/shutdown", body={})

    if options.json:
        print(
            json.dumps(
                [dict(zip(("phase", "n", "children", "s", "daemon"), r, strict=True)) for r in rows]
            )
        )
        return 0
    print(
        f"{'phase':9} {'n':>6} {'children':>8} {'s':>7} {'RSS MB':>7} {'threads':>7} "
        f"{'fds':>5} {'ports':>5}"
    )
    for phase, n, children, seconds, d in rows:
        print(
            f"{phase:9} {n:6} {children:8} {seconds:7.1f} {d['rss_kb'] / 1024:7.1f} "
            f"{d['threads']:7} {d['fds']:5} {d['ports']:5}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
