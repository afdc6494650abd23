"""Gemma: transformers ``GemmaForCausalLM`` against mlx-lm's ``gemma.Model``.

Two differences come with mlx-lm's port as shipped:

- **A moved scale** (not a bug): transformers multiplies the embeddings by
  sqrt(hidden_size) inside ``embed_tokens`` (``GemmaTextScaledWordEmbedding``); mlx-lm
  uses a plain ``nn.Embedding`` and multiplies right after it.  With hidden 64 the
  ``model.embed_tokens`` outputs differ by exactly 8x, and ``model.layers.0``'s input
  agrees again.  Every Gemma port here has it: a verdict must list it as a boundary
  difference (ratio 8) and never name it as the culprit.
- **Exact vs tanh GELU** (a real difference): transformers' Gemma MLP uses
  ``gelu_pytorch_tanh`` (it even rewrites a legacy ``hidden_act="gelu"`` to it); mlx-lm's
  uses the exact ``nn.gelu``.  The zoo's *clean* port swaps in ``nn.gelu_approx`` (the
  tanh form) so that it really matches; bug ``gelu_exact`` keeps mlx-lm's MLP as
  shipped.  The two GELUs differ by < 5e-4 absolute, ~1e-4 relative at the MLP's
  output: visible in float32, below the rounding of bf16 and fp16 (so that bug is
  built for float32 only).

Bugs and the module a verdict must name:

- ``gelu_exact`` (float32 only): every MLP as mlx-lm ships it -> ``model.layers.0.mlp``.
- ``attn_scale``: layer 1's attention forgets 1/sqrt(head_dim) -> ``model.layers.1.self_attn``.
- ``norm_offset``: layer 1's ``input_layernorm`` scales by ``weight`` where Gemma scales
  by ``1 + weight`` (the classic Gemma port slip) -> ``model.layers.1.input_layernorm``.
- ``rope_base``: the port's rope base is 100x the reference's in every layer ->
  ``model.layers.0.self_attn``.

(A wrong eps is not a Gemma bug here: the residual stream carries the sqrt(hidden)
scale, mean square ~64, so even eps 1.0 moves a norm's output by < 1%, inside bf16
rounding.  The Llama family covers eps.)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as mnn
import torch

from .core import TORCH_DTYPES, UnknownCase, ZooPort, check_case, generator, init_o1, swap_class
from .core import to_mlx as _to_mlx

BUGS = ("gelu_exact", "attn_scale", "norm_offset", "rope_base")
FLOAT32_ONLY = ("gelu_exact",)
CULPRITS = {
    "gelu_exact": "model.layers.0.mlp",
    "attn_scale": "model.layers.1.self_attn",
    "norm_offset": "model.layers.1.input_layernorm",
    "rope_base": "model.layers.0.self_attn",
}
SEQ_LEN = 8


@dataclass(frozen=True)
class Sizes:
    """Gemma-2B shapes, shrunk: multi-query attention (one kv head), head_dim 16."""

    vocab_size: int = 128
    hidden_size: int = 64  # sqrt(64) = 8: the moved scale is exact in every dtype
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 1
    head_dim: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0


SIZES = Sizes()
EMBED_SCALE = SIZES.hidden_size**0.5


@functools.cache
def reference(dtype: str, seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    """transformers' Gemma in ``dtype`` (tied embeddings, tanh GELU) and its token ids."""
    from transformers import GemmaConfig, GemmaForCausalLM

    s = SIZES
    kwargs: dict[str, Any] = dict(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads,
        head_dim=s.head_dim,
        rms_norm_eps=s.rms_norm_eps,
        rope_theta=s.rope_theta,
        hidden_act="gelu_pytorch_tanh",
        attn_implementation="eager",
        use_cache=False,
    )
    config = GemmaConfig(**kwargs)
    gen = generator(seed)
    model: Any = GemmaForCausalLM(config)
    init_o1(model, gen, norm_center=0.0)  # Gemma's norms scale by (1 + weight)
    model = model.to(TORCH_DTYPES[dtype]).eval()
    ids = torch.randint(0, s.vocab_size, (1, SEQ_LEN), generator=gen)
    return model, ids


def _tanh_gelu_mlp(cls: type) -> type:
    class TanhGeluMLP(cls):  # type: ignore[misc, valid-type]
        """mlx-lm's Gemma MLP with transformers' GELU (the tanh approximation)."""

        def __call__(self, x: mx.array) -> mx.array:
            return self.down_proj(mnn.gelu_approx(self.gate_proj(x)) * self.up_proj(x))

    return TanhGeluMLP


def _norm_without_offset(cls: type) -> type:
    class NormWithoutOffset(cls):  # type: ignore[misc, valid-type]
        """The bug: ``x * w`` (Llama's RMSNorm) where Gemma computes ``x * (1 + w)``."""

        def __call__(self, x: mx.array) -> mx.array:
            return mx.fast.rms_norm(x, self.weight, self.eps)

    return NormWithoutOffset


def port_model(rope_theta: float = SIZES.rope_theta) -> Any:
    from mlx_lm.models import gemma

    s = SIZES
    return gemma.Model(
        gemma.ModelArgs(
            model_type="gemma",
            hidden_size=s.hidden_size,
            num_hidden_layers=s.num_hidden_layers,
            intermediate_size=s.intermediate_size,
            num_attention_heads=s.num_attention_heads,
            head_dim=s.head_dim,
            rms_norm_eps=s.rms_norm_eps,
            vocab_size=s.vocab_size,
            num_key_value_heads=s.num_key_value_heads,
            rope_theta=rope_theta,
        )
    )


def build(dtype: str = "float32", bug: str | None = None, *, seed: int = 0) -> ZooPort:
    """transformers Gemma vs mlx-lm Gemma in ``dtype``, ``bug`` planted in the port."""
    check_case("gemma", dtype, bug, BUGS)
    if bug in FLOAT32_ONLY and dtype != "float32":
        raise UnknownCase(f"gemma bug {bug!r} is below {dtype} rounding; built for float32 only")
    ref, ids = reference(dtype, seed)
    port = port_model(SIZES.rope_theta * (100 if bug == "rope_base" else 1))
    # The output projection is tied to the embedding on both sides: mlx-lm has no lm_head.
    weights = {k: _to_mlx(v) for k, v in ref.state_dict().items() if k != "lm_head.weight"}
    port.load_weights(list(weights.items()))
    port.eval()
    if bug != "gelu_exact":
        for layer in port.model.layers:
            swap_class(layer.mlp, _tanh_gelu_mlp)
    if bug == "attn_scale":
        port.model.layers[1].self_attn.scale = 1.0
    elif bug == "norm_offset":
        swap_class(port.model.layers[1].input_layernorm, _norm_without_offset)
    return ZooPort(
        arch="gemma",
        dtype=dtype,
        bug=bug,
        ref=ref,
        port=port,
        ref_inputs=(ids,),
        port_inputs=(mx.array(ids.numpy()),),
        culprit=CULPRITS[bug] if bug else None,
        moved_scale=("model.embed_tokens", EMBED_SCALE),
    )
