"""A hand-written PyTorch port of flux_reference.py's transformer (diffusers' module names,
so the captures pair), for sizes where an MLX port on a CPU would take minutes: its
first argument is the size, its second a planted bug:

- ``rope``: ``apply_rope`` rotates the two halves instead of Flux's interleaved pairs.
"""

import math
import sys

import flux_setup as setup
import torch
import torch.nn.functional as F
from torch import nn

size = setup.SIZES[sys.argv[1] if len(sys.argv) > 1 else "tiny"]
BUG = sys.argv[2] if len(sys.argv) > 2 else ""


def apply_rope(x, cos, sin):
    """Rotate (batch, tokens, heads, head_dim) by the tables (tokens, head_dim)."""
    if BUG == "rope":
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    else:
        real, imag = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack([-imag, real], dim=-1).flatten(-2)
    out = x.float() * cos[None, :, None] + rotated.float() * sin[None, :, None]
    return out.to(x.dtype)


class Timesteps(nn.Module):
    def forward(self, t):
        half = 128
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        args = t.float()[:, None] * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TwoLinear(nn.Module):
    def __init__(self, names, size_in, dim):
        super().__init__()
        self.names = names
        setattr(self, names[0], nn.Linear(size_in, dim))
        setattr(self, names[1], nn.Linear(dim, dim))

    def forward(self, x):
        return getattr(self, self.names[1])(F.silu(getattr(self, self.names[0])(x)))


class TimeTextEmbed(nn.Module):
    def __init__(self, dim, pooled_dim):
        super().__init__()
        self.time_proj = Timesteps()
        self.timestep_embedder = TwoLinear(("linear_1", "linear_2"), 256, dim)
        self.text_embedder = TwoLinear(("linear_1", "linear_2"), pooled_dim, dim)

    def forward(self, timestep, pooled):
        t = self.time_proj(timestep).to(pooled.dtype)
        return self.timestep_embedder(t) + self.text_embedder(pooled)


class AdaNormZero(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, 6 * dim)

    def forward(self, x, temb):
        shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = self.linear(F.silu(temb)).chunk(
            6, dim=1
        )
        x = F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
        return x, gate, shift_mlp, scale_mlp, gate_mlp


class AdaNormContinuous(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x, temb):
        scale, shift = self.linear(F.silu(temb).to(x.dtype)).chunk(2, dim=1)
        return F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale[:, None]) + shift[:, None]


class GeluProj(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.proj = nn.Linear(dim, hidden)

    def forward(self, x):
        return F.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.net = nn.ModuleList([GeluProj(dim, 4 * dim), nn.Dropout(0.0), nn.Linear(4 * dim, dim)])

    def forward(self, x):
        return self.net[2](self.net[1](self.net[0](x)))


class JointAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        for name in (
            "to_q",
            "to_k",
            "to_v",
            "add_q_proj",
            "add_k_proj",
            "add_v_proj",
            "to_add_out",
        ):
            setattr(self, name, nn.Linear(dim, dim))
        self.to_out = nn.ModuleList([nn.Linear(dim, dim), nn.Dropout(0.0)])
        for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            setattr(self, name, nn.RMSNorm(self.head_dim, eps=1e-6))

    def forward(self, x, context, rope):
        b, n_image, n_text = x.shape[0], x.shape[1], context.shape[1]
        q = self.norm_q(self.to_q(x).view(b, n_image, self.heads, self.head_dim))
        k = self.norm_k(self.to_k(x).view(b, n_image, self.heads, self.head_dim))
        v = self.to_v(x).view(b, n_image, self.heads, self.head_dim)
        cq = self.norm_added_q(self.add_q_proj(context).view(b, n_text, self.heads, self.head_dim))
        ck = self.norm_added_k(self.add_k_proj(context).view(b, n_text, self.heads, self.head_dim))
        cv = self.add_v_proj(context).view(b, n_text, self.heads, self.head_dim)
        q, k, v = torch.cat([cq, q], dim=1), torch.cat([ck, k], dim=1), torch.cat([cv, v], dim=1)
        q = apply_rope(q, *rope)
        k = apply_rope(k, *rope)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        out = out.transpose(1, 2).reshape(b, n_text + n_image, -1)
        text, image = out[:, :n_text], out[:, n_text:]
        return self.to_out[1](self.to_out[0](image)), self.to_add_out(text)


class JointBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = AdaNormZero(dim)
        self.norm1_context = AdaNormZero(dim)
        self.attn = JointAttention(dim, heads)
        self.ff = FeedForward(dim)
        self.ff_context = FeedForward(dim)

    def forward(self, x, context, temb, rope):
        h, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(x, temb)
        c, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(context, temb)
        attn, context_attn = self.attn(h, c, rope)
        x = x + gate_msa[:, None] * attn
        h = F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        x = x + gate_mlp[:, None] * self.ff(h)
        context = context + c_gate_msa[:, None] * context_attn
        c = F.layer_norm(context, context.shape[-1:], eps=1e-6)
        c = c * (1 + c_scale_mlp[:, None]) + c_shift_mlp[:, None]
        context = context + c_gate_mlp[:, None] * self.ff_context(c)
        return context, x


def rope_tables(ids):
    cos, sin = [], []
    for i, dim in enumerate(size.axes):
        freqs = 1.0 / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = ids[:, i].double()[:, None] * freqs[None]
        cos.append(angles.cos().repeat_interleave(2, dim=1))
        sin.append(angles.sin().repeat_interleave(2, dim=1))
    return torch.cat(cos, dim=-1).float(), torch.cat(sin, dim=-1).float()


class FluxTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        dim = size.heads * size.head_dim
        self.time_text_embed = TimeTextEmbed(dim, size.pooled_dim)
        self.context_embedder = nn.Linear(size.joint_dim, dim)
        self.x_embedder = nn.Linear(size.in_channels, dim)
        self.transformer_blocks = nn.ModuleList([JointBlock(dim, size.heads)])
        self.norm_out = AdaNormContinuous(dim)
        self.proj_out = nn.Linear(dim, size.in_channels)

    def forward(self, latents, text, pooled, sigma, img_ids, txt_ids):
        x = self.x_embedder(latents)
        temb = self.time_text_embed(sigma.to(x.dtype) * 1000, pooled)
        context = self.context_embedder(text)
        rope = rope_tables(torch.cat([txt_ids, img_ids], dim=0))
        for block in self.transformer_blocks:
            context, x = block(x, context, temb, rope)
        return self.proj_out(self.norm_out(x, temb))


dtype = getattr(torch, size.dtype)
model = FluxTransformer()
shapes = [(name, tuple(p.shape)) for name, p in model.state_dict().items()]
model.load_state_dict({k: torch.from_numpy(v) for k, v in setup.weights(shapes).items()})
model = model.to(dtype).eval()
given = {k: torch.from_numpy(v) for k, v in setup.inputs(size).items()}
with torch.no_grad():
    out = model(
        given["latents"].to(dtype),
        given["text"].to(dtype),
        given["pooled"].to(dtype),
        given["sigma"].to(dtype),
        given["img_ids"],
        given["txt_ids"],
    )
print("port done", tuple(out.shape))
