"""The mechanics the verdict's rules (``rules.py``) use to name the first divergence.

Every module whose output differs is the culprit, a victim of an earlier difference, or
a boundary difference that the next module undoes.

* **Error growth.**  Errors flow forward and each module passes its inputs' error on,
  often rescaled (an RMSNorm puts the same relative error onto larger values).  So a
  module is a suspect only when its output's relative error (``rel_rms``) is clearly
  larger than its inputs explain: ``out > GROWTH * in + expected local rounding``.  The
  inputs' error is that of its compared inputs; when none were compared (captured with
  ``inputs=False``, or not paired) it is the largest error of any output that finished
  before the call started.  Among suspects the one that finished first wins: a parent
  finishes after its children, so that is the deepest call ("deepest call" rule).
* **Boundary differences.**  A module whose output differs while the next module that
  takes a tensor of that shape (and is not a sibling reading the same input) receives
  agreeing inputs computed something the port does a little later (Gemma's embedding
  scale, inside ``embed_tokens`` in transformers and after it in mlx-lm).  It is listed
  in ``boundary_differences`` with its ratio when the two differ by a constant factor,
  never named as the culprit, and the search goes on.
* **Modules the port never calls.**  When the culprit's reference call has a child the
  port never called at all, that child is named (the one just before the first child
  whose inputs already differ, or the last one when none do).
* **Replay.**  With local errors from ``mldbg.replay`` (each port module run on the
  reference's inputs), the culprit is the deepest call whose own local error is out of
  bounds; the growth verdict is kept beside it as ``by_growth``.

Plain tensor directories have no structure: there the first diverging entry is named.
The order in which these apply is ``rules.RULES``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ... import dtypes
from ...capture.store import ROOT
from ..judge.bounds import GROWTH, exact_scale, rel
from ..read.sources import Call, Source
from ..records import Boundary, Culprit, EntryResult, JsonNumber

CallKey = tuple[str, int]


def fails(result: EntryResult) -> bool:
    """Fails its deciding test, or (under a strict test) the scale-aware one."""
    return not result["ok"] or result.get("scale_ok") is False


def worst_rel(results: list[EntryResult]) -> float:
    return max((_input_rel(r) for r in results), default=0.0)


def _input_rel(r: EntryResult) -> float:
    """How wrong an entry is, relatively. Integers (token or position ids, indices) that
    differ at all make everything computed from them different: an unbounded error, so
    the module that receives them is a victim, never the one that made them wrong."""
    if r.get("error"):
        return 0.0
    if not r.get("ok") and _is_integer(r.get("dtype_a")) and _is_integer(r.get("dtype_b")):
        return math.inf
    if r.get("nonfinite_mismatched"):
        # NaN/inf against a number: the statistics cover the finite elements only, and a
        # module that turns finite inputs into inf (an fp16 overflow) must read as the
        # jump it is, not as the small error of the elements that stayed finite.
        return math.inf
    return rel(r.get("rel_rms"))


def _is_integer(dtype: str | None) -> bool:
    return dtype is not None and dtypes.is_exact(dtype)


def json_number(value: float) -> JsonNumber:
    """``value`` as JSON holds it: an unbounded error (NaN/inf against a number, integers
    that differ) is the string ``"inf"``, never a bare infinity."""
    return value if math.isfinite(value) else ("nan" if math.isnan(value) else "inf")


def largest_abs(results: list[EntryResult]) -> JsonNumber | None:
    found = [value for r in results if (value := r.get("max_abs")) is not None]
    # "inf" (a float64 overflow) is a string in JSON-ready results: float() reads it
    return max(found, key=float, default=None)


def culprit_of(
    call: Call, bad_out: list[EntryResult], reason: str, inputs_compared: bool
) -> Culprit:
    return {
        "name": f"{call.module}#{call.call}",
        "module": call.module,
        "call": call.call,
        "class": call.class_name,
        "reason": reason,
        "entries": [r["name"] for r in bad_out],
        "max_abs": largest_abs(bad_out),
        "nonfinite_mismatched": sum(r.get("nonfinite_mismatched") or 0 for r in bad_out),
        "inputs_compared": inputs_compared,
        "expected": max((r.get("expected") or 0.0) for r in bad_out),
    }


def boundary_differences_of(
    source: Source, by_call: dict[CallKey, dict[str, list[EntryResult]]]
) -> list[Boundary]:
    """Calls whose differing output the next consumer no longer sees."""
    finder = _Consumers(source, by_call)
    found: list[Boundary] = []
    absorbers: set[CallKey] = set()
    for key, roles in by_call.items():
        call = source.calls.get(key)
        bad = [r for r in roles["out"] if fails(r)]
        if call is None or call.end_order is None or not bad:
            continue
        in_err = worst_rel(roles["in"]) if roles["in"] else finder.upstream_error(call)
        local_bound = max((r.get("expected_local") or 0.0) for r in bad)
        # The consumer must see no more error than this call's inputs had: the
        # difference vanished, it was not merely diluted (a residual add shrinks one).
        allowed = GROWTH * in_err + local_bound
        if worst_rel(bad) <= allowed:
            continue  # a victim: its difference is not its own
        undone = finder.undone_by(call, roles, bad, allowed)
        if undone is None:
            continue
        consumer, absorbed = undone
        absorbers.add(consumer)
        ratio = _ratio(bad)
        found.append(
            _boundary(
                call,
                bad,
                absorbed,
                ratio,
                compensated_by=f"{consumer[0]}#{consumer[1]}",
                note=(
                    f"x{ratio:.3f}, compensated by the next module"
                    if ratio is not None
                    else "differs, and the next module's outputs agree again"
                    if absorbed
                    else "differs, but the next module's inputs agree again"
                ),
            )
        )
    found += _absorbed_inputs(source.calls, by_call, absorbers)
    return found


class _Consumers:
    """Who reads a call's outputs next, and what error each call's inputs brought, for
    one comparison's calls."""

    def __init__(self, source: Source, by_call: dict[CallKey, dict[str, list[EntryResult]]]):
        self.calls = source.calls
        self.by_call = by_call
        self.ended = sorted(
            (self.calls[k].end_order or 0, worst_rel(roles["out"]))
            for k, roles in by_call.items()
            if k in self.calls and self.calls[k].end_order is not None
        )
        self.starts = sorted(
            (self.calls[k].start_order, k) for k in by_call if k in self.calls and by_call[k]["in"]
        )
        self.same = _SameValues(source)

    def upstream_error(self, call: Call) -> float:
        """Inputs not compared: the largest error of any output finished before it."""
        start = call.start_order or 0
        before = [err for end, err in self.ended if end < start]
        return max(before) if before else 0.0

    def undone_by(
        self,
        call: Call,
        roles: dict[str, list[EntryResult]],
        bad: list[EntryResult],
        allowed: float,
    ) -> tuple[CallKey, list[str]] | None:
        """The call that next reads each differing output and no longer sees the
        difference (its inputs agree within ``allowed``, or it undoes the difference
        itself: then its differing inputs are listed as absorbed); None when any
        differing output reaches a reader that still sees it, or has no reader."""
        own_inputs = {tuple(r["shape_a"]) for r in roles["in"]}
        consumer = None
        absorbed: list[str] = []
        for result in bad:
            shape = tuple(result["shape_a"])
            readers = None  # a new shape: its first reader is the consumer
            if shape in own_inputs:
                readers = _reads_output(self.same, result["name"], roles["in"])
                if readers is None:  # an identity in the reference: undecidable
                    return None
            nxt = _next_consumer(self.calls, self.by_call, self.starts, call, shape, readers)
            if nxt is None:
                return None
            consumer, inputs = nxt
            agree = all(r["ok"] and r.get("scale_ok") is not False for r in inputs)
            if not agree or worst_rel(inputs) > allowed:
                differing = [r for r in inputs if fails(r)]
                if not _absorbs(self.by_call[consumer], differing):
                    return None
                # The consumer still sees the difference and undoes it itself (the port
                # moved the computation into it): its outputs agree.
                absorbed += [r["name"] for r in differing]
        return None if consumer is None else (consumer, absorbed)


