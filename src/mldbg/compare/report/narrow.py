"""After a coarse comparison: where to capture in full next.

A coarse capture (``mode="summary"``, or a ``depth`` limit) names the culprit among the
calls it recorded; the next step of the coarse-to-fine workflow is to capture again,
in full, only inside that module (``start --capture NAME --capture-within MODULE``).
This says so in the comparison's ``narrow`` field, with the module's path on each side
(B's path is the one its entries were paired from, before the map).
"""

from __future__ import annotations

import shlex

from ...capture.budget import size_text
from ...capture.store import ROOT
from ..pair.mapping import split_name
from ..read.arrays import numpy_dtype
from ..read.sources import Entry, Source
from ..records import Culprit, EntryResult, NarrowHint, WeightsHint


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
    module_a = str(culprit["module"])
    module_b = path_in_b(culprit, results)
    within_a = "" if module_a == ROOT else module_a
    within_b = "" if module_b == ROOT else module_b
    full = fine_pass_bytes(a, module_a)
    limits = [n for n in (_budget_limit(a), _budget_limit(b)) if n is not None]
    limit = min(limits) if limits else None
    summary = full is not None and limit is not None and full > limit and _has_children(a, module_a)
    # Quoted for a shell: "<root>" unquoted is a redirection, and a module path comes from
    # the capture's index, which may hold anything ("x; rm -rf ~").
    where = f"--capture-within {shlex.quote(within_a or ROOT)}"
    port = (
        ""
        if within_b == within_a
        else f" (the port: --capture-within {shlex.quote(within_b or ROOT)})"
    )
    cost = f" (about {size_text(full)})" if full is not None else ""
    suffix = _model_suffix(a)
    then = (
        f"then compare NAME{suffix} with the port's NAME{suffix} (the same model of each "
        "run; the others, which lack that module, keep no tensors)"
        if suffix
        else "then compare those"
    )
    if summary:
        assert full is not None and limit is not None
        hint = (
            f"a full capture inside the culprit would write about {size_text(full)}, over "
            f"the {size_text(limit)} budget: capture both scripts again as summaries one "
            f"level down inside it: mldbg start --capture NAME {where} --capture-mode summary "
            f"--capture-depth 1 --capture-budget {size_text(limit)}{port} --run SCRIPT; "
            f"{then}, and narrow again"
        )
    else:
        hint = (
            f"capture both scripts again in full inside the culprit only{cost}: "
            f"mldbg start --capture NAME {where}{port} --run SCRIPT; {then}"
        )
    return {
        "within_a": within_a,
        "within_b": within_b,
        "mode": "summary" if summary else "full",
        "full_bytes": full,
        "hint": hint,
    }


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


def line_call(a: Source, b: Source, culprit: Culprit | None) -> dict[str, object] | None:
    """After a module or glue verdict on two captures of runs: the ``line`` call that
    names the first wrong line of the port (``{"verb", "args"}``, worded by each surface)."""
    if culprit is None or culprit.get("module") is None:
        return None
    if a.kind != "capture" or b.kind != "capture":
        return None
    return {"verb": "line", "args": {"a": a.spec, "b": b.spec}}


def weights_hint(a: Source, b: Source, culprit: Culprit | None) -> WeightsHint | None:
    """When the culprit's inputs agree and its outputs differ, its own parameters are the
    first suspect (a weight never loaded, transposed, converted wrongly): say how to
    audit them (``mldbg weights``), by capture name when both captures saved them."""
    if culprit is None or culprit.get("reason") != "inputs agree, outputs differ":
        return None
    from ...capture import WEIGHTS

    saved = all(s.kind == "capture" and (s.path / WEIGHTS).is_file() for s in (a, b))
    command = (
        f"mldbg weights {shlex.quote(a.spec)} {shlex.quote(b.spec)}"
        if saved
        else "mldbg weights REF.safetensors PORT.safetensors "
        "(or capture both with --capture-weights and give the capture names)"
    )
    return {
        "module": culprit.get("module"),
        "hint": f"{culprit.get('name')}: inputs agree, outputs differ: audit its parameters "
        f"first: {command}",
    }
