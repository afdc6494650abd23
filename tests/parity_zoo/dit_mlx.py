"""Hand-written MLX building blocks of diffusers' DiTs (Flux, SD3), read top to bottom.

Each class keeps diffusers' module names (``time_text_embed.time_proj``, ``norm1.linear``,
``attn.to_q``, ``ff.net.0.proj``...) so the reference's state dict loads by name and the
captures pair without a map.  Activations are (batch, tokens, channels) as in diffusers;
attention works on (batch, heads, tokens, head_dim) as ``mx.fast`` wants it.

Dtypes follow diffusers: the sinusoidal timestep embedding and the rotary tables are
computed in float32 whatever the model's dtype and cast where diffusers casts them.

Bugs are switched on per instance with a flag (``Timesteps.flip``,
``AdaLayerNormZero.swap_shift_scale``, ``apply_rope(..., halves=True)``) so that a test
plants exactly one, in the port only.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as mnn


class Timesteps(mnn.Module):
    """Sinusoidal embedding of a (fractional) timestep: [cos, sin] of t * 10000^(-i/half).

    ``flip=False`` is the timestep-embedding bug: [sin, cos], the order of the DDPM paper
    that diffusers flips for Flux and SD3 (``flip_sin_to_cos=True``)."""

    def __init__(self, channels: int, flip: bool = True) -> None:
        super().__init__()
        self.channels = channels
        self.flip = flip

    def __call__(self, t: mx.array) -> mx.array:
        half = self.channels // 2
        freqs = mx.exp(-math.log(10000) * mx.arange(half, dtype=mx.float32) / half)
        args = t.astype(mx.float32)[:, None] * freqs[None]
        sin, cos = mx.sin(args), mx.cos(args)
        return mx.concatenate([cos, sin] if self.flip else [sin, cos], axis=-1)


class TimestepEmbedding(mnn.Module):
    def __init__(self, channels: int, dim: int) -> None:
        super().__init__()
        self.linear_1 = mnn.Linear(channels, dim)
        self.act = mnn.SiLU()
        self.linear_2 = mnn.Linear(dim, dim)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear_2(self.act(self.linear_1(x)))


class TextProjection(mnn.Module):
    """diffusers' ``PixArtAlphaTextProjection`` with SiLU: the pooled text embedding."""

    def __init__(self, pooled_dim: int, dim: int) -> None:
        super().__init__()
        self.linear_1 = mnn.Linear(pooled_dim, dim)
        self.act_1 = mnn.SiLU()
        self.linear_2 = mnn.Linear(dim, dim)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear_2(self.act_1(self.linear_1(x)))


class TimeTextEmbed(mnn.Module):
    """The conditioning vector ``temb``: timestep embedding + pooled text projection."""

    def __init__(self, dim: int, pooled_dim: int) -> None:
        super().__init__()
        self.time_proj = Timesteps(256)
        self.timestep_embedder = TimestepEmbedding(256, dim)
        self.text_embedder = TextProjection(pooled_dim, dim)

    def __call__(self, timestep: mx.array, pooled: mx.array) -> mx.array:
        t = self.time_proj(timestep).astype(pooled.dtype)
        return self.timestep_embedder(t) + self.text_embedder(pooled)


class AdaLayerNormZero(mnn.Module):
    """LayerNorm modulated by ``temb``: returns the modulated input and the gates, shifts
    and scales the block uses later.  ``swap_shift_scale`` is the modulation bug: the six
    chunks read as (scale, shift, ...) instead of (shift, scale, ...)."""

    def __init__(self, dim: int, chunks: int = 6) -> None:
        super().__init__()
        self.silu = mnn.SiLU()
        self.linear = mnn.Linear(dim, chunks * dim)
        self.norm = mnn.LayerNorm(dim, eps=1e-6, affine=False)
        self.chunks = chunks
        self.swap_shift_scale = False

    def __call__(self, x: mx.array, temb: mx.array) -> tuple[mx.array, ...]:
        parts = mx.split(self.linear(self.silu(temb)), self.chunks, axis=1)
        shift, scale, *rest = parts
        if self.swap_shift_scale:
            shift, scale = scale, shift
        return (self.norm(x) * (1 + scale[:, None]) + shift[:, None], *rest)