def _ratio(differing: list[EntryResult]) -> float | None:
    """reference / port: the exact factor the port applies elsewhere, when there is one."""
    ratio = None
    for result in differing:
        scale = exact_scale(result, result.get("expected") or 0.0)
        if scale is not None and scale != 0:
            ratio = 1.0 / scale
    return ratio


def _boundary(
    call: Call,
    differing: list[EntryResult],
    absorbed: list[str],
    ratio: float | None,
    *,
    compensated_by: str,
    note: str,
) -> Boundary:
    return {
        "name": f"{call.module}#{call.call}",
        "module": call.module,
        "call": call.call,
        "class": call.class_name,
        "entries": [r["name"] for r in differing] + absorbed,
        "ratio": ratio,
        "compensated_by": compensated_by,
        "rel_rms": json_number(worst_rel(differing)),
        "note": note,
    }


def _absorbs(roles: dict[str, list[EntryResult]], differing: list[EntryResult]) -> bool:
    """A call that undid what differed in its inputs: its outputs all agree, and it passes
    on a tensor shaped like each differing input (a norm that takes ``8 x`` and returns
    what it returns for ``x``).  A call whose outputs merely do not depend on the values
    (a rotary embedding reading only its input's dtype) has no such output."""
    if not roles["out"] or any(fails(r) for r in roles["out"]):
        return False
    shapes = {tuple(r["shape_a"]) for r in roles["out"]}
    return all(tuple(r["shape_a"]) in shapes for r in differing)


