"""The transposes a port's activation layout may need (channels-last vs channels-first).

Ports to MLX keep convolution activations channels-last (NHWC, NLC) where PyTorch is
channels-first.  Pairing (``align.py``), the per-comparison layout decision
(``layout.py``), replay and the operation alignment all ask the same two questions of a
pair of shapes: is one a known transpose of the other, and what is it called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# channels-last -> channels-first first (the usual MLX-port-vs-PyTorch case), then back.
_LAYOUT_CANDIDATES: dict[int, tuple[tuple[int, ...], ...]] = {
    2: ((1, 0),),
    3: ((0, 2, 1),),
    4: ((0, 3, 1, 2), (0, 2, 3, 1)),
    5: ((0, 4, 1, 2, 3), (0, 2, 3, 4, 1)),
}


# Names for the permutations ports most often need: channels-last vision and audio.
LAYOUT_NAMES: dict[tuple[int, ...], str] = {
    (0, 3, 1, 2): "NHWC→NCHW",
    (0, 2, 3, 1): "NCHW→NHWC",
    (0, 4, 1, 2, 3): "NDHWC→NCDHW",
    (0, 2, 3, 4, 1): "NCDHW→NDHWC",
    (0, 2, 1): "NLC→NCL",
    (1, 0): "transposed",
}


def layout_name(permutation: tuple[int, ...]) -> str:
    """What a person calls the layout change ``permutation`` undoes (``NHWC→NCHW``)."""
    return LAYOUT_NAMES.get(tuple(permutation), f"transposed {list(permutation)}")


def layout_permutation(
    shape_a: tuple[int, ...], shape_b: tuple[int, ...]
) -> tuple[int, ...] | None:
    """The axes ``p`` with ``b.transpose(p).shape == shape_a``, for a layout-only difference.

    Ports to MLX keep convolution activations channels-last (NHWC, NLC) where PyTorch is
    channels-first; such a pair holds the same numbers in a different order, so it should
    be compared after a transpose rather than reported as a shape error.  Only these
    transposes are tried, channels-last-to-first first: 4-D ``(0, 3, 1, 2)`` then
    ``(0, 2, 3, 1)``, 5-D the same, 3-D ``(0, 2, 1)``, 2-D ``(1, 0)``.  ``None`` when the
    shapes are already equal (an ambiguous square case is compared as is) or nothing fits.
    """
    shape_a, shape_b = tuple(shape_a), tuple(shape_b)
    if shape_a == shape_b or len(shape_a) != len(shape_b):
        return None
    for perm in _LAYOUT_CANDIDATES.get(len(shape_a), ()):
        if tuple(shape_b[axis] for axis in perm) == shape_a:
            return perm
    return None


@dataclass(frozen=True)
class Merged:
    """Two shapes that hold the same elements once one side's merged axes are split and
    B's are transposed: A viewed as ``shape_a``, B viewed as ``shape_b`` then transposed
    by ``permutation`` (None: the same order, only axes merged) give one shape.

    diffusers' VAE attention normalizes ``(B, C, H*W)`` where an MLX port normalizes its
    channels-last ``(B, H, W, C)``; an attention's ``(B, L, heads * dim)`` meets
    ``(B, L, heads, dim)``.  Splitting an axis of a contiguous array is a view, so both
    are compared element for element without a copy."""

    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    permutation: tuple[int, ...] | None

    @property
    def name(self) -> str:
        if self.permutation is None:
            return "axes merged"
        return f"{layout_name(self.permutation)}, axes merged"


def merged_layout(
    shape_a: tuple[int, ...], shape_b: tuple[int, ...], *, channels_last_b: bool
) -> Merged | None:
    """How ``shape_b`` meets ``shape_a`` when one has axes the other merged (their
    numbers of axes differ), trying B's channels-last-to-first transpose first when B
    is channels-last (``channels_last_b``), the same order first otherwise; None when
    neither fits."""
    shape_a, shape_b = tuple(shape_a), tuple(shape_b)
    if len(shape_a) == len(shape_b) or math.prod(shape_a) != math.prod(shape_b):
        return None
    fine = max(len(shape_a), len(shape_b))
    swaps = _LAYOUT_CANDIDATES.get(fine, ())
    ordered = [*swaps, None] if channels_last_b else [None, *swaps]
    for perm in ordered:
        axes = perm if perm is not None else tuple(range(fine))
        if len(shape_b) == fine:  # B is split: its transpose must merge into A
            split = tuple(shape_b[axis] for axis in axes)
            if _merges(split, shape_a):
                return Merged(split, shape_b, perm)
        else:  # A is split: B, split like A's transpose back, then transposed
            back = [0] * fine
            for i, axis in enumerate(axes):
                back[axis] = shape_a[i]
            if _merges(tuple(back), shape_b):
                return Merged(shape_a, tuple(back), perm)
    return None


def _merges(fine: tuple[int, ...], coarse: tuple[int, ...]) -> bool:
    """Whether runs of adjacent axes of ``fine`` multiply out to ``coarse``'s axes."""
    at, product = 0, 1
    for size in fine:
        product *= size
        if at < len(coarse) and product == coarse[at]:
            at, product = at + 1, 1
        elif at >= len(coarse) and size != 1:
            return False
    return at == len(coarse) and product == 1
