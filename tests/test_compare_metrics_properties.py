"""Property tests: ``compare_arrays`` against a straightforward float64 reference.

``compare_arrays`` measures float32-or-narrower pairs in float32 (with float64 row sums
and float64 values for the elements it picks) and everything else in float64; these
tests draw pairs of every kind -- NaN/inf, bf16, fp16, integers, empty tensors, values up
to float32's and float64's limits, subnormals, close pairs and unrelated ones, many
chunk sizes -- and hold each metric to the accuracy its docstring promises:

* counts (``mismatched``, ``nonfinite_mismatched``, NaN/inf) and ranges: exact, the
  tolerance test being ``torch.isclose`` on float32 tensors for float32-or-narrower
  pairs (what torch itself evaluates there) and on float64 tensors otherwise;
* ``max_abs``, ``max_rel``: the exact float64 value of an element whose float32
  difference ties the largest one, so within 2**-22 of the true maximum;
* the sums (``mean_abs``, ``rel_rms``, ``rms_*``, ``cosine``): within the float32 row
  bound SUM_ROW * 2**-24 (float64 pairs: 1e-9, the cosine 1e-12); and where the verdict
  reads the cosine to 1e-6 (``exact_scale``: a port equal to its reference times a
  scale), a test of its own below.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mldbg.compare.judge.metrics import SUM_ROW, compare_arrays

SINGLE_SUMS = SUM_ROW * 2.0**-24 + 2.0**-22  # the float32 row bound, plus the differences'
CHOSEN = 2.0**-22  # an element picked in float32: its difference within 2 roundings

FLOAT_KINDS = {
    "f32": np.float32,
    "bf16": ml_dtypes.bfloat16,
    "f16": np.float16,
    "f64": np.float64,
    "i32": np.int32,
    "i8": np.int8,
}
SINGLE = {"f32", "bf16", "f16"}


def as_number(value: Any) -> float:
    """A JSON metric as a float ("inf"/"nan" strings included)."""
    return float(value)


def isclose_count(a: np.ndarray, b: np.ndarray, rtol: float, atol: float, single: bool) -> int:
    """Elements torch.isclose rejects (b against expected a), in float32 or float64."""
    dtype = np.float32 if single else np.float64
    ta = torch.from_numpy(a.astype(dtype).ravel())
    tb = torch.from_numpy(b.astype(dtype).ravel())
    return int((~torch.isclose(tb, ta, rtol=rtol, atol=atol, equal_nan=True)).sum())


def reference(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> dict[str, Any]:
    """The metrics the obvious way, on whole float64 copies (ints below 2**53)."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    finite_a, finite_b = np.isfinite(a64), np.isfinite(b64)
    both = finite_a & finite_b
    same = (np.isnan(a64) & np.isnan(b64)) | (a64 == b64)
    fa, fb = a64[both], b64[both]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        diff = np.abs(fa - fb)
        larger = np.maximum(np.abs(fa), np.abs(fb))
        rel = np.where(larger == 0, 0.0, diff / larger)
        result: dict[str, Any] = {
            "nan_a": int(np.isnan(a64).sum()),
            "nan_b": int(np.isnan(b64).sum()),
            "inf_a": int(np.isinf(a64).sum()),
            "inf_b": int(np.isinf(b64).sum()),
            "nonfinite_mismatched": int((~both & ~same).sum()),
            "range_a": [a64[finite_a].min(), a64[finite_a].max()] if finite_a.any() else None,
            "range_b": [b64[finite_b].min(), b64[finite_b].max()] if finite_b.any() else None,
        }
        if not fa.size:
            return result
        norm_a, norm_b = math.hypot(*fa), math.hypot(*fb)
        result.update(
            max_abs=float(diff.max()),
            max_rel=float(rel.max()),
            mean_abs=float(diff.mean()),
            min_atol=max(0.0, float((diff - rtol * np.abs(fa)).max())),
            rel_rms=math.hypot(*diff) / norm_a if norm_a else None,
            rms_a=norm_a / math.sqrt(fa.size),
            rms_b=norm_b / math.sqrt(fb.size),
            cosine=math.fsum(fa * fb) / norm_a / norm_b if norm_a and norm_b else None,
            diff=diff,
            positions=np.flatnonzero(both),
        )
    return result


