"""Reasons from evidence (issue 33, item 4): what a verdict says is true of its entries.

* An fp16 port that overflows (transformers Llama in float32 against mlx-lm in float16,
  one ``down_proj`` channel at ~1.9e5) is named at ``down_proj`` as an overflow, with the
  reference's value beside the port's inf and a wider dtype as the fix; it read "every
  differing output has differing inputs" while its inputs agreed, and printed statistics
  of the finite elements without saying so.
* The weights hint only where parameters can explain the failure: not for an overflow,
  not for an attention all of whose children agree (the difference is its inline math).
* ``check.contradictions``, which the suite runs on every comparison it makes
  (``MLDBG_CHECK_VERDICTS``, set in conftest), finds a reason its entries contradict.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")

import mldbg  # noqa: E402
from mldbg.compare.culprit.check import contradictions  # noqa: E402
from mldbg.store import current_run  # noqa: E402
from mldbg.text import compare as compare_render  # noqa: E402
from mldbg.text.console import captured  # noqa: E402
from parity_zoo import flux  # noqa: E402
from parity_zoo import llama_family as lf  # noqa: E402
from parity_zoo.core import ZooPort  # noqa: E402

pytestmark = pytest.mark.usefixtures("home")  # a private run store (conftest)


def captured_pair(zoo: ZooPort) -> dict[str, Any]:
    """Capture the reference (sensitivity measured) and the port, compare at the defaults."""
    with mldbg.capture(zoo.ref, "ref"):
        zoo.run_ref()
    current_run.reset()
    with mldbg.capture(zoo.port, "port", sensitivity=False):
        zoo.run_port()
    current_run.reset()
    return mldbg.compare("ref", "port").result


def overflowing_llama() -> ZooPort:
    """The zoo's Llama with one ``down_proj`` row of layer 0 scaled up: the float32
    reference writes ~1.9e5 into that channel, the float16 port's 65504 cannot."""
    zoo = lf.build("llama", "float32")
    ref = copy.deepcopy(zoo.ref)
    with torch.no_grad():
        ref.model.layers[0].mlp.down_proj.weight[3] *= 2e5
    port = lf.mlx_model("llama", lf.SIZES.rope_theta, lf.SIZES)
    lf.load_from(port, ref)
    return ZooPort(
        "llama", "float32", None, ref, port, zoo.ref_inputs, zoo.port_inputs, None
    ).cast_port("float16")


def test_an_fp16_overflow_is_named_as_overflow_with_the_reference_value() -> None:
    result = captured_pair(overflowing_llama())
    culprit = result["first_divergence"]
    assert not result["ok"] and culprit is not None
    assert culprit["module"] == "model.layers.0.mlp.down_proj"
    assert culprit["reason"].startswith("inputs agree, outputs differ; overflow: float16 holds")
    assert "compute it in float32" in culprit["reason"]
    found = culprit["out_of_range"]
    assert found["kind"] == "overflow" and found["dtype"] == "float16"
    assert abs(found["reference"]) > 65504 and found["port"] in ("inf", "-inf")
    assert "weights_hint" not in result  # the fix is a dtype, not a parameter
    entry = next(e for e in result["entries"] if e["name"] == culprit["entries"][0])
    assert entry["finite_pairs"] < entry["numel"] and entry["port_nonfinite"] > 0
    with captured(width=300) as buffer:
        compare_render.show(result)
    text = buffer.getvalue()
    assert "overflow: float16 holds at most 65504" in text
    assert f"statistics over the {entry['finite_pairs']} of {entry['numel']} elements" in text
    assert contradictions(result) == []


def test_no_weights_hint_for_an_attention_whose_children_all_agree() -> None:
    """The single blocks' attention computes q/k/v (and their norms) in children that all
    agree, and pairs the rotary halves wrongly inline: its parameters cannot explain that,
    so "audit its parameters first" would send the user to the wrong place."""
    zoo = flux.build("float32", None)
    for block in zoo.port.single_transformer_blocks:
        block.attn.rope_halves = True
    result = captured_pair(zoo)
    culprit = result["first_divergence"]
    assert culprit is not None and culprit["module"] == "single_transformer_blocks.0.attn"
    assert culprit["reason"] == "inputs agree, outputs differ"
    assert "weights_hint" not in result


def entry(name: str, role: str, ok: bool, rel: float = 0.0, **extra: Any) -> dict[str, Any]:
    module, rest = name.split("#")
    return {
        "name": name,
        "module": module,
        "call": int(rest.split(".")[0]),
        "role": role,
        "ok": ok,
        "rel_rms": rel,
        "dtype_a": "F32",
        "dtype_b": "F32",
        **extra,
    }


def verdict(reason: str, named: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    module = named.split("#")[0]
    return {
        "ok": False,
        "decided_by": "growth",
        "entries": entries,
        "first_divergence": {
            "name": named,
            "module": module,
            "call": 0,
            "reason": reason,
            "entries": [named],
        },
    }


def test_the_checker_finds_a_reason_its_entries_contradict() -> None:
    """The Dropout-shifted pairing's verdict before item 2: an output that could not be
    compared, its inputs agreeing, named with "every differing output has differing
    inputs"; and an overflow claimed without a value beyond the range."""
    entries = [
        entry("ff.net.1#0.in.0", "in", True, 1e-7),
        entry("ff.net.1#0.out", "out", False, error="shapes differ"),
    ]
    claim = "every differing output has differing inputs; first entry that differs"
    found = contradictions(verdict(claim, "ff.net.1#0.out", entries))
    assert found and "ff.net.1#0.out's do not" in found[0]
    honest = "first entry that could not be compared: shapes differ"
    assert contradictions(verdict(honest, "ff.net.1#0.out", entries)) == []

    overflowed = [
        entry("proj#0.in.0", "in", True, 1e-7),
        entry("proj#0.out", "out", False, 1e-3, nonfinite_mismatched=2),
    ]
    says = "inputs agree, outputs differ; overflow: float16 holds at most 65504"
    assert "says overflow" in " ".join(contradictions(verdict(says, "proj#0.out", overflowed)))
    overflowed[1]["out_of_range"] = {
        "kind": "overflow",
        "dtype": "float16",
        "limit": 65504.0,
        "count": 2,
        "reference": 1.5e5,
        "port": "inf",
    }
    assert contradictions(verdict(says, "proj#0.out", overflowed)) == []
    wrong_inputs = [entry("proj#0.in.0", "in", False, 0.3), overflowed[1]]
    found = contradictions(verdict(says, "proj#0.out", wrong_inputs))
    assert found == ["says its inputs agree, yet proj#0.in.0 differs"]
