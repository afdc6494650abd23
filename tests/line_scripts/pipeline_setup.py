"""What the pipeline reference and its MLX port share (numpy only): the weights, made
from seeds by name, the starting noise, the conditioning and the settings."""

import zlib

import numpy as np

STEPS = 4
SHIFT = 3.0
GUIDANCE = 4.0
SCALE, OFFSET = 0.36, 0.12  # the latents' scale and shift before the decoder


def weights(shapes):
    found = {}
    for name, shape in shapes:
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        fan_in = shape[1] if len(shape) == 2 else 1
        found[name] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return found


def noise():
    return np.random.default_rng(3).standard_normal((1, 6, 16)).astype(np.float32)


def contexts():
    rng = np.random.default_rng(5)
    return rng.standard_normal((1, 8)).astype(np.float32), np.zeros((1, 8), dtype=np.float32)
