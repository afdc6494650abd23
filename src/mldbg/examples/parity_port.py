"""Parity example, the port: the same model in MLX, with one planted porting mistake.

Loads the reference's weights and runs one forward pass; an unmodified script, like the
reference.  The mistake is the classic one: the attention scores are scaled by
``1 / head_dim`` instead of ``1 / sqrt(head_dim)``.  Captured with ``start --capture``,
``mldbg compare ref port`` names ``layers.0.attn`` and ``mldbg line ref port`` the line.
"""

from __future__ import annotations

import mlx.core as mx

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
    args = ModelArgs()
    model = TinyTransformer(args)
    for layer in model.layers:
        layer.attn = PortedAttention(args)
    model.load_weights(WEIGHTS)
    tokens = mx.array([[ord(c) % 96 for c in PROMPT]])
    logits = model(tokens)
    mx.eval(logits)
    print(f"port logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()
