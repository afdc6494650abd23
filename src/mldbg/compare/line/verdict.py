"""The first wrong line: where the port's difference starts, followed through the code.

Every value the port's scope computed is paired with the reference's closest
(``align.py``).  A value without a counterpart within the bound is not yet a bug: a
port may compute steps the reference keeps inside one fused call (its attention
scores, when the reference calls SDPA), whose result then agrees again.  So the
difference is followed through the code, from what each line read
(``line_statements.py``): a value is *on the wrong path* when it has no counterpart
and it reaches the scope's output (the module's return value; for glue, the differing
input of the model call) through values that have none either.  The first such value
that has a same-sized counterpart in the reference, too far from it, is the first
wrong line; values before it on that path with nothing of their size in the reference
fall inside a fused reference call, and are said as such.  The last port value on its
path that still agreed is said too.  A scope whose output agrees names no line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .align import NEAREST, Aligner, Match, Near, align
from .read import LineRecord, LineRun

if TYPE_CHECKING:
    from ...results import FusedCall, LineCounterpart, LinePair, LineValue

INSIDE_SHOWN = 10  # port lines listed inside a fused reference call
SKIPPED_SHOWN = 5  # reference lines listed that the port has no counterpart of


@dataclass
class LineVerdict:
    """What the step found; ``pairs`` lists the port's values, in order."""

    first_wrong: LinePair | None
    last_agreeing: LinePair | None
    fused: FusedCall | None
    skipped: list[LineValue]
    reason: str
    notes: list[str]
    pairs: list[LinePair]
    first_index: int | None  # the first wrong value's place in ``pairs``


class _Path:
    """The port's values as a graph: who read whom, which agree, which reach the output.

    ``judged`` holds the scope's outputs, judged against the reference's own outputs
    (not against any reference value: a port that hands its model the latents before
    the scaling the reference does hands it a value the reference *has*, just not
    there)."""

    def __init__(
        self, port: LineRun, matches: dict[int, Match], targets: set[int], judged: dict[int, Match]
    ) -> None:
        self.port = port
        self.matches = matches
        self.judged = judged
        self.consumers: dict[int, list[int]] = {}
        for record in port.records:
            for seq in record.reads:
                self.consumers.setdefault(seq, []).append(record.seq)
        self.wrong: set[int] = set()
        for record in reversed(port.records):
            if self.ok(record) is True:
                continue
            if record.seq in targets or any(
                c in self.wrong for c in self.consumers.get(record.seq, ())
            ):
                self.wrong.add(record.seq)

    def match(self, record: LineRecord) -> Match | None:
        judged = self.judged.get(record.seq)
        if judged is not None:
            return judged
        return self.matches.get(self.port.original(record).seq)

    def ok(self, record: LineRecord) -> bool | None:
        match = self.match(record)
        return None if match is None else match.ok

    def ancestors(self, record: LineRecord) -> list[LineRecord]:
        """Every value ``record`` was computed from, through the lines it read, latest first."""
        return sorted(
            (self.port.by_seq[s] for s in _reached(self.port, record.reads)), key=lambda r: -r.seq
        )


def _reached(run: LineRun, start: list[int]) -> set[int]:
    """The records ``start`` reads, and what they read, all the way back."""
    found: set[int] = set()
    todo = list(start)
    while todo:
        seq = todo.pop()
        if seq in found or seq not in run.by_seq:
            continue
        found.add(seq)
        todo.extend(run.by_seq[seq].reads)
    return found


def targets_of(run: LineRun, kind: str, input_name: str | None) -> list[LineRecord]:
    """The scope's output: the culprit's return value(s) in its own frame, or the
    differing input of the call that ends a glue scope (every input when unnamed)."""
    records = run.records
    if kind == "glue":
        inputs = [r for r in records if r.kind == "input"]
        named = [r for r in inputs if input_name is not None and r.name == input_name]
        return named or inputs
    returns = [
        r for r in records if r.frame == 1 and (r.name == "return" or r.name.startswith("return["))
    ]
    return returns or records[-1:]


def _judged(
    aligner: Aligner, ours: list[LineRecord], theirs: list[LineRecord], bound: float
) -> dict[int, Match]:
    """Each of the port's outputs against the reference's output of the same name (or,
    one each, against that one): within the bound, or not."""
    judged: dict[int, Match] = {}
    for record in ours:
        same = [r for r in theirs if r.name == record.name] or (theirs if len(theirs) == 1 else [])
        originals = [aligner.ref.run.original(r) for r in same]
        found = aligner.nearest(record, originals)
        if found:
            judged[record.seq] = Match(record, found[:NEAREST], found[0].rel_rms <= bound)
    return judged


