"""The transposes a port's activation layout may need (channels-last vs channels-first).

Ports to MLX keep convolution activations channels-last (NHWC, NLC) where PyTorch is
channels-first.  Pairing (``align.py``), the per-comparison layout decision
(``layout.py``), replay and the operation alignment all ask the same two questions of a
pair of shapes: is one a known transpose of the other, and what is it called.
"""

from __future__ import annotations

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
