"""Weight audit of quantized MLX ports: a float transformers reference against mlx-lm's own
model, loaded from it and quantized by ``mlx.nn.quantize`` / mlx-lm's ``quantize_model``.

A quantized Linear or Embedding stores packed ``uint32`` codes, ``scales`` and (affine)
``biases``.  Before the audit knew them, a clean 4-bit Llama port was reported as 16
``shape`` problems and 32 ``extra`` parameters.  Now each weight is decoded and judged
against what its quantization may change element by element (the bound from its own
scales), and a real loading bug in a quantized port is still named: a weight transposed
before quantizing, one never loaded, one loaded with the wrong values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
mnn = pytest.importorskip("mlx.nn")
pytest.importorskip("mlx_lm")
pytest.importorskip("transformers")


from mlx.utils import tree_flatten  # noqa: E402

from mldbg.compare.read.sources import CompareInputError  # noqa: E402
from mldbg.weights.audit import audit_weights  # noqa: E402
from mldbg.weights.render import render_audit  # noqa: E402
from parity_zoo import llama_family  # noqa: E402

QUANTIZED_PER_LAYER = 7  # q, k, v, o, gate, up, down


def port(arch: str, dtype: str, *, mistakes: bool = False, **quantize: Any) -> Any:
    """mlx-lm's model loaded from the reference, then quantized; with ``mistakes``, the
    loader transposes two weights (a square and a rectangular one), never loads one and
    scales another, all before quantizing."""
    ref, _ids = llama_family.reference(arch, dtype)
    model = llama_family.mlx_model(arch, llama_family.SIZES.rope_theta)
    llama_family.load_from(model, ref)
    if mistakes:
        layer0, layer1 = model.model.layers[0], model.model.layers[1]
        layer0.self_attn.q_proj.weight = layer0.self_attn.q_proj.weight.T  # 64 x 64
        layer0.mlp.gate_proj.weight = layer0.mlp.gate_proj.weight.T  # 128 x 64 -> 64 x 128
        mx.random.seed(5)
        o_proj = layer1.self_attn.o_proj
        o_proj.weight = 0.02 * mx.random.normal(o_proj.weight.shape).astype(o_proj.weight.dtype)
        layer0.self_attn.k_proj.weight = layer0.self_attn.k_proj.weight * 1.5
    mnn.quantize(model, **quantize)
    mx.eval(model.parameters())
    return model


def rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"] or row["name_port"]: row for row in result["parameters"]}


CLEAN = [
    ("llama", "float32", {"bits": 4, "group_size": 64}, "affine"),
    ("qwen2", "bfloat16", {"bits": 8, "group_size": 32}, "affine"),
    ("qwen3", "float16", {"bits": 3, "group_size": 64}, "affine"),
    ("llama", "bfloat16", {"mode": "mxfp4"}, "mxfp4"),
    ("qwen2", "float32", {"mode": "mxfp8"}, "mxfp8"),
    ("llama", "float32", {"mode": "nvfp4"}, "nvfp4"),
]


@pytest.mark.parametrize(("arch", "dtype", "quantize", "mode"), CLEAN, ids=lambda v: str(v))
def test_a_clean_quantized_port_passes_with_its_quantization_reported(
    arch: str, dtype: str, quantize: dict[str, Any], mode: str, tmp_path: Path
) -> None:
    ref, _ids = llama_family.reference(arch, dtype)
    model = port(arch, dtype, **quantize)
    layers = llama_family.SIZES.num_hidden_layers
    expected = layers * QUANTIZED_PER_LAYER + 2  # and the embedding and lm_head
    result = audit_weights(ref, model)
    assert result["ok"], render_audit(result)
    assert result["counts"]["quantized"] == expected
    assert "extra" not in result["counts"] and "shape" not in result["counts"]
    head = rows(result)["lm_head.weight"]
    assert head["quant"]["mode"] == mode and head["quant"]["source"] == "module"
    assert head["quant"]["bits"] == quantize.get("bits", 8 if mode == "mxfp8" else 4)
    assert 0 < head["quant"]["worst"] <= 1
    # The same port saved to a file: the settings come from the shapes.
    path = tmp_path / "port.safetensors"
    mx.save_safetensors(str(path), dict(tree_flatten(model.parameters())))
    saved = audit_weights(ref, path)
    assert saved["ok"], render_audit(saved)
    assert saved["counts"]["quantized"] == expected
    assert rows(saved)["lm_head.weight"]["quant"]["source"] == "shapes"
    assert rows(saved)["lm_head.weight"]["quant"]["mode"] == mode


@pytest.mark.parametrize("quantize", [{"bits": 4, "group_size": 64}, {"mode": "mxfp4"}])
def test_loading_mistakes_in_a_quantized_port_are_named(
    quantize: dict[str, Any], tmp_path: Path
) -> None:
    ref, _ids = llama_family.reference("llama", "float32")
    model = port("llama", "float32", mistakes=True, **quantize)
    path = tmp_path / "port.safetensors"
    mx.save_safetensors(str(path), dict(tree_flatten(model.parameters())))
    for given in (model, path):
        result = audit_weights(ref, given)
        found = rows(result)
        assert not result["ok"]
        for name in (
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.mlp.gate_proj.weight",
        ):
            assert found[name]["status"] == "layout", found[name]
            assert found[name]["layout"] == "OI→IO"
        assert found["model.layers.1.self_attn.o_proj.weight"]["status"] == "never_loaded"
        scaled = found["model.layers.0.self_attn.k_proj.weight"]
        assert scaled["status"] == "values" and scaled["quant"]["worst"] > 1
        assert "outside what" in scaled["note"]
        failing = [r["name"] for r in result["problems"] if r["status"] not in ("quantized", "ok")]
        assert len(failing) == 4, failing


def test_fresh_quantized_port_names_never_loaded_exactly() -> None:
    ref, _ids = llama_family.reference("llama", "float32")

    def built(load: bool) -> Any:
        mx.random.seed(11)
        model = llama_family.mlx_model("llama", llama_family.SIZES.rope_theta)
        if load:
            weights = {k: v for k, v in ref.state_dict().items() if "o_proj" not in k}
            model.load_weights([(k, mx.array(v.numpy())) for k, v in weights.items()], strict=False)
        mnn.quantize(model, bits=4, group_size=64)
        mx.eval(model.parameters())
        return model

    result = audit_weights(ref, built(True), fresh=built(False))
    found = rows(result)
    for layer in range(llama_family.SIZES.num_hidden_layers):
        row = found[f"model.layers.{layer}.self_attn.o_proj.weight"]
        assert row["status"] == "never_loaded" and "fresh" in row["note"]
    assert result["counts"]["never_loaded"] == llama_family.SIZES.num_hidden_layers


def test_an_mlx_lm_saved_model_with_mixed_bits_reads_its_config(tmp_path: Path) -> None:
    """mlx-lm's own conversion: 4 bits, the head at 8 (a per-module entry in the config),
    saved as mlx-lm saves it; the audit takes the settings from ``config.json``."""
    from mlx_lm.utils import quantize_model, save_config, save_model

    ref, _ids = llama_family.reference("llama", "float32")
    model = llama_family.mlx_model("llama", llama_family.SIZES.rope_theta)
    llama_family.load_from(model, ref)

    def predicate(path: str, module: Any) -> bool | dict[str, Any]:
        return {"bits": 8, "group_size": 64} if path == "lm_head" else True

    model, config = quantize_model(model, {"model_type": "llama"}, 64, 4, quant_predicate=predicate)
    save_model(tmp_path / "port", model)
    save_config(config, tmp_path / "port" / "config.json")
    result = audit_weights(ref, tmp_path / "port")
    assert result["ok"], render_audit(result)
    found = rows(result)
    assert found["lm_head.weight"]["quant"] == {
        **found["lm_head.weight"]["quant"],
        "bits": 8,
        "source": "config.json",
    }
    assert found["model.embed_tokens.weight"]["quant"]["bits"] == 4
    # A config that contradicts the stored shapes is reported, not decoded wrongly.
    config["quantization"] = {"group_size": 32, "bits": 4, "mode": "affine"}
    (tmp_path / "port" / "config.json").write_text(json.dumps(config))
    wrong = audit_weights(ref, tmp_path / "port")
    assert not wrong["ok"]
    assert "does not fit" in rows(wrong)["lm_head.weight"]["note"]


def test_ambiguous_shapes_ask_for_the_quantization_and_take_it(tmp_path: Path) -> None:
    """A renamed quantized head has no reference parameter to size it by: its packed
    shape fits several settings, so the audit says so and asks; given them, the
    rename is found in the decoded values."""
    ref, _ids = llama_family.reference("llama", "float32")
    model = port("llama", "float32", bits=4, group_size=64)
    flat = dict(tree_flatten(model.parameters()))
    for part in ("weight", "scales", "biases"):
        flat[f"output.{part}"] = flat.pop(f"lm_head.{part}")
    path = tmp_path / "port.safetensors"
    mx.save_safetensors(str(path), flat)
    asked = audit_weights(ref, path)
    extra = rows(asked)["output.weight"]
    assert extra["status"] == "extra" and "give quantization=" in extra["note"]
    for given in ("bits=4,group_size=64", {"mode": "affine", "bits": 4, "group_size": 64}):
        told = audit_weights(ref, path, quantization=given)
        assert told["ok"], render_audit(told)
        assert rows(told)["lm_head.weight"]["status"] == "renamed"
        assert told["proposed_map"] == {"rename": {"output.weight": "lm_head.weight"}}
    with pytest.raises(CompareInputError, match="no affine quantization with 7 bits"):
        audit_weights(ref, path, quantization="bits=7,group_size=64")


def test_cli_takes_the_quantization(cli: Any, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    ref, _ids = llama_family.reference("llama", "float32")
    save_file(
        {k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "ref.safetensors")
    )
    model = port("llama", "float32", mode="mxfp4")
    mx.save_safetensors(str(tmp_path / "port.safetensors"), dict(tree_flatten(model.parameters())))
    answer = cli(
        "weights", "ref.safetensors", "port.safetensors", "--quantization", "mxfp4", json_out=True
    )
    assert answer["ok"] is True and answer["counts"]["quantized"] == 16
    assert answer["problems"][0]["quant"]["source"] == "given"
    bad = cli(
        "weights",
        "ref.safetensors",
        "port.safetensors",
        "--quantization",
        "q4",
        expect=None,
        json_out=True,
    )
    assert bad["code"] == "bad_weights_input"


def test_a_capture_records_what_its_quantized_modules_are(home: Path) -> None:
    """``save_weights`` (``start --capture-weights``) writes the packed tensors and, in
    ``capture.json``, each quantized module's settings: the audit decodes by them."""
    import mldbg

    ref, ids = llama_family.reference("llama", "float32")
    model = port("llama", "float32", bits=8, group_size=64)
    with mldbg.capture(model, "port") as cap:
        cap.save_weights()
        mx.eval(model(mx.array(ids.numpy())))
    meta = json.loads((cap.path / "capture.json").read_text())
    assert meta["weights"]["quantization"]["lm_head"] == {
        "mode": "affine",
        "bits": 8,
        "group_size": 64,
    }
    result = audit_weights(ref, "port", home=home)
    assert result["ok"], render_audit(result)
    assert rows(result)["lm_head.weight"]["quant"]["source"] == "capture"


