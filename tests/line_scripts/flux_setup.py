"""What the Flux reference and its MLX port share: the sizes, and the weights and inputs
made from seeds by name (numpy only), so the two scripts need no file between them.

``tiny`` is the zoo's Flux (2 heads of 16); ``flux`` is FLUX.1's width (24 heads of 128,
hidden 3,072) with one double block, 1,024 image and 256 text tokens, in bfloat16.
"""

import zlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Size:
    heads: int
    head_dim: int
    image_side: int
    text_tokens: int
    in_channels: int
    joint_dim: int
    pooled_dim: int
    axes: tuple
    dtype: str


SIZES = {
    "tiny": Size(2, 16, 4, 4, 16, 32, 16, (4, 6, 6), "float32"),
    "flux": Size(24, 128, 32, 256, 64, 64, 64, (16, 56, 56), "bfloat16"),
}


def config(size):
    return {
        "patch_size": 1,
        "in_channels": size.in_channels,
        "num_layers": 1,
        "num_single_layers": 0,
        "attention_head_dim": size.head_dim,
        "num_attention_heads": size.heads,
        "joint_attention_dim": size.joint_dim,
        "pooled_projection_dim": size.pooled_dim,
        "axes_dims_rope": size.axes,
    }


def weights(shapes):
    """One array per (name, shape): its seed is its name."""
    found = {}
    for name, shape in shapes:
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        if len(shape) == 2:
            value = rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[1])
        elif name.endswith("norm_q.weight") or "norm_k" in name or "norm_added" in name:
            value = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        else:
            value = 0.02 * rng.standard_normal(shape, dtype=np.float32)
        found[name] = value.astype(np.float32)
    return found


def inputs(size):
    rng = np.random.default_rng(7)
    side = size.image_side
    ids = np.zeros((side, side, 3), dtype=np.float32)
    ids[..., 1] = np.arange(side)[:, None]
    ids[..., 2] = np.arange(side)[None, :]
    return {
        "latents": rng.standard_normal((1, side * side, size.in_channels), dtype=np.float32),
        "text": rng.standard_normal((1, size.text_tokens, size.joint_dim), dtype=np.float32),
        "pooled": rng.standard_normal((1, size.pooled_dim), dtype=np.float32),
        "sigma": np.array([0.9], dtype=np.float32),
        "img_ids": ids.reshape(side * side, 3),
        "txt_ids": np.zeros((size.text_tokens, 3), dtype=np.float32),
    }
