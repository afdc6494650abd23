"""Weight audit: a torch reference against an MLX port loaded with three classic mistakes.

The port (a conv, a group norm and a linear head, as in a vision model) loads the
reference's state dict with a hand-written loader that (1) transposes the conv kernel to
OWHI instead of MLX's OHWI (kernel height and width swapped: same shape, wrong values),
(2) never loads the norm's weight nor the conv's bias (left at their initial values), and
(3) names the head ``head`` where the reference says ``fc`` (loaded correctly, under
another name).  A clean loader is audited too: it must pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
mnn = pytest.importorskip("mlx.nn")

from mldbg.weights.audit import audit_weights  # noqa: E402
from mldbg.weights.render import render_audit  # noqa: E402


class Reference(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 8)
        self.fc = torch.nn.Linear(8, 10)


class Port(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = mnn.Conv2d(4, 8, 3, padding=1)
        self.norm = mnn.GroupNorm(2, 8, pytorch_compatible=True)
        self.head = mnn.Linear(8, 10)


def reference() -> Reference:
    torch.manual_seed(0)
    model = Reference()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()  # no parameter left constant: norms included
    return model


def load(port: Port, state: dict[str, Any], *, buggy: bool) -> Port:
    w = {k: v.detach().numpy() for k, v in state.items()}
    conv = (0, 3, 2, 1) if buggy else (0, 2, 3, 1)  # OIHW -> OWHI (wrong) / OHWI (right)
    weights = [
        ("conv.weight", mx.array(w["conv.weight"].transpose(conv))),
        ("norm.bias", mx.array(w["norm.bias"])),
        ("head.weight", mx.array(w["fc.weight"])),
        ("head.bias", mx.array(w["fc.bias"])),
    ]
    if not buggy:
        weights += [
            ("conv.bias", mx.array(w["conv.bias"])),
            ("norm.weight", mx.array(w["norm.weight"])),
        ]
    port.load_weights(weights, strict=False)
    mx.eval(port.parameters())
    return port


def fresh_port() -> Port:
    mx.random.seed(3)
    port = Port()
    mx.eval(port.parameters())
    return port


def test_audit_finds_never_loaded_transposed_kernel_and_renamed_key() -> None:
    ref = reference()
    port = load(fresh_port(), ref.state_dict(), buggy=True)
    result = audit_weights(ref, port, fresh=fresh_port())
    by_name = {row["name"] or row["name_port"]: row for row in result["parameters"]}
    assert not result["ok"]
    assert by_name["conv.weight"]["status"] == "layout"
    assert by_name["conv.weight"]["layout"] == "OIHW→OWHI"
    assert by_name["norm.weight"]["status"] == "never_loaded"
    assert by_name["conv.bias"]["status"] == "never_loaded"
    assert "fresh initialization" in by_name["conv.bias"]["note"]
    assert by_name["fc.weight"]["status"] == by_name["fc.bias"]["status"] == "renamed"
    assert by_name["fc.weight"]["name_port"] == "head.weight"
    assert result["proposed_map"] == {
        "rename": {"head.weight": "fc.weight", "head.bias": "fc.bias"}
    }
    assert by_name["norm.bias"]["status"] == "ok"
    # Failures come first in the report.
    assert [r["status"] for r in result["problems"]][:3] == [
        "never_loaded",
        "never_loaded",
        "layout",
    ]
    text = render_audit(result)
    assert "conv.weight" in text and "OIHW→OWHI" in text


def test_without_fresh_a_constant_init_is_still_never_loaded() -> None:
    ref = reference()
    port = load(fresh_port(), ref.state_dict(), buggy=True)
    result = audit_weights(
        ref, port, map={"rename": {"head.weight": "fc.weight", "head.bias": "fc.bias"}}
    )
    by_name = {row["name"]: row for row in result["parameters"]}
    assert by_name["norm.weight"]["status"] == "never_loaded"  # MLX starts it at ones
    assert "constant" in by_name["norm.weight"]["note"]
    assert by_name["fc.weight"]["status"] == "ok"  # the map pairs it


def test_clean_loader_passes_with_the_mlx_conv_layout(tmp_path: Path) -> None:
    ref = reference()
    port = load(fresh_port(), ref.state_dict(), buggy=False)
    result = audit_weights(
        ref, port, map={"rename": {"head.weight": "fc.weight", "head.bias": "fc.bias"}}
    )
    assert result["ok"], result["problems"]
    conv = next(r for r in result["parameters"] if r["name"] == "conv.weight")
    assert conv["status"] == "ok" and conv["layout"] == "OIHW→OHWI"
    # A dtype change is reported, not failed.
    port.norm.bias = port.norm.bias.astype(mx.bfloat16)
    result = audit_weights(
        ref, port, map={"rename": {"head.weight": "fc.weight", "head.bias": "fc.bias"}}
    )
    assert result["ok"]
    assert result["counts"]["dtype"] == 1


def test_cli_audits_files(cli: Any, tmp_path: Path) -> None:
    from mlx.utils import tree_flatten
    from safetensors.torch import save_file

    ref = reference()
    save_file(
        {k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "ref.safetensors")
    )
    port = load(fresh_port(), ref.state_dict(), buggy=True)
    mx.save_safetensors(str(tmp_path / "port.safetensors"), dict(tree_flatten(port.parameters())))
    # exit codes as compare's: 0 all loaded right, 1 problems found, 2 bad input
    answer = cli("weights", "ref.safetensors", "port.safetensors", json_out=True, expect=1)
    assert answer["ok"] is False
    statuses = {row["name"] or row["name_port"]: row["status"] for row in answer["problems"]}
    assert statuses["conv.weight"] == "layout"
    assert statuses["norm.weight"] == "never_loaded"
    assert statuses["fc.weight"] == "renamed"
    text = cli("weights", "ref.safetensors", "port.safetensors", expect=1).stdout
    assert "never_loaded" in text and "PROBLEMS" in text
    bad = cli("weights", "nowhere.safetensors", "port.safetensors", expect=2, json_out=True)
    assert bad["code"] == "unknown_source"
    assert cli("weights", "ref.safetensors", "ref.safetensors", json_out=True)["ok"] is True
    np.testing.assert_array_equal(np.array(port.norm.weight), np.ones(8))
    json.dumps(answer)


def test_checkpoint_directories_and_one_tensor_files_keep_their_keys(tmp_path: Path) -> None:
    """A model saved as shards (``model-00001-of-00002.safetensors``…, as transformers and
    mlx-lm save large models) is one set of parameters named by their keys, not by
    ``<file stem>.<key>`` (as compare names a directory of tensors); a file holding one
    parameter names it by its key too.  Before, every parameter was ``renamed`` or
    ``missing``."""
    from mlx.utils import tree_flatten
    from safetensors.torch import save_file

    ref = reference()
    state = {k: v.contiguous() for k, v in ref.state_dict().items()}
    names = sorted(state)
    (tmp_path / "ref").mkdir()
    save_file(
        {k: state[k] for k in names[:3]}, str(tmp_path / "ref/model-00001-of-00002.safetensors")
    )
    save_file(
        {k: state[k] for k in names[3:]}, str(tmp_path / "ref/model-00002-of-00002.safetensors")
    )
    port = load(fresh_port(), ref.state_dict(), buggy=False)
    (tmp_path / "port").mkdir()
    mx.save_safetensors(
        str(tmp_path / "port/model.safetensors"), dict(tree_flatten(port.parameters()))
    )
    rename = {"rename": {"head.weight": "fc.weight", "head.bias": "fc.bias"}}
    result = audit_weights(tmp_path / "ref", tmp_path / "port", map=rename)
    assert result["ok"], render_audit(result)
    assert result["counts"] == {"ok": len(names)}
    save_file({"conv.weight": state["conv.weight"]}, str(tmp_path / "conv_only.safetensors"))
    one = audit_weights(tmp_path / "conv_only.safetensors", tmp_path / "port", map=rename)
    assert {r["name"] for r in one["parameters"] if r["name"]} == {"conv.weight"}
    assert next(r for r in one["parameters"] if r["name"] == "conv.weight")["status"] == "ok"
    # Two shards holding the same parameter: said, not silently one of them.
    save_file({"conv.weight": state["conv.weight"]}, str(tmp_path / "ref/extra.safetensors"))
    with pytest.raises(Exception, match="conv.weight"):
        audit_weights(tmp_path / "ref", tmp_path / "port")


class Decoder(torch.nn.Module):
    """A decoder's upsampling as diffusers writes it (``Upsample2D`` with a transposed
    convolution: torch's kernel is ``(in, out, kh, kw)``), a 1-D one, a batch norm (its
    running statistics and ``num_batches_tracked`` are buffers) and a persistent
    ``position_ids`` buffer, as BERT/CLIP embeddings keep one."""

    def __init__(self) -> None:
        from diffusers.models.upsampling import Upsample1D, Upsample2D

        super().__init__()
        self.up = Upsample2D(6, use_conv_transpose=True)  # as many channels in as out
        self.up1d = Upsample1D(6, use_conv_transpose=True, out_channels=5)
        self.norm = torch.nn.BatchNorm2d(6)
        self.register_buffer("position_ids", torch.arange(8).unsqueeze(0))

    def forward(self, x: Any) -> Any:
        return self.up1d(self.norm(self.up(x)).flatten(2))


class DecoderPort(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = {"conv": mnn.ConvTranspose2d(6, 6, 4, stride=2, padding=1)}
        self.up1d = {"conv": mnn.ConvTranspose1d(6, 5, 4, stride=2, padding=1)}
        self.norm = mnn.BatchNorm(6)


def decoder_pair(rule: tuple[int, ...]) -> tuple[Decoder, DecoderPort]:
    torch.manual_seed(0)
    ref = Decoder()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_()
        ref.norm.running_mean.normal_()
        ref.norm.running_var.uniform_(0.5, 2.0)
    w = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    port = DecoderPort()
    port.load_weights(
        [
            ("up.conv.weight", mx.array(w["up.conv.weight"].transpose(rule))),
            ("up.conv.bias", mx.array(w["up.conv.bias"])),
            ("up1d.conv.weight", mx.array(w["up1d.conv.weight"].transpose(1, 2, 0))),
            ("up1d.conv.bias", mx.array(w["up1d.conv.bias"])),
            *[(f"norm.{k}", mx.array(w[f"norm.{k}"])) for k in ("weight", "bias")],
            *[(f"norm.{k}", mx.array(w[f"norm.{k}"])) for k in ("running_mean", "running_var")],
        ]
    )
    mx.eval(port.parameters())
    return ref, port


def test_transposed_convolutions_and_buffers_of_a_clean_decoder_port_pass() -> None:
    """torch's ConvTranspose kernels are ``(in, out, k…)``, MLX's ``(out, k…, in)``: the
    right conversion is ``IOHW→OHWI``, named in the transposed convolution's own letters.
    Buffers the port has no use for (``num_batches_tracked``, ``position_ids``) are
    reported, not failed.  Before: ``up.conv.weight`` was a ``layout`` failure
    (``OIHW→IHWO``) and each buffer ``missing``."""
    ref, port = decoder_pair((1, 2, 3, 0))
    result = audit_weights(ref, port)
    assert result["ok"], render_audit(result)
    found = {row["name"]: row for row in result["parameters"]}
    assert found["up.conv.weight"]["layout"] == "IOHW→OHWI"
    assert found["up1d.conv.weight"]["layout"] == "IOL→OLI"
    for name in ("norm.num_batches_tracked", "position_ids"):
        assert found[name]["status"] == "buffer", found[name]
    assert found["norm.running_mean"]["status"] == "ok"


def test_a_transposed_convolution_converted_by_the_conv_rule_is_named() -> None:
    """The classic slip: the ConvTranspose kernel moved as a Conv kernel
    (``(0, 2, 3, 1)``), which with as many input as output channels keeps the shape."""
    ref, port = decoder_pair((0, 2, 3, 1))
    result = audit_weights(ref, port)
    found = {row["name"]: row for row in result["parameters"]}
    assert not result["ok"]
    row = found["up.conv.weight"]
    assert row["status"] == "layout" and row["layout"] == "IOHW→IHWO", row
    assert "transposed convolution" in row["note"]


def test_a_missing_constant_parameter_is_not_taken_for_a_tie() -> None:
    """Two norms both at 1 share their values; the port missing one is ``missing``."""
    ref = reference()
    with torch.no_grad():
        ref.norm.weight.fill_(1.0)
    state = {k: v for k, v in ref.state_dict().items() if k != "norm.weight"}
    state["other.weight"] = torch.ones(8)
    result = audit_weights({**state, "norm.weight": ref.norm.weight}, state)
    assert {r["name"]: r["status"] for r in result["parameters"]}["norm.weight"] == "missing"


def test_a_captures_classes_name_its_transposed_convolutions(home: Path) -> None:
    """Saved by ``--capture-weights`` (``save_weights``), the reference is a file: the
    classes its capture recorded say which kernels are ConvTranspose ones."""
    import mldbg

    ref, port = decoder_pair((1, 2, 3, 0))
    with torch.no_grad(), mldbg.capture(ref.eval(), "ref") as cap:
        cap.save_weights()
        ref(torch.randn(1, 6, 4, 4))
    result = audit_weights("ref", port, home=home)
    assert result["ok"], render_audit(result)
    found = {row["name"]: row for row in result["parameters"]}
    assert found["up.conv.weight"]["layout"] == "IOHW→OHWI"


def test_a_one_by_one_convolution_kept_as_a_linear_weight_is_its_layout() -> None:
    """A 1×1 convolution's kernel ``(O, I, 1, 1)`` is a linear weight ``(O, I)`` (old VAE
    checkpoints' attention projections, a port's ``proj_in`` as Linear on channels-last
    activations), and the other way round a Linear as MLX's 1×1 conv ``(O, 1, 1, I)``:
    the same values with unit axes dropped or added.  Before, a ``shape`` failure; a
    transposed one is still a ``layout`` failure."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 6, 1).weight.detach()
    linear = torch.nn.Linear(4, 6).weight.detach()
    result = audit_weights(
        {"proj_in.weight": conv, "proj_out.weight": linear, "to_q.weight": conv},
        {
            "proj_in.weight": mx.array(conv[:, :, 0, 0].numpy()),
            "proj_out.weight": mx.array(linear.numpy()[:, None, None, :]),
            "to_q.weight": mx.array(conv[:, :, 0, 0].numpy().T),
        },
    )
    found = {row["name"]: row for row in result["parameters"]}
    assert found["proj_in.weight"]["status"] == "ok"
    assert found["proj_in.weight"]["layout"] == "OIHW→OI"
    assert found["proj_out.weight"]["status"] == "ok"
    assert found["proj_out.weight"]["layout"] == "OI→O11I"
    assert found["to_q.weight"]["status"] == "layout"
    assert found["to_q.weight"]["layout"] == "OIHW→IO"


