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
reference) cannot be compared: sketches do not commute with a transpose.
"""

from __future__ import annotations

from typing import Any

from ..capture.sketch import ACCURACY, estimate, summarize_numpy
from ..errors import UNREADABLE
from .records import EntryResult
from .sources import CompareInputError, Entry, Source


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
        return _failed(
            result,
            f"summaries of different layouts ({ea.shape} vs {eb.shape}) cannot be compared: "
            "capture this module in full (mode=full, within=MODULE)",
        )
    try:
        sketch_a, stats_a = _sketch(a, ea, _inverse(permutation) if eb.stats is not None else None)
        sketch_b, stats_b = _sketch(b, eb, permutation if ea.stats is not None else None)
        numbers = estimate(sketch_a, sketch_b, stats_a, stats_b)
    except OSError as exc:
        raise CompareInputError(
            f"cannot read {exc.filename or ea.file}: {exc.strerror}", code=UNREADABLE
        ) from None
    except (ValueError, TypeError) as exc:
        return _failed(result, f"cannot compare the summaries: {exc}")
    exact = bool(numbers["exact"])
    nonfinite = abs(numbers["nan_a"] - numbers["nan_b"]) + abs(numbers["inf_a"] - numbers["inf_b"])
    rel_rms = numbers["rel_rms"]
    rms_a = numbers["rms_a"] or 0.0
    if rtol == 0 and atol == 0:
        ok = bool(numbers["identical"])
    else:
        ok = rel_rms is not None and rel_rms * rms_a <= atol + rtol * rms_a
    result.update(
        {
            "numel": numbers["numel"],
            "rel_rms": rel_rms,
            "cosine": numbers["cosine"],
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
            "estimated": {
                "method": "exact (small tensor)" if exact else "sketch",
                "buckets": int(sketch_a.size),
                "accuracy": 0.0 if exact else ACCURACY,
            },
        }
    )
    return result


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
