"""The tutorial's side-by-side port (MLX): the same attention weights, with the scale forgotten."""

from __future__ import annotations

import mlx.core as mx

d = 4
x = mx.arange(24, dtype=mx.float32).reshape(2, 3, d) / 24
scores = x @ x.swapaxes(-1, -2)  # the porting mistake: no 1/sqrt(d)
weights = mx.softmax(scores, axis=-1)
print("port ready")  # tutorial: compare here