def _absorbed_inputs(
    calls: dict[CallKey, Call],
    by_call: dict[CallKey, dict[str, list[EntryResult]]],
    absorbers: set[CallKey],
) -> list[Boundary]:
    """Calls whose inputs differ while their outputs agree: the port moved a computation
    into the module (the reference scales in the parent's code, the port inside the
    child), so the difference is the boundary's, not a culprit's."""
    found: list[Boundary] = []
    for key, roles in by_call.items():
        call = calls.get(key)
        bad_in = [r for r in roles["in"] if fails(r)]
        if call is None or key in absorbers or not bad_in or not _absorbs(roles, bad_in):
            continue
        if call.parent is None:
            continue  # the runs' own inputs differ: that is said plainly, never excused
        ratio = _ratio(bad_in)
        name = f"{call.module}#{call.call}"
        found.append(
            _boundary(
                call,
                bad_in,
                [],
                ratio,
                compensated_by=name,
                note=(
                    f"input x{ratio:.3f}, compensated inside this module"
                    if ratio is not None
                    else "input differs, but this module's outputs agree"
                ),
            )
        )
    return found


def _next_consumer(
    calls: dict[CallKey, Call],
    by_call: dict[CallKey, dict[str, list[EntryResult]]],
    starts: list[tuple[int, CallKey]],
    call: Call,
    shape: tuple[int, ...],
    reads_output: Callable[[EntryResult], bool] | None,
) -> tuple[CallKey, list[EntryResult]] | None:
    """The first call starting after ``call`` ended that takes ``call``'s output of ``shape``.

    When the output has a new shape, the first call taking a tensor of that shape is its
    consumer.  When it has the shape of one of ``call``'s own inputs (a block that returns
    ``x + update``, or only ``update`` in a port that adds the residual outside), shapes
    cannot tell a consumer from a sibling reading the same input (``k_proj`` after
    ``q_proj``), so the reference's values decide: ``reads_output`` says whether an input
    entry holds exactly the tensor ``call`` returned (``None``: the output has a new shape).
    """
    assert call.end_order is not None
    checked = 0
    for start, key in starts:
        if start <= call.end_order:
            continue
        inputs = [r for r in by_call[key]["in"] if tuple(r["shape_a"]) == shape]
        if not inputs:
            continue
        if reads_output is None:
            return key, inputs
        reading = [r for r in inputs if reads_output(r)]
        if reading:
            return key, reading
        checked += 1
        if checked >= _READERS_CHECKED:
            return None
    return None


# How many later calls taking a tensor of the output's shape are read to find the one
# that takes the output itself: each check reads two tensors of the reference.
_READERS_CHECKED = 8


def _reads_output(
    same: _SameValues, output: str, own_inputs: list[EntryResult]
) -> Callable[[EntryResult], bool] | None:
    """A test "does this input entry hold ``output``'s tensor?", or None when ``output``
    equals one of the call's own inputs (an identity module in the reference: its readers
    and its input's other readers cannot be told apart)."""
    if any(same(output, r["name"]) for r in own_inputs):
        return None
    return lambda entry: same(entry["name"], output)