def check(a: np.ndarray, b: np.ndarray, rtol: float, atol: float, chunk: int) -> None:
    single = a.dtype.name in ("float32", "bfloat16", "float16") and b.dtype.name in (
        "float32",
        "bfloat16",
        "float16",
    )
    exact_ints = a.dtype.kind == "i" and b.dtype.kind == "i"
    result = compare_arrays(a, b, rtol=rtol, atol=atol, chunk_elements=chunk)
    expected = reference(a, b, rtol, atol)
    sums = SINGLE_SUMS if single else 1e-9
    for key in ("nan_a", "nan_b", "inf_a", "inf_b", "nonfinite_mismatched"):
        assert result[key] == expected[key], key
    assert result["mismatched"] == isclose_count(a, b, rtol, atol, single or exact_ints)
    assert result["ok"] == (result["mismatched"] == 0)
    for side in ("range_a", "range_b"):
        got = result[side]
        assert (got is None) == (expected[side] is None)
        if got is not None:
            assert [as_number(x) for x in got] == expected[side], side
    if "max_abs" not in expected:  # no pair finite in both
        assert result["max_abs"] is None and result["cosine"] is None
        return
    true_max = expected["max_abs"]
    if math.isinf(true_max):  # float64 pairs beyond float64: reported, not a bare inf
        assert result["max_abs"] == "inf"
        return
    tolerance = CHOSEN if single else 0.0
    assert as_number(result["max_abs"]) == pytest.approx(true_max, rel=tolerance, abs=0)
    assert as_number(result["max_rel"]) == pytest.approx(expected["max_rel"], rel=2 * tolerance)
    largest = result["largest"]["index"]
    flat = int(np.ravel_multi_index(largest, a.shape)) if a.ndim else 0
    at = int(np.searchsorted(expected["positions"], flat))
    assert expected["positions"][at] == flat  # a pair finite in both
    assert expected["diff"][at] >= true_max * (1 - 2 * tolerance)
    if result["nonfinite_mismatched"]:
        assert result["min_atol"] is None
    else:
        slack = tolerance * (true_max + rtol * expected["rms_a"] * math.sqrt(a.size) + atol)
        assert as_number(result["min_atol"]) == pytest.approx(expected["min_atol"], abs=slack)
    assert as_number(result["mean_abs"]) == pytest.approx(expected["mean_abs"], rel=sums)
    for key in ("rms_a", "rms_b"):
        if math.isfinite(expected[key]) and result[key] != "inf":
            assert as_number(result[key]) == pytest.approx(expected[key], rel=sums), key
    if expected["rel_rms"] is not None and math.isfinite(expected["rel_rms"]):
        assert as_number(result["rel_rms"]) == pytest.approx(expected["rel_rms"], rel=2 * sums)
    cosine = expected["cosine"]
    if cosine is not None and math.isfinite(cosine) and result["cosine"] != "nan":
        slack = 4 * sums if single else 1e-12
        assert as_number(result["cosine"]) == pytest.approx(cosine, rel=slack, abs=slack**2)


def floats_of(kind: str) -> st.SearchStrategy[float]:
    """Any value of the dtype; float64 within 1e-150..1e150 (and 0, NaN, inf), where its
    squares are float64 numbers: beyond, the float64 path's sums under- or overflow (its
    documented limit, the same before and after the float32 pass)."""
    width = 16 if kind == "f16" else 32 if kind in SINGLE else 64
    values = st.floats(allow_nan=True, allow_infinity=True, width=width)
    if width == 64:
        return values.filter(lambda x: not math.isfinite(x) or x == 0 or 1e-150 < abs(x) < 1e150)
    return values


