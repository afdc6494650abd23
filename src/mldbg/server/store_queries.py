"""What the run store holds, as the JSON documents every surface shows, within a budget.

``runs``, ``checkpoints``, ``captures`` and ``trace`` answer these (the daemon runs them
for the CLI, REST and MCP alike).  Each takes the store's ``home`` explicitly: which
store a client means (its session's, ``--home``, its own ``./.mldbg``) is decided once,
by the caller.  Every list is newest first, paged (``offset``/``limit``) and says how
many items there are in all, with the call that gets the next page.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, TypeVar, cast

from .. import budget
from .. import results as R
from ..store.runs import (
    CHECKPOINTS,
    EVENTS,
    describe_run,
    is_dir,
    iter_jsonl,
    list_runs,
    resolve_run,
)

CAPTURE_KEYS = (
    "name",
    "run_id",
    "framework",
    "model_class",
    "state",
    "records",
    "tensors",
    "bytes",
)
T = TypeVar("T")
Record = TypeVar("Record", R.CheckpointRecord, R.TraceStep)
RECORD_BYTES = 8_000  # one checkpoint record or trace step, at most


def page(
    items: list[T], offset: int, limit: int, verb: str, args: dict[str, object]
) -> tuple[list[T], budget.PageInfo]:
    """``items[offset:offset+limit]``, and the counts and the call for the next page."""
    shown = items[offset : offset + limit]
    return shown, budget.page_info(len(items), offset, len(shown), verb, args)


def runs(home: Path, offset: int = 0, limit: int = 20) -> R.Runs:
    """Runs under ``home``, newest first."""
    found = list(reversed(list_runs(home)))
    items, paged = page(found, offset, limit, "runs", {"limit": limit})
    return {"home": str(home), "runs": [describe_run(r) for r in items], **paged}


def checkpoints(
    home: Path,
    run: str | None,
    name: str | None = None,
    hit: int | None = None,
    offset: int = 0,
    limit: int = 20,
) -> R.Checkpoints:
    """A run's checkpoint records (``run`` None: the latest), filtered by name glob and hit.

    Lines are parsed one at a time and only the requested page is kept, so a run with
    100k records answers as fast and as small as one with ten.
    """
    found = resolve_run(home, run)
    path = found.file(CHECKPOINTS)
    kept: list[R.CheckpointRecord] = []
    total = bad = 0
    for record in iter_jsonl(path):
        if record is None:
            bad += 1
            continue
        if name and not fnmatch.fnmatchcase(str(record.get("checkpoint_name")), name):
            continue
        if hit is not None and record.get("hit_count") != hit:
            continue
        if offset <= total < offset + limit:
            kept.append(_bounded_record(cast("R.CheckpointRecord", record)))
        total += 1
    args = {"run": found.run_id, "name": name, "hit": hit, "limit": limit}
    return {
        "run_id": found.run_id,
        "path": str(path),
        "checkpoints": kept,
        "unreadable_lines": bad,
        **budget.page_info(total, offset, len(kept), "checkpoints", args),
    }


def captures(home: Path, run: str | None = None, limit: int = 50) -> R.Captures:
    """The module captures of every run (or of ``run``), newest first."""
    from ..compare.read.sources import find_captures, find_captures_in

    if run:
        found = find_captures_in(resolve_run(home, run).path)
    else:  # a home that cannot be a directory (too long a name) holds no captures
        found = find_captures(home) if is_dir(home) else []
    items = [
        cast("R.CaptureRecord", {k: c.get(k) for k in CAPTURE_KEYS} | {"path": c["path"]})
        for c in reversed(found)  # capture.json's fields, as the capture wrote them
    ]
    shown, paged = page(items, 0, limit, "captures", {"run": run, "limit": len(items)})
    return {"home": str(home), "captures": shown, **paged}


def trace(home: Path, run: str | None, last: int = 10) -> R.Trace:
    """The last ``last`` stops recorded in a run's events.jsonl: where, the stack, the variables."""
    found = resolve_run(home, run)
    path = found.file(EVENTS)
    steps: list[R.TraceStep] = []
    total = 0
    for record in iter_jsonl(path):
        if record is None or record.get("event") != "stopped":
            continue
        total += 1
        steps.append(_step(record))
        if len(steps) > last:
            del steps[0]
    result: R.Trace = {
        "run_id": found.run_id,
        "path": str(path),
        "steps": steps,
        "total": total,
        "shown": len(steps),
        "truncated": len(steps) < total,
    }
    if result["truncated"]:
        result["next"] = {"verb": "trace", "args": {"run": found.run_id, "last": min(total, 1000)}}
    return result


def _step(record: dict[str, Any]) -> R.TraceStep:
    """A stop as events.jsonl recorded it (``Session``'s "stopped" event)."""
    step: R.TraceStep = {
        "time": record.get("time"),
        "event": record.get("event"),
        "reason": record.get("reason"),
        "location": {
            "file": record.get("file"),
            "line": record.get("line"),
            "function": record.get("function"),
            "code": record.get("code"),
        },
        "stack": record.get("stack") or [],
        "variables": record.get("variables") or [],
    }
    if record.get("exception"):
        step["exception"] = record["exception"]
    if record.get("breakpoint"):
        step["breakpoint"] = record["breakpoint"]
    if record.get("checkpoint"):
        step["checkpoint"] = record["checkpoint"]
    if record.get("condition_error"):
        step["condition_error"] = record["condition_error"]
    return _bounded_record(step)


def _bounded_record(record: Record) -> Record:
    return budget.shrink(record, RECORD_BYTES)
