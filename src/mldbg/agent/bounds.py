"""Out-of-range indices into MLX arrays, caught before the read (the tripwire's other half).

MLX does not check indices: ``sigmas[1000]`` on a 1000-element array returns whatever
memory follows it (subnormal garbage such as ``1.58e-43``, a plausible number, or a
crash), and an out-of-range write corrupts memory.  The values such a read returns are
not always NaN or subnormal, and a read inline in the script is no module's output, so
checking values cannot find it; checking the index can, whatever the garbage is.

While the tripwire is set, ``array[...]`` (read and write), ``mx.take``,
``mx.take_along_axis`` and ``mx.put_along_axis`` check their integer indices against the
array's shape first; an index out of range is reported to the tripwire, which stops the
script in the frame that indexed, before the read happens.  Indices held in arrays are
evaluated for the check (inside ``mx.compile`` they cannot be, and are passed over).
A function imported by name before the tripwire was set (``from mlx.core import take``)
is not checked.

Standard library only, like the rest of the agent: MLX is reached through ``sys.modules``.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol, SupportsIndex, cast

MAX_LISTED = 4096  # a list of indices longer than this is left to MLX


@dataclass(frozen=True)
class OutOfRange:
    """One index out of its axis' range."""

    operation: str  # "array[...]", "array[...] =", "mx.take", ...
    axis: int | None  # None: into the flattened array
    index: int
    size: int
    shape: tuple[int, ...]
    dtype: str


