"""The ways one tensor's elements can be read as another's shape without changing them.

A port keeps the same numbers as its reference in another layout: unit axes added or
dropped (``(1, L, D)`` vs ``(L, D)``), axes permuted (channels-last ``NHWC`` vs ``NCHW``),
heads split from or merged into the hidden axis (``(B, L, H*D)`` vs ``(B, H, L, D)``).
Compare's operation alignment (``culprit/ops.py``) and the line step (``line/``) both
ask the same question of two shapes: which readings map one onto the other.  A reading
is a *legitimate* change of layout: each axis of one side is a whole axis of the other,
a run of the other's axes merged in their order, or one of several axes that merge into
one of the other's, and the axes may be permuted.  A reshape that reinterprets memory
across axes (``x.reshape(B, H, L, D)`` of a ``(B, L, H*D)`` tensor, a classic port bug)
is *not* a reading: the values it gives have no counterpart, which is the point.

Standard library only: the line step computes readings inside the debuggee (the port's
values are sketched in each of the reference's layouts, since sketches do not commute
with a transpose); applying one takes numpy, imported by the caller's array.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

MAX_READINGS = 8  # readings kept per pair of shapes (equal axes make several)
_MAX_AXES = 8  # non-unit axes beyond which only the plain readings are tried


@dataclass(frozen=True)
class Reading:
    """``target = source.reshape(split).transpose(order).reshape(target)``, unit axes of
    either side dropped first.  ``split`` refines the source's non-unit axes into atoms,
    ``order`` puts them in the target's order, and the last reshape merges atoms into
    the target's axes."""

    source: tuple[int, ...]
    target: tuple[int, ...]
    split: tuple[int, ...]
    order: tuple[int, ...]

    @property
    def identity(self) -> bool:
        """No element moves: the shapes differ by unit axes (or not at all)."""
        return self.order == tuple(range(len(self.order)))

    def describe(self) -> str:
        """``as is``, ``unit axes``, or the atoms' move, for a person."""
        if self.source == self.target:
            return "as is"
        if self.identity:
            return f"reshaped {list(self.source)} -> {list(self.target)}"
        return f"{list(self.source)} read as {list(self.target)} (axes {list(self.order)})"

    def apply(self, value: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """``value`` (of shape ``source``) read in the target's shape."""
        atoms = value.reshape(self.split) if self.split else value.reshape(())
        if not self.identity:
            atoms = atoms.transpose(self.order)
        return atoms.reshape(self.target)


def _count(shape: tuple[int, ...]) -> int:
    total = 1
    for n in shape:
        total *= int(n)
    return total


def readings(
    source: tuple[int, ...] | list[int],
    target: tuple[int, ...] | list[int],
    limit: int = MAX_READINGS,
) -> list[Reading]:
    """The plainest readings of a ``source``-shaped tensor as a ``target``-shaped one (see
    ``_rank``; several only when equally plain); [] when the element counts differ or no
    legitimate reading exists.  Shapes equal but for unit axes have one reading: as they
    are."""
    source, target = tuple(int(n) for n in source), tuple(int(n) for n in target)
    if _count(source) != _count(target):
        return []
    ours = [n for n in source if n != 1]
    theirs = [n for n in target if n != 1]
    if not ours:  # a single element, however it is shaped
        return [Reading(source, target, (), ())]
    found: dict[tuple[tuple[int, ...], tuple[int, ...]], None] = {}
    if ours == theirs:
        # The same axes: read as they are.  Permuting equal axes (a square matrix
        # transposed) would let a port that transposes by mistake pass as agreeing.
        return [Reading(source, target, tuple(ours), tuple(range(len(ours))))]
    if len(ours) <= _MAX_AXES and len(theirs) <= _MAX_AXES:
        for split, order in _matchings(ours, theirs):
            found.setdefault((split, order), None)
            if len(found) >= 4 * limit:
                break
    if not found:
        return []
    ranks = {key: _rank(key[1], len(ours), len(theirs)) for key in found}
    plainest = min(ranks.values())
    kept = [key for key in found if ranks[key] == plainest]
    return [Reading(source, target, split, order) for split, order in kept[:limit]]


def _rank(order: tuple[int, ...], ours: int, theirs: int) -> tuple[int, int]:
    """How far a reading moves the elements: the pairs of axes it swaps (a channels-last
    rotation swaps fewer than a reversal), then how many splits and merges it needs.
    Only the plainest readings are kept: with axes of equal sizes (2 heads, pairs of 2)
    a far-fetched one exists too, and it would let a port that swaps those axes by
    mistake pass as agreeing."""
    swaps = sum(
        1 for i in range(len(order)) for j in range(i + 1, len(order)) if order[i] > order[j]
    )
    return (swaps, abs(len(order) - ours) + abs(len(order) - theirs))


def _matchings(ours: list[int], theirs: list[int]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every way to pair the two sides' non-unit axes: each of our axes is one of theirs,
    a run of theirs merged (in their order), or one of several of ours that merge into
    one of theirs (in our order, once moved next to each other: heads and head size
    merge after a transpose).  Returns (atoms in our order, their order)."""
    results: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    # groups[j]: the atoms that make their axis j, each atom (our axis, size); an atom of
    # ours split into several of theirs is listed once per piece
    assign: dict[int, list[tuple[int, int, int]]] = {}  # their axis -> [(ours, piece, size)]
    pieces: dict[int, list[int]] = {}  # our axis -> sizes it is split into, in order

    def place(i: int, free: frozenset[int]) -> None:
        if len(results) >= 64:
            return
        if i == len(ours):
            if free:
                return
            if all(_product([s for _, _, s in assign[j]]) == theirs[j] for j in assign):
                results.append(_atoms(ours, theirs, assign, pieces))
            return
        size = ours[i]
        # (a) ours[i] is their axis j, or one part of their axis j (several of ours merge)
        for j in sorted(free | _open_axes(assign, theirs)):
            taken = _product([s for _, _, s in assign.get(j, [])])
            if theirs[j] % (taken * size):
                continue
            assign.setdefault(j, []).append((i, 0, size))
            pieces[i] = [size]
            place(i + 1, free - {j})
            assign[j].pop()
            if not assign[j]:
                del assign[j]
            del pieces[i]
        # (b) ours[i] is a run of their axes merged, in their order
        for run in _runs(sorted(free), theirs, size):
            for k, j in enumerate(run):
                assign[j] = [(i, k, theirs[j])]
            pieces[i] = [theirs[j] for j in run]
            place(i + 1, free - set(run))
            for j in run:
                del assign[j]
            del pieces[i]

    place(0, frozenset(range(len(theirs))))
    return results


def _open_axes(assign: dict[int, list[tuple[int, int, int]]], theirs: list[int]) -> frozenset[int]:
    """Their axes already started by our axes and not yet complete."""
    return frozenset(
        j for j, parts in assign.items() if _product([s for _, _, s in parts]) < theirs[j]
    )


def _runs(free: list[int], theirs: list[int], size: int) -> list[tuple[int, ...]]:
    """Increasing runs of at least two free axes of theirs whose sizes multiply to ``size``."""
    found = []
    for count in range(2, len(free) + 1):
        for run in itertools.combinations(free, count):
            if _product([theirs[j] for j in run]) == size:
                found.append(run)
    return found


def _atoms(
    ours: list[int],
    theirs: list[int],
    assign: dict[int, list[tuple[int, int, int]]],
    pieces: dict[int, list[int]],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The split of our axes into atoms, and the order that puts them in their order."""
    index: dict[tuple[int, int], int] = {}
    split: list[int] = []
    for i in range(len(ours)):
        for k, size in enumerate(pieces[i]):
            index[(i, k)] = len(split)
            split.append(size)
    order = [index[(i, k)] for j in sorted(assign) for i, k, _ in assign[j]]
    return tuple(split), tuple(order)


def _product(sizes: list[int]) -> int:
    total = 1
    for n in sizes:
        total *= n
    return total
