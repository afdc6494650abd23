"""diffusers' ``FluxTransformer2DModel`` against a hand-written MLX port (same weights).

A tiny config (2 joint blocks, 2 single-stream blocks, 2 heads of 16, rotary axes
(4, 6, 6)): the port in :mod:`.dit_mlx` blocks keeps diffusers' module names, so the
captures pair without a map.  Inputs are what a Flux pipeline gives its transformer:
packed latents (1, 16, 16), text embeddings (1, 4, 32), a pooled text vector, the
timestep as a sigma in [0, 1] (the model multiplies it by 1000: sines of arguments up
to ~900, the ill-conditioned op a parity tool must not blame) and the position ids.

Bugs and the module a verdict must name:

- ``rope``: the port rotates halves (x_i, x_{i+d/2}) instead of Flux's interleaved pairs
  -> ``transformer_blocks.0.attn``, the first attention (RoPE is applied inside it).
- ``modulation``: ``AdaLayerNormZero`` reads shift and scale swapped, in every block ->
  ``transformer_blocks.0.norm1``, the first one to run.
- ``timestep``: the sinusoidal embedding in [sin, cos] order (``flip_sin_to_cos``
  forgotten) -> ``time_text_embed.time_proj``.
- ``single_modulation``: one single-stream block (the middle one) reads its shift and
  scale swapped -> ``single_transformer_blocks.<k>.norm``.

``REAL_WIDTH`` and ``REAL_DEPTH`` are FLUX.1's sizes (issue 33, item 6): one double and
one single block at hidden 3,072 (24 heads of 128, rotary axes (16, 56, 56), 64 latent
channels, 4,096-dim text, 768-dim pooled) over 1,024 image and 256 text tokens; and
19 + 38 blocks at the tiny width.  ``sizes=`` takes either (``benchmarks/real_sizes.py``
runs them; ``tests/test_parity_real_sizes.py`` runs the depth and a width with fewer
tokens).
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

BUGS = ("rope", "modulation", "timestep")
REAL_SIZE_BUGS = ("single_modulation",)  # built on request, not in the zoo's sweep
CULPRITS = {
    "rope": "transformer_blocks.0.attn",
    "modulation": "transformer_blocks.0.norm1",
    "timestep": "time_text_embed.time_proj",
}


@dataclass(frozen=True)
class Sizes:
    in_channels: int = 16
    layers: int = 2
    single_layers: int = 2
    heads: int = 2
    head_dim: int = 16
    joint_dim: int = 32
    pooled_dim: int = 16
    axes: tuple[int, int, int] = (4, 6, 6)
    image_side: int = 4  # 4 x 4 packed latent tokens
    text_tokens: int = 4
    sigma: float = 0.9

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim


SIZES = Sizes()
REAL_WIDTH = Sizes(
    in_channels=64,
    layers=1,
    single_layers=1,
    heads=24,
    head_dim=128,
    joint_dim=4096,
    pooled_dim=768,
    axes=(16, 56, 56),
    image_side=32,
    text_tokens=256,
)
REAL_DEPTH = Sizes(layers=19, single_layers=38)


def culprit(bug: str, s: Sizes = SIZES) -> str:
    """The module a verdict must name for ``bug`` in a model of sizes ``s``."""
    if bug == "single_modulation":
        return f"single_transformer_blocks.{s.single_layers // 2}.norm"
    return CULPRITS[bug]


def config(s: Sizes = SIZES) -> dict[str, Any]:
    """The diffusers config of the tiny model (also used by the pipeline tests)."""
    return {
        "patch_size": 1,
        "in_channels": s.in_channels,
        "num_layers": s.layers,
        "num_single_layers": s.single_layers,
        "attention_head_dim": s.head_dim,
        "num_attention_heads": s.heads,
        "joint_attention_dim": s.joint_dim,
        "pooled_projection_dim": s.pooled_dim,
        "axes_dims_rope": s.axes,
    }


def image_ids(side: int) -> torch.Tensor:
    """Flux's latent position ids: (0, row, column) per token."""
    ids = torch.zeros(side, side, 3)
    ids[..., 1] = torch.arange(side)[:, None]
    ids[..., 2] = torch.arange(side)[None, :]
    return ids.reshape(side * side, 3)


