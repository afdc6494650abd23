"""Whole pipelines (issue 20, items 3 and 4): glue code named, several models in one capture.

A flow-matching loop, written twice: diffusers' ``FlowMatchEulerDiscreteScheduler`` (time
shift 3) driving diffusers' tiny Flux transformer, and a hand-written MLX loop driving the
MLX port (``parity_zoo.flux``) with its own sigma schedule.  One capture holds every
denoiser call of the loop (``<root>#0``, ``<root>#1``, ...).  A port whose schedule
forgets the time shift gives the denoiser the same first call (sigma 1 is 1 shifted or
not) and different latents and timestep from the second call on: compare must say that
the difference enters between the calls, show the first differing input side by side,
and give the line of each script that made each call.

Then a two-model pipeline in one capture (``mldbg.capture({"text_encoder": te,
"transformer": t}, ...)``): a small text encoder (hand-written in both frameworks, same
weights) makes the prompt embeddings, the pipeline normalizes the pooled vector, the
transformer denoises for three steps.  Compare names the model, the step and the module
of a bug in either model, and glue between the text encoder and the transformer.

Last, diffusers' own ``FluxPipeline`` (tiny VAE, no text encoders: the prompt embeddings
are given) against the hand-written MLX loop: the call site of A is then the line of
diffusers' pipeline that calls the transformer.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
mnn = pytest.importorskip("mlx.nn")
pytest.importorskip("diffusers")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("home"),
]  # a real diffusers transformer and scheduler

import mldbg  # noqa: E402
from mldbg.store import current_run  # noqa: E402
from parity_zoo import flux, vae  # noqa: E402
from parity_zoo.core import to_mlx  # noqa: E402

STEPS = 3
SHIFT = 3.0


def reference_loop(model: Any, inputs: tuple[Any, ...]) -> torch.Tensor:
    """diffusers' scheduler, as the Flux pipeline drives it (sigmas 1 .. 1/N, shifted)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=SHIFT)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1.0 / STEPS, STEPS))
    latents, text, pooled, _sigma, img_ids, txt_ids = inputs
    with torch.no_grad():
        for t in scheduler.timesteps:
            timestep = (t / 1000).expand(latents.shape[0]).to(latents.dtype)
            velocity = model(latents, text, pooled, timestep, img_ids, txt_ids).sample  # REF-CALL
            latents = scheduler.step(velocity, t, latents).prev_sample
    return latents


def port_sigmas(shift: bool) -> list[float]:
    """The port's schedule: 1 .. 1/N, time-shifted (or, the bug, not), then 0."""
    sigmas = np.linspace(1.0, 1.0 / STEPS, STEPS)
    if shift:
        sigmas = SHIFT * sigmas / (1 + (SHIFT - 1) * sigmas)
    return [float(s) for s in sigmas] + [0.0]


def port_loop(
    model: Any,
    inputs: tuple[Any, ...],
    *,
    shift: bool,
    before: Callable[[int], None] | None = None,
) -> mx.array:
    """The port's loop; ``before(step)`` runs ahead of each step (to plant a bug there)."""
    latents, text, pooled, _sigma, img_ids, txt_ids = inputs
    sigmas = port_sigmas(shift)
    for step, (sigma, following) in enumerate(zip(sigmas[:-1], sigmas[1:], strict=True)):
        if before is not None:
            before(step)
        velocity = model(latents, text, pooled, mx.array([sigma]), img_ids, txt_ids)  # PORT-CALL
        latents = latents + (following - sigma) * velocity
        mx.eval(latents)
    return latents


def capture_loops(*, shift: bool) -> None:
    ref, inputs = flux.reference("float32")
    port = flux.port_of(ref, "float32")
    with mldbg.capture(ref, "ref"):
        reference_loop(ref, inputs)
    current_run.reset()
    with mldbg.capture(port, "port"):
        port_loop(port, tuple(to_mlx(t) for t in inputs), shift=shift)
    current_run.reset()


