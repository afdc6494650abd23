"""The tutorial's NaN: an MLX port whose RMSNorm lost its eps, run on a padded batch.

A padding row is all zeros, so the norm divides 0 by 0 and NaN flows through the rest of
the model; ``mldbg break --nonfinite`` stops in the call where it first appears
(``layers.0.norm``), not where someone finally notices it.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = mx.ones((dim,))

    def __call__(self, x: mx.array) -> mx.array:
        # the porting mistake: the reference adds eps (1e-5) under the square root
        return x * mx.rsqrt(mx.mean(mx.square(x), axis=-1, keepdims=True)) * self.weight


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm = RMSNorm(dim)
        self.out = nn.Linear(dim, dim)

    def __call__(self, x: mx.array) -> mx.array:
        h = self.proj(x)
        h = self.norm(h)  # tutorial: norm
        return x + self.out(h)


class Model(nn.Module):
    def __init__(self, dim: int = 8, n_layers: int = 2) -> None:
        super().__init__()
        self.layers = [Block(dim) for _ in range(n_layers)]

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.layers:
            x = layer(x)
        return x


def main() -> None:
    mx.random.seed(0)
    model = Model()
    batch = mx.random.normal((2, 4, 8))
    padded = mx.where(mx.arange(4).reshape(1, 4, 1) == 3, 0.0, batch)  # the last token: padding
    out = model(padded)
    mx.eval(out)
    print("NaN in the output:", bool(mx.isnan(out).any().item()))


if __name__ == "__main__":
    main()
