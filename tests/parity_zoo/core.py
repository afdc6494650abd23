"""What every zoo builder shares: the ``ZooPort`` record, dtypes, seeds, weights.

A zoo port is a reference model (PyTorch), a port of it (MLX, or a second PyTorch
implementation) holding the *same* weights in the same dtype, the inputs for each, and,
when a bug was planted in the port, the module where a parity tool must put the blame.

Weights are drawn at O(1) scale on purpose (embeddings ~ N(0, 1), Linear and conv weights
~ N(0, 1/fan_in), norm scales ~ 1 + N(0, 0.1), biases ~ N(0, 0.1)): activations stay
O(1) through every layer, so a relative error means the same thing at every module and
a planted bug cannot hide behind vanishing activations (transformers' default init,
std 0.02, shrinks them until every difference looks small).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np
import torch

DTYPES = ("float32", "bfloat16", "float16")
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MLX_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


class UnknownCase(ValueError):
    """An architecture, dtype or bug the zoo does not build (the message lists the known)."""


@dataclass
class ZooPort:
    """A reference, its port with the same weights, and where a parity tool must look.

    ``culprit`` is the module path (in the reference's names) that a correct verdict
    names as the first divergence, ``None`` for a clean port.  ``map`` is the compare
    map that turns the port's names into the reference's (``None`` when they already
    match).  ``moved_scale`` is ``(module, ratio)`` when the port computes a scale on
    the other side of a module boundary (its entry differs by ``ratio``, the next
    module's input agrees again); ``ratio`` is reference / port.  ``quantized`` is ``{"bits", "group_size"}`` for a
    quantized port.  ``layout`` names the port's activation layout when it differs
    from the reference's (``"NHWC"`` for an MLX conv port of an NCHW model).
    """

    arch: str
    dtype: str
    bug: str | None
    ref: torch.nn.Module
    port: Any
    ref_inputs: tuple[Any, ...]
    port_inputs: tuple[Any, ...]
    culprit: str | None
    port_framework: str = "mlx"
    map: dict[str, Any] | None = None
    moved_scale: tuple[str, float] | None = None
    quantized: dict[str, int] | None = None
    layout: str | None = None
    notes: list[str] = field(default_factory=list)

    def cast_port(self, dtype: str) -> ZooPort:
        """Run the port in another dtype than the reference (an fp32 reference checking a
        bf16 port, say): its parameters and float inputs are cast; returns ``self``."""
        if self.port_framework == "torch":
            self.port = self.port.to(TORCH_DTYPES[dtype])
            cast: Any = lambda t: t.to(TORCH_DTYPES[dtype]) if t.is_floating_point() else t  # noqa: E731
        else:
            self.port.set_dtype(MLX_DTYPES[dtype])
            floating = (mx.float32, mx.bfloat16, mx.float16)
            cast = lambda a: a.astype(MLX_DTYPES[dtype]) if a.dtype in floating else a  # noqa: E731
        self.port_inputs = tuple(cast(x) for x in self.port_inputs)
        self.notes.append(f"port cast to {dtype}")
        return self

    def run_ref(self) -> torch.Tensor:
        """One inference forward of the reference; its main output (logits, latents)."""
        with torch.no_grad():
            out = self.ref(*self.ref_inputs)
        return _main_output(out)

    def run_port(self) -> Any:
        """One inference forward of the port; its main output, evaluated."""
        if self.port_framework == "torch":
            with torch.no_grad():
                out = self.port(*self.port_inputs)
            return _main_output(out)
        out = self.port(*self.port_inputs)
        mx.eval(out)
        return out


def _main_output(out: Any) -> Any:
    """Logits of a language model, the sample of a diffusers model, else ``out``."""
    for field_name in ("logits", "sample"):
        if hasattr(out, field_name):
            return getattr(out, field_name)
    return out


def generator(seed: int) -> torch.Generator:
    """Seed both frameworks and return the generator every weight is drawn from."""
    torch.manual_seed(seed)
    mx.random.seed(seed)
    return torch.Generator().manual_seed(seed)


@torch.no_grad()
def init_o1(model: torch.nn.Module, gen: torch.Generator, *, norm_center: float = 1.0) -> None:
    """Redraw every parameter at O(1) scale (see the module docstring for why).

    ``norm_center`` is where norm scales sit: 1 for ``x * w`` norms, 0 for Gemma's
    ``x * (1 + w)``.  A norm is a module whose class name says ``Norm``.  transformers'
    ``Conv1D`` (GPT-2) stores its weight as (in, out), so its fan-in is the first axis.
    """
    for module in model.modules():
        is_norm = "Norm" in type(module).__name__
        for name, p in module.named_parameters(recurse=False):
            if p.ndim == 1 and is_norm and name == "weight":
                p.copy_(norm_center + 0.1 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:  # biases, norm shifts
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif isinstance(module, torch.nn.Embedding):
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[0] if type(module).__name__ == "Conv1D" else math.prod(p.shape[1:])
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))


def to_mlx(t: torch.Tensor) -> mx.array:
    """A torch tensor as an MLX array of the same dtype (exact: through float32)."""
    dtype = {v: k for k, v in TORCH_DTYPES.items()}[t.dtype]
    return mx.array(t.detach().float().numpy()).astype(MLX_DTYPES[dtype])


def as_numpy(x: Any) -> np.ndarray:
    """A torch tensor or MLX array as float32 numpy (bf16 and fp16 widen exactly)."""
    if isinstance(x, torch.Tensor):
        return x.detach().float().numpy()
    return np.array(x.astype(mx.float32))


def check_case(arch: str, dtype: str, bug: str | None, bugs: tuple[str, ...]) -> None:
    if dtype not in DTYPES:
        raise UnknownCase(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    if bug is not None and bug not in bugs:
        raise UnknownCase(f"{arch} has no bug {bug!r}; known: {', '.join(bugs)}")


def swap_class(module: Any, make: Callable[[type], type]) -> None:
    """Plant a bug in one port instance: its class becomes ``make(its class)``.

    Only this instance changes; the library class and every other instance stay as
    they were, so the bug sits in exactly one module path.
    """
    module.__class__ = make(type(module))


def dequantized_reference(z: ZooPort) -> torch.nn.Module:
    """A copy of ``z``'s reference holding its quantized port's weights as the port
    computes with them (``mx.dequantize`` of each quantized module, names unchanged), in
    float32: the better run a quantized port is judged against (``compare --better``)."""
    import copy

    state = {k: v.detach().clone() for k, v in z.ref.state_dict().items()}
    for path, module in z.port.named_modules():
        if not hasattr(module, "bits") or "scales" not in module:
            continue
        weight = mx.dequantize(
            module["weight"],
            module["scales"],
            module.get("biases"),
            group_size=module.group_size,
            bits=module.bits,
        )
        key = f"{path}.weight"
        assert key in state, key
        state[key] = torch.from_numpy(np.array(weight.astype(mx.float32)))
    ref = copy.deepcopy(z.ref).float()
    ref.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return ref.eval()
