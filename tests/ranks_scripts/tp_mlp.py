"""A 2-way tensor-parallel MLP (Megatron style) on gloo, and its single-process reference.

python tp_mlp.py            -> the single-process reference
torchrun --nproc_per_node 2 tp_mlp.py  -> each rank holds half of fc1's outputs (column
parallel) and half of fc2's inputs (row parallel); fc2's partial sums are all-reduced.
torchrun --nproc_per_node 2 tp_mlp.py bug  -> rank 1 loads rank 0's slice of fc1's bias.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

HIDDEN, INNER = 16, 64


class MLP(nn.Module):
    def __init__(self, inner: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(HIDDEN, inner)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(inner, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(self.act(self.fc1(x)))
        if dist.is_initialized():
            dist.all_reduce(y)
        return y


torch.manual_seed(0)
full = MLP(INNER)
x = torch.randn(4, HIDDEN, generator=torch.Generator().manual_seed(1))
if "RANK" in os.environ:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    part = INNER // world
    model = MLP(part)
    with torch.no_grad():
        model.fc1.weight.copy_(full.fc1.weight[rank * part : (rank + 1) * part])
        start = 0 if "bug" in sys.argv[1:] else rank * part  # the bug: a slicing slip
        model.fc1.bias.copy_(full.fc1.bias[start : start + part])
        model.fc2.weight.copy_(full.fc2.weight[:, rank * part : (rank + 1) * part])
    with torch.no_grad():
        out = model(x)
    dist.destroy_process_group()
else:
    with torch.no_grad():
        out = full(x)
print("done", float(out.abs().sum()))
