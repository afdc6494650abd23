"""The one dtype table (mldbg.dtypes) against what numpy, ml_dtypes, torch and MLX say."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mldbg import dtypes
from mldbg.capture.safetensors_header import DTYPE_BITS
from mldbg.compare.judge.bounds import unit_roundoff
from mldbg.compare.judge.metrics import default_tolerance
from mldbg.compare.read.arrays import dtype_name, numpy_dtype

FLOATS = [d for d in dtypes.TABLE if d.kind == "float" and d.max_finite is not None]


def numpy_type(entry: dtypes.DType) -> np.dtype:
    return np.dtype(getattr(np, entry.numpy, None) or getattr(ml_dtypes, entry.numpy))


@pytest.mark.parametrize("entry", FLOATS, ids=lambda d: d.code)
def test_each_float_formats_numbers_are_its_finfo(entry: dtypes.DType) -> None:
    info = ml_dtypes.finfo(numpy_type(entry))
    assert entry.max_finite == float(info.max)
    assert entry.min_normal == float(info.smallest_normal)
    assert entry.min_subnormal == float(info.smallest_subnormal)
    assert entry.unit_roundoff == float(info.eps) / 2  # half an ulp at 1
    assert entry.bits == info.bits


@pytest.mark.parametrize("entry", dtypes.TABLE, ids=lambda d: d.code)
def test_every_name_of_a_dtype_finds_it(entry: dtypes.DType) -> None:
    assert dtypes.lookup(entry.code) is entry
    assert dtypes.lookup(entry.numpy) is entry
    assert dtypes.code(f"torch.{entry.numpy}") == entry.code
    assert dtypes.code(f"mlx.core.{entry.numpy}") == entry.code
    if entry.bits % 8 == 0 and (entry.safetensors or hasattr(np, entry.numpy)):
        assert dtype_name(numpy_dtype(entry.code)) == entry.code  # a file's dtype, both ways
        assert dtypes.code(numpy_type(entry)) == entry.code


def test_framework_dtypes_name_themselves() -> None:
    torch = pytest.importorskip("torch")
    mx = pytest.importorskip("mlx.core")
    for value, code in (
        (torch.bfloat16, "BF16"),
        (torch.float8_e4m3fn, "F8_E4M3"),
        (torch.int64, "I64"),
        (mx.bfloat16, "BF16"),
        (mx.float16, "F16"),
        (mx.uint32, "U32"),
        (np.dtype("<f4"), "F32"),
    ):
        assert dtypes.code(value) == code


def test_safetensors_sizes_come_from_the_table() -> None:
    """The format's own list (safetensors' Dtype enum): no more, no fewer."""
    assert set(DTYPE_BITS) == {
        "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2",
        "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64",
    }  # fmt: skip
    assert DTYPE_BITS["F4"] == 4 and DTYPE_BITS["BF16"] == 16


def test_exact_dtypes_have_no_rounding_and_unknown_names_are_held_to_float32() -> None:
    for name in ("I64", "int8", "uint2", "int4", "bool", "torch.int32"):
        assert dtypes.is_exact(name) and dtypes.unit_roundoff(name) is None
        assert default_tolerance(name, name) == (0.0, 0.0)
        assert unit_roundoff(name, name) is None
    assert dtypes.unit_roundoff("F8_E4M3FNUZ") == 2.0**-24  # no table holds it
    assert default_tolerance("F8_E4M3FNUZ", "F32") == (0.125, 1e-2)  # fp8's family
    assert default_tolerance("mystery", "mystery") == (1.3e-6, 1e-5)
    # the verdict's unit: float32 counts 4 u, float64 8 u (both sides accumulate there)
    assert unit_roundoff("float32", "F32") == 2.0**-22
    assert unit_roundoff("F64", "F64") == 2.0**-50
    assert unit_roundoff("F32", "BF16") == 2.0**-8
    assert unit_roundoff("mystery", "mystery") == 2.0**-22
