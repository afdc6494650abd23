"""debug_checkpoint: records checked value by value, pausing under the debugger, and the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import Session, line_of

torch = pytest.importorskip("torch")

SCRIPT = """
import torch
from mldbg import debug_checkpoint

torch.manual_seed(0)
x = torch.randn(4, 5)
for step in range(3):
    y = torch.tanh(x * (step + 1))
    debug_checkpoint("layer", skip=True, y=y, step=step, metadata={"lr": 0.1})  # layer
h = torch.ones(3, dtype=torch.bfloat16) / 3
debug_checkpoint("final", skip=True)  # final
torch.save({"x": x}, "x.pt")
print("done")
"""


def run_plain(tmp_path: Path, source: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(source.lstrip())
    full_env = {**os.environ, "MLDBG_HOME": str(tmp_path / ".mldbg"), **env}
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def records(tmp_path: Path) -> list[dict[str, Any]]:
    path = (tmp_path / ".mldbg" / "latest" / "checkpoints.jsonl").resolve()
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_match_independent_computations(tmp_path: Path) -> None:
    result = run_plain(tmp_path, SCRIPT)
    assert result.returncode == 0, result.stderr
    recs = records(tmp_path)
    assert [(r["checkpoint_name"], r["hit_count"]) for r in recs] == [
        ("layer", 1),
        ("layer", 2),
        ("layer", 3),
        ("final", 1),
    ]
    x = torch.load(tmp_path / "x.pt")["x"]
    script = tmp_path / "prog.py"
    for step, rec in enumerate(recs[:3]):
        y = torch.tanh(x * (step + 1)).numpy().astype(np.float64)
        stats = rec["variables"]["y"]["stats"]
        assert stats["min"] == pytest.approx(y.min(), rel=1e-6)
        assert stats["max"] == pytest.approx(y.max(), rel=1e-6)
        assert stats["mean"] == pytest.approx(y.mean(), rel=1e-5, abs=1e-7)
        assert stats["std"] == pytest.approx(y.std(ddof=1), rel=1e-5)
        assert rec["variables"]["y"]["preview"] == pytest.approx(
            y.reshape(-1)[:8].tolist(), rel=1e-6
        )
        # Plain values: {"type", "value"} (the documented jq recipes select .value) ...
        assert rec["variables"]["step"]["value"] == step
        assert rec["variables"]["step"]["type"] == "int"
        assert rec["values"]["step"] == step  # ... and bare in the first release's field
        assert rec["variables"]["y"]["dtype"] == "float32"
        assert rec["variables"]["y"]["dtype_qualified"] == "torch.float32"
        stamp = datetime.fromisoformat(rec["timestamp"])
        assert stamp.tzinfo is not None
        assert abs(stamp.timestamp() - rec["timestamp_unix"]) < 1e-3
        assert rec["metadata"] == {"lr": 0.1}
        assert rec["location"] == {
            "file": str(script),
            "line": line_of(script, "# layer"),
            "function": "<module>",
        }
        context = rec["code_context"]
        assert (
            context["lines"][str(line_of(script, "# layer"))].strip().startswith("debug_checkpoint")
        )
        assert context["start_line"] <= line_of(script, "# layer") <= context["end_line"]
    final = recs[3]["variables"]
    assert set(final) == {"x", "y", "h"}  # no keywords: the caller's local tensors
    assert final["h"]["dtype"] == "bfloat16" and final["h"]["dtype_qualified"] == "torch.bfloat16"
    assert final["h"]["stats"]["mean"] == pytest.approx(
        float(torch.ones(3, dtype=torch.bfloat16)[0] / 3), rel=1e-6
    )
    run = json.loads((tmp_path / ".mldbg" / "latest" / "run.json").read_text())
    assert run["kind"] == "plain" and run["state"] == "exited" and run["pid"] > 0


def test_mlx_arrays_in_checkpoints(tmp_path: Path) -> None:
    mx = pytest.importorskip("mlx.core")
    result = run_plain(
        tmp_path,
        """
