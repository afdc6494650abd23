"""diffusers' ``SD3Transformer2DModel`` (MMDiT) against a hand-written MLX port (same weights).

A tiny config: an 8x8 latent with 4 channels in patches of 2 (16 tokens), 2 joint blocks
of 2 heads of 16 (the last one ``context_pre_only``: its text stream ends at the
attention), a 16x16 table of fixed sin-cos position embeddings cropped at the centre.
The port reuses the :mod:`.dit_mlx` blocks and diffusers' names; it works channels-last
as MLX does (an MLX ``Conv2d`` patchifies): it takes the latent NHWC and returns NHWC.  The
timestep is what the SD3 pipeline passes: ``sigma * 1000`` (sines of arguments ~900).

Bugs and the module a verdict must name:

- ``modulation``: ``AdaLayerNormZero`` reads shift and scale swapped, in every block ->
  ``transformer_blocks.0.norm1``.
- ``timestep``: the sinusoidal embedding in [sin, cos] order ->
  ``time_text_embed.time_proj``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as mnn
import torch

from . import dit_mlx as d
from .core import MLX_DTYPES, TORCH_DTYPES, ZooPort, check_case, generator, init_o1, to_mlx

BUGS = ("modulation", "timestep")
CULPRITS = {"modulation": "transformer_blocks.0.norm1", "timestep": "time_text_embed.time_proj"}


@dataclass(frozen=True)
class Sizes:
    sample: int = 8
    patch: int = 2
    channels: int = 4
    layers: int = 2
    heads: int = 2
    head_dim: int = 16
    joint_dim: int = 32
    pooled_dim: int = 16
    pos_max: int = 16
    text_tokens: int = 4
    timestep: float = 900.0

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim


SIZES = Sizes()


@functools.cache
def reference(dtype: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The tiny MMDiT in ``dtype`` and its inputs (latent, text, pooled text, timestep)."""
    from diffusers import SD3Transformer2DModel

    s = SIZES
    gen = generator(seed)
    model: Any = SD3Transformer2DModel(
        sample_size=s.sample,
        patch_size=s.patch,
        in_channels=s.channels,
        out_channels=s.channels,
        num_layers=s.layers,
        attention_head_dim=s.head_dim,
        num_attention_heads=s.heads,
        joint_attention_dim=s.joint_dim,
        caption_projection_dim=s.dim,
        pooled_projection_dim=s.pooled_dim,
        pos_embed_max_size=s.pos_max,
    )
    init_o1(model, gen)
    model = model.to(TORCH_DTYPES[dtype]).eval()
    cast = TORCH_DTYPES[dtype]
    inputs = (
        torch.randn(1, s.channels, s.sample, s.sample, generator=gen).to(cast),
        torch.randn(1, s.text_tokens, s.joint_dim, generator=gen).to(cast),
        torch.randn(1, s.pooled_dim, generator=gen).to(cast),
        torch.tensor([s.timestep]),
    )
    return model, inputs


class PatchEmbed(mnn.Module):
    """Patchify with a strided conv (NHWC), add the centre crop of the position table."""

    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.proj = mnn.Conv2d(s.channels, s.dim, s.patch, stride=s.patch)
        self.pos_embed = mx.zeros((1, s.pos_max * s.pos_max, s.dim))
        self.pos_max = s.pos_max

    def __call__(self, x: mx.array) -> mx.array:
        x = self.proj(x)
        B, H, W, C = x.shape
        top, left = (self.pos_max - H) // 2, (self.pos_max - W) // 2
        table = self.pos_embed.reshape(self.pos_max, self.pos_max, -1)
        pos = table[top : top + H, left : left + W].reshape(1, H * W, -1)
        return (x.reshape(B, H * W, C) + pos).astype(x.dtype)


