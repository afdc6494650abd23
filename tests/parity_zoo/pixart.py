"""diffusers' ``PixArtTransformer2DModel`` (a DiT with adaLN-single and cross-attention)
against a hand-written MLX port (same weights, diffusers' names).

A tiny config: an 8x8 latent with 4 channels in patches of 2 (16 tokens), 2 blocks of 2
heads of 16, a caption of 6 tokens of 24 channels, 8 output channels (PixArt's learned
sigma).  What PixArt does differently from Flux and SD3: one timestep embedding
(``adaln_single``) makes a (6 x dim) modulation that each block adds to its own
``scale_shift_table`` and applies *inline* (shift, scale and gate of the attention and
the MLP are computed in the block, between its ``norm1``/``attn1``/``norm2``/``ff``
children); text enters through cross-attention (``attn2``); the output is modulated by
the root's own ``scale_shift_table``.  The port works channels-last (an MLX ``Conv2d``
patchifies), takes the latent NHWC and returns NHWC; the fixed sin-cos position table
(a buffer diffusers does not save) is copied, as a port precomputes it.

Bugs and the module a verdict must name:

- ``modulation``: every block reads the attention's shift and scale swapped (inline, in
  the block) -> ``transformer_blocks.0``, whose children all agree on their inputs
  until its own inline arithmetic hands ``attn1`` a different one.
- ``timestep``: the sinusoidal embedding in [sin, cos] order ->
  ``adaln_single.emb.time_proj``.
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
from .sd3 import port_weight

BUGS = ("modulation", "timestep")
CULPRITS = {"modulation": "transformer_blocks.0", "timestep": "adaln_single.emb.time_proj"}


@dataclass(frozen=True)
class Sizes:
    sample: int = 8
    patch: int = 2
    channels: int = 4
    out_channels: int = 8
    layers: int = 2
    heads: int = 2
    head_dim: int = 16
    caption_channels: int = 24
    caption_tokens: int = 6
    timestep: float = 900.0

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim


SIZES = Sizes()


@functools.cache
def reference(dtype: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The tiny PixArt in ``dtype`` and its inputs (latent, caption, timestep)."""
    from diffusers import PixArtTransformer2DModel

    s = SIZES
    gen = generator(seed)
    model: Any = PixArtTransformer2DModel(
        num_attention_heads=s.heads,
        attention_head_dim=s.head_dim,
        in_channels=s.channels,
        out_channels=s.out_channels,
        num_layers=s.layers,
        cross_attention_dim=s.dim,
        sample_size=s.sample,
        patch_size=s.patch,
        caption_channels=s.caption_channels,
    )
    init_o1(model, gen)
    with torch.no_grad():  # the modulation tables at O(0.1), as trained ones sit
        for name, p in model.named_parameters():
            if name.endswith("scale_shift_table"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    model = model.to(TORCH_DTYPES[dtype]).eval()
    cast = TORCH_DTYPES[dtype]
    inputs = (
        torch.randn(1, s.channels, s.sample, s.sample, generator=gen).to(cast),
        torch.randn(1, s.caption_tokens, s.caption_channels, generator=gen).to(cast),
        torch.tensor([s.timestep]),
    )
    return model, inputs


class PatchEmbed(mnn.Module):
    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.proj = mnn.Conv2d(s.channels, s.dim, s.patch, stride=s.patch)
        tokens = (s.sample // s.patch) ** 2
        self.pos_embed = mx.zeros((1, tokens, s.dim))  # diffusers' fixed sin-cos table

    def __call__(self, x: mx.array) -> mx.array:
        x = self.proj(x)
        B, H, W, C = x.shape
        return (x.reshape(B, H * W, C) + self.pos_embed).astype(x.dtype)


class Attention(mnn.Module):
    """diffusers' ``Attention``: self-attention, or cross-attention on ``context``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = mnn.Linear(dim, dim)
        self.to_k = mnn.Linear(dim, dim)
        self.to_v = mnn.Linear(dim, dim)
        self.to_out = [mnn.Linear(dim, dim), mnn.Dropout(0.0)]

    def __call__(self, x: mx.array, context: mx.array | None = None) -> mx.array:
        source = x if context is None else context
        B, N, C = x.shape
        q, k, v = self.to_q(x), self.to_k(source), self.to_v(source)
        q, k, v = (
            t.reshape(B, t.shape[1], self.heads, -1).transpose(0, 2, 1, 3) for t in (q, k, v)
        )
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=q.shape[-1] ** -0.5)
        out = out.transpose(0, 2, 1, 3).reshape(B, N, C)
        return self.to_out[1](self.to_out[0](out))


class Block(mnn.Module):
    """``BasicTransformerBlock`` with ``ada_norm_single``: the modulation is inline."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = mnn.LayerNorm(dim, eps=1e-6, affine=False)
        self.attn1 = Attention(dim, heads)
        self.norm2 = mnn.LayerNorm(dim, eps=1e-6, affine=False)
        self.attn2 = Attention(dim, heads)
        self.ff = d.FeedForward(dim)
        self.scale_shift_table = mx.zeros((6, dim))
        self.swap_shift_scale = False

    def __call__(self, x: mx.array, context: mx.array, t: mx.array) -> mx.array:
        table = self.scale_shift_table[None] + t.reshape(x.shape[0], 6, -1)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            table[:, i : i + 1] for i in range(6)
        )
        if self.swap_shift_scale:
            shift_msa, scale_msa = scale_msa, shift_msa
        x = x + gate_msa * self.attn1(self.norm1(x) * (1 + scale_msa) + shift_msa)
        x = x + self.attn2(x, context)
        return x + gate_mlp * self.ff(self.norm2(x) * (1 + scale_mlp) + shift_mlp)


class CombinedEmbedding(mnn.Module):
    """``PixArtAlphaCombinedTimestepSizeEmbeddings`` without size conditions."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.time_proj = d.Timesteps(256)
        self.timestep_embedder = d.TimestepEmbedding(256, dim)

    def __call__(self, timestep: mx.array, dtype: Any) -> mx.array:
        return self.timestep_embedder(self.time_proj(timestep).astype(dtype))


class AdaLayerNormSingle(mnn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.emb = CombinedEmbedding(dim)
        self.silu = mnn.SiLU()
        self.linear = mnn.Linear(dim, 6 * dim)

    def __call__(self, timestep: mx.array, dtype: Any) -> tuple[mx.array, mx.array]:
        embedded = self.emb(timestep, dtype)
        return self.linear(self.silu(embedded)), embedded


class CaptionProjection(mnn.Module):
    """``PixArtAlphaTextProjection``: Linear, GELU (tanh), Linear."""

    def __init__(self, channels: int, dim: int) -> None:
        super().__init__()
        self.linear_1 = mnn.Linear(channels, dim)
        self.act_1 = mnn.GELU(approx="precise")
        self.linear_2 = mnn.Linear(dim, dim)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear_2(self.act_1(self.linear_1(x)))


class PixArtTransformer(mnn.Module):
    def __init__(self, s: Sizes = SIZES) -> None:
        super().__init__()
        self.patch = s.patch
        self.out_channels = s.out_channels
        self.pos_embed = PatchEmbed(s)
        self.transformer_blocks = [Block(s.dim, s.heads) for _ in range(s.layers)]
        self.norm_out = mnn.LayerNorm(s.dim, eps=1e-6, affine=False)
        self.proj_out = mnn.Linear(s.dim, s.patch * s.patch * s.out_channels)
        self.scale_shift_table = mx.zeros((2, s.dim))
        self.adaln_single = AdaLayerNormSingle(s.dim)
        self.caption_projection = CaptionProjection(s.caption_channels, s.dim)

    def __call__(self, latent: mx.array, caption: mx.array, timestep: mx.array) -> mx.array:
        B, H, W, _C = latent.shape
        x = self.pos_embed(latent)
        t, embedded = self.adaln_single(timestep, x.dtype)
        context = self.caption_projection(caption)
        for block in self.transformer_blocks:
            x = block(x, context, t)
        shift, scale = mx.split(self.scale_shift_table[None] + embedded[:, None], 2, axis=1)
        x = self.proj_out(self.norm_out(x) * (1 + scale) + shift)
        p, h, w = self.patch, H // self.patch, W // self.patch
        x = x.reshape(B, h, w, p, p, self.out_channels).transpose(0, 1, 3, 2, 4, 5)
        return x.reshape(B, H, W, self.out_channels)


def build(dtype: str, bug: str | None, seed: int = 0) -> ZooPort:
    check_case("pixart", dtype, bug, BUGS)
    ref, inputs = reference(dtype, seed)
    port = PixArtTransformer()
    weights = {k: port_weight(v) for k, v in ref.state_dict().items()}
    weights["pos_embed.pos_embed"] = to_mlx(ref.pos_embed.pos_embed)  # not in the state dict
    d.load_from(port, weights)
    port.set_dtype(MLX_DTYPES[dtype])
    port.pos_embed.pos_embed = to_mlx(ref.pos_embed.pos_embed)  # float32, as diffusers adds it
    if bug == "modulation":
        for block in port.transformer_blocks:
            block.swap_shift_scale = True
    elif bug == "timestep":
        port.adaln_single.emb.time_proj.flip = False
    return ZooPort(
        arch="pixart",
        dtype=dtype,
        bug=bug,
        ref=ref,
        port=port,
        ref_inputs=inputs,
        port_inputs=(to_mlx(inputs[0].permute(0, 2, 3, 1)), *(to_mlx(t) for t in inputs[1:])),
        culprit=CULPRITS.get(bug) if bug else None,
        layout="NHWC",
    )