@st.composite
def small_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Small tensors of any values (NaN, inf, subnormals, the dtype's extremes), b either
    unrelated, a perturbed copy of a, or a copy with a few elements changed."""
    kind_a = draw(st.sampled_from(sorted(FLOAT_KINDS)))
    kind_b = draw(st.sampled_from([kind_a, *sorted(FLOAT_KINDS)]))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9))

    def array(kind: str) -> np.ndarray:
        dtype = FLOAT_KINDS[kind]
        if kind.startswith("i"):
            info = np.iinfo(dtype)
            values = draw(hnp.arrays(dtype, shape, elements=st.integers(info.min, info.max)))
            return np.asarray(values)
        elements = floats_of("f32" if kind == "bf16" else kind)
        values = draw(hnp.arrays(np.float32 if kind == "bf16" else dtype, shape, elements=elements))
        return np.asarray(values).astype(dtype)

    a = array(kind_a)
    how = draw(st.sampled_from(["unrelated", "perturbed", "edited"]))
    if how == "unrelated" or a.size == 0:
        return a, array(kind_b)
    with np.errstate(all="ignore"):
        if how == "perturbed":
            scale = draw(st.sampled_from([1e-7, 1e-3, 0.5]))
            noise = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).standard_normal(a.shape)
            b = (a.astype(np.float64) * (1 + scale * noise)).astype(FLOAT_KINDS[kind_b])
        else:
            b = a.astype(FLOAT_KINDS[kind_b])
            edits = draw(st.lists(st.integers(0, a.size - 1), max_size=3))
            flat = b.reshape(-1)
            for index in edits:
                flat[index] = draw(floats_of(kind_b)) if kind_b[0] == "f" or kind_b == "bf16" else 0
    return a, np.asarray(b)


@st.composite
def large_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Several float32 rows (SUM_ROW) and blocks, at one scale from 2**-70 to 2**70, a
    port off by a relative error from 1e-7 to 1e-1, with NaN/inf sprinkled in or not."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind_a = draw(st.sampled_from(["f32", "bf16", "f16"]))
    kind_b = draw(st.sampled_from(["f32", "bf16"]))
    size = draw(st.integers(SUM_ROW - 3, 3 * SUM_ROW + 5))
    scale = 2.0 ** draw(st.integers(-70, 70))
    values = rng.standard_normal(size) * scale
    error = draw(st.sampled_from([1e-7, 1e-4, 1e-2, 1e-1]))
    port = values * (1 + error * rng.standard_normal(size))
    with np.errstate(all="ignore"):
        a, b = values.astype(FLOAT_KINDS[kind_a]), port.astype(FLOAT_KINDS[kind_b])
    if draw(st.booleans()):
        spots = rng.choice(size, size=4, replace=False)
        a[spots[:2]] = np.nan
        b[spots[1:3]] = np.inf
    return a, b


TOLERANCES = st.sampled_from([(0.0, 0.0), (1.3e-6, 1e-5), (1.6e-2, 1e-5), (1e-3, 0.0)])
CHUNKS = st.sampled_from([1, 3, 64, 1000, SUM_ROW, 1 << 17])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=small_pairs(), tolerance=TOLERANCES, chunk=CHUNKS)
def test_small_pairs_agree_with_the_float64_reference(
    pair: tuple[np.ndarray, np.ndarray], tolerance: tuple[float, float], chunk: int
) -> None:
    a, b = pair
    note(f"a={a!r} b={b!r}")
    check(a, b, tolerance[0], tolerance[1], chunk)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=large_pairs(), tolerance=TOLERANCES, chunk=st.sampled_from([1000, SUM_ROW, 1 << 17]))
def test_large_single_precision_pairs_agree_with_the_float64_reference(
    pair: tuple[np.ndarray, np.ndarray], tolerance: tuple[float, float], chunk: int
) -> None:
    a, b = pair
    check(a, b, tolerance[0], tolerance[1], chunk)


def test_the_float32_pass_keeps_the_ulps_a_bf16_port_differs_by() -> None:
    """A bf16 port one ulp off everywhere: float32 holds those differences exactly, so the
    numbers match float64's to the last bit where no sum is involved."""
    values = np.random.default_rng(2).standard_normal(3 * SUM_ROW).astype(ml_dtypes.bfloat16)
    bits = values.view(np.uint16).copy()
    bits[::2] += 1
    port = bits.view(ml_dtypes.bfloat16)
    result = compare_arrays(values, port, rtol=1.6e-2, atol=1e-5)
    expected = reference(values, port, 1.6e-2, 1e-5)
    assert result["max_abs"] == expected["max_abs"]
    assert result["max_rel"] == expected["max_rel"]
    assert result["mismatched"] == 0
    assert result["mean_abs"] == pytest.approx(expected["mean_abs"], rel=1e-6)


@pytest.mark.parametrize("kind", ["f32", "bf16"])
@pytest.mark.parametrize("scale", [1.0, 2.0, 0.7, -0.125, 1 + 2.0**-13, 3e5])
def test_a_scaled_port_reads_as_one_to_the_verdict(kind: str, scale: float) -> None:
    """``verdict.exact_scale`` reads ``sqrt(1 - cosine**2)`` (the residual of the best
    scale) down to 1e-6: a port that is its reference times a scale, rounded to its
    dtype, must show a residual of about one rounding, and one with an error of 1e-4 on
    top must show that error, not the noise of float32 sums."""
    from mldbg.compare.judge.bounds import exact_scale

    rng = np.random.default_rng(3)
    dtype = FLOAT_KINDS[kind]
    values = rng.standard_normal(5 * SUM_ROW + 17)
    a = values.astype(dtype)
    b = (a.astype(np.float64) * scale).astype(dtype)
    u = 2.0**-8 if kind == "bf16" else 2.0**-24
    result = compare_arrays(a, b, rtol=0.0, atol=0.0, chunk_elements=3000)
    residual = math.sqrt(max(0.0, 1.0 - float(result["cosine"]) ** 2))
    assert residual <= 2 * u
    if scale != 1.0 and abs(scale - 1.0) > 1e-3:
        assert exact_scale(result, 1e-7 if kind == "f32" else 1e-3) == pytest.approx(
            scale, rel=2 * u + 1e-6
        )
    noise = rng.standard_normal(a.size) * 1e-4 * np.abs(scale)
    noisy = (a.astype(np.float64) * scale + noise).astype(np.float32)
    if kind == "f32":
        result = compare_arrays(a, noisy, rtol=0.0, atol=0.0, chunk_elements=3000)
        residual = math.sqrt(max(0.0, 1.0 - float(result["cosine"]) ** 2))
        truth = np.linalg.norm(noise) / np.linalg.norm(a.astype(np.float64) * scale + noise)
        assert residual == pytest.approx(truth, rel=0.05)
