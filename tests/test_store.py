"""The run store and the daemon's files under bad conditions: full disks, bad paths, corrupt files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Session, line_of
from mldbg.server.sessions import Session as DaemonSession
from mldbg.server.sessions import StartRequest
from mldbg.store.runs import JsonlWriter, create_run_dir, make_run_id, write_json_atomic


def test_run_ids_are_safe_and_unique(tmp_path: Path) -> None:
    assert make_run_id("my model/../x", 42, 0).endswith("-42")
    assert "/" not in make_run_id("a/b", 1)
    first = create_run_dir(tmp_path, "train", 7)
    second = create_run_dir(tmp_path, "train", 7)  # same second, same pid: never overwritten
    assert first.path != second.path and first.path.exists() and second.path.exists()
    assert (tmp_path / "latest").resolve() == second.path.resolve()


def test_atomic_json_never_leaves_half_a_file(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    write_json_atomic(target, {"state": "running"})
    with pytest.raises(TypeError):
        write_json_atomic(target, {1j: 1})  # a key JSON cannot hold
    assert json.loads(target.read_text()) == {"state": "running"}


def test_full_disk_is_reported_not_fatal(tmp_path: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    writer = JsonlWriter(Path("/dev/full"))
    with pytest.raises(OSError):
        writer.append({"event": "x"})
    session = DaemonSession("disk", StartRequest(script="x.py"))
    session.log.open(Path("/dev/full"))
    session.log.event("stopped", line=3)  # must not raise
    assert "could not write /dev/full" in str(session.log.error)
    assert "could not write /dev/full" in session.snapshot()["store_error"]


def test_unwritable_run_store_refuses_to_start(session: Session, write) -> None:
    script = write("ok.py", "print('x')\n")
    env = {**os.environ, "MLDBG_HOME": "/dev/null/not-a-dir"}
    error = session.start(script, python=sys.executable, env=env, expect=400)
    assert "cannot create the run directory" in error["error"]


def test_kill_mid_run_leaves_every_record_readable(session: Session, write) -> None:
    script = write(
        "steps.py",
        """
        import time
        for i in range(1000):
            value = i * 2  # loop
        time.sleep(60)
    """,
    )
    session.start(
        script,
        python=sys.executable,
        breakpoints=[{"file": str(script), "line": line_of(script, "loop")}],
    )
    for _ in range(5):
        session.cont()
        session.eval("i * 2")
    state = session.state()
    os.kill(state["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (final := session.state())["state"] == "paused" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert final["state"] == "crashed"
    run_dir = Path(final["run_dir"])
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "eval" for e in events) == 5
    assert events[-1]["event"] == "ended" and events[-1]["signal"] == "SIGKILL"
    assert json.loads((run_dir / "run.json").read_text())["state"] == "crashed"


def test_corrupt_server_json_is_replaced_by_a_fresh_daemon(tmp_path: Path) -> None:
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "server.json").write_text("{not json")
    env = {**os.environ, "MLDBG_CONFIG_DIR": str(config)}
    run = [sys.executable, "-m", "mldbg"]
    try:
        result = subprocess.run(
            [*run, "sessions", "--json"], env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["sessions"] == []
        info = json.loads((config / "server.json").read_text())
        assert info["url"].startswith("http://127.0.0.1:")
    finally:
        subprocess.run([*run, "serve", "--stop"], env=env, capture_output=True, timeout=60)
    deadline = time.monotonic() + 10
    while (config / "server.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def test_code_made_in_a_loop_is_not_cached_forever(tmp_path: Path) -> None:
    """eval / namedtuple / torch.fx make new code objects; the tracer must not keep them all."""
    from mldbg.agent.breakpoints import BreakpointTable, make_breakpoint
    from mldbg.agent.debugger import Debugger
    from mldbg.agent.tracer_settrace import SettraceBackend

    script = tmp_path / "m.py"
    script.write_text("def f():\n    return 1\n")
    debugger = Debugger(None, str(tmp_path), SettraceBackend)  # type: ignore[arg-type]
    table: BreakpointTable = debugger.breakpoints
    table.add(make_breakpoint(str(script), 2))
    backend = SettraceBackend(debugger)
    for i in range(2000):
        code = compile(f"x + {i}", "<string>", "eval")
        assert table.lines_in_code(code, "<string>") == frozenset()
        backend._global(type("F", (), {"f_code": code})(), "call", None)
    assert len(table._code_cache) == 0
    assert len(backend._decisions) == 0 and len(backend._files) == 1