def test_a_float16_conversion_is_judged_with_its_subnormal_rounding() -> None:
    """Weights of std 0.02 hold elements below float16's smallest normal (6e-5): their
    conversion rounds to the subnormal grid, an absolute error up to 2⁻²⁵ that no
    relative bound covers.  Before, every such clean conversion was a ``values`` failure;
    an element that overflows to inf still fails, as ``nonfinite`` (an Inf where the
    reference holds a number)."""
    torch.manual_seed(0)
    weight = torch.randn(256, 256) * 0.02
    for reference in (weight, weight.to(torch.bfloat16)):
        port = mx.array(reference.float().numpy()).astype(mx.float16)
        result = audit_weights({"w": reference}, {"w": port})
        assert result["parameters"][0]["status"] == "dtype", result["parameters"][0]
    overflow = weight.clone()
    overflow[0, 0] = 1e5
    result = audit_weights({"w": overflow}, {"w": mx.array(overflow.numpy()).astype(mx.float16)})
    assert result["parameters"][0]["status"] == "nonfinite"
    assert result["parameters"][0]["nonfinite"]["first"] == [0, 0]


def test_a_scaled_weight_with_zeros_is_not_called_a_partial_load() -> None:
    """Elements that agree by chance (zeros stay zeros when scaled) are no evidence of a
    partial load: the note stays the plain one."""
    torch.manual_seed(0)
    weight = torch.randn(64, 64)
    weight[:, :4] = 0.0
    result = audit_weights({"w": weight}, {"w": mx.array(weight.numpy() * 1.5)})
    row = result["parameters"][0]
    assert row["status"] == "values" and "in part" not in row["note"], row
