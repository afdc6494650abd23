"""diffusers' FluxTransformer2DModel, one double block: the reference (its first argument
is the size, ``tiny`` or ``flux``; see flux_setup.py)."""

import sys

import flux_setup as setup
import torch
from diffusers import FluxTransformer2DModel

size = setup.SIZES[sys.argv[1] if len(sys.argv) > 1 else "tiny"]
dtype = getattr(torch, size.dtype)
model = FluxTransformer2DModel(**setup.config(size))
shapes = [(name, tuple(p.shape)) for name, p in model.state_dict().items()]
model.load_state_dict({k: torch.from_numpy(v) for k, v in setup.weights(shapes).items()})
model = model.to(dtype).eval()
given = {k: torch.from_numpy(v) for k, v in setup.inputs(size).items()}
with torch.no_grad():
    out = model(
        hidden_states=given["latents"].to(dtype),
        encoder_hidden_states=given["text"].to(dtype),
        pooled_projections=given["pooled"].to(dtype),
        timestep=given["sigma"].to(dtype),
        img_ids=given["img_ids"],
        txt_ids=given["txt_ids"],
    ).sample
print("reference done", tuple(out.shape))
