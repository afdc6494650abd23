"""A bad start changes nothing; a session in any state can be ended.

Each bad request answers 4xx with a code naming the argument, leaves no session behind
(the previous session of that name keeps its place), and never a 500.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from daemons import Daemon, start_body, wait_until

from conftest import Api, call

SCRIPT = "x = 1\nprint('ran', x)\n"


def _refused(api: Api, name: str, body: dict[str, Any]) -> dict[str, Any]:
    response = api.http.post(f"/v1/sessions/{name}/start", json=body)
    assert 400 <= response.status_code < 500, response.text
    return response.json()  # type: ignore[no-any-return]


BAD_REQUESTS = [
    ("nul-in-arg", {"args": ["ok", "bad\0arg"]}, "args[1]"),
    ("nul-in-env-value", {"env": {"A": "x\0y"}}, "env"),
    ("equals-in-env-name", {"env": {"A=B": ""}}, "env"),
    ("empty-env-name", {"env": {"": "x"}}, "env"),
    ("nul-in-env-name", {"env": {"A\0": "x"}}, "env"),
    ("nul-in-base-env", {"base_env": {"PATH": "/bin\0"}}, "base_env"),
    ("nul-in-script", {"script": "a\0.py"}, "script"),
    ("nul-in-cwd", {"cwd": "/tmp\0x"}, "cwd"),
    ("nul-in-python", {"python": "/usr/bin/python\0"}, "python"),
]


@pytest.mark.parametrize(
    ("case", "change", "argument"), BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS]
)
def test_bad_start_requests_change_nothing(
    api: Api, write, tmp_path: Path, case: str, change: dict[str, Any], argument: str
) -> None:
    script = write("ok.py", SCRIPT)
    name = f"bad-{case}"
    runs_before = set((tmp_path / ".mldbg" / "runs").glob("*"))
    error = _refused(api, name, {**start_body(script, tmp_path), **change})
    assert error["code"] == "bad_argument" and error["argument"].startswith(argument)
    assert "NUL" in error["error"] or "=" in error["error"] or "name" in error["error"]
    assert call(api.client, "status", name, 404)["code"] == "unknown_session"
    assert set((tmp_path / ".mldbg" / "runs").glob("*")) == runs_before  # nothing created


def test_env_name_with_equals_through_the_typed_client(daemon, config_dir, write, tmp_path) -> None:
    """What an agent sends through MCP (``env={"A=B": ""}``) reaches the same check."""
    from mldbg.client.api import Client, DaemonError

    script = write("ok.py", SCRIPT)
    client = Client(daemon)
    with pytest.raises(DaemonError) as raised:
        client.call("start", "mcp-env", script=str(script), env={"A=B": ""}, cwd=str(tmp_path))
    assert raised.value.status == 400 and raised.value.code == "bad_argument"
    assert "'A=B'" in raised.value.message


@pytest.mark.parametrize("kind", ["missing", "a-file", "not-executable"])
def test_bad_cwd_or_python_is_refused_before_anything_starts(
    api: Api, write, tmp_path: Path, kind: str
) -> None:
    script = write("ok.py", SCRIPT)
    plain = write("plain.txt", "not a program\n")
    change: dict[str, Any] = {
        "missing": {"cwd": str(tmp_path / "nowhere")},
        "a-file": {"cwd": str(plain)},
        "not-executable": {"python": str(plain)},
    }[kind]
    error = _refused(api, f"badpath-{kind}", {**start_body(script, tmp_path), **change})
    assert error["code"] == "start_failed" and error["argument"] in ("cwd", "python")
    api.get(f"/v1/sessions/badpath-{kind}", expect=404)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every directory")
def test_unreadable_cwd_is_refused(api: Api, write, tmp_path: Path) -> None:
    script = write("ok.py", SCRIPT)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o000)
    try:
        error = _refused(api, "locked-cwd", {**start_body(script, tmp_path), "cwd": str(locked)})
        assert error["code"] == "start_failed" and "not readable" in error["error"]
    finally:
        locked.chmod(0o700)


def test_unwritable_run_store_is_refused_and_the_previous_session_kept(
    api: Api, write, tmp_path: Path
) -> None:
    script = write("ok.py", SCRIPT)
    first = call(api.client, "start", "store-gone", **start_body(script, tmp_path))
    call(api.client, "terminate", "store-gone")
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where the run store should be\n")
    body = start_body(script, tmp_path)
    body["base_env"]["MLDBG_HOME"] = str(blocker / "home")
    error = _refused(api, "store-gone", body)
    assert error["code"] == "store_unwritable"
    kept = call(api.client, "status", "store-gone")
    assert kept["run_id"] == first["run_id"] and kept["state"] == "exited"


def _start_in_background(api: Api, name: str, body: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = {}

    def run() -> None:
        response = api.http.post(f"/v1/sessions/{name}/start", json=body)
        answer["status"], answer["body"] = response.status_code, response.json()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    answer["thread"] = thread
    wait_until(
        lambda: (
            api.http.get(f"/v1/sessions/{name}").status_code == 200
            and call(api.client, "status", name)["state"] == "starting"
        ),
        what="the session to show as starting",
    )
    return answer


@pytest.mark.parametrize("how", ["terminate", "delete", "replace"])
def test_a_start_in_progress_can_always_be_ended(api: Api, write, tmp_path: Path, how: str) -> None:
    from daemons import alive, slow_python

    script = write("ok.py", SCRIPT)
    name = f"midstart-{how}"
    body = start_body(script, tmp_path, python=str(slow_python(tmp_path, 60)))
    pending = _start_in_background(api, name, body)
    pid = call(api.client, "status", name)["pid"]
    if how == "terminate":
        state = call(api.client, "terminate", name)
        assert state["state"] == "exited" and state["terminated"] is True
    elif how == "delete":
        assert api.http.delete(f"/v1/sessions/{name}").status_code == 200
    else:
        state = call(api.client, "start", name, **start_body(script, tmp_path, replace=True))
        assert state["state"] == "paused"
    pending["thread"].join(60)
    assert pending["status"] == 400 and pending["body"]["code"] == "start_failed"
    assert pid is None or wait_until(lambda: not alive(pid), 30, "the slow interpreter to end")
    if how == "replace":
        assert call(api.client, "status", name)["state"] == "paused"
        call(api.client, "terminate", name)
    else:  # the start failed: it leaves no session behind (there was none before)
        assert call(api.client, "status", name, 404)["code"] == "unknown_session"


def test_serve_stop_ends_a_daemon_with_a_start_in_progress(write, tmp_path: Path) -> None:
    import subprocess

    from daemons import alive, slow_python

    script = write("ok.py", SCRIPT)
    daemon = Daemon(tmp_path / "config")
    try:
        body = start_body(script, tmp_path, python=str(slow_python(tmp_path, 60)))
        pending = _start_in_background(daemon.api, "stuck", body)
        pid = call(daemon.api.client, "status", "stuck")["pid"]
        stopped = subprocess.run(
            [sys.executable, "-m", "mldbg", "serve", "--stop"],
            env=daemon.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert stopped.returncode == 0, stopped.stderr
        assert daemon.process.wait(60) == 0
        pending["thread"].join(60)
        assert pid is None or wait_until(lambda: not alive(pid), 30, "the debuggee to end")
        assert not (daemon.config / "server.json").exists()
    finally:
        daemon.stop()
