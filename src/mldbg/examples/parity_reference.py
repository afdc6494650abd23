"""Parity example, the reference: the tiny transformer in PyTorch, an unmodified script.

``python -m mldbg.examples.parity_reference`` writes the weights to
``tiny_weights.safetensors`` (in the working directory) for the port to load, then runs
one forward pass.  It knows nothing of mldbg: ``mldbg start --capture ref --run -m
mldbg.examples.parity_reference`` records it (README, "Compare a port without editing it").
"""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from mldbg.examples.tiny_transformer import ModelArgs, TinyTransformer

WEIGHTS = "tiny_weights.safetensors"
PROMPT = "parity, please"


def main() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(ModelArgs()).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, WEIGHTS)
    tokens = torch.tensor([[ord(c) % 96 for c in PROMPT]])
    with torch.no_grad():
        logits = model(tokens)
    print(f"reference logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()