from mldbg import debug_checkpoint
import mlx.core as mx
a = mx.arange(10, dtype=mx.float32)
lazy = mx.exp(a / 10).astype(mx.bfloat16)
debug_checkpoint("mlx", lazy=lazy)
pending = mx.ones((64, 64)) * 3
debug_checkpoint("locals")  # the caller's locals: a lazy one is not run early
""",
    )
    assert result.returncode == 0, result.stderr
    taken = records(tmp_path)[1]["variables"]["pending"]
    assert taken["shape"] == [64, 64] and taken["dtype"] == "float32"
    assert taken["evaluated"] is False and taken["stats"] is None and "lazy" in taken["note"]
    summary = records(tmp_path)[0]["variables"]["lazy"]
    expected = np.array(
        mx.exp(mx.arange(10, dtype=mx.float32) / 10).astype(mx.bfloat16).astype(mx.float32).tolist()
    )
    assert summary["type"] == "mlx.core.array" and summary["dtype"] == "bfloat16"
    assert summary["dtype_qualified"] == "mlx.core.bfloat16"
    assert summary["stats"]["max"] == pytest.approx(expected.max(), rel=1e-6)
    assert summary["stats"]["mean"] == pytest.approx(expected.mean(), rel=1e-5)


def test_off_switch_is_a_cheap_no_op(tmp_path: Path) -> None:
    result = run_plain(
        tmp_path,
        """
import timeit
from mldbg import debug_checkpoint
n = 200_000
best = min(timeit.repeat(lambda: debug_checkpoint("x", a=1), number=n, repeat=5)) / n
empty = min(timeit.repeat(lambda: None, number=n, repeat=5)) / n
print(best - empty)
""",
        MLDBG_CHECKPOINTS="off",
    )
    assert result.returncode == 0, result.stderr
    per_call = float(result.stdout)
    assert per_call < 1e-6, f"{per_call * 1e9:.0f} ns per disabled call"
    assert not (tmp_path / ".mldbg").exists()  # nothing written


def test_kill_leaves_earlier_records_readable(tmp_path: Path, cli) -> None:
    result = run_plain(
        tmp_path,
        """
import os, signal
from mldbg import debug_checkpoint
for i in range(50):
    debug_checkpoint("tick", i=i)
