"""A tiny flow-matching pipeline in PyTorch, as such scripts go: diffusers' scheduler
makes the schedule, a denoiser is called twice per step (classifier-free guidance), and a
decoder reads the unscaled latents."""

import pipeline_setup as setup
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from torch import nn


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.time = nn.Linear(1, 32)
        self.cond = nn.Linear(8, 32)
        self.out = nn.Linear(32, 16)

    def forward(self, latents, timestep, context):
        h = self.inp(latents) + self.time(timestep[:, None])[:, None] + self.cond(context)[:, None]
        return self.out(torch.tanh(h))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 12)

    def forward(self, z):
        return torch.sigmoid(self.proj(z))


def loaded(module):
    shapes = [(name, tuple(p.shape)) for name, p in module.state_dict().items()]
    module.load_state_dict({k: torch.from_numpy(v) for k, v in setup.weights(shapes).items()})
    return module.eval()


denoiser, decoder = loaded(Denoiser()), loaded(Decoder())
scheduler = FlowMatchEulerDiscreteScheduler(shift=setup.SHIFT)
scheduler.set_timesteps(setup.STEPS)
sigmas = scheduler.sigmas
latents = torch.from_numpy(setup.noise())
cond, uncond = (torch.from_numpy(c) for c in setup.contexts())
with torch.no_grad():
    for i in range(setup.STEPS):
        t = sigmas[i].reshape(1)
        v_cond = denoiser(latents, t, cond)
        v_uncond = denoiser(latents, t, uncond)
        velocity = v_uncond + setup.GUIDANCE * (v_cond - v_uncond)
        latents = latents + (sigmas[i + 1] - sigmas[i]) * velocity
    latents = latents / setup.SCALE + setup.OFFSET
    image = decoder(latents)
print("reference done", tuple(image.shape))
