"""Llama, Qwen2, Mistral, Qwen3: transformers ``*ForCausalLM`` against mlx-lm's ``Model``.

The port is what a user gets from mlx-lm: ``mlx_lm.models.llama`` (Mistral too: mlx-lm
maps ``model_type="mistral"`` to its Llama module), ``qwen2`` or ``qwen3``, built
from the same sizes, loading the reference's state_dict as is (mlx-lm keeps
transformers' parameter names for these models, so every module path present in both
is the same module).  Optionally quantized with ``mlx.nn.quantize`` (4 or 8 bits).

Structural differences a parity tool must see through, none of them a bug:
transformers computes cos/sin once in ``model.rotary_emb`` and calls attention with
``hidden_states=`` / ``position_embeddings=`` keywords; mlx-lm rotates inside each
attention (an ``nn.RoPE`` submodule, ``self_attn.rope``) and passes ``x`` positionally;
transformers' activation is a module (``mlp.act_fn``), mlx-lm's a function; the
reference has a ``model`` module whose output is the final norm's.

Bugs, planted in the port instance only, and the module a verdict must name:

- ``rope_base``: the port's rope base is 100x the reference's in every layer (a config
  slip) -> ``model.layers.0.self_attn`` (the first attention; its rope is inside it).
- ``norm_eps``: layer 1's ``post_attention_layernorm`` has eps 1.0 ->
  ``model.layers.1.post_attention_layernorm``.
- ``attn_scale``: layer 1's attention forgets the 1/sqrt(head_dim) scale ->
  ``model.layers.1.self_attn``.
- ``swapped_mlp``: layer 1's MLP swaps gate and up (``down(silu(up x) * gate x)``) ->
  ``model.layers.1.mlp`` (its projections still agree one by one).
- ``skipped_norm``: layer 1 never calls its ``post_attention_layernorm`` (the MLP gets
  the raw residual stream) -> ``model.layers.1.post_attention_layernorm``, the module the
  port never calls: it exists in the port, holds the right weights and would compute
  the right thing, but its parent's forward skips it.  (Replayed alone, the norm is
  fine and ``model.layers.1`` is wrong; a verdict names the skipped child because
  calling it is the fix.  Modules a port does not have at all, such as transformers'
  ``mlp.act_fn`` or ``model.rotary_emb``, are not "never called": they are one-sided.)

Qwen3 normalizes queries and keys per head inside attention (``self_attn.q_norm`` /
``k_norm``, on (B, L, heads, head_dim) on both sides); its own bugs sit one level deeper:

- ``qk_norm_eps``: layer 1's ``q_norm`` has eps 1.0 -> ``model.layers.1.self_attn.q_norm``.
- ``skipped_qk_norm``: layer 1's attention never calls its ``k_norm`` ->
  ``model.layers.1.self_attn.k_norm`` (never called, like ``skipped_norm``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
import mlx.nn as mnn
import torch

from .core import (
    TORCH_DTYPES,
    ZooPort,
    check_case,
    generator,
    init_o1,
    swap_class,
    to_mlx,
)

ARCHS = ("llama", "qwen2", "mistral", "qwen3")
BUGS = ("rope_base", "norm_eps", "attn_scale", "swapped_mlp", "skipped_norm")
QWEN3_BUGS = ("qk_norm_eps", "skipped_qk_norm", "attn_scale", "swapped_mlp")
CULPRITS = {
    "rope_base": "model.layers.0.self_attn",
    "norm_eps": "model.layers.1.post_attention_layernorm",
    "attn_scale": "model.layers.1.self_attn",
    "swapped_mlp": "model.layers.1.mlp",
    "skipped_norm": "model.layers.1.post_attention_layernorm",
    "qk_norm_eps": "model.layers.1.self_attn.q_norm",
    "skipped_qk_norm": "model.layers.1.self_attn.k_norm",
}
SEQ_LEN = 8
BUGGY_LAYER = 1


@dataclass(frozen=True)
class Sizes:
    """One tiny config shared by all three architectures (Llama-family shapes: GQA 4/2)."""

    vocab_size: int = 128
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 64


SIZES = Sizes()


def _hf_config(arch: str, s: Sizes = SIZES) -> Any:
    import transformers

    common: dict[str, Any] = dict(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads,
        head_dim=s.head_dim,
        rms_norm_eps=s.rms_norm_eps,
        rope_theta=s.rope_theta,
        max_position_embeddings=s.max_position_embeddings,
        tie_word_embeddings=False,
        attn_implementation="eager",
        use_cache=False,
    )
    if arch == "llama":
        return transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    if arch == "qwen2":
        return transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    if arch == "qwen3":
        return transformers.Qwen3Config(**common), transformers.Qwen3ForCausalLM
    return transformers.MistralConfig(**common, sliding_window=None), (
        transformers.MistralForCausalLM
    )


@functools.cache
def reference(
    arch: str, dtype: str, seed: int = 0, s: Sizes = SIZES
) -> tuple[torch.nn.Module, torch.Tensor]:
    """The transformers model in ``dtype`` and its token ids (built once per process).

    Shared by every port of this (arch, dtype, seed): ports never touch it.
    """
    config, cls = _hf_config(arch, s)
    gen = generator(seed)
    model = cls(config)
    init_o1(model, gen)
    model = model.to(TORCH_DTYPES[dtype]).eval()
    ids = torch.randint(0, SIZES.vocab_size, (1, SEQ_LEN), generator=gen)
    return model, ids


def mlx_model(arch: str, rope_theta: float, s: Sizes = SIZES) -> mnn.Module:
    """mlx-lm's model for ``arch`` with the zoo's sizes (random weights until loaded)."""
    from mlx_lm.models import llama, qwen2, qwen3

    if arch == "qwen3":
        return qwen3.Model(
            qwen3.ModelArgs(
                model_type="qwen3",
                hidden_size=s.hidden_size,
                num_hidden_layers=s.num_hidden_layers,
                intermediate_size=s.intermediate_size,
                num_attention_heads=s.num_attention_heads,
                rms_norm_eps=s.rms_norm_eps,
                vocab_size=s.vocab_size,
                num_key_value_heads=s.num_key_value_heads,
                max_position_embeddings=s.max_position_embeddings,
                head_dim=s.head_dim,
                rope_theta=rope_theta,
                tie_word_embeddings=False,
            )
        )
    if arch == "qwen2":
        return qwen2.Model(
            qwen2.ModelArgs(
                model_type="qwen2",
                hidden_size=s.hidden_size,
                num_hidden_layers=s.num_hidden_layers,
                intermediate_size=s.intermediate_size,
                num_attention_heads=s.num_attention_heads,
                rms_norm_eps=s.rms_norm_eps,
                vocab_size=s.vocab_size,
                num_key_value_heads=s.num_key_value_heads,
                max_position_embeddings=s.max_position_embeddings,
                rope_theta=rope_theta,
                tie_word_embeddings=False,
            )
        )
    return llama.Model(
        llama.ModelArgs(
            model_type=arch,  # "mistral" runs on mlx-lm's Llama module too
            hidden_size=s.hidden_size,
            num_hidden_layers=s.num_hidden_layers,
            intermediate_size=s.intermediate_size,
            num_attention_heads=s.num_attention_heads,
            num_key_value_heads=s.num_key_value_heads,
            head_dim=s.head_dim,
            rms_norm_eps=s.rms_norm_eps,
            vocab_size=s.vocab_size,
            max_position_embeddings=s.max_position_embeddings,
            rope_theta=rope_theta,
            tie_word_embeddings=False,
        )
    )


def load_from(port: mnn.Module, ref: torch.nn.Module) -> None:
    """Load the reference's weights into the port, strictly (every name must match)."""
    weights = {k: to_mlx(v) for k, v in ref.state_dict().items()}
    port.load_weights(list(port.sanitize(weights).items()))
    port.eval()