def decide(
    reference: LineRun,
    port: LineRun,
    bound: float,
    kind: str,
    inputs: tuple[str | None, str | None] = (None, None),
) -> LineVerdict:
    """The first wrong line of the port (None when the scope's output agrees)."""
    aligner = Aligner(reference, port)
    targets = targets_of(port, kind, inputs[1])
    judged = _judged(aligner, targets, targets_of(reference, kind, inputs[0]), bound)
    path = _Path(port, align(reference, port, bound), {t.seq for t in targets}, judged)
    values = _Values(reference, port)
    notes = _notes(reference, port)
    shown = [r for r in port.records if r.alias is None or r.seq in judged]
    pairs = [values.pair(r, path.match(r)) for r in shown]
    first = _first_wrong(path, shown)
    if first is None:
        reason = _clean_reason(port, targets, path)
        return LineVerdict(None, None, None, [], reason, notes, pairs, None)
    index = next(i for i, r in enumerate(shown) if r.seq == first.seq)
    first_pair = pairs[index]
    ancestors = path.ancestors(first)
    agreeing = _last_agreeing(path, first, ancestors)
    last_pair = values.pair(agreeing, path.match(agreeing)) if agreeing is not None else None
    inside = [r for r in reversed(ancestors) if r.seq in path.wrong and path.ok(r) is None]
    fused = (
        _fused(values, first, first_pair, inside) if inside and path.ok(first) is False else None
    )
    skipped = [values.value(reference, r) for r in _skipped(reference, path, first)[:SKIPPED_SHOWN]]
    reason = _reason(first_pair, last_pair, fused, skipped)
    return LineVerdict(first_pair, last_pair, fused, skipped, reason, notes, pairs, index)


def _first_wrong(path: _Path, shown: list[LineRecord]) -> LineRecord | None:
    """The first value on the wrong path with a reference value of its size it is too far
    from; else the first on it that was kept at all; None when nothing is on it."""
    wrong = [r for r in shown if r.seq in path.wrong]
    found = next((r for r in wrong if path.ok(r) is False), None)
    return found if found is not None else next((r for r in wrong if r.kept), None)


def _last_agreeing(
    path: _Path, first: LineRecord, ancestors: list[LineRecord]
) -> LineRecord | None:
    """The latest value on the first wrong one's own path that agrees (else the latest
    agreeing value before it)."""
    found = next((r for r in ancestors if path.ok(r) is True), None)
    if found is not None:
        return found
    return next((r for r in reversed(path.port.records) if r.seq < first.seq and path.ok(r)), None)


def _skipped(reference: LineRun, path: _Path, first: LineRecord) -> list[LineRecord]:
    """Reference values computed between what the first wrong line read (which agrees
    with the reference) and the reference value nearest it, that no port value
    matches: lines of the reference the port has no counterpart of (a mask never
    added, a scaling never done), in the reference's order."""
    match = path.match(first)
    if match is None or match.best is None:
        return []
    nearest = reference.original(match.best.record)
    sources: set[int] = set()
    for seq in first.reads:
        read = path.port.by_seq.get(seq)
        found = path.match(read) if read is not None and path.ok(read) else None
        if found is not None and found.best is not None:
            sources.add(reference.original(found.best.record).seq)
    if not sources:
        return []
    shared = {m.best.record.seq for m in path.matches.values() if m.ok and m.best is not None}
    between = []
    # A value the port only passes on (an alias: a model call's input) computes nothing
    # itself: the reference line that made its counterpart is one the port lacks too.
    reached = _reached(reference, nearest.reads) | ({nearest.seq} if first.alias else set())
    for seq in reached:
        record = reference.by_seq[seq]
        if seq in sources or record.alias is not None or seq in shared or not record.kept:
            continue
        if sources & _reached(reference, record.reads):
            between.append(record)
    return sorted(between, key=lambda r: r.seq)


class _Values:
    """Records as the answer shows them: where, what, the first elements, how many runs."""

    def __init__(self, reference: LineRun, port: LineRun) -> None:
        self.reference = reference
        self.port = port
        self.runs = {id(run): _runs(run) for run in (reference, port)}

    def value(self, run: LineRun, record: LineRecord) -> LineValue:
        held = run.original(record)
        value: LineValue = {
            "file": record.file,
            "line": record.line,
            "function": record.function,
            "text": record.text,
            "name": record.name,
            "kind": record.kind,
            "shape": list(held.shape) if held.shape is not None else None,
            "dtype": held.dtype,
            "head": list(held.head),
            "rms": _rms(run, held),
            "runs": self.runs[id(run)].get((record.file, record.line, record.name), 1),
            "kept": held.kept,
        }
        return value

    def pair(self, record: LineRecord, match: Match | None) -> LinePair:
        pair: LinePair = {"b": self.value(self.port, record), "ok": None, "nearest": []}
        if match is not None:
            pair["ok"] = match.ok
            pair["nearest"] = [self.counterpart(near) for near in match.nearest]
        return pair

    def counterpart(self, near: Near) -> LineCounterpart:
        rel = near.rel_rms
        return {
            "a": self.value(self.reference, near.record),
            "rel_rms": rel if math.isfinite(rel) else None,
            "reading": near.reading,
            "head_b": list(near.head_b) if near.head_b is not None else None,
        }


