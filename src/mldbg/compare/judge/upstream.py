"""A later model of a pipeline captured without editing: what the models before it rounded.

``start --capture NAME`` makes one capture per model (``NAME``, ``NAME.2``, ...): the
text encoders, the denoiser, the VAE.  The VAE's first inputs are computed from the
denoiser's outputs, so a clean port gives it inputs that already differ by everything
the earlier models rounded (and by what their ill-conditioned ops, a timestep embedding's
sine of ~1000, made of one rounding step).  Judged alone, that capture's first call
would read "the two runs were given different inputs".

So each such capture's ``capture.json`` lists its ``upstream``: the earlier captures of
its process and how many of their calls had ended when it opened (``[{"capture",
"ended"}]``).  From the reference's own upstream captures (never the port's, as for every
floor) compare takes the leaf calls that had ended then, added to every entry's depth,
and the largest conditioning floor among them (their measured sensitivity, see
:mod:`.verdict`), which rides on everything after it as it does within one capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...capture.store import check_capture_name
from ...store.reading import read_json
from ..read.sources import Source, open_capture
from ..records import OtherModels
from .bounds import COND_C, NO_FLOOR, Floor

MAX_UPSTREAM = 64  # captures listed (a process opens at most that many models)


@dataclass
class Upstream:
    """What the earlier models of the reference's process left on its inputs."""

    leaves: int = 0  # leaf calls that ended before this capture opened
    floor: Floor = NO_FLOOR  # the largest conditioning floor among them
    captures: list[str] = field(default_factory=list)  # their names, in order
    missing: list[str] = field(default_factory=list)  # listed but not found (warned)


NONE = Upstream()


def upstream_of(source: Source) -> Upstream:
    """The earlier captures ``source``'s process made before it (its ``upstream``)."""
    listed = source.meta.get("upstream")
    if source.kind != "capture" or not isinstance(listed, list) or not listed:
        return NONE
    found = Upstream()
    for item in listed[:MAX_UPSTREAM]:
        name, ended = _item(item)
        if name is None:
            continue
        found.captures.append(name)
        directory = source.path.parent / name
        try:
            earlier = open_capture(name, directory)
        except Exception:  # gone, or unreadable: say so, judge without it
            found.missing.append(name)
            continue
        parents = {c.parent for c in earlier.calls.values() if c.parent is not None}
        for key, call in earlier.calls.items():
            if call.end is None or call.end >= ended:
                continue
            if call.seq not in parents:
                found.leaves += 1
            if call.sensitivity:
                bound = COND_C * call.sensitivity
                if bound > found.floor.bound:
                    found.floor = Floor(bound, (f"{name}:{key[0]}", key[1]), call.sensitivity)
    warning = (
        f"{source.label}: the earlier models' captures {', '.join(found.missing)} are "
        "gone: its first inputs are judged as if nothing ran before it"
    )
    if found.missing and warning not in source.warnings:
        source.warnings.append(warning)
    return found


def _item(item: Any) -> tuple[str | None, int]:
    if not isinstance(item, dict):
        return None, 0
    name, ended = item.get("capture"), item.get("ended")
    try:
        name = check_capture_name(str(name))  # a sibling directory's name, never a path
    except ValueError:
        return None, 0
    return name, ended if isinstance(ended, int) and ended > 0 else 0


MAX_LISTED = 20  # later models named in the hint (a process captures at most 64)


def later_models(source: Source) -> list[str]:
    """The captures of the models ``source``'s run called after it, when ``source`` is
    the first model of a zero-edit run (they list it first among their ``upstream``)."""
    if source.kind != "capture" or source.meta.get("upstream"):
        return []
    name = source.meta.get("name") or source.path.name
    found: list[tuple[int, str]] = []
    for meta_path in source.path.parent.glob("*/capture.json"):
        try:
            meta = read_json(meta_path)  # regular files only: a FIFO never blocks
        except (OSError, ValueError):
            continue
        listed = meta.get("upstream") if isinstance(meta, dict) else None
        first = listed[0] if isinstance(listed, list) and listed else None
        if isinstance(first, dict) and first.get("capture") == name:
            found.append((len(listed or ()), str(meta.get("name") or meta_path.parent.name)))
    return [n for _, n in sorted(found)]


