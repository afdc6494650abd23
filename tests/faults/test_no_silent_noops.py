"""No silent no-ops: what a zero-edit capture could not do is said, and what mldbg does to
the model's tensors is never recorded as the model's.

* ``--capture-model`` whose pattern matches no model captures nothing: the script's
  stderr says so, naming the classes that were called, and so does run.json
  (``capture_problems``): with no capture made there is no capture.json to say it in.
* ``--capture-ops`` records the operations of the model's code; mldbg's own tensor work
  inside a wanted module (a checkpoint's summary, ``debug_save``'s copy, an evaluation or
  a variables listing at a breakpoint there) is not the model's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from conftest import Session, line_of, wait_until

pytest.importorskip("torch")

PORT = """
import torch
import mldbg

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        h = torch.relu(self.lin(x))
        mldbg.debug_checkpoint("inside", h=h)
        mldbg.debug_save(h, "inside-block")
        y = h * 2  # stop here
        return self.norm(y)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.block(x))

torch.manual_seed(0)
net = Net()
with torch.no_grad():
    print("out", net(torch.randn(4, 8)).sum().item())
"""


def _run_to_end(session: Session) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        state: dict[str, Any] = session.wait(10.0)
        if state["state"] == "paused":
            state = session.cont(10.0)
        return None if state["state"] in ("starting", "running", "paused") else state

    state: dict[str, Any] = wait_until(ended, 120, "the script to end")
    assert state.get("exit_code") == 0, (state, session.output())
    return state


def _env(session: Session) -> dict[str, str]:
    return {**os.environ, "MLDBG_HOME": str(session.cwd / ".mldbg")}  # debug_save's store too


def test_a_model_pattern_that_matches_nothing_is_said(session: Session, write: Any) -> None:
    script = write("port.py", PORT.replace('mldbg.debug_save(h, "inside-block")', ""))
    session.start(
        script,
        env=_env(session),
        stop_on_entry=False,
        capture="port",
        capture_models=["NoSuchClass*"],
    )
    state = _run_to_end(session)
    output = session.output()
    assert "NoSuchClass*" in output and "no model" in output, output
    assert "Net" in output  # the classes that were called: what the pattern could name
    meta = json.loads((Path(state["run_dir"]) / "run.json").read_text())
    (problem,) = meta["capture_problems"]
    assert "NoSuchClass*" in problem and "Net" in problem, meta
    assert not list(Path(state["run_dir"]).glob("captures/*"))  # nothing was captured


def test_capture_ops_records_the_models_operations_only(session: Session, write: Any) -> None:
    script = write("port.py", PORT)
    line = line_of(script, "stop here")
    session.start(
        script,
        env=_env(session),
        stop_on_entry=False,
        capture="port",
        capture_ops=["block"],
        breakpoints=[{"file": str(script), "line": line}],
    )
    stop = session.wait(60.0)
    while stop["state"] == "paused" and stop["location"]["line"] != line:
        stop = session.cont(30.0)  # the checkpoint's own stop
    assert stop["state"] == "paused" and stop["location"]["line"] == line, stop
    # the debugger's own tensor work, on the model's thread, inside the wanted module
    assert session.value("float(h.detach().cpu().clone().numpy().sum())")
    session.api.get(f"{session.base}/vars")
    state = _run_to_end(session)
    (index,) = Path(state["run_dir"]).glob("captures/port/index.jsonl")
    calls = [json.loads(x) for x in index.read_text().splitlines()]
    ops = [c["class"] for c in calls if c["event"] == "call" and c["class"].startswith("op:")]
    assert ops == [
        "op:linear",
        "op:linear.without_bias",
        "op:relu",
        "op:mul",
        "op:layer_norm",
    ], ops
