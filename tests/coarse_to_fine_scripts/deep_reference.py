import torch
from deep_model import build, inputs

with torch.no_grad():
    out = build()(inputs())
print("reference", float(out.abs().mean()))
