"""The tutorial's PyTorch script: the tiny transformer, a checkpoint and a saved tensor."""

from __future__ import annotations

import torch

from mldbg import debug_checkpoint, debug_save
from mldbg.examples.tiny_transformer import ModelArgs, TinyTransformer


def generate(model: TinyTransformer, tokens: torch.Tensor, steps: int) -> torch.Tensor:
    for step in range(steps):
        logits = model(tokens)  # tutorial: step
        next_token = logits[:, -1].argmax(-1, keepdim=True)
        debug_checkpoint("generate.logits", logits=logits, step=step)
        tokens = torch.cat([tokens, next_token], dim=1)
    return tokens


def main() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(ModelArgs()).eval()
    tokens = torch.tensor([[ord(c) % 96 for c in "hello"]])
    with torch.no_grad():
        out = generate(model, tokens, steps=3)
        debug_save(model(out), "tutorial.logits")
    print("tokens", out.tolist())


if __name__ == "__main__":
    main()
