"""Per-pair numbers for ``mldbg compare``: how far a port's tensor is from its reference.

Everything here is numpy only (bf16 and fp8 arrive as ``ml_dtypes`` arrays, which numpy
converts like any other dtype), so the daemon can compare runs of either framework
without importing torch or MLX.

Three decisions shape the code:

* **float64 throughout.**  Differences between a bf16 reference and its port are often a
  few ulps of the *input* dtype; computing them in that dtype (or in float32 for large
  sums) would round away exactly what is being measured, and int64 token ids would
  saturate.  float64 holds every value of every supported float dtype exactly, but
  integers only up to 2**53, so a pair of two integer (or bool) tensors is also held as
  sign and uint64 magnitude: which elements differ, ``mismatched``, ``max_abs`` (the
  exact difference, rounded once to float) and ``worst`` are exact for any int64/uint64
  values, mixes included; the other metrics stay float64.
* **Streaming.**  The inputs are usually memory maps of safetensors files that can be
  larger than memory.  ``compare_arrays`` reads ``chunk_elements`` elements at a time
  and folds them into running totals, so peak memory is about 46 bytes per chunk
  element (about 6 MB with the default chunk of 2**17; integer pairs need a little more
  for their exact differences), whatever the tensor size.  Maxima,
  minima, counts and the worst element do not depend on the chunk size at all; sums
  (``mean_abs``, ``cosine``) may differ in their last bits, as float sums in a different
  order do.
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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

# torch.testing.assert_close defaults (torch/testing/_comparison.py), keyed by safetensors
# dtype name.  fp8 is not in torch's table; its entries are ours: one machine epsilon
# relative (2**-3 for E4M3's 3 mantissa bits, 2**-2 for E5M2's 2), i.e. a port may round
# once differently, and an absolute floor of 1e-2, about E4M3's smallest normal value
# (2**-6), below which fp8 keeps almost no relative precision.
_TOLERANCES: dict[str, tuple[float, float]] = {
    "F64": (1e-7, 1e-7),
    "F32": (1.3e-6, 1e-5),
    "F16": (1e-3, 1e-5),
    "BF16": (1.6e-2, 1e-5),
    "F8_E4M3": (0.125, 1e-2),
    "F8_E5M2": (0.25, 1e-2),
    "C128": (1e-7, 1e-7),
    "C64": (1.3e-6, 1e-5),
}
# numpy / ml_dtypes names, for callers that pass ``str(array.dtype)`` instead.
_ALIASES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e4m3": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "complex128": "C128",
    "complex64": "C64",
}
_EXACT_PREFIXES = ("I", "U", "BOOL", "int", "uint", "bool")
_FALLBACK_TOLERANCE = _TOLERANCES["F32"]

# channels-last -> channels-first first (the usual MLX-port-vs-PyTorch case), then back.
_LAYOUT_CANDIDATES: dict[int, tuple[tuple[int, ...], ...]] = {
    2: ((1, 0),),
    3: ((0, 2, 1),),
    4: ((0, 3, 1, 2), (0, 2, 3, 1)),
    5: ((0, 4, 1, 2, 3), (0, 2, 3, 4, 1)),
}


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
    name = _ALIASES.get(dtype, dtype)
    if name in _TOLERANCES:
        return _TOLERANCES[name]
    if name.startswith(_EXACT_PREFIXES):
        return (0.0, 0.0)
    if name.startswith("F8"):
        return _TOLERANCES["F8_E5M2"] if "E5M2" in name else _TOLERANCES["F8_E4M3"]
    return _FALLBACK_TOLERANCE


# Names for the permutations ports most often need: channels-last vision and audio.
LAYOUT_NAMES: dict[tuple[int, ...], str] = {
    (0, 3, 1, 2): "NHWC→NCHW",
    (0, 2, 3, 1): "NCHW→NHWC",
    (0, 4, 1, 2, 3): "NDHWC→NCDHW",
    (0, 2, 3, 4, 1): "NCDHW→NDHWC",
    (0, 2, 1): "NLC→NCL",
    (1, 0): "transposed",
}


def layout_name(permutation: tuple[int, ...]) -> str:
    """What a person calls the layout change ``permutation`` undoes (``NHWC→NCHW``)."""
    return LAYOUT_NAMES.get(tuple(permutation), f"transposed {list(permutation)}")


def layout_permutation(
    shape_a: tuple[int, ...], shape_b: tuple[int, ...]
) -> tuple[int, ...] | None:
    """The axes ``p`` with ``b.transpose(p).shape == shape_a``, for a layout-only difference.

    Ports to MLX keep convolution activations channels-last (NHWC, NLC) where PyTorch is
    channels-first; such a pair holds the same numbers in a different order, so it should
    be compared after a transpose rather than reported as a shape error.  Only these
    transposes are tried, channels-last-to-first first: 4-D ``(0, 3, 1, 2)`` then
    ``(0, 2, 3, 1)``, 5-D the same, 3-D ``(0, 2, 1)``, 2-D ``(1, 0)``.  ``None`` when the
    shapes are already equal (an ambiguous square case is compared as is) or nothing fits.
    """
    shape_a, shape_b = tuple(shape_a), tuple(shape_b)
    if shape_a == shape_b or len(shape_a) != len(shape_b):
        return None
    for perm in _LAYOUT_CANDIDATES.get(len(shape_a), ()):
        if tuple(shape_b[axis] for axis in perm) == shape_a:
            return perm
    return None


# Elements per streamed block: about a megabyte per float64 buffer, so the dozen passes
# the metrics make over a block run from the CPU's cache instead of main memory (measured:
# 2-3x the throughput of 2**20-element blocks, and less memory).
CHUNK_ELEMENTS = 1 << 17


def compare_arrays(
    a: Any,
    b: Any,
    *,
    rtol: float,
    atol: float,
    permutation: tuple[int, ...] | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
    head: int = 5,
) -> dict[str, Any]:
    """Compare reference ``a`` with ``b`` (first transposed by ``permutation``), streaming.

    Returns a JSON-ready dict with the keys ``numel``, ``max_abs``, ``mean_abs``,
    ``max_rel``, ``cosine``, ``range_a``, ``range_b``, ``range_ratio``, ``mismatched``,
    ``nonfinite_mismatched``, ``min_atol``, ``nan_a``, ``nan_b``, ``inf_a``, ``inf_b``,
    ``head_a``, ``head_b``, ``worst`` and ``ok``.

    ``mismatched`` counts elements failing assert_close's test ``|b - a| <= atol + rtol *
    |a|`` (``a`` is the "expected" side), with NaN equal to NaN and an infinity equal only
    to the same infinity; ``nonfinite_mismatched`` is the part of that count where NaN or
    an infinity is involved (NaN vs a number, inf vs -inf, inf vs a number); ``ok`` is
    ``mismatched == 0``.  ``max_abs``, ``mean_abs``, ``max_rel``, ``cosine``, the ranges
    and ``min_atol`` (the smallest atol that would pass at this rtol) cover only the
    elements finite in both tensors, so the first four can read 0, 0, 0, 1 while
    ``nonfinite_mismatched`` is not 0; ``min_atol`` is then ``None``: no atol passes.
    ``worst`` is the first element with the largest finite ``|b - a|``, except that when
    every pair finite in both passes and some NaN/inf pair does not, it is the first such
    NaN/inf mismatch.  When both tensors are integer or bool, which elements
    differ, ``max_abs`` and ``worst`` are decided on exact integers (tolerances of 0 mean
    exact equality for any int64/uint64 values; nonzero ones compare the exact difference,
    rounded to float64, with ``atol + rtol * |a|``).  Shapes must agree after the
    permutation (``ValueError`` otherwise); complex dtypes raise ``TypeError``.
    """
    a, b = np.asanyarray(a), np.asanyarray(b)
    exact = _is_exact(a.dtype) and _is_exact(b.dtype)
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
    totals = _Totals(rtol=float(rtol), atol=float(atol))
    if not exact:
        totals.scratch = _Scratch(min(chunk_elements, max(1, int(a.size))))
    # Overflow (|a - b| or a square beyond float64) is reported as "inf"/"nan", not warned.
    with np.errstate(over="ignore", invalid="ignore"):
        for offset, view_a, view_b in _blocks(a, b, chunk_elements):
            if exact:
                totals.add_exact(offset, view_a, view_b)
            else:
                scratch = totals.scratch
                assert scratch is not None
                totals.add(offset, scratch.widen("a", view_a), scratch.widen("b", view_b))
    return {
        "numel": int(a.size),
        **totals.summary(),
        "head_a": _head(a, head),
        "head_b": _head(b, head),
        "worst": _worst(a, b, totals.worst()),
        "largest": _worst(a, b, totals.largest_index),
        "ok": totals.mismatched == 0,
    }


# ---------------------------------------------------------------------------- chunking


def _blocks(a: np.ndarray, b: np.ndarray, chunk: int) -> Iterator[tuple[int, Any, Any]]:
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


def _index_blocks(shape: tuple[int, ...], chunk: int) -> Iterator[tuple[Any, ...]]:
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
    """The float64 buffers one block needs, allocated once per comparison.

    Temporaries of a megabyte are above the C allocator's mmap threshold: allocated anew
    for every block, each comes back as fresh pages the kernel must fault in (measured:
    most of the time of a comparison of large tensors, 4x slower than with these).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._buffers: dict[str, Any] = {}

    def get(self, name: str, size: int) -> Any:
        if size > self.size:
            return np.empty(size)
        buffer = self._buffers.get(name)
        if buffer is None:
            buffer = self._buffers[name] = np.empty(self.size)
        return buffer[:size]

    def widen(self, name: str, block: Any) -> Any:
        """``block`` as a flat float64 array, in this scratch (bf16/fp8 exactly)."""
        out = self.get(name, int(np.size(block)))
        np.copyto(out.reshape(np.shape(block)), block, casting="unsafe")
        return out


