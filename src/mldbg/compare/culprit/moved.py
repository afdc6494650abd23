"""A step the two trees place on different sides of a module boundary, shown by values.

The reference's ``adaLN_modulation`` is ``Sequential(SiLU, Linear)`` and is called on
``c``; the port's is a bare ``Linear`` called on ``silu(c)``.  Paired by name, the
module's input differs (``c`` against ``silu(c)``), its outputs agree, and the block
that called it read as having computed something wrong inline: a clean port failed.
The values say what happened: the port's input equals the input of the reference's
``adaLN_modulation.1``, the child that comes after the step the port did first.  The
other way round (the port's module holds the step, the reference computes it before
the call), the reference's input equals the input of one of the port's children.

:func:`moved_steps` finds such calls (inputs that differ, every output agreeing) and
checks, by the same scale-aware test as every entry, whether each differing input meets
the other side's child input: then the difference is structure, a boundary difference
never blamed, and (for the first case) the map that pairs the two modules directly is
proposed.  A port that forgot the step (``Linear`` on ``c``) meets no child input, and
its outputs differ besides: it is still named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import cast

from ... import dtypes
from ..judge import metrics
from ..judge.bounds import scale_test
from ..pair.align import Alignment, Pair
from ..read.sources import Call, Entry, Source
from ..records import Boundary, EntryResult
from .divergence import fails, json_number, worst_rel

CALLS_CHECKED = 256  # calls whose inputs are tried against the other side's children
CHILD_INPUTS_TRIED = 4  # same-shaped child inputs read per differing input
# What the checks may read in all: such calls are few in a port that differs by structure
# (one per block), and where a real bug makes many, the verdict does not wait on them.
BYTES_READ = 1 << 30


@dataclass
class Moved:
    """Boundaries the values explain, and B's module paths to rename onto A's."""

    boundaries: list[Boundary] = field(default_factory=list)
    renames: dict[str, str] = field(default_factory=dict)


def moved_steps(a: Source, b: Source, alignment: Alignment, results: list[EntryResult]) -> Moved:
    """Calls whose differing inputs the other side's children read, outputs agreeing."""
    found = Moved()
    by_call: dict[tuple[str, int], list[tuple[Pair, EntryResult]]] = {}
    for pair, result in zip(alignment.pairs, results, strict=True):
        if pair.a.call_key is not None:
            by_call.setdefault(pair.a.call_key, []).append((pair, result))
    checked = 0
    budget = _Budget()
    for key, items in by_call.items():
        inputs = [(p, r) for p, r in items if r.get("role") == "in" and fails(r)]
        outputs = [r for _p, r in items if r.get("role") == "out"]
        call = a.calls.get(key)
        if not inputs or not outputs or any(fails(r) for r in outputs) or call is None:
            continue
        if call.parent is None or checked >= CALLS_CHECKED:
            continue  # the runs' own inputs differing is said plainly, never excused
        checked += 1
        met = [_met(a, b, call, pair, result, budget) for pair, result in inputs]
        if all(m is not None for m in met):
            _add(found, call, inputs, cast("list[_Met]", met))
    return found


@dataclass
class _Met:
    """Where one differing input meets the other side: A's child entry (the port did
    the step first) or B's (the port does it inside), and the child's module path."""

    entry: str
    child: str
    port_inside: bool
    b_module: str
    steps: str = ""  # the children that run before ``child``: the step that moved


@dataclass
class _Budget:
    """The bytes the checks may still read."""

    left: int = BYTES_READ

    def spend(self, *entries: Entry) -> bool:
        size = sum(math.prod(e.shape) * _itemsize(e.dtype) for e in entries)
        if size > self.left:
            return False
        self.left -= size
        return True


