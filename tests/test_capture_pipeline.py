"""Several models in one capture (``mldbg.capture({"a": m1, "b": m2}, name)``): their
calls in one execution order, module paths prefixed with each model's name, the models
left exactly as they were; bad dicts refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
mnn = pytest.importorskip("mlx.nn")

import mldbg  # noqa: E402

pytestmark = pytest.mark.usefixtures("home")  # a private run store (conftest)


def calls(path: Path) -> list[tuple[str, int, int | None]]:
    lines = [json.loads(x) for x in (path / "index.jsonl").read_text().splitlines()]
    return [(r["module"], r["call"], r["parent"]) for r in lines if r["event"] == "call"]


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_two_models_share_one_capture_and_execution_order(framework: str) -> None:
    if framework == "torch":
        first, second = torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 2))
        x = torch.ones(1, 4)
    else:
        first, second = mnn.Linear(4, 4), mnn.Sequential(mnn.Linear(4, 2))
        x = mx.ones((1, 4))
    before = (
        type(first),
        type(second),
        type(second.layers[0] if framework == "mlx" else second[0]),
    )
    with mldbg.capture({"encoder": first, "decoder": second}, "pipe") as cap:
        h = first(x)
        second(first(h))  # the encoder twice: a loop's steps
    found = calls(cap.path)
    inner = "decoder.layers.0" if framework == "mlx" else "decoder.0"
    assert found == [
        ("encoder", 0, None),
        ("encoder", 1, None),
        ("decoder", 0, None),
        (inner, 0, 2),  # inside decoder#0 (seq 2)
    ]
    meta = json.loads((cap.path / "capture.json").read_text())
    assert meta["models"] == ["encoder", "decoder"]
    after = (type(first), type(second), type(second.layers[0] if framework == "mlx" else second[0]))
    assert after == before  # the models are left as they were


def test_a_pipeline_capture_refuses_bad_names_and_mixed_frameworks() -> None:
    with pytest.raises(TypeError, match="identifiers"):
        mldbg.capture({"text encoder": torch.nn.Linear(2, 2)}, "bad")
    with pytest.raises(TypeError, match="one framework"):
        mldbg.capture({"a": torch.nn.Linear(2, 2), "b": mnn.Linear(2, 2)}, "bad")
    with pytest.raises(TypeError, match="empty"):
        mldbg.capture({}, "bad")
