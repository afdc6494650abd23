"""Two runs' checkpoint records side by side, paired by checkpoint name and hit.

The reference and the port both call ``debug_checkpoint("block.3.attn", ...)``; this
answers, for each name and hit found in both runs, how each variable compares: shape,
dtype, the statistics of both sides with their differences, and the first values (the
record's preview, all a record keeps of the values) side by side.  It reports the numbers
and leaves the verdict to ``compare`` (which has the tensors and their rounding): a record
holds statistics, not enough to say what rounding explains.  Standard library only.
"""

from __future__ import annotations

import fnmatch
import math
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from .. import budget
from ..summary import relative as relative_to
from .runs import CHECKPOINTS, RunDir, iter_jsonl, resolve_run

if TYPE_CHECKING:  # the result shapes, for the type checker
    from typing import TypeGuard

    from .. import results as R

MAX_RECORDS = 20_000  # records read from each run (after the name/hit filter)
PAIR_BYTES = 8_000  # one pair in the answer, at most
UNPAIRED_SHOWN = 50
STATS = ("min", "max", "mean", "std")


class _Record(TypedDict, total=False):
    """What pairing keeps of a checkpoint record (``results.CheckpointRecord``)."""

    checkpoint_name: str
    hit_count: int
    variables: dict[str, dict[str, object]] | None
    location: R.Location | None


def compare_runs(
    home: Path,
    a: str | None,
    b: str,
    name: str | None = None,
    hit: int | None = None,
    offset: int = 0,
    limit: int = 20,
) -> R.CheckpointPairs:
    """Pairs of records ``(checkpoint_name, hit_count)`` in run ``a``'s order."""
    run_a, run_b = resolve_run(home, a), resolve_run(home, b)
    records_a, cut_a = _records(run_a, name, hit)
    records_b, cut_b = _records(run_b, name, hit)
    by_key_b = {_key(r): r for r in records_b}
    keys_a = {_key(r) for r in records_a}
    paired = [(r, by_key_b[_key(r)]) for r in records_a if _key(r) in by_key_b]
    unpaired_a = [_label(r) for r in records_a if _key(r) not in by_key_b]
    unpaired_b = [_label(r) for r in records_b if _key(r) not in keys_a]
    page = paired[offset : offset + limit]
    pairs = [budget.shrink(_pair(ra, rb), PAIR_BYTES) for ra, rb in page]
    args = {"a": run_a.run_id, "b": str(run_b.path), "name": name, "hit": hit, "limit": limit}
    result: R.CheckpointPairs = {
        "a": {"run_id": run_a.run_id, "path": str(run_a.path)},
        "b": {"run_id": run_b.run_id, "path": str(run_b.path)},
        "pairs": pairs,
        "unpaired_a": unpaired_a[:UNPAIRED_SHOWN],
        "unpaired_b": unpaired_b[:UNPAIRED_SHOWN],
        "unpaired_counts": {"a": len(unpaired_a), "b": len(unpaired_b)},
        **budget.page_info(len(paired), offset, len(pairs), "compare-checkpoints", args),
    }
    if cut_a or cut_b:
        result["records_cut"] = {"a": cut_a, "b": cut_b, "read": MAX_RECORDS}
    return result


def _records(run: RunDir, name: str | None, hit: int | None) -> tuple[list[_Record], bool]:
    kept: list[_Record] = []
    for record in iter_jsonl(run.file(CHECKPOINTS)):
        if record is None:
            continue  # a line a kill cut short
        if name and not fnmatch.fnmatchcase(str(record.get("checkpoint_name")), name):
            continue
        if hit is not None and record.get("hit_count") != hit:
            continue
        if len(kept) >= MAX_RECORDS:
            return kept, True
        kept.append(  # as debug_checkpoint wrote it
            cast(
                "_Record",
                {
                    k: record.get(k)
                    for k in ("checkpoint_name", "hit_count", "variables", "location")
                },
            )
        )
    return kept, False


def _key(record: _Record) -> tuple[str, int | None]:
    return str(record.get("checkpoint_name")), record.get("hit_count")


