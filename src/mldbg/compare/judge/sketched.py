"""Compare a pair when either side is a summary capture: estimates from sketches.

A summary capture keeps, per tensor, exact statistics and a seeded linear sketch
(``capture/sketch.py``); the sketch of a difference is the difference of sketches, so
the relative error ``||b - a|| / ||a||`` that verdicts judge by is estimated from 8 KB
per tensor (exactly, for tensors of at most ``SKETCH_SIZE`` elements).  A full tensor
paired with a summary is sketched here, in the summary side's layout, so a full
reference can be compared with a summary port and the other way round.

What a sketch cannot give is left ``None``: element-wise numbers (``max_abs``,
``mismatched``, ``worst``), ``rel_max`` (the scale test then holds ``rel_rms`` alone).
Under explicit ``--rtol/--atol`` the pair passes when the RMS error is within
``atol + rtol * rms(a)``.  Two summaries whose layouts differ (an NHWC port of an NCHW
reference) cannot be compared by their sketches (sketches do not commute with a
transpose): their statistics give a lower bound of the error instead
(:func:`_across_layouts`).
"""

from __future__ import annotations

import math
from typing import Any

from ...capture.safetensors_header import CorruptTensorFile
from ...capture.sketch import ACCURACY, estimate, paired_statistics, relative, summarize_numpy
from ...errors import CORRUPT_FILE, UNREADABLE
from ..read.sources import CompareInputError, Entry, Source
from ..records import EntryResult, Estimated


def _not_measured() -> EntryResult:
    """The element-wise numbers a sketch cannot give, ``None``."""
    return {
        "max_abs": None,
        "mean_abs": None,
        "max_rel": None,
        "range_ratio": None,
        "rel_max": None,
        "largest": None,
        "min_atol": None,
        "mismatched": None,
        "head_a": None,
        "head_b": None,
        "worst": None,
    }


def compare_summaries(
    a: Source,
    b: Source,
    ea: Entry,
    eb: Entry,
    permutation: tuple[int, ...] | None,
    rtol: float,
    atol: float,
) -> EntryResult:
    """The metric fields of one pair, estimated (``estimated`` says how)."""
    result = _not_measured()
    if permutation is not None and ea.stats is not None and eb.stats is not None:
        return _across_layouts(result, ea.stats, eb.stats, rtol, atol)
    if _concatenated(ea) or _concatenated(eb):
        # Ranks' summaries gathered along a dimension (compare/gather.py): no sketch of
        # the whole exists, but its statistics do, and they bound the error from below.
        try:
            stats_a = ea.stats if ea.stats is not None else _sketch(a, ea, None)[1]
            stats_b = eb.stats if eb.stats is not None else _sketch(b, eb, None)[1]
        except OSError as exc:
            raise CompareInputError(
                f"cannot read {exc.filename or ea.file}: {exc.strerror}", code=UNREADABLE
            ) from None
        return _across_layouts(
            result, stats_a, stats_b, rtol, atol, "statistics (gathered from the ranks' summaries)"
        )
    try:
        sketch_a, stats_a = _sketch(a, ea, _inverse(permutation) if eb.stats is not None else None)
        sketch_b, stats_b = _sketch(b, eb, permutation if ea.stats is not None else None)
        numbers = estimate(sketch_a, sketch_b, stats_a, stats_b)
    except OSError as exc:
        raise CompareInputError(
            f"cannot read {exc.filename or ea.file}: {exc.strerror}", code=UNREADABLE
        ) from None
    except CorruptTensorFile as exc:  # bad input (exit 2), as for a full capture's files
        raise CompareInputError(str(exc), code=CORRUPT_FILE) from None
    except (ValueError, TypeError) as exc:
        return _failed(result, f"cannot compare the summaries: {exc}")
    exact = bool(numbers["exact"])
    rel_rms = numbers["rel_rms"]
    ok = (
        bool(numbers["identical"])
        if rtol == 0 and atol == 0
        else _within(rel_rms, numbers["rms_a"], rtol, atol)
    )
    estimated: Estimated = {
        "method": "exact (small tensor)" if exact else "sketch",
        "buckets": int(sketch_a.size),
        "accuracy": 0.0 if exact else ACCURACY,
    }
    return _judged(result, numbers, rel_rms, numbers["cosine"], ok, estimated)


def _concatenated(entry: Entry) -> bool:
    return entry.stats is not None and entry.stats.get("gathered") == "concatenated"


