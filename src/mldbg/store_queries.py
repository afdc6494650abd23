"""What the run store holds, as the JSON documents its clients show.

``mldbg runs | checkpoints | captures`` print these and the MCP tools return them, so
the two never disagree.  They read files only: no daemon is needed.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from .runs import CHECKPOINTS, describe_run, list_runs, mldbg_home, read_jsonl, resolve_run

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


def runs() -> dict[str, Any]:
    """Every run under ``MLDBG_HOME``, newest first."""
    home = mldbg_home()
    return {"home": str(home), "runs": [describe_run(r) for r in list_runs(home)]}


def checkpoints(run: str | None, name: str | None = None, hit: int | None = None) -> dict[str, Any]:
    """A run's checkpoint records (``run`` None: the latest), filtered by name glob and hit."""
    found = resolve_run(mldbg_home(), run)
    records, unreadable = read_jsonl(found.file(CHECKPOINTS))
    if name:
        records = [r for r in records if fnmatch.fnmatchcase(str(r.get("checkpoint_name")), name)]
    if hit is not None:
        records = [r for r in records if r.get("hit_count") == hit]
    return {
        "run_id": found.run_id,
        "path": str(found.file(CHECKPOINTS)),
        "checkpoints": records,
        "unreadable_lines": unreadable,
    }


def captures(run: str | None = None) -> dict[str, Any]:
    """The module captures of every run (or of ``run``), as ``mldbg compare`` finds them."""
    from .compare.sources import find_captures, find_captures_in

    home = mldbg_home()
    found = find_captures_in(resolve_run(home, run).path) if run else find_captures(home)
    items = [{k: c.get(k) for k in CAPTURE_KEYS} | {"path": c["path"]} for c in found]
    return {"home": str(home), "captures": items}