def line_of(marker: str) -> str:
    """``file:line`` of the line of this file that carries ``marker``."""
    lines = Path(__file__).read_text().splitlines()
    number = next(i for i, text in enumerate(lines, 1) if f"# {marker}" in text)
    return f"{Path(__file__).resolve()}:{number}"


def test_a_clean_loop_agrees_call_by_call() -> None:
    capture_loops(shift=True)
    result = mldbg.compare("ref", "port").result
    assert result["ok"], json.dumps(result["first_divergence"])
    calls = {e["call"] for e in result["entries"] if e["module"] == "<root>"}
    assert calls == set(range(STEPS))


def test_a_schedule_bug_is_named_as_glue_code_with_both_call_sites(home: Path) -> None:
    capture_loops(shift=False)
    comparison = mldbg.compare("ref", "port")
    result = comparison.result
    assert not result["ok"]
    culprit = result["first_divergence"]
    assert result["decided_by"] == "glue", json.dumps(culprit)[:800]
    assert culprit["name"] == "<root>#1"
    assert "between <root>#0 and <root>#1" in culprit["reason"]
    glue = culprit["glue"]
    ref_site, port_site = line_of("REF-CALL"), line_of("PORT-CALL")
    assert glue["after"] == {"call": "<root>#0", "site_a": ref_site, "site_b": port_site}
    assert glue["before"] == {"call": "<root>#1", "site_a": ref_site, "site_b": port_site}
    # The first differing input, side by side: the latents after the first step.
    first = glue["input"]
    assert first["name"].startswith("<root>#1.in.")
    assert first["head_a"] and first["head_b"] and first["head_a"] != first["head_b"]
    # Call 0 agrees entirely: the difference is not the denoiser's.
    call0 = [e for e in result["entries"] if e["module"] == "<root>" and e["call"] == 0]
    assert call0 and all(e["ok"] for e in call0)
    # The timestep the second call received differs too (857.1 vs 666.7 after x1000).
    timestep = next(e for e in result["entries"] if e["name"] == "<root>#1.in.3")
    assert not timestep["ok"]
    # The human output says the same: both calls, both lines, the input side by side.
    proc = subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", "ref", "port"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "400"},
    )
    assert proc.returncode == 1, proc.stderr
    text = " ".join(proc.stdout.split())
    assert f"after <root>#0: A at {ref_site}, B at {port_site}" in text, proc.stdout
    assert "first differing input <root>#1.in." in text
    # And the HTML report.
    page = comparison.write_html(home.parent / "report.html").read_text()
    assert html.escape(ref_site) in page and html.escape(port_site) in page


# -- two models in one capture ---------------------------------------------------------------

TOKENS, WIDTH = 4, 8


