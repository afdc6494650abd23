"""Tiny reference/port model pairs with identical weights, for testing parity tools.

Each builder returns a :class:`Pair`: a reference model, a port of it with the same
weights, the inputs for each, and optionally one deliberate bug in the port.  A parity
tool run on a pair with a bug should name ``Pair.bug_module``: the deepest module whose
output is wrong while its inputs are still right (its callers are wrong too, and so is
everything downstream, but they are not the culprit).

Everything is built from configs with seeded random weights (no downloads) and is kept
tiny, so a forward pass takes milliseconds.  Weights are drawn at O(1) scale (Linear
weights ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norm scales ~ 1 + N(0, 0.1)) so that
activations stay O(1) and the assert_close default tolerances mean what they say;
HF's default init (std 0.02) would shrink activations until every diff looks small.

Bugs are applied to the port instance only (a changed attribute, or one module's class
swapped for a small subclass), never to the library code the port comes from.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as mnn
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SEQ_LEN = 8


@dataclass
class Pair:
    """A reference model, its port with the same weights, and where the port's bug is.

    ``run_ref()`` / ``run_port()`` do one inference forward (eval mode, no grad) on
    ``inputs_ref`` / ``inputs_port`` (positional arguments) and return the main output
    (logits), the MLX one already evaluated.  ``bug_module`` is in the reference's
    naming; ``bug_module_port`` is the same module in the port's own naming.
    ``name_map`` holds regex rules ``{pattern: replacement}`` that, applied in order with
    ``re.sub``, turn port module paths (and capture entry names such as
    ``blocks.1.attention#0.out``) into reference paths; it is empty when the names match.
    ``port_channels_last`` says that the port's 4-D activations are NHWC where the
    reference's are NCHW.
    """

    ref: Any
    port: Any
    inputs_ref: tuple[Any, ...]
    inputs_port: tuple[Any, ...]
    run_ref: Callable[[], Any]
    run_port: Callable[[], Any]
    bug_module: str | None
    bug_module_port: str | None = None
    name_map: dict[str, str] = field(default_factory=dict)
    ref_framework: str = "torch"
    port_framework: str = "mlx"
    dtype: str = "float32"
    port_channels_last: bool = False


_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_MLX_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def _check_bug(bug: str | None, known: tuple[str, ...]) -> None:
    if bug is not None and bug not in known:
        raise ValueError(f"unknown bug {bug!r}; known: {', '.join(known)}")


def _seed(seed: int) -> torch.Generator:
    """Seed both frameworks; the generator drawn from makes the weights, whatever ran before."""
    torch.manual_seed(seed)
    mx.random.seed(seed)
    return torch.Generator().manual_seed(seed)


@torch.no_grad()
def _init_o1(model: nn.Module, gen: torch.Generator) -> None:
    """Redraw every parameter at O(1) scale (see the module docstring for why)."""
    for name, p in model.named_parameters():
        if p.ndim == 1 and "norm" in name:
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
        elif p.ndim == 1:  # biases
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        elif "embed" in name:
            p.copy_(torch.randn(p.shape, generator=gen))
        else:
            fan_in = math.prod(p.shape[1:])
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))


def _to_mx(t: torch.Tensor) -> mx.array:
    """A torch tensor as an MLX array of the same dtype (through float32: numpy has no bf16)."""
    dtype = {v: k for k, v in _TORCH_DTYPES.items()}[t.dtype]
    return mx.array(t.detach().float().numpy()).astype(_MLX_DTYPES[dtype])


def _torch_runner(model: nn.Module, inputs: tuple[Any, ...], pick: Callable[[Any], Any]):
    def run() -> Any:
        with torch.no_grad():
            return pick(model(*inputs))

    return run


def _mlx_runner(model: mnn.Module, inputs: tuple[Any, ...]) -> Callable[[], mx.array]:
    def run() -> mx.array:
        out = model(*inputs)
        mx.eval(out)
        return out

    return run


# --------------------------------------------------------------------------------------
# 1. Llama: transformers LlamaForCausalLM vs mlx-lm's llama.Model


LLAMA_SIZES: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
LLAMA_BUGS = ("mlp_activation", "norm_eps")


def _gelu_mlp_class() -> type:
    from mlx_lm.models import llama

    class GeluMLP(llama.MLP):
        """The bug: gelu where Llama's gated MLP uses silu (a common port slip)."""

        def __call__(self, x: mx.array) -> mx.array:
            return self.down_proj(mnn.gelu(self.gate_proj(x)) * self.up_proj(x))

    return GeluMLP


def llama_pair(bug: str | None = None, dtype: str = "float32", seed: int = 0) -> Pair:
    """HF ``LlamaForCausalLM`` (eager attention) vs mlx-lm ``llama.Model``, 3 tiny layers.

    Both share ``LLAMA_SIZES`` and HF's parameter names, so the port loads the reference's
    state_dict as is and every module path present in both is the same module.  Input:
    token ids, batch 1, ``SEQ_LEN`` tokens.  Bugs, in the port's layer 1 only:

    - ``"mlp_activation"``: its MLP uses gelu instead of silu -> ``model.layers.1.mlp``
      (its gate/up projections still agree; down_proj already sees a wrong input).
    - ``"norm_eps"``: its input_layernorm eps is 1e-1 -> ``model.layers.1.input_layernorm``.
    """
    from mlx_lm.models import llama
    from transformers import LlamaConfig, LlamaForCausalLM

    _check_bug(bug, LLAMA_BUGS)
    gen = _seed(seed)
    config = LlamaConfig(**LLAMA_SIZES, attn_implementation="eager", use_cache=False)
    ref = LlamaForCausalLM(config)
    _init_o1(ref, gen)
    ref = ref.to(_TORCH_DTYPES[dtype]).eval()

    port = llama.Model(llama.ModelArgs(model_type="llama", **LLAMA_SIZES))
    weights = {k: _to_mx(v) for k, v in ref.state_dict().items()}
    port.load_weights(list(port.sanitize(weights).items()))  # strict: every name must match
    port.eval()

    bug_module = None
    if bug == "mlp_activation":
        port.model.layers[1].mlp.__class__ = _gelu_mlp_class()
        bug_module = "model.layers.1.mlp"
    elif bug == "norm_eps":
        port.model.layers[1].input_layernorm.eps = 1e-1
        bug_module = "model.layers.1.input_layernorm"

    ids = torch.randint(0, LLAMA_SIZES["vocab_size"], (1, SEQ_LEN), generator=gen)
    inputs_ref = (ids,)
    inputs_port = (mx.array(ids.numpy()),)
    return Pair(
        ref=ref,
        port=port,
        inputs_ref=inputs_ref,
        inputs_port=inputs_port,
        run_ref=_torch_runner(ref, inputs_ref, lambda out: out.logits),
        run_port=_mlx_runner(port, inputs_port),
        bug_module=bug_module,
        bug_module_port=bug_module,
        dtype=dtype,
    )


# --------------------------------------------------------------------------------------
# 2. Two PyTorch transformer stacks: separate q/k/v vs fused qkv, different module names

TORCH_DIM, TORCH_HEADS, TORCH_LAYERS, TORCH_HIDDEN, TORCH_OUT = 32, 4, 2, 64, 16
TORCH_BUGS = ("softmax_scale",)

# Port path -> reference path, applied in order.  ``(?=[.#]|$)`` ends a name component,
# so the rules also rewrite capture entry names like ``blocks.1.ffn#0.out``.
TORCH_NAME_MAP: dict[str, str] = {
    r"^blocks\.": "layers.",
    r"\.ln_(\d)(?=[.#]|$)": r".norm\1",
    r"\.attention(?=[.#]|$)": ".attn",
    r"\.attn\.out(?=[.#]|$)": ".attn.o_proj",
    r"\.ffn(?=[.#]|$)": ".mlp",
    r"^ln_f(?=[.#]|$)": "norm",
}


class RefAttention(nn.Module):
    """Causal multi-head attention written out: separate projections, explicit softmax."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj, self.k_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.v_proj, self.o_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        q, k, v = (
            p(x).view(B, L, self.heads, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        causal = torch.ones(L, L, dtype=torch.bool).triu(1)
        weights = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(B, L, -1))


class RefMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class RefBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), RefAttention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), RefMLP(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class RefStack(nn.Module):
    """Reference: ``layers.N.{norm1,attn.{q,k,v,o}_proj,norm2,mlp.{fc1,act,fc2}}``, norm, head."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            RefBlock(TORCH_DIM, TORCH_HEADS, TORCH_HIDDEN) for _ in range(TORCH_LAYERS)
        )
        self.norm, self.head = nn.LayerNorm(TORCH_DIM), nn.Linear(TORCH_DIM, TORCH_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class PortAttention(nn.Module):
    """The port: one fused qkv projection and torch's scaled_dot_product_attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim**-0.5
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        qkv = self.qkv(x).view(B, L, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(*qkv, is_causal=True, scale=self.scale)
        return self.out(out.transpose(1, 2).reshape(B, L, -1))


class PortBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.ln_1, self.attention = nn.LayerNorm(dim), PortAttention(dim, heads)
        self.ln_2, self.ffn = nn.LayerNorm(dim), RefMLP(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.ln_1(x))
        return h + self.ffn(self.ln_2(h))


class PortStack(nn.Module):
    """Port: ``blocks.N.{ln_1,attention.{qkv,out},ln_2,ffn.{fc1,act,fc2}}``, ln_f, head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            PortBlock(TORCH_DIM, TORCH_HEADS, TORCH_HIDDEN) for _ in range(TORCH_LAYERS)
        )
        self.ln_f, self.head = nn.LayerNorm(TORCH_DIM), nn.Linear(TORCH_DIM, TORCH_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# The reverse direction, for parameter names only: how the port stores a reference weight.
_REF_TO_PORT_PARAM = (
    (r"^layers\.", "blocks."),
    (r"\.norm(\d)\.", r".ln_\1."),
    (r"\.attn\.o_proj\.", ".attention.out."),
    (r"\.mlp\.", ".ffn."),
    (r"^norm\.", "ln_f."),
)


@torch.no_grad()
def _port_state_dict(ref: RefStack) -> dict[str, torch.Tensor]:
    """The reference's weights under the port's names, q/k/v concatenated into qkv."""
    state = {}
    for name, value in ref.state_dict().items():
        if re.search(r"\.attn\.[qkv]_proj\.", name):
            continue
        for pattern, replacement in _REF_TO_PORT_PARAM:
            name = re.sub(pattern, replacement, name)
        state[name] = value
    for i, layer in enumerate(ref.layers):
        projections = (layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj)
        for kind in ("weight", "bias"):
            fused = torch.cat([getattr(p, kind) for p in projections])
            state[f"blocks.{i}.attention.qkv.{kind}"] = fused
    return state


def torch_pair(bug: str | None = None, seed: int = 0) -> Pair:
    """Two PyTorch pre-norm transformer stacks (2 layers, dim 32, 4 heads), float32.

    The reference computes attention by hand with separate q/k/v projections; the port
    fuses them into one ``qkv`` Linear, calls ``F.scaled_dot_product_attention``, and
    names modules differently (``TORCH_NAME_MAP`` rewrites its names to the reference's;
    ``attention.qkv`` has no counterpart).  Input: hidden states (1, ``SEQ_LEN``, 32).
    Bug ``"softmax_scale"``: the port's layer-1 attention scales scores by 1/head_dim
    instead of 1/sqrt(head_dim) -> ``layers.1.attn`` (port: ``blocks.1.attention``).
    """
    _check_bug(bug, TORCH_BUGS)
    gen = _seed(seed)
    ref = RefStack()
    _init_o1(ref, gen)
    ref.eval()
    port = PortStack()
    port.load_state_dict(_port_state_dict(ref))  # strict: every port weight is set
    port.eval()

    bug_module = bug_module_port = None
    if bug == "softmax_scale":
        port.blocks[1].attention.scale = 1.0 / port.blocks[1].attention.head_dim
        bug_module, bug_module_port = "layers.1.attn", "blocks.1.attention"

    x = torch.randn(1, SEQ_LEN, TORCH_DIM, generator=gen)
    inputs_ref, inputs_port = (x,), (x.clone(),)
    return Pair(
        ref=ref,
        port=port,
        inputs_ref=inputs_ref,
        inputs_port=inputs_port,
        run_ref=_torch_runner(ref, inputs_ref, lambda out: out),
        run_port=_torch_runner(port, inputs_port, lambda out: out),
        bug_module=bug_module,
        bug_module_port=bug_module_port,
        name_map=dict(TORCH_NAME_MAP),
        port_framework="torch",
    )


# --------------------------------------------------------------------------------------
# 3. A small conv net: torch (NCHW) vs mlx.nn (NHWC)

CONV_BUGS = ("activation",)
CONV_CHANNELS = (3, 8, 16, 16)  # input, stem, block 0, block 1
CONV_CLASSES, CONV_SIZE = 10, 16


class TorchConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv, self.act = nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))


