"""The daemon killed, stopped, doubled or loaded: no debuggee runs on uncontrolled, no
session is stranded, and nothing written before the fault is lost.

Policy under test (``agent/orphan.py``, ``server/live_runs.py``): a debuggee whose
daemon dies ends itself and its process group, and finalises run.json with
``ended_reason: daemon_lost``; the next daemon lists it, ended, under its name.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from daemons import (
    Daemon,
    alive,
    events,
    kill_quietly,
    run_json,
    serving,
    slow_python,
    start_body,
    wait_until,
)

from conftest import call, line_of
from mldbg import verbs

SCRIPT = """
import sys, time
from pathlib import Path

marker = Path(sys.argv[1])
print("before the stop", flush=True)
value = 41  # stop here
if sys.argv[2] == "loop":
    while True:
        time.sleep(0.01)  # running
marker.write_text("ran past the breakpoint")
print("after the stop", flush=True)
"""


def _start(daemon: Daemon, write, tmp_path: Path, name: str, mode: str) -> dict[str, Any]:
    script = write("victim.py", SCRIPT)
    body = start_body(
        script,
        tmp_path,
        args=[str(tmp_path / "marker"), mode],
        stop_on_entry=False,
        breakpoints=[{"file": str(script), "line": line_of(script, "stop here")}],
    )
    call(daemon.api.client, "start", name, **body)
    state = call(daemon.api.client, "wait", name, wait=30)
    assert state["state"] == "paused" and state["reason"] == "breakpoint", state
    return state


def _put_in(daemon: Daemon, name: str, state: str) -> None:
    """From paused at the breakpoint into ``state``: paused, running, or evaluating."""
    api = daemon.api
    if state == "running":
        assert call(api.client, "continue", name, wait=0)["state"] == "running"
    elif state == "evaluating":

        def evaluate() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the daemon dies under it
                api.http.post(f"/v1/sessions/{name}/eval", json={"expression": "time.sleep(120)"})

        threading.Thread(target=evaluate, daemon=True).start()
        time.sleep(0.5)  # let the evaluation begin; the daemon dies under it either way


@pytest.mark.parametrize("state", ["paused", "running", "evaluating"])
def test_daemon_sigkill_ends_its_debuggees_and_the_next_daemon_says_so(
    write, tmp_path: Path, state: str
) -> None:
    daemon = Daemon(tmp_path / "config")
    pid = None
    try:
        started = _start(daemon, write, tmp_path, "victim", "loop" if state == "running" else "")
        pid, run_dir = started["pid"], started["run_dir"]
        _put_in(daemon, "victim", state)
        daemon.kill(signal.SIGKILL)
        # the debuggee notices (its link closes) and ends itself, never running on
        wait_until(lambda: not alive(pid), 30, "the orphaned debuggee to end itself")
        assert not (tmp_path / "marker").exists(), "the paused script ran on as an orphan"
        meta = run_json(run_dir)
        assert meta["state"] == "exited" and meta["ended_reason"] == "daemon_lost"
        assert meta["terminated"] is True and meta["ended_at"]
        if state != "running":
            assert meta["paused_at"]["line"] == started["location"]["line"]
        # nothing written before the fault is lost
        recorded = [e["event"] for e in events(run_dir)]
        assert recorded[:2] == ["started", "stopped"] and recorded[-1] == "ended"
        output = (Path(run_dir) / "output.log").read_text()
        assert "before the stop" in output and "daemon" in output and "after" not in output
        # a restarted daemon lists what it found
        again = Daemon(tmp_path / "config")
        try:
            health = again.api.get("/v1/health")
            found = {r["session"]: r for r in health["recovered"]}
            assert found["victim"]["found"] == "ended_itself"
            assert found["victim"]["run_dir"] == run_dir
            listed = call(again.api.client, "status", "victim")
            assert listed["state"] == "exited" and listed["recovered"]["pid"] == pid
            assert "before the stop" in listed["output_tail"]
            if state == "paused":  # and the CLI says so in words
                shown = subprocess.run(
                    [sys.executable, "-m", "mldbg", "status", "--session", "victim"],
                    env=again.env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                ).stdout
                assert "victim: exited (its daemon went away; found ended_itself)" in shown
            # and its name is free again
            _start(again, write, tmp_path, "victim", "")
            call(again.api.client, "terminate", "victim")
        finally:
            again.stop()
    finally:
        kill_quietly(pid)
        daemon.stop()


def test_daemon_sigkill_while_starting_is_cleaned_up_by_the_next_daemon(
    write, tmp_path: Path
) -> None:
    daemon = Daemon(tmp_path / "config")
    script = write("victim.py", SCRIPT)
    body = start_body(script, tmp_path, python=str(slow_python(tmp_path, 60)), args=["m", ""])

    def start() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the daemon dies under it
            daemon.api.http.post("/v1/sessions/early/start", json=body)

    threading.Thread(target=start, daemon=True).start()
    starting = wait_until(
        lambda: (
            daemon.api.http.get("/v1/sessions/early").status_code == 200
            and call(daemon.api.client, "status", "early").get("pid") is not None
            and call(daemon.api.client, "status", "early")
        ),
        what="the session's process to exist",
    )
    assert starting["state"] == "starting"
    pid = starting["pid"]
    try:
        wait_until(lambda: list((tmp_path / ".mldbg" / "runs").glob("victim-*")), what="run dir")
        daemon.kill(signal.SIGKILL)
        again = Daemon(tmp_path / "config")
        try:
            found = {r["session"]: r for r in again.api.get("/v1/health")["recovered"]}
            assert found["early"]["found"] == "ended_now"  # it was still alive: ended now
            assert not alive(pid)
            meta = run_json(found["early"]["run_dir"])
            assert meta["state"] == "exited" and meta["ended_reason"] == "daemon_lost"
            assert meta["started_at"]  # what the first daemon wrote is still there
        finally:
            again.stop()
    finally:
        kill_quietly(pid)
        daemon.stop()


def test_sigterm_shuts_down_as_cleanly_as_sigint(write, tmp_path: Path) -> None:
    daemon = Daemon(tmp_path / "config")
    started = _start(daemon, write, tmp_path, "polite", "")
    try:
        assert daemon.kill(signal.SIGTERM) == 0, daemon.log()
        assert not alive(started["pid"])
        assert not (tmp_path / "marker").exists()
        meta = run_json(started["run_dir"])
        assert meta["state"] == "exited" and meta["terminated"] is True
        assert "ended_reason" not in meta  # ended by its daemon, not orphaned
        assert not (daemon.config / "server.json").exists()
        assert not list((daemon.config / "live").glob("*.json"))
    finally:
        kill_quietly(started["pid"])
        daemon.stop()


def test_a_second_serve_refuses_and_names_the_running_daemon(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path / "config")
    try:
        second = subprocess.run(
            [sys.executable, "-m", "mldbg", "serve"],
            env=daemon.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        message = second.stdout + second.stderr
        assert "another mldbg daemon" in message and str(daemon.pid) in message
        # the first one still serves, and is still the one clients find
        assert daemon.api.get("/v1/health")["pid"] == daemon.pid
        assert json.loads((daemon.config / "server.json").read_text())["pid"] == daemon.pid
    finally:
        daemon.stop()


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_damaged_server_json_never_leads_to_a_second_daemon(tmp_path: Path, damage: str) -> None:
    daemon = Daemon(tmp_path / "config")
    try:
        server_json = daemon.config / "server.json"
        if damage == "corrupt":
            server_json.write_text('{"url": "http://127.0.0.1:1", "tok')
        else:
            server_json.unlink()
        listed = subprocess.run(
            [sys.executable, "-m", "mldbg", "sessions", "--json"],
            env=daemon.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert listed.returncode == 0, listed.stderr
        assert "sessions" in json.loads(listed.stdout)
        # still one daemon: the first, which the CLI found through its lock
        assert daemon.process.poll() is None
        assert daemon.api.get("/v1/health")["pid"] == daemon.pid
        assert serving(daemon.config) in ([daemon.pid], None)
    finally:
        daemon.stop()


def test_the_cli_waits_for_a_daemon_that_holds_the_lock(tmp_path: Path) -> None:
    """A lock held, no description yet (a daemon starting, or stuck): never a second one."""
    config = tmp_path / "config"
    config.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time\n"
            f"f = open({str(config / 'daemon.lock')!r}, 'w')\n"
            "fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(300)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        env = {**__import__("os").environ, "MLDBG_CONFIG_DIR": str(config)}
        result = subprocess.run(
            [sys.executable, "-m", "mldbg", "sessions", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert result.returncode != 0
        assert "daemon_busy" in result.stdout + result.stderr or "busy" in result.stderr
        assert serving(config) in ([], None)  # no second daemon was started
        assert not (config / "server.json").exists()
    finally:
        holder.kill()
        holder.wait()


def test_forty_waits_do_not_starve_the_daemon(api, write, tmp_path: Path) -> None:
    """Health and status answer while 50 long waits are pending (no timing threshold:
    the check is that they answer *before* the waits return)."""
    script = write("busy.py", "import time\nwhile True:\n    time.sleep(0.05)\n")
    call(api.client, "start", "loaded", **start_body(script, tmp_path, stop_on_entry=False))
    returned: list[float] = []
    lock = threading.Lock()

    def wait() -> None:
        import httpx

        with httpx.Client(base_url=api.info["url"], headers=api.http.headers, timeout=90) as c:
            c.post("/v1/sessions/loaded/wait", json={"wait": 30})
        with lock:
            returned.append(time.monotonic())

    threads = [threading.Thread(target=wait, daemon=True) for _ in range(50)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(2)  # let every wait reach the daemon (fewer would only make this easier)
        assert not returned
        assert api.get("/v1/health")["ok"] is True
        assert call(api.client, "status", "loaded")["state"] == "running"
        assert call(api.client, "sessions", None)["total"] >= 1
        answered = time.monotonic()
        assert not returned, "the waits returned before health answered: it was starved"
    finally:
        call(api.client, "terminate", "loaded")  # ends every wait at once
        for thread in threads:
            thread.join(60)
    assert len(returned) == 50 and min(returned) >= answered


def _pretend_older(daemon: Daemon) -> None:
    """Make the running daemon look started by another mldbg (an upgrade since): both
    descriptions it wrote, server.json and its lock's copy (which clients trust first)."""
    for path in (daemon.config / "server.json", daemon.config / "daemon.lock"):
        info = json.loads(path.read_text())
        info.pop("verbs", None)  # what a daemon from before the fingerprint publishes
        path.write_text(json.dumps(info))


