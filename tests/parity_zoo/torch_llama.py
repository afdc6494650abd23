"""A hand-written PyTorch Llama against transformers' Llama: the torch -> torch case.

Same module names as transformers (so the state_dict loads as is and no map is
needed), different code: its own RMSNorm, a ``rope`` submodule inside each attention
(transformers computes cos/sin once, in ``model.rotary_emb``), ``F.scaled_dot_product_attention``
with ``is_causal`` (transformers: eager softmax with a mask tensor), and every module
called with positional arguments (transformers: ``hidden_states=``,
``position_embeddings=``, ``attention_mask=`` keywords).

Bugs and culprits are the Llama family's (``llama_family.BUGS`` / ``CULPRITS``), planted
the same way in this port.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from . import llama_family
from .core import TORCH_DTYPES, ZooPort, check_case

BUGS = llama_family.BUGS
CULPRITS = llama_family.CULPRITS


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class RoPE(nn.Module):
    """Rotates the two halves of each head (transformers' ``rotate_half`` convention)."""

    def __init__(self, head_dim: int, base: float) -> None:
        super().__init__()
        self.head_dim, self.base = head_dim, base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        L, half = x.shape[-2], self.head_dim // 2
        inv_freq = self.base ** (-torch.arange(half, dtype=torch.float32) / half)
        angles = torch.arange(L, dtype=torch.float32)[:, None] * inv_freq[None, :]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, s: llama_family.Sizes, base: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            s.num_attention_heads,
            s.num_key_value_heads,
            s.head_dim,
        )
        self.scale = 1 / math.sqrt(s.head_dim)
        self.q_proj = nn.Linear(s.hidden_size, self.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden_size, self.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden_size, self.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * s.head_dim, s.hidden_size, bias=False)
        self.rope = RoPE(s.head_dim, base)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.heads, -1).transpose(1, 2)
        k = self.k_proj(x).view(B, L, self.kv_heads, -1).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.kv_heads, -1).transpose(1, 2)
        q, k = self.rope(q), self.rope(k)
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.scale, enable_gqa=True
        )
        return self.o_proj(out.transpose(1, 2).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.swapped = False  # the ``swapped_mlp`` bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.swapped:
            gate, up = up, gate
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, s: llama_family.Sizes, base: float) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = Attention(s, base)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = MLP(s.hidden_size, s.intermediate_size)
        self.skip_post_norm = False  # the ``skipped_norm`` bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x))
        if self.skip_post_norm:
            return h + self.mlp(h)
        return h + self.mlp(self.post_attention_layernorm(h))


class Decoder(nn.Module):
    def __init__(self, s: llama_family.Sizes, base: float) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(s, base) for _ in range(s.num_hidden_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class CausalLM(nn.Module):
    def __init__(self, s: llama_family.Sizes, base: float) -> None:
        super().__init__()
        self.model = Decoder(s, base)
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(ids))


def build(dtype: str = "float32", bug: str | None = None, *, seed: int = 0) -> ZooPort:
    """transformers Llama vs ``CausalLM`` (both torch, both ``dtype``), ``bug`` in the port."""
    check_case("torch_llama", dtype, bug, BUGS)
    ref, ids = llama_family.reference("llama", dtype, seed)
    s = llama_family.SIZES
    port = CausalLM(s, s.rope_theta * (100 if bug == "rope_base" else 1))
    port.load_state_dict(ref.state_dict())  # strict: same names, same shapes
    port = port.to(TORCH_DTYPES[dtype]).eval()
    layer = cast(DecoderLayer, port.model.layers[llama_family.BUGGY_LAYER])
    if bug == "norm_eps":
        layer.post_attention_layernorm.eps = 1.0
    elif bug == "attn_scale":
        layer.self_attn.scale = 1.0
    elif bug == "swapped_mlp":
        layer.mlp.swapped = True
    elif bug == "skipped_norm":
        layer.skip_post_norm = True
    return ZooPort(
        arch="torch_llama",
        dtype=dtype,
        bug=bug,
        ref=ref,
        port=port,
        ref_inputs=(ids,),
        port_inputs=(ids.clone(),),
        culprit=CULPRITS[bug] if bug else None,
        port_framework="torch",
    )
