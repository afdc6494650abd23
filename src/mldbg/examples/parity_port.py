"""Parity example, the port: the same model in MLX, with one planted porting mistake.

Loads the reference's weights and captures one forward pass as ``NAME``.  The mistake
is the classic one: the attention scores are scaled by ``1 / head_dim`` instead of
``1 / sqrt(head_dim)``.  ``mldbg compare reference port`` names ``layers.0.attn``.
"""

from __future__ import annotations

import sys

import mlx.core as mx

import mldbg
from mldbg.examples import tiny_mlx
from mldbg.examples.tiny_mlx import ModelArgs, TinyTransformer

WEIGHTS = "tiny_weights.safetensors"
PROMPT = "parity, please"


class PortedAttention(tiny_mlx.Attention):
    def __call__(self, x: mx.array) -> mx.array:
        batch, seq, dim = x.shape
        q, k, v = mx.split(self.qkv(x), 3, axis=-1)
        q, k, v = (
            t.reshape(batch, seq, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)
            for t in (q, k, v)
        )
        scores = (q @ k.transpose(0, 1, 3, 2)) / self.head_dim  # the mistake: no sqrt
        causal = mx.triu(mx.ones((seq, seq)), k=1).astype(mx.bool_)
        scores = mx.where(causal, mx.array(-mx.inf, dtype=scores.dtype), scores)
        weights = mx.softmax(scores, axis=-1)
        return self.out((weights @ v).transpose(0, 2, 1, 3).reshape(batch, seq, dim))


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "port"
    args = ModelArgs()
    model = TinyTransformer(args)
    for layer in model.layers:
        layer.attn = PortedAttention(args)
    model.load_weights(WEIGHTS)
    tokens = mx.array([[ord(c) % 96 for c in PROMPT]])
    with mldbg.capture(model, name) as cap:
        logits = model(tokens)
        mx.eval(logits)
    print(f"port logits {tuple(logits.shape)} captured as {cap.name} in {cap.path}")


if __name__ == "__main__":
    main()
