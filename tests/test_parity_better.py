"""Tight bounds from a better reference (issue 33, item 7).

The scale-aware bound is what a clean port *may* accumulate (``2 u sqrt(1 + d)``); in
bfloat16 that is several times what clean ports show.  With a run of the reference that
rounds less (``compare A B --better C``: the same weights in float64,
``mldbg.capture(..., precision="float64")``), each entry is also judged by the port's
error against C beside the reference's own, so a bfloat16 bug below the old bound is
named; a quantized port is judged against the reference run on its dequantized weights,
held to its own rounding, so a 4-bit bug under the quantization's noise is named.  The
clean ports pass either way.

Real transformers references and mlx-lm ports (``parity_zoo.llama_family``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")
pytest.importorskip("transformers")

import mldbg  # noqa: E402
from mldbg.compare import CompareInputError  # noqa: E402
from mldbg.store import current_run  # noqa: E402
from parity_zoo import llama_family  # noqa: E402
from parity_zoo.core import ZooPort, dequantized_reference  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("home")]  # real models, three runs
NORM = "model.layers.1.post_attention_layernorm"


def scaled_norm(z: ZooPort, factor: float) -> ZooPort:
    """The bug: layer 1's post-attention norm weight off by ``factor`` (a conversion that
    rounded or mis-scaled one norm): its outputs' relative error is ``factor - 1``."""
    norm = z.port.model.layers[1].post_attention_layernorm
    norm.weight = norm.weight * factor
    return z


def capture(z: ZooPort, better: Any = None) -> None:
    """``ref``, ``port`` and, given, the better run ``ref64`` (a reference model)."""
    with mldbg.capture(z.ref, "ref"):
        z.run_ref()
    current_run.reset()
    with mldbg.capture(z.port, "port"):
        z.run_port()
    current_run.reset()
    if better is not None:
        with torch.no_grad(), mldbg.capture(better, "ref64", precision="float64"):
            better(*z.ref_inputs)
        current_run.reset()


def verdict(result: dict[str, Any]) -> str:
    failing = [e for e in result["entries"] if not e["ok"]][:6]
    lines = [json.dumps(result["first_divergence"], default=str)[:600]]
    lines += [
        f"{e['name']} {e['rel_rms']:.3g} > {e['expected']:.3g} {e.get('better')}" for e in failing
    ]
    return "\n".join(lines)


def entry(result: dict[str, Any], name: str) -> dict[str, Any]:
    return next(e for e in result["entries"] if e["name"] == name)


def test_a_clean_bf16_port_passes_on_sharper_bounds() -> None:
    z = llama_family.build("llama", "bfloat16")
    capture(z, z.ref)
    plain = mldbg.compare("ref", "port").result
    result = mldbg.compare("ref", "port", better="ref64").result
    assert plain["ok"] and result["ok"] and result["decided_by"] == "agreement", verdict(result)
    assert result["better"]["mode"] == "precision"
    logits, plain_logits = entry(result, "<root>#0.out.logits"), entry(plain, "<root>#0.out.logits")
    # The bound comes from the reference's own error against the float64 run: tighter.
    assert logits["test"] == "better" and logits["expected"] < plain_logits["expected"], logits
    better = logits["better"]
    assert better["ok"] and better["rel_rms"] <= better["bound"], better
    assert 0 < better["reference_rel_rms"] < plain_logits["expected"] / 3, better
    # Every judged entry says how close it came to its bound.
    assert all("headroom" in e for e in result["entries"] if e.get("expected"))
    assert logits["headroom"] > plain_logits["headroom"]


def test_a_bf16_bug_below_the_old_bound_is_named_through_the_better_run() -> None:
    z = scaled_norm(llama_family.build("llama", "bfloat16"), 1.015)
    capture(z, z.ref)
    plain = mldbg.compare("ref", "port").result
    assert plain["ok"], verdict(plain)  # 0.48 of its bound: what the old bound missed
    result = mldbg.compare("ref", "port", better="ref64").result
    assert not result["ok"], verdict(result)
    assert result["first_divergence"]["module"] == NORM, verdict(result)
    judged = entry(result, f"{NORM}#0.out")
    assert not judged["better"]["ok"] and judged["headroom"] > 1, judged


