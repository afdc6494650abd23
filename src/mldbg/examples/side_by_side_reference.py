"""The tutorial's side-by-side reference (PyTorch): attention weights, scaled as they should be."""

from __future__ import annotations

import math

import torch

d = 4
x = torch.arange(24, dtype=torch.float32).reshape(2, 3, d) / 24
scores = x @ x.transpose(-1, -2) / math.sqrt(d)
weights = torch.softmax(scores, dim=-1)
print("reference ready")  # tutorial: compare here
