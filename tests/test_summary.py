"""Tensor summaries checked value by value against independent numpy computations."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mldbg import summary

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
ml_dtypes = pytest.importorskip("ml_dtypes")


def reference(values: np.ndarray) -> dict[str, float]:
    finite = values[np.isfinite(values)].astype(np.float64)
    return {
        "min": finite.min(),
        "max": finite.max(),
        "mean": finite.mean(),
        "std": finite.std(ddof=1) if finite.size > 1 else 0.0,
        "nan": int(np.isnan(values).sum()),
        "inf": int(np.isinf(values).sum()),
    }


def assert_stats(stats: dict, expected: dict, rel: float = 1e-5) -> None:
    for key in ("min", "max", "mean", "std"):
        assert stats[key] == pytest.approx(expected[key], rel=rel, abs=1e-6), key
    assert stats["nan"] == expected["nan"] and stats["inf"] == expected["inf"]


def test_torch_float32_against_numpy() -> None:
    values = np.random.default_rng(0).normal(size=(7, 13)).astype(np.float32)
    s = summary.summarize(torch.from_numpy(values))
    assert s["type"] == "torch.Tensor" and s["shape"] == [7, 13] and s["dtype"] == "float32"
    assert s["device"] == "cpu" and s["numel"] == 91 and s["requires_grad"] is False
    assert s["preview"] == pytest.approx(values.reshape(-1)[:8].tolist())
    assert_stats(s["stats"], reference(values))


def test_nan_and_inf_are_counted_and_left_out_of_the_stats() -> None:
    values = np.array([1.0, np.nan, -np.inf, 3.0, np.inf, np.nan, -2.0], dtype=np.float32)
    for tensor in (torch.from_numpy(values), mx.array(values), values):
        s = summary.summarize(tensor)
        assert_stats(s["stats"], reference(values))
        assert s["preview"][:3] == [1.0, "nan", "-inf"]
        json.dumps(s, allow_nan=False)
    only_nan = summary.summarize(torch.tensor([float("nan")] * 3))
    assert only_nan["stats"] == {
        "min": None,
        "max": None,
        "mean": None,
        "std": None,
        "nan": 3,
        "inf": 0,
    }


def test_bf16_and_fp16_are_computed_in_float32() -> None:
    values = np.array([0.1, 1000.5, -3.25, 7.0], dtype=np.float32)
    for dtype, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        tensor = torch.from_numpy(values).to(dtype)
        s = summary.summarize(tensor)
        exact = tensor.to(torch.float32).numpy()
        assert s["dtype"] == name
        assert_stats(s["stats"], reference(exact))
        assert s["preview"] == exact.tolist()
    lazy = (mx.array(values) * 2).astype(mx.bfloat16)  # lazy until summarized
    s = summary.summarize(lazy)
    exact = np.array(lazy.astype(mx.float32).tolist(), dtype=np.float32)
    assert s["dtype"] == "bfloat16" and s["type"] == "mlx.core.array"
    assert_stats(s["stats"], reference(exact))
    npbf = values.astype(ml_dtypes.bfloat16)
    s = summary.summarize(npbf)
    assert s["dtype"] == "bfloat16"
    assert_stats(s["stats"], reference(npbf.astype(np.float32)))


def test_integers_and_bools() -> None:
    ints = torch.tensor([[3, -7], [12, 0]])
    s = summary.summarize(ints)
    assert s["stats"]["min"] == -7 and s["stats"]["max"] == 12
    assert isinstance(s["stats"]["min"], int)
    assert_stats(s["stats"], reference(ints.numpy().astype(np.float64)))
    flags = summary.summarize(torch.tensor([True, False, True, True]))
    assert flags["stats"]["min"] is False and flags["stats"]["max"] is True
    assert flags["stats"]["mean"] == pytest.approx(0.75)
    mlx_ints = summary.summarize(mx.array([5, 1, 9], dtype=mx.int32))
    assert (mlx_ints["stats"]["min"], mlx_ints["stats"]["max"], mlx_ints["dtype"]) == (
        1,
        9,
        "int32",
    )


def test_preview_follows_row_major_order_of_non_contiguous_tensors() -> None:
    base = torch.arange(30.0).reshape(5, 6)
    assert summary.summarize(base.T)["preview"] == base.T.reshape(-1)[:8].tolist()
    assert summary.summarize(base[:, ::2])["preview"] == base[:, ::2].reshape(-1)[:8].tolist()
    transposed = mx.arange(30).reshape(5, 6).T
    assert (
        summary.summarize(transposed)["preview"]
        == np.arange(30).reshape(5, 6).T.reshape(-1)[:8].tolist()
    )


def test_edge_shapes_and_parameters() -> None:
    empty = summary.summarize(torch.empty(0, 4))
    assert empty["numel"] == 0 and empty["stats"] is None and empty["preview"] == []
    scalar = summary.summarize(torch.tensor(2.5))
    assert scalar["shape"] == [] and scalar["stats"]["std"] == 0.0 and scalar["preview"] == [2.5]
    param = torch.nn.Parameter(torch.ones(3))
    s = summary.summarize(param)
    assert s["type"] == "torch.Tensor" and s["requires_grad"] is True
    assert param.grad is None  # summarizing never builds a graph
    meta = summary.summarize(torch.empty(4, 4, device="meta"))
    assert meta["device"] == "meta" and meta["stats"] is None
    module = summary.summarize(torch.nn.Linear(3, 2))
    assert module["parameters"] == 8 and "Linear" in module["repr"]


def test_plain_values_are_bounded_and_never_raise() -> None:
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no repr for you")

    assert summary.summarize(Hostile())["repr"].startswith("<repr failed: RuntimeError")
    huge = "x" * 100_000
    s = summary.summarize(huge)
    assert s["len"] == 100_000 and len(s["repr"]) < 1100 and "value" not in s
    assert summary.summarize(3) == {"type": "int", "repr": "3", "value": 3}
    assert summary.summarize(float("nan"))["value"] == "nan"
    nested: list = []
    nested.append(nested)
    assert summary.summarize(nested)["len"] == 1
    assert len(summary.one_line(list(range(100_000)))) <= 200
    for value in (Hostile(), huge, nested, {"a": (1, 2)}, None, b"\x00" * 10_000):
        json.dumps(summary.summarize(value), allow_nan=False)


def test_one_line_for_tensors() -> None:
    line = summary.one_line(torch.tensor([[1.0, -1.0], [float("nan"), 3.0]]))
    assert line.startswith("torch.Tensor float32[2, 2] cpu min=-1 max=3")
    assert "nan=1" in line and "inf=" not in line
    assert summary.one_line(mx.zeros((2,))).startswith("mlx.core.array float32[2] cpu")


def test_hundred_million_elements_in_well_under_a_second() -> None:
    big = torch.randn(100_000_000)
    started = time.perf_counter()
    s = summary.summarize(big)
    elapsed = time.perf_counter() - started
    assert s["stats"]["mean"] == pytest.approx(0, abs=1e-3) and s["stats"]["std"] == pytest.approx(
        1, abs=1e-3
    )
    assert elapsed < 1.0, f"{elapsed:.2f} s"
    assert len(summary.one_line(big)) <= 200


def test_summary_imports_no_framework_of_its_own() -> None:
    src = Path(summary.__file__).resolve().parent.parent
    code = (
        "import sys, mldbg.summary as s\n"
        "s.summarize([1, 2]); s.one_line(3.0)\n"
        "assert not {'torch', 'numpy', 'mlx'} & set(sys.modules), sys.modules.keys()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert math.isfinite(1.0)