def _cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mldbg", *args],
        env=daemon.env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_daemon_from_another_mldbg_is_replaced_when_idle_refused_when_busy(
    write, tmp_path: Path
) -> None:
    """After an upgrade the old daemon still runs the old code while it launches the new
    agent from disk: every start would fail obscurely.  The CLI sees the verb table's and
    protocol's fingerprint differ: an idle daemon is replaced; one running sessions is not
    (they would be stranded), and the error names them and the way out."""
    busy = Daemon(tmp_path / "busy")
    try:
        _start(busy, write, tmp_path, "victim", "")
        _pretend_older(busy)
        refused = _cli(busy, "status", "--session", "victim", "--json")
        assert refused.returncode != 0
        answer = json.loads(refused.stdout or refused.stderr)
        assert answer["code"] == "daemon_skew" and answer["sessions"] == ["victim"], answer
        assert "mldbg serve --stop" in answer["error"]
        assert busy.process.poll() is None  # its session was not stranded
        stopped = _cli(busy, "serve", "--stop")  # reaches whichever daemon runs
        assert stopped.returncode == 0, stopped.stderr
        busy.process.wait(60)
    finally:
        busy.stop()
    idle = Daemon(tmp_path / "idle")
    try:
        _pretend_older(idle)
        listed = _cli(idle, "sessions", "--json")
        assert listed.returncode == 0, listed.stderr
        assert "was replaced" in listed.stderr
        idle.process.wait(60)  # the old one is gone
        fresh = json.loads((idle.config / "server.json").read_text())
        assert fresh["pid"] != idle.pid and fresh["verbs"] == verbs.fingerprint()
        kill_quietly(fresh["pid"])
    finally:
        idle.stop()


