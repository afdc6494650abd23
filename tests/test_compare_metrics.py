"""The per-pair numbers of ``mldbg compare`` against independent references.

References are a direct (whole-array) numpy float64 computation and torch itself:
``torch.testing.assert_close`` / ``torch.isclose`` decide what "mismatched" means and
which tolerances are the defaults, so these tests fail if metrics.py drifts from them.
"""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

from mldbg.compare.judge.metrics import compare_arrays, default_tolerance
from mldbg.compare.pair.transposes import layout_permutation

TORCH_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
KEYS = {
    "numel",
    "finite_pairs",
    "port_nonfinite",
    "nonfinite_at",
    "max_abs",
    "mean_abs",
    "max_rel",
    "cosine",
    "range_a",
    "range_b",
    "range_ratio",
    "mismatched",
    "nonfinite_mismatched",
    "min_atol",
    "nan_a",
    "nan_b",
    "inf_a",
    "inf_b",
    "head_a",
    "head_b",
    "worst",
    "largest",
    "rel_rms",
    "rel_max",
    "rms_a",
    "rms_b",
    "ok",
}
# Sums whose last bits depend on the order of summation, hence on the chunking.
SUMS = {"mean_abs", "cosine", "rel_rms", "rms_a", "rms_b"}


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """The exact values of a torch tensor as numpy, bf16 and fp8 through ml_dtypes."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if tensor.dtype == torch.float8_e4m3fn:
        return tensor.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    return tensor.numpy()


def assert_close_outcome(actual: torch.Tensor, expected: torch.Tensor, **kwargs: Any) -> int:
    """The number of mismatched elements torch.testing.assert_close reports (0 if it passes)."""
    try:
        torch.testing.assert_close(actual, expected, check_dtype=False, **kwargs)
    except AssertionError as exc:
        found = re.search(r"Mismatched elements: (\d+) / ", str(exc))
        assert found, str(exc)
        return int(found.group(1))
    return 0


def assert_close_tolerance(dtype_a: torch.dtype, dtype_b: torch.dtype) -> tuple[float, float]:
    """Probe the (rtol, atol) assert_close picks by default, from its failure message."""
    expected = torch.tensor([0.0, 0.0]).to(dtype_a)
    actual = torch.tensor([1.0, 2.0]).to(dtype_b)
    with pytest.raises(AssertionError) as caught:
        torch.testing.assert_close(actual, expected, check_dtype=False)
    allowed = re.findall(r"\(up to ([^ ]+) allowed\)", str(caught.value))
    if not allowed:  # "Tensor-likes are not equal!": an exact comparison
        assert "not equal" in str(caught.value)
        return (0.0, 0.0)
    atol, rtol = (float(x) for x in allowed)
    return rtol, atol


def reference(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> dict[str, Any]:
    """The metrics computed the obvious way, on whole float64 copies."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    both = np.isfinite(a64) & np.isfinite(b64)
    fa, fb = a64[both], b64[both]
    diff = np.abs(fa - fb)
    larger = np.maximum(np.abs(fa), np.abs(fb))
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(larger == 0, 0.0, diff / larger)
    same_nonfinite = (np.isnan(a64) & np.isnan(b64)) | (a64 == b64)
    close = np.where(both, np.abs(b64 - a64) <= atol + rtol * np.abs(a64), same_nonfinite)
    largest = int(np.flatnonzero(both)[np.argmax(diff)])
    worst = int(np.flatnonzero(both)[np.argmax(diff - rtol * np.abs(fa))])
    return {
        "max_abs": diff.max(),
        "mean_abs": diff.mean(),
        "max_rel": rel.max(),
        "cosine": fa @ fb / (np.linalg.norm(fa) * np.linalg.norm(fb)),
        "range_a": [a64[np.isfinite(a64)].min(), a64[np.isfinite(a64)].max()],
        "range_b": [b64[np.isfinite(b64)].min(), b64[np.isfinite(b64)].max()],
        "mismatched": int((~close).sum()),
        "min_atol": max(0.0, (diff - rtol * np.abs(fa)).max()),
        "worst": list(np.unravel_index(worst, a.shape)),
        "largest": list(np.unravel_index(largest, a.shape)),
        "rel_rms": np.linalg.norm(fa - fb) / np.linalg.norm(fa),
        "rel_max": diff.max() / np.abs(fa).max(),
    }


def check_json(result: dict[str, Any]) -> None:
    assert set(result) == KEYS
    json.dumps(result, allow_nan=False)  # plain types only, no NaN/inf


# ---------------------------------------------------------------------------- tolerances


@pytest.mark.parametrize(
    ("name_a", "name_b"),
    [(name, name) for name in TORCH_DTYPES]
    + [
        ("F32", "BF16"),
        ("BF16", "F32"),
        ("F64", "F16"),
        ("F32", "F64"),
        ("F16", "BF16"),
        ("I32", "F16"),
        ("BOOL", "F32"),
        ("I64", "I32"),
        ("U8", "BOOL"),
    ],
)
def test_default_tolerance_is_what_assert_close_uses(name_a: str, name_b: str) -> None:
    probed = assert_close_tolerance(TORCH_DTYPES[name_a], TORCH_DTYPES[name_b])
    assert default_tolerance(name_a, name_b) == probed


