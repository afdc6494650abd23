"""Which operation inside a module first diverges (captures made with ``ops=``).

Operation names differ across frameworks: the rotation torch spells ``mul``, ``cat``,
``neg``, ``add`` is one ``mx.fast.rope`` in MLX, and an eager attention's ``matmul`` /
``softmax`` / ``matmul`` is one ``fast.scaled_dot_product_attention``.  So operations are
aligned by value: each of the port's operation outputs, in order, is compared with every
reference operation output of the same call of the same module that holds as many
elements (through every legitimate reading of one shape as the other: unit axes,
permutations such as channels-last, heads split or merged; ``pair/readings.py``, which
the line step shares), and the closest one is its counterpart.  A port operation whose closest counterpart is still
further than a clean port's rounding allows (the bound compare uses for modules,
``2 u sqrt(1 + d)`` at the counterpart's depth) computes something the reference never
did: the first such operation, in the port's order, is the one that diverges.  When the
port's operations are finer than the reference's, the same holds the other way round;
only the port's side is searched, as the port is what gets fixed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...capture.ops import OP_CLASS_PREFIX
from ..judge.bounds import Depths, depths, expected_error, unit_roundoff
from ..pair.mapping import NameMap, split_name
from ..pair.readings import readings
from ..read.sources import Entry, Source
from ..records import OpMatch, OpsItem

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

MAX_OPS = 500  # operation outputs considered per module call and side
MAX_LISTED = 100  # operations listed per module call in the answer


def _op_outputs(source: Source) -> dict[tuple[str, int], list[Entry]]:
    """Output entries of recorded operations, by (module, call) of the module they ran in."""
    found: dict[tuple[str, int], list[Entry]] = {}
    for entry in source.entries:
        if entry.role != "out" or entry.module is None or ":op" not in entry.module:
            continue
        call = source.calls.get((entry.module, entry.call or 0))
        if call is None or not call.class_name.startswith(OP_CLASS_PREFIX):
            continue
        owner = entry.module.rsplit(":op", 1)[0]
        found.setdefault((owner, entry.call or 0), []).append(entry)
    return found


@dataclass(frozen=True)
class ModuleVerdict:
    """What compare said of a module call's outputs: whether all passed, and the largest
    error it allowed them (its bound: depth, conditioning floors, quantization)."""

    ok: bool = True
    expected: float | None = None

    def add(self, ok: bool, expected: object) -> ModuleVerdict:
        bound = float(expected) if isinstance(expected, int | float) else None
        widest = max((x for x in (self.expected, bound) if x is not None), default=None)
        return ModuleVerdict(self.ok and ok, widest)


def compare_ops(
    a: Source,
    b: Source,
    modules: Mapping[tuple[str, int], ModuleVerdict] | None = None,
    names: NameMap | None = None,
) -> list[OpsItem] | None:
    """One item per module call with operations recorded on both sides (None: none).

    ``modules`` says, per module call, what compare judged of its outputs.  Its bound is
    also each of its operations' least bound: an operation inside carries the error its
    module's inputs already had (drift from upstream, an ill-conditioned op before it),
    which the operation's own depth does not count.  An operation of a module call that
    agrees is never its first divergence (a step the reference does not show, such as a
    fused kernel's inside, is not a bug).  B's module calls are named in A's terms
    through ``names`` (compare's map), as its entries are."""
    ops_a, ops_b = _op_outputs(a), _in_a_terms(_op_outputs(b), names)
    shared = [key for key in ops_b if key in ops_a]
    if not shared:
        return None
    depth = depths(a, {})
    items = []
    for key in shared:
        verdict = (modules or {}).get(key)
        floor = verdict.expected if verdict is not None else None
        item = _align(a, b, key, ops_a[key][:MAX_OPS], ops_b[key][:MAX_OPS], depth, floor)
        agrees = verdict.ok if verdict is not None else None
        item["module_ok"] = agrees
        if agrees and item["first_divergence"] is not None:
            item["first_divergence"] = None
            unmatched = sum(1 for op in item["ops"] if op.get("ok") is False)
            item["note"] = (
                f"the module's outputs agree: {unmatched} of B's operations with no "
                "counterpart within rounding are steps A computes otherwise or keeps "
                "inside a fused kernel, not a divergence"
            )
        items.append(item)
    return items


def _in_a_terms(
    found: dict[tuple[str, int], list[Entry]], names: NameMap | None
) -> dict[tuple[str, int], list[Entry]]:
    """B's (module, call) keys after the map (``model.h.1.attn`` -> ``transformer.h.1.attn``)."""
    if names is None:
        return found
    mapped: dict[tuple[str, int], list[Entry]] = {}
    for (module, call), entries in found.items():
        parts = split_name(names.to_a(f"{module}#{call}.out"))
        key = (parts[0], parts[1]) if parts else (module, call)
        mapped.setdefault(key, []).extend(entries)
    return mapped


def _align(
    a: Source,
    b: Source,
    key: tuple[str, int],
    ours: list[Entry],
    theirs: list[Entry],
    depth: Depths,
    floor: float | None = None,
) -> OpsItem:
    import numpy as np

    loaded: dict[str, npt.NDArray[np.float64]] = {}

    def load(source: Source, entry: Entry) -> npt.NDArray[np.float64]:
        cache_key = f"{id(source)}:{entry.name}"
        if cache_key not in loaded:
            loaded[cache_key] = np.asarray(source.load(entry), dtype=np.float64)
        return loaded[cache_key]

    listed: list[OpMatch] = []
    first: OpMatch | None = None
    for entry_b in theirs:
        # (relative error, moved: 0 when read as it is, the operation): on a tie (one
        # value under two shapes, stack's (..., d/2, 2) and the flatten of it) the one
        # read as it is wins
        best: tuple[float, int, Entry] | None = None
        for entry_a in ours:
            if _count(entry_a.shape) != _count(entry_b.shape) or entry_a.stats or entry_b.stats:
                continue
            value_a = load(a, entry_a)
            norm = float(np.linalg.norm(value_a))
            for reading in readings(tuple(entry_b.shape), tuple(entry_a.shape)):
                error = float(np.linalg.norm(reading.apply(load(b, entry_b)) - value_a))
                relative = error / norm if norm else (0.0 if error == 0 else float("inf"))
                moved = int(reading.source != reading.target)
                if best is None or _better(relative, moved, best[0], best[1]):
                    best = (relative, moved, entry_a)
        item: OpMatch = {
            "op_b": entry_b.name,
            "class_b": _op_class(b, entry_b),
            "shape_b": entry_b.shape,
        }
        if best is None:
            item.update({"closest_a": None, "rel_rms": None, "expected": None, "ok": None})
        else:
            relative, _, entry_a = best
            call_key = (entry_a.module or "", entry_a.call or 0)
            u = unit_roundoff(entry_a.dtype, entry_b.dtype)
            bound = expected_error(u, depth.through.get(call_key, 0), 0.0)
            if bound is not None and floor is not None:
                bound = max(bound, floor)
            ok = relative <= bound if bound is not None else relative == 0.0
            item.update(
                {
                    "closest_a": entry_a.name,
                    "class_a": _op_class(a, entry_a),
                    "rel_rms": relative,
                    "expected": bound,
                    "ok": ok,
                }
            )
            if not ok and first is None:
                first = item
        listed.append(item)
    return {
        "module": key[0],
        "call": key[1],
        "name": f"{key[0]}#{key[1]}",
        "ops_a": len(ours),
        "ops_b": len(theirs),
        "first_divergence": first,
        "ops": listed[:MAX_LISTED],
        "truncated": len(listed) > MAX_LISTED,
        "module_ok": None,
        "note": None,
    }


def _better(relative: float, moved: int, best: float, best_moved: int) -> bool:
    """Closer, or as close (within float summation's own noise) and read as it is."""
    if abs(relative - best) <= 1e-9 * max(relative, best):
        return moved < best_moved
    return relative < best


def _op_class(source: Source, entry: Entry) -> str:
    call = source.calls.get((entry.module or "", entry.call or 0))
    name = call.class_name if call is not None else ""
    return name[len(OP_CLASS_PREFIX) :] if name.startswith(OP_CLASS_PREFIX) else name


def _count(shape: list[int]) -> int:
    total = 1
    for n in shape:
        total *= int(n)
    return total