@pytest.mark.parametrize("bits", [None, 4])
def test_tied_embeddings_on_the_reference_side_only_are_reported_not_missing(
    bits: int | None,
) -> None:
    """transformers' state dict lists a tied ``lm_head.weight`` (the embedding's own
    tensor); mlx-lm's tied model has no ``lm_head`` and multiplies by the embedding.  Before,
    ``lm_head.weight`` was ``missing`` and a clean port failed.  A head the reference does
    not tie stays ``missing``."""
    import dataclasses

    sizes = dataclasses.replace(llama_family.SIZES)
    config, cls = llama_family._hf_config("llama", sizes)
    config.tie_word_embeddings = True
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    ref = cls(config).eval()
    from mlx_lm.models import llama

    def mlx_port(tied_ref: Any) -> Any:
        model = llama.Model(
            llama.ModelArgs(
                model_type="llama",
                hidden_size=sizes.hidden_size,
                num_hidden_layers=sizes.num_hidden_layers,
                intermediate_size=sizes.intermediate_size,
                num_attention_heads=sizes.num_attention_heads,
                num_key_value_heads=sizes.num_key_value_heads,
                head_dim=sizes.head_dim,
                rms_norm_eps=sizes.rms_norm_eps,
                vocab_size=sizes.vocab_size,
                rope_theta=sizes.rope_theta,
                tie_word_embeddings=True,
            )
        )
        weights = {k: mx.array(v.detach().numpy()) for k, v in tied_ref.state_dict().items()}
        model.load_weights(list(model.sanitize(weights).items()))
        if bits is not None:
            mnn.quantize(model, bits=bits, group_size=64)
        mx.eval(model.parameters())
        return model

    result = audit_weights(ref, mlx_port(ref))
    assert result["ok"], render_audit(result)
    head = rows(result)["lm_head.weight"]
    assert head["status"] == "tied" and "model.embed_tokens.weight" in head["note"]
    untied = cls(config)
    untied.load_state_dict(ref.state_dict())
    with torch.no_grad():
        untied.lm_head.weight = torch.nn.Parameter(torch.randn_like(untied.lm_head.weight))
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()
    other = audit_weights(untied, mlx_port(ref))
    assert rows(other)["lm_head.weight"]["status"] == "missing"


