"""Every (architecture, dtype, bug) the zoo builds, and one ``build`` for all of them.

=============  ===========================================  ===============================
arch           reference -> port                            bugs
=============  ===========================================  ===============================
llama          transformers Llama -> mlx-lm llama           rope_base, norm_eps, attn_scale,
qwen2          transformers Qwen2 -> mlx-lm qwen2           swapped_mlp, skipped_norm
mistral        transformers Mistral -> mlx-lm llama         (same)
torch_llama    transformers Llama -> hand-written torch     (same)
qwen3          transformers Qwen3 -> mlx-lm qwen3           qk_norm_eps, skipped_qk_norm,
                                                            attn_scale, swapped_mlp
gemma          transformers Gemma -> mlx-lm gemma           gelu_exact (fp32), attn_scale,
                                                            norm_offset, rope_base; moved
                                                            scale in every case
gpt2           transformers GPT-2 -> mlx-lm gpt2            attn_scale, ln_eps, skipped_ln,
               (transformer. -> model., (1,L) vs (L,))      position_offset
renamed        transformers Llama -> hand-written MLX,      attn_scale, swapped_mlp
               other names (through a map)
vae            diffusers VAE encoder -> hand-written MLX    groupnorm_groups, attn_scale,
               (NHWC, ambiguous 32x32x32 layout)            downsample_padding, skipped_norm
flux           diffusers FluxTransformer2DModel -> hand-    rope, modulation, timestep
               written MLX (same names)
sd3            diffusers SD3Transformer2DModel -> hand-     modulation, timestep
               written MLX (patch conv in NHWC)
pixart         diffusers PixArtTransformer2DModel -> hand-  modulation (inline in the
               written MLX (adaLN-single, cross-attention)  block), timestep
qwen2-q4/-q8   transformers Qwen2 -> mlx-lm qwen2,          see QUANTIZED_BUGS
               nn.quantize 4 / 8 bits, group 32
=============  ===========================================  ===============================

Each arch is built in float32, bfloat16 and float16 (both sides in that dtype), clean and
with each of its bugs; the expected culprit of a bug is documented in its builder's module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import flux, gemma, gpt2, llama_family, pixart, renamed, sd3, torch_llama, vae
from .core import DTYPES, UnknownCase, ZooPort

QUANT_GROUP = 32
# 4-bit noise on O(1) random weights is ~10-20% at every module, so a 4-bit port keeps
# the bugs that push a module far past it (a norm's eps moves it by ~20%: 8-bit only).
QUANTIZED_BUGS = {4: ("attn_scale", "swapped_mlp"), 8: ("attn_scale", "norm_eps")}


def _llama_family(arch: str) -> Callable[..., ZooPort]:
    return lambda dtype, bug, seed=0: llama_family.build(arch, dtype, bug, seed=seed)


def _quantized(bits: int) -> Callable[..., ZooPort]:
    return lambda dtype, bug, seed=0: llama_family.build(
        "qwen2", dtype, bug, quantize=(bits, QUANT_GROUP), seed=seed
    )


BUILDERS: dict[str, Callable[..., ZooPort]] = {
    "llama": _llama_family("llama"),
    "qwen2": _llama_family("qwen2"),
    "mistral": _llama_family("mistral"),
    "qwen3": _llama_family("qwen3"),
    "torch_llama": torch_llama.build,
    "gemma": gemma.build,
    "gpt2": gpt2.build,
    "renamed": renamed.build,
    "vae": vae.build,
    "flux": flux.build,
    "sd3": sd3.build,
    "pixart": pixart.build,
    "qwen2-q4": _quantized(4),
    "qwen2-q8": _quantized(8),
}
BUGS: dict[str, tuple[str, ...]] = {
    "llama": llama_family.BUGS,
    "qwen2": llama_family.BUGS,
    "mistral": llama_family.BUGS,
    "qwen3": llama_family.QWEN3_BUGS,
    "torch_llama": torch_llama.BUGS,
    "gemma": gemma.BUGS,
    "gpt2": gpt2.BUGS,
    "renamed": renamed.BUGS,
    "vae": vae.BUGS,
    "flux": flux.BUGS,
    "sd3": sd3.BUGS,
    "pixart": pixart.BUGS,
    "qwen2-q4": QUANTIZED_BUGS[4],
    "qwen2-q8": QUANTIZED_BUGS[8],
}


@dataclass(frozen=True)
class Case:
    arch: str
    dtype: str
    bug: str | None = None

    def __str__(self) -> str:
        short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[self.dtype]
        return f"{self.arch}-{short}-{self.bug or 'clean'}"


def _buildable(arch: str, dtype: str, bug: str | None) -> bool:
    return not (arch == "gemma" and bug in gemma.FLOAT32_ONLY and dtype != "float32")


def all_cases(archs: tuple[str, ...] | None = None) -> list[Case]:
    """Every case of ``archs`` (all by default): each dtype, clean then each bug."""
    return [
        Case(arch, dtype, bug)
        for arch in archs or tuple(BUILDERS)
        for dtype in DTYPES
        for bug in (None, *BUGS[arch])
        if _buildable(arch, dtype, bug)
    ]


def build(case: Case, seed: int = 0) -> ZooPort:
    """A fresh port for ``case`` (the reference is shared: ports never change it).

    ``seed`` draws other weights and inputs: the tests use 0; other seeds check that a
    verdict does not depend on one draw.
    """
    if case.arch not in BUILDERS:
        raise UnknownCase(f"unknown architecture {case.arch!r}; known: {', '.join(BUILDERS)}")
    return BUILDERS[case.arch](case.dtype, case.bug, seed=seed)
