"""One side's parameters, as the audit reads them: names, shapes, dtypes, and a reader each.

Collected from a module, a dict of tensors, files, a capture or ranks (``collect.py``,
``ranks.py``), they are read (as float64 numpy) only when a pair is judged, so an audit
of a large checkpoint holds two parameters in memory at a time, not the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from .quantized import Packed, QuantSpec

if TYPE_CHECKING:  # numpy is imported where parameters are read
    import numpy as np
    import numpy.typing as npt
    import torch

    Values: TypeAlias = npt.NDArray[np.float64]  # a parameter's values, in float64


# One parameter's row of the audit: name, name_port, status, note, shapes and dtypes, and
# per status its own fields (layout, quant, fused, cosine, agree): results.WeightAudit.
Row: TypeAlias = "dict[str, Any]"
# The audit's answer (results.WeightAudit, with every parameter's row in ``parameters``).
Audit: TypeAlias = "dict[str, Any]"


@dataclass
class Params:
    """Parameters by name, each read (as float64 numpy) only when compared.

    A quantized weight (``quant``) reads as the values its codes decode to, with each
    element's allowance beside them (see ``quantized.py``); its ``scales``/``biases``
    are folded into it.  ``packed`` holds the quantized weights found but not yet
    resolved (their settings may need the reference's shape); ``unresolved`` the reason
    for those whose settings no source gives."""

    label: str
    framework: str | None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    readers: dict[str, Callable[[], Values]] = field(default_factory=dict)
    packed: dict[str, Packed] = field(default_factory=dict)
    settings: dict[str, Any] | None = None  # quantization given or from config.json
    settings_source: str = ""
    quant: dict[str, QuantSpec] = field(default_factory=dict)
    decoders: dict[str, Callable[[], tuple[Values, Values]]] = field(default_factory=dict)
    unresolved: dict[str, str] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)  # module path: class, when known
    ranks: list[str] = field(default_factory=list)  # the captures gathered, rank by rank
    buffers: set[str] = field(default_factory=set)  # names that are buffers, when known

    def read(self, name: str) -> Values:
        if name in self.decoders:
            return self.decoders[name]()[0]
        return self.readers[name]()

    def read_with_allowance(self, name: str) -> tuple[Values, Values | float]:
        """The values and how far each may be from the reference's for a reason other
        than a bug (quantization); 0.0 for a plain parameter."""
        if name in self.decoders:
            return self.decoders[name]()
        return self.readers[name](), 0.0


def to_float64(value: Any) -> Values:
    """A torch, MLX or numpy tensor as a float64 numpy array (bf16 exactly)."""
    import numpy as np

    module = type(value).__module__
    if module.startswith("torch"):
        return value.detach().to(dtype=_torch_float64()).cpu().numpy()
    if module.startswith("mlx"):
        import mlx.core as mx

        if mx.issubdtype(value.dtype, mx.floating) and value.dtype != mx.float32:
            value = value.astype(mx.float32)
        return np.array(value).astype(np.float64)
    return np.asarray(value).astype(np.float64)


def _torch_float64() -> torch.dtype:
    import torch

    return torch.float64
