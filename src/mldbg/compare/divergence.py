"""Name the first divergence: where the port starts computing something else.

Every module whose output differs is either the culprit or a victim of an earlier
difference.  The culprit is the deepest module whose inputs agree but whose outputs do
not: among such calls, the one that finished first (a parent finishes after its
children, so the first to finish is the deepest).  A call whose inputs were not
compared (not captured, or named differently in the port) counts as having agreeing
inputs only if no compared output diverged before it started; data flows forward, so
nothing earlier can have fed it a wrong value.  Plain tensor directories have no
structure: there the first diverging entry in order is the answer.
"""

from __future__ import annotations

from typing import Any

from ..capture.store import ROOT
from .sources import Source


def first_divergence(source: Source, results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``results`` are the compared entries, in A's order, each with name/module/call/role/ok."""
    failing = [r for r in results if not r["ok"]]
    if not failing:
        return None
    if not source.calls or all(r.get("module") is None for r in results):
        first = failing[0]
        return {
            "name": first["name"],
            "module": None,
            "call": None,
            "reason": "first entry that differs",
            "entries": [first["name"]],
            "max_abs": first.get("max_abs"),
            "nonfinite_mismatched": first.get("nonfinite_mismatched") or 0,
            "inputs_compared": False,
        }
    by_call: dict[tuple[str, int], dict[str, list[dict[str, Any]]]] = {}
    for result in results:
        if result.get("module") is None:
            continue
        roles = by_call.setdefault((result["module"], result["call"]), {"in": [], "out": []})
        roles[result["role"]].append(result)
    diverged_ends = [
        source.calls[key].end_order
        for key, roles in by_call.items()
        if key in source.calls and any(not r["ok"] for r in roles["out"])
    ]
    candidates = []
    for key, roles in by_call.items():
        call = source.calls.get(key)
        bad_out = [r for r in roles["out"] if not r["ok"]]
        if call is None or not bad_out:
            continue
        inputs_compared = bool(roles["in"])
        if inputs_compared:
            if any(not r["ok"] for r in roles["in"]):
                continue  # a victim: its inputs already differ
            reason = "inputs agree, outputs differ"
        else:
            if any(end is not None and end < call.start_order for end in diverged_ends):
                continue  # something it may have read had already gone wrong
            reason = "first output that differs (inputs not compared)"
        finished = call.end_order if call.end_order is not None else 1 << 62
        candidates.append((finished, call, bad_out, reason, inputs_compared))
    if not candidates:
        return _fallback(failing)
    _, call, bad_out, reason, inputs_compared = min(candidates, key=lambda c: (c[0], c[1].seq))
    return {
        "name": f"{call.module}#{call.call}",
        "module": call.module,
        "call": call.call,
        "class": call.class_name,
        "reason": reason,
        "entries": [r["name"] for r in bad_out],
        "max_abs": max(
            (r["max_abs"] for r in bad_out if r.get("max_abs") is not None),
            key=float,  # "inf" (a float64 overflow) is a string in JSON-ready results
            default=None,
        ),
        "nonfinite_mismatched": sum(r.get("nonfinite_mismatched") or 0 for r in bad_out),
        "inputs_compared": inputs_compared,
    }


def _fallback(failing: list[dict[str, Any]]) -> dict[str, Any]:
    first = failing[0]
    if all(r.get("role") == "in" for r in failing):
        reason = "outputs agree, only inputs differ; first input that differs"
    elif first.get("role") == "in" and first.get("module") == ROOT:
        reason = "the two runs were given different inputs"
    else:
        reason = "every differing output has differing inputs; first entry that differs"
    return {
        "name": first["name"],
        "module": first.get("module"),
        "call": first.get("call"),
        "reason": reason,
        "entries": [first["name"]],
        "max_abs": first.get("max_abs"),
        "nonfinite_mismatched": first.get("nonfinite_mismatched") or 0,
        "inputs_compared": True,
    }