def _to_float64(block: Any) -> Any:
    """A C-contiguous flat float64 copy of ``block`` (bf16/fp8 exactly, integers to 2**53)."""
    return np.ascontiguousarray(block, dtype=np.float64).reshape(-1)


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
    """Running totals over the blocks seen so far; ``summary`` turns them into the result."""

    rtol: float
    atol: float
    mismatched: int = 0
    nonfinite_mismatched: int = 0
    first_nonfinite: int | None = None  # flat index of the first NaN/inf mismatch
    exact_max: int = -1  # the largest |b - a| so far, integer pairs only
    nan_a: int = 0
    nan_b: int = 0
    inf_a: int = 0
    inf_b: int = 0
    finite_pairs: int = 0
    sum_abs: float = 0.0
    max_abs: float = -1.0
    max_rel: float = 0.0
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
    # Scratch float64 buffers of one block, made once (see ``_Scratch``); None: allocate.
    scratch: _Scratch | None = None

    def _buffer(self, name: str, size: int) -> Any:
        if self.scratch is None:
            return np.empty(size)
        return self.scratch.get(name, size)

    def add(self, offset: int, block_a: Any, block_b: Any) -> None:
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
            positions = np.flatnonzero(both)
            block_a, block_b = block_a[positions], block_b[positions]
        if block_a.size:
            self._add_finite(offset, block_a, block_b, positions)

    def add_exact(self, offset: int, block_a: Any, block_b: Any) -> None:
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

    def _add_finite(self, offset: int, xa: Any, xb: Any, positions: Any) -> None:
        """Fold in a block of pairs that are finite in both (``positions`` maps them back
        to the block's element numbers when some were dropped)."""
        # Written with out= so that about four float64 buffers per chunk element are alive,
        # and each intermediate is computed once: the passes over the block are the cost.
        diff = np.subtract(xa, xb, out=self._buffer("diff", xa.size))
        np.abs(diff, out=diff)
        at = int(np.argmax(diff))  # the first of equal maxima: stable across chunkings
        if float(diff[at]) > self.max_abs:
            self.max_abs = float(diff[at])
            self.largest_index = offset + (at if positions is None else int(positions[at]))
        larger, scaled = self._magnitudes(xa, xb)
        # ``worst`` is the element that fails its own tolerance by the most (the largest
        # |b - a| - rtol |a|), not merely the largest difference: a big value off by a few
        # ulps is not worse than a small one off by half of itself.  The same maximum is
        # the smallest atol that passes (``min_atol``).
        excess = np.subtract(diff, scaled, out=self._buffer("excess", xa.size))
        at = int(np.argmax(excess))
        self.max_excess = max(self.max_excess, float(excess[at]))
        if float(excess[at]) > self.max_excess_seen:
            self.max_excess_seen = float(excess[at])
            self.worst_index = offset + (at if positions is None else int(positions[at]))
        del excess
        self._fold(xa, xb, diff, larger, scaled)

    def _magnitudes(self, xa: Any, xb: Any) -> tuple[Any, Any]:
        """``max(|a|, |b|)`` (the scale relative errors are taken against) and ``rtol |a|``."""
        scaled = np.abs(xa, out=self._buffer("scaled", xa.size))
        larger = np.abs(xb, out=self._buffer("larger", xa.size))
        np.maximum(larger, scaled, out=larger)
        np.multiply(scaled, self.rtol, out=scaled)
        return larger, scaled

    def _fold(self, xa: Any, xb: Any, diff: Any, larger: Any, scaled: Any) -> None:
        """The sums, the relative maximum and the tolerance test over pairs finite in both,
        given ``diff = |xa - xb|``, ``larger = max(|xa|, |xb|)`` and ``scaled = rtol |xa|``
        (buffers this overwrites)."""
        self.finite_pairs += xa.size
        self.sum_abs += float(np.sum(diff))
        self.sum_sq_diff += _dot(diff, diff)
        # Relative to the larger magnitude of the two: symmetric, bounded by 2.  Where both
        # are exactly zero (a perfect match) 0/0 is NaN, which fmax passes over.
        np.divide(diff, larger, out=larger)
        rel = float(np.fmax.reduce(larger))
        if not math.isnan(rel):
            self.max_rel = max(self.max_rel, rel)
        # atol + rtol * |a|: the expression torch.isclose evaluates, so boundaries round alike.
        allowed = np.add(scaled, self.atol, out=scaled)
        failed = np.greater(
            diff, allowed, out=self._buffer("failed", diff.size).view(bool)[: diff.size]
        )
        self.mismatched += int(np.count_nonzero(failed))
        self.dot += _dot(xa, xb)
        self.norm2_a += _dot(xa, xa)
        self.norm2_b += _dot(xb, xb)

    def summary(self) -> dict[str, Any]:
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
            **self._scale(measured),
        }

    def _scale(self, measured: bool) -> dict[str, Any]:
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

        def ratio(num: float, den: float) -> float | str:
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

    def _range_ratio(self) -> float | str | None:
        if self.range_a is None or self.range_b is None:
            return None
        width_a = self.range_a[1] - self.range_a[0]
        if width_a == 0.0:
            return None
        return _json_float((self.range_b[1] - self.range_b[0]) / width_a)


