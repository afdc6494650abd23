"""Tight bounds from a better reference: a run of the reference that rounds less.

The scale-aware bound (:mod:`.bounds`) is what a clean port *may* accumulate:
``2 u sqrt(1 + d)`` grows with depth like a random walk of independent roundings, and
in bfloat16 that is loose: at a small Llama's logits it is ~0.04 where a clean port
differs by 7e-3.  What the reference's own rounding did can be measured instead, when
a run of the reference that rounds less exists (``compare A B --better C``):

* **C is the reference in a wider dtype** (the same weights and inputs in float32 or
  float64: ``mldbg.capture(..., precision="float64")``).  At each entry the
  reference's own error against it, ``e_A = rel_rms(A, C)``, is what rounding in A's
  dtype did there, the depth and the ill-conditioned ops included, measured.  A clean
  port rounds the same computation in the same dtype, at other places or the same
  ones, so its error against C, ``e_B``, is about ``e_A`` and it differs from A by at
  most about ``2 e_A`` (measured on clean bf16 Llama, Qwen2/3, Gemma, GPT-2, Flux, SD3,
  PixArt and VAE ports and fp16/fp32 Llama: ``e_B <= 1.55 e_A`` and ``|B - A| <= 1.81
  e_A`` at every entry).  So ``e_B`` is held to ``BETTER_C * e_A`` and the entry's
  bound (on B's difference from A, its numbers as ever, so the rules name the culprit
  on them) becomes the smaller of the scale-aware one and ``(1 + BETTER_C) e_A``
  (``e_A`` scaled by the ratio of the dtypes' units when B's is coarser).  Where
  ``e_A`` is below one rounding step of the coarser dtype, C did not round less (an
  exact op; code that casts to float32 itself, as diffusers' timestep embedding does,
  runs the same in C) and the scale-aware bound stands, its measured conditioning
  included.  Where the reference's own error is dominated by a rounding the port makes
  identically (a bfloat16 Flux rounds its timestep ``0.898 * 1000`` to 900 on both
  sides, 0.3 relative at the embedding against C), ``e_A`` bounds nothing tighter and
  the scale-aware bound stays too.
* **B is quantized and C is the reference on B's dequantized weights** (in a wide
  dtype).  Then A and C differ by the quantization, and B and C only by B's own
  rounding: B is compared with C instead of A, held to the rounding bound of its dtype
  with no quantization allowance, so a 4-bit bug below the quantization's noise
  (which the ordinary verdict must allow) is named; A's error against C (the
  quantization's) is shown beside.  A C that B is no closer to than A at B's quantized
  modules holds the reference's weights, not B's: said, exit 2.

``headroom`` (``rel_rms / expected``) on every judged entry says how close it came.
Floors and depths are the reference's (A's) measurements either way: C's own capture
measured rounding in C's dtype.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Literal

from ... import dtypes
from ...errors import BAD_ARGUMENT
from ..pair.align import Pair, align
from ..pair.layout import Layouts
from ..pair.mapping import NameMap
from ..read.sources import CompareInputError, Entry, Source
from ..records import EntryResult
from . import metrics
from .bounds import scale_test, unit_roundoff

# What a clean port's error against C may be, in units of the reference's own: measured
# at most 1.55 (its difference from A at most 1.81 of it, held to 1 + BETTER_C) over
# the zoo's clean bf16, fp16 and fp32 ports, so 2.5 leaves 1.6x of room.
BETTER_C = 2.5
# B's error against C at its quantized modules, over A's: below it, C holds B's
# dequantized weights (B rounds, A also carries the quantization: measured ~0.01-0.1).
PORT_WEIGHTS_RATIO = 0.5

Mode = Literal["precision", "port weights"]


@dataclass
class BetterReference:
    """A better run of the reference, and the reference's own error against it."""

    source: Source
    errors: dict[str, float] = field(default_factory=dict)  # A's entry -> rel_rms(A, C)
    dtypes_a: dict[str, str] = field(default_factory=dict)  # A's entry -> A's dtype
    entries: dict[str, Entry] = field(default_factory=dict)  # A's entry -> C's
    port_errors: dict[str, float] = field(default_factory=dict)  # A's entry -> rel_rms(B, C)
    mode: Mode = "precision"

    def describe(self) -> dict[str, object]:
        return {
            "source": self.source.describe(),
            "mode": self.mode,
            "factor": BETTER_C,
            "entries": len(self.errors),
        }


def open_better(a: Source, better: Source) -> BetterReference:
    """``better`` beside ``a``: A's error against it at every entry both hold (paired
    by name: one model, one run's structure), read one pair at a time."""
    found = BetterReference(better)
    for pair in align(a, better, NameMap()).pairs:
        error = _rel_rms(a, better, pair.a, pair.b)
        if error is not None:
            found.errors[pair.a.name] = error
            found.dtypes_a[pair.a.name] = pair.a.dtype
            found.entries[pair.a.name] = pair.b
    return found


def measure_port(found: BetterReference, b: Source, pairs: list[Pair], layouts: Layouts) -> None:
    """B's error against C at each pair of A and B whose A entry C holds (B's tensor
    laid out as A's, as the pair is compared)."""
    for pair in pairs:
        entry = found.entries.get(pair.a.name)
        if entry is None:
            continue
        error = _rel_rms(found.source, b, entry, pair.b, layouts.permutation(pair))
        if error is not None:
            found.port_errors[pair.a.name] = error


