"""A capture as a per-module table: how long each call took, in which dtypes it worked.

Two questions a port raises that a value comparison does not answer: where does the
reference upcast to float32 while the port stays in bfloat16 (or the other way round),
and which module is slow on which side.  ``module_table(a)`` lists one capture's calls;
``module_table(a, b)`` sets a second capture's same calls (same module path and call
index) beside them, flags the dtype differences and gives the time ratio.

Times come from the capture (``seconds`` on each call's index line): the call's own work,
its children included, the capture's writing excluded, with MLX outputs evaluated and
CUDA/MPS kernels waited for before the clock stops.  Captured with ``inputs=False``, an
MLX call's time can include evaluating a lazy input handed to it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from typing_extensions import TypedDict

from ... import budget
from ...errors import BAD_ARGUMENT
from ...store.runs import iter_jsonl

if TYPE_CHECKING:
    from ..read.sources import Source

SORTS = ("order", "time", "self", "ratio")
ROW_BYTES = 2_000


def module_table(
    a: str | Path,
    b: str | Path | None = None,
    *,
    home: str | Path | None = None,
    sort: str = "order",
    offset: int = 0,
    limit: int = 50,
) -> dict[str, Any]:
    """``{"a", "b", "rows": [...], "summary", "total", "shown", "truncated", "next"}``."""
    from ...store.runs import mldbg_home
    from ..read.sources import CompareInputError, open_source

    if sort not in SORTS:
        raise CompareInputError(f"sort {sort!r}: use one of {', '.join(SORTS)}", code=BAD_ARGUMENT)
    store = Path(home).expanduser().resolve() if home is not None else mldbg_home()
    side_a = _calls(open_source(str(a), store))
    side_b = _calls(open_source(str(b), store)) if b is not None else None
    rows = []
    for key, call in side_a["calls"].items():
        row: dict[str, Any] = {
            "module": call["module"],
            "call": call["call"],
            "class": call["class"],
            "depth": call["depth"],
            "a": _side(call),
        }
        other = side_b["calls"].get(key) if side_b is not None else None
        if side_b is not None:
            row["b"] = _side(other) if other is not None else None
            if other is not None:
                row["dtype_differs"] = (
                    call["in_dtypes"] != other["in_dtypes"]
                    or call["out_dtypes"] != other["out_dtypes"]
                )
                row["time_ratio"] = _ratio(other["self_seconds"], call["self_seconds"])
        rows.append(row)
    summary = _summary(side_a, side_b, rows)  # in execution order, before any sort
    if sort == "time":
        rows.sort(key=lambda r: -(r["a"]["seconds"] or 0.0))
    elif sort == "self":
        rows.sort(key=lambda r: -(r["a"]["self_seconds"] or 0.0))
    elif sort == "ratio":
        rows.sort(key=lambda r: -(r.get("time_ratio") or 0.0))
    page = [budget.shrink(r, ROW_BYTES) for r in rows[offset : offset + limit]]
    args = {"a": str(a), "b": None if b is None else str(b), "sort": sort, "limit": limit}
    result: dict[str, Any] = {
        "a": side_a["source"],
        "b": side_b["source"] if side_b is not None else None,
        "rows": page,
        "summary": summary,
        **budget.page_info(len(rows), offset, len(page), "module-table", args),
    }
    return result


# One call of one side ("class" is a keyword: the functional spelling).
_CallTimes = TypedDict(
    "_CallTimes",
    {
        "module": str,
        "call": int,
        "class": str,
        "depth": int,
        "seq": int,
        "parent": "int | None",
        "seconds": "float | None",
        "self_seconds": "float | None",
        "in_dtypes": "list[str]",
        "out_dtypes": "list[str]",
        "error": "str | None",
    },
    total=False,
)


def _calls(source: Source) -> dict[str, Any]:
    """Each call of a capture: its dtypes (from the entries) and times (from the index)."""
    seconds = _seconds(source.path / "index.jsonl") if source.kind == "capture" else {}
    calls: dict[tuple[str, int], _CallTimes] = {}
    by_seq: dict[int, _CallTimes] = {}
    for key, call in sorted(source.calls.items(), key=lambda kv: kv[1].start_order):
        item: _CallTimes = {
            "module": call.module,
            "call": call.call,
            "class": call.class_name,
            "depth": call.depth,
            "seq": call.seq,
            "parent": call.parent,
            "seconds": seconds.get(call.seq),
            "in_dtypes": [],
            "out_dtypes": [],
            "error": call.error,
        }
        calls[key] = item
        by_seq[call.seq] = item
    for entry in source.entries:
        owner = calls.get(entry.call_key) if entry.call_key is not None else None
        if owner is None:
            continue
        listed = owner["in_dtypes" if entry.role == "in" else "out_dtypes"]
        if entry.dtype not in listed:
            listed.append(entry.dtype)
    children: dict[int, float] = {}
    for item in calls.values():
        parent = item["parent"]
        if parent in by_seq and item["seconds"] is not None:
            children[parent] = children.get(parent, 0.0) + item["seconds"]
    for item in calls.values():
        total = item["seconds"]
        item["self_seconds"] = (
            None if total is None else max(0.0, total - children.get(item["seq"], 0.0))
        )
    return {"source": source.describe(), "calls": calls}


def _seconds(index: Path) -> dict[int, float]:
    found: dict[int, float] = {}
    try:
        for record in iter_jsonl(index):  # bounded lines; a FIFO is refused, not waited on
            seq, seconds = (record or {}).get("seq"), (record or {}).get("seconds")
            if isinstance(seq, int) and isinstance(seconds, int | float) and math.isfinite(seconds):
                found[seq] = float(seconds)
    except OSError:
        return found
    return found


def _side(call: _CallTimes) -> dict[str, object]:
    side: dict[str, object] = {
        "seconds": call["seconds"],
        "self_seconds": call["self_seconds"],
        "in_dtypes": call["in_dtypes"],
        "out_dtypes": call["out_dtypes"],
    }
    if call.get("error"):
        side["error"] = call["error"]
    return side


def _ratio(b: float | None, a: float | None) -> float | None:
    if a is None or b is None or a <= 0:
        return None
    return b / a


def _summary(
    side_a: dict[str, Any], side_b: dict[str, Any] | None, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    def total(side: dict[str, Any]) -> float | None:
        roots = [c["seconds"] for c in side["calls"].values() if c["depth"] == 0 and c["seconds"]]
        return sum(roots) if roots else None

    def slowest(side: dict[str, Any]) -> list[dict[str, Any]]:
        timed = [c for c in side["calls"].values() if c["self_seconds"] is not None]
        timed.sort(key=lambda c: -c["self_seconds"])
        return [
            {"module": c["module"], "call": c["call"], "self_seconds": c["self_seconds"]}
            for c in timed[:5]
        ]

    summary: dict[str, Any] = {
        "calls_a": len(side_a["calls"]),
        "seconds_a": total(side_a),
        "slowest_a": slowest(side_a),
    }
    if side_b is not None:
        paired = [r for r in rows if r.get("b")]
        differs = [r for r in paired if r.get("dtype_differs")]
        summary.update(
            calls_b=len(side_b["calls"]),
            paired=len(paired),
            seconds_b=total(side_b),
            slowest_b=slowest(side_b),
            dtype_differences=len(differs),
            first_dtype_difference=(
                {
                    "module": differs[0]["module"],
                    "call": differs[0]["call"],
                    "a": {k: differs[0]["a"][k] for k in ("in_dtypes", "out_dtypes")},
                    "b": {k: differs[0]["b"][k] for k in ("in_dtypes", "out_dtypes")},
                }
                if differs
                else None
            ),
        )
    return summary
