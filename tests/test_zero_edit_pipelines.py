"""Zero-edit capture of pipelines: several models, several calls each, as scripts call them.

Each script here is run unmodified in a real subprocess with ``$MLDBG_CAPTURE`` set, the
way the agent runs it under ``start --capture`` (``zero_edit.install_from_environment()``
before the script, ``finish()`` after): the captures it leaves are then read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mldbg.text import compare as compare_render
from mldbg.text.console import captured

RUNNER = textwrap.dedent(
    """
    import runpy, sys
    from mldbg import zero_edit
    tracker = zero_edit.install_from_environment()
    sys.argv = sys.argv[1:]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        tracker.finish()
    """
)


def run_script(
    directory: Path, script: str, *args: str, **settings: Any
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (its source) in ``directory`` with ``settings`` as ``$MLDBG_CAPTURE``."""
    path = directory / "script.py"
    path.write_text(textwrap.dedent(script))
    env = {
        **os.environ,
        "MLDBG_CAPTURE": json.dumps(settings),
        "MLDBG_HOME": str(directory / ".mldbg"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(path), *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def index_of(directory: Path, name: str) -> list[dict[str, Any]]:
    (index,) = (directory / ".mldbg" / "runs").glob(f"*/captures/{name}/index.jsonl")
    return [json.loads(line) for line in index.read_text().splitlines()]


def top_level_calls(lines: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [
        (line["module"], line["call"])
        for line in lines
        if line["event"] == "call" and line["parent"] is None
    ]


MLX_LOOP = """
    import mlx.core as mx
    import mlx.nn as nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 8)

        def __call__(self, x):
            return self.b(nn.gelu(self.a(x)))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [Block(), Block()]

        def __call__(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    mx.random.seed(0)
    model = Model()
    x = mx.random.normal((2, 8))
    for step in range(3):
        x = model(x)
        mx.eval(x)
"""


def test_an_mlx_model_called_in_a_loop_is_recorded_once_per_call(tmp_path: Path) -> None:
    """Every call after the first entered the recording class, which called the zero-edit
    wrapper, which went through the recording class again: ``<root>#1`` held a nested
    ``<root>#2`` with the whole tree, and the port's step k no longer met the reference's."""
    pytest.importorskip("mlx.core")
    run_script(tmp_path, MLX_LOOP, name="loop")
    lines = index_of(tmp_path, "loop")
    assert top_level_calls(lines) == [("", 0), ("", 1), ("", 2)]
    calls = [(line["module"], line["call"]) for line in lines if line["event"] == "call"]
    assert calls.count(("", 1)) == 1 and ("", 3) not in calls
    blocks = [line for line in lines if line["event"] == "call" and line["module"] == "blocks.0"]
    assert [line["call"] for line in blocks] == [0, 1, 2]


# -- a later model of a pipeline: its first inputs carry what the models before it rounded ----

FLUX_THEN_DECODER = """
    import sys
    import numpy as np
    import torch
    from parity_zoo import flux
    from parity_zoo.core import to_mlx

    ref, inputs = flux.reference("float32")
    torch.manual_seed(1)
    decoder = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)).eval()
    latents, text, pooled, sigma, img_ids, txt_ids = inputs
    sigmas = [1.0, 0.5, 0.0]
    if sys.argv[1] == "torch":  # the reference: diffusers' transformer
        with torch.no_grad():
            for s, following in zip(sigmas[:-1], sigmas[1:]):
                v = ref(latents, text, pooled, torch.tensor([s]), img_ids, txt_ids).sample
                latents = latents + (following - s) * v
    else:  # the port: the MLX transformer, same weights, same loop
        import mlx.core as mx

        port = flux.port_of(ref, "float32")
        x = to_mlx(latents)
        args = [to_mlx(t) for t in (text, pooled)]
        for s, following in zip(sigmas[:-1], sigmas[1:]):
            v = port(x, *args, mx.array([s]), to_mlx(img_ids), to_mlx(txt_ids))
            x = x + (following - s) * v
            mx.eval(x)
        latents = torch.from_numpy(np.array(x))
        if sys.argv[2:] == ["glue-bug"]:
            latents = latents * 1.01  # the code between the two models
    with torch.no_grad():
        decoder(latents)
"""


@pytest.mark.parametrize("glue_bug", [False, True], ids=["clean", "glue-bug"])
def test_a_later_models_first_inputs_are_bounded_by_the_models_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, glue_bug: bool
) -> None:
    """The decoder (``NAME.2``) reads what the transformer (``NAME``) computed: in a clean
    MLX port its first inputs differ by the transformer's rounding (its timestep
    embedding's sine of ~1000 first), which compare read as "the two runs were given
    different inputs".  Its capture now lists its ``upstream`` captures, whose leaf calls
    and conditioning floors bound those inputs; a real difference made between the two
    models is still named, and the reason says it entered before this model."""
    pytest.importorskip("mlx.core")
    pytest.importorskip("diffusers")
    import mldbg

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    ref_dir, port_dir = tmp_path / "ref", tmp_path / "port"
    ref_dir.mkdir()
    port_dir.mkdir()
    run_script(ref_dir, FLUX_THEN_DECODER, "torch", name="ref")
    port_args = ["mlx", "glue-bug"] if glue_bug else ["mlx"]
    run_script(port_dir, FLUX_THEN_DECODER, *port_args, name="port", sensitivity=False)

    def captured(directory: Path, name: str) -> str:
        (path,) = (directory / ".mldbg" / "runs").glob(f"*/captures/{name}")
        return str(path)

    # The transformer alone (NAME.1: the first model without the pipeline after it).
    transformer = mldbg.compare(captured(ref_dir, "ref") + ".1", captured(port_dir, "port") + ".1")
    assert transformer.ok, json.dumps(transformer.first_divergence)[:600]
    assert "pipeline" not in transformer.result
    decoder = mldbg.compare(captured(ref_dir, "ref.2"), captured(port_dir, "port.2"))
    if not glue_bug:
        assert decoder.ok, json.dumps(decoder.first_divergence)[:600]
    (ref_meta,) = (ref_dir / ".mldbg" / "runs").glob("*/captures/ref.2/capture.json")
    returns = [line for line in index_of(ref_dir, "ref") if line["event"] == "return"]
    upstream = [{"capture": "ref", "ended": len(returns)}]  # the transformer had ended
    assert json.loads(ref_meta.read_text())["upstream"] == upstream
    if not glue_bug:
        return
    culprit = decoder.first_divergence
    assert culprit is not None and culprit["name"] == "<root>#0"
    assert "before this model" in culprit["reason"] and "(ref)" in culprit["reason"]
    # The pipeline in one compare: the transformer agrees, so the glue between the two.
    pipeline = mldbg.compare(captured(ref_dir, "ref"), captured(port_dir, "port"))
    culprit = pipeline.first_divergence
    assert culprit is not None and culprit["capture"] == "ref.2" and culprit["name"] == "<root>#0"
    assert "enters between ref's <root>#1 and ref.2's <root>#0" in culprit["reason"]


# -- a model the pipeline drives through a method: the VAE's decode -------------------------

VAE_DECODE = """
    import sys
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    denoiser = torch.nn.Linear(4, 4).eval()
    vae = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=16,
    ).eval()
    if sys.argv[1:] == ["bug"]:  # a port that loaded one weight wrong
        with torch.no_grad():
            vae.decoder.up_blocks[0].resnets[0].conv1.weight.mul_(1.5)
    with torch.no_grad():
        latents = denoiser(torch.randn(1, 8, 8, 4)).permute(0, 3, 1, 2)
        image = vae.decode(latents).sample  # never vae(...): decode calls its parts
"""


@pytest.mark.parametrize("models", [None, ["AutoencoderKL"]], ids=["outermost", "by-class"])
def test_a_model_driven_through_its_method_is_one_model(
    tmp_path: Path, models: list[str] | None
) -> None:
    """diffusers pipelines call ``vae.decode(z)``, never ``vae(z)``: the outermost module
    calls were ``post_quant_conv`` and ``decoder``, two models of their own (and the
    numbering of every model after them shifted), and ``--capture-model AutoencoderKL``
    captured nothing at all.  The module whose method is running is the model now."""
    pytest.importorskip("diffusers")
    settings: dict[str, Any] = {"name": "pipe"}
    if models:
        settings["models"] = models
    run_script(tmp_path, VAE_DECODE, **settings)
    metas = {
        path.parent.name: json.loads(path.read_text())
        for path in (tmp_path / ".mldbg" / "runs").glob("*/captures/*/capture.json")
    }
    vae = "pipe" if models else "pipe.2"
    assert sorted(metas) == (["pipe"] if models else ["pipe", "pipe.2"])
    assert metas[vae]["model_class"].endswith("AutoencoderKL")
    lines = index_of(tmp_path, vae)
    assert top_level_calls(lines) == [("post_quant_conv", 0), ("decoder", 0)]
    # Both sited at the script's line that called decode (the code that feeds the VAE),
    # not inside diffusers' decode.
    sites = {line["site"] for line in lines if line["event"] == "call" and line["parent"] is None}
    (site,) = sites
    assert site.startswith(str(tmp_path / "script.py")), site
    if not models:
        assert metas["pipe"]["model_class"].endswith("Linear")


def test_the_fine_pass_of_a_later_model_names_it_and_leaves_the_others_quiet(
    tmp_path: Path,
) -> None:
    """Comparing the first models says the run holds more (``other_models``: a clean
    text encoder answered "match" while the VAE after it diverged).  The coarse pass
    names a module of the pipeline's second model (``pipe.2``); the
    ``narrow`` hint's fine pass (``--capture-within``) applies to every model of the run:
    the ones without that module ran uncaptured with a "not captured" line each on the
    script's stderr, and the hint said "then compare those" where the capture to compare
    is ``NAME.2``.  Now they stay quiet, and the hint names ``NAME.2``."""
    pytest.importorskip("diffusers")
    import mldbg

    ref_dir, port_dir = tmp_path / "ref", tmp_path / "port"
    ref_dir.mkdir()
    port_dir.mkdir()
    coarse = {"mode": "summary", "depth": 2}
    run_script(ref_dir, VAE_DECODE, "clean", name="ref", **coarse)
    run_script(port_dir, VAE_DECODE, "bug", name="port", sensitivity=False, **coarse)

    def captured(directory: Path, name: str) -> str:
        (path,) = (directory / ".mldbg" / "runs").glob(f"*/captures/{name}")
        return str(path)

    # The first models agree; the answer says that it covers that model only.
    first = mldbg.compare(captured(ref_dir, "ref") + ".1", captured(port_dir, "port") + ".1").result
    assert first["ok"]
    others = first["other_models"]
    assert others["models_a"] == ["ref.2"] and others["models_b"] == ["port.2"]
    assert "mldbg compare ref.2 port.2" in others["hint"] and "…" not in others["hint"]
    result = mldbg.compare(captured(ref_dir, "ref.2"), captured(port_dir, "port.2")).result
    assert "other_models" not in result  # a later model's name says which it is
    with pytest.raises(mldbg.CompareInputError, match="compare ref.2 with port.2"):
        mldbg.compare(captured(ref_dir, "ref.2"), captured(port_dir, "port"))  # nothing pairs
    narrow = result["narrow"]
    assert narrow is not None, result["first_divergence"]
    within = narrow["within_a"]
    assert within.startswith("decoder.up_blocks.0"), narrow
    assert "compare ref-fine.2 with port-fine.2" in narrow["hint"]
    assert narrow["calls"][2] == {
        "verb": "compare",
        "args": {"a": "ref-fine.2", "b": "port-fine.2"},
    }
    fine = run_script(ref_dir, VAE_DECODE, "clean", name="fine", within=within)
    assert "not captured" not in fine.stderr, fine.stderr
    # The denoiser, which lacks that module, is on the index only: its calls (and what
    # they round, for the VAE's bounds), no tensor.
    (denoiser,) = (ref_dir / ".mldbg" / "runs").glob("*/captures/fine/capture.json")
    assert json.loads(denoiser.read_text())["index_only"] is True
    assert json.loads(denoiser.read_text())["within"] == within
    lines = index_of(ref_dir, "fine")
    assert lines and all(line.get("tensors") is None for line in lines)
    with pytest.raises(mldbg.CompareInputError, match="captured index-only"):
        mldbg.compare(captured(ref_dir, "fine"), captured(ref_dir, "fine"))
    run_script(port_dir, VAE_DECODE, "bug", name="fine", within=within, sensitivity=False)
    fine_result = mldbg.compare(captured(ref_dir, "fine.2"), captured(port_dir, "fine.2"))
    culprit = fine_result.first_divergence
    assert culprit is not None and culprit["module"] == "decoder.up_blocks.0.resnets.0.conv1"
    nowhere = run_script(ref_dir, VAE_DECODE, "clean", name="none", within="up_blocks.9")
    assert "no model has the module within='up_blocks.9'" in nowhere.stderr


FLUX_CALLED_TWO_WAYS = """
    import sys
    import torch
    from parity_zoo import flux
    from parity_zoo.core import to_mlx

    ref, (latents, text, pooled, sigma, img_ids, txt_ids) = flux.reference("float32")
    if sys.argv[1] == "torch":  # as diffusers' FluxPipeline calls it: by keyword
        with torch.no_grad():
            ref(
                hidden_states=latents,
                timestep=sigma,
                guidance=None,
                pooled_projections=pooled,
                encoder_hidden_states=text,
                txt_ids=txt_ids,
                img_ids=img_ids,
                return_dict=False,
            )
    else:  # the MLX port takes its own positional order, RoPE pairing wrong
        import mlx.core as mx

        port = flux.port_of(ref, "float32", "rope")
        inputs = (latents, text, pooled, sigma, img_ids, txt_ids)
        mx.eval(port(*(to_mlx(t) for t in inputs)))
"""


def test_replay_feeds_the_reference_inputs_through_the_ports_own_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--capture-replay``: the reference's root was called with ``hidden_states=``,
    ``encoder_hidden_states=``..., the port's root takes ``(latents, text, pooled,
    sigma, img_ids, txt_ids)``.  Replay rebuilt the port's arguments from the reference's
    names (none known to the port: then in the capture file's order, alphabetical), the
    port's forward failed on them, the capture was left ``failed`` and nothing said so.
    Now the script's own call says how the port takes them, paired as at every module."""
    pytest.importorskip("mlx.core")
    pytest.importorskip("diffusers")
    import mldbg

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / ".mldbg"))
    run_script(tmp_path, FLUX_CALLED_TWO_WAYS, "torch", name="ref")
    run_script(tmp_path, FLUX_CALLED_TWO_WAYS, "mlx", name="bug", sensitivity=False)
    replayed = run_script(tmp_path, FLUX_CALLED_TWO_WAYS, "mlx", name="rep", replay="ref")
    assert "mldbg replay" not in replayed.stderr, replayed.stderr
    (meta,) = (tmp_path / ".mldbg" / "runs").glob("*/captures/rep/capture.json")
    assert json.loads(meta.read_text())["state"] == "complete"
    culprit = mldbg.compare("ref", "bug", replay="rep").first_divergence
    assert culprit is not None and culprit["module"] == "transformer_blocks.0.attn"
    assert culprit.get("local") is True


