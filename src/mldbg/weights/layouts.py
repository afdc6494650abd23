"""Which axes' order makes two parameters equal: the port framework's layout or a mistake.

MLX convolutions are channels-last and a ConvTranspose kernel is stored input-first, so a
port's kernel is often the reference's permuted, rightly (``EXPECTED_LAYOUTS``) or by
mistake; a 1×1 convolution's kernel may be kept as a linear weight (axes of size 1).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from .closeness import close

if TYPE_CHECKING:
    from .params import Params, Values

# Layout conversions a port is expected to make (MLX convolutions are channels-last; a
# torch ConvTranspose kernel is (in, out, k…), MLX's (out, k…, in)).
EXPECTED_LAYOUTS = {
    "OIHW→OHWI",
    "OIL→OLI",
    "OIDHW→ODHWI",
    "IOHW→OHWI",
    "IOL→OLI",
    "IODHW→ODHWI",
    "IO→OI",
}
_LETTERS = {2: "OI", 3: "OIL", 4: "OIHW", 5: "OIDHW"}
# Kernels stored input-first: torch's ConvTranspose (in, out, k…) and transformers'
# ``Conv1D`` (GPT-2's projections: (in, out), a Linear's weight transposed).
_INPUT_FIRST_LETTERS = {2: "IO", 3: "IOL", 4: "IOHW", 5: "IODHW"}
MAX_PERMUTED_DIMS = 5


def is_transposed_conv(side: Params, name: str) -> bool:
    """Whether ``name`` is an input-first kernel: a ConvTranspose module's, or the weight
    of transformers' ``Conv1D`` (known from a module or a capture's classes; files do
    not say)."""
    cls = side.classes.get(name.rpartition(".")[0], "")
    return "ConvTranspose" in cls or (cls == "Conv1D" and len(side.shapes.get(name, ())) == 2)


def layout_hint(layout: str, transposed_conv: bool) -> str:
    if layout == "OI→IO":
        return " (a transposed linear weight)"
    if transposed_conv and layout.startswith("IO") and layout.endswith("O"):
        return " (a transposed convolution converted as a convolution: MLX wants it O…I)"
    if not transposed_conv and layout in ("OIHW→IHWO", "OIL→ILO", "OIDHW→IDHWO"):
        return (
            " unless this is a ConvTranspose kernel (torch IO…, MLX O…I: this is then its "
            "right layout): audit the modules or captures so the class is known"
        )
    return ""


def permuted_layout(
    a: Values,
    b: Values,
    u: float,
    slack_a: Values | float = 0.0,
    slack_b: Values | float = 0.0,
    transposed_conv: bool = False,
    letters: str | None = None,
) -> str | None:
    """``"OIHW→OHWI"``: the port's axes, in the reference's letters (``IOHW`` for a
    ConvTranspose kernel), when ``b`` equals ``a`` only through a permutation (None when
    none does)."""
    import numpy as np

    if a.ndim != b.ndim or a.ndim < 2 or a.ndim > MAX_PERMUTED_DIMS:
        return None
    if letters is None:
        letters = _INPUT_FIRST_LETTERS[a.ndim] if transposed_conv else _LETTERS[a.ndim]
    identity = tuple(range(a.ndim))
    for perm in itertools.permutations(range(a.ndim)):
        if perm == identity:
            continue
        if tuple(b.shape[p] for p in perm) != a.shape:
            continue
        moved = slack_b if isinstance(slack_b, float) else np.transpose(slack_b, perm)
        if close(a, b.transpose(perm), u, slack_a, moved):
            port_letters = [""] * a.ndim
            for i, p in enumerate(perm):
                port_letters[p] = letters[i]
            return f"{letters}→{''.join(port_letters)}"
    return None


def unit_axes(
    a: Values,
    b: Values,
    u: float,
    slack_a: Values | float,
    slack_b: Values | float,
    transposed_conv: bool,
) -> tuple[str, bool] | None:
    """Two shapes that differ only by axes of size 1 (a 1×1 convolution's kernel
    ``(O, I, 1, 1)`` kept as a linear weight ``(O, I)``, or a linear weight as MLX's 1×1
    convolution ``(O, 1, 1, I)``): ``("OIHW→OI", True)`` when the values agree in the same
    order (the port's unit axes written ``1``), ``("OIHW→IO", False)`` when only through a
    permutation of the other axes; None otherwise."""
    import numpy as np

    if a.size != b.size or a.shape == b.shape or a.ndim > MAX_PERMUTED_DIMS:
        return None
    if b.ndim > MAX_PERMUTED_DIMS or max(a.ndim, b.ndim) < 2:
        return None
    full = (
        _INPUT_FIRST_LETTERS.get(a.ndim, _LETTERS.get(a.ndim, ""))
        if transposed_conv
        else _LETTERS.get(a.ndim, "")
    ) or "X" * a.ndim
    kept = [i for i, n in enumerate(a.shape) if n != 1]
    letters = "".join(full[i] for i in kept)
    squeezed_a = a.reshape([a.shape[i] for i in kept])
    squeezed_b = b.reshape([n for n in b.shape if n != 1])

    def squeezed(slack: Values | float, shape: tuple[int, ...]) -> Values | float:
        return slack if isinstance(slack, float) else np.reshape(slack, shape)

    slack_a2 = squeezed(slack_a, squeezed_a.shape)
    slack_b2 = squeezed(slack_b, squeezed_b.shape)
    if squeezed_a.shape == squeezed_b.shape and close(
        squeezed_a, squeezed_b, u, slack_a2, slack_b2
    ):
        order = iter(letters)
        port = "".join("1" if n == 1 else next(order) for n in b.shape)
        return f"{full}→{port}", True
    moved = permuted_layout(squeezed_a, squeezed_b, u, slack_a2, slack_b2, letters=letters)
    if moved is not None:
        return f"{full}→{moved.split('→')[1]}", False
    return None
