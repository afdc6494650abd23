"""Per-pair numbers for ``mldbg compare``: how far a port's tensor is from its reference.

Everything here is numpy only (bf16 and fp8 arrive as ``ml_dtypes`` arrays, which numpy
converts like any other dtype), so the daemon can compare runs of either framework
without importing torch or MLX.

Three decisions shape the code:

* **float32 where it is exact enough, float64 elsewhere.**  Differences between a bf16
  reference and its port are often a few ulps of the *input* dtype; computing them in
  that dtype would round away exactly what is being measured.  When both tensors are
  float32 or narrower (bf16, fp16, fp8), every value is a float32, the difference is one
  correctly rounded float32 operation, the tolerance test is the float32 one
  ``torch.isclose`` evaluates, and the values reported for the chosen elements are
  recomputed in float64; sums are float32 rows added in float64, the cosine taken from
  the residual of a fixed scale (``add_single`` and ``_cosine_single`` say why that is
  enough, and when a block still goes to float64).
  This halves the bytes every pass touches, which is what a comparison's speed is made
  of.  Other float pairs (float64, or a float64 side) are held in float64, which holds
  every value of every supported float dtype exactly, but integers only up to 2**53, so
  a pair of two integer (or bool) tensors is also held as sign and uint64 magnitude:
  which elements differ, ``mismatched``, ``max_abs`` (the exact difference, rounded once
  to float) and ``worst`` are exact for any int64/uint64 values, mixes included; the
  other metrics stay float64.
* **Streaming.**  The inputs are usually memory maps of safetensors files that can be
  larger than memory.  ``compare_arrays`` reads ``chunk_elements`` elements at a time
  and folds them into running totals, so peak memory is about 18-30 bytes per chunk
  element in float32 (bf16 and strided inputs need float32 copies: 2-4 MB with the
  default chunk of 2**17), 46 in float64
  (integer pairs need a little more for their exact differences), whatever the tensor
  size.  Maxima, minima, counts and the worst element do not depend on the chunk size
  (up to ties within one float32 rounding); sums (``mean_abs``, ``cosine``, ``rel_rms``)
  may differ in their last bits, as float sums in a different order do.
* **JSON-ready results.**  The dict holds plain ``int``/``float``/``list``/``None``/``str``.
  ``None`` means "nothing to measure" (no element finite in both tensors, a zero range
  for ``range_ratio``) or, for ``min_atol``, "no atol passes" (a NaN/inf mismatch).  A
  float that is not finite -- a value in ``head_a``/``worst``, or a metric that
  overflowed float64 -- is written as the string ``"nan"``, ``"inf"`` or ``"-inf"``,
  never as a bare NaN (which is not JSON).  A NaN/inf mismatch is therefore not folded
  into ``max_abs`` (which stays a number over the pairs finite in both) but counted in
  ``nonfinite_mismatched``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import EllipsisType
from typing import Any, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt

from ... import dtypes
from ..records import JsonNumber, PairMetrics, RunningMetrics, ScaleMetrics, WorstElement

_Float = TypeVar("_Float", np.float32, np.float64)


def default_tolerance(dtype_a: str, dtype_b: str) -> tuple[float, float]:
    """``(rtol, atol)`` that ``torch.testing.assert_close`` would use for these dtypes.

    Using torch's defaults means "ok" here agrees with the check a porter would write in
    a unit test.  Like assert_close with mixed dtypes, the looser value of each wins: a
    float32 port of a bf16 reference can only be held to bf16 precision.  Integer and bool
    dtypes compare exactly (0, 0); fp8 gets (0.125, 1e-2) for E4M3 and (0.25, 1e-2) for
    E5M2 (torch has no default for them).  Dtype names are safetensors names (``"BF16"``)
    or numpy names (``"bfloat16"``); an unknown name is held to float32's defaults.
    """
    rtol_a, atol_a = _tolerance_of(dtype_a)
    rtol_b, atol_b = _tolerance_of(dtype_b)
    return max(rtol_a, rtol_b), max(atol_a, atol_b)


def _tolerance_of(dtype: str) -> tuple[float, float]:
    found = dtypes.lookup(dtype)
    if found is not None:
        return found.tolerance
    if dtypes.is_exact(dtype):
        return (0.0, 0.0)
    if dtype.startswith("F8"):  # an fp8 variant the table lacks: its family's
        return dtypes.BY_CODE["F8_E5M2" if "E5M2" in dtype else "F8_E4M3"].tolerance
    return dtypes.BY_CODE["F32"].tolerance


# Elements per streamed block.  A block's buffers (three of 512 KB in single precision,
# 1 MB in double) stay in the CPU's cache across the passes the metrics make over it
# (measured: 2-3x the throughput of 2**20-element blocks, and less memory), while the
# Python cost of one pass (a microsecond or two) stays a small part of its work.
CHUNK_ELEMENTS = 1 << 17

# Products are summed in the block's own precision per row of this many elements, the
# rows' sums in float64 (``_sum_products``): a float32 row's rounding error is at most
# SUM_ROW * 2**-24 = 2.4e-4 of its sum in the worst case (about 1e-7 in practice).
SUM_ROW = 4096

# A single-precision block is measured in float32 only while the largest magnitude of
# each side and its largest difference lie in [2**-50, 2**50] (or are 0): the largest square is then at
# least 2**-100, so squares that underflow (each off by at most 2**-150) move a row's sum
# by under 2**-38 of itself, and a row of SUM_ROW squares cannot overflow.  Other blocks
# take the float64 path.
_SINGLE_LOW = 2.0**-50
_SINGLE_HIGH = 2.0**50

Array: TypeAlias = npt.NDArray[np.generic]
Float64s: TypeAlias = npt.NDArray[np.float64]
Float32s: TypeAlias = npt.NDArray[np.float32]
Bools: TypeAlias = npt.NDArray[np.bool_]
UInt64s: TypeAlias = npt.NDArray[np.uint64]


def compare_arrays(
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    *,
    rtol: float,
    atol: float,
    permutation: tuple[int, ...] | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
    head: int = 5,
) -> PairMetrics:
    """Compare reference ``a`` with ``b`` (first transposed by ``permutation``), streaming.

    Returns a JSON-ready dict with the keys ``numel``, ``max_abs``, ``mean_abs``,
    ``max_rel``, ``cosine``, ``range_a``, ``range_b``, ``range_ratio``, ``mismatched``,
    ``nonfinite_mismatched``, ``min_atol``, ``nan_a``, ``nan_b``, ``inf_a``, ``inf_b``,
    ``head_a``, ``head_b``, ``worst``, ``largest``, ``rel_rms``, ``rel_max``, ``rms_a``,
    ``rms_b``, ``finite_pairs`` (how many elements the statistics cover: those finite in
    both), ``port_nonfinite`` and ``nonfinite_at`` (how many elements are NaN/inf in ``b``
    only, and the one of them with the largest ``|a|``: an overflow's evidence) and ``ok``.

    ``mismatched`` counts elements failing assert_close's test ``|b - a| <= atol + rtol *
    |a|`` (``a`` is the "expected" side), with NaN equal to NaN and an infinity equal only
    to the same infinity; ``nonfinite_mismatched`` is the part of that count where NaN or
    an infinity is involved (NaN vs a number, inf vs -inf, inf vs a number); ``ok`` is
    ``mismatched == 0``.  When both tensors are float32 or narrower (bf16, fp16, fp8) the
    test is evaluated in float32, as ``torch.isclose`` does for float32 tensors; otherwise
    in float64.  ``max_abs``, ``mean_abs``, ``max_rel``, ``cosine``, the ranges
    and ``min_atol`` (the smallest atol that would pass at this rtol) cover only the
    elements finite in both tensors, so the first four can read 0, 0, 0, 1 while
    ``nonfinite_mismatched`` is not 0; ``min_atol`` is then ``None``: no atol passes.
    ``worst`` is the first element with the largest finite ``|b - a| - rtol |a|``, except
    that when every pair finite in both passes and some NaN/inf pair does not, it is the
    first such NaN/inf mismatch.  When both tensors are integer or bool, which elements
    differ, ``max_abs`` and ``worst`` are decided on exact integers (tolerances of 0 mean
    exact equality for any int64/uint64 values; nonzero ones compare the exact difference,
    rounded to float64, with ``atol + rtol * |a|``).  Shapes must agree after the
    permutation (``ValueError`` otherwise); complex dtypes raise ``TypeError``.
    """
    a, b = np.asanyarray(a), np.asanyarray(b)
    if chunk_elements < 1:
        raise ValueError(f"chunk_elements must be positive, got {chunk_elements}")
    if head < 0:
        raise ValueError(f"head must be >= 0, got {head}")
    for array in (a, b):
        if np.issubdtype(array.dtype, np.complexfloating):
            raise TypeError(f"complex tensors are not supported (dtype {array.dtype})")
    if permutation is not None:
        b = b.transpose(tuple(permutation))
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape} (b after the permutation)")
    exact = _is_exact(a.dtype) and _is_exact(b.dtype)
    # (tolerances beyond 2**60 would overflow rtol * |a| in float32: measured in float64)
    single = _is_single(a.dtype) and _is_single(b.dtype) and max(rtol, atol) < 2.0**60
    scratch = _Scratch(min(chunk_elements, max(1, int(a.size))))
    totals = _Totals(rtol=float(rtol), atol=float(atol), scratch=scratch, single=single)
    # Overflow (|a - b| or a square beyond float64) is reported as "inf"/"nan", not warned.
    with np.errstate(over="ignore", invalid="ignore"):
        for offset, view_a, view_b in _blocks(a, b, chunk_elements):
            if exact:
                totals.add_exact(offset, view_a, view_b)
            elif single:
                totals.add_single(offset, scratch.single("a", view_a), scratch.single("b", view_b))
            else:
                totals.add(offset, scratch.widen("a", view_a), scratch.widen("b", view_b))
    return {
        "numel": int(a.size),
        **totals.summary(),
        "head_a": _head(a, head),
        "head_b": _head(b, head),
        "worst": _worst(a, b, totals.worst()),
        "largest": _worst(a, b, totals.largest_index),
        # the port's NaN/inf beside the largest finite reference value there
        "nonfinite_at": _worst(a, b, totals.port_nonfinite_index),
        "ok": totals.mismatched == 0,
    }


# ---------------------------------------------------------------------------- chunking


def _blocks(a: Array, b: Array, chunk: int) -> Iterator[tuple[int, Array, Array]]:
    """``(flat offset, view of a, view of b)``: runs of consecutive C-order elements, at
    most ``chunk`` each, cut at the same places in both arrays so they line up element for
    element.  Views only: nothing is read from a memory map until the caller converts them.

    Contiguous arrays are cut from their flat view; anything else (a transposed ``b``)
    by index blocks, each of which is one strided read.
    """
    if a.size == 0:
        return
    if a.flags.c_contiguous and b.flags.c_contiguous:
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        for start in range(0, a.size, chunk):
            stop = min(start + chunk, a.size)
            yield start, flat_a[start:stop], flat_b[start:stop]
        return
    offset = 0
    for index in _index_blocks(a.shape, chunk):
        view_a = a[index]
        yield offset, view_a, b[index]
        offset += int(np.size(view_a))


def _index_blocks(
    shape: tuple[int, ...], chunk: int
) -> Iterator[tuple[int | slice | EllipsisType, ...]]:
    """Index tuples that cover ``shape`` in C order, each selecting at most ``chunk``
    consecutive elements: whole trailing sub-arrays while they fit, otherwise going one
    axis deeper and slicing that axis (so a single huge row is still split)."""
    inner = 1  # elements in one step along the split axis
    split = len(shape)  # axes from here on are taken whole
    while split > 0 and inner * shape[split - 1] <= chunk:
        split -= 1
        inner *= shape[split]
    if split == 0:
        yield (Ellipsis,)
        return
    axis = split - 1
    step = max(1, chunk // inner)
    for outer in np.ndindex(*shape[:axis]):
        for start in range(0, shape[axis], step):
            yield (*outer, slice(start, min(start + step, shape[axis])))


class _Scratch:
    """The buffers one block needs, allocated once per comparison.

    Temporaries of a megabyte are above the C allocator's mmap threshold: allocated anew
    for every block, each comes back as fresh pages the kernel must fault in (measured:
    most of the time of a comparison of large tensors, 4x slower than with these).
    Buffers are made on first use, so a comparison that stays in float32 never allocates
    the float64 ones.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._doubles: dict[str, Float64s] = {}
        self._singles: dict[str, Float32s] = {}
        self._mask: Bools | None = None
        self._ones: Float32s | None = None

    def double(self, name: str, size: int) -> Float64s:
        """A float64 buffer of ``size`` elements (a fresh array beyond the block size)."""
        if size > self.size:
            return np.empty(size)
        buffer = self._doubles.get(name)
        if buffer is None:
            buffer = self._doubles[name] = np.empty(self.size)
        return buffer[:size]

    def float32(self, name: str, size: int) -> Float32s:
        if size > self.size:
            return np.empty(size, np.float32)
        buffer = self._singles.get(name)
        if buffer is None:
            buffer = self._singles[name] = np.empty(self.size, np.float32)
        return buffer[:size]

    def mask(self, size: int) -> Bools:
        if size > self.size:
            return np.empty(size, np.bool_)
        if self._mask is None:
            self._mask = np.empty(self.size, np.bool_)
        return self._mask[:size]

    def ones(self, size: int) -> Float32s:
        """float32 ones: ``_sum_products(x, ones)`` sums ``x`` in one BLAS pass."""
        if size > self.size:
            return np.ones(size, np.float32)
        if self._ones is None:
            self._ones = np.ones(self.size, np.float32)
        return self._ones[:size]

    def widen(self, name: str, block: Array) -> Float64s:
        """``block`` as a flat float64 array, in this scratch (bf16/fp8 exactly)."""
        out = self.double(name, int(np.size(block)))
        np.copyto(out.reshape(np.shape(block)), block, casting="unsafe")
        return out

    def single(self, name: str, block: Array) -> Float32s:
        """``block`` as a flat float32 array: a float32 C-contiguous block as it is (a
        view of the memory map, no copy), anything else (bf16, fp16, fp8, or strided)
        copied into this scratch, exactly: each of those dtypes' values is a float32."""
        if block.dtype == np.float32 and block.flags.c_contiguous:
            return np.asarray(block, np.float32).reshape(-1)
        out = self.float32(name, int(np.size(block)))
        np.copyto(out.reshape(np.shape(block)), block, casting="unsafe")
        return out


def _to_float64(block: Array) -> Float64s:
    """A C-contiguous flat float64 copy of ``block`` (bf16/fp8 exactly, integers to 2**53)."""
    return np.ascontiguousarray(block, dtype=np.float64).reshape(-1)


def _single_mismatches(xa: Float32s, xb: Float32s, rtol: float, atol: float) -> int:
    """Pairs finite in both that fail ``|a - b| <= atol + rtol |a|`` evaluated in float32,
    as ``torch.isclose`` does on float32 tensors (a difference that overflows float32
    fails, as there); NaN/inf pairs are counted by ``_Totals.add``."""
    allowed = np.abs(xa) * np.float32(rtol) + np.float32(atol)
    failed = (np.abs(xa - xb) > allowed) & np.isfinite(xa) & np.isfinite(xb)
    return int(np.count_nonzero(failed))


def _single_scale(magnitude: float) -> bool:
    """Whether a block whose largest magnitude (or difference) is ``magnitude`` can be
    summed in float32 rows: 0, or within [2**-50, 2**50] (see ``_SINGLE_LOW``)."""
    return magnitude == 0.0 or _SINGLE_LOW <= magnitude <= _SINGLE_HIGH


def _is_single(dtype: np.dtype[np.generic]) -> bool:
    """float32 and the float dtypes narrower than it (fp16, bf16, fp8, via ml_dtypes),
    every value of which float32 holds exactly: their pairs are measured in float32."""
    if dtype == np.float32 or dtype == np.float16:
        return True
    return dtype.name.startswith(("bfloat16", "float8_"))


def _is_exact(dtype: np.dtype[Any]) -> bool:
    """Integer and bool dtypes, whose pairs are compared in exact integer arithmetic."""
    return dtype == np.bool_ or np.issubdtype(dtype, np.integer)


def _sign_magnitude(block: Any) -> tuple[Any, Any]:
    """``(negative, magnitude)`` of an integer/bool block, flat: a bool mask (``None`` for
    an unsigned dtype, which has no negatives) and ``|value|`` as uint64, which holds
    every int64 and uint64 magnitude exactly (``|-2**63|`` included)."""
    if np.issubdtype(block.dtype, np.signedinteger):
        values = np.array(block, dtype=np.int64, order="C").reshape(-1)  # a copy: see abs
        negative = values < 0
        # abs(-2**63) wraps to -2**63 in int64, whose uint64 view is 2**63: still exact.
        return negative, np.abs(values, out=values).view(np.uint64)
    return None, np.ascontiguousarray(block, dtype=np.uint64).reshape(-1)


def _exact_difference(
    negative_a: Any, magnitude_a: Any, negative_b: Any, magnitude_b: Any
) -> tuple[Any, Any]:
    """``|a - b|`` as ``(low, carry)``: the uint64 value ``low`` plus ``2**64`` where the
    bool mask ``carry`` is set (``None`` when it is set nowhere), so that
    ``uint64 max - int64 min`` still fits.  Same signs subtract the magnitudes, opposite
    signs add them."""
    low = np.subtract(magnitude_a, magnitude_b)  # wraps where b is larger: redone below
    np.subtract(magnitude_b, magnitude_a, out=low, where=magnitude_b > magnitude_a)
    if negative_a is None and negative_b is None:
        return low, None
    if negative_a is None or negative_b is None:
        opposite = negative_b if negative_a is None else negative_a
    else:
        opposite = negative_a != negative_b
    if not opposite.any():
        return low, None
    total = np.add(magnitude_a, magnitude_b)  # wraps past 2**64: the carry
    np.copyto(low, total, where=opposite)
    carry = opposite & (total < magnitude_a)
    return low, (carry if carry.any() else None)


# ---------------------------------------------------------------------------- running totals


@dataclass
class _Totals:
    """Running totals over the blocks seen so far; ``summary`` turns them into the result.

    The float paths choose the element behind ``max_abs``, ``max_rel`` and ``worst`` by a
    key (``largest_key``, ``max_rel_key``, ``max_excess_seen``) in the block's own
    precision, strictly greater wins (the first of equal maxima, whatever the chunking),
    and then compute the reported value for that one element in float64.
    """

    rtol: float
    atol: float
    scratch: _Scratch
    mismatched: int = 0
    nonfinite_mismatched: int = 0
    first_nonfinite: int | None = None  # flat index of the first NaN/inf mismatch
    # Where b is NaN/inf and a finite: the element with the largest |a| (what the port's
    # dtype failed to hold, when it overflowed), its |a|, and how many such elements.
    port_nonfinite: int = 0
    port_nonfinite_index: int | None = None
    port_nonfinite_key: float = -1.0
    exact_max: int = -1  # the largest |b - a| so far, integer pairs only
    nan_a: int = 0
    nan_b: int = 0
    inf_a: int = 0
    inf_b: int = 0
    finite_pairs: int = 0
    sum_abs: float = 0.0
    max_abs: float = -1.0
    largest_key: float = -1.0
    max_rel: float = 0.0
    max_rel_key: float = 0.0
    max_excess: float = 0.0
    dot: float = 0.0
    norm2_a: float = 0.0
    norm2_b: float = 0.0
    worst_index: int | None = None  # the element over its tolerance by the most
    largest_index: int | None = None  # the element with the largest |b - a|
    max_excess_seen: float = -math.inf
    sum_sq_diff: float = 0.0
    range_a: tuple[float, float] | None = None
    range_b: tuple[float, float] | None = None
    single_tested: bool = False  # the finite pairs' tolerance test was made in float32
    # A float32-or-narrower pair's cosine comes from the residual of a fixed scale
    # (``_cosine_single``): s0, the first block's b/a (None until a block of a is not all
    # zeros; 0.0 where no usable scale), and the sums of e = b - s0 a.
    single: bool = False
    scale0: float | None = None
    sum_sq_residual: float = 0.0  # sum of e**2
    sum_residual_a: float = 0.0  # sum of e * a

    def add_single(self, offset: int, xa: Float32s, xb: Float32s) -> None:
        """Fold in a block of two flat float32 arrays (float32 data, or bf16/fp16/fp8
        widened exactly), computing in float32: half the bytes of float64 per pass, no
        widening copy of float32 data, and each pass twice the elements per instruction.

        Why float32 is enough for these inputs: every value is a float32, so ``a - b`` is
        one correctly rounded float32 operation (exact when the two are within a factor 2
        of each other, as a port's values are; bf16 and fp16 pairs are exact unless their
        exponents differ by more than 13); the tolerance test is then the one
        ``torch.isclose`` itself evaluates on float32 tensors, ``|a - b| > atol + rtol
        |a|`` in float32, decided without rounding by the sign of ``|a - b| - allowed``.
        The values reported for ``max_abs``, ``max_rel`` and ``min_atol`` are recomputed
        in float64 for the element the float32 pass picks (a tie within one float32
        rounding may pick a different, equally large element).  Sums of differences
        (``mean_abs``, ``rel_rms``) are float32 rows of SUM_ROW elements added in float64
        (``_sum_products``): relative errors of about 1e-7 (2.4e-4 at worst), far below
        what a verdict distinguishes.  The cosine is not a relative quantity (the verdict
        reads ``1 - cosine**2`` down to 1e-12): it is taken from the residual of a fixed
        scale (``_cosine_single``), which float32 rows measure well where that matters.
        Blocks with NaN/inf, a side whose largest magnitude lies beyond [2**-50, 2**50],
        or differences below 2**-50 take the float64 path (``add``), where squares
        neither overflow nor underflow.
        """
        scratch = self.scratch
        low_a, high_a = float(np.min(xa)), float(np.max(xa))
        low_b, high_b = float(np.min(xb)), float(np.max(xb))
        extremes = (low_a, high_a, low_b, high_b)
        peak_a, peak_b = max(-low_a, high_a), max(-low_b, high_b)
        finite = all(map(math.isfinite, extremes))
        if not finite or not (_single_scale(peak_a) and _single_scale(peak_b)):
            self._add_single_in_double(offset, xa, xb)
            return
        size = xa.size
        scale = self._scale0(lambda: (_sum_products(xa, xa), _sum_products(xa, xb)))
        diff = np.subtract(xa, xb, out=scratch.float32("diff", size))
        # with s0 = 1 the cosine's residual e = b - a is -diff itself (see _cosine_single)
        diff_dot_a = _sum_products(diff, xa) if scale == 1.0 else 0.0
        np.abs(diff, out=diff)
        top = float(np.max(diff))
        if not _single_scale(top):  # differences whose squares would underflow
            self._add_single_in_double(offset, xa, xb)
            return
        self.range_a = _merge_bounds(self.range_a, low_a, high_a)
        self.range_b = _merge_bounds(self.range_b, low_b, high_b)
        if top > self.largest_key:
            at = int(np.argmax(diff))  # the first of equal maxima: stable across chunkings
            self.largest_key = top
            self.max_abs = abs(float(xa[at]) - float(xb[at]))  # exact in float64
            self.largest_index = offset + at
        larger = np.abs(xb, out=scratch.float32("larger", size))
        allowed = np.abs(xa, out=scratch.float32("allowed", size))
        np.maximum(larger, allowed, out=larger)
        # atol + rtol * |a| in float32, the expression torch.isclose evaluates on float32.
        np.multiply(allowed, np.float32(self.rtol), out=allowed)
        np.add(allowed, np.float32(self.atol), out=allowed)
        excess = np.subtract(diff, allowed, out=allowed)  # > 0 exactly where the test fails
        top = float(np.max(excess))
        if top + self.atol > self.max_excess_seen:  # the float64 path's key: |b-a| - rtol|a|
            at = int(np.argmax(excess))
            self.max_excess_seen = top + self.atol
            self.worst_index = offset + at
            x, y = float(xa[at]), float(xb[at])
            self.max_excess = max(self.max_excess, abs(x - y) - self.rtol * abs(x))
        if top > 0.0:
            failed = np.greater(excess, np.float32(0.0), out=scratch.mask(size))
            self.mismatched += int(np.count_nonzero(failed))
        # Relative to the larger magnitude of the two: symmetric, bounded by 2.  Where both
        # are exactly zero (a perfect match) 0/0 is NaN, which fmax passes over.
        rel = np.divide(diff, larger, out=larger)
        top = float(np.fmax.reduce(rel))
        if top > self.max_rel_key:  # False for NaN: a block of exact zeros
            at = int(np.argmax(rel == np.float32(top)))  # rare: only when the maximum grows
            x, y = float(xa[at]), float(xb[at])
            self.max_rel_key = top
            self.max_rel = max(self.max_rel, abs(x - y) / max(abs(x), abs(y)))
        self.finite_pairs += size
        self.sum_abs += _sum_products(diff, scratch.ones(size))
        squares = _sum_products(diff, diff)
        self.sum_sq_diff += squares
        # The cosine's sums (see _cosine_single): the residual e = b - s0 a of one fixed
        # scale, so that a port equal to its reference up to a scale shows a residual
        # measured on e itself, not on the cancellation of two large sums.
        if scale == 1.0:
            self.sum_sq_residual += squares
            self.sum_residual_a -= diff_dot_a
        else:
            residual = np.multiply(xa, np.float32(scale), out=scratch.float32("residual", size))
            np.subtract(xb, residual, out=residual)
            self.sum_sq_residual += _sum_products(residual, residual)
            self.sum_residual_a += _sum_products(residual, xa)
        self.dot += _sum_products(xa, xb)
        self.norm2_a += _sum_products(xa, xa)
        self.norm2_b += _sum_products(xb, xb)

    def _scale0(self, products: Callable[[], tuple[float, float]]) -> float:
        """s0, fixed at the first block where ``a`` is not all zeros (earlier blocks'
        residual is ``b`` whatever s0 is): that block's least-squares ``b / a``, rounded
        to float32, or exactly 1 within 2**-12 of it (then e is ``b - a``, which the
        differences already hold; the cancellation left is at most 2**-24 of the sums
        times (s - 1)**2, under 1e-7 in the residual); 0.0 (no benefit, still correct)
        outside [2**-20, 2**20].  ``products`` gives this block's ``(|a|**2, a . b)``."""
        if self.scale0 is not None:
            return self.scale0
        norm2, dot = products()
        if norm2 == 0.0:
            return 0.0
        scale = dot / norm2
        usable = math.isfinite(scale) and 2.0**-20 <= abs(scale) <= 2.0**20
        if usable and abs(scale - 1.0) <= 2.0**-12:
            scale = 1.0
        self.scale0 = float(np.float32(scale)) if usable else 0.0
        return self.scale0

    def _add_single_in_double(self, offset: int, xa: Float32s, xb: Float32s) -> None:
        """A float32 block the float32 pass cannot measure (NaN/inf, extreme scales): its
        metrics in float64, its tolerance test still in float32, so that which elements
        fail never depends on which path their block took."""
        self.mismatched += _single_mismatches(xa, xb, self.rtol, self.atol)
        self.single_tested = True  # _fold must not count these pairs again
        try:
            self.add(offset, self.scratch.widen("a", xa), self.scratch.widen("b", xb))
        finally:
            self.single_tested = False

    def add(self, offset: int, block_a: Float64s, block_b: Float64s) -> None:
        """Fold in a block of two flat float64 arrays (float64 data, mixed dtypes, or a
        float32 block that ``add_single`` cannot measure in float32)."""
        if block_a.size:
            low_a, high_a = float(np.min(block_a)), float(np.max(block_a))
            low_b, high_b = float(np.min(block_b)), float(np.max(block_b))
            if all(map(math.isfinite, (low_a, high_a, low_b, high_b))):
                # The common case, decided by the ranges themselves: min and max propagate
                # NaN and show an infinity, so finite extremes mean every element is finite
                # and the masks below would select everything.
                self.range_a = _merge_bounds(self.range_a, low_a, high_a)
                self.range_b = _merge_bounds(self.range_b, low_b, high_b)
                self._add_finite(offset, block_a, block_b, None)
                return
        finite_a, finite_b = np.isfinite(block_a), np.isfinite(block_b)
        nan_a, nan_b = np.isnan(block_a), np.isnan(block_b)
        self.nan_a += int(np.count_nonzero(nan_a))
        self.nan_b += int(np.count_nonzero(nan_b))
        self.inf_a += block_a.size - int(np.count_nonzero(finite_a | nan_a))
        self.inf_b += block_b.size - int(np.count_nonzero(finite_b | nan_b))
        self.range_a = _merge_range(self.range_a, block_a, finite_a)
        self.range_b = _merge_range(self.range_b, block_b, finite_b)
        both = finite_a & finite_b
        positions = None
        if not both.all():
            # NaN matches NaN and an infinity matches the same infinity (== is True for
            # +inf == +inf); every other pair involving a non-finite value is a mismatch.
            same = (nan_a & nan_b) | (block_a == block_b)
            failed = ~both & ~same
            count = int(np.count_nonzero(failed))
            if count:
                self.mismatched += count
                self.nonfinite_mismatched += count
                if self.first_nonfinite is None:
                    self.first_nonfinite = offset + int(np.argmax(failed))
                self._port_nonfinite(offset, block_a, finite_a & ~finite_b)
            positions = np.flatnonzero(both)
            block_a, block_b = block_a[positions], block_b[positions]
        if block_a.size:
            self._add_finite(offset, block_a, block_b, positions)

    def _port_nonfinite(self, offset: int, block_a: Float64s, where: Bools) -> None:
        """Count the elements where only the port is NaN/inf and keep the one whose
        reference value is largest: an overflow shows there as a value beyond the port
        dtype's range beside the port's inf."""
        count = int(np.count_nonzero(where))
        if not count:
            return
        self.port_nonfinite += count
        magnitudes = np.where(where, np.abs(block_a), -1.0)
        at = int(np.argmax(magnitudes))
        if float(magnitudes[at]) > self.port_nonfinite_key:
            self.port_nonfinite_key = float(magnitudes[at])
            self.port_nonfinite_index = offset + at

    def add_exact(self, offset: int, block_a: Array, block_b: Array) -> None:
        """Fold in a block of two integer/bool views: the difference is taken exactly
        (``_exact_difference``), then rounded once to float64 for the float metrics."""
        negative_a, magnitude_a = _sign_magnitude(block_a)
        negative_b, magnitude_b = _sign_magnitude(block_b)
        low, carry = _exact_difference(negative_a, magnitude_a, negative_b, magnitude_b)
        del negative_a, magnitude_a, negative_b, magnitude_b
        if carry is None:
            at = int(np.argmax(low))  # the first of equal maxima, as for floats
            largest = int(low[at])
        else:  # every carried difference is larger than every other one
            carried = np.flatnonzero(carry)
            at = int(carried[np.argmax(low[carried])])
            largest = int(low[at]) + (1 << 64)
        if largest > self.exact_max:
            self.exact_max = largest
            self.max_abs = float(largest)  # Python rounds the exact integer once
            self.largest_index = offset + at
            if not self.rtol:
                self.worst_index = offset + at
        diff = low.astype(np.float64)
        del low
        if carry is not None:
            diff[carry] += 2.0**64
        xa, xb = _to_float64(block_a), _to_float64(block_b)
        self.range_a = _merge_range(self.range_a, xa, None)  # integers are all finite
        self.range_b = _merge_range(self.range_b, xb, None)
        if not diff.size:
            return
        larger, scaled = self._magnitudes(xa, xb)
        excess = np.subtract(diff, scaled)
        at = int(np.argmax(excess))
        self.max_excess = max(self.max_excess, float(excess[at]))
        if self.rtol and float(excess[at]) > self.max_excess_seen:
            # the element over its tolerance by the most (without rtol: the largest, above)
            self.max_excess_seen = float(excess[at])
            self.worst_index = offset + at
        del excess
        self._fold(xa, xb, diff, larger, scaled)

    def _add_finite(
        self, offset: int, xa: Float64s, xb: Float64s, positions: npt.NDArray[np.intp] | None
    ) -> None:
        """Fold in a block of pairs that are finite in both (``positions`` maps them back
        to the block's element numbers when some were dropped)."""
        # Written with out= so that about four float64 buffers per chunk element are alive,
        # and each intermediate is computed once: the passes over the block are the cost.
        diff = np.subtract(xa, xb, out=self.scratch.double("diff", xa.size))
        np.abs(diff, out=diff)
        at = int(np.argmax(diff))  # the first of equal maxima: stable across chunkings
        if float(diff[at]) > self.largest_key:
            self.largest_key = self.max_abs = float(diff[at])
            self.largest_index = offset + (at if positions is None else int(positions[at]))
        larger, scaled = self._magnitudes(xa, xb)
        # ``worst`` is the element that fails its own tolerance by the most (the largest
        # |b - a| - rtol |a|), not merely the largest difference: a big value off by a few
        # ulps is not worse than a small one off by half of itself.  The same maximum is
        # the smallest atol that passes (``min_atol``).
        excess = np.subtract(diff, scaled, out=self.scratch.double("excess", xa.size))
        at = int(np.argmax(excess))
        self.max_excess = max(self.max_excess, float(excess[at]))
        if float(excess[at]) > self.max_excess_seen:
            self.max_excess_seen = float(excess[at])
            self.worst_index = offset + (at if positions is None else int(positions[at]))
        del excess
        self._fold(xa, xb, diff, larger, scaled)

    def _magnitudes(self, xa: Float64s, xb: Float64s) -> tuple[Float64s, Float64s]:
        """``max(|a|, |b|)`` (the scale relative errors are taken against) and ``rtol |a|``."""
        scaled = np.abs(xa, out=self.scratch.double("scaled", xa.size))
        larger = np.abs(xb, out=self.scratch.double("larger", xa.size))
        np.maximum(larger, scaled, out=larger)
        np.multiply(scaled, self.rtol, out=scaled)
        return larger, scaled

    def _fold(
        self, xa: Float64s, xb: Float64s, diff: Float64s, larger: Float64s, scaled: Float64s
    ) -> None:
        """The sums, the relative maximum and the tolerance test over pairs finite in both,
        given ``diff = |xa - xb|``, ``larger = max(|xa|, |xb|)`` and ``scaled = rtol |xa|``
        (buffers this overwrites)."""
        self.finite_pairs += xa.size
        self.sum_abs += float(np.sum(diff))
        self.sum_sq_diff += _sum_products(diff, diff)
        # Relative to the larger magnitude of the two: symmetric, bounded by 2.  Where both
        # are exactly zero (a perfect match) 0/0 is NaN, which fmax passes over.
        np.divide(diff, larger, out=larger)
        rel = float(np.fmax.reduce(larger))
        if not math.isnan(rel):
            self.max_rel = max(self.max_rel, rel)
            self.max_rel_key = max(self.max_rel_key, rel)
        # atol + rtol * |a|: the expression torch.isclose evaluates, so boundaries round alike.
        if not self.single_tested:
            allowed = np.add(scaled, self.atol, out=scaled)
            failed = np.greater(diff, allowed, out=self.scratch.mask(diff.size))
            self.mismatched += int(np.count_nonzero(failed))
        self.dot += _sum_products(xa, xb)
        self.norm2_a += _sum_products(xa, xa)
        self.norm2_b += _sum_products(xb, xb)
        if self.single:  # a float32 block measured in float64: the residual sums too
            scale = self._scale0(lambda: (_sum_products(xa, xa), _sum_products(xa, xb)))
            residual = np.multiply(xa, scale, out=self.scratch.double("res", xa.size))
            np.subtract(xb, residual, out=residual)
            self.sum_sq_residual += _sum_products(residual, residual)
            self.sum_residual_a += _sum_products(residual, xa)

    def summary(self) -> RunningMetrics:
        measured = self.finite_pairs > 0
        return {
            "max_abs": _json_float(self.max_abs) if measured else None,
            "mean_abs": _json_float(self.sum_abs / self.finite_pairs) if measured else None,
            "max_rel": _json_float(self.max_rel) if measured else None,
            "cosine": self._cosine() if measured else None,
            "range_a": _json_range(self.range_a),
            "range_b": _json_range(self.range_b),
            "range_ratio": self._range_ratio(),
            "mismatched": self.mismatched,
            "nonfinite_mismatched": self.nonfinite_mismatched,
            # A NaN/inf mismatch fails under every atol: there is no smallest one.
            "min_atol": None if self.nonfinite_mismatched else _json_float(self.max_excess),
            "nan_a": self.nan_a,
            "nan_b": self.nan_b,
            "inf_a": self.inf_a,
            "inf_b": self.inf_b,
            # the elements the statistics above cover (finite in both)
            "finite_pairs": self.finite_pairs,
            "port_nonfinite": self.port_nonfinite,
            **self._scale(measured),
        }

    def _scale(self, measured: bool) -> ScaleMetrics:
        """The error measured against the reference's own scale, for the scale-aware test.

        ``rel_rms`` is ``||b - a|| / ||a||`` (the RMS of the error over the RMS of the
        reference) and ``rel_max`` is ``max|b - a| / max|a|``: both stay meaningful
        whether a tensor's values are 1e-3 or 1e3, which an absolute atol cannot.
        ``rms_a`` / ``rms_b`` are the two sides' RMS (their ratio is a moved scale's factor).  A zero reference gives 0 when ``b`` is zero
        too and ``"inf"`` otherwise.
        """
        if not measured:
            return {"rel_rms": None, "rel_max": None, "rms_a": None, "rms_b": None}
        err = math.sqrt(self.sum_sq_diff) if math.isfinite(self.sum_sq_diff) else math.inf
        norm_a = math.sqrt(self.norm2_a) if math.isfinite(self.norm2_a) else math.inf
        peak_a = 0.0 if self.range_a is None else max(abs(self.range_a[0]), abs(self.range_a[1]))

        def ratio(num: float, den: float) -> JsonNumber:
            if num == 0.0:
                return 0.0
            if den == 0.0 or math.isinf(den):
                return "inf" if den == 0.0 else "nan"
            return _json_float(num / den)

        return {
            "rel_rms": ratio(err, norm_a),
            "rel_max": ratio(self.max_abs, peak_a),
            "rms_a": _json_float(norm_a / math.sqrt(self.finite_pairs)),
            "rms_b": _json_float(math.sqrt(self.norm2_b / self.finite_pairs)),
        }

    def worst(self) -> int | None:
        """Flat index of the element ``worst`` shows: the first largest finite difference,
        unless only NaN/inf pairs fail, then the first of those (so it is a mismatch)."""
        if self.first_nonfinite is not None and self.mismatched == self.nonfinite_mismatched:
            return self.first_nonfinite
        return self.worst_index

    def _cosine(self) -> float | str:
        if self.norm2_a == 0.0 and self.norm2_b == 0.0:
            return 1.0  # two zero tensors agree perfectly
        if self.norm2_a == 0.0 or self.norm2_b == 0.0:
            return 0.0  # no direction to share
        if self.single:
            return self._cosine_single()
        if not all(map(math.isfinite, (self.dot, self.norm2_a, self.norm2_b))):
            return "nan"  # squares beyond float64 (|values| > 1e154): no usable answer
        product = self.norm2_a * self.norm2_b
        # sqrt of the product rounds once (identical tensors give exactly 1); the product
        # of the roots only where the product itself would overflow or underflow.
        if math.isfinite(product) and product > 0.0:
            cosine = self.dot / math.sqrt(product)
        else:
            cosine = self.dot / (math.sqrt(self.norm2_a) * math.sqrt(self.norm2_b))
        return min(1.0, max(-1.0, cosine))  # rounding can step just outside [-1, 1]

    def _cosine_single(self) -> float | str:
        """The cosine of a float32-or-narrower pair from float32 row sums, accurate where
        the verdict reads it.  With ``e = b - s0 a`` for one fixed scale s0 (the first
        block's ``b / a``), the least residual over every
        scale is ``min_s |b - s a|**2 = |e|**2 - (e . a)**2 / |a|**2``, so ``1 - cos**2 =
        that / |b|**2``.  For a port that is its reference times a scale (``verdict.
        exact_scale`` reads ``sqrt(1 - cos**2)`` down to 1e-6) e is that small residual
        itself and is summed as such (each e off by one float32 rounding of ``b``, about
        6e-8 relative), where ``(a . b)**2 / (|a|**2 |b|**2)`` would take it from the
        cancellation of sums accurate to 1e-7 only.  Far from parallel
        the direct ratio is as accurate and is used: when ``|e|**2 > |b|**2 / 100``."""
        norm2_a, norm2_b = self.norm2_a, self.norm2_b
        sums = (self.sum_sq_residual, self.sum_residual_a, self.dot, norm2_a, norm2_b)
        if not all(map(math.isfinite, sums)):
            return "nan"
        dot = self.dot
        if self.sum_sq_residual > 1e-2 * norm2_b:
            # e is not small beside b (far from parallel, or s0 far from the best scale,
            # which a parallel pair's first block cannot give): the direct ratio, whose
            # error (about 1e-7) is then far below what 1 - cos**2 holds.
            direct = dot / math.sqrt(norm2_a) / math.sqrt(norm2_b)
            return min(1.0, max(-1.0, direct))
        least = max(0.0, self.sum_sq_residual - self.sum_residual_a**2 / norm2_a)
        return math.copysign(math.sqrt(max(0.0, 1.0 - least / norm2_b)), dot)

    def _range_ratio(self) -> float | str | None:
        if self.range_a is None or self.range_b is None:
            return None
        width_a = self.range_a[1] - self.range_a[0]
        if width_a == 0.0:
            return None
        return _json_float((self.range_b[1] - self.range_b[0]) / width_a)


def _sum_products(x: npt.NDArray[_Float], y: npt.NDArray[_Float]) -> float:
    """``x . y`` for two flat arrays of one dtype: rows of SUM_ROW products summed in that
    dtype by BLAS (``vecdot``), the rows' sums added in float64.

    One pass at memory speed (a third of the time of ``einsum``, which sums in one
    accumulator), and accurate: a float32 row's error is at most SUM_ROW * 2**-24 of
    its sum.  Rows of SUM_ROW also keep OpenBLAS on this thread: it hands a dot product
    longer than 10,000 elements to its own threads, which on a busy machine wait for a
    free core at every call (measured: 20 us idle, 1-3 ms loaded, per block).
    """
    size = x.size
    whole = size - size % SUM_ROW
    total = 0.0
    if whole:
        rows_x, rows_y = x[:whole].reshape(-1, SUM_ROW), y[:whole].reshape(-1, SUM_ROW)
        total = float(_row_dots(rows_x, rows_y).sum(dtype=np.float64))
    if whole < size:
        total += float(np.dot(x[whole:], y[whole:]))
    return total


def _row_dots(x: npt.NDArray[_Float], y: npt.NDArray[_Float]) -> npt.NDArray[_Float]:
    """One dot product per row (numpy 2's ``vecdot``; ``einsum`` on numpy 1)."""
    vecdot = getattr(np, "vecdot", None)
    if vecdot is not None:
        return vecdot(x, y)  # type: ignore[no-any-return]
    return np.einsum("ij,ij->i", x, y)


def _merge_bounds(
    current: tuple[float, float] | None, low: float, high: float
) -> tuple[float, float]:
    return (low, high) if current is None else (min(current[0], low), max(current[1], high))


def _merge_range(
    current: tuple[float, float] | None, block: Any, finite: Any
) -> tuple[float, float] | None:
    """``[min, max]`` of the finite values seen so far (NaN/inf are counted separately);
    ``finite`` is the mask of finite elements, ``None`` when all are."""
    values = block if finite is None or finite.all() else block[finite]
    if values.size == 0:
        return current
    low, high = float(np.min(values)), float(np.max(values))
    if current is None:
        return low, high
    return min(current[0], low), max(current[1], high)


# ---------------------------------------------------------------------------- JSON values


def _json_float(value: float) -> JsonNumber:
    """A finite float as is; NaN and infinities as ``"nan"``, ``"inf"``, ``"-inf"``."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(value)


def _json_range(bounds: tuple[float, float] | None) -> list[JsonNumber] | None:
    return None if bounds is None else [_json_float(bounds[0]), _json_float(bounds[1])]


def _json_value(value: np.generic, dtype: np.dtype[np.generic]) -> int | float | str:
    """One element as its dtype suggests: ``int`` for integers and bools, else a float."""
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer):
        return int(value)  # type: ignore[call-overload]
    return _json_float(float(value))  # type: ignore[arg-type]


def _head(array: Array, count: int) -> list[int | float | str]:
    """The first ``count`` elements in C order of ``array``'s (logical) shape, read one by
    one so a memory map is touched only where they lie."""
    count = min(count, int(array.size))
    return [_json_value(array[_unravel(i, array.shape)], array.dtype) for i in range(count)]


def _worst(a: Array, b: Array, flat_index: int | None) -> WorstElement | None:
    if flat_index is None:
        return None
    index = _unravel(flat_index, a.shape)
    return {
        "index": list(index),
        "a": _json_value(a[index], a.dtype),
        "b": _json_value(b[index], b.dtype),
    }


def _unravel(flat_index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat_index, shape))