def test_default_tolerance_fp8_and_numpy_names() -> None:
    assert default_tolerance("F8_E4M3", "F8_E4M3") == (0.125, 1e-2)
    assert default_tolerance("F8_E5M2", "F8_E5M2") == (0.25, 1e-2)
    assert default_tolerance("F32", "F8_E4M3") == (0.125, 1e-2)  # the looser one
    assert default_tolerance("bfloat16", "float32") == default_tolerance("BF16", "F32")
    assert default_tolerance("int64", "bool") == (0.0, 0.0)


@pytest.mark.parametrize(
    ("fp8", "name"),
    [(ml_dtypes.float8_e4m3fn, "F8_E4M3"), (ml_dtypes.float8_e5m2, "F8_E5M2")],
)
def test_fp8_tolerance_accepts_a_plain_cast_and_rejects_a_real_error(
    rng: np.random.Generator, fp8: Any, name: str
) -> None:
    """A port that merely rounds to fp8 passes; one off by 50% does not."""
    exact = (rng.standard_normal(2000) * 4).astype(np.float32)
    exact[:50] = rng.uniform(-1e-3, 1e-3, 50)  # the subnormal range, where atol matters
    rounded = exact.astype(fp8)
    rtol, atol = default_tolerance("F32", name)
    assert compare_arrays(exact, rounded, rtol=rtol, atol=atol)["ok"]
    wrong = (exact * 1.5).astype(fp8)
    assert compare_arrays(exact, wrong, rtol=rtol, atol=atol)["mismatched"] > 1000


# ---------------------------------------------------------------------------- layouts


