"""The line step's answer, as the ``line`` verb gives it: the verdict first, the port's
values around it paged, every list bounded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .plan import Plan
from .read import LineRun
from .verdict import LineVerdict

if TYPE_CHECKING:
    from ...results import LineScope, LineStep

BEFORE = 5  # values shown before the first wrong one, when no offset is given
NOTES_SHOWN = 10


def answer(
    plan: Plan,
    verdict: LineVerdict,
    runs: tuple[LineRun, LineRun],
    *,
    offset: int | None,
    limit: int,
) -> tuple[LineStep, int | None]:
    """The ``line`` verb's result for a finished step, and the offset of the port's next
    values when some are left after the ones shown (None: none)."""
    reference, port = runs
    start = offset
    if start is None:
        start = max(0, (verdict.first_index or 0) - BEFORE) if verdict.first_wrong else 0
    shown = verdict.pairs[start : start + limit]
    scope: LineScope = {
        "kind": plan.kind,
        "model": plan.b.model,
        "module_a": plan.a.module_path,
        "module_b": plan.b.module_path,
        "call": plan.call,
        "sites_a": plan.a.sites,
        "sites_b": plan.b.sites,
        "input": plan.inputs[1],
    }
    result: LineStep = {
        "state": "done",
        "phase": "done",
        "culprit": plan.culprit,
        "scope": scope,
        "bound": plan.bound,
        "first_wrong": verdict.first_wrong,
        "last_agreeing": verdict.last_agreeing,
        "fused": verdict.fused,
        "skipped": verdict.skipped,
        "reason": verdict.reason,
        "notes": verdict.notes[:NOTES_SHOWN],
        "lines": shown,
        "runs": {"a": reference.path.parent.name, "b": port.path.parent.name},
        "records": {"a": len(reference.records), "b": len(port.records)},
        "total": len(verdict.pairs),
        "shown": len(shown),
        "truncated": len(shown) < len(verdict.pairs),
    }
    more = start + len(shown) < len(verdict.pairs)
    return result, (start + len(shown) if more else None)
