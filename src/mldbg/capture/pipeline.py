"""Several models in one capture: ``mldbg.capture({"text_encoder": te, "transformer": t}, "ref")``.

A pipeline calls its models in turn (text encoder(s), the denoiser at every step of a
loop, the VAE), and a port goes wrong as often between them as inside them.  Capturing
them together keeps one execution order across models, so compare can name the first
model, step and module that diverge, or the code between two calls.

The models are held, unchanged, by one container module whose children they are: the
container is never called, each model's calls are top-level (``transformer#0``,
``transformer#1``, ... one per step), and every module path starts with the model's name
(``transformer.transformer_blocks.0.attn``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MAX_MODELS = 64
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def container(models: Mapping[str, Any], framework_of: Any) -> Any:
    """One module holding ``models`` under their names (all of one framework)."""
    if not models:
        raise TypeError("mldbg.capture got an empty dict of models: give at least one")
    if len(models) > MAX_MODELS:
        raise TypeError(f"mldbg.capture takes at most {MAX_MODELS} models, got {len(models)}")
    for name in models:
        if not isinstance(name, str) or not _NAME.fullmatch(name):  # "$" takes a final "\n"
            raise TypeError(
                f"model names are identifiers of at most 64 characters (letters, digits, _), "
                f"not {str(name)[:80]!r}: they start every module path of the capture"
            )
    frameworks = {framework_of(model) for model in models.values()}
    if len(frameworks) > 1:
        raise TypeError(
            "one capture records models of one framework; capture the torch and the MLX "
            "models separately"
        )
    if frameworks == {"torch"}:
        import torch

        return torch.nn.ModuleDict(dict(models))
    import mlx.nn as mnn

    holder = mnn.Module()
    for name, model in models.items():
        setattr(holder, name, model)
    return holder
