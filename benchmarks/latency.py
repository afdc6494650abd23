"""How long an answer takes: REST on one kept-alive connection, MCP over it, the CLI.

Measured side by side in one run against one daemon and one paused session, medians of
many calls, and judged against the targets of the issues:

* REST eval / status / step: <= 5 ms p50 on a persistent connection;
* an MCP tool call: <= 10 ms over the same REST call;
* ``mldbg eval`` from a shell: <= 120 ms (an idle machine), human and ``--json``, beside
  ``python -c pass`` (the interpreter's own start-up on this machine, at that moment).

Run: ``.venv/bin/python benchmarks/latency.py [--calls N]``.  It uses a private config
directory and run store under a temporary directory, never ``~/.mldbg``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

SCRIPT = textwrap.dedent(
    """
    def work(n):
        total = 0
        for i in range(n):
            total += i  # stop here
        return total

    while True:
        work(10)
    """
)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def time_calls(fn: Any, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def rest_rows(client: Any, session: str, calls: int) -> dict[str, float]:
    rows = {}
    rows["status"] = median_ms(time_calls(lambda: client.call("status", session), calls))
    rows["eval"] = median_ms(
        time_calls(lambda: client.call("eval", session, expression="total + 1"), calls)
    )
    rows["step"] = median_ms(
        time_calls(lambda: client.call("step", session, kind="over", wait=5), calls)
    )
    return rows


def mcp_rows(config: Path, session: str, calls: int) -> dict[str, float]:
    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mldbg", "mcp"],
        env={**os.environ, "MLDBG_CONFIG_DIR": str(config)},
    )
    rows: dict[str, float] = {}

    async def main() -> None:
        async with Client(server, read_timeout_seconds=60) as client:
            await client.call_tool("status", {"session": session})  # connect, warm up
            for name, args in (
                ("status", {"session": session}),
                ("eval", {"session": session, "expression": "total + 1"}),
            ):
                samples = []
                for _ in range(calls):
                    started = time.perf_counter()
                    await client.call_tool(name, args)
                    samples.append(time.perf_counter() - started)
                rows[name] = median_ms(samples)

    anyio.run(main)
    return rows


def cli_rows(config: Path, session: str, runs: int) -> dict[str, float]:
    """``mldbg eval`` (human and ``--json``) beside ``python -c pass``, runs interleaved,
    so that the interpreter's own start-up on this machine, now, is in the same table."""
    env = {**os.environ, "MLDBG_CONFIG_DIR": str(config)}
    mldbg = str(Path(sys.executable).with_name("mldbg"))
    commands = {
        "python": [sys.executable, "-c", "pass"],
        "eval": [mldbg, "eval", "-s", session, "total + 1"],
        "eval_json": [mldbg, "eval", "--json", "-s", session, "total + 1"],
    }
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, command in commands.items():
            started = time.perf_counter()
            subprocess.run(command, env=env, capture_output=True, check=True)
            samples[name].append(time.perf_counter() - started)
    return {name: median_ms(values) for name, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--cli-runs", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="mldbg-latency-") as scratch:
        root = Path(scratch)
        config = root / "config"
        config.mkdir()
        os.environ["MLDBG_CONFIG_DIR"] = str(config)
        os.environ["MLDBG_HOME"] = str(root / ".mldbg")
        script = root / "loop.py"
        script.write_text(SCRIPT)
        line = next(i for i, t in enumerate(SCRIPT.splitlines(), 1) if "stop here" in t)
        from mldbg.client.api import connect

        client = connect()
        session = "latency"
        try:
            client.call(
                "start",
                session,
                script=str(script),
                breakpoints=[{"file": str(script), "line": line}],
                replace=True,
            )
            client.call("continue", session, wait=10)
            rest = rest_rows(client, session, options.calls)
            mcp = mcp_rows(config, session, max(20, options.calls // 4))
            cli = cli_rows(config, session, options.cli_runs)
        finally:
            client.call("terminate", session)
            client.request("POST", "/v1/shutdown", body={})

    rows = [
        ("REST status (p50)", rest["status"], 5.0),
        ("REST eval (p50)", rest["eval"], 5.0),
        ("REST step (p50)", rest["step"], 5.0),
        ("MCP status over REST", mcp["status"] - rest["status"], 10.0),
        ("MCP eval over REST", mcp["eval"] - rest["eval"], 10.0),
        ("CLI `mldbg eval` (wall)", cli["eval"], 120.0),
        ("CLI `mldbg eval --json` (wall)", cli["eval_json"], 120.0),
        ("`python -c pass` (wall, reference)", cli["python"], None),
    ]
    if options.json:
        print(json.dumps({name: {"ms": round(ms, 2), "target_ms": t} for name, ms, t in rows}))
        return 0
    print(f"{'measure':36} {'ms':>8} {'target':>8}  verdict")
    for name, ms, target in rows:
        if target is None:
            print(f"{name:36} {ms:8.2f} {'':>8}")
            continue
        verdict = "met" if ms <= target else "MISSED"
        print(f"{name:36} {ms:8.2f} {target:8.0f}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