class TorchPool(nn.Module):
    """Global mean over H and W: (B, C, H, W) -> (B, C)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


class TorchConvNet(nn.Module):
    """``stem`` conv, ``blocks.N.{conv,act}`` (stride 2), ``pool``, ``head``."""

    def __init__(self) -> None:
        super().__init__()
        c0, c1, c2, c3 = CONV_CHANNELS
        self.stem = nn.Conv2d(c0, c1, 3, padding=1)
        self.blocks = nn.ModuleList([TorchConvBlock(c1, c2), TorchConvBlock(c2, c3)])
        self.pool, self.head = TorchPool(), nn.Linear(c3, CONV_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.pool(x))


class MLXConvBlock(mnn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv, self.act = mnn.Conv2d(cin, cout, 3, stride=2, padding=1), mnn.ReLU()

    def __call__(self, x: mx.array) -> mx.array:
        return self.act(self.conv(x))


class MLXPool(mnn.Module):
    """Global mean over H and W: (B, H, W, C) -> (B, C)."""

    def __call__(self, x: mx.array) -> mx.array:
        return x.mean(axis=(1, 2))


class MLXConvNet(mnn.Module):
    """The same net in mlx.nn, channels last, with the same module names."""

    def __init__(self) -> None:
        super().__init__()
        c0, c1, c2, c3 = CONV_CHANNELS
        self.stem = mnn.Conv2d(c0, c1, 3, padding=1)
        self.blocks = [MLXConvBlock(c1, c2), MLXConvBlock(c2, c3)]
        self.pool, self.head = MLXPool(), mnn.Linear(c3, CONV_CLASSES)

    def __call__(self, x: mx.array) -> mx.array:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.pool(x))


def conv_pair(bug: str | None = None, seed: int = 0) -> Pair:
    """Torch conv net (NCHW) vs its mlx.nn port (NHWC), float32, 16x16 RGB input.

    Module names are the same on both sides: ``stem``, ``blocks.{0,1}``,
    ``blocks.{0,1}.conv``, ``blocks.{0,1}.act``, ``pool``, ``head``.  Conv weights move
    from torch's (out, in, kH, kW) to MLX's (out, kH, kW, in); the input is the same data
    transposed to NHWC, and so are the port's 4-D activations (``port_channels_last``).
    Bug ``"activation"``: the port's ``blocks.1.act`` is GELU instead of ReLU ->
    ``blocks.1.act``.
    """
    _check_bug(bug, CONV_BUGS)
    gen = _seed(seed)
    ref = TorchConvNet()
    _init_o1(ref, gen)
    ref.eval()
    port = MLXConvNet()
    weights = {
        k: _to_mx(v.permute(0, 2, 3, 1) if v.ndim == 4 else v) for k, v in ref.state_dict().items()
    }
    port.load_weights(list(weights.items()))
    port.eval()

    bug_module = None
    if bug == "activation":
        port.blocks[1].act = mnn.GELU()
        bug_module = "blocks.1.act"

    x = torch.randn(1, CONV_CHANNELS[0], CONV_SIZE, CONV_SIZE, generator=gen)
    inputs_ref = (x,)
    inputs_port = (_to_mx(x.permute(0, 2, 3, 1)),)
    return Pair(
        ref=ref,
        port=port,
        inputs_ref=inputs_ref,
        inputs_port=inputs_port,
        run_ref=_torch_runner(ref, inputs_ref, lambda out: out),
        run_port=_mlx_runner(port, inputs_port),
        bug_module=bug_module,
        bug_module_port=bug_module,
        port_channels_last=True,
    )


# --------------------------------------------------------------------------------------
# 4. A bfloat16 MLP: torch vs mlx.nn

MLP_BUGS = ("bias",)
MLP_SIZES = (32, 64, 64, 16)  # in, fc1 out, fc2 out, fc3 out


class TorchMLP(nn.Module):
    """``fc1``, ``act1``, ``fc2``, ``act2``, ``fc3``; ReLU, which is exact in bf16."""

    def __init__(self) -> None:
        super().__init__()
        d0, d1, d2, d3 = MLP_SIZES
        self.fc1, self.act1 = nn.Linear(d0, d1), nn.ReLU()
        self.fc2, self.act2 = nn.Linear(d1, d2), nn.ReLU()
        self.fc3 = nn.Linear(d2, d3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.act2(self.fc2(self.act1(self.fc1(x)))))


class MLXMLP(mnn.Module):
    """The same MLP in mlx.nn, same module names."""

    def __init__(self) -> None:
        super().__init__()
        d0, d1, d2, d3 = MLP_SIZES
        self.fc1, self.act1 = mnn.Linear(d0, d1), mnn.ReLU()
        self.fc2, self.act2 = mnn.Linear(d1, d2), mnn.ReLU()
        self.fc3 = mnn.Linear(d2, d3)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc3(self.act2(self.fc2(self.act1(self.fc1(x)))))


def mlp_bf16_pair(bug: str | None = None, seed: int = 0) -> Pair:
    """Torch MLP vs mlx.nn MLP, both bfloat16 with the same bf16 weights; input (8, 32).

    The activations are ReLU on purpose: both frameworks compute a bf16 Linear as one
    float32 accumulation rounded once, so fc outputs match bit for bit, and ReLU is exact,
    so the clean pair passes bf16 assert_close defaults at every module.  (GELU would not:
    MLX evaluates it op by op in bf16 and lands up to a few bf16 ulps from torch, more
    than rtol 1.6e-2 allows in the negative tail.)  Bug ``"bias"``: the port's fc2 bias is
    off by +0.5 -> ``fc2``.
    """
    _check_bug(bug, MLP_BUGS)
    gen = _seed(seed)
    ref = TorchMLP()
    _init_o1(ref, gen)
    ref = ref.to(torch.bfloat16).eval()
    port = MLXMLP()
    port.load_weights([(k, _to_mx(v)) for k, v in ref.state_dict().items()])
    port.eval()

    bug_module = None
    if bug == "bias":
        port.fc2.bias = port.fc2.bias + 0.5
        bug_module = "fc2"

    x = torch.randn(8, MLP_SIZES[0], generator=gen).to(torch.bfloat16)
    inputs_ref, inputs_port = (x,), (_to_mx(x),)
    return Pair(
        ref=ref,
        port=port,
        inputs_ref=inputs_ref,
        inputs_port=inputs_port,
        run_ref=_torch_runner(ref, inputs_ref, lambda out: out),
        run_port=_mlx_runner(port, inputs_port),
        bug_module=bug_module,
        bug_module_port=bug_module,
        dtype="bfloat16",
    )


PAIRS: dict[str, Callable[..., Pair]] = {
    "llama": llama_pair,
    "torch": torch_pair,
    "conv": conv_pair,
    "mlp_bf16": mlp_bf16_pair,
}
BUGS: dict[str, tuple[str, ...]] = {
    "llama": LLAMA_BUGS,
    "torch": TORCH_BUGS,
    "conv": CONV_BUGS,
    "mlp_bf16": MLP_BUGS,
}


def as_numpy(x: Any) -> np.ndarray:
    """A torch tensor or MLX array as a float32 numpy array (bf16 widened exactly)."""
    if isinstance(x, torch.Tensor):
        return x.detach().float().numpy()
    return np.array(x.astype(mx.float32))