def _label(record: _Record) -> str:
    return f"{record.get('checkpoint_name')}#{record.get('hit_count')}"


def _pair(a: _Record, b: _Record) -> R.CheckpointPair:
    vars_a = a.get("variables") or {}
    vars_b = b.get("variables") or {}
    compared = {n: _variable(vars_a[n], vars_b[n]) for n in vars_a if n in vars_b}
    return {
        "checkpoint_name": a.get("checkpoint_name"),
        "hit_count": a.get("hit_count"),
        "location_a": a.get("location"),
        "location_b": b.get("location"),
        "variables": compared,
        "only_a": [n for n in vars_a if n not in vars_b],
        "only_b": [n for n in vars_b if n not in vars_a],
    }


def _variable(a: object, b: object) -> R.VariableComparison:
    if _is_tensor(a) and _is_tensor(b):
        return _tensors(a, b)
    if _is_tensor(a) or _is_tensor(b):
        return {"kind": "mismatch", "note": "a tensor on one side only"}
    value_a, value_b = _plain(a), _plain(b)
    out: R.VariableComparison = {
        "kind": "value",
        "a": value_a,
        "b": value_b,
        "equal": value_a == value_b,
    }
    if _number(value_a) and _number(value_b):
        out["b_minus_a"] = _finite(float(value_b) - float(value_a))
    return out


def _tensors(a: dict[str, object], b: dict[str, object]) -> R.VariableComparison:
    stats_a, stats_b = _mapping(a.get("stats")), _mapping(b.get("stats"))
    out: R.VariableComparison = {
        "kind": "tensor",
        "shape_a": a.get("shape"),
        "shape_b": b.get("shape"),
        "shape_match": a.get("shape") == b.get("shape"),
        "dtype_a": a.get("dtype"),
        "dtype_b": b.get("dtype"),
        "stats_a": stats_a or None,
        "stats_b": stats_b or None,
    }
    deltas: dict[str, float | str] = {}
    relative: list[float] = []
    for key in STATS:
        x, y = stats_a.get(key), stats_b.get(key)
        if not (_number(x) and _number(y)):
            continue
        delta = float(y) - float(x)
        deltas[key] = _finite(delta)
        rel = relative_to(delta, float(y))  # b is the reference: on its scale
        if math.isfinite(delta) and rel is not None:
            relative.append(rel)
    if deltas:
        out["stats_b_minus_a"] = deltas
        out["stats_max_rel"] = max(relative) if relative else 0.0
    if stats_a.get("nan") or stats_b.get("nan"):
        out["nan_a"], out["nan_b"] = stats_a.get("nan", 0), stats_b.get("nan", 0)
    if stats_a.get("inf") or stats_b.get("inf"):
        out["inf_a"], out["inf_b"] = stats_a.get("inf", 0), stats_b.get("inf", 0)
    preview_a, preview_b = _sequence(a.get("preview")), _sequence(b.get("preview"))
    shared = [
        (x, y) for x, y in zip(preview_a, preview_b, strict=False) if _number(x) and _number(y)
    ]
    if shared:
        out["preview_a"], out["preview_b"] = preview_a, preview_b
        out["preview_max_abs"] = _finite(max(abs(float(y) - float(x)) for x, y in shared))
    if a.get("evaluated") is False or b.get("evaluated") is False:
        out["note"] = "a lazy MLX array was recorded unevaluated: no statistics on that side"
    return out


def _is_tensor(value: object) -> TypeGuard[dict[str, object]]:
    return isinstance(value, dict) and "shape" in value and "dtype" in value


def _mapping(value: object) -> dict[str, object]:
    """A record's object (statistics), or {} where it holds none."""
    return value if isinstance(value, dict) else {}


def _sequence(value: object) -> list[object]:
    """A record's list (a preview), or [] where it holds none."""
    return value if isinstance(value, list) else []


def _plain(value: object) -> object:
    return value.get("value", value.get("repr")) if isinstance(value, dict) else value


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)
