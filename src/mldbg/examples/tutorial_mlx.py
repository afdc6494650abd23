"""The tutorial's MLX script: the tiny transformer, a checkpoint and a saved array."""

from __future__ import annotations

import mlx.core as mx

from mldbg import debug_checkpoint, debug_save
from mldbg.examples.tiny_mlx import ModelArgs, TinyTransformer


def generate(model: TinyTransformer, tokens: mx.array, steps: int) -> mx.array:
    for step in range(steps):
        logits = model(tokens)  # tutorial: step
        next_token = mx.argmax(logits[:, -1], axis=-1, keepdims=True)
        debug_checkpoint("generate.logits", logits=logits, step=step)
        tokens = mx.concatenate([tokens, next_token.astype(tokens.dtype)], axis=1)
    return tokens


def main() -> None:
    mx.random.seed(0)
    model = TinyTransformer(ModelArgs())
    tokens = mx.array([[ord(c) % 96 for c in "hello"]])
    out = generate(model, tokens, steps=3)
    debug_save(model(out), "tutorial.logits")
    print("tokens", out.tolist())


if __name__ == "__main__":
    main()