def _rel_rms(
    a: Source,
    c: Source,
    ea: Entry,
    ec: Entry,
    permutation: tuple[int, ...] | list[int] | None = None,
) -> float | None:
    """``rel_rms`` of ``ec`` (in ``c``) against ``ea`` (in ``a``); None where it is not
    a float pair of one shape (after ``permutation``), or cannot be read."""
    if ea.stats is not None or ec.stats is not None:
        return None  # summaries: no tensor to measure
    shape = list(ec.shape) if permutation is None else [ec.shape[i] for i in permutation]
    if shape != list(ea.shape) or dtypes.is_exact(ea.dtype) or dtypes.is_exact(ec.dtype):
        return None
    try:
        rtol, atol = metrics.default_tolerance(ea.dtype, ec.dtype)
        numbers = metrics.compare_arrays(
            a.load(ea),
            c.load(ec),
            rtol=rtol,
            atol=atol,
            permutation=None if permutation is None else tuple(permutation),
        )
    except (OSError, TypeError, ValueError):
        return None
    value = numbers.get("rel_rms")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def quantized_port(b: Source) -> bool:
    """B has quantized modules: a better run helps it only on its dequantized weights."""
    return any(call.quant for call in b.calls.values())


def check_port_weights(found: BetterReference, results: list[EntryResult]) -> None:
    """``results`` (B against C) show C holding B's dequantized weights: at B's quantized
    modules B is much closer to C than A is; bad input otherwise."""
    found.mode = "port weights"
    ratios = [
        float(rel) / found.errors[r["name"]]
        for r in results
        if r.get("quantized") and r.get("role") == "out"
        for rel in [r.get("rel_rms")]
        if isinstance(rel, int | float) and found.errors.get(r["name"])
    ]
    median = statistics.median(ratios) if ratios else math.nan
    if not median < PORT_WEIGHTS_RATIO:
        raise CompareInputError(
            "better: B is quantized, and it is no closer to the better run than A is at "
            f"its quantized modules (median ratio {median:.2g}): the better run holds the "
            "reference's weights. For a quantized port, make it on the port's dequantized "
            "weights (docs/parity-precision.md)",
            code=BAD_ARGUMENT,
        )


def judge_by_better(found: BetterReference, results: list[EntryResult]) -> None:
    """Each entry A and C both hold.  Precision mode: B's error against C is held to
    ``BETTER_C`` times A's own (:func:`_reference_scale`), and B's difference from A to
    the smaller of its scale-aware bound and what that allows of it (``1 + BETTER_C``
    times A's own: B and A each that far from C).  Port weights mode (B already judged
    against C without a quantization allowance): A's error, the quantization's, beside."""
    for result in results:
        error_a = found.errors.get(result["name"])
        if error_a is None or result.get("error") or result.get("test") != "scale":
            continue
        if found.mode == "port weights":
            result["better"] = {"reference_rel_rms": error_a, "mode": found.mode}
            continue
        scale = _reference_scale(found, result, error_a)
        error_b = found.port_errors.get(result["name"])
        expected = result.get("expected")
        if scale is None or error_b is None or expected is None:
            continue  # C does not round less here (see _reference_scale): the bound stands
        bound_b = BETTER_C * scale
        passes = error_b <= bound_b
        result["better"] = {
            "rel_rms": error_b,
            "reference_rel_rms": error_a,
            "bound": bound_b,
            "ok": passes,
            "mode": found.mode,
        }
        tighter = (1.0 + BETTER_C) * scale
        local = result.get("expected_local")
        if local is not None:
            result["expected_local"] = min(local, tighter)
        if tighter < expected:
            result["expected"] = tighter
            result.pop("conditioning", None)  # C measured what the conditioning did
            check_max = not result.get("quant_noise")
            result["scale_ok"] = scale_test(result, tighter, check_max=check_max)
        elif passes:
            continue  # A's own error bounds nothing tighter here: the scale test stands
        result["ok"] = bool(result.get("scale_ok")) and passes
        result["test"] = "better"


def _reference_scale(found: BetterReference, result: EntryResult, error_a: float) -> float | None:
    """A's error against C as a bound's unit, scaled up to B's dtype when B's is coarser;
    None for exact dtypes and where it is below one rounding step of the coarser dtype:
    C did not round less there (an exact op, or code that casts to float32 itself, as
    diffusers' timestep embedding does, runs the same in C), and the scale-aware bound,
    with its measured conditioning, stands."""
    u = unit_roundoff(result.get("dtype_a") or "", result.get("dtype_b") or "")
    if u is None:
        return None
    unit_a = dtypes.unit_roundoff(found.dtypes_a.get(result["name"], "")) or 0.0
    unit_b = dtypes.unit_roundoff(result.get("dtype_b") or "") or 0.0
    coarser = unit_b / unit_a if unit_a and unit_b > unit_a else 1.0
    scale = error_a * coarser
    return scale if scale >= u else None


def headroom(results: list[EntryResult]) -> None:
    """Each judged entry's ``headroom``: its error over its bound (1 is the bound; with
    a better run, the larger of that and B's error against it over its bound)."""
    for result in results:
        rel, bound = result.get("rel_rms"), result.get("expected")
        if isinstance(rel, int | float) and isinstance(bound, int | float) and bound > 0:
            found = float(rel) / float(bound)
            better = result.get("better") or {}
            error_b, bound_b = better.get("rel_rms"), better.get("bound")
            if error_b is not None and bound_b:
                found = max(found, error_b / bound_b)
            result["headroom"] = found
