"""The parameters of a model split over ranks, gathered from each rank's capture.

Under torchrun every rank saves its own slices (``--capture-weights``); the audit judges
the whole model, so the slices are joined along the dimension ``shards`` names for them,
lazily (one parameter at a time), with compare's rules for finding and ordering ranks.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

from ..compare.read.sources import CompareInputError
from ..errors import BAD_SHARDS, BAD_WEIGHTS_INPUT
from .collect import from_path
from .params import Params


def names_ranks(value: object, home: Path) -> bool:
    """Whether ``value`` is a glob over capture names (``tp@rank*``), not a path."""
    if not isinstance(value, str) or not any(c in value for c in "*?["):
        return False
    return not Path(value).expanduser().exists()


def from_ranks(spec: str, home: Path, shards: Mapping[str, object]) -> Params:
    """The parameters of a model split over ranks, gathered from each rank's capture
    (``NAME@rank<r>``, saved with ``--capture-weights``): a parameter matching a
    ``shards`` glob is the ranks' slices concatenated along its dimension, in rank
    order; any other is replicated (rank 0's)."""
    import fnmatch

    import numpy as np

    from ..compare.read.gather import check_shards, ranked_captures

    rules = check_shards(shards)
    for pattern, rule in rules.items():
        if rule == "sum":
            raise CompareInputError(
                f"shards: {pattern!r}: parameters are split along a dimension, not summed "
                "('sum' is for activations' partial sums)",
                code=BAD_WEIGHTS_INPUT,
            )
    ranked = ranked_captures(spec, home)
    sides = [from_path(str(m["path"]), home) for m in ranked]
    base = sides[0]
    params = Params(f"{spec} ({len(sides)} ranks gathered)", None)
    params.ranks = [str(m["name"]) for m in ranked]
    params.classes, params.buffers = base.classes, base.buffers
    for name in base.shapes:
        split = next((r for p, r in rules.items() if fnmatch.fnmatchcase(name, p)), None)
        params.dtypes[name] = base.dtypes[name]
        if split is None or name in base.packed:
            params.shapes[name] = base.shapes[name]
            params.readers[name] = base.readers[name]
            continue
        axis, params.shapes[name] = _gathered_shape(name, int(split), sides)
        readers = [side.readers[name] for side in sides]
        params.readers[name] = functools.partial(
            lambda parts, dim: np.concatenate([read() for read in parts], axis=dim), readers, axis
        )
    params.packed = {k: v for k, v in base.packed.items() if k in params.shapes}
    params.settings, params.settings_source = base.settings, base.settings_source
    return params


def _gathered_shape(name: str, dim: int, sides: list[Params]) -> tuple[int, tuple[int, ...]]:
    """The axis ``name`` is split along and its whole shape, checked before any rank is
    read: every rank holds it, ``dim`` is an axis it has, and the ranks' slices agree on
    every other axis.  (A dimension out of range was taken modulo the rank, and slices
    that do not fit made the read fail as ``internal``.)"""
    missing = [side.label for side in sides if name not in side.shapes]
    if missing:
        raise CompareInputError(
            f"{name} is split over the ranks but {missing[0]} lacks it", code=BAD_WEIGHTS_INPUT
        )
    shapes = [list(side.shapes[name]) for side in sides]
    if not -len(shapes[0]) <= dim < len(shapes[0]):
        raise CompareInputError(
            f"shards: {name} has {len(shapes[0])} dimension(s), no dimension {dim}",
            code=BAD_SHARDS,
        )
    axis = dim % len(shapes[0])
    rest = [[n for i, n in enumerate(shape) if i != axis] for shape in shapes]
    if any(len(shape) != len(shapes[0]) for shape in shapes) or any(r != rest[0] for r in rest):
        listed = ", ".join(str(shape) for shape in shapes[:4])
        raise CompareInputError(
            f"{name}: the ranks' slices differ in shape outside dimension {dim} ({listed})",
            code=BAD_SHARDS,
        )
    whole = list(shapes[0])
    whole[axis] = sum(shape[axis] for shape in shapes)
    return axis, tuple(whole)
