"""The run store under faults: private whatever the umask, and a full disk loses nothing.

The full-disk cases use a real 2 MB tmpfs where one can be mounted (root on Linux), and
``RLIMIT_FSIZE`` on the debuggee everywhere else, so they run on every machine.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from daemons import Daemon, events, run_json, start_body

from conftest import Api, call, line_of


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


STORE_SCRIPT = """
import numpy as np
import torch

import mldbg
from mldbg import debug_checkpoint, debug_save

hidden = np.arange(6, dtype=np.float32)
debug_checkpoint("layer", skip=True, hidden=hidden)
debug_save(hidden, "hidden")
net = torch.nn.Linear(3, 2)
with torch.no_grad(), mldbg.capture(net, "ref"):
    net(torch.ones(1, 3))
print("secret output")
value = 1  # stop here
"""


def test_run_store_is_private_whatever_the_umask(write, tmp_path: Path) -> None:
    shared = tmp_path / "shared-config"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    daemon = Daemon(shared, umask=0)
    try:
        assert _mode(shared) == 0o755  # an existing config directory is never re-moded
        script = write("store.py", STORE_SCRIPT)
        body = start_body(
            script,
            tmp_path,
            stop_on_entry=False,
            breakpoints=[{"file": str(script), "line": line_of(script, "stop here")}],
        )
        call(daemon.api.client, "start", "private", **body)
        state = call(daemon.api.client, "wait", "private", wait=60)
        assert state["state"] == "paused", state
        call(daemon.api.client, "eval", "private", expression="hidden.sum()")
        ended = call(daemon.api.client, "continue", "private", wait=60)
        assert ended["state"] == "exited"
        home = tmp_path / ".mldbg"
        run_dir = Path(ended["run_dir"])
        expected = {"run.json", "output.log", "events.jsonl", "checkpoints.jsonl", "captures"}
        assert expected <= {p.name for p in run_dir.iterdir()}
        assert list(run_dir.glob("captures/ref/*.safetensors"))  # the capture's tensors too
        # what the CLI writes in its own process: a profile run (its report, its output),
        # a compare's HTML report
        cli = [sys.executable, "-m", "mldbg"]
        env = {**os.environ, "MLDBG_CONFIG_DIR": str(shared)}
        outputs = []
        for argv in (
            [*cli, "profile", "--json", str(script)],
            [*cli, "compare", "--json", "ref", "ref", "--html", str(tmp_path / "report.html")],
        ):
            done = subprocess.run(
                argv, cwd=tmp_path, env=env, capture_output=True, text=True, umask=0
            )
            assert done.returncode == 0, done.stderr
            outputs.append(json.loads(done.stdout))
        report = Path(outputs[0]["report"])
        assert report.name.startswith("PROFILE_REPORT_") and report.is_relative_to(home)
        assert _mode(tmp_path / "report.html") == 0o600
        # every file and directory mldbg wrote in its store: private, whatever the umask
        written = []
        for root, dirs, files in os.walk(home):
            for name in dirs + files:
                path = Path(root, name)
                written.append(path)
                if not path.is_symlink():  # latest -> runs/<newest>
                    assert _mode(path) == (0o700 if name in dirs else 0o600), path
        names = {p.name for p in written}
        assert {".gitignore", "output.log", "run.json", "profile.json", report.name} <= names
        for directory in (home, home / "runs", run_dir, home / "tensors"):
            assert _mode(directory) == 0o700, directory
        for name in ("server.json", "daemon.lock"):
            assert _mode(shared / name) == 0o600
    finally:
        daemon.stop()


def test_a_config_directory_the_daemon_creates_is_private(tmp_path: Path) -> None:
    config = tmp_path / "made" / "config"
    daemon = Daemon(config, umask=0)
    try:
        assert _mode(config) == 0o700
    finally:
        daemon.stop()


# -- full disk ---------------------------------------------------------------------------------

FILL_SCRIPT = """
print("early line", flush=True)
value = 1  # stop here
while True:
    print("x" * 4000, flush=True)
"""


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(mount)],
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip("no tmpfs can be mounted here (needs root); the RLIMIT_FSIZE case runs")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(session: str, api: Api, write, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    script = write("fill.py", FILL_SCRIPT)
    body = start_body(
        script,
        tmp_path,
        stop_on_entry=False,
        breakpoints=[{"file": str(script), "line": line_of(script, "stop here")}],
        **extra,
    )
    return body


def test_disk_full_while_running_loses_nothing_written_before(
    api: Api, write, tmp_path: Path, small_disk: Path
) -> None:
    body = _fill("full", api, write, tmp_path)
    body["base_env"]["MLDBG_HOME"] = str(small_disk / "home")
    call(api.client, "start", "full", **body)
    try:
        paused = call(api.client, "wait", "full", wait=60)
        assert paused["reason"] == "breakpoint", paused
        assert call(api.client, "eval", "full", expression="1 + 1")["result"] == "2"
        run_dir = Path(paused["run_dir"])
        before = run_json(run_dir)
        state = call(api.client, "continue", "full", wait=60)
        # the script's own print fails on the full disk: it stops on that exception
        assert state["reason"] == "exception", state
        assert "No space left" in json.dumps(state["exception"]), state["exception"]
        while state["state"] in ("paused", "running"):
            state = call(api.client, "continue", "full", wait=60)
        assert state["state"] in ("exited", "crashed")
        # run.json is finalised all the same (rewritten within the room it keeps; what
        # cannot be written is reported in the state's store_error)
        meta = run_json(run_dir)
        assert meta["state"] == state["state"] and meta["ended_at"], meta
        # nothing written before the disk filled up is lost
        assert {k: meta[k] for k in ("run_id", "started_at", "pid")} == {
            k: before[k] for k in ("run_id", "started_at", "pid")
        }
        recorded = [e["event"] for e in events(run_dir)]
        assert recorded[:3] == ["started", "stopped", "eval"]
        assert (run_dir / "output.log").read_text(errors="replace").startswith("early line")
        # a start on the full disk is refused with a code, and leaves no session
        refused = api.http.post("/v1/sessions/full-again/start", json=body)
        assert refused.status_code == 400 and refused.json()["code"] == "store_unwritable"
        call(api.client, "status", "full-again", 404)
    finally:
        call(api.client, "terminate", "full")


def test_file_size_limit_on_the_debuggee_finalises_the_run(api: Api, write, tmp_path: Path) -> None:
    """RLIMIT_FSIZE (every machine): the script's output hits the limit; run.json, written
    by the daemon, is still finalised and the output written before is kept."""
    import sys

    limited = tmp_path / "limited-python"
    limited.write_text(f'#!/bin/sh\nulimit -f 256\nexec "{sys.executable}" "$@"\n')
    limited.chmod(0o755)
    body = _fill("fsize", api, write, tmp_path, python=str(limited))
    call(api.client, "start", "fsize", **body)
    try:
        paused = call(api.client, "wait", "fsize", wait=60)
        assert paused["reason"] == "breakpoint", paused
        state = call(api.client, "continue", "fsize", wait=60)
        while state["state"] in ("paused", "running"):
            state = call(api.client, "continue", "fsize", wait=60)
        assert state["state"] in ("exited", "crashed") and "store_error" not in state
        run_dir = Path(state["run_dir"])
        meta = run_json(run_dir)
        assert meta["state"] == state["state"] and meta["ended_at"]
        assert (run_dir / "output.log").read_text(errors="replace").startswith("early line")
        assert [e["event"] for e in events(run_dir)][:2] == ["started", "stopped"]
    finally:
        call(api.client, "terminate", "fsize")