def test_fused_projections_are_named_as_the_parts_they_hold() -> None:
    """A port that fuses what the reference splits (``qkv_proj`` for q/k/v, ``gate_up_proj``
    for gate/up, as Phi-3 and many hand-written ports do) and a reference that fuses what
    the port splits (GPT-2's ``c_attn``, q/k/v side by side along its last axis).  Before,
    the parts were ``missing`` and the whole ``extra``."""
    import numpy as np
    import transformers

    ref, _ids = llama_family.reference("llama", "float32")
    state = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    port: dict[str, Any] = {}
    for name, value in state.items():
        if ".k_proj." in name or ".v_proj." in name or ".up_proj." in name:
            continue
        if ".q_proj." in name:
            parts = [state[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            port[name.replace("q_proj", "qkv_proj")] = mx.array(np.concatenate(parts))
        elif ".gate_proj." in name:
            parts = [state[name], state[name.replace("gate_proj", "up_proj")]]
            port[name.replace("gate_proj", "gate_up_proj")] = mx.array(np.concatenate(parts))
        else:
            port[name] = mx.array(value)
    result = audit_weights(ref, port)
    assert result["ok"], render_audit(result)
    found = rows(result)
    k_proj = found["model.layers.1.self_attn.k_proj.weight"]
    assert k_proj["status"] == "fused"
    assert k_proj["fused"] == {
        "into": "model.layers.1.self_attn.qkv_proj.weight",
        "axis": 0,
        "start": 64,
        "stop": 96,
    }
    assert found["model.layers.0.mlp.gate_up_proj.weight"]["status"] == "fused"
    # A wrong part is not fused: v's rows replaced, v stays missing, the whole extra.
    broken = dict(port)
    qkv = np.array(broken["model.layers.0.self_attn.qkv_proj.weight"])
    qkv[96:] = np.random.default_rng(0).normal(size=qkv[96:].shape)
    broken["model.layers.0.self_attn.qkv_proj.weight"] = mx.array(qkv)
    bad = audit_weights(ref, broken)
    assert not bad["ok"]
    assert rows(bad)["model.layers.0.self_attn.v_proj.weight"]["status"] == "missing"

    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50, n_positions=16)
    gpt2 = transformers.GPT2Model(config).eval()
    split: dict[str, Any] = {}
    for name, value in gpt2.state_dict().items():
        if ".c_attn." in name:
            for i, part in enumerate(("q", "k", "v")):
                chunk = np.split(value.numpy(), 3, axis=-1)[i]
                split[name.replace("c_attn", part)] = mx.array(chunk)
        else:
            split[name] = mx.array(value.numpy())
    split_result = audit_weights(gpt2, split)
    assert split_result["ok"], render_audit(split_result)
    whole = rows(split_result)["h.0.attn.c_attn.weight"]
    assert whole["status"] == "fused" and "along axis 1" in whole["note"]
    assert rows(split_result)["h.0.attn.v.bias"]["fused"]["start"] == 64


def test_gpt2s_conv1d_weights_moved_to_linear_are_its_layout() -> None:
    """transformers' GPT-2 keeps its projections in ``Conv1D`` modules, weight ``(in,
    out)``; mlx-lm's port transposes them into Linear ``(out, in)``: the right layout
    (``IO→OI``), not a transposed linear.  Before, all eight were ``layout`` failures."""
    from parity_zoo import gpt2

    z = gpt2.build("float32", None)
    result = audit_weights(z.ref, z.port, map=z.map)
    assert result["ok"], render_audit(result)
    c_attn = rows(result)["transformer.h.0.attn.c_attn.weight"]
    assert c_attn["status"] == "ok" and c_attn["layout"] == "IO→OI"


def test_a_quantized_gemma_port_with_its_tied_head() -> None:
    """mlx-lm's Gemma (its embedding, quantized, also serves as the output head) against
    transformers' Gemma, whose state dict lists the tied ``lm_head.weight``."""
    from parity_zoo import gemma

    z = gemma.build("float32", None)
    mnn.quantize(z.port, bits=4, group_size=32)
    mx.eval(z.port.parameters())
    result = audit_weights(z.ref, z.port, map=z.map)
    assert result["ok"], render_audit(result)
    assert result["counts"]["tied"] == 1
    assert rows(result)["model.embed_tokens.weight"]["quant"]["bits"] == 4
