"""After a coarse comparison: where to capture in full next.

A coarse capture (``mode="summary"``, or a ``depth`` limit) names the culprit among the
calls it recorded; the next step of the coarse-to-fine workflow is to capture again,
in full, only inside that module (``start --capture NAME --capture-within MODULE``).
This says so in the comparison's ``narrow`` field, with the module's path on each side
(B's path is the one its entries were paired from, before the map).
"""

from __future__ import annotations

from ..capture.store import ROOT
from .mapping import split_name
from .records import Culprit, EntryResult, NarrowHint, WeightsHint
from .sources import Source


def is_coarse(source: Source) -> bool:
    """A summary capture, or one with a depth limit."""
    return source.meta.get("mode") == "summary" or source.meta.get("depth") is not None


def narrow_hint(
    a: Source, b: Source, culprit: Culprit | None, results: list[EntryResult]
) -> NarrowHint | None:
    """``{"within_a", "within_b", "hint"}`` when a coarse comparison named a culprit."""
    if culprit is None or culprit.get("module") is None or not (is_coarse(a) or is_coarse(b)):
        return None
    module_a = str(culprit["module"])
    module_b = module_a
    entries = set(culprit.get("entries") or [])
    for result in results:
        if result["name"] in entries and result.get("name_b"):
            parts = split_name(str(result["name_b"]))
            if parts is not None:
                module_b = parts[0]
                break
    within_a = "" if module_a == ROOT else module_a
    within_b = "" if module_b == ROOT else module_b
    both = f"--capture-within {within_a or ROOT}"
    port = "" if within_b == within_a else f" (the port: --capture-within {within_b or ROOT})"
    suffix = _model_suffix(a)
    then = (
        f"then compare NAME{suffix} with the port's NAME{suffix} (the same model of each "
        "run; the others, which lack that module, keep no tensors)"
        if suffix
        else "then compare those"
    )
    return {
        "within_a": within_a,
        "within_b": within_b,
        "hint": (
            f"capture both scripts again in full inside the culprit only: "
            f"mldbg start --capture NAME {both}{port} --run SCRIPT; {then}"
        ),
    }


def _model_suffix(source: Source) -> str:
    """``.3`` for the third model a zero-edit run captured (``NAME.3``, its capture
    listing the ones before it), else "": a fine pass of that run names it alike."""
    name = str(source.meta.get("name") or "")
    stem, dot, number = name.rpartition(".")
    if source.meta.get("upstream") and dot and stem and number.isdigit():
        return f".{number}"
    return ""


def weights_hint(a: Source, b: Source, culprit: Culprit | None) -> WeightsHint | None:
    """When the culprit's inputs agree and its outputs differ, its own parameters are the
    first suspect (a weight never loaded, transposed, converted wrongly): say how to
    audit them (``mldbg weights``), by capture name when both captures saved them."""
    if culprit is None or culprit.get("reason") != "inputs agree, outputs differ":
        return None
    from ..capture import WEIGHTS

    saved = all(s.kind == "capture" and (s.path / WEIGHTS).is_file() for s in (a, b))
    command = (
        f"mldbg weights {a.spec} {b.spec}"
        if saved
        else "mldbg weights REF.safetensors PORT.safetensors "
        "(or capture both with --capture-weights and give the capture names)"
    )
    return {
        "module": culprit.get("module"),
        "hint": f"{culprit.get('name')}: inputs agree, outputs differ: audit its parameters "
        f"first: {command}",
    }
