"""A hand-written MLX port of flux_reference.py's transformer (the zoo's building blocks,
dit_mlx.py); its first argument is the size, its second a planted bug:

- ``rope``: ``apply_rope`` rotates the two halves instead of Flux's interleaved pairs.
"""

import sys

import dit_mlx as d
import flux_setup as setup
import mlx.core as mx
import mlx.nn as nn
import numpy as np

size = setup.SIZES[sys.argv[1] if len(sys.argv) > 1 else "tiny"]
BUG = sys.argv[2] if len(sys.argv) > 2 else ""
DTYPE = getattr(mx, size.dtype)


class PosEmbed(nn.Module):
    def __init__(self, axes, theta=10000.0):
        super().__init__()
        self.axes = axes
        self.theta = theta

    def __call__(self, ids):
        cos, sin = [], []
        for i, dim in enumerate(self.axes):
            freqs = 1.0 / self.theta ** (mx.arange(0, dim, 2, dtype=mx.float32) / dim)
            angles = ids[:, i].astype(mx.float32)[:, None] * freqs[None]
            cos.append(mx.repeat(mx.cos(angles), 2, axis=1))
            sin.append(mx.repeat(mx.sin(angles), 2, axis=1))
        return mx.concatenate(cos, axis=-1), mx.concatenate(sin, axis=-1)


class JointBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = d.AdaLayerNormZero(dim)
        self.norm1_context = d.AdaLayerNormZero(dim)
        self.attn = d.JointAttention(dim, heads, qk_norm=True)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, affine=False)
        self.ff = d.FeedForward(dim)
        self.norm2_context = nn.LayerNorm(dim, eps=1e-6, affine=False)
        self.ff_context = d.FeedForward(dim)

    def __call__(self, x, context, temb, rope):
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


class FluxTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        dim = size.heads * size.head_dim
        self.pos_embed = PosEmbed(size.axes)
        self.time_text_embed = d.TimeTextEmbed(dim, size.pooled_dim)
        self.context_embedder = nn.Linear(size.joint_dim, dim)
        self.x_embedder = nn.Linear(size.in_channels, dim)
        self.transformer_blocks = [JointBlock(dim, size.heads)]
        self.norm_out = d.AdaLayerNormContinuous(dim)
        self.proj_out = nn.Linear(dim, size.in_channels)

    def __call__(self, latents, text, pooled, sigma, img_ids, txt_ids):
        x = self.x_embedder(latents)
        temb = self.time_text_embed(sigma.astype(x.dtype) * 1000, pooled)
        context = self.context_embedder(text)
        rope = self.pos_embed(mx.concatenate([txt_ids, img_ids], axis=0))
        for block in self.transformer_blocks:
            context, x = block(x, context, temb, rope)
        return self.proj_out(self.norm_out(x, temb))


model = FluxTransformer()
shapes = [(name, tuple(p.shape)) for name, p in nn.utils.tree_flatten(model.parameters())]
model.load_weights([(k, mx.array(v)) for k, v in setup.weights(shapes).items()], strict=True)
model.set_dtype(DTYPE)
if BUG == "rope":
    model.transformer_blocks[0].attn.rope_halves = True
given = {k: mx.array(v) for k, v in setup.inputs(size).items()}
out = model(
    given["latents"].astype(DTYPE),
    given["text"].astype(DTYPE),
    given["pooled"].astype(DTYPE),
    given["sigma"].astype(DTYPE),
    given["img_ids"],
    given["txt_ids"],
)
mx.eval(out)
print("port done", out.shape, np.array(out.astype(mx.float32)).ravel()[:2])
