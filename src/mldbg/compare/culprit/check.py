"""The verdict held to the entries it shows: what a reason claims must be true of them.

A verdict reads "inputs agree, outputs differ", "every differing output has differing
inputs", "overflow: ..."; each is a claim about entries the same answer lists.  One that
the entries contradict sends a user to the wrong place (an fp16 overflow at ``down_proj``
was reported as "every differing output has differing inputs" while its inputs agreed).
:func:`contradictions` reads a finished comparison and lists every claim its entries do
not bear out.  The test suite runs it on every comparison it makes (``MLDBG_CHECK_VERDICTS``
set: ``comparison.compare_sources`` then raises on a contradicting verdict), so a rule that
starts saying something untrue fails the tests that reach it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import cast

from ...dtypes import is_exact
from ..judge.bounds import GROWTH, rel
from ..records import Culprit, EntryResult

ENV = "MLDBG_CHECK_VERDICTS"

Entries = list[EntryResult]


def check_enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def refuse_contradictions(result: Mapping[str, object]) -> None:
    """Raise ``AssertionError`` listing what ``result`` claims untruly: a rule's bug,
    which only the tests ask to stop at."""
    found = contradictions(result)
    if found:
        culprit = cast("Culprit | None", result.get("first_divergence")) or {}
        raise AssertionError(
            f"verdict {result.get('decided_by')!r} on {culprit.get('name')!r} "
            f"({culprit.get('reason')!r}): " + "; ".join(found)
        )


def contradictions(result: Mapping[str, object]) -> list[str]:
    """Every claim of ``result``'s verdict that its entries contradict (empty: none)."""
    entries = cast("Entries", result.get("entries") or [])
    culprit = cast("Culprit | None", result.get("first_divergence"))
    found: list[str] = []
    if result.get("ok") and culprit is not None:
        found.append("ok, yet a culprit is named")
    if result.get("decided_by") == "agreement" and any(not e.get("ok") for e in entries):
        found.append("decided by agreement, yet an entry fails")
    if culprit is None:
        return found
    by_name = {e.get("name"): e for e in entries}
    named = [by_name[n] for n in culprit.get("entries") or [] if n in by_name]
    if not culprit.get("passes_elementwise"):
        found += [f"{e['name']} is named but passes" for e in named if e.get("ok")]
    reason = str(culprit.get("reason") or "")
    for claim, test in _CLAIMS:
        if claim in reason:
            found += test(culprit, entries)
    if "overflow" in reason and not _overflowed(named):
        found.append("says overflow, yet no entry holds a reference value beyond its range")
    return found


def _of_call(culprit: Culprit | EntryResult, entries: Entries, role: str) -> Entries:
    key = (culprit.get("module"), culprit.get("call"))
    return [e for e in entries if (e.get("module"), e.get("call")) == key and e.get("role") == role]


def _fails(entry: EntryResult) -> bool:
    return not entry.get("ok") or entry.get("scale_ok") is False


def _inputs_agree(culprit: Culprit, entries: Entries) -> list[str]:
    inputs = _of_call(culprit, entries, "in")
    if not inputs:
        return ["says its inputs agree, yet none was compared"]
    return [f"says its inputs agree, yet {e['name']} differs" for e in inputs if _fails(e)]


def _outputs_differ(culprit: Culprit, entries: Entries) -> list[str]:
    outputs = _of_call(culprit, entries, "out")
    if outputs and not any(_fails(e) for e in outputs):
        return ["says its outputs differ, yet all of them agree"]
    return []


def _error_grows(culprit: Culprit, entries: Entries) -> list[str]:
    inputs, outputs = _of_call(culprit, entries, "in"), _of_call(culprit, entries, "out")
    worst_in = max((_error(e) for e in inputs), default=0.0)
    worst_out = max((_error(e) for e in outputs if _fails(e)), default=0.0)
    if worst_out <= GROWTH * worst_in:
        return [
            f"says its error grows, yet {worst_out:.3g} out is within {GROWTH}x {worst_in:.3g} in"
        ]
    return []


def _not_compared(culprit: Culprit, entries: Entries) -> list[str]:
    if _of_call(culprit, entries, "in"):
        return ["says its inputs were not compared, yet some were"]
    return []


def _every_output_has_differing_inputs(culprit: Culprit, entries: Entries) -> list[str]:
    found = []
    for entry in entries:
        if entry.get("role") != "out" or not _fails(entry) or entry.get("note"):
            continue
        inputs = _of_call(entry, entries, "in")
        if not any(_fails(e) for e in inputs):
            found.append(
                f"says every differing output has differing inputs, yet {entry['name']}'s do not"
            )
    return found


def _only_inputs(culprit: Culprit, entries: Entries) -> list[str]:
    failing = [e for e in entries if e.get("role") == "out" and not e.get("ok")]
    return [f"says only inputs differ, yet {e['name']} differs" for e in failing[:3]]


def _differing_inputs_named(culprit: Culprit, entries: Entries) -> list[str]:
    inputs = _of_call(culprit, entries, "in")
    if not any(_fails(e) for e in inputs):
        return ["says the inputs differ, yet none of the call's inputs does"]
    return []


def _everything_before_agrees(culprit: Culprit, entries: Entries) -> list[str]:
    first = next(
        (i for i, e in enumerate(entries) if e.get("name") in (culprit.get("entries") or [])),
        None,
    )
    if first is None:
        return []
    return [
        f"says everything before agrees, yet {e['name']} differs"
        for e in entries[:first]
        if e.get("role") == "out" and not e.get("ok")
    ][:3]


def _error(entry: EntryResult) -> float:
    """How wrong an entry is, as the growth rule reads it (``divergence.worst_rel``)."""
    if entry.get("error"):
        return 0.0
    exact = is_exact(entry.get("dtype_a") or "") and is_exact(entry.get("dtype_b") or "")
    if entry.get("nonfinite_mismatched") or (exact and not entry.get("ok")):
        return float("inf")
    return rel(entry.get("rel_rms"))


def _overflowed(named: Entries) -> bool:
    for entry in named:
        found = entry.get("out_of_range")
        value = None if found is None else found.get("reference")
        if (
            found is not None
            and found["kind"] == "overflow"
            and isinstance(value, int | float)
            and abs(value) > found["limit"]
        ):
            return True
    return False


Claim = Callable[[Culprit, Entries], list[str]]

# What each phrase of a reason claims (``rules.py``, ``divergence.py``), and its test.
_CLAIMS: tuple[tuple[str, Claim], ...] = (
    ("inputs agree, outputs differ", _inputs_agree),
    ("inputs agree, outputs differ", _outputs_differ),
    ("inputs agree, but what it computes inline", _inputs_agree),
    ("output error grows beyond what its inputs explain", _error_grows),
    ("(inputs not compared)", _not_compared),
    ("every differing output has differing inputs", _every_output_has_differing_inputs),
    ("outputs agree, only inputs differ", _only_inputs),
    ("differ while everything before agrees", _differing_inputs_named),
    ("differ while everything before agrees", _everything_before_agrees),
    ("is the first call and its inputs differ", _differing_inputs_named),
    ("this model's first call, differ", _differing_inputs_named),
    ("differ while the models before it agree", _differing_inputs_named),
)