@functools.cache
def reference(
    dtype: str, seed: int = 0, s: Sizes = SIZES
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The transformer (tiny unless ``s`` says otherwise) in ``dtype`` and its inputs
    (latents, text, pooled, sigma, ids)."""
    from diffusers import FluxTransformer2DModel

    gen = generator(seed)
    model: Any = FluxTransformer2DModel(**config(s))
    init_o1(model, gen)
    model = model.to(TORCH_DTYPES[dtype]).eval()
    cast = TORCH_DTYPES[dtype]
    inputs = (
        torch.randn(1, s.image_side**2, s.in_channels, generator=gen).to(cast),
        torch.randn(1, s.text_tokens, s.joint_dim, generator=gen).to(cast),
        torch.randn(1, s.pooled_dim, generator=gen).to(cast),
        torch.tensor([s.sigma]).to(cast),
        image_ids(s.image_side),
        torch.zeros(s.text_tokens, 3),
    )
    return model, inputs


class PosEmbed(mnn.Module):
    """Rotary tables for ids (tokens, 3): per axis cos/sin of id * theta^(-2i/d),
    each repeated twice (interleaved pairs), in float32."""

    def __init__(self, axes: tuple[int, ...], theta: float = 10000.0) -> None:
        super().__init__()
        self.axes = axes
        self.theta = theta

    def __call__(self, ids: mx.array) -> tuple[mx.array, mx.array]:
        cos, sin = [], []
        for i, dim in enumerate(self.axes):
            freqs = 1.0 / self.theta ** (mx.arange(0, dim, 2, dtype=mx.float32) / dim)
            angles = ids[:, i].astype(mx.float32)[:, None] * freqs[None]
            cos.append(mx.repeat(mx.cos(angles), 2, axis=1))
            sin.append(mx.repeat(mx.sin(angles), 2, axis=1))
        return mx.concatenate(cos, axis=-1), mx.concatenate(sin, axis=-1)


class JointBlock(mnn.Module):
    """Two streams (image, text), each modulated by ``temb``, one joint attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = d.AdaLayerNormZero(dim)
        self.norm1_context = d.AdaLayerNormZero(dim)
        self.attn = d.JointAttention(dim, heads, qk_norm=True)
        self.norm2 = mnn.LayerNorm(dim, eps=1e-6, affine=False)
        self.ff = d.FeedForward(dim)
        self.norm2_context = mnn.LayerNorm(dim, eps=1e-6, affine=False)
        self.ff_context = d.FeedForward(dim)

    def __call__(
        self, x: mx.array, context: mx.array, temb: mx.array, rope: tuple[mx.array, mx.array]
    ) -> tuple[mx.array, mx.array]:
        h, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(x, temb)
        c, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(context, temb)
        attn, context_attn = self.attn(h, c, rope)
        x = x + gate_msa[:, None] * attn
        h = self.norm2(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        x = x + gate_mlp[:, None] * self.ff(h)
        context = context + c_gate_msa[:, None] * context_attn
        c = self.norm2_context(context) * (1 + c_scale_mlp[:, None]) + c_shift_mlp[:, None]
        context = context + c_gate_mlp[:, None] * self.ff_context(c)
        return context, x


class SingleBlock(mnn.Module):
    """One stream ([text, image] joined): attention and MLP side by side, one projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm = d.AdaLayerNormZero(dim, chunks=3)
        self.proj_mlp = mnn.Linear(dim, 4 * dim)
        self.act_mlp = mnn.GELU(approx="precise")
        self.proj_out = mnn.Linear(5 * dim, dim)
        self.attn = d.JointAttention(dim, heads, qk_norm=True, added=False, out=False)

    def __call__(
        self, x: mx.array, context: mx.array, temb: mx.array, rope: tuple[mx.array, mx.array]
    ) -> tuple[mx.array, mx.array]:
        n_text = context.shape[1]
        joined = mx.concatenate([context, x], axis=1)
        h, gate = self.norm(joined, temb)
        mlp = self.act_mlp(self.proj_mlp(h))
        attn = self.attn(h, None, rope)
        joined = joined + gate[:, None] * self.proj_out(mx.concatenate([attn, mlp], axis=2))
        return joined[:, :n_text], joined[:, n_text:]


class FluxTransformer(mnn.Module):
    def __init__(self, s: Sizes = SIZES) -> None:
        super().__init__()
        dim = s.dim
        self.pos_embed = PosEmbed(s.axes)
        self.time_text_embed = d.TimeTextEmbed(dim, s.pooled_dim)
        self.context_embedder = mnn.Linear(s.joint_dim, dim)
        self.x_embedder = mnn.Linear(s.in_channels, dim)
        self.transformer_blocks = [JointBlock(dim, s.heads) for _ in range(s.layers)]
        self.single_transformer_blocks = [SingleBlock(dim, s.heads) for _ in range(s.single_layers)]
        self.norm_out = d.AdaLayerNormContinuous(dim)
        self.proj_out = mnn.Linear(dim, s.in_channels)

    def __call__(
        self,
        latents: mx.array,
        text: mx.array,
        pooled: mx.array,
        sigma: mx.array,
        img_ids: mx.array,
        txt_ids: mx.array,
    ) -> mx.array:
        x = self.x_embedder(latents)
        temb = self.time_text_embed(sigma.astype(x.dtype) * 1000, pooled)
        context = self.context_embedder(text)
        rope = self.pos_embed(mx.concatenate([txt_ids, img_ids], axis=0))
        for block in self.transformer_blocks:
            context, x = block(x, context, temb, rope)
        for block in self.single_transformer_blocks:
            context, x = block(x, context, temb, rope)
        return self.proj_out(self.norm_out(x, temb))


def port_of(
    ref: torch.nn.Module, dtype: str, bug: str | None = None, s: Sizes = SIZES
) -> FluxTransformer:
    """A port holding ``ref``'s weights, with ``bug`` planted."""
    port = FluxTransformer(s)
    d.load_from(port, {k: to_mlx(v) for k, v in ref.state_dict().items()})
    port.set_dtype(MLX_DTYPES[dtype])
    if bug == "rope":
        for block in [*port.transformer_blocks, *port.single_transformer_blocks]:
            block.attn.rope_halves = True
    elif bug == "modulation":
        for block in port.transformer_blocks:
            block.norm1.swap_shift_scale = True
            block.norm1_context.swap_shift_scale = True
    elif bug == "timestep":
        port.time_text_embed.time_proj.flip = False
    elif bug == "single_modulation":
        port.single_transformer_blocks[s.single_layers // 2].norm.swap_shift_scale = True
    return port


def build(dtype: str, bug: str | None, seed: int = 0, sizes: Sizes = SIZES) -> ZooPort:
    check_case("flux", dtype, bug, BUGS + REAL_SIZE_BUGS)
    ref, inputs = reference(dtype, seed, sizes)
    port = port_of(ref, dtype, bug, sizes)
    return ZooPort(
        arch="flux",
        dtype=dtype,
        bug=bug,
        ref=ref,
        port=port,
        ref_inputs=inputs,
        port_inputs=tuple(to_mlx(t) for t in inputs),
        culprit=culprit(bug, sizes) if bug else None,
    )