# -- bugs --------------------------------------------------------------------------------


def _swapped_mlp(cls: type) -> type:
    from mlx_lm.models.activations import swiglu

    class SwappedMLP(cls):  # type: ignore[misc, valid-type]
        """The bug: gate and up exchanged, ``down(silu(up(x)) * gate(x))``."""

        def __call__(self, x: mx.array) -> mx.array:
            gate, up = self.gate_proj(x), self.up_proj(x)
            return self.down_proj(swiglu(up, gate))

    return SwappedMLP


def _block_without_post_norm(cls: type) -> type:
    class BlockWithoutPostNorm(cls):  # type: ignore[misc, valid-type]
        """The bug: the MLP gets the residual stream un-normalized."""

        def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
            h = x + self.self_attn(self.input_layernorm(x), mask, cache)
            return h + self.mlp(h)

    return BlockWithoutPostNorm


def _attention_without_k_norm(cls: type) -> type:
    from mlx_lm.models.base import scaled_dot_product_attention

    class AttentionWithoutKNorm(cls):  # type: ignore[misc, valid-type]
        """The bug: Qwen3's attention with keys left un-normalized."""

        def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
            B, L, _ = x.shape
            q = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, -1))
            k = self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)
            v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
            q, k = self.rope(q.transpose(0, 2, 1, 3)), self.rope(k.transpose(0, 2, 1, 3))
            out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
            return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))

    return AttentionWithoutKNorm