def test_a_daemon_of_another_installation_is_replaced_when_idle(tmp_path: Path) -> None:
    """A daemon started from another copy of mldbg (another checkout or virtualenv, or a
    worktree removed since) publishes the same verb table, but launches the debuggee's
    agent from its own files, which may differ or be gone (an ImportError mid-session):
    the CLI of this copy replaces it when idle, as it does a daemon of another version."""
    import shutil

    import mldbg

    other = tmp_path / "other"
    shutil.copytree(
        Path(mldbg.__file__).parent, other / "mldbg", ignore=shutil.ignore_patterns("__pycache__")
    )
    stale = Daemon(tmp_path / "config", env={"PYTHONPATH": str(other)})
    try:
        assert stale.info["package"] == str((other / "mldbg").resolve())
        assert stale.info["verbs"] == verbs.fingerprint()  # the same table: not enough
        ours = {k: v for k, v in stale.env.items() if k != "PYTHONPATH"}
        listed = subprocess.run(
            [sys.executable, "-m", "mldbg", "sessions", "--json"],
            env=ours,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert listed.returncode == 0, listed.stderr
        assert "was replaced" in listed.stderr and str(other) in listed.stderr, listed.stderr
        stale.process.wait(60)
        fresh = json.loads((stale.config / "server.json").read_text())
        assert fresh["package"] == str(Path(mldbg.__file__).resolve().parent), fresh
        kill_quietly(fresh["pid"])
    finally:
        stale.stop()
