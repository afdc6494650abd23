"""A hand-written MLX Llama with its own module names, against transformers' Llama.

What a user writes when porting by hand, Meta-style names and nothing shared with
transformers but the math::

    tok_embeddings
    blocks.N.attention_norm    blocks.N.attention.{wq,wk,wv,wo}
    blocks.N.ffn_norm          blocks.N.feed_forward.{w1,w2,w3}   (gate, down, up)
    norm, output

RoPE and attention are inline (``mx.fast.rope``, ``mx.fast.scaled_dot_product_attention``
with a causal mask), not modules.  ``NAME_MAP`` is the compare map (regex rules, port
name -> reference name); without it almost nothing pairs, which is where a parity
tool should propose a map.  The reference is the Llama of ``llama_family`` (same sizes,
same weights, same token ids).

Bugs and the module a verdict must name (in the reference's names):

- ``attn_scale``: layer 1's attention forgets 1/sqrt(head_dim) -> ``model.layers.1.self_attn``.
- ``swapped_mlp``: layer 1's feed-forward swaps w1 and w3 -> ``model.layers.1.mlp``.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as mnn

from . import llama_family
from .core import ZooPort, check_case, to_mlx

BUGS = ("attn_scale", "swapped_mlp")
CULPRITS = {"attn_scale": "model.layers.1.self_attn", "swapped_mlp": "model.layers.1.mlp"}

# Port name -> reference name, applied in order with re.sub; ``(?=[.#]|$)`` ends a name
# component, so the rules rewrite capture entry names (``blocks.1.attention#0.out``) too.
NAME_MAP: dict[str, Any] = {
    "regex": [
        [r"^tok_embeddings(?=[.#]|$)", "model.embed_tokens"],
        [r"^blocks\.(\d+)\.attention_norm(?=[.#]|$)", r"model.layers.\1.input_layernorm"],
        [r"^blocks\.(\d+)\.attention\.w([qkvo])(?=[.#]|$)", r"model.layers.\1.self_attn.\2_proj"],
        [r"^blocks\.(\d+)\.attention(?=[.#]|$)", r"model.layers.\1.self_attn"],
        [r"^blocks\.(\d+)\.ffn_norm(?=[.#]|$)", r"model.layers.\1.post_attention_layernorm"],
        [r"^blocks\.(\d+)\.feed_forward\.w1(?=[.#]|$)", r"model.layers.\1.mlp.gate_proj"],
        [r"^blocks\.(\d+)\.feed_forward\.w2(?=[.#]|$)", r"model.layers.\1.mlp.down_proj"],
        [r"^blocks\.(\d+)\.feed_forward\.w3(?=[.#]|$)", r"model.layers.\1.mlp.up_proj"],
        [r"^blocks\.(\d+)\.feed_forward(?=[.#]|$)", r"model.layers.\1.mlp"],
        [r"^blocks\.(\d+)(?=[.#]|$)", r"model.layers.\1"],
        [r"^norm(?=[.#]|$)", "model.norm"],
        [r"^output(?=[.#]|$)", "lm_head"],
    ]
}

# Reference parameter name -> port parameter name, for loading the weights.
_PARAMS = (
    ("model.embed_tokens.", "tok_embeddings."),
    ("model.layers.", "blocks."),
    (".input_layernorm.", ".attention_norm."),
    (".post_attention_layernorm.", ".ffn_norm."),
    (".self_attn.q_proj.", ".attention.wq."),
    (".self_attn.k_proj.", ".attention.wk."),
    (".self_attn.v_proj.", ".attention.wv."),
    (".self_attn.o_proj.", ".attention.wo."),
    (".mlp.gate_proj.", ".feed_forward.w1."),
    (".mlp.down_proj.", ".feed_forward.w2."),
    (".mlp.up_proj.", ".feed_forward.w3."),
    ("model.norm.", "norm."),
    ("lm_head.", "output."),
)


class Attention(mnn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, base: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.base = heads, kv_heads, head_dim, base
        self.scale = head_dim**-0.5
        self.wq = mnn.Linear(dim, heads * head_dim, bias=False)
        self.wk = mnn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wv = mnn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wo = mnn.Linear(heads * head_dim, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        B, L, _ = x.shape
        q = self.wq(x).reshape(B, L, self.heads, -1).transpose(0, 2, 1, 3)
        k = self.wk(x).reshape(B, L, self.kv_heads, -1).transpose(0, 2, 1, 3)
        v = self.wv(x).reshape(B, L, self.kv_heads, -1).transpose(0, 2, 1, 3)
        q = mx.fast.rope(q, self.head_dim, traditional=False, base=self.base, scale=1.0, offset=0)
        k = mx.fast.rope(k, self.head_dim, traditional=False, base=self.base, scale=1.0, offset=0)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask="causal")
        return self.wo(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class FeedForward(mnn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = mnn.Linear(dim, hidden, bias=False)
        self.w2 = mnn.Linear(hidden, dim, bias=False)
        self.w3 = mnn.Linear(dim, hidden, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.w2(mnn.silu(self.w1(x)) * self.w3(x))


class Block(mnn.Module):
    def __init__(self, s: llama_family.Sizes) -> None:
        super().__init__()
        self.attention_norm = mnn.RMSNorm(s.hidden_size, eps=s.rms_norm_eps)
        self.attention = Attention(
            s.hidden_size, s.num_attention_heads, s.num_key_value_heads, s.head_dim, s.rope_theta
        )
        self.ffn_norm = mnn.RMSNorm(s.hidden_size, eps=s.rms_norm_eps)
        self.feed_forward = FeedForward(s.hidden_size, s.intermediate_size)

    def __call__(self, x: mx.array) -> mx.array:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(mnn.Module):
    def __init__(self, s: llama_family.Sizes) -> None:
        super().__init__()
        self.tok_embeddings = mnn.Embedding(s.vocab_size, s.hidden_size)
        self.blocks = [Block(s) for _ in range(s.num_hidden_layers)]
        self.norm = mnn.RMSNorm(s.hidden_size, eps=s.rms_norm_eps)
        self.output = mnn.Linear(s.hidden_size, s.vocab_size, bias=False)

    def __call__(self, tokens: mx.array) -> mx.array:
        h = self.tok_embeddings(tokens)
        for block in self.blocks:
            h = block(h)
        return self.output(self.norm(h))


def port_name(ref_name: str) -> str:
    for old, new in _PARAMS:
        ref_name = ref_name.replace(old, new)
    return ref_name


def _swapped_feed_forward(cls: type) -> type:
    class SwappedFeedForward(cls):  # type: ignore[misc, valid-type]
        """The bug: w1 (gate) and w3 (up) exchanged."""

        def __call__(self, x: mx.array) -> mx.array:
            gate, up = self.w1(x), self.w3(x)
            return self.w2(mnn.silu(up) * gate)

    return SwappedFeedForward


def build(dtype: str = "float32", bug: str | None = None, *, seed: int = 0) -> ZooPort:
    """transformers Llama vs the hand-written ``Transformer``, ``bug`` in the port."""
    check_case("renamed", dtype, bug, BUGS)
    ref, ids = llama_family.reference("llama", dtype, seed)
    port = Transformer(llama_family.SIZES)
    port.load_weights([(port_name(k), to_mlx(v)) for k, v in ref.state_dict().items()])
    port.eval()
    if bug == "attn_scale":
        port.blocks[1].attention.scale = 1.0
    elif bug == "swapped_mlp":
        ff = port.blocks[1].feed_forward
        ff.__class__ = _swapped_feed_forward(type(ff))
    return ZooPort(
        arch="renamed",
        dtype=dtype,
        bug=bug,
        ref=ref,
        port=port,
        ref_inputs=(ids,),
        port_inputs=(mx.array(ids.numpy()),),
        culprit=CULPRITS[bug] if bug else None,
        map=NAME_MAP,
    )
