"""What the two captures lost, and which entries of the other side that leaves unchecked.

Missing data is never agreement.  A capture loses tensors it recorded: a full disk (the
index line says ``write_error``, ``capture.json`` says ``incomplete``), the byte budget
or the per-call limit (the line lists them under ``skipped``, with why), a run killed
inside the model (``capture.json`` still says ``capturing``: calls that never returned,
and the rest never started), a forward that raised (its return line holds the error), an
index line the disk refused (counted in ``write_errors``: what it held is unknown).
Pairing leaves the other side's counterparts of all of these unpaired, and an unpaired
entry used to change nothing: the port's capture that stopped before the model's output
compared as "match".

:func:`missing_data` names each entry of either side that had a counterpart and lost it
(in A's names), and the last point that agreed before the first of them; the verdict
then cannot be "match" (``rules.py``: no culprit while entries are unchecked is no
verdict, exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..read.sources import Source
from ..records import EntryResult, Missing, MissingSide
from .align import Alignment
from .mapping import NameMap, split_name

LISTED = 20  # unchecked entry names listed (all are counted)
_INDEX_LOST = "index.jsonl"  # a write error naming the index: a line lost, unknown what


@dataclass
class _Lost:
    """One side's losses in A's names: entries and calls, each with why."""

    entries: dict[str, str] = field(default_factory=dict)
    calls: dict[tuple[str, int, str], str] = field(default_factory=dict)
    unfinished: dict[tuple[str, int], str] = field(default_factory=dict)
    cut_short: bool = False  # killed inside the model: what came after never started


def missing_data(
    a: Source, b: Source, alignment: Alignment, names: NameMap, results: list[EntryResult]
) -> Missing | None:
    """The entries no comparison could check because a capture lost them, or None."""
    lost_a, lost_b = _lost(a, NameMap()), _lost(b, names)
    unchecked: dict[str, str] = {}
    last_paired = max((p.a.order for p in alignment.pairs), default=-1)
    order = {e.name: e.order for e in a.entries}
    for name in alignment.unpaired_a:  # A has it; did B lose it?
        why = _why(name, lost_b, "B")
        if why is None and lost_b.cut_short and order.get(name, -1) > last_paired:
            why = "B's capture ended before it (its run never finished)"
        if why is not None:
            unchecked[name] = why
    for name in alignment.unpaired_b:  # B has it (in A's names); did A lose it?
        why = _why(name, lost_a, "A")
        if why is not None:
            unchecked.setdefault(name, why)
    for name, why in lost_a.entries.items():  # lost on both sides: neither can be checked
        if name in lost_b.entries:
            unchecked.setdefault(name, f"lost by both captures ({why})")
    sides = {"a": _side(a, lost_a), "b": _side(b, lost_b)}
    unknown = any(side is not None and side.get("index_lines_lost") for side in sides.values())
    if not unchecked and not unknown:
        return None
    first_at = min((order.get(n, last_paired + 1) for n in unchecked), default=None)
    listed = sorted(unchecked, key=lambda n: order.get(n, 1 << 62))
    return {
        "a": sides["a"],
        "b": sides["b"],
        "unchecked": len(unchecked),
        "entries": [{"name": n, "why": unchecked[n]} for n in listed[:LISTED]],
        "last_agreeing": _last_agreeing(results, order, first_at),
        "note": _note(len(unchecked), listed, unchecked, unknown),
    }


def _lost(source: Source, names: NameMap) -> _Lost:
    """``source``'s losses, its names turned into A's by ``names``."""
    found = _Lost()
    for name, why in source.lost.items():
        found.entries[names.to_a(name)] = why
    for (module, index, role), why in source.lost_calls.items():
        key = _in_a(names, module, index)
        found.calls[(key[0], key[1], role)] = why
    by_seq = {c.seq: c for c in source.calls.values()}
    for call in source.calls.values():
        if call.end_order is None or call.error:
            key = _in_a(names, call.module, call.call)
            found.unfinished[key] = (
                f"raised {call.error}" if call.error else "never returned (the run ended inside it)"
            )
    found.cut_short = source.kind == "capture" and (
        source.meta.get("state") == "capturing"
        or any(c.end_order is None and c.parent not in by_seq for c in source.calls.values())
    )
    return found


def _in_a(names: NameMap, module: str, call: int) -> tuple[str, int]:
    mapped = split_name(names.to_a(f"{module}#{call}.out"))
    return (mapped[0], mapped[1]) if mapped else (module, call)


def _why(name: str, lost: _Lost, side: str) -> str | None:
    """Why the side ``lost`` belongs to has no tensor for ``name``, or None."""
    if name in lost.entries:
        return f"{side} did not write it: {lost.entries[name]}"
    parts = split_name(name)
    if parts is None:
        return None
    module, call, key = parts
    role = key.split(".", 1)[0]
    if (module, call, role) in lost.calls:
        return f"{side} could not write its {role}puts: {lost.calls[(module, call, role)]}"
    if role == "out" and (module, call) in lost.unfinished:
        return f"{side}'s call {module}#{call} {lost.unfinished[(module, call)]}"
    return None


def _side(source: Source, lost: _Lost) -> MissingSide | None:
    """What one capture says of its own losses (None: it lost nothing)."""
    write_errors = source.meta.get("write_errors") or []
    index_lines = sum(1 for e in write_errors if _INDEX_LOST in str(e))
    if not (lost.entries or lost.calls or lost.unfinished or lost.cut_short or index_lines):
        return None
    first = next(iter(source.lost.items()), None)
    return {
        "label": source.label,
        "state": str(source.meta.get("state") or ""),
        "not_written": len(lost.entries),
        "first_not_written": None if first is None else f"{first[0]}: {first[1]}",
        "calls_not_written": len(lost.calls),
        "unfinished": [f"{m}#{c}: {why}" for (m, c), why in list(lost.unfinished.items())[:5]],
        "index_lines_lost": index_lines,
    }


def _last_agreeing(
    results: list[EntryResult], order: dict[str, int], first_at: int | None
) -> str | None:
    """The last output, in A's order, that was compared and agrees before the first
    unchecked entry."""
    found = None
    for result in results:
        at = order.get(result["name"], -1)
        if first_at is not None and at >= first_at:
            break
        if result.get("role") == "out" and result.get("ok"):
            found = result["name"]
    return found


def _note(count: int, listed: list[str], unchecked: dict[str, str], unknown: bool) -> str:
    if not count:
        return (
            "a capture could not write some of its index lines: what they recorded is "
            "unknown, so agreement cannot be claimed"
        )
    first = listed[0]
    text = f"{count} entr{'y' if count == 1 else 'ies'} could not be checked, first {first} ({unchecked[first]})"
    if unknown:
        text += "; and a capture lost index lines: what they recorded is unknown"
    return text