def _across_layouts(
    result: EntryResult,
    stats_a: dict[str, Any],
    stats_b: dict[str, Any],
    rtol: float,
    atol: float,
    why: str = "statistics (the layouts differ)",
) -> EntryResult:
    """Two summaries of different layouts (an NHWC port of an NCHW reference): sketches
    do not commute with a transpose, but the statistics do not depend on the order of
    the elements, and they bound the error from below.  For ``d = b - a`` over ``n``
    finite elements, ``| ||b|| - ||a|| | <= ||d||`` (the triangle inequality) and
    ``|sum b - sum a| <= sqrt(n) ||d||`` (Cauchy-Schwarz), so

        rel_rms >= max(| ||b|| - ||a|| |, sqrt(n) |mean_b - mean_a|) / ||a||

    That bound is the entry's ``rel_rms`` (``estimated.lower_bound``): a port that
    agrees stays within its bound, and one that fails it differs at least that much,
    but a difference that keeps the norm and the mean (a permutation of the elements)
    passes unseen.  A full capture of the module (``within=``) measures it."""
    numbers = paired_statistics(stats_a, stats_b)
    finite_a = numbers["numel"] - numbers["nan_a"] - numbers["inf_a"]
    norm_a, norm_b = float(stats_a.get("norm") or 0.0), float(stats_b.get("norm") or 0.0)
    means = stats_a.get("mean"), stats_b.get("mean")
    gap = abs(norm_b - norm_a)
    if means[0] is not None and means[1] is not None and finite_a > 0:
        gap = max(gap, math.sqrt(finite_a) * abs(float(means[1]) - float(means[0])))
    rel_rms = relative(gap, norm_a, norm_b)
    estimated: Estimated = {
        "method": f"{why}: a lower bound",
        "buckets": 0,
        "accuracy": 0.0,
        "lower_bound": True,
    }
    ok = _within(rel_rms, numbers["rms_a"], rtol, atol)
    return _judged(result, numbers, rel_rms, None, ok, estimated)


def _judged(
    result: EntryResult,
    numbers: dict[str, Any],
    rel_rms: float | None,
    cosine: float | None,
    ok: bool,
    estimated: Estimated,
) -> EntryResult:
    """``result`` with what the summaries say (``numbers``: ``paired_statistics``' fields)
    and the verdict: ``ok`` unless the NaN/Inf counts differ."""
    nonfinite = abs(numbers["nan_a"] - numbers["nan_b"]) + abs(numbers["inf_a"] - numbers["inf_b"])
    result.update(
        {
            "numel": numbers["numel"],
            "rel_rms": rel_rms,
            "cosine": cosine,
            "rms_a": numbers["rms_a"],
            "rms_b": numbers["rms_b"],
            "range_a": numbers["range_a"],  # the width of the range: a summary keeps no more
            "range_b": numbers["range_b"],
            "nan_a": numbers["nan_a"],
            "nan_b": numbers["nan_b"],
            "inf_a": numbers["inf_a"],
            "inf_b": numbers["inf_b"],
            "nonfinite_mismatched": nonfinite,
            "ok": bool(ok) and nonfinite == 0,
            "error": None,
            "estimated": estimated,
        }
    )
    return result


def _within(rel_rms: float | None, rms_a: float | None, rtol: float, atol: float) -> bool:
    """The RMS error within ``atol + rtol * rms(a)`` (exactly zero when both are 0)."""
    if rtol == 0 and atol == 0:
        return rel_rms == 0
    scale = rms_a or 0.0
    return rel_rms is not None and rel_rms * scale <= atol + rtol * scale


def _failed(result: EntryResult, error: str) -> EntryResult:
    result.update({"error": error, "ok": False, "numel": None, "rel_rms": None})
    return result


def _sketch(
    source: Source, entry: Entry, permutation: tuple[int, ...] | None
) -> tuple[Any, dict[str, Any]]:
    """A summary's stored sketch and statistics, or a full tensor sketched now (first
    transposed by ``permutation`` into the other side's layout)."""
    import numpy as np

    array = source.load(entry)
    if entry.stats is not None:
        return np.asarray(array, dtype=np.float64).reshape(-1), entry.stats
    if permutation is not None:
        array = np.ascontiguousarray(np.asarray(array).transpose(permutation))
    return summarize_numpy(array)


def _inverse(permutation: tuple[int, ...] | None) -> tuple[int, ...] | None:
    if permutation is None:
        return None
    inverse = [0] * len(permutation)
    for position, axis in enumerate(permutation):
        inverse[axis] = position
    return tuple(inverse)
