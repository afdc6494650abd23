"""The daemon always stops, and the CLI always finds the live one.

Real daemons (``python -m mldbg serve``, each with its own config directory) kept busy by
real input: a compare of two wide captures (a model calling one module 20,000 times) with
the analysis deadline off (``MLDBG_DEADLINE=0``), so a daemon thread computes for minutes;
and a daemon that cannot act at all (stopped by ``SIGSTOP``: no signal handler, no event
loop, nothing of it runs).  ``mldbg serve --stop`` and SIGTERM must end the process
whatever that thread does, and "stopped" is said only once its pid is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from daemons import Daemon, alive, wait_until

import mldbg
from mldbg.store import current_run

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="reads a process's CPU time from /proc"
)

WIDE = 20_000  # calls of a wide capture: its compare keeps a thread busy for minutes
NO_DEADLINE = {"MLDBG_DEADLINE": "0"}


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _captures(home: Path, wide: bool) -> None:
    """Two captures of a small model whose port differs (so compare names a culprit); with
    ``wide``, each rewritten as the model calling its one module ``WIDE`` times (the index
    of a real wide model; every call's tensors the module's files)."""
    import torch

    torch.manual_seed(0)
    net, x = torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.randn(2, 4)
    current_run.reset()
    with mldbg.capture(net, "ref", sensitivity=False):
        net(x)
    current_run.reset()
    with torch.no_grad():
        net[0].weight[0, 0] += 1.0
    with mldbg.capture(net, "port", sensitivity=False):
        net(x)
    current_run.reset()
    if wide:
        for capture in home.glob("runs/*/captures/*"):
            _widen(capture / "index.jsonl", WIDE)


def _widen(index: Path, calls: int) -> None:
    root_call, call, returned, root_returned = map(json.loads, index.read_text().splitlines())
    lines = [root_call]
    for i in range(1, calls + 1):
        (key_in,), (key_out,) = call["tensors"].values(), returned["tensors"].values()
        lines.append({**call, "seq": i, "module": f"m{i}", "tensors": {f"m{i}#0.in.0": key_in}})
        lines.append({**returned, "seq": i, "end": 2 * i, "tensors": {f"m{i}#0.out": key_out}})
    lines.append({**root_returned, "end": 2 * calls + 1})
    index.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _busy_compare(daemon: Daemon, home: Path, **extra: Any) -> threading.Thread:
    """POST a compare that keeps a daemon thread busy, and return once it demonstrably
    does: the daemon burns a second of CPU while the compare has not answered."""
    body = {"a": "ref", "b": "port", "client_cwd": str(home.parent), "client_home": str(home)}
    answered: list[int] = []

    def compare() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the daemon stops under it
            response = daemon.api.http.post("/v1/compare", json={**body, **extra}, timeout=600)
            answered.append(response.status_code)

    thread = threading.Thread(target=compare, daemon=True)
    before = _cpu_seconds(daemon.pid)
    thread.start()
    wait_until(
        lambda: answered or _cpu_seconds(daemon.pid) > before + 1.0,
        60,
        "the compare to keep the daemon busy",
    )
    assert not answered, f"the compare answered ({answered}): this input no longer spins"
    return thread


def _stop(daemon: Daemon, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mldbg", "serve", "--stop", "--json"],
        env=daemon.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "work" / ".mldbg"
    home.parent.mkdir()
    monkeypatch.setenv("MLDBG_HOME", str(home))
    yield home
    current_run.reset()


@pytest.mark.slow
def test_serve_stop_ends_a_daemon_whose_thread_spins_in_python(store: Path, tmp_path: Path) -> None:
    _captures(store, wide=True)
    daemon = Daemon(tmp_path / "config", env=NO_DEADLINE)
    try:
        _busy_compare(daemon, store)
        stopped = _stop(daemon)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        answer = json.loads(stopped.stdout)
        assert answer["stopped"] is True and answer["pid"] == daemon.pid, answer
        # said only once true: the process is gone when the CLI says so
        assert not alive(daemon.pid), daemon.log()
        assert not (daemon.config / "server.json").exists()
        assert answer["forced"] is None, answer  # it stopped itself, no SIGKILL needed
    finally:
        daemon.stop()


@pytest.mark.slow
def test_sigterm_ends_a_daemon_whose_thread_spins_in_python(store: Path, tmp_path: Path) -> None:
    _captures(store, wide=True)
    daemon = Daemon(tmp_path / "config", env=NO_DEADLINE)
    try:
        _busy_compare(daemon, store)
        daemon.process.send_signal(signal.SIGTERM)
        # the hang guard only: the daemon bounds its own stop far below it
        assert daemon.process.wait(60) == 0, daemon.log()
        assert not (daemon.config / "server.json").exists()
        assert "still busy" in daemon.log()  # it says which threads it left behind
    finally:
        daemon.stop()


@pytest.mark.slow
def test_serve_stop_ends_a_daemon_that_cannot_act(store: Path, tmp_path: Path) -> None:
    """A daemon none of whose code can run (stopped: as good as one stuck in a C loop that
    holds the GIL) answers no request and handles no signal: the CLI ends it by its pid,
    which its lock names, and says so."""
    _captures(store, wide=False)
    daemon = Daemon(tmp_path / "config")
    try:
        daemon.process.send_signal(signal.SIGSTOP)
        stopped = _stop(daemon)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        answer = json.loads(stopped.stdout)
        assert answer["stopped"] is True and answer["forced"] == "SIGKILL", answer
        assert not alive(daemon.pid)
    finally:
        daemon.stop()


def test_a_stale_server_json_is_passed_over_for_the_daemon_the_lock_names(
    tmp_path: Path,
) -> None:
    """server.json names a dead URL (its pid is the live daemon's): the lock is the truth."""
    daemon = Daemon(tmp_path / "config")
    try:
        with socket.socket() as sock:  # a port nobody listens on once closed
            sock.bind(("127.0.0.1", 0))
            dead = sock.getsockname()[1]
        server_json = daemon.config / "server.json"
        info = json.loads(server_json.read_text())
        info.update(url=f"http://127.0.0.1:{dead}", port=dead)
        server_json.write_text(json.dumps(info))
        listed = subprocess.run(
            [sys.executable, "-m", "mldbg", "sessions", "--json"],
            env=daemon.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert listed.returncode == 0, listed.stdout + listed.stderr
        assert "sessions" in json.loads(listed.stdout)
        assert daemon.process.poll() is None  # the same daemon, not a second one
        stopped = _stop(daemon)
        assert stopped.returncode == 0 and json.loads(stopped.stdout)["stopped"] is True
        assert daemon.process.wait(60) == 0
    finally:
        daemon.stop()