def plant(port: mnn.Module, bug: str, layer: int = BUGGY_LAYER) -> None:
    """Plant ``bug`` (not ``rope_base``, which is a build argument) in one port layer."""
    block = port.model.layers[layer]
    if bug == "norm_eps":
        block.post_attention_layernorm.eps = 1.0
    elif bug == "attn_scale":
        block.self_attn.scale = 1.0
    elif bug == "swapped_mlp":
        swap_class(block.mlp, _swapped_mlp)
    elif bug == "skipped_norm":
        swap_class(block, _block_without_post_norm)
    elif bug == "qk_norm_eps":
        block.self_attn.q_norm.eps = 1.0
    elif bug == "skipped_qk_norm":
        swap_class(block.self_attn, _attention_without_k_norm)
    else:
        raise AssertionError(bug)


def build(
    arch: str,
    dtype: str = "float32",
    bug: str | None = None,
    *,
    quantize: tuple[int, int] | None = None,
    seed: int = 0,
    layers: int | None = None,
) -> ZooPort:
    """transformers ``arch`` vs mlx-lm, both in ``dtype``, with ``bug`` planted in the port.

    ``quantize=(bits, group_size)`` quantizes the port (every Linear and the embedding)
    with ``mlx.nn.quantize`` after loading the reference's weights: the common MLX case
    of a 4- or 8-bit port checked against a full-precision reference.  ``layers``
    overrides the zoo's depth (a deeper model lets quantization noise compound).
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHS)}")
    check_case(arch, dtype, bug, QWEN3_BUGS if arch == "qwen3" else BUGS)
    sizes = SIZES if layers is None else replace(SIZES, num_hidden_layers=layers)
    ref, ids = reference(arch, dtype, seed, sizes)
    theta = sizes.rope_theta * (100 if bug == "rope_base" else 1)
    port = mlx_model(arch, theta, sizes)
    load_from(port, ref)
    if bug not in (None, "rope_base"):
        plant(port, bug)
    quantized = None
    if quantize is not None:
        bits, group_size = quantize
        mnn.quantize(port, group_size=group_size, bits=bits)
        quantized = {"bits": bits, "group_size": group_size}
    return ZooPort(
        arch=arch if quantize is None else f"{arch}-q{quantize[0]}",
        dtype=dtype,
        bug=bug,
        ref=ref,
        port=port,
        ref_inputs=(ids,),
        port_inputs=(mx.array(ids.numpy()),),
        culprit=CULPRITS[bug] if bug else None,
        quantized=quantized,
    )
