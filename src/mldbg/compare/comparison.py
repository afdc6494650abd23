"""Compare two sources pair by pair and name the first divergence.

Pairs are streamed: one pair's tensors are mapped, reduced chunk by chunk (judge/metrics.py)
and released before the next, so two whole models are never in memory.  The result
is the documented JSON shape (docs/verdict.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from ..capture.safetensors_header import CorruptTensorFile
from ..capture.store import ROOT
from ..errors import CORRUPT_FILE, NOTHING_COMPARABLE, NOTHING_PAIRED, UNREADABLE
from .culprit.check import check_enabled, refuse_contradictions
from .culprit.divergence import missing_child
from .culprit.moved import moved_steps
from .culprit.rules import CallKey, Verdict, call_key, first_divergence
from .judge import metrics
from .judge.better import (
    BetterReference,
    check_port_weights,
    headroom,
    judge_by_better,
    measure_port,
    open_better,
    quantized_port,
)
from .judge.bounds import (
    NO_FLOOR,
    Depths,
    amplified,
    depths,
    exact_scale,
    expected_error,
    quantization_error,
    rounding_bound,
    scale_test,
    unit_roundoff,
)
from .judge.ranges import out_of_range
from .judge.upstream import model_position, other_models_hint, upstream_of
from .pair.align import Alignment, Pair, align
from .pair.layout import Layouts
from .pair.mapping import NameMap, split_name
from .pair.missing import missing_data
from .pair.propose import merged, propose_map
from .pair.structure import identity_shifts
from .pair.transposes import layout_name
from .read.arrays import UnsupportedDtype
from .read.sources import CompareInputError, Entry, Source
from .records import (
    Boundary,
    Culprit,
    Document,
    EntryResult,
    LocalCall,
    LocalError,
    LocalErrors,
    Missing,
    OpsItem,
)
from .report.unpaired import parameter_free_apart

Progress = Callable[[int, int, str], None]


def compare_sources(
    a: Source,
    b: Source,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    names: NameMap | None = None,
    layout: str | None = None,
    replay: Source | None = None,
    better: Source | None = None,
    progress: Progress | None = None,
) -> Document:
    """Run the stages on two sources: pair, judge each pair, name the first divergence,
    attach the hints for the next step.  The result is the documented JSON shape.
    With ``better`` (a run of A that rounds less) each bound is sharpened by A's own
    error against it, or a quantized B is judged against it (``judge/better.py``)."""
    names = names or NameMap()
    improved, against = _better_run(a, b, better)
    shifted = identity_shifts(against, b, names)  # past a Dropout or Identity one tree lacks
    if shifted:
        names = dataclasses.replace(names, structure=shifted)
    alignment, proposal = _paired(against, b, names)
    layouts = Layouts(against, b, alignment, layout)
    results = _compared(against, b, alignment, rtol, atol, layouts, progress)
    strict = rtol is not None or atol is not None
    _judge_all(a, b, (alignment, layouts), results, strict, improved)
    local = local_errors(a, replay, layout=layout) if replay is not None else None
    if local is not None:
        _add_local_errors(results, local)
    _refuse_if_nothing_compared(results)
    lost = missing_data(a, b, alignment, names, results)
    moved = moved_steps(a, b, alignment, results)  # a step on the other side of a boundary
    proposal = merged(proposal, list(moved.renames.items()))
    verdict = first_divergence(
        a,
        results,
        b_calls=_b_calls(b, names),
        b_modules=_b_modules(b, names),
        local=local,
        b_sites=_b_sites(b, names),
        paired=_paired_counts(a, alignment) if _unlocalizable(a, alignment) else None,
        missing=lost,
        moved=moved.boundaries,
    )
    _mark_verdict(results, verdict)
    unpaired_a, free_a = parameter_free_apart(alignment.unpaired_a, a, verdict.culprit)
    unpaired_b, free_b = parameter_free_apart(alignment.unpaired_b, b, verdict.culprit)
    failed = sum(1 for r in results if not r["ok"])
    document: Document = {
        # Notes alone (differences beyond their bound that no output shows) never fail
        # a comparison: only a culprit, or an entry no rule set aside, does.
        "ok": (failed == 0 and verdict.rule != "missing")
        or (verdict.culprit is None and bool(verdict.notes) and not verdict.undecided),
        "a": a.describe(),
        "b": b.describe(),
        "rtol": rtol,
        "atol": atol,
        "test": "elementwise" if strict else "scale",
        "layout": layouts.describe(),
        "first_divergence": verdict.culprit,
        "boundary_differences": verdict.boundaries,
        "notes": verdict.notes,
        "decided_by": verdict.rule,
        "undecided": verdict.undecided,
        "entries": results,
        "unpaired_a": unpaired_a,
        "unpaired_b": unpaired_b,
        # parameter-free modules one side computes inline (report/unpaired.py): counted
        "unpaired_parameter_free": {"a": len(free_a), "b": len(free_b)},
        "proposed_map": proposal,
        "replay": None if replay is None else replay.describe(),
        "better": None if improved is None else improved.describe(),
        "counts": _counts(results, failed, alignment),
        "warnings": a.warnings + b.warnings + (replay.warnings if replay is not None else []),
    }
    _attach_findings(document, lost, shifted, local)
    _attach_hints(document, a, b, verdict.culprit, results)
    ops = _operations(a, b, alignment, results, names)
    if ops is not None:  # captured with ops=: which operation inside diverges first
        document["ops"] = ops
    if check_enabled():  # the test suite: a reason its entries contradict is a rule's bug
        refuse_contradictions(document)
    return document


def _attach_findings(
    document: Document,
    lost: Missing | None,
    shifted: dict[str, str],
    local: LocalErrors | None,
) -> None:
    """What the comparison found beside the verdict, where there is something."""
    if lost is not None:  # what a capture lost: never agreement
        document["missing"] = lost
    if shifted:  # paired past identity modules one tree lacks: said, never silent
        document["structure"] = {
            "renamed": shifted,
            "note": "B's modules renamed past the identity modules (Dropout, Identity) "
            "one tree has and the other lacks, so that the rest pair in order",
        }
    if local is not None:
        document["replay_culprit"] = local["culprit"]


def _better_run(
    a: Source, b: Source, better: Source | None
) -> tuple[BetterReference | None, Source]:
    """The better run, opened beside A (None without one), and the source B is measured
    against: C itself for a quantized B (the reference on B's dequantized weights), else A."""
    if better is None:
        return None, a
    return open_better(a, better), better if quantized_port(b) else a


def _judge_all(
    a: Source,
    b: Source,
    paired: tuple[Alignment, Layouts],
    results: list[EntryResult],
    strict: bool,
    improved: BetterReference | None,
) -> None:
    """Judge every entry: against A's bounds and, with a better run, beside it (a
    quantized B compared with C, on its dequantized weights, has no quantization
    allowance); then each entry's headroom."""
    alignment, layouts = paired
    quantized = _quantized(b, alignment, results)
    if improved is not None and quantized_port(b):
        check_port_weights(improved, results)
        quantized = {}  # B and C hold the same weights: B is held to its own rounding
    judge(a, results, quantized, strict=strict)
    if improved is not None:
        if improved.mode == "precision":
            measure_port(improved, b, alignment.pairs, layouts)
        judge_by_better(improved, results)
    headroom(results)


def _paired(a: Source, b: Source, names: NameMap) -> tuple[Alignment, dict[str, Any] | None]:
    """The pairs, and a proposed map when few entries paired; nothing paired at all is
    bad input (with the proposal, when there is one)."""
    alignment = align(a, b, names)
    proposal = propose_map(a, b, names) if _few_paired(a, alignment) else None
    if not alignment.pairs:
        extra: dict[str, Any] = {"proposed_map": proposal} if proposal else {}
        raise CompareInputError(
            _nothing_paired(a, b, alignment, proposal), code=NOTHING_PAIRED, **extra
        )
    return alignment, proposal


def _compared(
    a: Source,
    b: Source,
    alignment: Alignment,
    rtol: float | None,
    atol: float | None,
    layouts: Layouts,
    progress: Progress | None,
) -> list[EntryResult]:
    """Each pair's numbers, one pair's tensors in memory at a time."""
    results = []
    for done, pair in enumerate(alignment.pairs):
        if progress is not None:
            progress(done, len(alignment.pairs), pair.a.name)
        results.append(_compare_pair(a, b, pair, rtol, atol, layouts))
    if progress is not None:
        progress(len(alignment.pairs), len(alignment.pairs), "")
    return results


def _add_local_errors(results: list[EntryResult], local: LocalErrors) -> None:
    for result in results:
        found = local["entries"].get(result["name"])
        if found is not None:
            result["local"] = found
            if not found["ok"] and result["ok"]:
                # Within what upstream drift allows, but wrong on the reference's own
                # inputs: the replay is the stronger evidence (a bug hidden by the
                # noise of a 4-bit port, say), so the entry fails and says why.
                result["ok"] = False
                result["test"] = "local"


def _refuse_if_nothing_compared(results: list[EntryResult]) -> None:
    if all(r["error"] for r in results):
        first = results[0]
        raise CompareInputError(
            f"nothing could be compared: {first['name']}: {first['error']}"
            + (f" (and {len(results) - 1} more)" if len(results) > 1 else ""),
            code=NOTHING_COMPARABLE,
        )


def _mark_verdict(results: list[EntryResult], verdict: Verdict) -> None:
    """Mark the culprit's entries, set aside the differences the next module undoes, and
    note on each failing entry what a rule said of it."""
    culprit_entries = set(verdict.culprit["entries"]) if verdict.culprit else set()
    compensated = {name: b for b in verdict.boundaries for name in b["entries"]}
    for result in results:
        result["culprit"] = result["name"] in culprit_entries
        if result["name"] in compensated and not result["culprit"]:
            # A difference the next module undoes is reported, not counted as a failure.
            result["ok"] = True
            result["compensated_by"] = compensated[result["name"]]["compensated_by"]
    noted = {name: n["note"] for n in verdict.notes for name in n["entries"]}
    for result in results:
        if result["name"] in noted and not result["ok"]:
            result["note"] = noted[result["name"]]


def _counts(results: list[EntryResult], failed: int, alignment: Alignment) -> dict[str, int]:
    counts = {
        "compared": len(results),
        "passed": len(results) - failed,
        "failed": failed,
        "noted": sum(1 for r in results if r.get("note")),
        "unpaired_a": len(alignment.unpaired_a),
        "unpaired_b": len(alignment.unpaired_b),
    }
    if alignment.operations_a or alignment.operations_b:
        # tensors of operations recorded with ops=, aligned by value under "ops"
        counts["operations_a"] = alignment.operations_a
        counts["operations_b"] = alignment.operations_b
    return counts


def _attach_hints(
    document: Document,
    a: Source,
    b: Source,
    culprit: Culprit | None,
    results: list[EntryResult],
) -> None:
    """What to do next: find the line (``line``), audit the culprit's parameters, capture
    finer, compare the pipeline's other models."""
    from .report.narrow import line_call, narrow_hint, weights_hint

    line = line_call(a, b, culprit)
    if line is not None:  # the first wrong line, in both scripts: the line verb
        document["line"] = line
    audit = weights_hint(a, b, culprit, results)
    if audit is not None:  # the culprit's own parameters are the first suspect
        document["weights_hint"] = audit
    narrow = narrow_hint(a, b, culprit, results)
    if narrow is not None:  # a coarse pass: where the fine one should look
        document["narrow"] = narrow
    others = other_models_hint(a, b)
    if others is not None:  # a pipeline's first model: the others are captures of their own
        document["other_models"] = others


def _operations(
    a: Source, b: Source, alignment: Alignment, results: list[EntryResult], names: NameMap
) -> list[OpsItem] | None:
    """The operations recorded with ``ops=`` aligned by value inside each module call,
    judged by how that call's outputs fared."""
    from .culprit.ops import ModuleVerdict, compare_ops

    verdicts: dict[tuple[str, int], ModuleVerdict] = {}  # each module call's outputs
    for pair, result in zip(alignment.pairs, results, strict=True):
        if pair.a.role == "out" and pair.a.module is not None:
            key = (pair.a.module, pair.a.call or 0)
            verdicts[key] = verdicts.get(key, ModuleVerdict()).add(
                bool(result["ok"]), result.get("expected")
            )
    return compare_ops(a, b, verdicts, names)


def local_errors(a: Source, replay: Source, *, layout: str | None = None) -> LocalErrors:
    """Each reference output against the replayed port's output for the same call: the
    port module's own error on the reference's inputs, free of upstream drift.  The
    replayed capture is named like the reference (replay writes it so), so no map is
    needed.  ``culprit`` is the deepest call whose local error is out of bounds."""
    alignment = align(a, replay, NameMap())
    pairs = [p for p in alignment.pairs if p.a.role == "out"]
    sub = Alignment(pairs, [], [])
    layouts = Layouts(a, replay, sub, layout)
    results = [_compare_pair(a, replay, pair, None, None, layouts) for pair in pairs]
    quantized = _quantized(replay, sub, results)
    judge(a, results, quantized, strict=False, local=True)
    entries: dict[str, LocalError] = {}
    listed: list[LocalCall] = []
    for result in results:
        own: LocalError = {
            "rel_rms": result.get("rel_rms"),
            "rel_max": result.get("rel_max"),
            "max_abs": result.get("max_abs"),
            "expected": result.get("expected"),
            "ok": result["ok"],
            "error": result.get("error"),
        }
        entries[result["name"]] = own
        item: LocalCall = {
            "name": result["name"],
            "module": result.get("module"),
            "call": result.get("call"),
            "class": _class_of(a, result),
            **own,
        }
        quantized_port = result.get("quantized")
        if quantized_port:
            item["quantized"] = quantized_port
        listed.append(item)
    failing: dict[CallKey, list[str]] = {}
    scaled: dict[CallKey, float] = {}
    for result in results:
        key = call_key(result)
        if not result["ok"] and key is not None and key in a.calls:
            failing.setdefault(key, []).append(result["name"])
            ratio = exact_scale(result, result.get("expected") or 0.0)
            if ratio:
                scaled[key] = ratio
    by_seq = {c.seq: k for k, c in a.calls.items()}
    boundaries: list[Boundary] = []

    def ancestors(key: CallKey) -> set[CallKey]:
        found, seq = set(), a.calls[key].parent
        while seq is not None and seq in by_seq:
            found.add(by_seq[seq])
            seq = a.calls[by_seq[seq]].parent
        return found

    for key, ratio in scaled.items():
        # A constant factor is a scale moved across the boundary (applied by the parent
        # right after) when the parent's own output no longer shows it, or when other
        # calls than its ancestors fail on their own (the difference lies elsewhere).
        parent = by_seq.get(a.calls[key].parent)  # type: ignore[arg-type]
        if parent is None or parent not in a.calls:
            continue
        others = set(failing) - ancestors(key) - {key} - set(scaled)
        if parent not in failing or others:
            boundaries.append(
                {
                    "module": key[0],
                    "call": key[1],
                    "ratio": 1.0 / ratio,
                    "compensated_by": f"{parent[0]}#{parent[1]}",
                }
            )
            del failing[key]
    moved = {(b["module"], b["call"]): b["compensated_by"] for b in boundaries}
    for item in listed:
        where = moved.get((item.get("module") or "", item.get("call") or 0))
        if where is not None and not item["ok"]:
            item["ok"] = True
            item["compensated_by"] = where
            entries[item["name"]]["ok"] = True
    culprit: Culprit | None = None
    if failing:
        key = min(failing, key=lambda k: (a.calls[k].end_order or 1 << 62, a.calls[k].seq))
        call = a.calls[key]
        culprit = {
            "name": f"{call.module}#{call.call}",
            "module": call.module,
            "call": call.call,
            "class": call.class_name,
            "entries": failing[key],
        }
        missing = missing_child(
            a, call, {}, {m for m, _ in replay.calls}, _b_modules(replay, NameMap())
        )
        if missing is not None:
            culprit = {
                "name": f"{missing.module}#{missing.call}",
                "module": missing.module,
                "call": missing.call,
                "class": missing.class_name,
                "entries": failing[key],
                "never_called_in_b": True,
            }
    return {"entries": entries, "culprit": culprit, "list": listed, "boundaries": boundaries}


def _class_of(a: Source, result: EntryResult) -> str | None:
    key = call_key(result)
    call = None if key is None else a.calls.get(key)
    return call.class_name if call is not None else None


def _paired_counts(a: Source, alignment: Alignment) -> tuple[int, int]:
    return len(alignment.pairs), len(alignment.pairs) + len(alignment.unpaired_a)


def _few_paired(a: Source, alignment: Alignment) -> bool:
    """Fewer than half of A's entries paired: the names probably differ (propose a map)."""
    total = len(alignment.pairs) + len(alignment.unpaired_a)
    return bool(a.calls) and total > 0 and len(alignment.pairs) < 0.5 * total


def _unlocalizable(a: Source, alignment: Alignment) -> bool:
    """Too little paired to say where a difference begins: A has several module calls and
    fewer than two of them have an output that paired (with one, ``<root>`` say, that call would be blamed
    for everything).  Not a share of the entries: a real port pairs every module's output
    yet leaves many inputs and helper modules (rotary embeddings, activations) unpaired,
    and a verdict it earns must not be withheld for that."""
    # Only calls that hold tensors count: a fine pass inside one module (``within``)
    # lists the model's other calls on its index without any, and narrowing into a
    # leaf leaves one call to pair, which pairs whole or not at all.
    if len({e.call_key for e in a.entries if e.role == "out" and e.call_key}) < 2:
        return False
    paired_calls = {
        (pair.a.module, pair.a.call) for pair in alignment.pairs if pair.a.role == "out"
    }
    return len(paired_calls) < 2


def _b_calls(b: Source, names: NameMap) -> set[str]:
    """B's module paths in A's terms (after the map): which modules the port called."""
    found = set()
    for module, call in b.calls:
        mapped = split_name(names.to_a(f"{module}#{call}.out"))
        found.add(mapped[0] if mapped else module)
    return found


def _b_sites(b: Source, names: NameMap) -> dict[tuple[str, int], str]:
    """Call sites of B's top-level calls, keyed by A's (module, call)."""
    found = {}
    for (module, call), info in b.calls.items():
        if info.site is None:
            continue
        mapped = split_name(names.to_a(f"{module}#{call}.out"))
        found[(mapped[0], mapped[1]) if mapped else (module, call)] = info.site
    return found


def _b_modules(b: Source, names: NameMap) -> set[str] | None:
    """Every module path of B's model (in A's terms), called or not; None when the
    capture predates the module list in ``capture.json``."""
    modules = b.meta.get("modules")
    if not isinstance(modules, list):
        return None
    found = set()
    for path in modules:
        label = str(path) or ROOT
        mapped = split_name(names.to_a(f"{label}#0.out"))
        found.add(mapped[0] if mapped else label)
    return found


def _quantized(b: Source, alignment: Alignment, results: list[EntryResult]) -> dict[CallKey, float]:
    """Mark the entries whose port module is quantized; their A calls' expected error."""
    found: dict[CallKey, float] = {}
    for pair, result in zip(alignment.pairs, results, strict=True):
        key = pair.b.call_key
        call = b.calls.get(key) if key is not None else None
        quant = call.quant if call is not None else None
        if not quant:
            continue
        result["quantized"] = {"bits": quant.get("bits"), "group_size": quant.get("group_size")}
        if pair.a.call_key is not None and quant.get("bits") and quant.get("group_size"):
            found[pair.a.call_key] = quantization_error(quant["bits"], quant["group_size"])
    return found


def judge(
    a: Source,
    results: list[EntryResult],
    quantized: dict[CallKey, float],
    *,
    strict: bool,
    local: bool = False,
) -> None:
    """Decide each entry's ``ok``: the element-wise test when tolerances were given or the
    dtypes are exact, else the scale-aware test against the expected error at its depth
    (``local``: the depth is the call's own subtree, as for a replayed call).

    An ill-conditioned call may amplify the error its inputs arrive with (``verdict.
    amplified``), but only an error that is itself explained: a call's inputs must pass
    before their error widens its bound, or a bug's error would excuse everything
    downstream of it.  Passing inputs can make the next amplifying call's inputs pass
    (two attentions in a row), so the entries are judged again until that set stops
    growing (each round adds calls, so at most one round per call; in practice a few)."""
    errors = _input_errors(results)
    explained: set[tuple[str, int]] = set()
    earlier = upstream_of(a)  # a later model of a pipeline: what ran before it
    for _round in range(len(a.calls) + 1):
        floors = amplified(a.calls, {k: e for k, e in errors.items() if k in explained})
        depth_of = depths(a, quantized, floors, (earlier.leaves, earlier.floor))
        _judge_entries(a, results, quantized, depth_of, strict, local)
        passing = _inputs_passing(results) & errors.keys()
        if passing <= explained:
            return
        explained |= passing


def _inputs_passing(results: list[EntryResult]) -> set[tuple[str, int]]:
    """The calls whose compared inputs all pass, with no quantization noise among them:
    that noise has its own allowance, measured over whole quantized models with
    whatever their attentions make of it (``verdict.QUANT_C``), and is not rounding."""
    seen: dict[tuple[str, int], bool] = {}
    for result in results:
        key = call_key(result)
        if result.get("role") != "in" or key is None:
            continue
        clean = bool(result.get("ok")) and not result.get("quant_noise")
        seen[key] = seen.get(key, True) and clean
    return {key for key, ok in seen.items() if ok}


def _judge_entries(
    a: Source,
    results: list[EntryResult],
    quantized: dict[CallKey, float],
    depth_of: Depths,
    strict: bool,
    local: bool,
) -> None:
    for position, result in enumerate(results):
        # The element-wise verdict as the metrics gave it (kept when judged again).
        elementwise = result["elementwise_ok"] if "elementwise_ok" in result else result.get("ok")
        result["elementwise_ok"] = elementwise
        result.pop("conditioning", None)
        u = unit_roundoff(result.get("dtype_a") or "", result.get("dtype_b") or "")
        key = call_key(result)
        own = None
        floor = NO_FLOOR
        if key is not None and key in a.calls:
            own = (depth_of.leaves[key], depth_of.quant_inside[key])
            if local:
                depth, quant = own
                floor = depth_of.cond_inside[key]
            elif result["role"] == "in":
                depth, quant = depth_of.before[key], depth_of.quant_before[key]
                floor = depth_of.cond_before[key]
            else:
                depth, quant = depth_of.through[key], depth_of.quant_through[key]
                floor = depth_of.cond_through[key]
        else:
            depth, quant = position, 0.0
        result["depth"] = depth
        if quant:
            result["quant_noise"] = quant  # quantized port modules upstream (or itself)
        expected = expected_error(u, depth, quant, floor)
        result["expected"] = expected
        if u is not None and floor.source is not None and floor.bound > rounding_bound(u, depth):
            # The bound is set by an ill-conditioned op (a sine of a large argument), not
            # by rounding: say which one and what was measured there.
            result["conditioning"] = {
                "bound": floor.bound,
                "from": f"{floor.source[0]}#{floor.source[1]}",
                "sensitivity": floor.sensitivity,
            }
            if floor.amplification is not None:
                # ... by how much that call amplifies the error its inputs arrived with.
                result["conditioning"]["amplification"] = floor.amplification
                result["conditioning"]["input_rel_rms"] = floor.input_rel_rms
        if own is not None and result["role"] == "out":
            # Its own rounding and, for a quantized module, its own quantization; the
            # noise of quantized submodules shows in their outputs, not here.
            assert key is not None
            result["expected_local"] = expected_error(
                u, own[0], quantized.get(key, 0.0), depth_of.cond_inside[key]
            )
        if result.get("error") or expected is None:
            result["test"] = "elementwise" if expected is None else "error"
            continue
        result["scale_ok"] = scale_test(result, expected, check_max=not quant)
        result["test"] = "elementwise" if strict else "scale"
        if not strict:
            result["ok"] = result["scale_ok"]
        _mark_out_of_range(result)


def _mark_out_of_range(result: EntryResult) -> None:
    """Say when the port's dtype could not hold the values (an fp16 overflow's inf): the
    entry's statistics cover its finite elements only, and would not."""
    result.pop("out_of_range", None)
    found = out_of_range(result)
    if found is not None:
        result["out_of_range"] = found


def _input_errors(results: list[EntryResult]) -> dict[tuple[str, int], float]:
    """Per call, the worst measured relative RMS error of its float inputs."""
    found: dict[tuple[str, int], float] = {}
    for result in results:
        error = result.get("rel_rms")
        if result.get("role") != "in" or result.get("module") is None:
            continue
        if unit_roundoff(result.get("dtype_a") or "", result.get("dtype_b") or "") is None:
            continue  # integer ids, masks: compared exactly, no relative error to amplify
        key = call_key(result)
        if not isinstance(error, int | float) or not math.isfinite(error) or key is None:
            continue
        found[key] = max(found.get(key, 0.0), float(error))
    return found


def _nothing_paired(
    a: Source, b: Source, alignment: Alignment, proposal: dict[str, Any] | None
) -> str:
    def some(names: list[str]) -> str:
        return ", ".join(names[:5]) + (" …" if len(names) > 5 else "")

    if not alignment.unpaired_a or not alignment.unpaired_b:
        empty = a if not alignment.unpaired_a else b
        if empty.meta.get("index_only"):  # a pipeline's model without the within module
            return (
                f"{empty.label} has no tensors to compare: it was captured index-only, "
                f"lacking the module within={empty.meta.get('within')!r} that another model "
                "of its run has (compare that model's capture, NAME.k)"
            )
        if empty.not_written:  # a byte budget of 0, or one the first call used up
            return (
                f"{empty.label} has no tensors to compare: its {empty.not_written} tensor(s) "
                f"were recorded but not written (first {empty.first_not_written})"
            )
        return f"{empty.label} has no tensors to compare"
    hint = (
        " (a map proposed from the module trees is in proposed_map; "
        "write it with --propose-map FILE and pass it as --map FILE)"
        if proposal
        else ""
    )
    others = other_models_hint(a, b)
    if others is not None and (
        "counterpart_b" in others or model_position(a) != model_position(b)
    ):  # ref.2 against port, or T5 against CLIP: not the same model
        hint += f". {others['hint']}"
    return (
        f"no tensor names in common: {a.label} has {some(alignment.unpaired_a)}; "
        f"{b.label} has {some(alignment.unpaired_b)}. Map B's names onto A's with --map FILE" + hint
    )


def _compare_pair(
    a: Source, b: Source, pair: Pair, rtol: float | None, atol: float | None, layouts: Layouts
) -> EntryResult:
    ea, eb = pair.a, pair.b
    result: EntryResult = {
        "name": ea.name,
        "module": ea.module,
        "call": ea.call,
        "role": ea.role,
        "shape_a": ea.shape,
        "shape_b": eb.shape,
        "dtype_a": ea.dtype,
        "dtype_b": eb.dtype,
        "transpose": None,
        "layout": None,
    }
    if pair.b_name != ea.name:
        result["name_b"] = pair.b_name
        result["paired_by"] = pair.how
    default_rtol, default_atol = metrics.default_tolerance(ea.dtype, eb.dtype)
    result["rtol"] = default_rtol if rtol is None else rtol
    result["atol"] = default_atol if atol is None else atol
    view = _view(pair, layouts, result)
    if view is None:
        _verify(a, ea)  # an index that lies about a file is bad input, not a divergence
        _verify(b, eb)
        same = _count(ea.shape) == _count(eb.shape)
        return _failed(
            result,
            f"shapes differ: {ea.shape} vs {eb.shape}"
            + (" (same number of elements: a reshape?)" if same else ""),
        )
    permutation = view.permutation
    if view.split and permutation is not None and (ea.stats is None) != (eb.stats is None):
        # a sketch of one side cannot be laid out like the other's tensor
        return _failed(result, f"shapes differ: {ea.shape} vs {eb.shape} (one side a summary)")
    if ea.stats is not None or eb.stats is not None:  # a summary capture on either side
        from .judge.sketched import compare_summaries

        result.update(compare_summaries(a, b, ea, eb, permutation, result["rtol"], result["atol"]))
        return result
    try:
        array_a = a.load(ea)
        array_b = b.load(eb)
    except UnsupportedDtype as exc:
        return _failed(result, str(exc))
    except CorruptTensorFile as exc:
        raise CompareInputError(str(exc), code=CORRUPT_FILE) from None
    except OSError as exc:
        raise CompareInputError(
            f"cannot read {exc.filename or ea.file}: {exc.strerror}", code=UNREADABLE
        ) from None
    # Unit axes dropped or added, merged axes split: views of the stored (contiguous)
    # tensors, no copy.
    if view.shape_a is not None:
        array_a = array_a.reshape(view.shape_a)
    if view.shape_b is not None:
        array_b = array_b.reshape(view.shape_b)
    try:
        numbers = metrics.compare_arrays(
            array_a, array_b, rtol=result["rtol"], atol=result["atol"], permutation=permutation
        )
    except TypeError as exc:  # complex and other dtypes the metrics do not define
        return _failed(result, str(exc))
    result.update(numbers)
    result["error"] = None
    return result


@dataclasses.dataclass(frozen=True)
class _View:
    """How a pair's two tensors are laid side by side: each reshaped (a view) when given,
    then B transposed by ``permutation``."""

    permutation: tuple[int, ...] | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    split: bool = False  # merged axes split: a tensor's sketch cannot follow


def _view(pair: Pair, layouts: Layouts, result: EntryResult) -> _View | None:
    """How A's and B's shapes meet (recorded on ``result``), or None when they do not:
    equal; a channels-last transpose; only axes of size 1 apart (a batch of one kept on
    one side, squeezed on the other: the same elements in the same order); or axes one
    side merged, split again (``(B, C, H*W)`` against ``(B, H, W, C)``)."""
    shape_a, shape_b = list(pair.a.shape), list(pair.b.shape)
    permutation = layouts.permutation(pair)
    if permutation is not None:
        result["transpose"] = list(permutation)
        result["layout"] = layout_name(permutation)
        return _View(permutation)
    if shape_a == shape_b:
        return _View()
    if _squeezed(shape_a) == _squeezed(shape_b):
        result["reshape"] = "unit axes"
        return _View(shape_b=tuple(shape_a))
    merged = layouts.merged(pair)
    if merged is None:
        return None
    result["reshape"] = "axes merged"
    result["layout"] = merged.name
    if merged.permutation is not None:
        result["transpose"] = list(merged.permutation)
    return _View(merged.permutation, merged.shape_a, merged.shape_b, split=True)


def _verify(source: Source, entry: Entry) -> None:
    """``source.verify(entry)``, its failures as compare's bad input (exit 2)."""
    try:
        source.verify(entry)
    except CorruptTensorFile as exc:
        raise CompareInputError(str(exc), code=CORRUPT_FILE) from None
    except OSError as exc:
        raise CompareInputError(
            f"cannot read {exc.filename or entry.file}: {exc.strerror}", code=UNREADABLE
        ) from None


def _squeezed(shape: list[int]) -> list[int]:
    return [int(n) for n in shape if int(n) != 1]


def _count(shape: list[int]) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


def _failed(result: EntryResult, error: str) -> EntryResult:
    """``result`` with every metric ``None``, failed for ``error``."""
    result.update(_empty_metrics())
    result["error"] = error
    result["ok"] = False
    return result


def _empty_metrics() -> EntryResult:
    """Every metric ``None``: nothing was measured (an error, a shape mismatch)."""
    return {
        "max_abs": None,
        "mean_abs": None,
        "max_rel": None,
        "cosine": None,
        "range_a": None,
        "range_b": None,
        "range_ratio": None,
        "rel_rms": None,
        "rel_max": None,
        "rms_a": None,
        "rms_b": None,
        "largest": None,
        "min_atol": None,
        "mismatched": None,
        "nonfinite_mismatched": None,
        "numel": None,
        "head_a": None,
        "head_b": None,
        "worst": None,
        "nan_a": None,
        "nan_b": None,
        "inf_a": None,
        "inf_b": None,
        "finite_pairs": None,
        "port_nonfinite": None,
        "nonfinite_at": None,
    }