TWO_ENCODERS = """
    import sys
    import torch

    class Clip(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.token_proj = torch.nn.Linear(4, 4)
            self.final_norm = torch.nn.LayerNorm(4)

        def forward(self, x):
            return self.final_norm(self.token_proj(x))

    class T5(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wi = torch.nn.Linear(4, 8)
            self.wo = torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.wo(torch.relu(self.wi(x)))

    torch.manual_seed(0)
    clip, t5, x = Clip().eval(), T5().eval(), torch.randn(2, 4)
    with torch.no_grad():
        order = [t5, clip] if sys.argv[1:] == ["t5-first"] else [clip, t5]
        for encoder in order:
            encoder(x)
"""


def test_models_called_in_another_order_are_pointed_at(tmp_path: Path) -> None:
    """The port encodes with T5 before CLIP: ``NAME.2`` is T5 in one run and CLIP in the
    other.  Entries that happen to share a name pair (``<root>#0.out``), and compare gave
    a verdict about two different models; now it says which capture of the port's run
    holds the reference model's modules."""
    import mldbg

    ref_dir, port_dir = tmp_path / "ref", tmp_path / "port"
    ref_dir.mkdir()
    port_dir.mkdir()
    run_script(ref_dir, TWO_ENCODERS, "clip-first", name="ref")
    run_script(port_dir, TWO_ENCODERS, "t5-first", name="port", sensitivity=False)

    def captured(directory: Path, name: str) -> str:
        (path,) = (directory / ".mldbg" / "runs").glob(f"*/captures/{name}")
        return str(path)

    crossed = mldbg.compare(captured(ref_dir, "ref.2"), captured(port_dir, "port.2")).result
    others = crossed["other_models"]
    assert others["counterpart_b"] == "port"
    assert "compare ref.2 with port" in others["hint"]
    same = mldbg.compare(captured(ref_dir, "ref.2"), captured(port_dir, "port")).result
    assert same["ok"] and "counterpart_b" not in same["other_models"]
    assert "ref.2 is model 2 of its run and port model 1" in same["other_models"]["hint"]