def _itemsize(dtype: str) -> int:
    found = dtypes.lookup(dtype)
    return max(1, found.bits // 8) if found is not None else 4


def _met(
    a: Source, b: Source, call: Call, pair: Pair, result: EntryResult, budget: _Budget
) -> _Met | None:
    bound = result.get("expected") or 0.0
    b_call = b.calls.get(pair.b.call_key) if pair.b.call_key is not None else None
    b_module = pair.b.module or ""
    for child_entry in _child_inputs(a, call, tuple(pair.b.shape)):
        if budget.spend(child_entry, pair.b) and _agrees(a, child_entry, b, pair.b, bound):
            steps = _before(a, call, child_entry)
            return _Met(child_entry.name, child_entry.module or "", False, b_module, steps)
    if b_call is not None:
        for child_entry in _child_inputs(b, b_call, tuple(pair.a.shape)):
            if budget.spend(pair.a, child_entry) and _agrees(a, pair.a, b, child_entry, bound):
                steps = _before(b, b_call, child_entry)
                return _Met(child_entry.name, child_entry.module or "", True, b_module, steps)
    return None


def _before(source: Source, call: Call, entry: Entry) -> str:
    """The children of ``call`` that ran before the one ``entry`` is an input of, as
    ``path (Class)``: what one side computes inside the module and the other before."""
    reader = source.calls.get(entry.call_key) if entry.call_key is not None else None
    if reader is None:
        return ""
    earlier = sorted(
        (
            c
            for c in source.calls.values()
            if c.parent == call.seq and c.start_order < reader.start_order
        ),
        key=lambda c: c.start_order,
    )
    return ", ".join(f"{c.module} ({c.class_name})" for c in earlier[:3])


def _child_inputs(source: Source, call: Call, shape: tuple[int, ...]) -> list[Entry]:
    """Inputs of ``call``'s children shaped ``shape``, in the order the children ran."""
    children = {
        (c.module, c.call): c.start_order for c in source.calls.values() if c.parent == call.seq
    }
    found = [
        e
        for e in source.entries
        if e.role == "in" and e.call_key in children and tuple(e.shape) == shape
    ]
    found.sort(key=lambda e: children[e.call_key] if e.call_key else 0)
    return found[:CHILD_INPUTS_TRIED]


def _agrees(a: Source, ea: Entry, b: Source, eb: Entry, bound: float) -> bool:
    """Whether the two tensors agree within ``bound`` (the scale-aware test)."""
    if ea.stats is not None or eb.stats is not None:
        return False  # a summary: no tensor to read
    rtol, atol = metrics.default_tolerance(ea.dtype, eb.dtype)
    try:
        numbers = metrics.compare_arrays(
            a.load_checked(ea), b.load_checked(eb), rtol=rtol, atol=atol
        )
    except (TypeError, ValueError):
        return False
    return scale_test(cast("EntryResult", numbers), bound)


def _add(found: Moved, call: Call, inputs: list[tuple[Pair, EntryResult]], met: list[_Met]) -> None:
    first = met[0]
    step = first.steps or "a step"
    if first.port_inside:
        note = (
            f"input differs, outputs agree: the port computes {step} inside this module, "
            f"the reference before calling it (the reference's input agrees with the "
            f"port's {first.entry}): structure, not a bug"
        )
    else:
        note = (
            f"input differs, outputs agree: the port computes {step} before calling this "
            f"module, the reference inside it (the port's input agrees with the "
            f"reference's {first.entry}): structure, not a bug"
        )
        if all(not m.port_inside and m.child == first.child for m in met):
            found.renames[first.b_module] = first.child  # pairs the two directly
    differing = [r for _p, r in inputs]
    found.boundaries.append(
        {
            "name": f"{call.module}#{call.call}",
            "module": call.module,
            "call": call.call,
            "class": call.class_name,
            "entries": [r["name"] for r in differing],
            "ratio": None,
            "compensated_by": f"{call.module}#{call.call}",
            "rel_rms": json_number(worst_rel(differing)),
            "note": note,
        }
    )