@pytest.mark.parametrize(
    ("shape_a", "shape_b", "expected"),
    [
        ((2, 3, 4, 5), (2, 4, 5, 3), (0, 3, 1, 2)),  # NCHW reference, NHWC port
        ((2, 4, 5, 3), (2, 3, 4, 5), (0, 2, 3, 1)),  # NHWC reference, NCHW port
        ((2, 3, 4, 5, 6), (2, 4, 5, 6, 3), (0, 4, 1, 2, 3)),  # NCDHW vs NDHWC
        ((2, 4, 5, 6, 3), (2, 3, 4, 5, 6), (0, 2, 3, 4, 1)),
        ((2, 3, 7), (2, 7, 3), (0, 2, 1)),  # NCL vs NLC
        ((3, 7), (7, 3), (1, 0)),
    ],
)
def test_layout_permutation_finds_the_transpose(
    shape_a: tuple[int, ...], shape_b: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    permutation = layout_permutation(shape_a, shape_b)
    assert permutation == expected
    assert np.empty(shape_b).transpose(permutation).shape == shape_a


@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        ((2, 3, 4, 5), (2, 3, 4, 5)),  # equal: nothing to do
        ((3, 3), (3, 3)),
        ((2, 3, 4, 5), (2, 3, 4)),  # different rank
        ((3,), (4,)),  # 1-D has no layouts
        ((2, 3, 4, 5), (2, 3, 5, 6)),  # a different tensor
        ((2, 3, 4, 5), (3, 2, 4, 5)),  # a transpose, but not a layout change
        ((2, 3, 4), (3, 2, 4)),
        ((1, 2, 3, 4, 5, 6), (1, 3, 4, 5, 6, 2)),  # 6-D: not tried
    ],
)
def test_layout_permutation_none(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> None:
    assert layout_permutation(shape_a, shape_b) is None


# ---------------------------------------------------------------------------- numbers


def test_metrics_match_a_direct_float64_computation(rng: np.random.Generator) -> None:
    a = rng.standard_normal((37, 29)).astype(np.float32)
    b = (a + rng.standard_normal(a.shape) * 1e-3).astype(np.float32)
    a[0, :5] = 0.0
    b[0, :3] = 0.0  # both zero at three places, only a at two
    b[5, 5] = -a[5, 5]  # a sign flip: max_rel 2
    rtol, atol = 1e-3, 1e-4
    result = compare_arrays(a, b, rtol=rtol, atol=atol)
    expected = reference(a, b, rtol, atol)
    check_json(result)
    assert result["numel"] == a.size
    for key in ("max_abs", "max_rel", "min_atol"):
        assert result[key] == expected[key], key
    assert result["max_rel"] == 2.0
    # float32 pairs are summed from float32 differences (each rounded once, 2**-24) in
    # float32 rows: relative errors near 1e-7, held here to 1e-6.
    assert result["mean_abs"] == pytest.approx(expected["mean_abs"], rel=1e-6)
    # The cosine's deficit from 1 is what tells close tensors apart: float32 row sums
    # (the residual of a fixed scale, metrics._cosine_single) give it to 1e-5 of itself.
    assert 1 - result["cosine"] == pytest.approx(1 - expected["cosine"], rel=1e-5)
    assert result["range_a"] == expected["range_a"]
    assert result["range_b"] == expected["range_b"]
    width_a = expected["range_a"][1] - expected["range_a"][0]
    width_b = expected["range_b"][1] - expected["range_b"][0]
    assert result["range_ratio"] == pytest.approx(width_b / width_a, rel=1e-15)
    assert result["mismatched"] == expected["mismatched"] > 0
    assert result["ok"] is False
    assert result["worst"]["index"] == expected["worst"]
    i, j = expected["worst"]
    assert result["worst"]["a"] == float(a[i, j])
    assert result["worst"]["b"] == float(b[i, j])
    assert result["largest"]["index"] == expected["largest"]
    assert result["rel_rms"] == pytest.approx(expected["rel_rms"], rel=1e-6)
    assert result["rel_max"] == pytest.approx(expected["rel_max"], rel=1e-12)
    assert result["head_a"] == [float(x) for x in a.ravel()[:5]]
    assert result["head_b"] == [float(x) for x in b.ravel()[:5]]
    assert (result["nan_a"], result["nan_b"], result["inf_a"], result["inf_b"]) == (0, 0, 0, 0)


def test_worst_is_the_element_that_fails_its_tolerance_most() -> None:
    """Not the largest difference: a value of 100 off by 0.5 passes rtol 1e-2, while a
    value of 0.1 off by 0.2 is far outside it (the issue's complaint about ``worst``)."""
    a = np.array([100.0, 0.1, 1.0])
    b = np.array([100.5, 0.3, 1.0])
    result = compare_arrays(a, b, rtol=1e-2, atol=1e-5)
    assert result["worst"]["index"] == [1]
    assert result["largest"]["index"] == [0]
    assert result["rel_max"] == pytest.approx(0.005)
    assert result["rel_rms"] == pytest.approx(np.sqrt(0.25 + 0.04) / np.sqrt(1e4 + 0.01 + 1))


def test_min_atol_is_the_smallest_passing_atol(rng: np.random.Generator) -> None:
    a = rng.standard_normal(500)
    b = a + rng.standard_normal(500) * 1e-4
    rtol = 1e-5
    result = compare_arrays(a, b, rtol=rtol, atol=0.0)
    min_atol = result["min_atol"]
    assert min_atol > 0
    assert torch.isclose(torch.from_numpy(b), torch.from_numpy(a), rtol=rtol, atol=min_atol).all()
    below = np.nextafter(min_atol, 0) * (1 - 1e-9)
    assert compare_arrays(a, b, rtol=rtol, atol=below)["mismatched"] >= 1
    assert compare_arrays(a, b, rtol=rtol, atol=min_atol * 1.000001)["ok"]
    assert compare_arrays(a, a, rtol=rtol, atol=0.0)["min_atol"] == 0.0


@pytest.mark.parametrize(("rtol", "atol"), [(0.0, 0.0), (1e-3, 0.0), (0.0, 2e-3), (1e-2, 1e-3)])
def test_mismatched_counts_what_torch_isclose_rejects(
    rng: np.random.Generator, rtol: float, atol: float
) -> None:
    """Same criterion, same orientation (a is "expected"), same rounding, in float64."""
    a = rng.standard_normal((64, 33)) * rng.choice([1e-3, 1.0, 1e3], (64, 33))
    b = a * (1 + rng.standard_normal(a.shape) * 1e-2) + rng.standard_normal(a.shape) * 1e-3
    b[::7] = a[::7]
    result = compare_arrays(a, b, rtol=rtol, atol=atol)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    rejected = int((~torch.isclose(tb, ta, rtol=rtol, atol=atol)).sum())
    assert result["mismatched"] == rejected > 0
    assert result["mismatched"] == assert_close_outcome(tb, ta, rtol=rtol, atol=atol)
    assert result["ok"] is False


def test_rtol_is_relative_to_a_the_reference() -> None:
    a, b = np.array([1.0]), np.array([1.1])
    # |b - a| = 0.1: within 0.095 * |b| = 0.1045 but not within 0.095 * |a|.
    assert compare_arrays(a, b, rtol=0.095, atol=0.0)["mismatched"] == 1
    assert assert_close_outcome(torch.from_numpy(b), torch.from_numpy(a), rtol=0.095, atol=0) == 1
    assert compare_arrays(b, a, rtol=0.095, atol=0.0)["ok"]


@pytest.mark.parametrize("name", ["F64", "F32", "F16", "BF16"])
def test_ok_agrees_with_assert_close_on_native_dtypes(name: str) -> None:
    """Each element is either well inside or well outside the default tolerance, so the
    count does not hinge on how torch rounds the difference in bf16/fp16."""
    dtype = TORCH_DTYPES[name]
    generator = torch.Generator().manual_seed(7)
    expected = torch.randn(40, 50, generator=generator, dtype=torch.float64).to(dtype)
    rtol, atol = default_tolerance(name, name)
    exact = expected.double()
    allowed = atol + rtol * exact.abs()
    far = torch.rand(exact.shape, generator=generator) < 0.1
    sign = torch.where(torch.rand(exact.shape, generator=generator) < 0.5, -1.0, 1.0)
    actual = (exact + sign * torch.where(far, 3.0, 0.3) * allowed).to(dtype)
    result = compare_arrays(to_numpy(expected), to_numpy(actual), rtol=rtol, atol=atol)
    torch_count = assert_close_outcome(actual, expected)
    assert result["mismatched"] == torch_count == int(far.sum())
    assert result["ok"] is False
    same = compare_arrays(to_numpy(expected), to_numpy(expected), rtol=rtol, atol=atol)
    assert same["ok"] and same["max_abs"] == 0.0 and same["cosine"] == 1.0


def test_bf16_through_ml_dtypes_uses_the_exact_torch_values() -> None:
    generator = torch.Generator().manual_seed(3)
    ta = torch.randn(300, generator=generator).to(torch.bfloat16)
    tb = (ta.float() + torch.randn(300, generator=generator) * 0.05).to(torch.bfloat16)
    a, b = to_numpy(ta), to_numpy(tb)
    assert a.dtype == ml_dtypes.bfloat16
    result = compare_arrays(a, b, rtol=1.6e-2, atol=1e-5)
    assert result["head_a"] == ta[:5].double().tolist()
    assert result["head_b"] == tb[:5].double().tolist()
    diff = (ta.double() - tb.double()).abs()
    assert result["max_abs"] == diff.max().item()
    assert result["mean_abs"] == pytest.approx(diff.mean().item(), rel=1e-12)
    assert result["range_a"] == [ta.double().min().item(), ta.double().max().item()]
    worst = int(diff.argmax())
    assert result["worst"] == {"index": [worst], "a": ta[worst].item(), "b": tb[worst].item()}
    assert result["mismatched"] == assert_close_outcome(tb, ta)


def test_nan_and_inf() -> None:
    nan, inf = np.nan, np.inf
    a = np.array([nan, inf, -inf, 1.0, nan, inf, 2.0, 3.0, -inf], dtype=np.float32)
    b = np.array([nan, inf, inf, 1.0, 0.0, 5.0, nan, 3.5, -inf], dtype=np.float32)
    result = compare_arrays(a, b, rtol=0.0, atol=0.0)
    check_json(result)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    rejected = int((~torch.isclose(tb, ta, rtol=0, atol=0, equal_nan=True)).sum())
    assert result["mismatched"] == rejected == 5
    assert result["mismatched"] == assert_close_outcome(tb, ta, rtol=0, atol=0, equal_nan=True)
    assert (result["nan_a"], result["nan_b"], result["inf_a"], result["inf_b"]) == (2, 2, 4, 3)
    # The metrics cover the two pairs finite in both: (1, 1) and (3, 3.5).
    assert result["max_abs"] == 0.5
    assert result["mean_abs"] == 0.25
    assert result["range_a"] == [1.0, 3.0]
    assert result["range_b"] == [0.0, 5.0]
    assert result["worst"] == {"index": [7], "a": 3.0, "b": 3.5}
    assert result["head_a"] == ["nan", "inf", "-inf", 1.0, "nan"]
    assert result["head_b"] == ["nan", "inf", "inf", 1.0, 0.0]


@pytest.mark.parametrize("chunk", [1, 2, 1 << 20])
def test_a_nonfinite_mismatch_shows_in_worst_and_min_atol(chunk: int) -> None:
    """The finite metrics cannot see NaN-vs-number or inf-vs-(-inf); the count, ``worst``
    and ``min_atol`` must, while every value stays JSON."""
    nan, inf = np.nan, np.inf
    result = compare_arrays(
        np.array([1.0, nan]), np.array([1.0, 2.0]), rtol=0, atol=0, chunk_elements=chunk
    )
    check_json(result)
    assert result["ok"] is False
    assert result["mismatched"] == result["nonfinite_mismatched"] == 1
    assert result["max_abs"] == 0.0 and result["cosine"] == 1.0  # finite pairs only
    assert result["worst"] == {"index": [1], "a": "nan", "b": 2.0}
    assert result["min_atol"] is None  # no atol passes

    result = compare_arrays(np.array([inf]), np.array([-inf]), rtol=1e-5, atol=1e-8)
    check_json(result)
    assert result["ok"] is False
    assert result["mismatched"] == result["nonfinite_mismatched"] == 1
    assert result["max_abs"] is None and result["min_atol"] is None
    assert result["worst"] == {"index": [0], "a": "inf", "b": "-inf"}

    # Finite pairs all pass, several NaN/inf mismatches: the first of them, in C order of
    # the logical shape, also through a transposed b and tiny chunks.
    a = np.array([[1.0, 2.0, 3.0], [4.0, inf, 6.0]], dtype=np.float32)
    b = np.array([[1.0, 2.0, nan], [4.0, 5.0, -inf]], dtype=np.float32)
    b_t = np.ascontiguousarray(b.T)
    result = compare_arrays(a, b_t, rtol=0, atol=0, permutation=(1, 0), chunk_elements=chunk)
    check_json(result)
    assert result["mismatched"] == result["nonfinite_mismatched"] == 3
    assert result["worst"] == {"index": [0, 2], "a": 3.0, "b": "nan"}
    assert result["max_abs"] == 0.0 and result["min_atol"] is None and not result["ok"]


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_the_ports_nonfinite_values_are_counted_beside_the_reference_values(chunk: int) -> None:
    """An fp16 port that overflows holds inf where the reference holds 1.5e5: the
    statistics cover the finite pairs only, so they must say how many those are, and the
    reference's largest value where the port went non-finite is the overflow's evidence
    (the first NaN/inf mismatch, ``worst``, may be a smaller one)."""
    inf = np.inf
    a = np.array([[1.0, 7.0e4, 2.0], [1.5e5, 3.0, np.nan]], dtype=np.float32)
    b = np.array([[1.0, inf, 2.0], [inf, 3.0, np.nan]], dtype=np.float16)
    result = compare_arrays(a, b, rtol=0, atol=0, chunk_elements=chunk)
    check_json(result)
    assert result["finite_pairs"] == 3 and result["numel"] == 6
    assert result["port_nonfinite"] == 2  # the shared NaN is not the port's own
    assert result["nonfinite_at"] == {"index": [1, 0], "a": 1.5e5, "b": "inf"}
    clean = compare_arrays(a[:1, ::2], b[:1, ::2].astype(np.float32), rtol=0, atol=0)
    assert clean["port_nonfinite"] == 0 and clean["nonfinite_at"] is None
    assert clean["finite_pairs"] == clean["numel"] == 2


def test_a_failing_finite_pair_stays_worst_beside_nonfinite_mismatches() -> None:
    a = np.array([1.0, np.nan, 3.0, np.inf])
    b = np.array([1.0, 2.0, 5.0, 1.0])
    result = compare_arrays(a, b, rtol=0, atol=0)
    check_json(result)
    assert result["mismatched"] == 3 and result["nonfinite_mismatched"] == 2
    assert result["worst"] == {"index": [2], "a": 3.0, "b": 5.0}
    assert result["max_abs"] == 2.0
    assert result["min_atol"] is None  # 2.0 would fix the finite pair, not the others


def test_matching_nonfinite_values_do_not_count() -> None:
    nan, inf = np.nan, np.inf
    a = np.array([nan, inf, -inf, 1.0])
    result = compare_arrays(a, np.array([nan, inf, -inf, 1.5]), rtol=0, atol=0)
    check_json(result)
    assert result["mismatched"] == 1 and result["nonfinite_mismatched"] == 0
    assert result["min_atol"] == 0.5 and result["worst"]["index"] == [3]
    same = compare_arrays(a, a.copy(), rtol=0, atol=0)
    assert same["ok"] and same["nonfinite_mismatched"] == 0 and same["min_atol"] == 0.0


def exact_reference(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Mismatches, the largest difference and where it first occurs, in Python ints."""
    pairs = zip(a.ravel().tolist(), b.ravel().tolist(), strict=True)
    diffs = [abs(int(x) - int(y)) for x, y in pairs]
    largest = max(diffs)
    return {
        "mismatched": sum(d != 0 for d in diffs),
        "max_abs": float(largest),
        "worst": list(np.unravel_index(diffs.index(largest), a.shape)),
    }


@pytest.mark.parametrize(
    ("a", "b", "max_abs"),
    [
        (np.array([2**60], np.int64), np.array([2**60 + 1], np.int64), 1.0),
        (np.array([2**64 - 1], np.uint64), np.array([2**64 - 2], np.uint64), 1.0),
        (np.array([2**63 + 1], np.uint64), np.array([2**63], np.uint64), 1.0),
        (np.array([-(2**63)], np.int64), np.array([-(2**63) + 1], np.int64), 1.0),
        (np.array([2**63 - 1], np.int64), np.array([2**63 - 1], np.uint64), None),
        (np.array([2**64 - 1], np.uint64), np.array([-1], np.int64), float(2**64)),
        (np.array([-(2**63)], np.int64), np.array([2**64 - 1], np.uint64), float(3 * 2**63 - 1)),
        (np.array([-(2**63)], np.int64), np.array([2**63 - 1], np.int64), float(2**64 - 1)),
    ],
)
def test_integers_compare_exactly_beyond_2_53(
    a: np.ndarray, b: np.ndarray, max_abs: float | None
) -> None:
    rtol, atol = default_tolerance(str(a.dtype), str(b.dtype))
    assert (rtol, atol) == (0.0, 0.0)
    result = compare_arrays(a, b, rtol=rtol, atol=atol)
    check_json(result)
    if max_abs is None:
        assert result["ok"] and result["mismatched"] == 0 and result["max_abs"] == 0.0
        return
    assert result["ok"] is False and result["mismatched"] == 1
    assert result["max_abs"] == max_abs > 0
    assert result["min_atol"] == max_abs
    assert result["worst"] == {"index": [0], "a": int(a[0]), "b": int(b[0])}
    assert result["nonfinite_mismatched"] == 0


def test_int64_mismatches_agree_with_torch_beyond_2_53() -> None:
    a = np.array([2**60, 2**62 + 3, -(2**61), 7, 2**53 + 1], np.int64)
    b = np.array([2**60 + 1, 2**62 + 3, -(2**61) - 2, 7, 2**53], np.int64)
    result = compare_arrays(a, b, rtol=0, atol=0)
    torch_count = assert_close_outcome(torch.from_numpy(b), torch.from_numpy(a))
    assert result["mismatched"] == torch_count == 3
    assert result["max_abs"] == 2.0 and result["worst"]["index"] == [2]


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 20])
def test_exact_integer_path_streams_by_chunks(rng: np.random.Generator, chunk: int) -> None:
    """Huge int64 vs uint64 values, ties and carries past 2**64, through contiguous and
    strided blocks: the exact answers never depend on the chunking."""
    shape = (4, 5, 6)
    a = rng.integers(-(2**63), 2**63 - 1, shape, dtype=np.int64, endpoint=True)
    a[0] = rng.integers(0, 2**62, shape[1:], dtype=np.int64)
    b = a.astype(np.uint64)  # equal where a >= 0, wrapped (far off) where a < 0
    b[0, 0, :3] += np.uint64(1)  # off by one at ~2**62: invisible to float64
    expected = exact_reference(a, b)
    result = compare_arrays(a, b, rtol=0, atol=0, chunk_elements=chunk)
    check_json(result)
    assert result["mismatched"] == expected["mismatched"] == int((a < 0).sum()) + 3
    assert result["max_abs"] == expected["max_abs"]
    assert result["worst"]["index"] == expected["worst"]
    b_t = np.ascontiguousarray(b.transpose(0, 2, 1))
    strided = compare_arrays(a, b_t, rtol=0, atol=0, permutation=(0, 2, 1), chunk_elements=chunk)
    assert_same_result(strided, result)

    near = a[0].copy()  # only the three ones: max_abs 1, first of the ties is worst
    result = compare_arrays(near, b[0].astype(np.int64), rtol=0, atol=0, chunk_elements=chunk)
    assert result["mismatched"] == 3 and result["max_abs"] == 1.0 and result["min_atol"] == 1.0
    assert result["worst"]["index"] == [0, 0]


@pytest.mark.parametrize(
    ("dtype_a", "dtype_b"),
    [(np.int64, np.int64), (np.int32, np.uint8), (np.uint64, np.int16), (np.bool_, np.int8)],
)
@pytest.mark.parametrize(("rtol", "atol"), [(0.0, 0.0), (0.1, 2.0)])
def test_small_integers_give_the_float64_answers(
    rng: np.random.Generator, dtype_a: Any, dtype_b: Any, rtol: float, atol: float
) -> None:
    """Below 2**53 the exact path must give every metric the float64 path gives."""
    high = 2 if np.bool_ in (dtype_a, dtype_b) else 100
    low = 0 if np.issubdtype(dtype_a, np.unsignedinteger) or dtype_a is np.bool_ else -high
    a = rng.integers(low, high, (9, 11)).astype(dtype_a)
    b = a.astype(np.int64) + rng.integers(-3, 4, a.shape) * (rng.random(a.shape) < 0.3)
    b = np.clip(b, 0 if dtype_b in (np.uint8, np.bool_) else -200, high).astype(dtype_b)
    result = compare_arrays(a, b, rtol=rtol, atol=atol, chunk_elements=17)
    check_json(result)
    floats = compare_arrays(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)
    assert_same_result(result, floats)  # ints compare equal to the same floats
    assert all(type(x) is int for x in result["head_a"] + result["head_b"])


def test_nothing_finite_to_measure() -> None:
    a = np.full((2, 3), np.nan)
    result = compare_arrays(a, a.copy(), rtol=1e-5, atol=1e-8)
    check_json(result)
    assert result["ok"] and result["mismatched"] == 0
    assert result["nan_a"] == result["nan_b"] == 6
    for key in ("max_abs", "mean_abs", "max_rel", "cosine", "range_a", "range_ratio", "worst"):
        assert result[key] is None, key


@pytest.mark.filterwarnings("error")  # overflow is expected and reported, not warned about
def test_overflowing_difference_is_a_string_not_a_bare_inf() -> None:
    a, b = np.array([1e308, 1.0]), np.array([-1e308, 1.0])
    result = compare_arrays(a, b, rtol=1e-7, atol=1e-7)
    check_json(result)
    assert result["max_abs"] == "inf"
    assert result["cosine"] == "nan"
    assert result["mismatched"] == 1
    assert result["worst"] == {"index": [0], "a": 1e308, "b": -1e308}


def test_zeros_guard_max_rel_and_cosine() -> None:
    zeros = np.zeros(4, dtype=np.float32)
    tiny = np.array([0.0, 1e-30, 0.0, 0.0], dtype=np.float32)
    result = compare_arrays(zeros, tiny, rtol=1e-6, atol=1e-5)
    assert result["max_rel"] == 1.0  # relative to the larger magnitude, not to |a| = 0
    assert result["cosine"] == 0.0  # one side all zero
    assert result["range_ratio"] is None  # a's range is 0
    assert result["ok"]  # 1e-30 is within atol
    both = compare_arrays(zeros, zeros.copy(), rtol=1e-6, atol=1e-5)
    assert both["max_rel"] == 0.0 and both["cosine"] == 1.0 and both["max_abs"] == 0.0
    assert both["worst"] == {"index": [0], "a": 0.0, "b": 0.0}
    flipped = compare_arrays(np.array([1.0, -2.0]), np.array([-1.0, 2.0]), rtol=0, atol=0)
    assert flipped["max_rel"] == 2.0
    assert flipped["cosine"] == pytest.approx(-1.0, abs=1e-15)


def test_integer_and_bool_tensors_compare_exactly(rng: np.random.Generator) -> None:
    a = rng.integers(-1000, 1000, (6, 7), dtype=np.int64)
    b = a.copy()
    b[1, 2] += 1
    b[4, 0] -= 7
    rtol, atol = default_tolerance("I64", "I64")
    result = compare_arrays(a, b, rtol=rtol, atol=atol)
    check_json(result)
    assert result["mismatched"] == 2
    assert result["mismatched"] == assert_close_outcome(torch.from_numpy(b), torch.from_numpy(a))
    assert result["worst"] == {"index": [4, 0], "a": int(a[4, 0]), "b": int(b[4, 0])}
    assert all(type(x) is int for x in result["head_a"] + result["head_b"])
    assert result["head_a"] == a.ravel()[:5].tolist()
    assert result["max_abs"] == 7.0

    big = np.array([2**40 + 1, 5], dtype=np.int64)  # beyond float32, exact in float64
    assert compare_arrays(big, np.array([2**40, 5]), rtol=0, atol=0)["mismatched"] == 1

    flags = rng.random(20) < 0.5
    flipped = flags.copy()
    flipped[[3, 11]] = ~flipped[[3, 11]]
    result = compare_arrays(flags, flipped, rtol=0.0, atol=0.0)
    check_json(result)
    assert (
        result["mismatched"]
        == 2
        == assert_close_outcome(torch.from_numpy(flipped), torch.from_numpy(flags))
    )
    assert result["head_a"] == [int(x) for x in flags[:5]]
    assert result["worst"]["index"] == [3]
    assert result["worst"]["a"] in (0, 1) and type(result["worst"]["a"]) is int

    mixed = compare_arrays(np.arange(5, dtype=np.uint8), np.arange(5.0), rtol=0, atol=0)
    assert mixed["ok"] and mixed["head_a"] == [0, 1, 2, 3, 4] and mixed["head_b"][1] == 1.0


def test_zero_dimensional() -> None:
    result = compare_arrays(np.array(1.5, np.float32), np.float32(1.75), rtol=0.2, atol=0.0)
    check_json(result)
    assert result["numel"] == 1
    assert result["max_abs"] == 0.25 and result["ok"]  # 0.25 <= 0.2 * 1.5
    assert compare_arrays(np.array(1.5), np.array(1.75), rtol=0.1, atol=0.0)["mismatched"] == 1
    assert result["worst"] == {"index": [], "a": 1.5, "b": 1.75}
    assert result["head_a"] == [1.5] and result["head_b"] == [1.75]


@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [((0,), (0,)), ((3, 0, 4), (3, 0, 4)), ((0, 3, 4, 5), (0, 4, 5, 3)), ((2, 0, 3), (2, 3, 0))],
)
def test_empty_tensors(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> None:
    a, b = np.zeros(shape_a, np.float32), np.zeros(shape_b, ml_dtypes.bfloat16)
    permutation = layout_permutation(shape_a, shape_b)
    result = compare_arrays(a, b, rtol=1e-3, atol=1e-5, permutation=permutation, chunk_elements=1)
    check_json(result)
    assert result["ok"] is True
    assert result["numel"] == result["mismatched"] == result["nan_a"] == 0
    assert result["head_a"] == result["head_b"] == []
    assert result["worst"] is None and result["max_abs"] is None and result["cosine"] is None


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        compare_arrays(np.zeros((2, 3)), np.zeros((3, 2)), rtol=0, atol=0)
    with pytest.raises(ValueError):
        compare_arrays(np.zeros((2, 3)), np.zeros((3, 2)), rtol=0, atol=0, permutation=(0, 1, 2))
    with pytest.raises(ValueError, match="shapes differ"):
        compare_arrays(
            np.zeros((2, 3, 4)), np.zeros((2, 3, 4)), rtol=0, atol=0, permutation=(0, 2, 1)
        )
    with pytest.raises(TypeError, match="complex"):
        compare_arrays(np.zeros(2, np.complex64), np.zeros(2, np.complex64), rtol=0, atol=0)
    with pytest.raises(ValueError):
        compare_arrays(np.zeros(2), np.zeros(2), rtol=0, atol=0, chunk_elements=0)


# ---------------------------------------------------------------------------- chunking


def tricky_pair(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """float32 pairs with NaN/inf, exact zeros and many tied differences (values on a
    0.25 grid), so any chunk-boundary mistake in counts, maxima or the worst index shows."""
    a = (rng.integers(-8, 8, shape) / 4).astype(np.float32)
    b = (a + rng.integers(-1, 2, shape) / 4).astype(np.float32)
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    n = flat_a.size
    picks = rng.choice(n, size=min(n, 12), replace=False)
    flat_b[picks[:4]] = flat_a[picks[:4]] + 3.0  # tied largest differences
    flat_a[picks[4:6]] = np.nan
    flat_b[picks[5:7]] = np.nan
    flat_a[picks[7:9]] = np.inf
    flat_b[picks[8:10]] = -np.inf
    return a, b


def assert_same_result(result: dict[str, Any], baseline: dict[str, Any]) -> None:
    for key in KEYS - SUMS:
        assert result[key] == baseline[key], key
    # float32 pairs sum in float32 rows cut where the chunks are, and their cosine's
    # scale s0 comes from the first chunk: the same to 1e-6, not to the last bit.
    for key in SUMS:
        assert result[key] == pytest.approx(baseline[key], rel=1e-6), key


@pytest.mark.parametrize("chunk", [1, 7, 13, 64])
@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 50), (211,), (2, 7, 3, 5)])
def test_result_does_not_depend_on_chunk_size(
    rng: np.random.Generator, shape: tuple[int, ...], chunk: int
) -> None:
    a, b = tricky_pair(rng, shape)
    baseline = compare_arrays(a, b, rtol=0.1, atol=0.01)
    assert_same_result(compare_arrays(a, b, rtol=0.1, atol=0.01, chunk_elements=chunk), baseline)
    # The same values with a non-contiguous reference take the index-block path.
    wide_a = np.zeros((*shape[:-1], shape[-1] * 2), np.float32)
    wide_a[..., ::2] = a
    strided = compare_arrays(wide_a[..., ::2], b, rtol=0.1, atol=0.01, chunk_elements=chunk)
    assert_same_result(strided, baseline)
    assert baseline["worst"]["index"] == list(np.unravel_index(baseline_worst(a, b, 0.1), shape))
    assert baseline["largest"]["index"] == list(np.unravel_index(baseline_worst(a, b, 0), shape))


@pytest.mark.parametrize("chunk", [1, 4, 7, 35, 36, 1000])
@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 50), (1, 1, 9), (4, 3, 1, 6)])
def test_index_blocks_cover_in_order_within_the_chunk(shape: tuple[int, ...], chunk: int) -> None:
    """The memory bound rests on this: every block is at most ``chunk`` elements, even
    when one row along axis 0 is longer, and the blocks tile the array in C order."""
    from mldbg.compare.judge.metrics import _index_blocks

    numbers = np.arange(int(np.prod(shape))).reshape(shape)
    blocks = [numbers[index].ravel() for index in _index_blocks(shape, chunk)]
    assert all(0 < block.size <= chunk for block in blocks)
    assert np.concatenate(blocks).tolist() == list(range(numbers.size))


def baseline_worst(a: np.ndarray, b: np.ndarray, rtol: float) -> int:
    """The first element with the largest finite ``|b - a| - rtol |a|``, computed directly."""
    a64 = a.astype(np.float64).ravel()
    diff = np.abs(a64 - b.astype(np.float64).ravel()) - rtol * np.abs(a64)
    diff[~np.isfinite(diff)] = -np.inf
    return int(np.argmax(diff))


@pytest.mark.parametrize("chunk", [1, 7, 29, 1 << 22])
def test_transposed_nhwc_port_streams_from_memmaps(
    rng: np.random.Generator, tmp_path: Path, chunk: int
) -> None:
    a, b_nchw = tricky_pair(rng, (3, 5, 4, 7))  # N, C, H, W
    b_nhwc = np.ascontiguousarray(b_nchw.transpose(0, 2, 3, 1))
    permutation = layout_permutation(a.shape, b_nhwc.shape)
    assert permutation == (0, 3, 1, 2)
    baseline = compare_arrays(a, b_nchw, rtol=0.1, atol=0.01)  # the same layout, in memory

    def on_disk(name: str, array: np.ndarray) -> np.ndarray:
        mapped = np.memmap(tmp_path / name, dtype=array.dtype, mode="w+", shape=array.shape)
        mapped[...] = array
        mapped.flush()
        del mapped
        return np.memmap(tmp_path / name, dtype=array.dtype, mode="r", shape=array.shape)

    mapped_a, mapped_b = on_disk("a.bin", a), on_disk("b.bin", b_nhwc)
    result = compare_arrays(
        mapped_a, mapped_b, rtol=0.1, atol=0.01, permutation=permutation, chunk_elements=chunk
    )
    check_json(result)
    assert_same_result(result, baseline)
    assert result["head_b"] == [
        x if np.isfinite(x) else str(x).lower() for x in b_nchw.ravel()[:5].tolist()
    ]


def test_streams_a_200mb_memmap_in_bounded_memory(tmp_path: Path) -> None:
    """tracemalloc sees numpy's buffers (not the mapped file), so its peak is the working
    memory: it must stay far below the size of the tensor, let alone its float64 copy."""
    shape = (6400, 8192)  # 200 MiB of float32
    rng = np.random.default_rng(5)
    files = {}
    for name in ("a", "b"):
        files[name] = np.memmap(tmp_path / name, dtype=np.float32, mode="w+", shape=shape)
    for start in range(0, shape[0], 800):
        rows = rng.standard_normal((800, shape[1]), dtype=np.float32)
        files["a"][start : start + 800] = rows
        rows += np.float32(1e-3)
        files["b"][start : start + 800] = rows
    for mapped in files.values():
        mapped.flush()
    del files, rows, mapped
    a = np.memmap(tmp_path / "a", dtype=np.float32, mode="r", shape=shape)
    b = np.memmap(tmp_path / "b", dtype=np.float32, mode="r", shape=shape)
    tracemalloc.start()
    try:
        result = compare_arrays(a, b, rtol=1e-3, atol=1e-5, chunk_elements=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert a.nbytes == 200 * 2**20
    # About 18 bytes per chunk element for float32 pairs (46 in float64); bounded by the
    # chunk, not by the tensor.
    assert peak < 64 * (1 << 20) < a.nbytes / 3, f"peak {peak / 2**20:.0f} MiB"
    assert result["numel"] == a.size
    assert result["max_abs"] == pytest.approx(1e-3, rel=1e-2)
    assert result["mean_abs"] == pytest.approx(1e-3, rel=1e-2)
    assert result["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert 0 < result["mismatched"] < a.size
