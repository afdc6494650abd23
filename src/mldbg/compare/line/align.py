"""The port's line values paired with the reference's by value, not by name.

Names and lines differ between a reference and its port (diffusers' ``query`` is the
port's ``q``; one fused call is ten lines), so each value the port's scope computed is
compared with every value the reference's computed that holds as many elements, read
through the legitimate changes of layout (``pair/readings.py``: unit axes,
permutations, heads split or merged), and the closest is its counterpart.  Small values
are kept whole and compared exactly; larger ones by their sketches: the port's run
sketched each of its values as read in each reference shape of as many elements, so
``||S b - S a|| / ||a||`` estimates the relative error in the reference's own layout
(``capture/sketch.py``: within about 3 % of the error itself, not of ``a``).

The closest counterpart is *within the bound* when its relative error is no more than
the rounding compare allowed the culprit's call (``plan.py``): the port computed that
value; otherwise the port's value has no counterpart in the reference.  A single number
(a setting, a scale) far from every one of the reference's is no evidence either way: a
reference may keep its settings anywhere (inside a scheduler, in a config), so it is
judged by what it makes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..pair.readings import Reading, readings
from .read import LineRecord, LineRun, View

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

NEAREST = 3  # reference values kept per port value, closest first
MAX_CANDIDATES = 5_000  # reference values of one size compared with a port value


@dataclass(frozen=True)
class Near:
    """A reference value and how far a port value is from it."""

    record: LineRecord
    rel_rms: float
    reading: str  # how the port's value was read in its shape ("as is", ...)
    head_b: list[float | int | str] | None  # the port's first elements, so read


@dataclass
class Match:
    """A port value and its closest reference values."""

    record: LineRecord
    nearest: list[Near] = field(default_factory=list)
    ok: bool | None = None  # None: not compared (not kept, or no value of its size)

    @property
    def best(self) -> Near | None:
        return self.nearest[0] if self.nearest else None


def _finite(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """NaN as 0, as a sketch takes it (infinities were kept as their sign already)."""
    import numpy as np

    return np.nan_to_num(values, nan=0.0, posinf=1.0, neginf=-1.0)


def _rel(difference: float, norm_a: float, norm_b: float) -> float:
    if norm_a > 0:
        return difference / norm_a
    return 0.0 if difference == 0 and norm_b == 0 else math.inf


class _Reference:
    """The reference's kept values, by element count, with their numbers loaded once."""

    def __init__(self, run: LineRun) -> None:
        self.run = run
        self.by_count: dict[int, list[LineRecord]] = {}
        for record in run.records:
            if record.alias is None and record.kept and record.numel is not None:
                self.by_count.setdefault(record.numel, []).append(record)
        self._cache: dict[tuple[int, bool], npt.NDArray[np.float64]] = {}

    def values(self, record: LineRecord) -> npt.NDArray[np.float64]:
        """Its elements (kept whole) or its own sketch."""
        view = record.exact if record.exact is not None else record.views[0]
        key = (record.seq, record.exact is not None)
        if key not in self._cache:
            self._cache[key] = _finite(self.run.numbers(view))
        return self._cache[key]

    def norm(self, record: LineRecord) -> float:
        if record.exact is not None:
            import numpy as np

            return float(np.linalg.norm(self.values(record)))
        norm = (record.stats or {}).get("norm")
        return float(norm) if isinstance(norm, int | float) else math.nan


class Aligner:
    """Port values against reference values: the closest, by value."""

    def __init__(self, reference: LineRun, port: LineRun) -> None:
        self.ref = _Reference(reference)
        self.port = port

    def nearest(self, record: LineRecord, among: list[LineRecord] | None = None) -> list[Near]:
        """The reference values closest to ``record``'s (held by its original, for an
        alias), among ``among`` (default: every reference value of as many elements),
        closest first."""
        held = self.port.original(record)
        if not held.kept or held.numel is None:
            return []
        pool = self.ref.by_count.get(held.numel, []) if among is None else among
        candidates = [c for c in pool if c.numel == held.numel and c.alias is None][:MAX_CANDIDATES]
        if not candidates:
            return []
        if held.exact is not None:
            found = _exact_nearest(self.ref, self.port, held, candidates)
        else:
            found = _sketched_nearest(self.ref, self.port, held, candidates)
        return sorted(found, key=lambda near: near.rel_rms)


