"""The inline work of a module with children is measured too (issue 20, item 1).

diffusers' Flux and SD3 attention processors, and every hand-written MLX DiT, compute
q/k/v/out in ``Linear`` children and the softmax of q.k, the rotary embedding and SDPA
inline.  With large logits (``parity_zoo.large_logits``: QK-norm scales x4 in Flux, q/k
projections x8 in SD3) that inline softmax amplifies rounding, and before the capture
measured calls with children a *clean* port exited 1, blamed at an attention.  Now each
call whose subtree is one call deep is re-run twice at capture time (inputs perturbed:
its amplification; descendants' outputs rounded: its own sensitivity), and compare
bounds the attention by what its inputs' measured error and its own rounding explain.
A real bug inside that inline computation (a wrong softmax scale, RoPE pairs) is still
named at the attention that holds it.

Real diffusers models from tiny configs against the hand-written MLX ports of
``parity_zoo``, same weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
pytest.importorskip("diffusers")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("home"),
]  # real diffusers transformers, both frameworks

import mldbg  # noqa: E402
from mldbg.store import current_run  # noqa: E402
from parity_zoo import large_logits  # noqa: E402
from parity_zoo.core import ZooPort  # noqa: E402


def capture(z: ZooPort) -> tuple[Path, Path]:
    with mldbg.capture(z.ref, "ref") as ref:
        z.run_ref()
    current_run.reset()
    with mldbg.capture(z.port, "port") as port:
        z.run_port()
    current_run.reset()
    assert ref.path is not None and port.path is not None
    return ref.path, port.path


def verdict(result: dict[str, Any]) -> str:
    failing = [e for e in result["entries"] if not e["ok"]][:6]
    lines = [json.dumps(result["first_divergence"], default=str)[:600]]
    lines += [f"{e['name']} {e['rel_rms']:.3g} > {e['expected']:.3g}" for e in failing]
    return "\n".join(lines)


@pytest.mark.parametrize("arch", ["flux", "sd3"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_clean_port_with_large_logits_agrees(arch: str, dtype: str) -> None:
    capture(large_logits.build(arch, dtype))
    result = mldbg.compare("ref", "port").result
    assert result["ok"] and result["decided_by"] == "agreement", verdict(result)
    # The attention's bound comes from its own measurement, and says so.
    out = next(e for e in result["entries"] if e["name"] == "transformer_blocks.1.attn#0.out.0")
    assert out["conditioning"]["from"].endswith(".attn#0"), out["conditioning"]
    assert out["conditioning"]["amplification"] > 2, out["conditioning"]


@pytest.mark.parametrize(
    ("arch", "dtype", "bug"),
    [
        ("flux", "float32", "rope"),
        ("flux", "bfloat16", "softmax_scale"),
        ("sd3", "float32", "softmax_scale"),
        ("sd3", "bfloat16", "softmax_scale"),
    ],
)
def test_a_bug_inside_the_inline_attention_is_named_there(arch: str, dtype: str, bug: str) -> None:
    capture(large_logits.build(arch, dtype, bug))
    result = mldbg.compare("ref", "port").result
    assert not result["ok"], verdict(result)
    assert result["first_divergence"]["module"] == large_logits.CULPRIT, verdict(result)
    assert result["decided_by"] == "growth", verdict(result)


def test_without_the_inline_measurement_the_clean_port_is_blamed() -> None:
    """What compare saw before: the same clean capture with the measurements of calls
    with children taken out of the reference's index exits 1 at an attention."""
    ref, _port = capture(large_logits.build("flux", "float32"))
    index = ref / "index.jsonl"
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    parents = {line["parent"] for line in lines if line["event"] == "call"}
    for line in lines:
        if line["event"] == "return" and line["seq"] in parents:
            for field in ("sensitivity", "step", "amplification"):
                line.pop(field, None)
    index.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = mldbg.compare("ref", "port").result
    assert not result["ok"], verdict(result)
    assert result["first_divergence"]["module"].endswith(".attn"), verdict(result)
