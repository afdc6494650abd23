"""After a coarse comparison: where to capture in full next.

A coarse capture (``mode="summary"``, or a ``depth`` limit) names the culprit among the
calls it recorded; the next step of the coarse-to-fine workflow is to capture again,
in full, only inside that module (``start --capture NAME --capture-within MODULE``).
This says so in the comparison's ``narrow`` field, with the module's path on each side
(B's path is the one its entries were paired from, before the map).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, cast

from ...capture.budget import size_text
from ...capture.store import ROOT
from ...store.runs import SETTINGS_ENV, started_as
from ..pair.mapping import split_name
from ..read.arrays import numpy_dtype
from ..read.sources import Entry, Source
from ..records import Culprit, EntryResult, NarrowHint, WeightsHint

if TYPE_CHECKING:
    from ...results import Call


def is_coarse(source: Source) -> bool:
    """A summary capture, or one with a depth limit."""
    return source.meta.get("mode") == "summary" or source.meta.get("depth") is not None


def narrow_hint(
    a: Source, b: Source, culprit: Culprit | None, results: list[EntryResult]
) -> NarrowHint | None:
    """``{"within_a", "within_b", "mode", "full_bytes", "hint"}`` when a coarse comparison
    named a culprit: capture in full inside it, or, when that would take more than the
    coarse pass's byte budget, as summaries one level down inside it (a third pass then
    goes in full inside the module that one names)."""
    if culprit is None or culprit.get("module") is None or not (is_coarse(a) or is_coarse(b)):
        return None
    module_a = _narrowed_module(a, culprit)
    module_b = path_in_b(culprit, results)
    within_a = "" if module_a == ROOT else module_a
    within_b = "" if module_b == ROOT else module_b
    full = fine_pass_bytes(a, module_a)
    limits = [n for n in (_budget_limit(a), _budget_limit(b)) if n is not None]
    limit = min(limits) if limits else None
    summary = full is not None and limit is not None and full > limit and _has_children(a, module_a)
    suffix = _model_suffix(a)
    fine_a, fine_b = _fine_name(a), _fine_name(b)
    options: dict[str, object] = {}
    if summary and limit is not None:
        options = {
            "capture_mode": "summary",
            "capture_depth": 1,
            "capture_budget": size_text(limit),
        }
    calls: list[Call] = [
        _rerun(a, fine_a, capture_within=within_a or ROOT, **options),
        _rerun(b, fine_b, capture_within=within_b or ROOT, **options),
        {"verb": "compare", "args": {"a": fine_a + suffix, "b": fine_b + suffix}},
    ]
    then = (
        f"then compare {fine_a}{suffix} with {fine_b}{suffix} (the same model of each run; "
        "the others, which lack that module, keep no tensors)"
        if suffix
        else f"then compare {fine_a} with {fine_b}"
    )
    if summary:
        assert full is not None and limit is not None
        hint = (
            f"a full capture inside the culprit would write about {size_text(full)}, over "
            f"the {size_text(limit)} budget: capture both scripts again as summaries one "
            f"level down inside it, {then}, and narrow again"
        )
    else:
        cost = f" (about {size_text(full)})" if full is not None else ""
        hint = f"capture both scripts again in full inside the culprit only{cost}, {then}"
    return {
        "within_a": within_a,
        "within_b": within_b,
        "mode": "summary" if summary else "full",
        "full_bytes": full,
        "hint": hint,
        "calls": calls,
    }


def _fine_name(source: Source, suffix: str = "-fine") -> str:
    """The name a finer capture of ``source``'s run gets: its own with ``-fine`` for a
    ``-coarse`` (``ref-coarse`` -> ``ref-fine``) or added (a model number ``.k`` is left
    out: the capture adds it to the model that has the module)."""
    name = str(source.meta.get("name") or source.path.name)
    stem, dot, number = name.rpartition(".")
    base = stem if dot and stem and number.isdigit() else name
    for coarse in ("-coarse", "_coarse"):
        base = base.removesuffix(coarse)
    return base + suffix


def _rerun(source: Source, capture: str, **options: object) -> Call:
    """The ``start`` call that runs ``source``'s script again as its run was started
    (``store.runs.started_as``), capturing as ``capture`` with ``options``; ``SCRIPT``
    where the run is not known (a directory of tensor files, a script run without start)."""
    started = started_as(source.path.parent.parent) if source.kind == "capture" else None
    args: dict[str, object] = {"script": "SCRIPT"}
    if started is not None:
        added = cast("dict[str, str]", started.pop("env"))  # started_as always says it
        args = {k: v for k, v in started.items() if v or k in ("script", "module")}
        if env := {k: v for k, v in added.items() if k not in SETTINGS_ENV}:
            args["env"] = env
    args.update(capture=capture, **options, stop_on_entry=False)
    return {"verb": "start", "args": args}


def _narrowed_module(a: Source, culprit: Culprit) -> str:
    """Where the fine pass should look: the culprit, or, for a module the port never
    calls, the call whose outputs differ because of it (a pass inside the skipped module
    would find nothing of the port's to compare)."""
    module = str(culprit["module"])
    if not culprit.get("never_called_in_b"):
        return module
    call = a.calls.get((module, int(culprit.get("call") or 0)))
    parents = {c.seq: c for c in a.calls.values()}
    parent = parents.get(call.parent) if call is not None and call.parent is not None else None
    return parent.module if parent is not None else module


def path_in_b(culprit: Culprit, results: list[EntryResult]) -> str:
    """The culprit's module path in B, as B's entries of it were named before the map."""
    module = str(culprit.get("module"))
    entries = set(culprit.get("entries") or [])
    for result in results:
        if result["name"] in entries and result.get("name_b"):
            parts = split_name(str(result["name_b"]))
            if parts is not None:
                return parts[0]
    return module


def fine_pass_bytes(source: Source, module: str) -> int | None:
    """About what a full capture inside ``module`` (every call of it) would write: the
    tensors of its recorded calls exactly (a summary keeps each tensor's shape and
    dtype), and each call below the coarse pass's depth (recorded without tensors) at
    the size of its closest recorded ancestor's own call.  None when the culprit's calls
    are not in the source (a directory of tensor files)."""
    by_seq = {call.seq: call for call in source.calls.values()}
    roots = [call.seq for call in source.calls.values() if call.module == module]
    if not roots:
        return None
    children: dict[int, list[int]] = {}
    for call in by_seq.values():
        if call.parent is not None:
            children.setdefault(call.parent, []).append(call.seq)
    sizes: dict[tuple[str, int], int] = {}
    for entry in source.entries:
        if entry.call_key is not None and not source.is_operation(entry):
            sizes[entry.call_key] = sizes.get(entry.call_key, 0) + _entry_bytes(entry)
    total = 0
    pending = [(seq, 0) for seq in roots]
    while pending:
        seq, inherited = pending.pop()
        call = by_seq[seq]
        own = sizes.get((call.module, call.call))
        size = inherited if own is None else own
        total += size
        pending.extend((child, size) for child in children.get(seq, []))
    return total


def _entry_bytes(entry: Entry) -> int:
    count = 1
    for dim in entry.shape:
        count *= max(int(dim), 0)
    try:
        width = numpy_dtype(entry.dtype).itemsize
    except Exception:  # a dtype numpy has no name for: counted as 4 bytes
        width = 4
    return count * width


def _budget_limit(source: Source) -> int | None:
    limit = source.meta.get("budget_limit")
    return int(limit) if isinstance(limit, int | float) and limit > 0 else None


def _has_children(source: Source, module: str) -> bool:
    """Whether any call of ``module`` contains a module call (a leaf cannot be narrowed)."""
    seqs = {call.seq for call in source.calls.values() if call.module == module}
    return any(call.parent in seqs and not call.is_operation for call in source.calls.values())


def _model_suffix(source: Source) -> str:
    """``.3`` for the third model a zero-edit run captured (``NAME.3``, its capture
    listing the ones before it), else "": a fine pass of that run names it alike."""
    name = str(source.meta.get("name") or "")
    stem, dot, number = name.rpartition(".")
    if source.meta.get("upstream") and dot and stem and number.isdigit():
        return f".{number}"
    return ""


def line_call(a: Source, b: Source, culprit: Culprit | None) -> Call | None:
    """After a module or glue verdict on two captures of runs: the ``line`` call that
    names the first wrong line of the port (``{"verb", "args"}``, worded by each surface)."""
    if culprit is None or culprit.get("module") is None:
        return None
    if a.kind != "capture" or b.kind != "capture":
        return None
    return {"verb": "line", "args": {"a": a.spec, "b": b.spec}}


# Classes that hold no parameters (an activation, a dropout, an identity, a softmax), for a
# capture made before captures recorded which modules hold none (``parameter_free``).
_PARAMETER_FREE_CLASS = re.compile(
    r"^(SiLU|GELU|ReLU\d*|LeakyReLU|Tanh|Sigmoid|Softmax|Softplus|Mish|Hardswish|"
    r"Dropout\d?d?|Identity|Flatten|Unflatten|Upsample)$"
)


def weights_hint(
    a: Source, b: Source, culprit: Culprit | None, results: list[EntryResult]
) -> WeightsHint | None:
    """When the culprit's inputs agree and its outputs differ, its own parameters are the
    first suspect (a weight never loaded, transposed, converted wrongly): say how to
    audit them (the ``weights`` verb), by capture name when both captures saved them,
    else after capturing both again with their parameters saved.

    Only where parameters can explain it: not for values the port's dtype could not hold
    (an overflow: the fix is a wider dtype), not for a module that holds none (an
    activation, a dropout: the capture's ``parameter_free``), and not for a call all of
    whose children's outputs agree: their parameters are fine, and what differs was
    computed inline (an attention's softmax or rotary embedding between its projections)."""
    if culprit is None or not str(culprit.get("reason", "")).startswith(
        "inputs agree, outputs differ"
    ):
        return None
    if culprit.get("out_of_range") or _parameter_free(a, culprit):
        return None
    if _children_agree(a, culprit, results):
        return None
    from ...capture import WEIGHTS

    saved = all(s.kind == "capture" and (s.path / WEIGHTS).is_file() for s in (a, b))
    head = f"{culprit.get('name')}: inputs agree, outputs differ: audit its parameters first"
    if saved:
        calls: list[Call] = [{"verb": "weights", "args": {"reference": a.spec, "port": b.spec}}]
        return {"module": culprit.get("module"), "hint": head, "calls": calls}
    with_weights, port_weights = _fine_name(a, "-weights"), _fine_name(b, "-weights")
    calls = [
        _rerun(a, with_weights, capture_weights=True),
        _rerun(b, port_weights, capture_weights=True),
        {"verb": "weights", "args": {"reference": with_weights, "port": port_weights}},
    ]
    return {
        "module": culprit.get("module"),
        "hint": f"{head} (the captures did not save them: capture both again with their "
        "parameters, or give the weights verb the two checkpoint files)",
        "calls": calls,
    }


def _parameter_free(source: Source, culprit: Culprit) -> bool:
    """The culprit's module holds no parameter, as its capture recorded (by its class for
    a capture that did not record it)."""
    recorded = source.meta.get("parameter_free")
    if isinstance(recorded, list):
        return culprit.get("module") in recorded
    return bool(_PARAMETER_FREE_CLASS.match(str(culprit.get("class") or "")))


def _children_agree(a: Source, culprit: Culprit, results: list[EntryResult]) -> bool:
    """The culprit's call has children with compared outputs, and all of them agree."""
    call = a.calls.get((str(culprit.get("module")), int(culprit.get("call") or 0)))
    if call is None:
        return False
    children = {(c.module, c.call) for c in a.calls.values() if c.parent == call.seq}
    outputs = [
        r
        for r in results
        if r.get("role") == "out" and (r.get("module"), r.get("call")) in children
    ]
    return bool(outputs) and all(r["ok"] for r in outputs)