class MlxArray(Protocol):
    """What the checks read of an ``mx.array``."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> object: ...

    @property
    def size(self) -> int: ...


class Report(Protocol):
    """What the guard tells (the tripwire): the array, the index as given, what is wrong."""

    def __call__(self, array: object, index: object, problem: OutOfRange) -> None: ...


# -- the checks --------------------------------------------------------------------------------


def _is_array(value: object) -> bool:
    return type(value).__name__ == "array" and (type(value).__module__ or "").startswith("mlx")


def _extremes(value: object) -> tuple[int, int] | None:
    """The smallest and largest of an index: an int, an integer array or a list of ints;
    None when it is no integer index (a slice, a boolean, a float array...)."""
    if isinstance(value, bool):
        return None
    if _is_array(value):
        mx = sys.modules["mlx.core"]
        array = cast("MlxArray", value)
        if not mx.issubdtype(array.dtype, mx.integer) or array.size == 0:
            return None
        low, high = mx.min(array), mx.max(array)
        mx.eval(low, high)  # raises inside mx.compile: the caller passes the index over
        return int(low.item()), int(high.item())
    if isinstance(value, list | tuple):
        if not value or len(value) > MAX_LISTED:
            return None
        numbers = [_extremes(item) for item in value]
        if any(n is None for n in numbers):
            return None
        return min(n[0] for n in numbers if n), max(n[1] for n in numbers if n)
    if not hasattr(value, "__index__"):
        return None
    try:
        number = operator.index(cast("SupportsIndex", value))  # int, numpy integers
    except TypeError:
        return None
    return number, number


def _beyond(extremes: tuple[int, int], size: int) -> int | None:
    """The first of the two extremes outside ``-size <= i < size``, else None."""
    low, high = extremes
    if low < -size:
        return low
    if high >= size:
        return high
    return None


def index_problem(shape: tuple[int, ...], index: object) -> tuple[int | None, int, int] | None:
    """``(axis, index, size)`` of the first index out of range in ``array[index]``.

    Integers, integer arrays and lists each index the axis at their place; a slice takes
    one axis (slices are clamped, never out of range), ``None`` none, ``...`` the axes left
    over.  An index MLX would refuse anyway (too many axes) is left to MLX.
    """
    items = index if isinstance(index, tuple) else (index,)
    taking = sum(1 for item in items if item is not None and item is not Ellipsis)
    axis = 0
    for item in items:
        if item is None:
            continue
        if item is Ellipsis:
            axis += max(len(shape) - taking, 0)
            continue
        if axis >= len(shape):
            return None
        if not isinstance(item, slice):
            extremes = _extremes(item)
            if extremes is not None:
                bad = _beyond(extremes, shape[axis])
                if bad is not None:
                    return axis, bad, shape[axis]
        axis += 1
    return None


def along_problem(
    shape: tuple[int, ...], indices: object, axis: int | None
) -> tuple[int | None, int, int] | None:
    """``(axis, index, size)`` for ``mx.take`` and the ``*_along_axis`` functions."""
    size = 1
    if axis is None:
        for n in shape:
            size *= n
    elif -len(shape) <= axis < len(shape):
        size = shape[axis]
    else:
        return None  # MLX refuses the axis itself
    extremes = _extremes(indices)
    bad = None if extremes is None else _beyond(extremes, size)
    return None if bad is None else (axis, bad, size)


# -- the guard ----------------------------------------------------------------------------------


class IndexGuard:
    """The checked indexing of MLX, installed and removed as a whole."""

    def __init__(self, report: Report, quiet: Callable[[], bool]) -> None:
        self.report = report
        self.quiet = quiet
        self._originals: list[tuple[object, str, object]] = []  # (owner, name, original)

    @property
    def installed(self) -> bool:
        return bool(self._originals)

    def install(self, mx: ModuleType) -> None:
        if self._originals:
            return
        array = mx.array
        self._patch(array, "__getitem__", self._item(array.__getitem__, "array[...]", 1))
        self._patch(array, "__setitem__", self._item(array.__setitem__, "array[...] =", 1))
        for name, axis_at in (("take", 2), ("take_along_axis", 2), ("put_along_axis", 3)):
            original = getattr(mx, name, None)
            if original is not None:
                self._patch(mx, name, self._along(original, f"mx.{name}", axis_at))

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._originals):
            with contextlib.suppress(AttributeError, TypeError):
                _set(owner, name, original)
        self._originals = []

    def _patch(self, owner: object, name: str, replacement: object) -> None:
        original = getattr(owner, name)
        try:
            _set(owner, name, replacement)
        except (AttributeError, TypeError):  # an MLX whose classes cannot be patched
            return
        self._originals.append((owner, name, original))

    def _item(self, original: Callable[..., object], operation: str, at: int) -> object:
        guard = self

        @functools.wraps(original)
        def checked(array: MlxArray, index: object, *rest: object) -> object:
            if not guard.quiet():
                guard._check(operation, array, index, lambda: index_problem(array.shape, index))
            return original(array, index, *rest)

        return checked

    def _along(self, original: Callable[..., object], operation: str, axis_at: int) -> object:
        guard = self

        @functools.wraps(original)
        def checked(*args: object, **kwargs: object) -> object:
            if not guard.quiet() and len(args) >= 2 and _is_array(args[0]):
                array, indices = cast("MlxArray", args[0]), args[1]
                given = args[axis_at] if len(args) > axis_at else kwargs.get("axis")
                axis = given if isinstance(given, int) else None
                guard._check(
                    operation, array, indices, lambda: along_problem(array.shape, indices, axis)
                )
            return original(*args, **kwargs)

        return checked

    def _check(
        self,
        operation: str,
        array: MlxArray,
        index: object,
        find: Callable[[], tuple[int | None, int, int] | None],
    ) -> None:
        try:
            found = find()
        except Exception:  # a tracer inside mx.compile, an index MLX will refuse itself
            return
        if found is None:
            return
        axis, bad, size = found
        problem = OutOfRange(
            operation,
            axis,
            bad,
            size,
            tuple(array.shape),
            str(array.dtype).removeprefix("mlx.core."),
        )
        self.report(array, index, problem)


def _set(owner: object, name: str, value: object) -> None:
    """Replace an attribute of a class or a module.  ``mx.array`` is a nanobind type, whose
    metaclass sets attributes itself (``type.__setattr__`` refuses it)."""
    setattr(owner, name, value)
