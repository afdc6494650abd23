"""A comparison as an agent should receive it: the verdict first, within a budget.

A full comparison of a 7B model holds thousands of entries; an agent needs the verdict,
the culprit, the entries that fail and the counts.  Passing entries (and input entries)
come only on request, paged, and every cut says what was left out and how to get it.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from typing import Any

from ... import budget

UNPAIRED_SHOWN = 50
# Lists a real port can make long (one boundary per layer when the port adds residuals
# outside its blocks; a warning per odd file): the first ones, the count, and the CLI's
# ``--json`` / ``html`` for the whole list.
LISTS_SHOWN = {"boundary_differences": 20, "warnings": 20, "notes": 20}
NOTE_ENTRIES_SHOWN = 20  # a note on compounded quantization noise lists every entry it covers


# Keys of the first page only: later pages say which page they are and hold their rows.
HEADER_ONLY = (
    "a",
    "b",
    "rtol",
    "atol",
    "test",
    "layout",
    "boundary_differences",
    "notes",
    "warnings",
    "unpaired_a",
    "unpaired_b",
    "proposed_map",
    "replay",
    "better",
    "replay_culprit",
    "weights_hint",
    "narrow",
    "other_models",
    "ops",
    "calls_aligned",
    "html",
    "first_divergence",
    "decided_by",
    "undecided",
    "pipeline",
    "missing",
    "structure",
    "unpaired_parameter_free",
    "line",
)


class Selection:
    """Which entries a page of the comparison shows: by default the culprit and the
    failing outputs; ``passing``/``inputs`` add the others; ``module`` (a glob of module
    paths or entry names), ``call``, ``status`` and ``kind`` narrow to what they match.
    A ``module`` or ``call`` filter shows every entry it matches, passing ones and inputs
    included (one asks for a module to see how it fared), unless ``status``/``kind`` say
    otherwise."""

    def __init__(
        self,
        *,
        passing: bool = False,
        inputs: bool = False,
        module: str | None = None,
        call: int | None = None,
        status: str | None = None,
        kind: str | None = None,
    ) -> None:
        self.passing, self.inputs = passing, inputs
        self.module, self.call, self.status, self.kind = module, call, status, kind

    @property
    def filtered(self) -> bool:
        return any(v is not None for v in (self.module, self.call, self.status, self.kind))

    def args(self) -> dict[str, object]:
        """The arguments that make this selection again (for a ``next`` call)."""
        found = {
            "passing": self.passing or None,
            "inputs": self.inputs or None,
            "module": self.module,
            "call": self.call,
            "status": self.status,
            "kind": self.kind,
        }
        return {k: v for k, v in found.items() if v is not None}

    def wants(self, entry: Mapping[str, object]) -> bool:
        if self.module is not None and not _matches_module(entry, self.module):
            return False
        if self.call is not None and entry.get("call") != self.call:
            return False
        if self.kind is not None and entry.get("role") != self.kind:
            return False
        if self.status is not None:
            return self.status in statuses(entry)
        culprit = bool(entry.get("culprit"))
        narrowed = self.module is not None or self.call is not None
        if not (self.passing or narrowed or culprit) and entry.get("ok"):
            return False
        return (
            self.kind is not None or self.inputs or narrowed or culprit or entry.get("role") != "in"
        )


def statuses(entry: Mapping[str, object]) -> set[str]:
    """What ``status=`` finds an entry by (several may hold: a culprit also fails)."""
    found = {"passing" if entry.get("ok") else "failing"}
    if entry.get("culprit"):
        found.add("culprit")
    if entry.get("error"):
        found.add("error")
    if entry.get("note"):
        found.add("noted")
    if entry.get("compensated_by"):
        found.add("compensated")
    return found


def _matches_module(entry: Mapping[str, object], pattern: str) -> bool:
    names = [str(entry.get("name") or ""), str(entry.get("module") or "")]
    if entry.get("module") is not None and entry.get("call") is not None:
        names.append(f"{entry['module']}#{entry['call']}")
    return any(fnmatch.fnmatchcase(name, pattern) for name in names)


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
    result: dict[str, Any],
    *,
    passing: bool = False,
    inputs: bool = False,
    offset: int = 0,
    limit: int = 20,
    module: str | None = None,
    call: int | None = None,
    status: str | None = None,
    kind: str | None = None,
) -> dict[str, Any]:
    """One page of ``result``: the entries asked for (the culprit and failures first when
    no filter is given, else in execution order), each with its ``row`` (its place in the
    whole comparison, the same on every page), ``next`` whenever anything was left out,
    and the header, verdict and hints on the first page only."""
    selection = Selection(
        passing=passing, inputs=inputs, module=module, call=call, status=status, kind=kind
    )
    entries = result.get("entries", [])
    wanted = [{**e, "row": row} for row, e in enumerate(entries) if selection.wants(e)]
    if not selection.filtered:
        wanted.sort(key=lambda e: (not e.get("culprit"), bool(e.get("ok"))))
    shown = wanted[offset : offset + limit]
    answer = {k: v for k, v in result.items() if k != "entries"}
    if offset > 0:  # a later page: said once, on the first
        for key in HEADER_ONLY:
            answer.pop(key, None)
        answer["page"] = {"offset": offset, "limit": limit, "matching": len(wanted)}
    answer["entries"] = shown
    answer["total"] = len(entries)
    answer["matching"] = len(wanted)
    answer["shown"] = len(shown)
    if selection.filtered:
        answer["filter"] = {
            k: v for k, v in selection.args().items() if k not in ("passing", "inputs")
        }
    answer["left_out"] = {
        "passing": 0 if passing or selection.filtered else sum(1 for e in entries if e.get("ok")),
        "not_asked": len(entries) - len(wanted),
        "beyond_limit": max(0, len(wanted) - offset - len(shown)),
    }
    answer["truncated"] = len(shown) < len(entries)
    sources = _sources(result)  # the next call is whole: the same two sources
    if offset + len(shown) < len(wanted):
        answer["next"] = {
            "verb": "compare",
            "args": {**sources, **selection.args(), "offset": offset + len(shown), "limit": limit},
        }
    elif not passing and not selection.filtered and answer["left_out"]["passing"]:
        answer["next"] = {"verb": "compare", "args": {**sources, "passing": True, "limit": limit}}
    if offset == 0:
        _bound_lists(result, answer)
    return answer


def _sources(result: Mapping[str, object]) -> dict[str, object]:
    """``a`` and ``b`` as the comparison was asked for them (their ``spec``)."""
    found = {}
    for side in ("a", "b"):
        described = result.get(side)
        if isinstance(described, Mapping) and described.get("spec") is not None:
            found[side] = described["spec"]
    return found


def _bound_lists(result: dict[str, Any], answer: dict[str, Any]) -> None:
    """The first page's lists a real port can make long, cut to their first items."""
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


def _short_note(note: dict[str, Any]) -> dict[str, Any]:
    entries = note.get("entries") or []
    if len(entries) <= NOTE_ENTRIES_SHOWN:
        return note
    return {**note, "entries": entries[:NOTE_ENTRIES_SHOWN], "entries_count": len(entries)}