os.kill(os.getpid(), signal.SIGKILL)
""",
    )
    assert result.returncode == -9
    recs = records(tmp_path)
    assert [r["variables"]["i"]["value"] for r in recs] == list(range(50))
    listed = cli("checkpoints", "--name", "tick", "--hit", "50", json_out=True)
    assert [r["variables"]["i"]["value"] for r in listed["checkpoints"]] == [49]
    with open((tmp_path / ".mldbg" / "latest" / "checkpoints.jsonl").resolve(), "a") as fh:
        fh.write('{"checkpoint_name": "half')  # a line cut short
    listed = cli("checkpoints", json_out=True)
    assert len(listed["checkpoints"]) == 20 and listed["unreadable_lines"] == 1
    assert listed["total"] == 50 and listed["truncated"]
    assert listed["next"] == {
        "verb": "checkpoints",
        "args": {"run": listed["run_id"], "limit": 20, "offset": 20},
    }
    listed = cli("checkpoints", "--limit", "100", json_out=True)
    assert len(listed["checkpoints"]) == 50 and not listed["truncated"]


def test_checkpoint_pauses_under_the_debugger(session: Session, write) -> None:
    script = write(
        "ck.py",
        """
        from mldbg import debug_checkpoint

        def block(i):
            hidden = [i] * 3
            debug_checkpoint("block", hidden=hidden, i=i)  # block
            return hidden

        for i in range(4):
            block(i)
        debug_checkpoint("quiet", skip=True, i=i)
        print("end")
    """,
    )
    state = session.start(script, python=sys.executable, stop_on_entry=False)
    state = session.wait()
    assert state["reason"] == "checkpoint"
    assert state["checkpoint"] == {"name": "block", "hit_count": 1}
    assert (
        state["location"]["line"] == line_of(script, "# block")
        and state["location"]["function"] == "block"
    )
    assert session.value("hidden") == "[0, 0, 0]"  # eval sees the caller's frame
    # Only the 3rd hit (i == 2) of "block" may pause from now on.
    session.brk(None, None, checkpoint="bl*", condition="i == 2")
    state = session.cont()
    assert state["checkpoint"] == {"name": "block", "hit_count": 3} and session.value("i") == "2"
    listed = session.call("breaks")["breakpoints"]
    assert listed == [
        {"id": listed[0]["id"], "checkpoint": "bl*", "condition": "i == 2", "hit_count": 1}
    ]
    state = session.step("over")
    assert state["reason"] == "step" and state["location"]["line"] == line_of(script, "# block") + 1
    final = session.run_to_end()
    assert final["exit_code"] == 0
    recs = [
        json.loads(line)
        for line in (Path(final["run_dir"]) / "checkpoints.jsonl").read_text().splitlines()
    ]
    assert [(r["checkpoint_name"], r["hit_count"]) for r in recs] == [
        ("block", n) for n in range(1, 5)
    ] + [("quiet", 1)]


def test_checkpoint_filter_errors(session: Session, write) -> None:
    script = write(
        "ck2.py",
        "from mldbg import debug_checkpoint\nfor i in range(3):\n    debug_checkpoint('c', i=i)\n",
    )
    session.start(script, python=sys.executable)
    error = session.brk(None, None, checkpoint="c", condition="i ==", expect=400)
    assert "not a valid Python expression" in error["error"]
    session.brk(None, None, checkpoint="c", condition="missing_name")
    state = session.cont()
    assert state["reason"] == "checkpoint" and "NameError" in state["condition_error"]
    removed = session.call("remove", checkpoint="c")
    assert removed["checkpoint"] == "c"
    error = session.call("remove", 400, checkpoint="c")
    assert "no checkpoint filter 'c'" in error["error"]


def test_runs_and_run_resolution(tmp_path: Path, cli) -> None:
    for _ in range(2):
        assert run_plain(tmp_path, SCRIPT).returncode == 0
    runs = cli("runs", json_out=True)["runs"]
    assert len(runs) == 2 and all(r["checkpoints"] == 4 and r["state"] == "exited" for r in runs)
    first = runs[1]["run_id"]  # newest first: the oldest run is the last listed
    assert cli("checkpoints", "--run", first, json_out=True)["run_id"] == first
    assert cli("checkpoints", "--run", runs[1]["path"], json_out=True)["run_id"] == first
    # newest first: the latest run is the first listed
    assert cli("checkpoints", "--run", "latest", json_out=True)["run_id"] == runs[0]["run_id"]
    error = cli("checkpoints", "--run", "prog-1999", json_out=True, expect=1)
    assert error["code"] == "unknown_run" and "prog-1999" in error["error"]
    # --name filters (it once reached the daemon as a session name: ignored, a glob refused)
    named = cli("checkpoints", "--name", "final", json_out=True)
    assert [r["checkpoint_name"] for r in named["checkpoints"]] == ["final"]
    globbed = cli("checkpoints", "--name", "lay*", "--hit", "2", json_out=True)
    assert [(r["checkpoint_name"], r["hit_count"]) for r in globbed["checkpoints"]] == [
        ("layer", 2)
    ]
    assert cli("checkpoints", "--name", "none?", json_out=True)["checkpoints"] == []
    human = cli("checkpoints", "--name", "final").stdout
    assert "final #1" in human and "bfloat16[3]" in human
    assert "prog" in cli("runs").stdout

    dry = cli("clean", "--keep", "1", "--dry-run", json_out=True)
    assert dry["removed"] == [first] and dry["dry_run"] is True
    assert len(cli("runs", json_out=True)["runs"]) == 2  # a dry run deletes nothing
    done = cli("clean", "--keep", "1", json_out=True)
    assert done["removed"] == [first] and done["freed_bytes"] > 0
    assert [r["run_id"] for r in cli("runs", json_out=True)["runs"]] == [runs[0]["run_id"]]
    assert cli("checkpoints", json_out=True)["run_id"] == runs[0]["run_id"]


def test_plain_values_jq_recipe_and_unjsonable_values(tmp_path: Path) -> None:
    """`.variables.NAME.value` works for every plain value, JSON-able or not."""
    result = run_plain(
        tmp_path,
        """
from mldbg import debug_checkpoint
class Opaque:
    def __repr__(self):
        return "Opaque(7)"