def _runs(run: LineRun) -> dict[tuple[str, int, str], int]:
    counts: dict[tuple[str, int, str], int] = {}
    for record in run.records:
        key = (record.file, record.line, record.name)
        counts[key] = max(counts.get(key, 0), record.hit)
    return counts


def _rms(run: LineRun, record: LineRecord) -> float | None:
    stats = record.stats or {}
    rms = stats.get("rms")
    if isinstance(rms, int | float):
        return float(rms)
    if record.exact is not None and record.numel:
        import numpy as np

        values = run.numbers(record.exact)
        finite = values[np.isfinite(values)]
        return float(np.sqrt(np.mean(finite * finite))) if finite.size else None
    return None


def _where(value: LineValue) -> str:
    return f"{value.get('file')}:{value.get('line')}"


def _fused(
    values: _Values, first: LineRecord, pair: LinePair, inside: list[LineRecord]
) -> FusedCall | None:
    """The port's lines before the first wrong value, on its path, that could not be
    compared: nothing of their size in the reference (it computes them inside one call,
    the nearest reference line: an attention's scores inside SDPA, a schedule inside a
    scheduler) or single numbers (settings a reference keeps anywhere)."""
    nearest = pair.get("nearest") or []
    if not nearest:
        return None
    call = nearest[0]["a"]
    shown = [values.value(values.port, r) for r in inside[:INSIDE_SHOWN]]
    listed = ", ".join(f"{_where(v)} ({v.get('name')})" for v in shown[:3])
    more = f" and {len(inside) - 3} more" if len(inside) > 3 else ""
    note = (
        f"{len(inside)} port line(s) before it feed it with values the reference has no "
        f"counterpart to compare with ({listed}{more}): it computes them inside one call "
        f"({_where(call)}: {call.get('text')}), or they are single numbers; the first port "
        f"value a reference value of its size contradicts is {_where(pair['b'])} "
        f"({pair['b'].get('name')}), and the difference may start in one of the lines before"
    )
    return {"a": call, "inside": shown, "contradicted": pair, "note": note}


def _reason(
    first: LinePair, last: LinePair | None, fused: FusedCall | None, skipped: list[LineValue]
) -> str:
    b = first["b"]
    head = f"{_where(b)}  {b.get('text')}  — "
    nearest = first.get("nearest") or []
    if nearest:
        near = nearest[0]
        rel = near.get("rel_rms")
        how = f"rel {rel:.3g}" if isinstance(rel, float) else "no finite error"
        head += f"no counterpart (nearest: {_where(near['a'])}  {near['a'].get('text')}, {how})"
    else:
        head += "no value of its size in the reference"
    if last is not None:
        head += f"; last agreeing: {_where(last['b'])}  {last['b'].get('text')}"
    runs_b = b.get("runs", 1)
    if nearest and runs_b != nearest[0]["a"].get("runs", 1):
        head += f"; it ran {runs_b} time(s) in the port, {nearest[0]['a'].get('runs', 1)} in the reference"
    if skipped:
        lines = ", ".join(f"{_where(v)}  {v.get('text')}" for v in skipped)
        head += (
            f"; the reference computes in between, and nothing in the port has those values: "
            f"{lines}"
        )
    if fused is not None:
        head += f"; inside a fused reference call: {fused.get('note')}"
    return head


def _clean_reason(port: LineRun, targets: list[LineRecord], path: _Path) -> str:
    if not port.records:
        return (
            "the port's scope ran no line outside torch's, MLX's or numpy's own code (the "
            "culprit is one of their modules): no line of the port to name; the module "
            "itself, or which one the port uses there, is what differs"
        )
    if not targets:
        return "the port's scope recorded no output to follow"
    if all(path.ok(t) is True for t in targets):
        return (
            "every value on the way to the scope's output has a counterpart in the reference "
            "within the bound: no line of the port differs"
        )
    return "the scope's output differs, but no recorded line of the port explains it"


def _notes(reference: LineRun, port: LineRun) -> list[str]:
    notes = []
    for side, run in (("reference", reference), ("port", port)):
        skipped = sum(1 for r in run.records if r.skipped)
        if skipped:
            needed = run.scope.get("needed_bytes")
            notes.append(
                f"{skipped} value(s) of the {side} were not kept (over the byte budget"
                + (f"; {needed} more bytes would keep them" if isinstance(needed, int) else "")
                + "): they are never named, and may hide where the difference starts"
            )
        errors = sum(1 for r in run.records if r.error)
        if errors:
            notes.append(
                f"{errors} value(s) of the {side} could not be read: {run.scope.get('errors')}"
            )
        if run.unreadable:
            notes.append(f"{run.unreadable} record line(s) of the {side} could not be read")
    return notes