class JointBlock(mnn.Module):
    """SD3's joint block; ``context_pre_only`` (the last one) returns no text stream."""

    def __init__(self, dim: int, heads: int, context_pre_only: bool) -> None:
        super().__init__()
        self.context_pre_only = context_pre_only
        self.norm1 = d.AdaLayerNormZero(dim)
        self.norm1_context = (
            d.AdaLayerNormContinuous(dim) if context_pre_only else d.AdaLayerNormZero(dim)
        )
        self.attn = d.JointAttention(
            dim, heads, qk_norm=False, context_pre_only=context_pre_only, text_first=False
        )
        self.norm2 = mnn.LayerNorm(dim, eps=1e-6, affine=False)
        self.ff = d.FeedForward(dim)
        if not context_pre_only:
            self.norm2_context = mnn.LayerNorm(dim, eps=1e-6, affine=False)
            self.ff_context = d.FeedForward(dim)

    def __call__(
        self, x: mx.array, context: mx.array, temb: mx.array
    ) -> tuple[mx.array | None, mx.array]:
        h, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(x, temb)
        if self.context_pre_only:
            c = self.norm1_context(context, temb)
        else:
            c, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(context, temb)
        attn, context_attn = self.attn(h, c)
        x = x + gate_msa[:, None] * attn
        h = self.norm2(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        x = x + gate_mlp[:, None] * self.ff(h)
        if self.context_pre_only:
            return None, x
        context = context + c_gate_msa[:, None] * context_attn
        c = self.norm2_context(context) * (1 + c_scale_mlp[:, None]) + c_shift_mlp[:, None]
        return context + c_gate_mlp[:, None] * self.ff_context(c), x


class SD3Transformer(mnn.Module):
    def __init__(self, s: Sizes = SIZES) -> None:
        super().__init__()
        self.patch = s.patch
        self.pos_embed = PatchEmbed(s)
        self.time_text_embed = d.TimeTextEmbed(s.dim, s.pooled_dim)
        self.context_embedder = mnn.Linear(s.joint_dim, s.dim)
        self.transformer_blocks = [
            JointBlock(s.dim, s.heads, context_pre_only=i == s.layers - 1) for i in range(s.layers)
        ]
        self.norm_out = d.AdaLayerNormContinuous(s.dim)
        self.proj_out = mnn.Linear(s.dim, s.patch * s.patch * s.channels)

    def __call__(
        self, latent: mx.array, text: mx.array, pooled: mx.array, timestep: mx.array
    ) -> mx.array:
        B, H, W, C = latent.shape
        x = self.pos_embed(latent)
        temb = self.time_text_embed(timestep, pooled)
        context: mx.array | None = self.context_embedder(text)
        for block in self.transformer_blocks:
            assert context is not None
            context, x = block(x, context, temb)
        x = self.proj_out(self.norm_out(x, temb))
        p, h, w = self.patch, H // self.patch, W // self.patch
        x = x.reshape(B, h, w, p, p, C).transpose(0, 1, 3, 2, 4, 5)
        return x.reshape(B, H, W, C)


def port_weight(value: torch.Tensor) -> mx.array:
    """OIHW conv kernels become OHWI; everything else moves as is."""
    return to_mlx(value.permute(0, 2, 3, 1) if value.ndim == 4 else value)


def build(dtype: str, bug: str | None, seed: int = 0) -> ZooPort:
    check_case("sd3", dtype, bug, BUGS)
    ref, inputs = reference(dtype, seed)
    port = SD3Transformer()
    d.load_from(port, {k: port_weight(v) for k, v in ref.state_dict().items()})
    port.set_dtype(MLX_DTYPES[dtype])
    if bug == "modulation":
        for block in port.transformer_blocks:
            block.norm1.swap_shift_scale = True
            if not block.context_pre_only:
                block.norm1_context.swap_shift_scale = True
    elif bug == "timestep":
        port.time_text_embed.time_proj.flip = False
    return ZooPort(
        arch="sd3",
        dtype=dtype,
        bug=bug,
        ref=ref,
        port=port,
        ref_inputs=inputs,
        port_inputs=(to_mlx(inputs[0].permute(0, 2, 3, 1)), *(to_mlx(t) for t in inputs[1:])),
        culprit=CULPRITS.get(bug) if bug else None,
        layout="NHWC",
    )