debug_checkpoint("plain", n=3, lr=0.5, opt="adam", sizes=[1, 2], obj=Opaque(), none=None)
""",
    )
    assert result.returncode == 0, result.stderr
    variables = records(tmp_path)[0]["variables"]
    assert {k: v["value"] for k, v in variables.items()} == {
        "n": 3,
        "lr": 0.5,
        "opt": "adam",
        "sizes": [1, 2],
        "obj": "Opaque(7)",
        "none": None,
    }
    assert variables["obj"]["type"] == "__main__.Opaque" and variables["lr"]["type"] == "float"
    jq = shutil.which("jq")
    if jq:  # the seeds' documented recipe, run for real where jq exists
        path = (tmp_path / ".mldbg" / "latest" / "checkpoints.jsonl").resolve()
        out = subprocess.run(
            [jq, "-c", 'select(.checkpoint_name == "plain") | .variables.n.value', str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == "3"


def test_run_store_is_ignored_by_git(tmp_path: Path) -> None:
    """`git add -A` in the project never commits the run store."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    subprocess.run([git, "init", "-q", str(tmp_path)], check=True)
    assert run_plain(tmp_path, SCRIPT).returncode == 0
    assert (tmp_path / ".mldbg" / ".gitignore").read_text().splitlines()[-1] == "*"
    status = subprocess.run(
        [git, "status", "--porcelain", "--untracked-files=all"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert ".mldbg" not in status and "prog.py" in status, status


def test_two_runs_compared_by_name_and_hit(tmp_path: Path, cli) -> None:
    """The reference's and the port's records, each from its own repository's store."""
    reference, port = tmp_path / "reference", tmp_path / "port"
    reference.mkdir()
    port.mkdir()
    assert run_plain(reference, SCRIPT).returncode == 0
    ported = SCRIPT.replace(
        "y = torch.tanh(x * (step + 1))",
        "y = torch.tanh(x * (step + 1)) * (1.1 if step == 2 else 1.0)",
    )
    ported = ported.replace(
        'debug_checkpoint("final", skip=True)', 'debug_checkpoint("tail", skip=True, h=h)'
    )
    assert ported != SCRIPT and run_plain(port, ported).returncode == 0

    diff = cli(
        "compare-checkpoints",
        "port/.mldbg/latest",
        "--run",
        "reference/.mldbg/latest",
        json_out=True,
    )
    assert [(p["checkpoint_name"], p["hit_count"]) for p in diff["pairs"]] == [
        ("layer", 1),
        ("layer", 2),
        ("layer", 3),
    ]
    assert diff["unpaired_a"] == ["final#1"] and diff["unpaired_b"] == ["tail#1"]
    first, last = diff["pairs"][0]["variables"], diff["pairs"][2]["variables"]
    assert first["y"]["kind"] == "tensor" and first["y"]["shape_match"]
    assert first["y"]["stats_max_rel"] == 0 and first["y"]["preview_max_abs"] == 0
    y_ref = records(reference)[2]["variables"]["y"]["stats"]
    assert last["y"]["stats_b_minus_a"]["max"] == pytest.approx(y_ref["max"] * 0.1, rel=1e-5)
    assert last["y"]["stats_max_rel"] == pytest.approx(0.1 / 1.1, rel=1e-5)
    assert last["step"] == {"kind": "value", "a": 2, "b": 2, "equal": True, "b_minus_a": 0.0}
    only = cli(
        "compare-checkpoints",
        "port/.mldbg/latest",
        "--run",
        "reference/.mldbg/latest",
        "--name",
        "lay*",
        "--hit",
        "3",
        json_out=True,
    )
    assert len(only["pairs"]) == 1 and only["unpaired_a"] == []
    human = cli(
        "compare-checkpoints", "port/.mldbg/latest", "--run", "reference/.mldbg/latest"
    ).stdout
    assert (
        "layer #3" in human and "stats rel 0.09091" in human and "only in A (1): final#1" in human
    )
    # B is the reference ("this run against that one"): relative differences are on its
    # scale, as compare's are on its reference's (the port's values are 1.1 times its own)
    flipped = cli(
        "compare-checkpoints",
        "reference/.mldbg/latest",
        "--run",
        "port/.mldbg/latest",
        "--hit",
        "3",
        json_out=True,
    )
    assert flipped["pairs"][0]["variables"]["y"]["stats_max_rel"] == pytest.approx(0.1, rel=1e-5)
