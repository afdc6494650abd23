"""mldbg.summary against real torch, MLX and numpy, value by value.

Every statistic is checked against a float64 numpy computation of the same values made
here, independently of the module: finite values only, sample standard deviation.
"""

from __future__ import annotations

import enum
import json
import math
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mldbg import summary

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
ml_dtypes = pytest.importorskip("ml_dtypes")

SRC = Path(summary.__file__).resolve().parent.parent
STATS_KEYS = {"min", "max", "mean", "std", "nan", "inf"}
TENSOR_KEYS = {"type", "shape", "dtype", "device", "numel", "preview", "stats"}


def check(value: object) -> dict[str, Any]:
    """summarize, plus the promises every summary keeps: strict JSON, a bounded one_line."""
    s = summary.summarize(value, force=True)  # as eval shows it: a lazy MLX graph runs
    json.dumps(s, allow_nan=False)
    assert len(summary.one_line(value)) <= 200
    assert len(summary.one_line(value, 40)) <= 40
    return s


def reference(values: Any) -> dict[str, Any]:
    """float64 statistics of the finite values; std with Bessel's correction."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    finite = values[np.isfinite(values)]
    counts = {"nan": int(np.isnan(values).sum()), "inf": int(np.isinf(values).sum())}
    if finite.size == 0:
        return {"min": None, "max": None, "mean": None, "std": None, **counts}
    return {
        "min": finite.min(),
        "max": finite.max(),
        "mean": finite.mean(),
        "std": finite.std(ddof=1) if finite.size > 1 else 0.0,
        **counts,
    }


def assert_stats(stats: dict[str, Any], expected: dict[str, Any], rel: float = 1e-6) -> None:
    assert set(stats) == STATS_KEYS
    for key in ("min", "max", "mean", "std"):
        if expected[key] is None:
            assert stats[key] is None, key
        else:
            assert stats[key] == pytest.approx(expected[key], rel=rel, abs=1e-9), key
            assert type(stats[key]) in (int, float, bool), key
    assert (stats["nan"], stats["inf"]) == (expected["nan"], expected["inf"])


def torch_values(t: Any) -> np.ndarray:
    return t.detach().to(torch.float64).numpy()


def mlx_values(a: Any) -> np.ndarray:
    return np.array(a.astype(mx.float32) if a.dtype in (mx.bfloat16, mx.float16) else a)


def permute(a: Any, *order: int) -> Any:
    """The same axis permutation in torch (``permute``), MLX and numpy (``transpose``)."""
    return a.permute(*order) if isinstance(a, torch.Tensor) else a.transpose(*order)


def assert_tensor_summary(s: dict[str, Any], kind: str, shape: list[int], dtype: str) -> None:
    expected_keys = TENSOR_KEYS | ({"requires_grad"} if kind == "torch.Tensor" else set())
    assert set(s) - {"note"} == expected_keys
    assert (s["type"], s["shape"], s["dtype"]) == (kind, shape, dtype)
    assert s["numel"] == math.prod(shape)


# -- what a value is ------------------------------------------------------------------------


def test_tensors_are_recognised_and_named() -> None:
    class MyTensor(torch.Tensor):
        pass

    class Local:
        pass

    tensors = [
        torch.ones(2),
        torch.nn.Parameter(torch.ones(2)),
        torch.ones(2).as_subclass(MyTensor),
        mx.ones(2),
        np.ones(2),
    ]
    assert all(summary.is_tensor(t) for t in tensors)
    not_tensors = [np.float32(1.0), [1.0], torch.float32, torch.nn.Linear(1, 1), mx.float32, None]
    assert not any(summary.is_tensor(v) for v in not_tensors)
    assert [summary.type_name(t) for t in tensors] == [
        "torch.Tensor",
        "torch.Tensor",
        "torch.Tensor",
        "mlx.core.array",
        "numpy.ndarray",
    ]
    assert summary.type_name(3) == "int" and summary.type_name(None) == "NoneType"
    assert summary.type_name(Local()) == f"{__name__}.{Local.__qualname__}"
    assert summary.type_name(np.float32(1)) == "numpy.float32"
    assert summary.type_name(torch.nn.Linear(1, 1)) == "torch.nn.modules.linear.Linear"


# -- statistics -----------------------------------------------------------------------------


def test_float32_against_numpy_for_every_framework() -> None:
    values = np.random.default_rng(0).normal(3.0, 2.0, size=(7, 13)).astype(np.float32)
    for value, kind in (
        (torch.from_numpy(values), "torch.Tensor"),
        (mx.array(values), "mlx.core.array"),
        (values, "numpy.ndarray"),
    ):
        s = check(value)
        assert_tensor_summary(s, kind, [7, 13], "float32")
        assert s["device"] == "cpu" and s["preview"] == values.reshape(-1)[:8].tolist()
        assert_stats(s["stats"], reference(values))
    assert check(torch.from_numpy(values))["requires_grad"] is False


def test_nan_and_inf_are_counted_and_left_out_of_the_stats() -> None:
    values = np.array([1.0, np.nan, -np.inf, 3.0, np.inf, np.nan, -2.0, 0.5], dtype=np.float32)
    expected = reference(values)
    assert (expected["nan"], expected["inf"]) == (2, 2)
    cases = [torch.from_numpy(values), mx.array(values), values, values.astype(np.float16)]
    cases += [torch.from_numpy(values).to(torch.bfloat16), mx.array(values).astype(mx.bfloat16)]
    cases += [values.astype(ml_dtypes.bfloat16)]
    for value in cases:
        s = check(value)
        assert_stats(s["stats"], expected)
        assert s["preview"][:6] == [1.0, "nan", "-inf", 3.0, "inf", "nan"]
    for value in (torch.full((3,), math.nan), mx.array([math.inf, -math.inf]), np.full(2, np.nan)):
        stats = check(value)["stats"]
        assert stats["min"] is stats["max"] is stats["mean"] is stats["std"] is None
        assert stats["nan"] + stats["inf"] == math.prod(value.shape)


def test_half_precision_is_computed_in_float32() -> None:
    # The mean, 251.0625, has no bfloat16 (or float16) representation: only a wider
    # accumulator gets it right to the digit.
    values = np.array([0.1, 1000.5, -3.25, 7.0], dtype=np.float32)
    for dtype, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        tensor = torch.from_numpy(values).to(dtype)
        s = check(tensor)
        assert s["dtype"] == name and s["preview"] == torch_values(tensor).tolist()
        assert_stats(s["stats"], reference(torch_values(tensor)))
    for dtype, name in ((mx.bfloat16, "bfloat16"), (mx.float16, "float16")):
        lazy = (mx.array(values) * 2).astype(dtype)  # a graph, evaluated by summarize
        s = check(lazy)
        assert s["dtype"] == name and s["type"] == "mlx.core.array"
        assert_stats(s["stats"], reference(mlx_values(lazy)))
    for dtype in (ml_dtypes.bfloat16, np.float16):
        array = values.astype(dtype)
        s = check(array)
        assert s["dtype"] == np.dtype(dtype).name
        assert_stats(s["stats"], reference(array.astype(np.float64)))


def test_integers_keep_exact_extremes() -> None:
    big = 2**53 + 1  # not a float64
    ints = np.array([[big, -7], [12, big + 2]], dtype=np.int64)
    for value in (torch.from_numpy(ints), mx.array(ints), ints):
        stats = check(value)["stats"]
        assert (stats["min"], stats["max"]) == (-7, big + 2)
        assert type(stats["min"]) is int and type(stats["max"]) is int
        assert_stats(stats, reference(ints))
    unsigned = np.array([0, 2**64 - 1, 5], dtype=np.uint64)
    torch_unsigned = torch.tensor([0, 2**64 - 1, 5], dtype=torch.uint64)
    for value in (torch_unsigned, mx.array(unsigned), unsigned):
        stats = check(value)["stats"]
        assert (stats["min"], stats["max"]) == (0, 2**64 - 1)
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.uint16, torch.uint32):
        tensor = torch.tensor([3, 1, 7, 0]).to(dtype)
        s = check(tensor)
        assert s["dtype"] == str(dtype).removeprefix("torch.")
        assert_stats(s["stats"], reference([3, 1, 7, 0]))
    s = check(mx.array([5, 1, 9], dtype=mx.int32))
    assert s["dtype"] == "int32" and (s["stats"]["min"], s["stats"]["max"]) == (1, 9)


def test_booleans_are_zeros_and_ones() -> None:
    flags = np.array([[True, False, True], [True, True, False]])
    for value in (torch.from_numpy(flags), mx.array(flags), flags):
        s = check(value)
        assert s["dtype"] == "bool" and s["preview"] == flags.reshape(-1).tolist()
        stats = s["stats"]
        assert stats["min"] is False and stats["max"] is True
        assert_stats(stats, {**reference(flags), "min": False, "max": True})
    assert check(np.ones(3, dtype=bool))["stats"]["min"] is True


def test_complex_stats_are_on_absolute_values() -> None:
    values = np.array([3 + 4j, 1 - 1j, 2j], dtype=np.complex64)
    for value in (torch.from_numpy(values), mx.array(values), values):
        s = check(value)
        assert s["dtype"] == "complex64" and s["preview"] == ["3+4j", "1-1j", "0+2j"]
        assert_stats(s["stats"], reference(np.abs(values)))


def test_empty_and_zero_dimensional_tensors() -> None:
    for value in (torch.empty(0, 4), mx.zeros((0, 3)), np.empty((2, 0))):
        s = check(value)
        assert s["numel"] == 0 and s["stats"] is None and s["preview"] == []
    for value in (torch.tensor(2.5), mx.array(2.5), np.array(2.5)):
        s = check(value)
        assert s["shape"] == [] and s["numel"] == 1 and s["preview"] == [2.5]
        assert s["stats"] == {"min": 2.5, "max": 2.5, "mean": 2.5, "std": 0.0, "nan": 0, "inf": 0}


def test_preview_is_row_major_for_non_contiguous_tensors() -> None:
    base = np.arange(2 * 5 * 6, dtype=np.float32).reshape(2, 5, 6)
    views = [
        lambda a: permute(a, 2, 0, 1),
        lambda a: a[:, :, ::2],
        lambda a: a[:, ::-1] if isinstance(a, np.ndarray) else a.flip(1),
        lambda a: a[1:, 3:, 4:],
    ]
    for view in views:
        expected_array = view(base)
        expected = expected_array.reshape(-1)[:8].tolist()
        t = view(torch.from_numpy(base))
        assert check(t)["preview"] == expected
        assert_stats(check(t)["stats"], reference(expected_array))
        assert check(expected_array)["preview"] == expected
    transposed = mx.array(base).transpose(2, 0, 1)
    assert check(transposed)["preview"] == base.transpose(2, 0, 1).reshape(-1)[:8].tolist()
    wide = torch.arange(40.0).reshape(1, 1, 40)
    assert check(wide)["preview"] == list(range(8))
    expanded = torch.arange(3.0).reshape(3, 1).expand(3, 1000)  # stride 0
    s = check(expanded)
    assert s["preview"] == [0.0] * 8 and s["stats"]["mean"] == pytest.approx(1.0)


def test_chunked_reductions_match_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny chunks and MLX rows: merges across chunks, whole non-finite chunks, tails."""
    monkeypatch.setattr(summary, "CHUNK", 7)
    monkeypatch.setattr(summary, "ACCELERATOR_CHUNK", 7)
    monkeypatch.setattr(summary, "_MLX_ROW", 4)
    values = np.random.default_rng(1).normal(50.0, 3.0, size=(6, 5, 4)).astype(np.float32)
    values[0, :2] = np.nan  # a whole chunk, and more, without a finite value
    values[3, 1, 2] = np.inf
    values[5, 4, 3] = -np.inf
    expected = reference(values)
    for value in (torch.from_numpy(values), mx.array(values), values):
        assert_stats(check(value)["stats"], expected, rel=1e-5)
        assert_stats(check(permute(value, 2, 0, 1))["stats"], expected, rel=1e-5)
    ints = np.random.default_rng(2).integers(-1000, 1000, size=(9, 11))
    flags = ints > 0
    for data in (ints, flags):
        for value in (torch.from_numpy(data), mx.array(data), data):
            stats = check(value)["stats"]
            assert_stats(stats, {**reference(data), "min": stats["min"], "max": stats["max"]})
            assert (stats["min"], stats["max"]) == (data.min(), data.max())
    bf16 = torch.from_numpy(values).to(torch.bfloat16)
    assert_stats(check(bf16)["stats"], reference(torch_values(bf16)), rel=1e-5)


