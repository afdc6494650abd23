"""A comparison as an agent should receive it: the verdict first, within a budget.

A full comparison of a 7B model holds thousands of entries; an agent needs the verdict,
the culprit, the entries that fail and the counts.  Passing entries (and input entries)
come only on request, paged, and every cut says what was left out and how to get it.
"""

from __future__ import annotations

import math
from typing import Any

from ... import budget

UNPAIRED_SHOWN = 50
# Lists a real port can make long (one boundary per layer when the port adds residuals
# outside its blocks; a warning per odd file): the first ones, the count, and the CLI's
# ``--json`` / ``html`` for the whole list.
LISTS_SHOWN = {"boundary_differences": 20, "warnings": 20, "notes": 20}
NOTE_ENTRIES_SHOWN = 20  # a note on compounded quantization noise lists every entry it covers


def json_numbers(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with every number JSON cannot carry (NaN, ±Inf) written as the element-wise
    numbers already write it (``"nan"``, ``"inf"``, ``"-inf"``).  A zero reference against a
    non-zero port is an infinite relative error, and the verdict's rules carry such numbers
    into the culprit and its glue; ``--json`` and the daemon send only JSON (an infinite
    one made the daemon answer ``internal``)."""
    return {key: _json_number(value) for key, value in result.items()}


def _json_number(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: _json_number(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_number(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_json_number(item) for item in value)
    return value


def bounded(
    result: dict[str, Any], *, passing: bool, inputs: bool, offset: int, limit: int
) -> dict[str, Any]:
    """``result`` with its entries cut to the ones asked for: the culprit and failures first."""
    entries = result.get("entries", [])
    wanted = [
        e
        for e in entries
        if (passing or not e.get("ok") or e.get("culprit"))
        and (inputs or e.get("role") != "in" or e.get("culprit"))
    ]
    wanted.sort(key=lambda e: (not e.get("culprit"), bool(e.get("ok"))))
    shown = wanted[offset : offset + limit]
    answer = {k: v for k, v in result.items() if k != "entries"}
    answer["entries"] = shown
    answer["total"] = len(entries)
    answer["shown"] = len(shown)
    answer["left_out"] = {
        "passing": 0 if passing else sum(1 for e in entries if e.get("ok")),
        "not_asked": len(entries) - len(wanted),
        "beyond_limit": max(0, len(wanted) - offset - len(shown)),
    }
    answer["truncated"] = len(shown) < len(entries)
    if offset + len(shown) < len(wanted):
        answer["next"] = {
            "verb": "compare",
            "args": {"offset": offset + len(shown), "limit": limit},
        }
    elif not passing and answer["left_out"]["passing"]:
        answer["next"] = {"verb": "compare", "args": {"passing": True, "limit": limit}}
    for side in ("unpaired_a", "unpaired_b"):
        names = result.get(side) or []
        if len(names) > UNPAIRED_SHOWN:
            answer[side] = names[:UNPAIRED_SHOWN]
            answer[f"{side}_count"] = len(names)
            answer["truncated"] = True
    for key, most in LISTS_SHOWN.items():
        items = result.get(key) or []
        if key == "warnings":
            items = [budget.capped(str(w), budget.MESSAGE) for w in items]
        if key == "notes":
            items = [_short_note(note) for note in items]
            if any("entries_count" in note for note in items):
                answer["truncated"] = True
        answer[key] = items[:most]
        if len(items) > most:
            answer[f"{key}_count"] = len(items)
            answer["truncated"] = True
    return answer


def _short_note(note: dict[str, Any]) -> dict[str, Any]:
    entries = note.get("entries") or []
    if len(entries) <= NOTE_ENTRIES_SHOWN:
        return note
    return {**note, "entries": entries[:NOTE_ENTRIES_SHOWN], "entries_count": len(entries)}