def align(reference: LineRun, port: LineRun, bound: float) -> dict[int, Match]:
    """Each of the port's kept values (aliases aside) -> its match; ``ok`` when its
    closest reference value is within ``bound``."""
    aligner = Aligner(reference, port)
    matches: dict[int, Match] = {}
    for record in port.records:
        if record.alias is not None:
            continue
        match = Match(record, aligner.nearest(record)[:NEAREST])
        if match.nearest:
            match.ok = match.nearest[0].rel_rms <= bound
            if match.ok is False and record.numel == 1:
                match.ok = None  # a single number far from every other: no evidence
        matches[record.seq] = match
    return matches


def _exact_nearest(
    ref: _Reference, port: LineRun, record: LineRecord, candidates: list[LineRecord]
) -> list[Near]:
    """Whole values: every reading of the port's into each candidate's shape, exactly."""
    import numpy as np

    assert record.exact is not None and record.shape is not None
    ours = _finite(port.numbers(record.exact)).reshape(record.shape)
    norm_b = float(np.linalg.norm(ours))
    found: list[Near] = []
    plans: dict[tuple[int, ...], list[Reading]] = {}
    for candidate in candidates:
        if candidate.exact is None or candidate.shape is None:
            continue
        theirs = ref.values(candidate)
        shape = candidate.shape
        if shape not in plans:
            plans[shape] = readings(record.shape, shape)
        best: Near | None = None
        for reading in plans[shape]:
            moved = reading.apply(ours).reshape(-1)
            rel = _rel(float(np.linalg.norm(moved - theirs)), float(np.linalg.norm(theirs)), norm_b)
            if best is None or rel < best.rel_rms:
                head: list[float | int | str] = [float(x) for x in moved[:4].tolist()]
                best = Near(candidate, rel, reading.describe(), head)
        if best is not None:
            found.append(best)
    return found


def _sketched_nearest(
    ref: _Reference, port: LineRun, record: LineRecord, candidates: list[LineRecord]
) -> list[Near]:
    """Sketched values: the port's sketch in each candidate's shape (its own, or one its
    run made as it read the value in that shape) against the candidate's own sketch."""
    assert record.shape is not None
    norm = (record.stats or {}).get("norm")
    norm_b = float(norm) if isinstance(norm, int | float) else 0.0
    views: dict[tuple[int, ...], list[View]] = {}
    for view in record.views:
        shape = record.shape if view.order is None else view.shape
        views.setdefault(_squeezed(shape), []).append(view)
    found: list[Near] = []
    for candidate in candidates:
        if not candidate.views or candidate.shape is None:
            continue
        mine = views.get(_squeezed(candidate.shape), [])
        best = _closest_view(ref, port, record, candidate, mine, norm_b) if mine else None
        if best is not None:
            found.append(best)
    return found


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def _closest_view(
    ref: _Reference,
    port: LineRun,
    record: LineRecord,
    candidate: LineRecord,
    mine: list[View],
    norm_b: float,
) -> Near | None:
    """Of the port's sketches in the candidate's shape, the one nearest the candidate's."""
    import numpy as np

    assert candidate.shape is not None
    theirs = ref.values(candidate)
    norm_a = ref.norm(candidate)
    best: Near | None = None
    for view in mine:
        sketch = port.numbers(view)
        if sketch.size != theirs.size:
            continue
        rel = _rel(float(np.linalg.norm(sketch - theirs)), norm_a, norm_b)
        if best is None or rel < best.rel_rms:
            how = "as is" if view.order is None else f"read as {list(candidate.shape)}"
            head = record.head if view.order is None else view.head
            best = Near(candidate, rel, how, head)
    return best
