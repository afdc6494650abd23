"""The daemon always stops, and the CLI always finds the live one.

Real daemons (``python -m mldbg serve``, each with its own config directory) kept busy by
real input: a compare of captures whose ``index.jsonl`` makes a daemon thread spin in pure
Python (a ``parent`` cycle), or a map whose regex backtracks for ages inside ``re`` (a C
loop that holds the GIL, so no Python code of the daemon runs at all).  ``mldbg serve
--stop`` and SIGTERM must end the process whatever that thread does, and "stopped" is said
only once its pid is gone.
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

LONG_NAME = "x" * 40  # a module path the regex below backtracks on for ages


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _captures(home: Path, cycle: bool) -> None:
    """Two captures of a small model whose port differs (so compare names a culprit); with
    ``cycle``, each index makes the root call and its first child each other's parent."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module(LONG_NAME, torch.nn.Linear(4, 4))
            self.b = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(getattr(self, LONG_NAME)(x)))

    torch.manual_seed(0)
    net, x = Net(), torch.randn(2, 4)
    current_run.reset()
    with mldbg.capture(net, "ref"):
        net(x)
    current_run.reset()
    with torch.no_grad():
        getattr(net, LONG_NAME).weight[0, 0] += 1.0
    with mldbg.capture(net, "port"):
        net(x)
    current_run.reset()
    if cycle:
        for index in home.glob("runs/*/captures/*/index.jsonl"):
            text = index.read_text()
            assert '"parent": null' in text
            index.write_text(text.replace('"parent": null', '"parent": 1'))


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
    _captures(store, cycle=True)
    daemon = Daemon(tmp_path / "config")
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
    _captures(store, cycle=True)
    daemon = Daemon(tmp_path / "config")
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
def test_serve_stop_ends_a_daemon_stuck_in_a_c_loop(store: Path, tmp_path: Path) -> None:
    """A regex that backtracks for ages holds the GIL inside ``re``: the daemon's event
    loop and signal handlers cannot run, so the CLI ends it by its pid, and says so."""
    _captures(store, cycle=False)
    daemon = Daemon(tmp_path / "config")
    try:
        _busy_compare(daemon, store, map={"regex": [["(x+x+)+y", "z"]]})
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
