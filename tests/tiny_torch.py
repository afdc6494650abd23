"""The tiny torch MLP the capture tests record: two ``Linear`` children around a
parameter-free ``GELU`` module, so a capture holds a root, children with parameters and
one without, in a few kilobytes."""

from __future__ import annotations

import torch


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))
