"""The real ``mldbg`` command: every verb in human form and ``--json``, and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import line_of

SCRIPT = """
import sys

def scale(values, factor):
    out = [v * factor for v in values]  # in scale
    return out

data = [1, 2, 3]
result = scale(data, 2)  # call scale
print("result", result, sys.argv[1:])
"""


def test_full_session_through_the_cli(cli, write) -> None:
    script = write("prog.py", SCRIPT)
    inside, call = line_of(script, "in scale"), line_of(script, "call scale")
    session = ["--session", "clifull"]

    state = cli(
        "start",
        *session,
        "prog.py",
        "--break",
        f"prog.py:{inside}",
        "--",
        "--verbose",
        json_out=True,
    )
    assert (
        state["state"] == "paused" and state["reason"] == "entry" and state["session"] == "clifull"
    )
    assert set(state) >= {
        "session",
        "state",
        "reason",
        "location",
        "pid",
        "exit_code",
        "signal",
        "exception",
    }
    assert state["location"]["code"][0] == [1, "import sys"]

    human = cli("breaks", *session).stdout
    assert f"prog.py:{inside}" in human and "hit 0x" in human
    assert (
        cli("break", *session, "prog.py", str(call), "--if", "len(data) == 3", json_out=True)[
            "condition"
        ]
        == "len(data) == 3"
    )

    state = cli("continue", *session, json_out=True)
    assert state["reason"] == "breakpoint" and state["location"]["line"] == call
    human = cli("status", *session).stdout
    assert f"paused (breakpoint) at {script.resolve()}:{call}" in human and "->" in human

    state = cli("continue", *session, json_out=True)
    assert state["location"]["line"] == inside
    stack = cli("stack", *session, json_out=True)
    assert [f["function"] for f in stack["frames"]] == ["scale", "<module>"]
    assert "#1" in cli("stack", *session).stdout

    result = cli("eval", *session, "values[-1] * factor", json_out=True)
    assert result == {
        "expression": "values[-1] * factor",
        "result": "6",
        "type": "int",
        "summary": result["summary"],
        "output": "",  # what the evaluated code printed
    }
    assert (
        cli("eval", *session, "-", stdin="import math\nmath.floor(factor * 2.5)\n").stdout.strip()
        == "5"
    )

    variables = cli("vars", *session, json_out=True)["variables"]
    assert {v["name"] for v in variables} == {"values", "factor", "math"}  # math: imported by eval
    assert "factor" in cli("vars", *session).stdout

    up = cli("up", *session, json_out=True)
    assert up["selected"] == 1 and up["frame"]["function"] == "<module>"
    assert cli("eval", *session, "data", json_out=True)["result"] == "[1, 2, 3]"
    assert cli("down", *session, json_out=True)["selected"] == 0
    assert cli("frame", *session, "1", json_out=True)["frame"]["function"] == "<module>"
    location = cli("location", *session, json_out=True)
    assert location["location"]["line"] == call and location["frame_index"] == 1

    state = cli("step", *session, "over", json_out=True)
    assert state["reason"] == "step" and state["location"]["function"] == "scale"
    state = cli("step", *session, "out", json_out=True)
    assert state["location"]["function"] == "<module>"

    assert cli("remove", *session, f"prog.py:{inside}", json_out=True)["line"] == inside
    assert cli("clear", *session, json_out=True)["removed"] == 1
    state = cli("continue", *session, json_out=True)
    assert state["state"] == "exited" and state["exit_code"] == 0
    assert cli("output", *session).stdout == "result [2, 4, 6] ['--verbose']\n"
    assert (
        cli("output", *session, "--tail", "1", json_out=True)["output"]
        == "result [2, 4, 6] ['--verbose']\n"
    )
    sessions = cli("sessions", json_out=True)["sessions"]
    assert any(s["session"] == "clifull" and s["state"] == "exited" for s in sessions)
    assert "clifull" in cli("sessions").stdout


def test_errors_exit_nonzero_and_say_what_to_do(cli, write) -> None:
    error = cli("status", "--session", "nobody", json_out=True, expect=1)
    assert (
        error["code"] == "unknown_session"
        and "mldbg start" in error["error"]
        or "sessions:" in error["error"]
    )
    proc = cli("eval", "--session", "nobody", "1", expect=1)
    assert "no session named 'nobody'" in proc.stderr

    script = write("blank.py", "a = 1\n\nb = 2\n")
    cli("start", "--session", "clierr", "blank.py")
    try:
        error = cli("break", "--session", "clierr", "blank.py:2", json_out=True, expect=1)
        assert error["nearest_lines"] == [1, 3]
        assert (
            "nearest executable lines: 1, 3"
            in cli("break", "--session", "clierr", "blank.py:2", expect=1).stderr
        )
        error = cli("break", "--session", "clierr", "nowhere", json_out=True, expect=2)
        assert "FILE:LINE" in error["error"]
        proc = cli("eval", "--session", "clierr", "1/0", expect=1)
        assert "ZeroDivisionError" in proc.stderr
        proc = cli("up", "--session", "clierr")  # past the outermost frame: stays, says so
        assert "already at the outermost frame" in proc.stdout
        proc = cli("frame", "--session", "clierr", "1", expect=1)
        assert "no frame 1" in proc.stderr
        error = cli("start", "--session", "clierr", "blank.py", json_out=True, expect=1)
        assert error["code"] == "session_busy"
        assert (
            cli("start", "--session", "clierr", "--replace", "blank.py", json_out=True)["state"]
            == "paused"
        )
    finally:
        cli("terminate", "--session", "clierr", expect=None)
    error = cli("start", "--session", "clierr2", "missing.py", json_out=True, expect=1)
    assert "no such script: missing.py" in error["error"]
    proc = cli("step", "sideways", expect=2)
    assert "invalid choice" in proc.stderr
    assert script.exists()


def test_continue_waits_with_progress_and_max_wait(cli, write) -> None:
    write("slow.py", "import time\nfor _ in range(100):\n    time.sleep(0.1)\nprint('done')\n")
    cli("start", "--session", "cliwait", "slow.py")
    try:
        state = cli("continue", "--session", "cliwait", "--max-wait", "1.5", json_out=True)
        assert state["state"] == "running"
        # continue on a running script just waits (with --no-wait: not at all)
        assert (
            cli("continue", "--session", "cliwait", "--no-wait", json_out=True)["state"]
            == "running"
        )
        state = cli("pause", "--session", "cliwait", json_out=True)
        assert state["state"] == "paused" and state["reason"] == "pause"
        state = cli("continue", "--session", "cliwait", "--no-wait", json_out=True)
        assert state["state"] == "running"
        state = cli("terminate", "--session", "cliwait", json_out=True)
        assert state["state"] == "exited" and state["terminated"] is True
    finally:
        cli("terminate", "--session", "cliwait", expect=None)


def test_cli_starts_the_daemon_on_demand(tmp_path: Path, write) -> None:
    """A fresh config directory: the first command starts a daemon, later ones reuse it."""
    config = tmp_path / "fresh-config"
    script = write("hello.py", "print('hi')\n")
    env = {**os.environ, "MLDBG_CONFIG_DIR": str(config)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mldbg", *args],
            cwd=script.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    try:
        first = run("start", "--run", "hello.py", "--json")
        assert first.returncode == 0, first.stderr
        info = json.loads((config / "server.json").read_text())
        assert run("sessions", "--json").returncode == 0
        assert json.loads((config / "server.json").read_text())["pid"] == info["pid"]
    finally:
        stopped = run("serve", "--stop")
    assert stopped.returncode == 0, stopped.stderr
    deadline = time.monotonic() + 10
    while (config / "server.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (config / "server.json").exists()
    again = run("serve", "--stop")  # nothing to stop: what was asked holds, and it says so
    assert again.returncode == 0 and "no mldbg daemon is running" in again.stdout, again
    assert json.loads(run("serve", "--stop", "--json").stdout) == {
        "stopped": False,
        "running": False,
    }
    assert not (config / "server.json").exists()  # and it started none


def test_help_and_store_verbs_with_a_session(cli, write) -> None:
    """Regressions: `break --help` crashed on a literal % in its help; `runs -s X` and
    `checkpoints -s X` crashed in the client (session given twice)."""
    proc = cli("break", "--help")
    assert "--hits" in proc.stdout and "--condition" in proc.stdout
    write(
        "tick.py", "from mldbg import debug_checkpoint\ndebug_checkpoint('tick', skip=True, i=1)\n"
    )
    cli("start", "-s", "storeverbs", "tick.py")
    try:
        # --condition: the spelling pdb/debugpy users bring, the same as --if
        bp = cli(
            "break", "-s", "storeverbs", "tick.py", "2", "--condition", "1 + 1 == 2", json_out=True
        )
        assert bp["condition"] == "1 + 1 == 2" and bp["line"] == 2
        assert cli("continue", "-s", "storeverbs", json_out=True)["location"]["line"] == 2
        assert cli("continue", "-s", "storeverbs", json_out=True)["state"] == "exited"
        runs = cli("runs", "-s", "storeverbs", json_out=True)
        assert runs["runs"] and runs["runs"][0]["script"].endswith("tick.py")
        listed = cli("checkpoints", "-s", "storeverbs", json_out=True)
        assert [r["checkpoint_name"] for r in listed["checkpoints"]] == ["tick"]
        unknown = cli("runs", "-s", "nobody", json_out=True, expect=1)
        assert unknown["code"] == "unknown_session"
    finally:
        cli("terminate", "-s", "storeverbs", expect=None)


def test_demo_runs_end_to_end(cli) -> None:
    result = cli("demo", json_out=True)
    assert result["ok"] is True
    commands = [step["command"] for step in result["transcript"]]
    assert commands[0].startswith("mldbg start --session demo --run --break tiny_transformer.py:")
    assert any("weights.sum(-1)" in c for c in commands)
    human = cli("demo").stdout
    assert "Found: attention rows sum to 1" in human
