"""pipeline_reference.py ported to MLX by hand, the schedule written out; its first
argument plants a bug:

- ``schedule``: the sigmas are not shifted (the schedule, computed before the loop);
- ``cfg``: the guidance mix starts from the conditional velocity (the loop body);
- ``scale``: the latents reach the decoder unscaled (between the two models).
"""

import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pipeline_setup as setup

BUG = sys.argv[1] if len(sys.argv) > 1 else ""


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.time = nn.Linear(1, 32)
        self.cond = nn.Linear(8, 32)
        self.out = nn.Linear(32, 16)

    def __call__(self, latents, timestep, context):
        h = self.inp(latents) + self.time(timestep[:, None])[:, None] + self.cond(context)[:, None]
        return self.out(mx.tanh(h))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 12)

    def __call__(self, z):
        return mx.sigmoid(self.proj(z))


def loaded(module):
    shapes = [(name, tuple(p.shape)) for name, p in nn.utils.tree_flatten(module.parameters())]
    module.load_weights([(k, mx.array(v)) for k, v in setup.weights(shapes).items()])
    return module


denoiser, decoder = loaded(Denoiser()), loaded(Decoder())
shift = setup.SHIFT
sigma_min = shift * 0.001 / (1 + (shift - 1) * 0.001)
sigmas = np.linspace(1.0, sigma_min, setup.STEPS)
if BUG != "schedule":
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
sigmas = np.append(sigmas, 0.0)
latents = mx.array(setup.noise())
cond, uncond = (mx.array(c) for c in setup.contexts())
for i in range(setup.STEPS):
    t = mx.array([sigmas[i]], dtype=mx.float32)
    v_cond = denoiser(latents, t, cond)
    v_uncond = denoiser(latents, t, uncond)
    if BUG == "cfg":
        velocity = v_cond + setup.GUIDANCE * (v_cond - v_uncond)
    else:
        velocity = v_uncond + setup.GUIDANCE * (v_cond - v_uncond)
    latents = latents + float(sigmas[i + 1] - sigmas[i]) * velocity
if BUG != "scale":
    latents = latents / setup.SCALE + setup.OFFSET
image = decoder(latents)
mx.eval(image)
print("port done", image.shape)