def test_a_bf16_bug_the_old_bound_blamed_elsewhere_is_named_at_its_module() -> None:
    """3% off: the old bound let the norm's output pass and named the MLP that
    amplifies it (inline, by its down projection's input)."""
    z = scaled_norm(llama_family.build("llama", "bfloat16"), 1.03)
    capture(z, z.ref)
    plain = mldbg.compare("ref", "port").result
    assert plain["first_divergence"]["module"] == "model.layers.1.mlp", verdict(plain)
    result = mldbg.compare("ref", "port", better="ref64").result
    assert result["first_divergence"]["module"] == NORM, verdict(result)
    assert result["decided_by"] == "growth", verdict(result)


def test_a_bf16_bug_at_twice_the_old_bound_is_named_with_more_headroom() -> None:
    z = scaled_norm(llama_family.build("llama", "bfloat16"), 1.06)
    capture(z, z.ref)
    plain = mldbg.compare("ref", "port").result
    result = mldbg.compare("ref", "port", better="ref64").result
    for found in (plain, result):
        assert found["first_divergence"]["module"] == NORM, verdict(found)
    name = f"{NORM}#0.out"
    assert 1.5 < entry(plain, name)["headroom"] < 3, entry(plain, name)
    assert entry(result, name)["headroom"] > 2 * entry(plain, name)["headroom"]


def test_a_4bit_bug_under_the_quantization_noise_is_named_against_the_dequantized_run() -> None:
    clean = llama_family.build("qwen3", "float32", quantize=(4, 64), layers=4)
    capture(clean, dequantized_reference(clean))
    result = mldbg.compare("ref", "port", better="ref64").result
    assert result["ok"] and result["decided_by"] == "agreement", verdict(result)
    assert result["better"]["mode"] == "port weights"
    logits = entry(result, "<root>#0.out.logits")
    assert "quant_noise" not in logits, logits  # held to its own rounding
    assert logits["better"]["reference_rel_rms"] > 100 * logits["rel_rms"], logits

    bug = scaled_norm(llama_family.build("qwen3", "float32", quantize=(4, 64), layers=4), 1.01)
    capture(bug, dequantized_reference(bug))
    plain = mldbg.compare("ref", "port").result
    assert plain["ok"] and plain["decided_by"] == "quantized", verdict(plain)  # noise to it
    result = mldbg.compare("ref", "port", better="ref64").result
    assert not result["ok"], verdict(result)
    assert result["first_divergence"]["module"] == NORM, verdict(result)
    assert entry(result, f"{NORM}#0.out")["headroom"] > 100


def test_a_better_run_on_the_references_weights_cannot_judge_a_quantized_port() -> None:
    z = llama_family.build("qwen3", "float32", quantize=(4, 64), layers=2)
    capture(z, z.ref)
    with pytest.raises(CompareInputError) as refused:
        mldbg.compare("ref", "port", better="ref64")
    assert refused.value.code == "bad_argument"
    assert "dequantized weights" in str(refused.value)


def test_the_cli_takes_a_better_run() -> None:
    z = scaled_norm(llama_family.build("llama", "bfloat16"), 1.03)
    capture(z, z.ref)
    proc = subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", "ref", "port", "--better", "ref64", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert proc.returncode == 1, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["better"]["mode"] == "precision"
    assert answer["first_divergence"]["module"] == NORM
    human = subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", "ref", "port", "--better", "ref64"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "300"},
    )
    assert human.returncode == 1, human.stderr
    assert "x bound" in human.stdout  # each entry's error over its bound, beside it


def test_replay_sets_aside_a_4bit_gemmas_moved_embedding_scale() -> None:
    """transformers scales Gemma's embeddings by sqrt(hidden) inside ``embed_tokens``,
    mlx-lm right after it: a boundary difference (x8 here).  Quantized to 4 bits, the
    embedding's bound holds the quantization's noise (0.39), which used to hide that
    exact scale from replay's boundary test: replay named the clean port's
    ``embed_tokens``, exit 1.  The noise moves the norms' ratio by its square only."""
    import mlx.nn as mnn

    from parity_zoo import gemma

    z = gemma.build("float32")
    mnn.quantize(z.port, group_size=64, bits=4)
    capture(z)
    replayed = mldbg.replay(z.port, "ref")
    assert replayed.culprit is None, replayed.culprit
    result = mldbg.compare("ref", "port", replay=replayed.capture).result
    assert result["ok"] and result["first_divergence"] is None, verdict(result)
    assert entry(result, "model.embed_tokens#0.out")["local"]["ok"]