class TorchTextEncoder(torch.nn.Module):
    """Token features (1, tokens, 8) -> prompt embeddings (1, tokens, 32) and a pooled (1, 16)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj_in = torch.nn.Linear(WIDTH, flux.SIZES.joint_dim)
        self.act = torch.nn.GELU()
        self.proj_out = torch.nn.Linear(flux.SIZES.joint_dim, flux.SIZES.joint_dim)
        self.pool = torch.nn.Linear(flux.SIZES.joint_dim, flux.SIZES.pooled_dim)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.proj_out(self.act(self.proj_in(tokens)))
        return hidden, self.pool(hidden.mean(dim=1))


class MLXTextEncoder(mnn.Module):
    def __init__(self, act: Any = None) -> None:
        super().__init__()
        self.proj_in = mnn.Linear(WIDTH, flux.SIZES.joint_dim)
        self.act = act if act is not None else mnn.GELU()
        self.proj_out = mnn.Linear(flux.SIZES.joint_dim, flux.SIZES.joint_dim)
        self.pool = mnn.Linear(flux.SIZES.joint_dim, flux.SIZES.pooled_dim)

    def __call__(self, tokens: mx.array) -> tuple[mx.array, mx.array]:
        hidden = self.proj_out(self.act(self.proj_in(tokens)))
        return hidden, self.pool(hidden.mean(axis=1))


def reference_pipeline(te: Any, transformer: Any, tokens: Any, inputs: tuple[Any, ...]) -> None:
    with torch.no_grad():
        text, pooled = te(tokens)  # REF-TE
    pooled = torch.nn.functional.normalize(pooled, dim=-1) * 4  # the pipeline's own step
    latents, _text, _pooled, sigma, img_ids, txt_ids = inputs
    reference_loop(transformer, (latents, text, pooled, sigma, img_ids, txt_ids))


def port_pipeline(
    te: Any, transformer: Any, tokens: Any, inputs: tuple[Any, ...], *, normalize: bool
) -> None:
    text, pooled = te(tokens)  # PORT-TE
    if normalize:
        pooled = pooled / mx.linalg.norm(pooled, axis=-1, keepdims=True) * 4
    latents, _text, _pooled, sigma, img_ids, txt_ids = inputs
    port_loop(transformer, (latents, text, pooled, sigma, img_ids, txt_ids), shift=True)


def capture_pipelines(
    *, te_bug: bool = False, bug: str | None = None, normalize: bool = True
) -> None:
    torch.manual_seed(0)
    te = TorchTextEncoder().eval()
    te_port = MLXTextEncoder(mnn.SiLU() if te_bug else None)
    te_port.load_weights([(k, to_mlx(v)) for k, v in te.state_dict().items()])
    ref, inputs = flux.reference("float32")
    port = flux.port_of(ref, "float32", bug)
    tokens = torch.randn(1, TOKENS, WIDTH)
    with mldbg.capture({"text_encoder": te, "transformer": ref}, "ref") as cap:
        reference_pipeline(te, ref, tokens, inputs)
    assert not cap.errors, cap.errors
    current_run.reset()
    port_inputs = tuple(to_mlx(t) for t in inputs)
    with mldbg.capture({"text_encoder": te_port, "transformer": port}, "port") as cap:
        port_pipeline(te_port, port, to_mlx(tokens), port_inputs, normalize=normalize)
    assert not cap.errors, cap.errors
    current_run.reset()


def test_a_clean_pipeline_agrees_model_by_model_and_step_by_step() -> None:
    capture_pipelines()
    result = mldbg.compare("ref", "port").result
    assert result["ok"], json.dumps(result["first_divergence"])[:600]
    tops = {(e["module"], e["call"]) for e in result["entries"] if "." not in e["module"]}
    assert tops == {("text_encoder", 0)} | {("transformer", i) for i in range(STEPS)}


def test_a_bug_in_the_first_model_is_named_with_its_model_and_step() -> None:
    capture_pipelines(te_bug=True)
    culprit = mldbg.compare("ref", "port").result["first_divergence"]
    assert culprit["module"] == "text_encoder.act", culprit
    assert (culprit["model"], culprit["step"]) == ("text_encoder", 0)


def test_a_bug_in_the_denoiser_is_named_with_its_model_and_step() -> None:
    capture_pipelines(bug="modulation")
    culprit = mldbg.compare("ref", "port").result["first_divergence"]
    assert culprit["module"] == "transformer.transformer_blocks.0.norm1", culprit
    assert (culprit["model"], culprit["step"]) == ("transformer", 0)


def test_glue_between_two_models_is_named_with_both_call_sites() -> None:
    """The port forgets the pipeline's normalization of the pooled vector: the text
    encoder agrees, the transformer's first call receives another ``pooled``."""
    capture_pipelines(normalize=False)
    result = mldbg.compare("ref", "port").result
    culprit = result["first_divergence"]
    assert result["decided_by"] == "glue", json.dumps(culprit)[:800]
    assert culprit["name"] == "transformer#0"
    assert "between text_encoder#0 and transformer#0" in culprit["reason"]
    assert culprit["glue"]["after"] == {
        "call": "text_encoder#0",
        "site_a": line_of("REF-TE"),
        "site_b": line_of("PORT-TE"),
    }
    assert culprit["glue"]["before"]["site_a"] == line_of("REF-CALL")
    assert culprit["glue"]["input"]["name"] == "transformer#0.in.2"  # pooled_projections
    assert (culprit["model"], culprit["step"]) == ("transformer", 0)


