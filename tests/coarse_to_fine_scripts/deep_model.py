"""A deep model with large activations and cheap arithmetic (shared by both scripts).

64 residual blocks on a 4096 x 1024 float32 stream (16 MiB per tensor), each with four
element-wise modules and six dropouts (identities in eval mode, as in most transformer
blocks): a full capture of every module call's inputs and outputs would write
``would_be_bytes()`` = 23.6 GB, while the forward costs a few passes over memory per
block.  The port computes its residual adds with ``torch.add(..., alpha=)`` (rounding
differs from the reference's ``x + 0.1 * y``) and planted a bug in one block's ``mix``.
"""

from __future__ import annotations

import torch
from torch import nn

TOKENS, HIDDEN, BLOCKS = 4096, 1024, 64
DROPOUTS = 6
BUGGY_BLOCK = 41


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class Shift(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


class Act(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


class Mix(nn.Module):
    def __init__(self, shift: int) -> None:
        super().__init__()
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - 0.5 * torch.roll(x, self.shift, dims=-1)


class Block(nn.Module):
    def __init__(self, port: bool, shift: int) -> None:
        super().__init__()
        self.port = port
        self.scale, self.shift, self.act, self.mix = Scale(), Shift(), Act(), Mix(shift)
        self.drops = nn.ModuleList(nn.Dropout(0.1) for _ in range(DROPOUTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.drops
        y = d[3](self.mix(d[2](self.act(d[1](self.shift(self.scale(d[0](x))))))))
        y = d[5](d[4](y))
        return torch.add(x, y, alpha=0.1) if self.port else x + 0.1 * y


class Deep(nn.Module):
    def __init__(self, port: bool = False, buggy_block: int | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            Block(port=port, shift=2 if i == buggy_block else 1) for i in range(BLOCKS)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def build(port: bool = False, buggy_block: int | None = None) -> Deep:
    torch.manual_seed(0)
    model = Deep(port, buggy_block)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


def would_be_bytes() -> int:
    """What a full capture (inputs and outputs of every module call) would write."""
    tensor = TOKENS * HIDDEN * 4
    calls_per_block = 1 + 4 + DROPOUTS  # the block, its four modules, its dropouts
    return 2 * tensor * (1 + BLOCKS * calls_per_block)  # the model's own call, then blocks


def inputs() -> torch.Tensor:
    return torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
