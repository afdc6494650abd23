"""eval --against: one expression in the reference's and the port's paused sessions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from conftest import Api, Session, line_of

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")

REFERENCE = """
import torch
torch.manual_seed(0)
x = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10
h = torch.tanh(x).to(torch.bfloat16)
steps = 3
print("reference")  # stop
"""

PORT = """
import mlx.core as mx
x = mx.arange(12, dtype=mx.float32).reshape(3, 4) / 10
h = mx.tanh(x)
h = mx.where(mx.arange(12).reshape(3, 4) == 5, h * 2, h)  # the planted mistake
steps = 4
print("port")  # stop
"""


@pytest.fixture
def port(api: Api, tmp_path: Path) -> Iterator[Session]:
    s = Session(api, f"port-{uuid.uuid4().hex[:8]}", tmp_path)
    yield s
    s.end()


def test_one_expression_in_two_sessions(session: Session, port: Session, write) -> None:
    for s, name, source in ((session, "ref.py", REFERENCE), (port, "port.py", PORT)):
        script = write(name, source)
        s.start(script, breakpoints=[{"file": str(script), "line": line_of(script, "stop")}])
        assert s.cont(wait=60)["reason"] == "breakpoint"

    # asked in the port, set against the reference (`eval -s port h --against ref`)
    both = port.call("eval", expression="h", against=session.name)
    assert both["session"] == port.name and both["against"]["session"] == session.name
    assert (
        both["summary"]["dtype"] == "float32" and both["against"]["summary"]["dtype"] == "bfloat16"
    )
    diff = both["difference"]
    ref = np.tanh(np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    ref_bf16 = torch.from_numpy(ref).to(torch.bfloat16).float().numpy().astype(np.float64)
    port_values = ref.astype(np.float64).copy()
    port_values[1, 1] *= 2
    assert diff["shape_a"] == diff["shape_b"] == [3, 4] and diff["equal"] is False
    assert diff["worst"]["index"] == [1, 1]
    assert diff["max_abs"] == pytest.approx(np.abs(port_values - ref_bf16).max(), rel=1e-6)
    assert diff["mismatched"] == int(np.count_nonzero(port_values != ref_bf16))
    # relative to the reference (the session set against), as compare's is
    error = np.linalg.norm(port_values - ref_bf16) / np.linalg.norm(ref_bf16)
    assert diff["rel_rms"] == pytest.approx(error, rel=1e-6) and 0.9 < diff["cosine"] < 1

    numbers = port.call("eval", expression="steps", against=session.name)
    # port 4, reference 3: off by a third of the reference's value
    assert numbers["difference"] == {"equal": False, "b_minus_a": -1.0, "rel": pytest.approx(1 / 3)}
    same = session.call("eval", expression="x.shape[0]", against=port.name)
    assert same["difference"]["equal"] is True

    error = session.call("eval", 400, expression="h", against=session.name)
    assert error["code"] == "bad_argument"
    error = session.call("eval", 404, expression="h", against="nobody")
    assert error["code"] == "unknown_session"
