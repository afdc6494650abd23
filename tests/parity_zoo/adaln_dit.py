"""A DiT whose modulation is ``Sequential(SiLU, Linear)`` in PyTorch and a bare ``Linear``
fed ``silu(c)`` in the MLX port: the same computation, the step on the other side of the
module boundary.

The reference follows facebookresearch/DiT's ``DiTBlock`` (``adaLN_modulation =
nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden))``, the timm attention's ``qkv``
and ``proj``, an MLP with tanh GELU) and ends in diffusers' own ``FinalLayer`` of PRX
(``diffusers.models.transformers.transformer_prx``: ``norm_final``, ``linear`` and the
same ``Sequential(SiLU, Linear)`` modulation).  The port, as MLX ports write it, holds
``adaLN_modulation`` as the ``Linear`` itself and calls it on ``nn.silu(c)``; its
weights are the reference's, ``adaLN_modulation.1.*`` loaded as ``adaLN_modulation.*``.

Bug: ``skipped_silu``: block 0 of the port calls its modulation on ``c`` itself ->
``blocks.0.adaLN_modulation`` (its inputs agree with the reference's, its outputs do not).
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import mlx.nn as mnn
import torch
from torch import nn

from .core import generator, init_o1, to_mlx

HIDDEN, HEADS, BLOCKS, TOKENS, OUT = 32, 4, 2, 8, 4
BUGS = ("skipped_silu",)
CULPRITS = {"skipped_silu": "blocks.0.adaLN_modulation"}


def _modulate(x: Any, shift: Any, scale: Any) -> Any:
    return x * (1 + scale[:, None]) + shift[:, None]


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, HIDDEN))


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class DiTBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(HIDDEN, elementwise_affine=False, eps=1e-6)
        self.attn = Attention()
        self.norm2 = nn.LayerNorm(HIDDEN, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(HIDDEN, 6 * HIDDEN))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate1[:, None] * self.attn(_modulate(self.norm1(x), shift1, scale1))
        return x + gate2[:, None] * self.mlp(_modulate(self.norm2(x), shift2, scale2))


class DiT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from diffusers.models.transformers.transformer_prx import FinalLayer

        self.blocks = nn.ModuleList(DiTBlock() for _ in range(BLOCKS))
        self.final_layer = FinalLayer(HIDDEN, 1, OUT)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, c)
        return self.final_layer(x, c)  # type: ignore[no-any-return]


# -- the MLX port ------------------------------------------------------------------------------


class PortAttention(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = mnn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = mnn.Linear(HIDDEN, HIDDEN)

    def __call__(self, x: mx.array) -> mx.array:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, -1).transpose(2, 0, 3, 1, 4)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=(HIDDEN // HEADS) ** -0.5)
        return self.proj(out.transpose(0, 2, 1, 3).reshape(b, n, HIDDEN))


class PortMlp(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = mnn.Linear(HIDDEN, 4 * HIDDEN)
        self.fc2 = mnn.Linear(4 * HIDDEN, HIDDEN)

    def __call__(self, x: mx.array) -> mx.array:
        h = self.fc1(x)
        return self.fc2(0.5 * h * (1 + mx.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3))))


class PortBlock(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = mnn.LayerNorm(HIDDEN, eps=1e-6, affine=False)
        self.attn = PortAttention()
        self.norm2 = mnn.LayerNorm(HIDDEN, eps=1e-6, affine=False)
        self.mlp = PortMlp()
        self.adaLN_modulation = mnn.Linear(HIDDEN, 6 * HIDDEN)
        self.silu = True  # False: the bug, the modulation reads c itself

    def __call__(self, x: mx.array, c: mx.array) -> mx.array:
        mod = self.adaLN_modulation(mnn.silu(c) if self.silu else c)
        shift1, scale1, gate1, shift2, scale2, gate2 = mx.split(mod, 6, axis=1)
        x = x + gate1[:, None] * self.attn(_modulate(self.norm1(x), shift1, scale1))
        return x + gate2[:, None] * self.mlp(_modulate(self.norm2(x), shift2, scale2))


class PortFinalLayer(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm_final = mnn.LayerNorm(HIDDEN, eps=1e-6, affine=False)
        self.linear = mnn.Linear(HIDDEN, OUT)
        self.adaLN_modulation = mnn.Linear(HIDDEN, 2 * HIDDEN)

    def __call__(self, x: mx.array, c: mx.array) -> mx.array:
        shift, scale = mx.split(self.adaLN_modulation(mnn.silu(c)), 2, axis=1)
        return self.linear(_modulate(self.norm_final(x), shift, scale))


class PortDiT(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = [PortBlock() for _ in range(BLOCKS)]
        self.final_layer = PortFinalLayer()

    def __call__(self, x: mx.array, c: mx.array) -> mx.array:
        for block in self.blocks:
            x = block(x, c)
        return self.final_layer(x, c)


def build(bug: str | None = None, seed: int = 0) -> tuple[DiT, PortDiT, tuple[Any, ...]]:
    """The reference (float32), its MLX port with ``bug`` planted, and the inputs
    ``(x, c)`` as torch tensors."""
    gen = generator(seed)
    ref = DiT().eval()
    init_o1(ref, gen)
    port = PortDiT()
    weights = {
        key.replace("adaLN_modulation.1.", "adaLN_modulation."): to_mlx(value)
        for key, value in ref.state_dict().items()
    }
    port.load_weights(list(weights.items()))
    if bug == "skipped_silu":
        port.blocks[0].silu = False
    elif bug is not None:
        raise ValueError(f"unknown bug {bug!r}; known: {', '.join(BUGS)}")
    x = torch.randn(2, TOKENS, HIDDEN, generator=gen)
    c = torch.randn(2, HIDDEN, generator=gen)
    return ref, port, (x, c)