def _dot(x: Any, y: Any) -> float:
    """``x . y`` without BLAS: numpy's ``dot`` hands a block this size to OpenBLAS's
    threads, which on a busy machine wait for a free core at every call (measured: 20 us
    idle, 1-3 ms loaded, per block); ``einsum`` stays on this thread at a steady speed."""
    return float(np.einsum("i,i->", x, y))


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


def _json_float(value: float) -> float | str:
    """A finite float as is; NaN and infinities as ``"nan"``, ``"inf"``, ``"-inf"``."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(value)


def _json_range(bounds: tuple[float, float] | None) -> list[float | str] | None:
    return None if bounds is None else [_json_float(bounds[0]), _json_float(bounds[1])]


def _json_value(value: Any, dtype: np.dtype[Any]) -> int | float | str:
    """One element as its dtype suggests: ``int`` for integers and bools, else a float."""
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer):
        return int(value)
    return _json_float(float(value))


def _head(array: np.ndarray, count: int) -> list[int | float | str]:
    """The first ``count`` elements in C order of ``array``'s (logical) shape, read one by
    one so a memory map is touched only where they lie."""
    count = min(count, int(array.size))
    return [_json_value(array[_unravel(i, array.shape)], array.dtype) for i in range(count)]


def _worst(a: np.ndarray, b: np.ndarray, flat_index: int | None) -> dict[str, Any] | None:
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
