"""Compare two sources pair by pair and name the first divergence.

Pairs are streamed: one pair's tensors are mapped, reduced chunk by chunk in float64
and released before the next, so two whole models are never in memory.  The result
is the documented JSON shape (README, "mldbg compare").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..capture.safetensors_header import CorruptTensorFile
from . import metrics
from .align import Alignment, Pair, align
from .arrays import UnsupportedDtype
from .divergence import first_divergence
from .mapping import NameMap
from .sources import CompareInputError, Source

Progress = Callable[[int, int, str], None]


def compare_sources(
    a: Source,
    b: Source,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    names: NameMap | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    alignment = align(a, b, names or NameMap())
    if not alignment.pairs:
        raise CompareInputError(_nothing_paired(a, b, alignment), code="nothing_paired")
    results = []
    for done, pair in enumerate(alignment.pairs):
        if progress is not None:
            progress(done, len(alignment.pairs), pair.a.name)
        results.append(_compare_pair(a, b, pair, rtol, atol))
    if progress is not None:
        progress(len(alignment.pairs), len(alignment.pairs), "")
    if all(r["error"] for r in results):
        first = results[0]
        raise CompareInputError(
            f"nothing could be compared: {first['name']}: {first['error']}"
            + (f" (and {len(results) - 1} more)" if len(results) > 1 else ""),
            code="nothing_comparable",
        )
    culprit = first_divergence(a, results)
    culprit_entries = set(culprit["entries"]) if culprit else set()
    for result in results:
        result["culprit"] = result["name"] in culprit_entries
    failed = sum(1 for r in results if not r["ok"])
    return {
        "ok": failed == 0,
        "a": a.describe(),
        "b": b.describe(),
        "rtol": rtol,
        "atol": atol,
        "first_divergence": culprit,
        "entries": results,
        "unpaired_a": alignment.unpaired_a,
        "unpaired_b": alignment.unpaired_b,
        "counts": {
            "compared": len(results),
            "passed": len(results) - failed,
            "failed": failed,
            "unpaired_a": len(alignment.unpaired_a),
            "unpaired_b": len(alignment.unpaired_b),
        },
        "warnings": a.warnings + b.warnings,
    }


def _nothing_paired(a: Source, b: Source, alignment: Alignment) -> str:
    def some(names: list[str]) -> str:
        return ", ".join(names[:5]) + (" …" if len(names) > 5 else "")

    if not alignment.unpaired_a or not alignment.unpaired_b:
        empty = a if not alignment.unpaired_a else b
        return f"{empty.label} has no tensors to compare"
    return (
        f"no tensor names in common: {a.label} has {some(alignment.unpaired_a)}; "
        f"{b.label} has {some(alignment.unpaired_b)}. Map B's names onto A's with --map FILE"
    )


def _compare_pair(
    a: Source, b: Source, pair: Pair, rtol: float | None, atol: float | None
) -> dict[str, Any]:
    ea, eb = pair.a, pair.b
    result: dict[str, Any] = {
        "name": ea.name,
        "module": ea.module,
        "call": ea.call,
        "role": ea.role,
        "shape_a": ea.shape,
        "shape_b": eb.shape,
        "dtype_a": ea.dtype,
        "dtype_b": eb.dtype,
        "transpose": None,
        "layout": None,
    }
    if pair.b_name != ea.name:
        result["name_b"] = pair.b_name
        result["paired_by"] = pair.how
    default_rtol, default_atol = metrics.default_tolerance(ea.dtype, eb.dtype)
    result["rtol"] = default_rtol if rtol is None else rtol
    result["atol"] = default_atol if atol is None else atol
    permutation = None
    if list(ea.shape) != list(eb.shape):
        permutation = metrics.layout_permutation(tuple(ea.shape), tuple(eb.shape))
        if permutation is None:
            same = _count(ea.shape) == _count(eb.shape)
            result.update(
                _empty_metrics(),
                error=f"shapes differ: {ea.shape} vs {eb.shape}"
                + (" (same number of elements: a reshape?)" if same else ""),
                ok=False,
            )
            return result
        result["transpose"] = list(permutation)
        result["layout"] = metrics.layout_name(permutation)
    try:
        array_a = a.load(ea)
        array_b = b.load(eb)
    except UnsupportedDtype as exc:
        result.update(_empty_metrics(), error=str(exc), ok=False)
        return result
    except CorruptTensorFile as exc:
        raise CompareInputError(str(exc), code="corrupt_file") from None
    except OSError as exc:
        raise CompareInputError(
            f"cannot read {exc.filename or ea.file}: {exc.strerror}", code="unreadable"
        ) from None
    try:
        numbers = metrics.compare_arrays(
            array_a, array_b, rtol=result["rtol"], atol=result["atol"], permutation=permutation
        )
    except TypeError as exc:  # complex and other dtypes the metrics do not define
        result.update(_empty_metrics(), error=str(exc), ok=False)
        return result
    result.update(numbers)
    result["error"] = None
    return result


def _count(shape: list[int]) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


def _empty_metrics() -> dict[str, Any]:
    keys = [
        "max_abs",
        "mean_abs",
        "max_rel",
        "cosine",
        "range_a",
        "range_b",
        "range_ratio",
        "min_atol",
        "mismatched",
        "nonfinite_mismatched",
        "numel",
        "head_a",
        "head_b",
        "worst",
        "nan_a",
        "nan_b",
        "inf_a",
        "inf_b",
    ]
    return dict.fromkeys(keys)
