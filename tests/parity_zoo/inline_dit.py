"""A small DiT whose time embedding computes its sinusoid inline, in PyTorch and MLX.

Many hand-written DiTs (and the MLX ports of them) do not give the sinusoidal timestep
embedding a module of its own: ``time_embed`` computes ``[cos, sin](t * freqs)`` in its
own ``forward``, with ``t`` up to 1000, and then calls its ``Linear`` children.  One
float32 step of ``t * freqs`` (~6e-5 at 1000) moves the sines by about as much, so two
clean implementations differ there by ~1e-5 relative, many times what rounding alone
explains; a parity tool that does not measure the rounding of that inline work blames
the clean ``time_embed``.

A denoising loop drives the model: Euler steps of a flow-matching schedule whose sigmas
are time-shifted (``SHIFT``); the port's schedule can forget the shift (the bug
``schedule``), which leaves the first call (sigma 1) alone and changes the latents and
the timestep of every later one: glue code, between ``<root>#0`` and ``<root>#1``.
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import mlx.nn as mnn
import numpy as np
import torch
from torch import nn

from .core import generator, init_o1, to_mlx

HALF = 64  # frequencies of the sinusoid: 128 features
WIDTH = 64
CHANNELS = 8
TOKENS = 16
BLOCKS = 2
STEPS = 3
SHIFT = 3.0


class TorchTimeEmbed(nn.Module):
    """``[cos, sin](t * 10000^(-i/HALF))`` computed inline, then Linear, SiLU, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(2 * HALF, WIDTH)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(WIDTH, WIDTH)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        exponent = -math.log(10000) * torch.arange(HALF, dtype=torch.float32) / HALF
        args = t.float()[:, None] * torch.exp(exponent)[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(self.linear_1.weight.dtype)
        return self.linear_2(self.act(self.linear_1(emb)))


class TorchBlock(nn.Module):
    """adaLN: shift and scale from the conditioning, a norm, an MLP, a gated residual."""

    def __init__(self) -> None:
        super().__init__()
        self.modulation = nn.Linear(WIDTH, 3 * WIDTH)
        self.norm = nn.LayerNorm(WIDTH, elementwise_affine=False, eps=1e-6)
        self.fc1 = nn.Linear(WIDTH, 2 * WIDTH)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.modulation(nn.functional.silu(c)).chunk(3, dim=-1)
        h = self.norm(x) * (1 + scale[:, None]) + shift[:, None]
        return x + gate[:, None] * self.fc2(self.act(self.fc1(h)))


class TorchDiT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.x_embed = nn.Linear(CHANNELS, WIDTH)
        self.time_embed = TorchTimeEmbed()
        self.blocks = nn.ModuleList(TorchBlock() for _ in range(BLOCKS))
        self.out = nn.Linear(WIDTH, CHANNELS)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.x_embed(x)
        c = self.time_embed(t)
        for block in self.blocks:
            h = block(h, c)
        return self.out(h)


class MLXTimeEmbed(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = mnn.Linear(2 * HALF, WIDTH)
        self.act = mnn.SiLU()
        self.linear_2 = mnn.Linear(WIDTH, WIDTH)

    def __call__(self, t: mx.array) -> mx.array:
        freqs = mx.exp(-math.log(10000) * mx.arange(HALF, dtype=mx.float32) / HALF)
        args = t.astype(mx.float32)[:, None] * freqs[None]
        emb = mx.concatenate([mx.cos(args), mx.sin(args)], axis=-1)
        return self.linear_2(self.act(self.linear_1(emb.astype(self.linear_1.weight.dtype))))


class MLXBlock(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.modulation = mnn.Linear(WIDTH, 3 * WIDTH)
        self.norm = mnn.LayerNorm(WIDTH, eps=1e-6, affine=False)
        self.fc1 = mnn.Linear(WIDTH, 2 * WIDTH)
        self.act = mnn.GELU()
        self.fc2 = mnn.Linear(2 * WIDTH, WIDTH)

    def __call__(self, x: mx.array, c: mx.array) -> mx.array:
        shift, scale, gate = mx.split(self.modulation(mnn.silu(c)), 3, axis=-1)
        h = self.norm(x) * (1 + scale[:, None]) + shift[:, None]
        return x + gate[:, None] * self.fc2(self.act(self.fc1(h)))


class MLXDiT(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.x_embed = mnn.Linear(CHANNELS, WIDTH)
        self.time_embed = MLXTimeEmbed()
        self.blocks = [MLXBlock() for _ in range(BLOCKS)]
        self.out = mnn.Linear(WIDTH, CHANNELS)

    def __call__(self, x: mx.array, t: mx.array) -> mx.array:
        h = self.x_embed(x)
        c = self.time_embed(t)
        for block in self.blocks:
            h = block(h, c)
        return self.out(h)


def build(seed: int = 0) -> tuple[TorchDiT, MLXDiT, torch.Tensor]:
    """The reference, its port with the same weights, and the starting latents."""
    gen = generator(seed)
    ref = TorchDiT()
    init_o1(ref, gen)
    ref.eval()
    port = MLXDiT()
    port.load_weights([(k, to_mlx(v)) for k, v in ref.state_dict().items()])
    latents = torch.randn(1, TOKENS, CHANNELS, generator=gen)
    return ref, port, latents


def sigmas(shift: bool) -> list[float]:
    """1 .. 1/STEPS, time-shifted (or, the bug, not), then 0."""
    found = np.linspace(1.0, 1.0 / STEPS, STEPS)
    if shift:
        found = SHIFT * found / (1 + (SHIFT - 1) * found)
    return [float(s) for s in found] + [0.0]


def reference_loop(model: TorchDiT, latents: torch.Tensor) -> torch.Tensor:
    schedule = sigmas(shift=True)
    with torch.no_grad():
        for sigma, following in zip(schedule[:-1], schedule[1:], strict=True):
            t = torch.tensor([sigma * 1000], dtype=torch.float32)
            velocity = model(latents, t)  # REF-CALL
            latents = latents + (following - sigma) * velocity
    return latents


def port_loop(model: MLXDiT, latents: Any, *, shift: bool = True) -> Any:
    schedule = sigmas(shift)
    for sigma, following in zip(schedule[:-1], schedule[1:], strict=True):
        t = mx.array([sigma * 1000], dtype=mx.float32)
        velocity = model(latents, t)  # PORT-CALL
        latents = latents + (following - sigma) * velocity
        mx.eval(latents)
    return latents
