"""Which side keeps its activations channels-last, decided once per comparison.

A 4-D pair whose shapes differ by a channels-last permutation (``1×16×32×8`` vs
``1×8×16×32``) is compared through the transpose (see ``transposes.layout_permutation``).
Shapes alone cannot decide when C == H == W (a 32×32 image with 32 channels): the same
shape is NCHW on one side and NHWC on the other.  Then the layout is decided by

1. ``--layout NCHW|NHWC`` (B's layout; ``auto`` is the default),
2. the rest of the comparison: if any other 4-D/5-D pair needed the channels-last
   permutation, the port keeps that layout everywhere (an MLX conv port is NHWC end to
   end, also in its attention and resnet blocks),
3. the module's framework and class: an MLX ``Conv*``, pooling or normalization-over-
   channels module works in NHWC / NLC.
"""

from __future__ import annotations

import re
from typing import Any

from ...errors import BAD_LAYOUT
from ..read.sources import CompareInputError, Source
from . import transposes
from .align import Alignment, Pair

LAYOUTS = ("auto", "NCHW", "NHWC")
_CHANNELS_LAST_CLASS = re.compile(
    r"(Conv|Pool|GroupNorm|BatchNorm|InstanceNorm|Upsample)", re.IGNORECASE
)


def check_layout(layout: str | None) -> str:
    value = "auto" if layout is None else str(layout)
    for known in LAYOUTS:
        if value.lower() == known.lower():
            return known
    raise CompareInputError(
        f"unknown layout {layout!r}: use NCHW (B is channels-first like PyTorch), "
        "NHWC (B is channels-last like MLX) or auto",
        code=BAD_LAYOUT,
    )


def _to_first(ndim: int) -> tuple[int, ...]:
    """Channels-last -> channels-first axes for an ``ndim``-D tensor."""
    return (0, ndim - 1, *range(1, ndim - 1))


def _to_last(ndim: int) -> tuple[int, ...]:
    return (0, *range(2, ndim), 1)


class Layouts:
    def __init__(self, a: Source, b: Source, alignment: Alignment, layout: str | None) -> None:
        self.mode = check_layout(layout)
        self.a, self.b = a, b
        self.b_last = self.a_last = False
        self.transposed = 0
        for pair in alignment.pairs:
            shape_a, shape_b = tuple(pair.a.shape), tuple(pair.b.shape)
            if len(shape_a) not in (4, 5) or shape_a == shape_b or len(shape_a) != len(shape_b):
                continue
            perm = transposes.layout_permutation(shape_a, shape_b)
            if perm == _to_first(len(shape_a)):
                self.b_last = True
            elif perm == _to_last(len(shape_a)):
                self.a_last = True

    def _class_says_last(self, source: Source, key: tuple[str, int] | None) -> bool:
        if source.meta.get("framework") != "mlx" or key is None:
            return False
        call = source.calls.get(key)
        return call is not None and bool(_CHANNELS_LAST_CLASS.search(call.class_name))

    def permutation(self, pair: Pair) -> tuple[int, ...] | None:
        """The axes that turn B's tensor into A's layout, or None to compare as is."""
        shape_a, shape_b = tuple(pair.a.shape), tuple(pair.b.shape)
        ndim = len(shape_a)
        perm = self._decide(pair, shape_a, shape_b, ndim)
        if perm is not None:
            self.transposed += 1
        return perm

    def _decide(
        self, pair: Pair, shape_a: tuple[int, ...], shape_b: tuple[int, ...], ndim: int
    ) -> tuple[int, ...] | None:
        if self.mode == "NCHW":
            return None
        fits_first = (
            ndim in (3, 4, 5)
            and len(shape_b) == ndim
            and (tuple(shape_b[i] for i in _to_first(ndim)) == shape_a)
        )
        if self.mode == "NHWC":
            if fits_first:
                return _to_first(ndim)
            return transposes.layout_permutation(shape_a, shape_b)
        if shape_a != shape_b:
            return transposes.layout_permutation(shape_a, shape_b)
        if not fits_first:
            return None  # equal shapes that no layout change maps onto themselves
        if ndim in (4, 5) and (self.b_last and not self.a_last):
            return _to_first(ndim)
        if ndim in (4, 5) and (self.a_last and not self.b_last):
            return _to_last(ndim)
        b_last = self._class_says_last(self.b, pair.b.call_key)
        a_last = self._class_says_last(self.a, pair.a.call_key)
        if b_last and not a_last:
            return _to_first(ndim)
        if a_last and not b_last:
            return _to_last(ndim)
        return None

    def merged(self, pair: Pair) -> transposes.Merged | None:
        """How B's tensor meets A's when one side merged axes the other keeps (diffusers'
        ``(B, C, H*W)`` against an MLX ``(B, H, W, C)``); None when it does not.  B's
        channels-last transpose is tried first when B is channels-last (``--layout
        NHWC``, the rest of the comparison, or its module's framework and class)."""
        if self.mode == "NCHW":
            last = False
        elif self.mode == "NHWC" or self.b_last:
            last = True
        else:
            last = not self.a_last and self._class_says_last(self.b, pair.b.call_key)
        found = transposes.merged_layout(
            tuple(pair.a.shape), tuple(pair.b.shape), channels_last_b=last
        )
        if found is not None:
            self.transposed += found.permutation is not None
        return found

    def describe(self) -> dict[str, Any]:
        side = "NHWC" if self.b_last else "NCHW" if self.a_last else None
        return {"mode": self.mode, "inferred_b": side, "transposed": self.transposed}
