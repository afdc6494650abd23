"""The run store's answers fit the result types the verb table declares for them.

Those TypedDicts (``results.py``) are what the MCP server validates every result against
before it sends it, and the REST schema: an answer that drifts from its type is a tool
error for an agent.  Real runs, recorded by real scripts, read back by the daemon's own
queries, validated by pydantic as the MCP server does.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from mldbg import verbs
from mldbg.server import store_queries
from mldbg.store import tensors as store
from mldbg.store.checkpoint_diff import compare_runs
from mldbg.text import render

pytest.importorskip("torch")

SCRIPT = """
import numpy as np
import torch
from mldbg import debug_checkpoint, debug_save

x = torch.linspace(-1, 1, 12).reshape(3, 4)
for step in range(2):
    debug_checkpoint("layer", skip=True, y=torch.tanh(x * (step + SCALE)), step=step, note="n")
debug_checkpoint("lazy", skip=True, metadata={"lr": 0.1})
debug_save(np.arange(6, dtype=np.float32).reshape(2, 3), "saved")
"""


def _record(directory: Path, scale: float) -> Path:
    """A plain run of the script (no debugger), in its own store; the store's home."""
    directory.mkdir()
    script = directory / "prog.py"
    script.write_text(SCRIPT.replace("SCALE", repr(scale)).lstrip())
    home = directory / ".mldbg"
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=directory,
        env={**os.environ, "MLDBG_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return home


def _fits(verb_name: str, answer: object) -> None:
    """As the MCP server checks a result: against the verb's declared type; and the CLI
    renders it."""
    TypeAdapter(verbs.get(verb_name).result).validate_python(answer)
    assert render.to_text(verb_name, answer)


def test_store_answers_fit_their_result_types(tmp_path: Path) -> None:
    reference = _record(tmp_path / "reference", 1.0)
    port = _record(tmp_path / "port", 1.5)

    runs = store_queries.runs(reference)
    _fits("runs", runs)
    assert runs["runs"][0]["checkpoints"] == 3 and runs["runs"][0]["state"] == "exited"

    listed = store_queries.checkpoints(reference, None)
    _fits("checkpoints", listed)
    first = listed["checkpoints"][0]
    assert first["checkpoint_name"] == "layer" and first["code_context"]["lines"]
    assert first["variables"]["note"] == {"type": "str", "value": "n", "repr": "'n'"}

    pairs = compare_runs(port, str(reference / "latest"), str(port / "latest"))
    _fits("compare-checkpoints", pairs)
    y = pairs["pairs"][0]["variables"]["y"]
    assert y["kind"] == "tensor" and y["shape_match"] and y["stats_max_rel"] > 0
    assert pairs["pairs"][0]["variables"]["step"]["equal"] is True

    _fits("captures", store_queries.captures(reference))

    tensors = store.list_tensors(reference)
    _fits("tensors", {"path": str(store.store_dir(reference)), "tensors": tensors})
    info = store.tensor_info("saved", reference)
    _fits("tensors", info)
    assert info["dtype"] == "F32" and info["shape"] == [2, 3]


def test_a_tensor_file_whose_header_names_no_dtype_is_still_described(tmp_path: Path) -> None:
    """``tensors info`` reads the header as it is: a file whose entry lacks dtype and
    shape (written by another tool) is described with them null, not refused by the
    result type (it said ``dtype: str``, and MCP's validation turned the answer into a
    tool error)."""
    directory = store.store_dir(tmp_path)
    directory.mkdir(parents=True)
    header = json.dumps({"tensor": {"data_offsets": [0, 0]}}).encode()
    (directory / "odd.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    info = store.tensor_info("odd", tmp_path)
    assert info["dtype"] is None and info["shape"] is None
    _fits("tensors", info)


def test_parity_answers_fit_their_result_types(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compare, module-table, nonfinite, weights and captures, on two real captures of a
    tiny torch model whose port differs in one layer."""
    import torch

    import mldbg
    from mldbg.compare import compare_answer
    from mldbg.compare.culprit.nonfinite import first_nonfinite
    from mldbg.compare.report.table import module_table
    from mldbg.store import current_run
    from mldbg.weights.audit import audit_weights

    home = tmp_path / "store"
    monkeypatch.setenv("MLDBG_HOME", str(home))
    current_run.reset()

    def model(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

    reference, port = model(0), model(0)
    with torch.no_grad():
        port[2].weight.mul_(1.5)  # the port's last layer is wrong
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    try:
        for net, name in ((reference, "ref"), (port, "port")):
            with torch.no_grad(), mldbg.capture(net, name):
                net(x)
    finally:
        current_run.reset()

    captures = store_queries.captures(home)
    _fits("captures", captures)
    assert [c["name"] for c in captures["captures"]] == ["port", "ref"]
    compared = compare_answer(home, a="ref", b="port")
    _fits("compare", compared)
    assert not compared["ok"] and compared["counts"]["failed"] >= 1
    table = module_table("ref", "port", home=home)
    _fits("module-table", table)
    assert table["a"]["label"].startswith("ref")
    found = first_nonfinite("ref", home=home)
    _fits("nonfinite", found)
    assert found["first"] is None
    audit = audit_weights(reference, port)
    _fits("weights", audit)
    assert audit["reference"]["count"] == audit["port"]["count"] == 4
