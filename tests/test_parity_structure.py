"""Structure is not a bug (issue 33, item 2): the same computation, placed differently.

Each case is a clean port that failed, and a planted bug that must still be named:

* a DiT whose ``adaLN_modulation`` is ``Sequential(SiLU, Linear)`` in PyTorch (DiT's
  blocks, diffusers' PRX ``FinalLayer``) and a bare ``Linear`` fed ``silu(c)`` in MLX:
  the block was named for what its modulation's input "computed inline";
* diffusers' VAE attention normalizing ``(B, C, H*W)`` against an MLX port normalizing
  its channels-last ``(B, H, W, C)`` (as mlx-examples does): "shapes differ" at
  ``group_norm#0.in.0``;
* diffusers' Flux against an MLX port that leaves out the feed-forward's ``Dropout``
  (``net = [GELU, Linear]``): its ``net.1`` met the reference's dropout.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
mnn = pytest.importorskip("mlx.nn")
pytest.importorskip("diffusers")

import mldbg  # noqa: E402
from mldbg.compare.pair.transposes import Merged, merged_layout  # noqa: E402
from mldbg.store import current_run  # noqa: E402
from parity_zoo import adaln_dit, flux, vae  # noqa: E402
from parity_zoo.core import ZooPort, to_mlx  # noqa: E402

pytestmark = pytest.mark.usefixtures("home")  # a private run store (conftest)


def compared(
    ref: Any, port: Any, ref_inputs: tuple[Any, ...], port_inputs: tuple[Any, ...], **options: Any
) -> dict[str, Any]:
    with torch.no_grad(), mldbg.capture(ref, "ref"):
        ref(*ref_inputs)
    current_run.reset()
    with mldbg.capture(port, "port", sensitivity=False):
        mx.eval(port(*port_inputs))
    current_run.reset()
    return mldbg.compare("ref", "port", **options).result


def brief(result: dict[str, Any]) -> str:
    failing = [e["name"] for e in result["entries"] if not e["ok"]][:5]
    return json.dumps({"culprit": result["first_divergence"], "failing": failing})[:800]


def test_a_sequential_activation_against_an_inline_one_is_a_boundary_note() -> None:
    ref, port, (x, c) = adaln_dit.build()
    result = compared(ref, port, (x, c), (to_mlx(x), to_mlx(c)))
    assert result["ok"] and result["first_divergence"] is None, brief(result)
    notes = {b["module"]: b for b in result["boundary_differences"]}
    assert set(notes) == {
        "blocks.0.adaLN_modulation",
        "blocks.1.adaLN_modulation",
        "final_layer.adaLN_modulation",  # diffusers' FinalLayer
    }
    note = notes["blocks.0.adaLN_modulation"]["note"]
    assert "blocks.0.adaLN_modulation.0 (SiLU) before calling this module" in note
    assert "blocks.0.adaLN_modulation.1#0.in.0" in note
    # The map that pairs the port's Linear with the reference's child directly.
    proposal = result["proposed_map"]
    assert proposal == {
        "rename": {
            "blocks.0.adaLN_modulation": "blocks.0.adaLN_modulation.1",
            "blocks.1.adaLN_modulation": "blocks.1.adaLN_modulation.1",
            "final_layer.adaLN_modulation": "final_layer.adaLN_modulation.1",
        }
    }
    mapped = mldbg.compare("ref", "port", map=proposal).result
    assert mapped["ok"] and mapped["boundary_differences"] == [], brief(mapped)


def test_a_port_that_forgot_the_activation_is_still_named() -> None:
    ref, port, (x, c) = adaln_dit.build("skipped_silu")
    result = compared(ref, port, (x, c), (to_mlx(x), to_mlx(c)))
    culprit = result["first_divergence"]
    assert not result["ok"] and culprit is not None, brief(result)
    assert culprit["module"] == adaln_dit.CULPRITS["skipped_silu"], brief(result)
    assert culprit["reason"] == "inputs agree, outputs differ"
    assert "blocks.0.adaLN_modulation.0" in culprit["unpaired_children"]
    assert "blocks.0.adaLN_modulation" not in {b["module"] for b in result["boundary_differences"]}


class InlineReference(torch.nn.Module):
    """The reference computes the activation before its ``mod`` Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.mod = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return self.out(self.mod(torch.nn.functional.silu(c)))


class SequentialPort(mnn.Module):
    """The port's ``mod`` is ``Sequential(SiLU, Linear)``, called on ``c`` itself."""

    def __init__(self) -> None:
        super().__init__()
        self.mod = mnn.Sequential(mnn.SiLU(), mnn.Linear(8, 16))
        self.out = mnn.Linear(16, 4)

    def __call__(self, c: mx.array) -> mx.array:
        return self.out(self.mod(c))