class AdaLayerNormContinuous(mnn.Module):
    """The final norm: LayerNorm then ``* (1 + scale) + shift`` from ``temb`` (scale first)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.silu = mnn.SiLU()
        self.linear = mnn.Linear(dim, 2 * dim)
        self.norm = mnn.LayerNorm(dim, eps=1e-6, affine=False)

    def __call__(self, x: mx.array, temb: mx.array) -> mx.array:
        scale, shift = mx.split(self.linear(self.silu(temb).astype(x.dtype)), 2, axis=1)
        return self.norm(x) * (1 + scale[:, None]) + shift[:, None]


class GELUProj(mnn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.proj = mnn.Linear(dim, hidden)

    def __call__(self, x: mx.array) -> mx.array:
        return _gelu_tanh(self.proj(x))


def _gelu_tanh(x: mx.array) -> mx.array:
    """GELU, tanh approximation (diffusers' ``gelu-approximate``)."""
    return 0.5 * x * (1 + mx.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


class FeedForward(mnn.Module):
    """``net.0`` (Linear + GELU), ``net.1`` (dropout: an identity here), ``net.2``."""

    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        self.net = [GELUProj(dim, mult * dim), mnn.Dropout(0.0), mnn.Linear(mult * dim, dim)]

    def __call__(self, x: mx.array) -> mx.array:
        return self.net[2](self.net[1](self.net[0](x)))


def apply_rope(x: mx.array, cos: mx.array, sin: mx.array, *, halves: bool = False) -> mx.array:
    """Rotate (batch, tokens, heads, head_dim) by the rotary tables (tokens, head_dim).

    Flux rotates interleaved pairs (x0, x1), (x2, x3)...; ``halves=True`` is the RoPE bug
    every Llama port invites: pairs (x_i, x_{i + d/2}) (``rotate_half``)."""
    if halves:
        d = x.shape[-1] // 2
        rotated = mx.concatenate([-x[..., d:], x[..., :d]], axis=-1)
    else:
        real, imag = x[..., 0::2], x[..., 1::2]
        rotated = mx.stack([-imag, real], axis=-1).reshape(x.shape)
    out = (
        x.astype(mx.float32) * cos[None, :, None] + rotated.astype(mx.float32) * sin[None, :, None]
    )
    return out.astype(x.dtype)


class JointAttention(mnn.Module):
    """Attention over [text tokens, image tokens] (Flux, SD3): image projections ``to_*``,
    text projections ``add_*_proj``, optional RMS norms on queries and keys.

    ``context_pre_only``: the last SD3 block, whose text stream has no output projection.
    ``text_first``: where the text tokens sit in the joint sequence (Flux: first; SD3:
    after the image tokens).  ``added``: whether there is a text stream at all (Flux's
    single-stream blocks have none: one sequence, no output projection)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        qk_norm: bool,
        added: bool = True,
        out: bool = True,
        context_pre_only: bool = False,
        text_first: bool = True,
    ) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.text_first = text_first
        self.rope_halves = False
        # The softmax-scale bug: 1/head_dim (a port that forgot the square root) when set.
        self.softmax_scale = self.head_dim**-0.5
        self.to_q = mnn.Linear(dim, dim)
        self.to_k = mnn.Linear(dim, dim)
        self.to_v = mnn.Linear(dim, dim)
        if qk_norm:
            self.norm_q = mnn.RMSNorm(self.head_dim, eps=1e-6)
            self.norm_k = mnn.RMSNorm(self.head_dim, eps=1e-6)
        if out:
            self.to_out = [mnn.Linear(dim, dim), mnn.Dropout(0.0)]
        if added:
            if qk_norm:
                self.norm_added_q = mnn.RMSNorm(self.head_dim, eps=1e-6)
                self.norm_added_k = mnn.RMSNorm(self.head_dim, eps=1e-6)
            self.add_q_proj = mnn.Linear(dim, dim)
            self.add_k_proj = mnn.Linear(dim, dim)
            self.add_v_proj = mnn.Linear(dim, dim)
            if not context_pre_only:
                self.to_add_out = mnn.Linear(dim, dim)

    def _heads(self, x: mx.array) -> mx.array:
        return x.reshape(*x.shape[:2], self.heads, self.head_dim)

    def _qkv(self, x: mx.array, prefix: str) -> tuple[mx.array, mx.array, mx.array]:
        names = (
            ("to_q", "to_k", "to_v") if prefix == "" else ("add_q_proj", "add_k_proj", "add_v_proj")
        )
        q, k, v = (self._heads(self[n](x)) for n in names)
        norm_q, norm_k = ("norm_q", "norm_k") if prefix == "" else ("norm_added_q", "norm_added_k")
        if norm_q in self:
            q, k = self[norm_q](q), self[norm_k](k)
        return q, k, v

    def __call__(
        self,
        x: mx.array,
        context: mx.array | None = None,
        rope: tuple[mx.array, mx.array] | None = None,
    ) -> mx.array | tuple[mx.array, mx.array]:
        q, k, v = self._qkv(x, "")
        n_text = 0
        if context is not None:
            cq, ck, cv = self._qkv(context, "added")
            n_text = context.shape[1]
            join = _text_first if self.text_first else _text_last
            q, k, v = join(q, cq), join(k, ck), join(v, cv)
        if rope is not None:
            q = apply_rope(q, *rope, halves=self.rope_halves)
            k = apply_rope(k, *rope, halves=self.rope_halves)
        out = mx.fast.scaled_dot_product_attention(
            _heads_first(q), _heads_first(k), _heads_first(v), scale=self.softmax_scale
        )
        out = out.transpose(0, 2, 1, 3).reshape(*x.shape[:1], -1, self.heads * self.head_dim)
        if context is None:
            return out
        if self.text_first:
            text, image = out[:, :n_text], out[:, n_text:]
        else:
            image, text = out[:, : x.shape[1]], out[:, x.shape[1] :]
        image = self.to_out[1](self.to_out[0](image))
        if "to_add_out" in self:
            text = self.to_add_out(text)
        return image, text


def _text_first(image: mx.array, text: mx.array) -> mx.array:
    return mx.concatenate([text, image], axis=1)


def _text_last(image: mx.array, text: mx.array) -> mx.array:
    return mx.concatenate([image, text], axis=1)


def _heads_first(x: mx.array) -> mx.array:
    """(batch, tokens, heads, head_dim) -> (batch, heads, tokens, head_dim)."""
    return x.transpose(0, 2, 1, 3)


def load_from(port: mnn.Module, state: dict[str, mx.array]) -> None:
    """The reference's weights into the port, by name; every port parameter must get one."""
    port.load_weights(list(state.items()), strict=True)
    mx.eval(port.parameters())
