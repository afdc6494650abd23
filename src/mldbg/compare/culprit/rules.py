"""The verdict as small named rules, applied in a documented order.

Each entry has already been judged (``ok``: within what rounding, quantization and the
op's conditioning explain).  What remains is to name the one place a user should read:
the *first divergence*.  Every rule reads the same :class:`Evidence` and either decides
(returns a :class:`Verdict`) or passes (returns None, possibly after adding notes or
boundary differences for the rules after it).  :data:`RULES` is the order; docs/verdict.md
documents the same order.

0. ``pairing``: fewer than half of the reference's entries paired -> no culprit (a map
   is needed; one is proposed).
1. ``agreement``: nothing fails -> no culprit.
2. ``unstructured``: plain tensor directories have no calls -> the first differing entry.
3. ``boundary``: differences the next module no longer sees (a scale moved across a
   module boundary) are listed and set aside.
4. ``glue``: the first difference is an *input* of a top-level call (a later step of a
   loop, the next model of a pipeline, or the runs' very first inputs) while everything
   before agrees -> the code between the calls, named with both call sites.
5. ``growth``: among calls whose output error grows beyond what their inputs explain
   (or whose inline code made a child's inputs differ: :func:`_inline_suspects`), the
   one whose jump explains what reaches the outputs (see :func:`growth`); a child or
   sibling the port has as a module but never calls is named instead.
6. ``quantized``: no suspect, and all that fails is downstream of quantized port
   modules -> compounded quantization noise: a note, no culprit (replay can tell more).
7. ``replay``: with local errors from ``mldbg.replay``, the deepest call out of bounds
   on the reference's own inputs overrides growth, glue and quantized.
8. ``fallback``: what is left fails only because its inputs do -> the first of it.
9. ``missing``: no culprit while a capture lost entries the other side has (a full disk,
   the byte budget, a run killed inside the model) -> no verdict: what could not be
   checked, and the last point that agreed before it.  Missing data is never agreement.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..judge.bounds import GROWTH
from ..judge.ranges import describe
from ..read.sources import Call, Source
from ..records import (
    Boundary,
    Culprit,
    EntryResult,
    LocalErrors,
    Missing,
    Note,
    SideBySide,
    Site,
)
from .divergence import (
    CallKey,
    boundary_differences_of,
    culprit_of,
    fails,
    fallback_culprit,
    json_number,
    largest_abs,
    missing_child,
    missing_sibling,
    worst_rel,
)

# A candidate whose output error is this many times smaller than a later candidate's own
# jump is a note, not the culprit.  A margin, not a fit: the factor compares two relative
# errors (no scale, no dtype in it), and an earlier relative error reaches the outputs at
# most GROWTH x (the growth rule's premise), so fixing a dwarfed one changes the outputs
# by at most GROWTH / DWARF (2%) of what the later jump puts there.  Measured on real
# ports of two architectures (tests/test_parity_dwarf.py): a Llama norm-eps slip (5e-5)
# reaches the logits x1.2 and is 0.03% of a later attention-scale bug's effect; a Flux
# embedding slip (1e-4) all but dies out; real bugs planted 2-10x apart stay named first.
# Rounding-level slips (1e-6..1e-4 relative) and real bugs (0.1..1) sit 1e3-1e5 apart.
DWARF = 100.0


@dataclass
class Evidence:
    """What every rule reads: the reference's calls and the judged entries."""

    source: Source
    results: list[EntryResult]
    b_calls: set[str] | None = None
    b_modules: set[str] | None = None
    local: LocalErrors | None = None
    b_sites: dict[CallKey, str] = field(default_factory=dict)
    paired: tuple[int, int] | None = None  # (entries of A paired, entries of A) when too few pair
    missing: Missing | None = None  # what the captures lost that the other side has
    moved: list[Boundary] = field(default_factory=list)  # steps moved across a boundary
    by_call: dict[CallKey, dict[str, list[EntryResult]]] = field(default_factory=dict)
    failing: list[EntryResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.failing = [r for r in self.results if not r["ok"]]
        for result in self.results:
            key, role = call_key(result), result.get("role")
            if key is not None and role is not None:
                self.by_call.setdefault(key, {"in": [], "out": []})[role].append(result)

    @property
    def calls(self) -> dict[CallKey, Call]:
        return self.source.calls


@dataclass
class Verdict:
    """The culprit (or None), what was set aside, and the rule that decided."""

    culprit: Culprit | None = None
    boundaries: list[Boundary] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    rule: str | None = None
    undecided: str | None = None  # why no culprit can be named (too few entries pair)

    def set_aside(self) -> tuple[set[CallKey], set[str]]:
        """The boundary differences' calls, and the entries they cover: what no rule
        after ``boundary`` counts."""
        calls = {(b["module"], b["call"]) for b in self.boundaries}
        return calls, {name for b in self.boundaries for name in b["entries"]}


Rule = Callable[[Evidence, Verdict], Verdict | None]


def agreement(evidence: Evidence, verdict: Verdict) -> Verdict | None:
    """Nothing fails: no culprit."""
    if evidence.failing:
        return None
    verdict.rule = "agreement"
    return verdict


def unstructured(evidence: Evidence, verdict: Verdict) -> Verdict | None:
    """Tensor directories (no calls, no modules): the first entry that differs."""
    if evidence.calls and any(r.get("module") is not None for r in evidence.results):
        return None
    first = evidence.failing[0]
    verdict.culprit = {
        "name": first["name"],
        "module": None,
        "call": None,
        "reason": "first entry that differs",
        "entries": [first["name"]],
        "max_abs": first.get("max_abs"),
        "rel_rms": first.get("rel_rms"),
        "nonfinite_mismatched": first.get("nonfinite_mismatched") or 0,
        "inputs_compared": False,
    }
    verdict.rule = "unstructured"
    return verdict


def pairing(evidence: Evidence, verdict: Verdict) -> Verdict | None:
    """Fewer than two of the reference's module calls have a paired output: the names
    probably differ, and a culprit among the few that paired would be a guess (the one
    module that pairs by accident, ``<root>``, would be blamed for everything)."""
    if evidence.paired is None:
        return None
    paired, total = evidence.paired
    verdict.undecided = (
        f"only {paired} of {total} entries of the reference paired: too few to name a "
        "culprit; the module names probably differ: compare again with a map (the map "
        "argument: a file or {rename, regex, ignore}; proposed_map holds one proposed from "
        "the module trees)"
    )
    verdict.rule = "pairing"
    return verdict


def boundary(evidence: Evidence, verdict: Verdict) -> Verdict | None:
    """Set aside the differences the next module no longer sees (never decides)."""
    found = boundary_differences_of(evidence.source, evidence.by_call)
    known = {b["name"] for b in found}  # a scale's ratio says more than a moved step
    verdict.boundaries = found + [b for b in evidence.moved if b["name"] not in known]
    return None


def glue(evidence: Evidence, verdict: Verdict) -> Verdict | None:
    """The first failing entry is an input of a top-level call and everything that ended
    before that call agrees: the difference was made between the calls, in the code
    that calls the model (a scheduler step, a loop, latent packing, preprocessing)."""
    rest = _unexplained(evidence, verdict)
    first = rest[0] if rest else None
    if first is None or first.get("role") != "in" or all(r["role"] == "in" for r in rest):
        return None  # (differing inputs that change no output are said plainly later)
    key = (first.get("module"), first.get("call"))
    call = evidence.calls.get(key)  # type: ignore[arg-type]
    if call is None or call.parent is not None:
        return None
    if any(not r["ok"] for r in _outputs_ended_before(evidence, call.start_order)):
        return None
    previous = _previous_top_level(evidence, call)
    roles = evidence.by_call.get((call.module, call.call), {"in": [], "out": []})
    differing = [r for r in roles["in"] if not r["ok"]]
    here = _site(evidence, call)
    earlier = _earlier_models(evidence.source)
    if previous is None and earlier:
        reason = (
            f"the inputs of {call.module}#{call.call}, this model's first call, differ beyond "
            f"what the models its run called before it ({earlier}) round: the difference "
            f"enters before this model, in the code that feeds it (glue) or in an earlier "
            f"model: compare those first"
        )
    elif previous is None:
        reason = (
            f"the two runs were given different inputs: {call.module}#{call.call} "
            "is the first call and its inputs differ"
        )
    else:
        reason = (
            f"the inputs of {call.module}#{call.call} differ while everything before agrees: "
            f"the difference enters between {previous.module}#{previous.call} and "
            f"{call.module}#{call.call}, in the code between the two calls (glue code)"
        )
    verdict.culprit = {
        "name": f"{call.module}#{call.call}",
        "module": call.module,
        "call": call.call,
        "class": call.class_name,
        "reason": reason,
        "entries": [r["name"] for r in differing],
        "max_abs": largest_abs(differing),
        "rel_rms": json_number(worst_rel(differing)),
        "nonfinite_mismatched": sum(r.get("nonfinite_mismatched") or 0 for r in differing),
        "inputs_compared": True,
        "glue": {
            "after": None if previous is None else _site(evidence, previous),
            "before": here,
            "input": _side_by_side(first),
        },
    }
    verdict.rule = "glue"
    return verdict


def growth(evidence: Evidence, verdict: Verdict) -> Verdict | None:
    """The call whose own error jump explains what reaches the outputs.

    Suspects are calls whose output error exceeds ``GROWTH x`` their inputs' error plus
    their own expected error (a victim passes its inputs' error on; see
    ``divergence``).  Among them:

    * when the model's outputs (the last top-level call's) were compared and all agree,
      a suspect whose difference dies out (no call that starts after it ends differs, and
      the outputs' error is ``DWARF`` times smaller than its own) never reaches an output:
      a note, never the culprit.  (An error that merely hides under a loose bound, a bug
      under 4-bit noise, still shows in the outputs' error and stays a suspect);
    * a suspect whose error a later suspect's own jump dwarfs (``DWARF`` times larger)
      is a note;
    * the first remaining suspect to finish (the deepest call) is the culprit.
    """
    suspects = _suspects(evidence, verdict)
    if not suspects:
        return None
    outputs = _model_outputs(evidence)
    if outputs and all(r["ok"] for r in outputs):
        reached = worst_rel(outputs)
        dying = [
            s for s in suspects if not _seen_later(evidence, s) and DWARF * reached < s.out_err
        ]
        for suspect in dying:
            verdict.notes.append(
                _note(suspect, "differs beyond its bound, but nothing after it does")
            )
        suspects = [s for s in suspects if s not in dying]
        if not suspects:
            verdict.rule = "growth"
            return verdict
    kept = []
    for i, suspect in enumerate(suspects):
        # An unbounded jump (NaN/inf) is no measure to dwarf anything with: a difference
        # before it may be what pushed the values out of the dtype's range.
        later = [
            s
            for s in suspects[i + 1 :]
            if math.isfinite(s.jump) and s.jump > DWARF * suspect.out_err
        ]
        if later:
            verdict.notes.append(
                _note(
                    suspect,
                    f"differs beyond its bound, but {later[0].name}'s own error "
                    f"({later[0].out_err:.3g}) dwarfs it",
                )
            )
        else:
            kept.append(suspect)
    verdict.culprit = _growth_culprit(evidence, kept[0])
    verdict.rule = "growth"
    return verdict


def _growth_culprit(evidence: Evidence, chosen: _Suspect) -> Culprit:
    """The chosen suspect as the culprit: its numbers, what its dtype could not hold, a
    child the port skips, the children the port computes inline."""
    culprit = culprit_of(chosen.call, chosen.bad_out, chosen.reason, chosen.inputs_compared)
    culprit["input_rel_rms"] = chosen.in_err
    culprit["rel_rms"] = json_number(chosen.out_err)
    ranged = next((r["out_of_range"] for r in chosen.bad_out if r.get("out_of_range")), None)
    if ranged is not None:  # the port's dtype could not hold the values: say so
        culprit["out_of_range"] = ranged
        culprit["reason"] += f"; {describe(ranged)}"
    if all(r["ok"] for r in chosen.bad_out):
        # Under --rtol/--atol its outputs pass: never name a passing entry, say why the
        # call is named all the same.
        culprit["entries"] = []
        culprit["passes_elementwise"] = True
        culprit["reason"] += (
            f"; its outputs pass the element-wise test at these tolerances, but its "
            f"relative error ({chosen.out_err:.3g}) is where the error first grows beyond "
            f"what its inputs explain: {evidence.failing[0]['name']} fails because of it"
        )
    culprit = _never_called(evidence, chosen.call, culprit)
    inline = _unpaired_children(evidence, culprit)
    if inline:
        culprit["unpaired_children"] = inline
        culprit["hint"] = (
            f"the reference's {', '.join(inline[:3])} ha{'s' if len(inline) == 1 else 've'} "
            "no counterpart in the port: look at what the port computes inline there"
        )
    return culprit


def quantized(evidence: Evidence, verdict: Verdict) -> Verdict | None:
    """No call's own jump is out of bounds, and everything that still fails sits
    downstream of quantized port modules: the quantization noise compounded past the
    allowance (it does, over a deep 4-bit model) while every call stayed within twice
    its inputs' error plus its own quantization.  That is noise, not a culprit: each
    failure is a note, and the note says that only replay (each port module on the
    reference's own inputs) can tell a bug hidden under it."""
    if verdict.culprit is not None or verdict.rule is not None:
        return None
    rest = _unexplained(evidence, verdict)
    if not rest or not all(r.get("quant_noise") for r in rest):
        return None
    local = evidence.local
    if local is None:
        why = "only replay (mldbg.replay, local errors) can tell a bug hidden under this noise"
    elif local.get("culprit"):
        why = "replay's local errors decide (rule replay)"
    else:
        # Each port module on the reference's own inputs stayed within its own rounding
        # and quantization: the drift is noise compounding, and replay has said so.
        why = (
            "replay confirms it: on the reference's own inputs every replayed module "
            "stays within its own rounding and quantization"
        )
    verdict.notes.append(
        {
            "name": rest[0]["name"],
            "module": rest[0].get("module"),
            "call": rest[0].get("call"),
            "entries": [r["name"] for r in rest],
            "rel_rms": json_number(worst_rel(rest)),
            "expected": max((r.get("expected") or 0.0) for r in rest),
            "note": (
                "quantization noise compounding over depth: every call's output stays "
                f"within twice its inputs' error plus its own quantization, so no module "
                f"is to blame; {why}"
            ),
            "replay_checked": local is not None,
        }
    )
    verdict.rule = "quantized"
    return verdict


def replay(evidence: Evidence, verdict: Verdict) -> Verdict | None:
    """Local errors (each port module on the reference's inputs) name the culprit."""
    found = None if evidence.local is None else evidence.local["culprit"]
    if not found:
        return None
    roles = evidence.by_call.get(call_key(found) or ("", 0), {"in": [], "out": []})
    entries = found["entries"]
    growth_culprit = verdict.culprit
    verdict.culprit = {
        "name": found["name"],
        "module": found["module"],
        "call": found["call"],
        "class": found.get("class", ""),
        "reason": "its own error on the reference's inputs (replay) is out of bounds",
        "entries": [e for e in entries if any(r["name"] == e for r in roles["out"])] or entries,
        "max_abs": largest_abs(roles["out"]),
        "rel_rms": json_number(worst_rel(roles["out"])) if roles["out"] else None,
        "nonfinite_mismatched": sum(r.get("nonfinite_mismatched") or 0 for r in roles["out"]),
        "inputs_compared": bool(roles["in"]),
        "local": True,
        "by_growth": None
        if growth_culprit is None
        else {"name": growth_culprit["name"], "reason": growth_culprit["reason"]},
    }
    verdict.rule = "replay"
    return verdict


def fallback(evidence: Evidence, verdict: Verdict) -> Verdict | None:
    """What fails is explained by its inputs: the first of it (none when only boundary
    differences and notes are left)."""
    if verdict.culprit is not None or verdict.rule in ("growth", "quantized"):
        return verdict
    rest = _unexplained(evidence, verdict)
    verdict.culprit = fallback_culprit(rest, evidence.by_call) if rest else None
    verdict.rule = "fallback"
    return verdict


RULES: tuple[tuple[str, Rule], ...] = (
    ("pairing", pairing),
    ("agreement", agreement),
    ("unstructured", unstructured),
    ("boundary", boundary),
    ("glue", glue),
    ("growth", growth),
    ("quantized", quantized),
    ("replay", replay),
    ("fallback", fallback),
)
# growth and glue decide the culprit but replay may still override it: a verdict of a
# rule in _OVERRIDABLE is handed on to the rules in _OVERRIDES only.
_OVERRIDABLE = {"growth", "glue", "quantized"}
_OVERRIDES = {"replay", "fallback"}


def missing(evidence: Evidence, verdict: Verdict) -> Verdict:
    """No culprit, and entries went unchecked because a capture lost them: no verdict,
    never "match" (a culprit found among what was compared stands)."""
    lost = evidence.missing
    if lost is None or verdict.culprit is not None or verdict.undecided is not None:
        return verdict
    where = (
        f"; the last point that agrees is {lost['last_agreeing']}" if lost["last_agreeing"] else ""
    )
    verdict.undecided = (
        f"nothing that was compared differs, but {lost['note']}{where}: capture again "
        "with room for them (free disk, a larger capture budget) and let the run finish"
    )
    verdict.rule = "missing"
    return verdict


def decide(evidence: Evidence) -> Verdict:
    """Apply :data:`RULES` in order; the first that decides ends the search (growth and
    glue hand on to replay, which may override them with stronger evidence); then
    :func:`missing`: what no entry could show is never agreement."""
    return missing(evidence, _decide(evidence))


def _decide(evidence: Evidence) -> Verdict:
    verdict = Verdict()
    for name, rule in RULES:
        if verdict.rule in _OVERRIDABLE and name not in _OVERRIDES:
            continue
        decided = rule(evidence, verdict)
        if decided is None:
            continue
        verdict = decided
        if verdict.rule not in _OVERRIDABLE:
            return verdict
    return verdict


def first_divergence(
    source: Source,
    results: list[EntryResult],
    *,
    b_calls: set[str] | None = None,
    b_modules: set[str] | None = None,
    local: LocalErrors | None = None,
    b_sites: dict[CallKey, str] | None = None,
    paired: tuple[int, int] | None = None,
    missing: Missing | None = None,
    moved: list[Boundary] | None = None,
) -> Verdict:
    """The verdict for ``results`` (compared entries in A's order, each with
    name/module/call/role/ok and the scale numbers)."""
    evidence = Evidence(
        source,
        results,
        b_calls,
        b_modules,
        local,
        b_sites=b_sites or {},
        paired=paired,
        missing=missing,
        moved=moved or [],
    )
    verdict = decide(evidence)
    if verdict.culprit is not None:
        verdict.culprit.update(_located(evidence, verdict.culprit))
    return verdict


# -- what the rules share ------------------------------------------------------------------


@dataclass
class _Suspect:
    call: Call
    bad_out: list[EntryResult]
    reason: str
    inputs_compared: bool
    in_err: float
    out_err: float

    @property
    def name(self) -> str:
        return f"{self.call.module}#{self.call.call}"

    @property
    def jump(self) -> float:
        """The error this call adds by itself."""
        return max(0.0, self.out_err - GROWTH * self.in_err)


def _suspects(evidence: Evidence, verdict: Verdict) -> list[_Suspect]:
    """Calls whose output error grows beyond what their inputs explain, in end order."""
    calls, by_call = evidence.calls, evidence.by_call
    boundary_keys, _moved = verdict.set_aside()
    finished = sorted(
        (calls[k].end_order or 0, worst_rel(roles["out"]))
        for k, roles in by_call.items()
        if k in calls and k not in boundary_keys and calls[k].end_order is not None
    )

    def upstream(call: Call, roles: dict[str, list[EntryResult]]) -> tuple[float, bool]:
        if roles["in"]:
            return worst_rel(roles["in"]), True
        before = [err for end, err in finished if end < (call.start_order or 0)]
        return (max(before) if before else 0.0), False

    found = []
    for key, roles in by_call.items():
        call = calls.get(key)
        if call is None or key in boundary_keys:
            continue
        bad_out = [r for r in roles["out"] if fails(r)]
        if not bad_out:
            continue
        out_err = worst_rel(bad_out)
        in_err, inputs_compared = upstream(call, roles)
        bound = max((r.get("expected_local") or 0.0) for r in bad_out)
        if out_err <= GROWTH * in_err + bound:
            continue  # a victim: its inputs' error explains its own
        if inputs_compared and all(r["ok"] for r in roles["in"]):
            reason = "inputs agree, outputs differ"
        elif inputs_compared:
            reason = (
                f"output error grows beyond what its inputs explain "
                f"(relative error {in_err:.3g} in, {out_err:.3g} out)"
            )
        else:
            reason = "first output whose error grows (inputs not compared)"
        found.append(_Suspect(call, bad_out, reason, inputs_compared, in_err, out_err))
    found.extend(_inline_suspects(evidence, verdict, {s.call.seq for s in found}))
    never = 1 << 62
    found.sort(key=lambda s: (never if s.call.end_order is None else s.call.end_order, s.call.seq))
    return found


def _inline_suspects(evidence: Evidence, verdict: Verdict, suspected: set[int]) -> list[_Suspect]:
    """Calls that made a difference inline although their own outputs pass.

    A block whose output stays within its bound (a gated branch, a residual that
    dominates, a bfloat16 bound) can still have computed something wrong between its
    children: a child's inputs differ beyond their bound while the block's own inputs,
    and every output that ended before that child started, agree.  What the child read
    was computed by the block's own code (a modulation, a scale, a mask), so the block
    is a suspect, that intermediate standing for its output; without this the first
    call the difference reaches with a large enough jump was named instead (a later
    block's attention).  Differences set aside as moved across a boundary are not
    counted; ``suspected``: calls already suspects by their outputs."""
    calls, by_call = evidence.calls, evidence.by_call
    boundary_keys, moved = verdict.set_aside()
    by_seq = {c.seq: c for c in calls.values()}
    found: list[_Suspect] = []
    children = sorted(
        (c for c in calls.values() if c.parent is not None), key=lambda c: c.start_order or 0
    )
    for child in children:
        key = (child.module, child.call)
        roles = by_call.get(key)
        parent = by_seq.get(child.parent) if child.parent is not None else None
        if roles is None or parent is None or parent.seq in suspected or key in boundary_keys:
            continue
        bad_in = [r for r in roles["in"] if fails(r) and r["name"] not in moved]
        parent_in = by_call.get((parent.module, parent.call), {"in": []})["in"]
        if not bad_in or not parent_in or any(fails(r) for r in parent_in):
            continue
        if any(fails(r) for r in _outputs_ended_before(evidence, child.start_order or 0)):
            continue
        in_err, out_err = worst_rel(parent_in), worst_rel(bad_in)
        bound = max((r.get("expected_local") or 0.0) for r in bad_in)
        if out_err <= GROWTH * in_err + bound:
            continue
        reason = (
            f"inputs agree, but what it computes inline for {child.module}#{child.call} "
            f"differs (relative error {out_err:.3g}) while everything before agrees"
        )
        found.append(_Suspect(parent, bad_in, reason, True, in_err, out_err))
        suspected.add(parent.seq)
    return found


def _never_called(evidence: Evidence, call: Call, culprit: Culprit) -> Culprit:
    """A child (or the sibling just before) that the port has but never called, named
    instead of ``call``: the port skips it."""
    missing = missing_child(
        evidence.source, call, evidence.by_call, evidence.b_calls, evidence.b_modules
    )
    roles = evidence.by_call[(call.module, call.call)]
    if missing is None and roles["in"] and not all(r["ok"] for r in roles["in"]):
        missing = missing_sibling(evidence.source, call, evidence.b_calls, evidence.b_modules)
    if missing is None:
        return culprit
    return {
        **culprit,
        "name": f"{missing.module}#{missing.call}",
        "module": missing.module,
        "call": missing.call,
        "class": missing.class_name,
        "reason": (
            f"called in A, never called in B: the port skips it "
            f"({call.module}#{call.call} is the first call whose output differs)"
        ),
        "never_called_in_b": True,
    }


MAX_UNPAIRED_CHILDREN = 10  # listed on a culprit; the module tree says the rest


def _unpaired_children(evidence: Evidence, culprit: Culprit) -> list[str]:
    """The culprit's children in the reference that the port has no module for at all
    (it computes them inline: mlx-lm's SiLU where transformers has ``act_fn``)."""
    if not evidence.b_modules or culprit.get("never_called_in_b"):
        return []
    key = call_key(culprit)
    call = None if key is None else evidence.calls.get(key)
    if call is None:
        return []
    known = evidence.b_modules | (evidence.b_calls or set())
    found = []
    for child in sorted(evidence.calls.values(), key=lambda c: c.start_order):
        if child.parent == call.seq and child.module not in known and child.module not in found:
            found.append(child.module)
    return found[:MAX_UNPAIRED_CHILDREN]


def _located(evidence: Evidence, culprit: Culprit) -> Culprit:
    """Which model and which step: the culprit's top-level call (``transformer#2``: the
    denoiser's third call in a loop; ``<root>#0`` for a single model called once)."""
    key = call_key(culprit)
    call = None if key is None else evidence.calls.get(key)
    if call is None:
        return {}
    by_seq = {c.seq: c for c in evidence.calls.values()}
    top = call
    while top.parent is not None and top.parent in by_seq:
        top = by_seq[top.parent]
    return {"model": top.module, "step": top.call}


def _unexplained(evidence: Evidence, verdict: Verdict) -> list[EntryResult]:
    boundary_keys, moved = verdict.set_aside()
    return [
        r
        for r in evidence.failing
        if (r.get("module"), r.get("call")) not in boundary_keys and r["name"] not in moved
    ]


def _model_outputs(evidence: Evidence) -> list[EntryResult]:
    """The outputs of the last top-level call (the model's answer), when compared."""
    tops = [c for c in evidence.calls.values() if c.parent is None and c.end_order is not None]
    if not tops:
        return []
    last = max(tops, key=lambda c: c.end_order or 0)
    return evidence.by_call.get((last.module, last.call), {}).get("out", [])


def _seen_later(evidence: Evidence, suspect: _Suspect) -> bool:
    """Some entry of a call that started after ``suspect`` ended differs."""
    end = suspect.call.end_order
    if end is None:
        return True
    for result in evidence.failing:
        key = call_key(result)
        call = None if key is None else evidence.calls.get(key)
        if call is not None and call.start_order > end:
            return True
    return False


def _outputs_ended_before(evidence: Evidence, order: int) -> list[EntryResult]:
    """The output entries of every call that ended before ``order``."""
    return [r for r in evidence.results if r["role"] == "out" and _ended_before(evidence, r, order)]


def _ended_before(evidence: Evidence, result: EntryResult, order: int) -> bool:
    key = call_key(result)
    call = None if key is None else evidence.calls.get(key)
    return call is not None and call.end_order is not None and call.end_order < order


def _previous_top_level(evidence: Evidence, call: Call) -> Call | None:
    before = [
        c
        for c in evidence.calls.values()
        if c.parent is None and c.end_order is not None and c.end_order < call.start_order
    ]
    return max(before, key=lambda c: c.end_order or 0) if before else None


def call_key(item: EntryResult | Culprit) -> CallKey | None:
    """The (module, call) an entry or a culprit belongs to; None for a bare tensor."""
    module, call = item.get("module"), item.get("call")
    return None if module is None or call is None else (module, call)


def _earlier_models(source: Source) -> str:
    """The captures of the models a zero-edit run called before this one, as a list
    (at most five named), or "" (compare/upstream.py)."""
    listed = source.meta.get("upstream")
    if not isinstance(listed, list):
        return ""
    names = [str(i.get("capture")) for i in listed if isinstance(i, dict) and i.get("capture")]
    if len(names) > 5:
        return ", ".join([*names[:2], "…", *names[-2:]]) + f" ({len(names)} captures)"
    return ", ".join(names)


def _site(evidence: Evidence, call: Call) -> Site:
    """Where each script made this call (file:line), as captured."""
    return {
        "call": f"{call.module}#{call.call}",
        "site_a": call.site,
        "site_b": evidence.b_sites.get((call.module, call.call)),
    }


def _side_by_side(result: EntryResult) -> SideBySide:
    """The first differing input: a few values of each side and the worst element."""
    return {
        "name": result["name"],
        "head_a": result.get("head_a"),
        "head_b": result.get("head_b"),
        "worst": result.get("worst"),
        "rel_rms": result.get("rel_rms"),
        "max_abs": result.get("max_abs"),
    }


def _note(suspect: _Suspect, why: str) -> Note:
    return {
        "name": suspect.name,
        "module": suspect.call.module,
        "call": suspect.call.call,
        "entries": [r["name"] for r in suspect.bad_out],
        "rel_rms": json_number(suspect.out_err),
        "expected": max((r.get("expected") or 0.0) for r in suspect.bad_out),
        "note": why,
    }


__all__ = ["DWARF", "RULES", "Evidence", "Verdict", "decide", "first_divergence"]