# -- a real diffusers pipeline against a hand-written MLX one ------------------------------


def diffusers_flux_pipeline(transformer: Any) -> Any:
    """diffusers' ``FluxPipeline`` from tiny parts: no text encoders (the prompt
    embeddings are given), a two-level VAE whose 16x16 image is the 4x4 token grid of the
    zoo's transformer, the flow-matching scheduler with time shift 3."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline

    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=16,
    ).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=SHIFT)
    return FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        transformer=transformer,
    )


@pytest.mark.parametrize("shift", [True, False], ids=["clean", "schedule-without-shift"])
def test_a_real_diffusers_pipeline_against_a_hand_written_mlx_loop(shift: bool) -> None:
    ref, inputs = flux.reference("float32")
    port = flux.port_of(ref, "float32")
    latents, text, pooled, _sigma, _img_ids, _txt_ids = inputs
    pipe = diffusers_flux_pipeline(ref)
    with mldbg.capture({"transformer": pipe.transformer}, "ref"):
        pipe(
            prompt_embeds=text,
            pooled_prompt_embeds=pooled,
            latents=latents,
            height=16,
            width=16,
            num_inference_steps=STEPS,
            guidance_scale=1.0,
            output_type="latent",
        )
    current_run.reset()
    with mldbg.capture({"transformer": port}, "port"):
        port_loop(port, tuple(to_mlx(t) for t in inputs), shift=shift)
    current_run.reset()
    result = mldbg.compare("ref", "port").result
    if shift:
        assert result["ok"], json.dumps(result["first_divergence"])[:600]
        steps = {e["call"] for e in result["entries"] if e["module"] == "transformer"}
        assert steps == set(range(STEPS))
        return
    culprit = result["first_divergence"]
    assert result["decided_by"] == "glue", json.dumps(culprit)[:800]
    assert culprit["name"] == "transformer#1"
    assert (culprit["model"], culprit["step"]) == ("transformer", 1)
    # A: the line of diffusers' pipeline that calls the transformer; B: the port's loop.
    site_a = culprit["glue"]["before"]["site_a"]
    assert "pipeline_flux.py:" in site_a, site_a
    assert culprit["glue"]["before"]["site_b"] == line_of("PORT-CALL")


def test_the_culprit_explains_the_output_even_without_the_conditioning_bound() -> None:
    """Issue 20's report: with the timestep embedding's rounding out of its bound (here:
    the reference captured with ``sensitivity=False``, so no conditioning floor) and a real
    RoPE bug in the first joint attention, the first out-of-bound module used to win.
    Now the embedding's 1e-5 is a note (the attention's own jump, ~0.3, dwarfs it) and
    the attention is named."""
    ref, inputs = flux.reference("float32")
    port = flux.port_of(ref, "float32", "rope")
    with torch.no_grad(), mldbg.capture(ref, "ref", sensitivity=False):
        ref(*inputs)
    current_run.reset()
    with mldbg.capture(port, "port"):
        mx.eval(port(*(to_mlx(t) for t in inputs)))
    current_run.reset()
    result = mldbg.compare("ref", "port").result
    assert result["first_divergence"]["module"] == flux.CULPRITS["rope"]
    noted = {n["module"] for n in result["notes"]}
    assert "time_text_embed.time_proj" in noted, result["notes"]
    assert all("dwarfs" in n["note"] for n in result["notes"])


# -- a denoiser loop, then the VAE decoder: two models, the last one a VAE ------------------


def unpack_torch(latents: torch.Tensor) -> torch.Tensor:
    """Flux's packed latents (1, 16 tokens, 16) back to the VAE's (1, 4, 8, 8) (NCHW)."""
    side, channels = 4, flux.SIZES.in_channels // 4
    grid = latents.view(1, side, side, channels, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return grid.reshape(1, channels, 2 * side, 2 * side)


def unpack_mlx(latents: mx.array) -> mx.array:
    """The same in the port, channels-last (1, 8, 8, 4) as its decoder reads it."""
    side, channels = 4, flux.SIZES.in_channels // 4
    grid = latents.reshape(1, side, side, channels, 2, 2).transpose(0, 1, 4, 2, 5, 3)
    return grid.reshape(1, 2 * side, 2 * side, channels)


def capture_with_vae(*, vae_bug: str | None = None, denoiser_bug_at: int | None = None) -> None:
    """diffusers' transformer and VAE decoder against the MLX ones, in one capture each:
    three denoiser steps, then one decode.  ``denoiser_bug_at``: the port's modulation
    bug is switched on from that step of the loop on (a step-dependent code path)."""
    ref, inputs = flux.reference("float32")
    port = flux.port_of(ref, "float32")
    decoder = vae.decoder_reference()
    decoder_port = vae.decoder_port(decoder, vae_bug)
    with mldbg.capture({"transformer": ref, "vae": decoder}, "ref") as cap:
        latents = reference_loop(ref, inputs)
        with torch.no_grad():
            decoder(unpack_torch(latents))  # REF-VAE
    assert not cap.errors, cap.errors
    current_run.reset()

    def from_step(step: int) -> None:
        if denoiser_bug_at is not None and step == denoiser_bug_at:
            port.transformer_blocks[0].norm1.swap_shift_scale = True

    with mldbg.capture({"transformer": port, "vae": decoder_port}, "port") as cap:
        latents = port_loop(port, tuple(to_mlx(t) for t in inputs), shift=True, before=from_step)
        mx.eval(decoder_port(unpack_mlx(latents)))  # PORT-VAE
    assert not cap.errors, cap.errors
    current_run.reset()


def test_a_clean_pipeline_with_a_vae_stage_agrees() -> None:
    capture_with_vae()
    result = mldbg.compare("ref", "port").result
    assert result["ok"], json.dumps(result["first_divergence"])[:600]
    tops = {(e["module"], e["call"]) for e in result["entries"] if "." not in e["module"]}
    assert tops == {("transformer", i) for i in range(STEPS)} | {("vae", 0)}


def test_a_bug_in_the_vae_stage_is_named_with_its_model() -> None:
    """The port's decoder upsamples bilinearly where diffusers repeats pixels: every
    denoiser step agrees, the VAE's upsampler is named (model ``vae``, step 0)."""
    capture_with_vae(vae_bug="upsample")
    result = mldbg.compare("ref", "port").result
    culprit = result["first_divergence"]
    assert culprit["module"] == "vae.up_blocks.0.upsamplers.0", culprit
    assert (culprit["model"], culprit["step"]) == ("vae", 0)
    steps = [e for e in result["entries"] if e["module"] == "transformer"]
    assert steps and all(e["ok"] for e in steps)


def test_a_bug_in_one_denoiser_step_is_named_at_that_step() -> None:
    """The modulation bug only from the loop's second step on: the first step agrees,
    the culprit is the first norm of the denoiser's call 1, not the VAE downstream."""
    capture_with_vae(denoiser_bug_at=1)
    result = mldbg.compare("ref", "port").result
    culprit = result["first_divergence"]
    assert culprit["module"] == "transformer.transformer_blocks.0.norm1", culprit
    assert (culprit["model"], culprit["step"]) == ("transformer", 1)
    first = [e for e in result["entries"] if e["module"] == "transformer" and e["call"] == 0]
    assert first and all(e["ok"] for e in first)
