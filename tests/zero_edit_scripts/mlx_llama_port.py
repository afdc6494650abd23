"""A hand-written MLX port of ``hf_llama_reference.py``'s Llama, attention spelled out.

It loads the weights the reference wrote and runs the same token ids; its first argument
plants one bug (none when absent), each a classic of hand-written ports:

- ``rotate``: ``rotate_half`` pairs interleaved elements instead of the two halves (a
  helper function the attention calls);
- ``heads``: the queries' heads read straight from the projection's memory
  (``reshape(b, heads, n, d)``, no transpose);
- ``axis``: the softmax over the queries' axis instead of the keys';
- ``scale``: the scores scaled by ``1 / head_dim`` instead of its square root;
- ``mask``: the causal mask also hides each token from itself.
"""

import json
import sys

import mlx.core as mx
import mlx.nn as nn

BUG = sys.argv[1] if len(sys.argv) > 1 else ""
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 64, 4, 2, 16, 2


def rotate_half(x):
    if BUG == "rotate":
        x1, x2 = x[..., ::2], x[..., 1::2]
    else:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
    return mx.concatenate([-x2, x1], axis=-1)


def rope_tables(length, base=10000.0):
    inverse = 1.0 / base ** (mx.arange(0, HEAD_DIM, 2, dtype=mx.float32) / HEAD_DIM)
    angles = mx.arange(length, dtype=mx.float32)[:, None] * inverse[None]
    angles = mx.concatenate([angles, angles], axis=-1)
    return mx.cos(angles), mx.sin(angles)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def __call__(self, x, cos, sin):
        b, n, _ = x.shape
        q = self.q_proj(x)
        k = self.k_proj(x)
        v = self.v_proj(x)
        if BUG == "heads":
            q = q.reshape(b, HEADS, n, HEAD_DIM)
        else:
            q = q.reshape(b, n, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
        k = k.reshape(b, n, KV_HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
        v = v.reshape(b, n, KV_HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = mx.repeat(k, HEADS // KV_HEADS, axis=1)
        v = mx.repeat(v, HEADS // KV_HEADS, axis=1)
        scale = 1.0 / HEAD_DIM if BUG == "scale" else HEAD_DIM**-0.5
        scores = (q @ k.transpose(0, 1, 3, 2)) * scale
        mask = mx.triu(mx.full((n, n), -1e9), k=0 if BUG == "mask" else 1)
        scores = scores + mask
        probs = mx.softmax(scores, axis=-2 if BUG == "axis" else -1)
        out = probs @ v
        out = out.transpose(0, 2, 1, 3).reshape(b, n, HEADS * HEAD_DIM)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, 128, bias=False)
        self.up_proj = nn.Linear(HIDDEN, 128, bias=False)
        self.down_proj = nn.Linear(128, HIDDEN, bias=False)

    def __call__(self, x):
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(HIDDEN, eps=1e-6)
        self.self_attn = Attention()
        self.post_attention_layernorm = nn.RMSNorm(HIDDEN, eps=1e-6)
        self.mlp = MLP()

    def __call__(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(128, HIDDEN)
        self.layers = [Layer() for _ in range(LAYERS)]
        self.norm = nn.RMSNorm(HIDDEN, eps=1e-6)

    def __call__(self, ids):
        x = self.embed_tokens(ids)
        cos, sin = rope_tables(ids.shape[1])
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Body()
        self.lm_head = nn.Linear(HIDDEN, 128, bias=False)

    def __call__(self, ids):
        return self.lm_head(self.model(ids))


model = Llama()
model.load_weights(list(mx.load("weights.safetensors").items()))
with open("ids.json") as fh:
    ids = mx.array(json.load(fh))
logits = model(ids)
mx.eval(logits)
print("port done", logits.shape)
