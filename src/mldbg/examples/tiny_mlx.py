"""The tiny decoder-only transformer of ``tiny_transformer.py``, in MLX, read top to bottom.

Same modules, same names (``layers.0.attn.qkv`` ...), same weight layouts, so a weight
file written by one loads in the other.  The tutorial's MLX track runs it; run it
directly with ``python -m mldbg.examples.tiny_mlx``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn


@dataclass
class ModelArgs:
    vocab_size: int = 96
    dim: int = 32
    n_layers: int = 2
    n_heads: int = 4
    hidden_dim: int = 64
    max_seq_len: int = 16
    norm_eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = mx.ones((dim,))

    def __call__(self, x: mx.array) -> mx.array:
        rms = mx.rsqrt(mx.mean(mx.square(x), axis=-1, keepdims=True) + self.eps)
        return x * rms * self.weight


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.head_dim = args.dim // args.n_heads
        self.qkv = nn.Linear(args.dim, 3 * args.dim, bias=False)
        self.out = nn.Linear(args.dim, args.dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        batch, seq, dim = x.shape
        q, k, v = mx.split(self.qkv(x), 3, axis=-1)
        q, k, v = (
            t.reshape(batch, seq, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)
            for t in (q, k, v)
        )
        scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(self.head_dim)
        causal = mx.triu(mx.ones((seq, seq)), k=1).astype(mx.bool_)
        scores = mx.where(causal, mx.array(-mx.inf, dtype=scores.dtype), scores)
        weights = mx.softmax(scores, axis=-1)
        mixed = weights @ v  # tutorial: breakpoint
        return self.out(mixed.transpose(0, 2, 1, 3).reshape(batch, seq, dim))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.up = nn.Linear(args.dim, args.hidden_dim, bias=False)
        self.down = nn.Linear(args.hidden_dim, args.dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down(nn.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(args.dim, args.norm_eps)
        self.attn = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn = FeedForward(args)

    def __call__(self, x: mx.array) -> mx.array:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class TinyTransformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.embed = nn.Embedding(args.vocab_size, args.dim)
        self.layers = [Block(args) for _ in range(args.n_layers)]
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.head = nn.Linear(args.dim, args.vocab_size, bias=False)

    def __call__(self, tokens: mx.array) -> mx.array:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def main() -> None:
    mx.random.seed(0)
    model = TinyTransformer(ModelArgs())
    tokens = mx.array([[ord(c) % 96 for c in "hello, mldbg"]])
    logits = model(tokens)
    mx.eval(logits)
    next_token = mx.argmax(logits[0, -1]).item()
    print(f"logits {tuple(logits.shape)}, mean {logits.mean().item():.4f}, next token {next_token}")


if __name__ == "__main__":
    main()