class _SameValues:
    """Exact equality of two tensors of the reference capture, read in chunks (bounded
    memory, like the comparison itself), answers cached."""

    CHUNK = 1 << 20

    def __init__(self, source: Source) -> None:
        self._source = source
        self._entries = {e.name: e for e in source.entries}
        self._known: dict[tuple[str, str], bool] = {}

    def __call__(self, x: str, y: str) -> bool:
        key = (x, y) if x <= y else (y, x)
        if key not in self._known:
            self._known[key] = self._equal(x, y)
        return self._known[key]

    def _equal(self, x: str, y: str) -> bool:
        ex, ey = self._entries.get(x), self._entries.get(y)
        if ex is None or ey is None or ex.shape != ey.shape or ex.dtype != ey.dtype:
            return False
        try:
            a = np.asarray(self._source.load(ex)).reshape(-1)
            b = np.asarray(self._source.load(ey)).reshape(-1)
        except (OSError, ValueError):
            return False
        for start in range(0, a.size, self.CHUNK):
            if not np.array_equal(a[start : start + self.CHUNK], b[start : start + self.CHUNK]):
                return False
        return True


def missing_child(
    source: Source,
    call: Call,
    by_call: dict[CallKey, dict[str, list[EntryResult]]],
    b_calls: set[str] | None,
    b_modules: set[str] | None,
) -> Call | None:
    """A child of ``call`` that the port has as a module but never called.  A child the
    port has no module for (mlx-lm computes SiLU inline where transformers has
    ``act_fn``) is a structural difference, not a skipped call."""
    if b_calls is None or not b_modules:
        return None
    children = sorted(
        (c for c in source.calls.values() if c.parent == call.seq), key=lambda c: c.start_order
    )
    missing = [c for c in children if c.module not in b_calls and c.module in b_modules]
    if not missing:
        return None
    first_bad = next(
        (
            c
            for c in children
            if c.module in b_calls
            and any(fails(r) for r in by_call.get((c.module, c.call), {}).get("in", []))
        ),
        None,
    )
    if first_bad is not None:
        before = [c for c in missing if c.start_order < first_bad.start_order]
        return before[-1] if before else None
    return missing[-1]


def missing_sibling(
    source: Source, call: Call, b_calls: set[str] | None, b_modules: set[str] | None
) -> Call | None:
    """The sibling just before ``call`` that the port has but never called: what should
    have turned ``call``'s (now differing) inputs into the reference's."""
    if b_calls is None or not b_modules or call.parent is None:
        return None
    before = sorted(
        (
            c
            for c in source.calls.values()
            if c.parent == call.parent and c.start_order < call.start_order
        ),
        key=lambda c: c.start_order,
    )
    if before and before[-1].module not in b_calls and before[-1].module in b_modules:
        return before[-1]
    return None


def fallback_culprit(
    failing: list[EntryResult], by_call: dict[CallKey, dict[str, list[EntryResult]]]
) -> Culprit:
    """The first of what still fails, with a reason its entries bear out: every claim
    made here is checked against the entries (``check.py``)."""
    first = failing[0]
    if all(r.get("role") == "in" for r in failing):
        reason = "outputs agree, only inputs differ; first input that differs"
    elif first.get("role") == "in" and first.get("module") == ROOT:
        reason = "the two runs were given different inputs"
    elif first.get("error"):
        reason = f"first entry that could not be compared: {first['error']}"
    elif all(_inputs_fail(r, by_call) for r in failing if r.get("role") == "out"):
        reason = "every differing output has differing inputs; first entry that differs"
    else:
        reason = "first entry that differs"
    return {
        "name": first["name"],
        "module": first.get("module"),
        "call": first.get("call"),
        "reason": reason,
        "entries": [first["name"]],
        "max_abs": first.get("max_abs"),
        "rel_rms": first.get("rel_rms"),
        "nonfinite_mismatched": first.get("nonfinite_mismatched") or 0,
        "inputs_compared": bool(_inputs_of(first, by_call)),
    }


def _inputs_of(
    result: EntryResult, by_call: dict[CallKey, dict[str, list[EntryResult]]]
) -> list[EntryResult]:
    """The compared inputs of the call ``result`` belongs to."""
    module, call = result.get("module"), result.get("call")
    if module is None or call is None:
        return []
    return by_call.get((module, call), {}).get("in", [])


def _inputs_fail(result: EntryResult, by_call: dict[CallKey, dict[str, list[EntryResult]]]) -> bool:
    """Some compared input of the call ``result`` is an output of fails."""
    return any(fails(r) for r in _inputs_of(result, by_call))
