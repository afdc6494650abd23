"""``mldbg kill-all``: real torch and MLX processes started by the test, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mldbg.tools import killall

torch = pytest.importorskip("torch")  # this test process holds torch too: it must be spared

HOLD = """
import signal, sys, time
if "ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
import {module}
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def spawn() -> Iterator:
    started: list[subprocess.Popen[str]] = []

    def _spawn(module: str, *marks: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLD.format(module=module), *marks],
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    yield _spawn
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_dry_run_lists_then_a_real_run_ends_only_the_target(cli, spawn) -> None:
    mark = f"mldbg-test-{uuid.uuid4().hex[:8]}"
    target = spawn("torch", mark)
    bystander = spawn("torch", f"mldbg-test-{uuid.uuid4().hex[:8]}")  # torch, not matched
    plain = spawn("json", mark)  # matched, but holds no framework

    listed = cli("kill-all", "--dry-run", "--match", mark, json_out=True)
    pids = [p["pid"] for p in listed["processes"]]
    assert target.pid in pids and plain.pid not in pids
    entry = next(p for p in listed["processes"] if p["pid"] == target.pid)
    assert entry["frameworks"] == ["torch"] and mark in entry["command"]
    assert entry["rss_bytes"] > 10_000_000 and entry["age_s"] >= 0 and entry["outcome"] is None
    assert all(p.poll() is None for p in (target, bystander, plain))  # a dry run touches nothing

    everything = cli("kill-all", "--dry-run", json_out=True)
    assert os.getpid() not in [p["pid"] for p in everything["processes"]]  # an ancestor: spared
    assert everything["skipped"].get("protected", 0) >= 1

    refused = cli("kill-all", "--match", mark, json_out=True, expect=2)
    assert refused["code"] == "confirmation_required" and "--yes" in refused["error"]
    assert target.poll() is None

    assert cli("kill-all", "--mlx-only", "--dry-run", "--match", mark, json_out=True)["count"] == 0
    # --pytorch-only: the spelling of the tool mldbg replaces, the same filter
    aliased = cli("kill-all", "--pytorch-only", "--dry-run", "--match", mark, json_out=True)
    assert [p["pid"] for p in aliased["processes"]] == [target.pid]
    done = cli("kill-all", "--yes", "--torch-only", "--match", mark, json_out=True)
    assert {p["pid"]: p["outcome"] for p in done["processes"]} == {target.pid: "terminated"}
    assert target.wait(10) == -15
    assert bystander.poll() is None and plain.poll() is None


def test_force_kills_what_ignores_sigterm_and_mlx_is_seen(cli, spawn) -> None:
    pytest.importorskip("mlx.core")
    mark = f"mldbg-test-{uuid.uuid4().hex[:8]}"
    stubborn = spawn("torch", mark, "ignore-term")
    mlx_proc = spawn("mlx.core", mark + "-mlx")
    seen = cli("kill-all", "--dry-run", "--mlx-only", "--match", mark + "-mlx", json_out=True)
    assert [(p["pid"], p["frameworks"]) for p in seen["processes"]] == [(mlx_proc.pid, ["mlx"])]
    soft = cli(
        "kill-all", "--yes", "--torch-only", "--grace", "0.5", "--match", mark, json_out=True
    )
    assert [p["outcome"] for p in soft["processes"]] == ["still_running"]
    assert stubborn.poll() is None
    hard = cli(
        "kill-all",
        "--yes",
        "--force",
        "--torch-only",
        "--grace",
        "0.5",
        "--match",
        mark,
        json_out=True,
    )
    assert [p["outcome"] for p in hard["processes"]] == ["killed"]
    assert stubborn.wait(10) == -9 and mlx_proc.poll() is None


def test_the_daemon_and_this_process_are_protected(
    daemon, config_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLDBG_CONFIG_DIR", str(config_dir))
    protected = killall.protected_pids()
    assert {os.getpid(), os.getppid(), daemon["pid"]} <= protected
    found, _ = killall.find_processes("torch")
    assert os.getpid() not in [p.pid for p in found]
    with pytest.raises(killall.MldbgError) as bad:
        killall.find_processes("jax")
    assert bad.value.code == "bad_argument"