def model_position(source: Source) -> int:
    """Which model of its zero-edit run ``source`` is: 1 + the captures before it."""
    listed = source.meta.get("upstream") if source.kind == "capture" else None
    return 1 + len(listed) if isinstance(listed, list) else 1


def other_models_hint(a: Source, b: Source) -> OtherModels | None:
    """When ``a`` and ``b`` are the first of several models their runs captured (``start
    --capture`` on a pipeline: text encoder ``NAME``, denoiser ``NAME.2``...), say that
    this comparison covers that one only, and how to compare the others.  When they are
    not the same model of their runs (``ref.2`` against ``port``), say that instead."""
    models_a, models_b = later_models(a), later_models(b)
    name_a = str(a.meta.get("name") or a.path.name)
    name_b = str(b.meta.get("name") or b.path.name)
    elsewhere = counterpart_elsewhere(a, b)
    if elsewhere is not None:
        return {
            "models_a": models_a[:MAX_LISTED],
            "models_b": models_b[:MAX_LISTED],
            "hint": f"most of {name_a}'s modules are not in {name_b} but in {elsewhere}, "
            f"another capture of its run: did the runs call their models in another order? "
            f"compare {name_a} with {elsewhere}",
            "counterpart_b": elsewhere,
        }
    at_a, at_b = model_position(a), model_position(b)
    if at_a != at_b:
        return {
            "models_a": models_a[:MAX_LISTED],
            "models_b": models_b[:MAX_LISTED],
            "hint": f"{name_a} is model {at_a} of its run and {name_b} model {at_b} of its "
            "own: compare the same model of each run (NAME.k with NAME.k)",
        }
    if not models_a and not models_b:
        return None
    pairs = [f"mldbg compare {m} {name_b}{m[len(name_a) :]}" for m in models_a[:3]]
    more = "…" if len(models_a) > len(pairs) else ""
    hint = (
        f"this compares the first model of each run only; the reference's run captured "
        f"{len(models_a) + 1} models, the port's {len(models_b) + 1}: compare the others "
        f"model by model" + (f" ({'; '.join(pairs)}{more})" if pairs else "")
    )
    if len(models_a) != len(models_b):
        hint += ": the runs did not call as many models (a model called in only one of them?)"
    elif a.one_model or b.one_model:  # NAME.1: the pipeline was left out on purpose
        hint += f"; mldbg compare {name_a} {name_b} compares them all in one verdict"
    return {"models_a": models_a[:MAX_LISTED], "models_b": models_b[:MAX_LISTED], "hint": hint}


def counterpart_elsewhere(a: Source, b: Source) -> str | None:
    """When ``a`` and ``b`` share no module path but another capture of ``b``'s run has
    most of ``a``'s (its ``capture.json`` lists every module it kept), its name: the two
    runs called their models in another order (T5 before CLIP), so ``NAME.2`` is not the
    same model in both."""
    if a.kind != "capture" or b.kind != "capture":
        return None
    ours = {str(p) for p in a.meta.get("modules") or [] if p}
    theirs = {str(p) for p in b.meta.get("modules") or [] if p}
    if len(ours) < 2 or len(ours & theirs) * 2 > len(ours):
        return None
    best, best_share = None, 0.5
    for meta_path in sorted(b.path.parent.glob("*/capture.json"))[:MAX_UPSTREAM]:
        if meta_path.parent == b.path:
            continue
        try:
            meta = read_json(meta_path)  # regular files only: a FIFO never blocks
        except (OSError, ValueError):
            continue
        modules = {str(p) for p in meta.get("modules") or [] if p}
        share = len(ours & modules) / len(ours)
        if share > best_share:
            best, best_share = str(meta.get("name") or meta_path.parent.name), share
    return best
