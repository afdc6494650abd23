"""Every dtype mldbg reads or writes, once: its names and the numbers a verdict needs.

A tensor's dtype reaches mldbg under many names: safetensors codes in the files it writes
and reads (``BF16``), numpy and ml_dtypes names (``bfloat16``), torch's and MLX's
(``torch.bfloat16``, ``mlx.core.bfloat16``), numpy's type strings (``<f4``).  Capture,
the tensor store, compare and the weight audit all ask the same questions of one: which
safetensors code is it, how wide, how finely does it round, how large a value does it
hold, what would ``torch.testing.assert_close`` allow.  This table answers them; the
layers above keep none of their own.

Standard library only: the debuggee imports it when it captures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["float", "complex", "int", "uint", "bool"]


@dataclass(frozen=True)
class DType:
    """One dtype.  ``significand``: bits of precision, the implicit one included (24 for
    float32), so its unit roundoff (half an ulp at 1) is ``2**-significand``."""

    code: str  # the safetensors name, mldbg's canonical one
    numpy: str  # numpy's (or ml_dtypes') name
    bits: int
    kind: Kind
    significand: int | None = None
    max_finite: float | None = None
    min_normal: float | None = None
    min_subnormal: float | None = None
    # torch.testing.assert_close's defaults (torch/testing/_comparison.py).  fp8 is not in
    # torch's table; its entries are ours: one machine epsilon relative (a port may round
    # once differently) and an absolute floor of 1e-2, about E4M3's smallest normal value,
    # below which fp8 keeps almost no relative precision.
    tolerance: tuple[float, float] = (0.0, 0.0)
    safetensors: bool = True  # a dtype the safetensors format defines
    # The unit a rounding bound counts in, in units of ``unit_roundoff``: where two
    # implementations both compute in this precision they accumulate long reductions (a
    # matmul over 64..4096 terms) in a different order, ~sqrt(K) u per op, where bf16 and
    # fp16 ports accumulate in float32 and round once per op: float32 counts 4 u, float64
    # 8 u (compare/judge/bounds.py; capture/sensitivity.py's ``benign``).
    accumulation: float = 1.0

    @property
    def exact(self) -> bool:
        """Integers and booleans: any difference at all is a difference."""
        return self.kind in ("int", "uint", "bool")

    @property
    def unit_roundoff(self) -> float | None:
        """Half an ulp at 1; None for exact dtypes."""
        return None if self.significand is None else 2.0**-self.significand


def _float(
    code: str,
    numpy: str,
    bits: int,
    significand: int,
    max_finite: float,
    min_normal_exponent: int,
    tolerance: tuple[float, float],
    kind: Kind = "float",
    safetensors: bool = True,
    accumulation: float = 1.0,
) -> DType:
    min_normal = 2.0**min_normal_exponent
    return DType(
        code,
        numpy,
        bits,
        kind,
        significand,
        max_finite,
        min_normal,
        min_normal * 2.0 ** -(significand - 1),
        tolerance,
        safetensors,
        accumulation,
    )


TABLE: tuple[DType, ...] = (
    _float("F64", "float64", 64, 53, 1.7976931348623157e308, -1022, (1e-7, 1e-7), accumulation=8),
    _float("F32", "float32", 32, 24, 3.4028234663852886e38, -126, (1.3e-6, 1e-5), accumulation=4),
    _float("F16", "float16", 16, 11, 65504.0, -14, (1e-3, 1e-5)),
    _float("BF16", "bfloat16", 16, 8, 3.3895313892515355e38, -126, (1.6e-2, 1e-5)),
    _float("F8_E4M3", "float8_e4m3fn", 8, 4, 448.0, -6, (0.125, 1e-2)),
    _float("F8_E5M2", "float8_e5m2", 8, 3, 57344.0, -14, (0.25, 1e-2)),
    _float(
        "C128",
        "complex128",
        128,
        53,
        1.7976931348623157e308,
        -1022,
        (1e-7, 1e-7),
        "complex",
        False,
        accumulation=8,
    ),
    _float(
        "C64",
        "complex64",
        64,
        24,
        3.4028234663852886e38,
        -126,
        (1.3e-6, 1e-5),
        "complex",
        accumulation=4,
    ),
    # storage formats: scales and packed codes of quantized weights, never computed in
    DType("F8_E8M0", "float8_e8m0fnu", 8, "float", significand=1),
    DType("F6_E2M3", "float6_e2m3fn", 6, "float", significand=4),
    DType("F6_E3M2", "float6_e3m2fn", 6, "float", significand=3),
    DType("F4", "float4_e2m1fn", 4, "float", significand=2),
    DType("I64", "int64", 64, "int"),
    DType("I32", "int32", 32, "int"),
    DType("I16", "int16", 16, "int"),
    DType("I8", "int8", 8, "int"),
    DType("U64", "uint64", 64, "uint"),
    DType("U32", "uint32", 32, "uint"),
    DType("U16", "uint16", 16, "uint"),
    DType("U8", "uint8", 8, "uint"),
    DType("BOOL", "bool", 8, "bool"),
)
BY_CODE: dict[str, DType] = {d.code: d for d in TABLE}

# Other spellings of the same dtypes: numpy's type strings, names without ml_dtypes' suffix.
_OTHER_NAMES = {
    "float8_e4m3": "F8_E4M3",
    "float8_e8m0": "F8_E8M0",
    "<f8": "F64",
    "<f4": "F32",
    "<f2": "F16",
    "<c16": "C128",
    "<c8": "C64",
    "<i8": "I64",
    "<i4": "I32",
    "<i2": "I16",
    "|i1": "I8",
    "i1": "I8",
    "<u8": "U64",
    "<u4": "U32",
    "<u2": "U16",
    "|u1": "U8",
    "u1": "U8",
    "|b1": "BOOL",
    "?": "BOOL",
}
_BY_NAME: dict[str, DType] = {
    **{d.numpy: d for d in TABLE},
    **{name: BY_CODE[code] for name, code in _OTHER_NAMES.items()},
    **BY_CODE,
}


def lookup(name: object) -> DType | None:
    """The dtype of any of its names: ``BF16``, ``bfloat16``, ``torch.bfloat16``,
    ``mlx.core.bfloat16``, a numpy dtype or ``<f4``; None for a name no table holds."""
    text = str(name)
    found = _BY_NAME.get(text)
    if found is None:
        found = _BY_NAME.get(text.rsplit(".", 1)[-1])  # torch.float32, mlx.core.float32
    return found


def code(name: object) -> str:
    """The safetensors code of a dtype (``F32`` for ``float32``, ``torch.float32`` or
    ``<f4``); a name no table holds comes back as given (its last dotted part)."""
    found = lookup(name)
    return found.code if found is not None else str(name).rsplit(".", 1)[-1]


def unit_roundoff(name: object) -> float | None:
    """Half an ulp at 1 (``2**-24`` for float32); None for exact dtypes.  A name no table
    holds is taken for float32, the precision anything unknown is held to."""
    found = lookup(name)
    if found is None:
        return None if is_exact(name) else BY_CODE["F32"].unit_roundoff
    return found.unit_roundoff


_INTEGER_NAME = re.compile(r"^(bool|u?int\d*|[iu]\d+)$", re.IGNORECASE)  # int4, I64, uint2


def is_exact(name: object) -> bool:
    """An integer or boolean dtype, also one no table holds (``int4``, ``uint2``)."""
    found = lookup(name)
    if found is not None:
        return found.exact
    return bool(_INTEGER_NAME.match(str(name).rsplit(".", 1)[-1]))
