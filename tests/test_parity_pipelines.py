"""Glue code named (issue 20, item 3): a bug between two calls of a captured model.

A flow-matching loop, written twice: diffusers' ``FlowMatchEulerDiscreteScheduler`` (time
shift 3) driving diffusers' tiny Flux transformer, and a hand-written MLX loop driving the
MLX port (``parity_zoo.flux``) with its own sigma schedule.  One capture holds every
denoiser call of the loop (``<root>#0``, ``<root>#1``, ...).  A port whose schedule
forgets the time shift gives the denoiser the same first call (sigma 1 is 1 shifted or
not) and different latents and timestep from the second call on: compare must say that
the difference enters between the calls, show the first differing input side by side,
and give the line of each script that made each call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
pytest.importorskip("diffusers")
pytestmark = pytest.mark.slow  # a real diffusers transformer and scheduler

import mldbg  # noqa: E402
from mldbg import current_run  # noqa: E402
from parity_zoo import flux  # noqa: E402
from parity_zoo.core import to_mlx  # noqa: E402

STEPS = 3
SHIFT = 3.0


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / "store"))
    current_run.reset()
    yield tmp_path / "store"
    current_run.reset()


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


def port_loop(model: Any, inputs: tuple[Any, ...], *, shift: bool) -> mx.array:
    latents, text, pooled, _sigma, img_ids, txt_ids = inputs
    sigmas = port_sigmas(shift)
    for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
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


def test_a_schedule_bug_is_named_as_glue_code_with_both_call_sites() -> None:
    capture_loops(shift=False)
    result = mldbg.compare("ref", "port").result
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
