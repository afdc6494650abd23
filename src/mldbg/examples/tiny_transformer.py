"""A tiny decoder-only transformer in PyTorch, read top to bottom.

The demo (`mldbg demo`) stops inside ``Attention.forward`` to look at the attention
weights.  Run it directly with ``python -m mldbg.examples.tiny_transformer``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


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
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * rms * self.weight


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.head_dim = args.dim // args.n_heads
        self.qkv = nn.Linear(args.dim, 3 * args.dim, bias=False)
        self.out = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=-1)
        q, k, v = (
            t.view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v)
        )
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        weights = F.softmax(scores, dim=-1)
        mixed = weights @ v  # demo: breakpoint
        return self.out(mixed.transpose(1, 2).reshape(batch, seq, dim))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.up = nn.Linear(args.dim, args.hidden_dim, bias=False)
        self.down = nn.Linear(args.hidden_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(args.dim, args.norm_eps)
        self.attn = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn = FeedForward(args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class TinyTransformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.embed = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.head = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def main() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(ModelArgs()).eval()
    tokens = torch.tensor([[ord(c) % 96 for c in "hello, mldbg"]])
    with torch.no_grad():
        logits = model(tokens)
    next_token = int(logits[0, -1].argmax())
    print(f"logits {tuple(logits.shape)}, mean {logits.mean().item():.4f}, next token {next_token}")


if __name__ == "__main__":
    main()
