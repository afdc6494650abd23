"""The rounding of a call's inline work is measured (issue 33, item 1).

A DiT whose ``time_embed`` computes ``[cos, sin](t * freqs)`` in its own forward, with
``t`` up to 1000, then calls its ``Linear`` children (``parity_zoo.inline_dit``): the
float32 rounding of ``t * freqs`` moves the sines by ~1e-5 relative, and before the
capture measured the rounding of a call's intermediates (it perturbed a parent's inputs
and its children's outputs, never what its own inline code computes), the clean
``time_embed#0`` "differed", the glue rule's "every output before it agrees" never
held, and a schedule bug between denoiser calls was blamed on ``time_embed#1``.  Now
the rounding re-run of a call with children also rounds every intermediate its own
code computes, and:

* the clean loop agrees;
* the schedule bug is glue code, named with both call sites;
* ``--replay`` does not blame ``time_embed#0``'s pure rounding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")

import mldbg  # noqa: E402
from mldbg.store import current_run  # noqa: E402
from parity_zoo import inline_dit  # noqa: E402
from parity_zoo.core import to_mlx  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("home")]  # two models, three steps


def capture_loops(*, shift: bool) -> tuple[inline_dit.TorchDiT, inline_dit.MLXDiT]:
    ref, port, latents = inline_dit.build()
    with mldbg.capture(ref, "ref") as cap:
        inline_dit.reference_loop(ref, latents)
    assert not cap.errors, cap.errors
    current_run.reset()
    with mldbg.capture(port, "port") as cap:
        inline_dit.port_loop(port, to_mlx(latents), shift=shift)
    assert not cap.errors, cap.errors
    current_run.reset()
    return ref, port


def line_of(marker: str) -> str:
    """``file:line`` of the line of the fixture that carries ``marker``."""
    path = Path(inline_dit.__file__).resolve()
    lines = path.read_text().splitlines()
    number = next(i for i, text in enumerate(lines, 1) if f"# {marker}" in text)
    return f"{path}:{number}"


def verdict(result: dict[str, Any]) -> str:
    failing = [e for e in result["entries"] if not e["ok"]][:8]
    lines = [json.dumps(result["first_divergence"], default=str)[:800]]
    lines += [f"{e['name']} {e['rel_rms']} > {e['expected']}" for e in failing]
    return "\n".join(lines)


def sensitivities(path: Path, module: str) -> list[float]:
    """The measured ``sensitivity`` of each call of ``module`` in a capture."""
    lines = [json.loads(x) for x in (path / "index.jsonl").read_text().splitlines()]
    seqs = {r["seq"] for r in lines if r["event"] == "call" and r["module"] == module}
    return [
        r["sensitivity"]
        for r in lines
        if r["event"] == "return" and "sensitivity" in r and r["seq"] in seqs
    ]


def test_both_frameworks_measure_the_rounding_of_the_inline_sinusoid() -> None:
    """``time_embed`` reads an exact timestep; its own rounding is that of ``t * freqs``
    and the sines of it, ~1000 steps at t = 1000, not the one step its children's
    outputs make.  Measured the same way in PyTorch (every torch operation's result
    rounded) and MLX (``mx`` functions' results, and the arguments of its sines)."""
    ref, port, latents = inline_dit.build()
    with mldbg.capture(ref, "ref") as cap_ref:
        inline_dit.reference_loop(ref, latents)
    with mldbg.capture(port, "port") as cap_port:
        inline_dit.port_loop(port, to_mlx(latents))
    step = 2.0**-24
    for cap in (cap_ref, cap_port):
        assert cap.path is not None
        found = sensitivities(cap.path, "time_embed")
        assert len(found) == inline_dit.STEPS
        assert all(s > 50 * step for s in found), found
        # A block's inline work (a SiLU, a modulation) rounds like any op (measured
        # once: its kind proved benign, later calls are not re-run).
        blocks = sensitivities(cap.path, "blocks.0")
        assert blocks and all(s < 20 * step for s in blocks), cap.path


def test_the_clean_loop_agrees_on_the_inline_sinusoid() -> None:
    capture_loops(shift=True)
    result = mldbg.compare("ref", "port").result
    assert result["ok"] and result["decided_by"] == "agreement", verdict(result)
    # The embedding's bound is its own measured rounding, and says so.
    out = next(e for e in result["entries"] if e["name"] == "time_embed#0.out")
    assert out["conditioning"]["from"] == "time_embed#0", out.get("conditioning")


def test_a_schedule_bug_is_glue_with_both_call_sites() -> None:
    capture_loops(shift=False)
    result = mldbg.compare("ref", "port").result
    culprit = result["first_divergence"]
    assert result["decided_by"] == "glue", verdict(result)
    assert culprit["name"] == "<root>#1", verdict(result)
    ref_site, port_site = line_of("REF-CALL"), line_of("PORT-CALL")
    assert culprit["glue"]["after"] == {"call": "<root>#0", "site_a": ref_site, "site_b": port_site}
    assert culprit["glue"]["before"] == {
        "call": "<root>#1",
        "site_a": ref_site,
        "site_b": port_site,
    }
    # The first call agrees entirely, its inline sinusoid included.
    first = [e for e in result["entries"] if e["call"] == 0]
    assert first and all(e["ok"] for e in first), verdict(result)


def test_replay_does_not_blame_the_embeddings_rounding() -> None:
    _ref, port = capture_loops(shift=True)
    replayed = mldbg.replay(port, "ref")
    result = mldbg.compare("ref", "port", replay=replayed).result
    assert result["ok"], verdict(result)
    assert result["replay_culprit"] is None, json.dumps(result["replay_culprit"])
    local = next(e for e in result["entries"] if e["name"] == "time_embed#0.out")["local"]
    assert local["ok"], local
