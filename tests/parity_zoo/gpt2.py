"""GPT-2: transformers ``GPT2LMHeadModel`` against mlx-lm's ``gpt2.Model``.

Another family: LayerNorm with biases, learned position embeddings (``wpe``), one fused
``c_attn`` projection, tanh GELU, tied output embedding.  What differs without being a
bug:

- **Names**: transformers nests the decoder as ``transformer`` (``transformer.h.0.attn``),
  mlx-lm as ``model`` (``model.h.0.attn``): ``NAME_MAP`` renames one prefix.
- **Weights**: transformers' ``Conv1D`` stores (in, out); mlx-lm's ``sanitize`` transposes
  them to ``nn.Linear``'s (out, in).  Activations are laid out alike.
- **Shapes**: transformers' position ids are (1, L), mlx-lm's (L,): ``wpe`` gets (1, 8)
  and returns (1, 8, 64) in one, (8,) and (8, 64) in the other: the same numbers
  without the leading unit axis.
- transformers calls ``transformer.drop``, ``attn.resid_dropout``, ``mlp.act`` and
  ``mlp.dropout`` as modules; mlx-lm has none of them.

Bugs and the module a verdict must name (reference names):

- ``attn_scale``: block 1's attention forgets 1/sqrt(head_dim) -> ``transformer.h.1.attn``.
- ``ln_eps``: block 1's ``ln_2`` has eps 1.0 -> ``transformer.h.1.ln_2``.
- ``skipped_ln``: block 1 never calls its ``ln_2`` -> ``transformer.h.1.ln_2``.
- ``position_offset``: the decoder numbers positions from 1 (an off-by-one) ->
  ``transformer``, whose forward makes the position ids; ``wpe`` is right on what it
  was given.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import torch

from .core import TORCH_DTYPES, ZooPort, check_case, generator, init_o1, swap_class, to_mlx

BUGS = ("attn_scale", "ln_eps", "skipped_ln", "position_offset")
CULPRITS = {
    "attn_scale": "transformer.h.1.attn",
    "ln_eps": "transformer.h.1.ln_2",
    "skipped_ln": "transformer.h.1.ln_2",
    "position_offset": "transformer",
}
NAME_MAP: dict[str, Any] = {"regex": [[r"^model(?=[.#]|$)", "transformer"]]}
SEQ_LEN = 8


@dataclass(frozen=True)
class Sizes:
    vocab_size: int = 128
    n_positions: int = 64
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    layer_norm_epsilon: float = 1e-5


SIZES = Sizes()


@functools.cache
def reference(dtype: str, seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    """transformers' GPT-2 in ``dtype`` (eager attention, tied embeddings) and token ids."""
    from transformers import GPT2Config, GPT2LMHeadModel

    s = SIZES
    kwargs: dict[str, Any] = dict(
        vocab_size=s.vocab_size,
        n_positions=s.n_positions,
        n_embd=s.n_embd,
        n_layer=s.n_layer,
        n_head=s.n_head,
        layer_norm_epsilon=s.layer_norm_epsilon,
        activation_function="gelu_new",
        attn_implementation="eager",
        use_cache=False,
        bos_token_id=0,  # the defaults (50256) are outside the tiny vocabulary
        eos_token_id=0,
    )
    gen = generator(seed)
    model: Any = GPT2LMHeadModel(GPT2Config(**kwargs))
    init_o1(model, gen)
    model = model.to(TORCH_DTYPES[dtype]).eval()
    ids = torch.randint(0, s.vocab_size, (1, SEQ_LEN), generator=gen)
    return model, ids


def port_model() -> Any:
    from mlx_lm.models import gpt2

    s = SIZES
    return gpt2.Model(
        gpt2.ModelArgs(
            model_type="gpt2",
            n_ctx=s.n_positions,
            n_embd=s.n_embd,
            n_head=s.n_head,
            n_layer=s.n_layer,
            n_positions=s.n_positions,
            layer_norm_epsilon=s.layer_norm_epsilon,
            vocab_size=s.vocab_size,
        )
    )


def _block_without_ln_2(cls: type) -> type:
    class BlockWithoutLn2(cls):  # type: ignore[misc, valid-type]
        """The bug: the MLP gets the residual stream un-normalized."""

        def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
            h = x + self.attn(self.ln_1(x), mask, cache)
            return h + self.mlp(h)

    return BlockWithoutLn2


def _positions_from_one(cls: type) -> type:
    from mlx_lm.models.base import create_attention_mask

    class PositionsFromOne(cls):  # type: ignore[misc, valid-type]
        """The bug: position ids 1..L where GPT-2 counts 0..L-1."""

        def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
            h = self.wte(inputs) + self.wpe(mx.arange(1, inputs.shape[1] + 1))
            mask = create_attention_mask(h, None)
            for layer in self.h:
                h = layer(h, mask)
            return self.ln_f(h)

    return PositionsFromOne


def build(dtype: str = "float32", bug: str | None = None, *, seed: int = 0) -> ZooPort:
    """transformers GPT-2 vs mlx-lm GPT-2 in ``dtype``, ``bug`` planted in the port."""
    check_case("gpt2", dtype, bug, BUGS)
    ref, ids = reference(dtype, seed)
    port = port_model()
    # The output projection is tied to wte on both sides; mlx-lm's sanitize transposes
    # Conv1D weights and adds its ``model.`` prefix to transformers' bare names.
    weights = {
        k.removeprefix("transformer."): to_mlx(v)
        for k, v in ref.state_dict().items()
        if k != "lm_head.weight"
    }
    port.load_weights(list(port.sanitize(weights).items()))
    port.eval()
    block = port.model.h[1]
    if bug == "attn_scale":
        block.attn.scale = 1.0
    elif bug == "ln_eps":
        block.ln_2.eps = 1.0
    elif bug == "skipped_ln":
        swap_class(block, _block_without_ln_2)
    elif bug == "position_offset":
        swap_class(port.model, _positions_from_one)
    return ZooPort(
        arch="gpt2",
        dtype=dtype,
        bug=bug,
        ref=ref,
        port=port,
        ref_inputs=(ids,),
        port_inputs=(mx.array(ids.numpy()),),
        culprit=CULPRITS[bug] if bug else None,
        map=NAME_MAP,
    )