# -- a pipeline is one verdict: three models, one compare ------------------------------------

THREE_MODELS = """
    import sys
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, max_position_embeddings=8, projection_dim=16,
            bos_token_id=0, eos_token_id=2,
        )
    ).eval()
    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(16, 32), norm_num_groups=8, cross_attention_dim=16,
        attention_head_dim=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
    ).eval()
    vae = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4,
        sample_size=16,
    ).eval()
    ids = torch.tensor([[0, 5, 9, 2, 2, 2, 2, 2]])
    with torch.no_grad():
        text = text_encoder(ids).last_hidden_state
        latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(1))
        for t in (999, 500):
            noise = unet(latents, t, encoder_hidden_states=text).sample  # DENOISE
            latents = latents - 0.1 * noise
        if sys.argv[1:] != ["skip-unscale"]:
            latents = latents / vae.config.scaling_factor
        image = vae.decode(latents).sample  # DECODE
"""


def _line_of(script: str, marker: str) -> int:
    lines = textwrap.dedent(script).splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


def test_a_three_model_pipeline_is_compared_in_one_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers' CLIP text encoder, diffusers' UNet called twice, diffusers' VAE
    decoded through ``vae.decode``: each its own capture (``ref``, ``ref.2``, ``ref.3``).
    A port that skips the latent unscale before the VAE compared as "match" (the text
    encoders agree) and took three compares and a map to find; one compare names it now:
    the code between the UNet's last call and the VAE's first, with both call sites."""
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    import mldbg

    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / ".mldbg"))
    run_script(tmp_path, THREE_MODELS, "clean", name="ref")
    run_script(tmp_path, THREE_MODELS, "clean", name="clean", sensitivity=False)
    run_script(tmp_path, THREE_MODELS, "skip-unscale", name="port", sensitivity=False)

    clean = mldbg.compare("ref", "clean")
    models = clean.result["pipeline"]["models"]
    assert [m["a"] for m in models] == ["ref", "ref.2", "ref.3"]
    assert [m["b"] for m in models] == ["clean", "clean.2", "clean.3"]
    assert clean.ok and all(m["ok"] for m in models), json.dumps(models)[:1500]

    buggy = mldbg.compare("ref", "port")
    assert not buggy.ok and buggy.exit_code == 1
    pipeline = buggy.result["pipeline"]
    assert [m["ok"] for m in pipeline["models"]] == [True, True, False]
    assert pipeline["deciding"] == 3
    culprit = buggy.first_divergence
    assert culprit is not None and culprit["capture"] == "ref.3"
    assert culprit["name"] == "post_quant_conv#0", culprit  # the VAE's first call (decode)
    assert "enters between ref.2's <root>#1 and ref.3's post_quant_conv#0" in culprit["reason"]
    script = str(tmp_path / "script.py")
    glue = culprit["glue"]
    denoise, decode = _line_of(THREE_MODELS, "# DENOISE"), _line_of(THREE_MODELS, "# DECODE")
    assert glue["after"]["call"] == "ref.2:<root>#1"
    assert glue["after"]["site_a"] == glue["after"]["site_b"] == f"{script}:{denoise}"
    assert glue["before"]["site_a"] == glue["before"]["site_b"] == f"{script}:{decode}"
    with captured(width=300) as buffer:
        compare_render.show(buggy.result)
    text = buffer.getvalue()
    assert "model 1 ref / port" in text and "model 3 ref.3 / port.3" in text
    assert "first divergence: post_quant_conv#0" in text

    # One model alone: NAME.k, and NAME.1 for the first.
    assert "pipeline" not in mldbg.compare("ref.3", "port.3").result
    first = mldbg.compare("ref.1", "port.1").result
    assert first["ok"] and "pipeline" not in first and "other_models" in first