def test_a_step_the_port_moved_inside_the_module_is_a_boundary_note() -> None:
    torch.manual_seed(0)
    ref = InlineReference().eval()
    port = SequentialPort()
    port.load_weights(
        [(k.replace("mod.", "mod.layers.1."), to_mlx(v)) for k, v in ref.state_dict().items()]
    )
    c = torch.randn(3, 8)
    result = compared(ref, port, (c,), (to_mlx(c),))
    assert result["ok"], brief(result)
    (note,) = result["boundary_differences"]
    assert note["module"] == "mod" and "inside this module" in note["note"]


class ChannelsLastAttention(vae.SelfAttention):
    """mlx-examples' VAE attention: the group norm on the channels-last (B, H, W, C)."""

    def __call__(self, x: mx.array) -> mx.array:
        B, H, W, C = x.shape
        h = self.group_norm(x).reshape(B, H * W, C)
        q, k, v = (p(h)[:, None] for p in (self.to_q, self.to_k, self.to_v))
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return x + self.to_out[0](out[:, 0]).reshape(B, H, W, C)


@pytest.mark.parametrize("bug", [None, "attn_scale"])
def test_a_channels_last_group_norm_against_a_flattened_one(bug: str | None) -> None:
    zoo = vae.build("float32", bug)
    zoo.port.mid_block.attentions[0].__class__ = ChannelsLastAttention
    result = compared(zoo.ref, zoo.port, zoo.ref_inputs, zoo.port_inputs)
    norm = next(
        e for e in result["entries"] if e["name"] == "mid_block.attentions.0.group_norm#0.in.0"
    )
    assert norm["shape_a"] != norm["shape_b"] and norm["reshape"] == "axes merged"
    assert norm["layout"] == "NHWC→NCHW, axes merged" and norm["ok"], norm
    if bug is None:
        assert result["ok"], brief(result)
    else:
        culprit = result["first_divergence"]
        assert culprit is not None and culprit["module"] == zoo.culprit, brief(result)


def flux_without_dropouts(bug: str | None) -> ZooPort:
    """The zoo's Flux port with each feed-forward's dropout left out (``net = [GELU,
    Linear]``), as a port that drops identities at inference writes it."""
    zoo = flux.build("float32", bug)

    class TwoLayers(type(zoo.port.transformer_blocks[0].ff)):  # type: ignore[misc]
        def __call__(self, x: mx.array) -> mx.array:
            return self.net[1](self.net[0](x))

    for block in zoo.port.transformer_blocks:
        for ff in (block.ff, block.ff_context):
            ff.net = [ff.net[0], ff.net[2]]
            ff.__class__ = TwoLayers
    return zoo


@pytest.mark.parametrize("bug", [None, "modulation"])
def test_a_dropout_one_tree_lacks_shifts_its_siblings_names(bug: str | None) -> None:
    zoo = flux_without_dropouts(bug)
    result = compared(zoo.ref, zoo.port, zoo.ref_inputs, zoo.port_inputs)
    renamed = result["structure"]["renamed"]
    assert renamed["transformer_blocks.0.ff.net.1"] == "transformer_blocks.0.ff.net.2"
    assert (
        renamed["transformer_blocks.1.ff_context.net.1"] == "transformer_blocks.1.ff_context.net.2"
    )
    if bug is None:
        assert result["ok"], brief(result)
    else:
        culprit = result["first_divergence"]
        assert culprit is not None and culprit["module"] == zoo.culprit, brief(result)


def test_merged_layouts_split_the_merged_side() -> None:
    nchw_flat, nhwc = (1, 64, 256), (1, 16, 16, 64)
    assert merged_layout(nchw_flat, nhwc, channels_last_b=True) == Merged(
        (1, 64, 16, 16), nhwc, (0, 3, 1, 2)
    )
    tokens = (1, 256, 64)  # (B, H*W, C) against (B, H, W, C): the same order
    assert merged_layout(tokens, nhwc, channels_last_b=True) == Merged(nhwc, nhwc, None)
    assert merged_layout(nhwc, nchw_flat, channels_last_b=False) == Merged(
        nhwc, (1, 64, 16, 16), (0, 2, 3, 1)
    )
    # ambiguous (C == H*W): B's layout decides
    assert merged_layout((1, 16, 16), (1, 4, 4, 16), channels_last_b=False).permutation is None
    assert merged_layout((1, 16, 16), (1, 4, 4, 16), channels_last_b=True).permutation == (
        0,
        3,
        1,
        2,
    )
    assert merged_layout((6, 4), (4, 6, 1), channels_last_b=False) is None  # no split fits
    assert merged_layout((2, 3, 4), (2, 3, 4), channels_last_b=False) is None  # equal shapes