def test_mlx_sums_stay_accurate_on_large_arrays() -> None:
    # MLX's CPU mean of these 2**21 equal values is about 1% off; its std of normal
    # values drifts the same way.  The summary must not inherit that.
    constant = mx.full((1 << 21,), 1000.1)
    s = check(constant)["stats"]
    assert s["mean"] == pytest.approx(float(np.float32(1000.1)), rel=1e-7)
    assert s["std"] == pytest.approx(0.0, abs=1e-3)
    normal = np.random.default_rng(3).normal(10.0, 1.0, size=1 << 21).astype(np.float32)
    assert_stats(check(mx.array(normal))["stats"], reference(normal), rel=1e-6)


def test_parameters_and_autograd_are_left_alone() -> None:
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0, 4.0]))
    s = check(param)
    assert s["type"] == "torch.Tensor" and s["requires_grad"] is True
    assert_stats(s["stats"], reference([1.0, -2.0, 4.0]))
    derived = param * 2
    assert check(derived)["requires_grad"] is True
    assert torch.is_grad_enabled() and param.grad is None
    derived.sum().backward()  # the graph is intact
    assert param.grad.tolist() == [2.0, 2.0, 2.0]


def test_tensor_subclass_hooks_are_not_run_for_statistics() -> None:
    calls: list[str] = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            calls.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    logged = torch.tensor([1.0, 5.0, 2.0]).as_subclass(Logged)
    s = check(logged)
    assert_stats(s["stats"], reference([1.0, 5.0, 2.0]))
    assert not {"aminmax", "mean", "var", "to"} & set(calls)


