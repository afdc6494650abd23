"""Overhead of running under mldbg, pdb and debugpy, measured side by side in one run.

This machine is shared and noisy, so absolute times mean little: every configuration of
a workload runs interleaved with the others, N rounds, and the table reports the median
of each relative to plain Python from the same rounds.

Each workload times itself (``time.perf_counter`` around the work) and prints it, so
interpreter start-up, daemon round trips and torch's import are not counted.  In every
debugger the breakpoint sits in a function of the *same file* that is never called:
the tracer must stay armed, and the question is what that costs while nothing stops.

    python benchmarks/overhead.py            # 3 rounds
    python benchmarks/overhead.py --quick    # 1 round
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ELAPSED = re.compile(r"elapsed ([0-9.]+)")

PURE_PYTHON = """
import time

def never_called():
    return 0  # BREAKPOINT

def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def small(x):
    return x * 2 + 1

t = time.perf_counter()
fib(24)
total = 0
for i in range(200_000):
    total += small(i)
print(f"elapsed {time.perf_counter() - t:.6f}")
"""

TORCH_MODEL = """
import time
import torch
from torch import nn

def never_called():
    return 0  # BREAKPOINT

class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(*[Block(64) for _ in range(4)]).eval()
x = torch.randn(8, 16, 64)
with torch.no_grad():
    model(x)
    t = time.perf_counter()
    for _ in range(300):
        x = model(x) * 0.5
print(f"elapsed {time.perf_counter() - t:.6f}")
"""


def breakpoint_line(path: Path) -> int:
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if "# BREAKPOINT" in text:
            return number
    raise RuntimeError(f"no breakpoint marker in {path}")


def parse_elapsed(text: str) -> float:
    match = ELAPSED.search(text)
    if not match:
        raise RuntimeError(f"the workload printed no elapsed time:\n{text[-2000:]}")
    return float(match.group(1))


# -- runners: each returns (inner seconds, wall seconds) ------------------------------------------


def run_plain(python: str, script: Path) -> tuple[float, float]:
    started = time.perf_counter()
    out = subprocess.run(
        [python, str(script)], capture_output=True, text=True, timeout=600, check=True
    )
    return parse_elapsed(out.stdout), time.perf_counter() - started


def run_pdb(python: str, script: Path) -> tuple[float, float]:
    """``python -m pdb`` with a breakpoint, then continue; EOF on stdin ends it at the restart prompt."""
    line = breakpoint_line(script)
    argv = [python, "-m", "pdb", "-c", f"break {script}:{line}", "-c", "continue", str(script)]
    started = time.perf_counter()
    out = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )
    return parse_elapsed(out.stdout), time.perf_counter() - started


class Mldbg:
    """A private daemon (own config dir), driven over its REST API."""

    def __init__(self, workdir: Path) -> None:
        self.config = workdir / "mldbg-config"
        env = {**os.environ, "MLDBG_CONFIG_DIR": str(self.config)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mldbg", "serve"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not (self.config / "server.json").exists():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the mldbg daemon did not start")
            time.sleep(0.05)
        time.sleep(0.2)
        info = json.loads((self.config / "server.json").read_text())
        self.http = httpx.Client(
            base_url=info["url"], headers={"Authorization": f"Bearer {info['token']}"}, timeout=600
        )
        self.count = 0

    def run(self, python: str, script: Path, with_breakpoint: bool) -> tuple[float, float]:
        self.count += 1
        name = f"bench{self.count}"
        breakpoints = (
            [{"file": str(script), "line": breakpoint_line(script)}] if with_breakpoint else []
        )
        body = {
            "script": str(script),
            "cwd": str(script.parent),
            "python": python,
            "breakpoints": breakpoints,
            "stop_on_entry": False,
            "env": {**os.environ, "MLDBG_HOME": str(script.parent / ".mldbg")},
        }
        started = time.perf_counter()
        state = self.http.post(f"/v1/sessions/{name}/start", json=body).json()
        while state.get("state") in ("running", "starting"):
            state = self.http.post(f"/v1/sessions/{name}/wait", json={"wait": 30}).json()
        wall = time.perf_counter() - started
        if state.get("state") != "exited" or state.get("exit_code") != 0:
            raise RuntimeError(f"mldbg run ended badly: {state}")
        output = self.http.get(f"/v1/sessions/{name}/output").json()["output"]
        self.http.delete(f"/v1/sessions/{name}")
        return parse_elapsed(output), wall

    def close(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            self.http.post("/v1/shutdown")
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Debugpy:
    """debugpy as VS Code uses it: a real DAP client sets the breakpoint before the script runs.

    ``python -m debugpy --listen PORT --wait-for-client`` holds the script until the
    client's ``configurationDone``, so the breakpoint is armed for the whole run.
    """

    def __init__(self, python: str) -> None:
        self.python = python

    @staticmethod
    def _send(sock: socket.socket, seq: int, command: str, arguments: dict[str, Any]) -> None:
        body = json.dumps(
            {"seq": seq, "type": "request", "command": command, "arguments": arguments}
        ).encode()
        sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def run(self, script: Path) -> tuple[float, float]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        argv = [
            self.python,
            "-m",
            "debugpy",
            "--listen",
            f"127.0.0.1:{port}",
            "--wait-for-client",
            str(script),
        ]
        started = time.perf_counter()
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("debugpy did not listen") from None
                time.sleep(0.05)
        with sock:
            sock.settimeout(None)
            self._send(
                sock,
                1,
                "initialize",
                {"adapterID": "bench", "pathFormat": "path", "linesStartAt1": True},
            )
            self._send(sock, 2, "attach", {"justMyCode": True})
            line = breakpoint_line(script)
            self._send(
                sock,
                3,
                "setBreakpoints",
                {"source": {"path": str(script)}, "breakpoints": [{"line": line}]},
            )
            self._send(sock, 4, "configurationDone", {})
            threading.Thread(target=_drain, args=(sock,), daemon=True).start()
            # debugpy lingers for tens of seconds after the script ends: once the workload
            # has printed its time, end the session instead of waiting for that.
            assert process.stdout is not None
            stdout = ""
            for text in process.stdout:
                stdout += text
                if ELAPSED.search(text):
                    break
            self._send(sock, 5, "disconnect", {"terminateDebuggee": True})
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return parse_elapsed(stdout), time.perf_counter() - started


def _drain(sock: socket.socket) -> None:
    """Read and drop the adapter's events so it never blocks on a full socket."""
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass


def available(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def find_python312() -> str | None:
    for candidate in sorted(
        Path("~/.pyenv/versions").expanduser().glob("3.12.*/bin/python3.12"), reverse=True
    ):
        return str(candidate)
    return shutil.which("python3.12")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round instead of three")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="mldbg-bench-"))
    mldbg = Mldbg(work)
    try:
        scripts = {"pure-python": PURE_PYTHON}
        if available(python, "torch"):
            scripts["torch-mlp"] = TORCH_MODEL
        paths = {}
        for name, source in scripts.items():
            paths[name] = work / f"{name.replace('-', '_')}.py"
            paths[name].write_text(textwrap.dedent(source).lstrip())

        configs: list[tuple[str, str, str, Callable[[Path], tuple[float, float]]]] = []
        version = ".".join(map(str, sys.version_info[:2]))
        backend = "monitoring" if sys.version_info >= (3, 12) else "settrace"
        configs.append((version, "plain python", "", lambda p: run_plain(python, p)))
        configs.append(
            (
                version,
                f"mldbg, no breakpoint ({backend})",
                "",
                lambda p: mldbg.run(python, p, False),
            )
        )
        configs.append(
            (
                version,
                f"mldbg, breakpoint never hit ({backend})",
                "",
                lambda p: mldbg.run(python, p, True),
            )
        )
        configs.append((version, "pdb, breakpoint never hit", "", lambda p: run_pdb(python, p)))
        if available(python, "debugpy"):
            debugpy = Debugpy(python)
            configs.append((version, "debugpy, breakpoint never hit", "", debugpy.run))
        py312 = find_python312()
        if py312 and sys.version_info < (3, 12):
            configs.append(("3.12", "plain python", "pure", lambda p: run_plain(py312, p)))
            configs.append(
                (
                    "3.12",
                    "mldbg, breakpoint never hit (monitoring)",
                    "pure",
                    lambda p: mldbg.run(py312, p, True),
                )
            )
            configs.append(
                ("3.12", "pdb, breakpoint never hit", "pure", lambda p: run_pdb(py312, p))
            )

        results: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
        for round_index in range(rounds):
            for workload, path in paths.items():
                for version_label, label, only, runner in configs:
                    if only == "pure" and workload != "pure-python":
                        continue
                    key = (workload, version_label, label)
                    results.setdefault(key, []).append(runner(path))
            print(f"round {round_index + 1}/{rounds} done", file=sys.stderr, flush=True)

        print(
            f"\nmldbg overhead benchmark — {rounds} round(s), median times; ratio = inner time / plain python's"
        )
        print(f"python {sys.version.split()[0]} ({sys.executable}), {os.cpu_count()} cores\n")
        header = f"{'workload':<12} {'python':<7} {'configuration':<44} {'inner s':>8} {'ratio':>7} {'wall s':>7}"
        print(header)
        print("-" * len(header))
        for (workload, version_label, label), samples in results.items():
            inner = statistics.median(s[0] for s in samples)
            wall = statistics.median(s[1] for s in samples)
            base = statistics.median(
                s[0] for s in results[(workload, version_label, "plain python")]
            )
            print(
                f"{workload:<12} {version_label:<7} {label:<44} {inner:>8.3f} {inner / base:>6.2f}x {wall:>7.2f}"
            )
    finally:
        mldbg.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
