"""Diffusers DiTs whose attention logits are large: the inline softmax is ill-conditioned.

The attention of diffusers' Flux and SD3 computes its projections in ``Linear`` children
and everything else inline (in the attention processor): q.k, the softmax, the rotary
embedding, SDPA.  With O(1) weights the logits are O(1) and that inline work rounds like
a matmul; real checkpoints, and ports of them, often have logits one or two orders larger
(no QK-norm, or norm scales far from 1), where one rounding step of q or k moves the
softmax by many steps.  These fixtures scale the weights that set the logits, in the
reference before the port copies them, so both sides hold the same model:

- ``flux``: diffusers' ``FluxTransformer2DModel`` (:mod:`.flux`) with its QK-norm scales
  (``norm_q``, ``norm_k``, ``norm_added_q``, ``norm_added_k``) times ``FLUX_SCALE``: the
  logits grow by its square (16).
- ``sd3``: diffusers' ``SD3Transformer2DModel`` (:mod:`.sd3`, no QK-norm) with the query
  and key projections (``to_q``, ``to_k``, ``add_q_proj``, ``add_k_proj``) times
  ``SD3_SCALE``: the logits grow by 64.

Before capture measured the inline work of calls with children, a *clean* port of either
exits 1 in float32 and bfloat16, blamed at an attention (``transformer_blocks.1.attn``:
its output error ~9x its inputs', the softmax amplifying the timestep embedding's
explained rounding).

Bugs, each inside the attention's inline computation of ``transformer_blocks.0`` only,
and named there (``transformer_blocks.0.attn``):

- ``softmax_scale``: logits scaled by ``1/head_dim`` instead of ``1/sqrt(head_dim)``.
- ``rope`` (Flux): rotary pairs (x_i, x_{i+d/2}) instead of Flux's interleaved pairs.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

from . import dit_mlx as d
from . import flux, sd3
from .core import MLX_DTYPES, TORCH_DTYPES, ZooPort, check_case, to_mlx

FLUX_SCALE = 4.0
SD3_SCALE = 8.0
BUGS = {"flux": ("softmax_scale", "rope"), "sd3": ("softmax_scale",)}
CULPRIT = "transformer_blocks.0.attn"
_LOGIT_WEIGHTS = {
    "flux": ("norm_q.weight", "norm_k.weight", "norm_added_q.weight", "norm_added_k.weight"),
    "sd3": ("to_q.weight", "to_k.weight", "add_q_proj.weight", "add_k_proj.weight"),
}
_SCALES = {"flux": FLUX_SCALE, "sd3": SD3_SCALE}


@functools.cache
def reference(
    arch: str, dtype: str, seed: int = 0
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The tiny model of ``arch`` with its logit-setting weights scaled, in ``dtype``."""
    base, inputs = (flux if arch == "flux" else sd3).reference("float32", seed)
    model: Any = copy.deepcopy(base)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith(_LOGIT_WEIGHTS[arch]):
                weight.mul_(_SCALES[arch])
    cast = TORCH_DTYPES[dtype]
    model = model.to(cast).eval()
    # The float inputs in the model's dtype, as the pipelines pass them (Flux's sigma
    # too; SD3's timestep and the position ids stay as they are).
    floats = 4 if arch == "flux" else 3
    cast_inputs = tuple(
        t.to(cast) if i < floats and t.is_floating_point() else t for i, t in enumerate(inputs)
    )
    return model, cast_inputs


def build(arch: str, dtype: str, bug: str | None = None, seed: int = 0) -> ZooPort:
    check_case(f"large-logits {arch}", dtype, bug, BUGS[arch])
    ref, inputs = reference(arch, dtype, seed)
    port: Any
    if arch == "flux":
        port = flux.FluxTransformer()
        d.load_from(port, {k: to_mlx(v) for k, v in ref.state_dict().items()})
        port_inputs = tuple(to_mlx(t) for t in inputs)
    else:
        port = sd3.SD3Transformer()
        d.load_from(port, {k: sd3.port_weight(v) for k, v in ref.state_dict().items()})
        port_inputs = (to_mlx(inputs[0].permute(0, 2, 3, 1)), *(to_mlx(t) for t in inputs[1:]))
    port.set_dtype(MLX_DTYPES[dtype])
    attention = port.transformer_blocks[0].attn
    if bug == "softmax_scale":
        attention.softmax_scale = attention.head_dim**-1.0
    elif bug == "rope":
        attention.rope_halves = True
    return ZooPort(
        arch=f"{arch}-large-logits",
        dtype=dtype,
        bug=bug,
        ref=ref,
        port=port,
        ref_inputs=inputs,
        port_inputs=port_inputs,
        culprit=CULPRIT if bug else None,
        layout="NHWC" if arch == "sd3" else None,
    )