def test_unusual_torch_tensors_never_raise() -> None:
    meta = check(torch.empty(4, 4, device="meta"))
    assert meta["device"] == "meta" and meta["stats"] is None and meta["preview"] == []
    sparse = check(torch.eye(3).to_sparse())
    assert sparse["stats"] is None and "sparse" in sparse["note"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized creation is deprecated
        quantized = torch.quantize_per_tensor(torch.arange(6.0), 0.5, 0, torch.qint8)
    q = check(quantized)
    assert q["dtype"] == "qint8" and q["stats"] is None and "note" in q
    assert q["preview"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    fp8 = torch.tensor([1.0, -2.0, 448.0]).to(torch.float8_e4m3fn)
    assert_stats(check(fp8)["stats"], reference([1.0, -2.0, 448.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the strided layout is a prototype
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    s = check(nested)  # no shape to report: a repr and the reason instead
    assert s["type"] == "torch.Tensor" and "nested_tensor" in s["repr"] and "note" in s


def test_unusual_numpy_arrays_never_raise() -> None:
    for value in (
        np.array([{"a": 1}, None, "x" * 500], dtype=object),
        np.array(["ab", "cd"]),
        np.array(["2020-01-01"], dtype="datetime64[D]"),
        np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]),
    ):
        s = check(value)
        assert s["stats"] is None and "note" in s and len(s["preview"]) == value.size
    int4 = np.arange(-3, 4).astype(ml_dtypes.int4)
    assert check(int4)["stats"]["max"] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        matrix = np.matrix([[1, 2], [3, 4]])  # stays 2-D whatever it is sliced or reshaped to
    assert check(matrix)["stats"]["mean"] == 2.5
    assert check(np.array([1.0, 2.0], dtype=np.longdouble))["preview"] == [1.0, 2.0]


# -- everything else ------------------------------------------------------------------------


def test_plain_values() -> None:
    assert check(3) == {"type": "int", "repr": "3", "value": 3}
    assert check(None)["value"] is None and check(True)["value"] is True
    assert check(float("nan"))["value"] == "nan" and check(-math.inf)["value"] == "-inf"
    assert check("hi") == {"type": "str", "repr": "'hi'", "value": "hi", "len": 2}
    assert check(np.float32(1.5))["value"] == 1.5

    class Color(enum.IntEnum):
        RED = 1

    assert check(Color.RED)["value"] == 1 and type(check(Color.RED)["value"]) is int
    assert check({"a": (1, 2)})["len"] == 1 and check(b"\x00" * 10)["len"] == 10
    huge_int = check(10**5000)
    assert "value" not in huge_int and huge_int["repr"].startswith("<repr failed: ValueError")
    assert check(torch.float32)["repr"] == "torch.float32"
    assert check(mx.bfloat16)["repr"] == "mlx.core.bfloat16"


def test_modules_report_their_parameter_count() -> None:
    import mlx.nn

    torch_module = check(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()))
    assert torch_module["parameters"] == 8 and "Linear" in torch_module["repr"]
    assert check(mlx.nn.Linear(3, 2))["parameters"] == 8
    line = summary.one_line(torch.nn.Sequential(torch.nn.Linear(3, 2)))
    assert "\n" not in line and line.startswith("Sequential( (0): Linear(")


def test_hostile_objects_never_raise() -> None:
    class BadRepr:
        def __repr__(self) -> str:
            raise RuntimeError("no repr for you")

    class NotAString:
        def __repr__(self) -> Any:
            return 42

    class BadLen(list):
        def __len__(self) -> int:
            raise RuntimeError("no len")

    class BadClass:
        @property  # type: ignore[misc]
        def __class__(self) -> Any:
            raise RuntimeError("no class")

    assert check(BadRepr())["repr"] == "<repr failed: RuntimeError: no repr for you>"
    assert summary.safe_repr(NotAString()).startswith("<repr failed: TypeError")
    bad_len = check(BadLen([1, 2]))
    assert bad_len["repr"] == "[1, 2]" and "len" not in bad_len
    assert check(BadClass())["repr"].startswith("<")
    assert not summary.is_tensor(BadClass())

    nested: list[Any] = []
    nested.append(nested)
    assert check(nested)["len"] == 1
    deep: list[Any] = []
    current = deep
    for _ in range(100_000):  # deeper than any recursion limit
        current.append([])
        current = current[0]
    assert check(deep)["len"] == 1


def test_reprs_are_bounded_and_cheap() -> None:
    huge = "x" * 50_000_000
    s = check(huge)
    assert s["len"] == 50_000_000 and "value" not in s
    assert len(s["repr"]) <= 1000 and s["repr"].endswith("… (50000000 chars)")
    assert len(check("y" * 1000)["value"]) == 1000
    for max_chars in (1, 5, 30, 100, 4096):
        for value in (huge, list(range(100_000)), {i: str(i) for i in range(10_000)}, "short"):
            assert len(summary.safe_repr(value, max_chars)) <= max_chars
    text = summary.safe_repr(list(range(100_000)), 100)
    assert text.startswith("[0, 1, 2") and "chars)" in text


def test_one_line_for_tensors() -> None:
    t = torch.tensor([[0.1, 0.2, 0.3], [1.0, -1.2, 3.4]])
    line = summary.one_line(t)
    values = t.numpy().astype(np.float64)
    std = f"{values.std(ddof=1):.4g}"
    assert line == (
        "torch.Tensor float32[2, 3] cpu min=-1.2 max=3.4 mean=0.6333 "
        f"std={std} [0.1, 0.2, 0.3, 1, -1.2, 3.4]"
    )
    line = summary.one_line(torch.tensor([[1.0, -1.0], [float("nan"), 3.0]]))
    assert line.startswith("torch.Tensor float32[2, 2] cpu min=-1 max=3")
    assert "nan=1" in line and "inf=" not in line
    assert summary.one_line(torch.arange(20.0)).endswith("[0, 1, 2, 3, 4, 5, 6, 7, …]")
    evaluated = mx.zeros((2,))
    mx.eval(evaluated)
    assert summary.one_line(evaluated).startswith("mlx.core.array float32[2] cpu min=0")
    assert summary.one_line(np.ones((2, 2), dtype=bool)).startswith(
        "numpy.ndarray bool[2, 2] cpu min=True max=True"
    )
    assert len(summary.one_line(torch.zeros(3, 5, 7, 9, 11, 13), 30)) <= 30


def test_hundred_million_elements() -> None:
    """Exact statistics of 1e8 elements; how fast is measured in benchmarks/, not here."""
    big = torch.empty(100_000_000).uniform_(-1.0, 1.0)
    s = summary.summarize(big)
    stats = s["stats"]
    assert -1.0 <= stats["min"] < -0.999 and 0.999 < stats["max"] <= 1.0
    assert stats["mean"] == pytest.approx(0.0, abs=1e-3)
    assert stats["std"] == pytest.approx(1 / math.sqrt(3), rel=1e-3)


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_summary_imports_no_framework_of_its_own() -> None:
    run_python(
        """
        import sys; import mldbg.summary as s; s.summarize([1, 2]); s.one_line(3.0)
        s.is_tensor(2); s.type_name(2); s.safe_repr(2)
        assert not {"torch", "numpy", "mlx", "mlx.core"} & set(sys.modules), sorted(sys.modules)
        """
    )


def test_memory_stays_bounded_for_conversions_and_non_finite_values() -> None:
    """A bfloat16 tensor with NaNs: a whole float32 copy would take 200 MB more."""
    out = run_python(
        """
        import resource, torch, mldbg.summary as s
        t = torch.zeros(50_000_000, dtype=torch.bfloat16)
        t[::1000] = float("nan")
        s.summarize(torch.ones(100, dtype=torch.bfloat16))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        stats = s.summarize(t)["stats"]
        assert stats["nan"] == 50_000 and stats["max"] == 0.0, stats
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
        """
    )
    assert int(out) < 100, f"peak grew by {out.strip()} MB"


def test_lazy_mlx_arrays_are_not_evaluated_by_a_summary() -> None:
    """A variable listing must not run the script's graph: a lazy 64 MB array stays lazy."""
    lazy = mx.ones((4096, 4096)) * 2
    before = mx.get_active_memory()
    s = summary.summarize(lazy)
    assert mx.get_active_memory() == before  # nothing was allocated
    assert s["shape"] == [4096, 4096] and s["dtype"] == "float32" and s["numel"] == 1 << 24
    assert s["evaluated"] is False and "not evaluated" in s["note"]
    assert s["stats"] is None and s["preview"] == []
    line = summary.one_line(lazy)
    assert line.startswith("mlx.core.array float32[4096, 4096]") and "not evaluated" in line
    assert mx.get_active_memory() == before
    # asked for (eval): computed, and said so; afterwards it is an evaluated array
    forced = summary.summarize(lazy, force=True)
    assert forced["stats"]["max"] == 2.0 and "evaluated now" in forced["note"]
    again = summary.summarize(lazy)
    assert again["stats"]["min"] == 2.0 and "note" not in again and "evaluated" not in again
    constant = summary.summarize(mx.array([1.0, 2.0]))  # made from host data: has values
    assert constant["preview"] == [1.0, 2.0]


def test_mlx_tracers_inside_compile_show_shape_and_dtype() -> None:
    seen: dict[str, Any] = {}

    @mx.compile
    def double(x: Any) -> Any:
        y = (x * 2).astype(mx.float16)
        seen["x"], seen["y"] = summary.summarize(x), summary.summarize(y, force=True)
        seen["line"] = summary.one_line(y)
        return y

    mx.eval(double(mx.ones((3, 2))))
    for key in ("x", "y"):
        assert seen[key]["type"] == "mlx.core.array" and seen[key]["shape"] == [3, 2], seen
        assert seen[key]["evaluated"] is False and "mx.compile" in seen[key]["note"], seen
    assert seen["y"]["dtype"] == "float16" and seen["x"]["dtype"] == "float32"
    assert seen["line"].startswith("mlx.core.array float16[3, 2]"), seen["line"]
