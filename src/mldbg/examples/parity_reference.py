"""Parity example, the reference: the tiny transformer in PyTorch, captured as ``NAME``.

``python parity_reference.py [NAME]`` writes the weights to ``tiny_weights.safetensors``
(in the working directory) for the port to load, then captures one forward pass.
"""

from __future__ import annotations

import sys

import torch
from safetensors.torch import save_file

import mldbg
from mldbg.examples.tiny_transformer import ModelArgs, TinyTransformer

WEIGHTS = "tiny_weights.safetensors"
PROMPT = "parity, please"


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "reference"
    torch.manual_seed(0)
    model = TinyTransformer(ModelArgs()).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, WEIGHTS)
    tokens = torch.tensor([[ord(c) % 96 for c in PROMPT]])
    with torch.no_grad(), mldbg.capture(model, name) as cap:
        logits = model(tokens)
    print(f"reference logits {tuple(logits.shape)} captured as {cap.name} in {cap.path}")


if __name__ == "__main__":
    main()
