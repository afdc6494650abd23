"""Parity end to end: capture a reference and a port, compare them, name the bug.

The pairs come from ``parity_models``: a transformers Llama against mlx-lm with the same
weights, two PyTorch implementations with different module names, a conv net in NCHW
(torch) against NHWC (MLX), and a bf16 MLP.  A clean port must compare clean; a port
with one deliberate mistake must be named at exactly the module holding it — through
the Python API and through the CLI (its exit code, ``--json`` and ``--html``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")
pytest.importorskip("transformers")

import mldbg  # noqa: E402
from mldbg.store import current_run  # noqa: E402
from parity_models import Pair, conv_pair, llama_pair, mlp_bf16_pair, torch_pair  # noqa: E402

pytestmark = pytest.mark.usefixtures("home")  # a private run store (conftest)


def capture_both(pair: Pair, *, inputs: bool = True) -> tuple[mldbg.Capture, mldbg.Capture]:
    """Capture the reference as ``ref`` and the port as ``port``, each in its own run."""
    with mldbg.capture(pair.ref, "ref", inputs=inputs) as ref:
        pair.run_ref()
    current_run.reset()
    with mldbg.capture(pair.port, "port", inputs=inputs) as port:
        pair.run_port()
    current_run.reset()
    assert not ref.errors and not port.errors
    return ref, port


def name_map(pair: Pair) -> dict[str, Any] | None:
    if not pair.name_map:
        return None
    return {"regex": [[pattern, replacement] for pattern, replacement in pair.name_map.items()]}


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "MLDBG_HOME": str(home), "NO_COLOR": "1"},
    )


def failing_modules(result: dict[str, Any]) -> set[str]:
    return {e["module"] for e in result["entries"] if not e["ok"]}


# -- Llama: transformers vs mlx-lm --------------------------------------------------------


def test_clean_llama_port_compares_clean_over_every_shared_module(home: Path) -> None:
    pair = llama_pair()
    ref, port = capture_both(pair)
    comparison = mldbg.compare(ref, port)
    result = comparison.result
    assert comparison.ok and result["first_divergence"] is None
    assert result["counts"]["failed"] == 0
    compared = {e["module"] for e in result["entries"]}
    # Every module of the reference that the port also has got its output compared:
    # only torch's rotary embedding and activation modules (mlx-lm computes those
    # inline) and mlx-lm's rope modules are one-sided.
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict)  # never called themselves
    ref_modules = {
        m for m, mod in pair.ref.named_modules() if m and not isinstance(mod, containers)
    } | {"<root>"}
    one_sided = re.compile(r"(^model\.rotary_emb$|\.act_fn$)")
    expected = {m for m in ref_modules if not one_sided.search(m)}
    assert expected <= compared, sorted(expected - compared)
    assert all(".rope#" in name for name in result["unpaired_b"] if "#0.out" in name)
    outputs = [e for e in result["entries"] if e["role"] == "out"]
    assert all(e["dtype_a"] == "F32" and e["dtype_b"] == "F32" for e in outputs)
    # The logits arrive as a ModelOutput field on one side and a bare array on the other.
    assert any(e["name"].startswith("<root>#0.out") for e in outputs)


@pytest.mark.parametrize(
    ("bug", "module"),
    [
        ("mlp_activation", "model.layers.1.mlp"),
        ("norm_eps", "model.layers.1.input_layernorm"),
    ],
)
def test_llama_port_bug_is_named_at_its_module(home: Path, bug: str, module: str) -> None:
    pair = llama_pair(bug=bug)
    assert pair.bug_module == module
    capture_both(pair)
    result = mldbg.compare("ref", "port").result
    assert not result["ok"]
    culprit = result["first_divergence"]
    assert culprit is not None and culprit["module"] == module
    assert culprit["call"] == 0
    # Victims downstream diverge too, but none of them is named.
    assert "model.layers.2" in failing_modules(result)
    assert all(e["culprit"] == (e["name"] in culprit["entries"]) for e in result["entries"])
    assert all(e["module"] == module for e in result["entries"] if e["culprit"])


def test_llama_bug_through_the_cli_json_and_html(home: Path, tmp_path: Path) -> None:
    capture_both(llama_pair(bug="norm_eps"))
    report = tmp_path / "report.html"
    run = cli(home, "ref", "port", "--json", "--html", str(report))
    assert run.returncode == 1, run.stderr
    result = json.loads(run.stdout)
    assert result["ok"] is False
    assert result["first_divergence"]["module"] == "model.layers.1.input_layernorm"
    entry = result["entries"][0]
    for key in ("name", "shape_a", "shape_b", "dtype_a", "dtype_b", "max_abs", "mean_abs"):
        assert key in entry
    for key in ("max_rel", "cosine", "ok"):
        assert key in entry
    assert isinstance(result["unpaired_a"], list) and isinstance(result["unpaired_b"], list)
    page = report.read_text()
    assert "model.layers.1.input_layernorm" in page and "http://" not in page.replace(
        "http://www.w3.org", ""
    )

    human = cli(home, "ref", "port")
    assert human.returncode == 1
    assert "model.layers.1.input_layernorm" in human.stdout
    assert "first divergence" in human.stdout.lower()


def test_clean_llama_through_the_cli_exits_zero(home: Path) -> None:
    capture_both(llama_pair())
    run = cli(home, "ref", "port", "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["ok"] is True


def test_without_inputs_the_first_diverging_output_is_named(home: Path) -> None:
    """No inputs recorded: the culprit is the first output to go wrong, in execution order."""
    pair = llama_pair(bug="norm_eps")
    capture_both(pair, inputs=False)
    result = mldbg.compare("ref", "port").result
    assert all(e["role"] == "out" for e in result["entries"])
    assert result["first_divergence"]["module"] == "model.layers.1.input_layernorm"


# -- two PyTorch implementations with different names -------------------------------------


def test_two_torch_implementations_clean_with_a_map(home: Path, tmp_path: Path) -> None:
    pair = torch_pair()
    capture_both(pair)
    without = mldbg.compare("ref", "port", map=None).result
    assert without["counts"]["compared"] < 10  # the names barely meet without the map
    mapped = mldbg.compare("ref", "port", map=name_map(pair)).result
    assert mapped["ok"] and mapped["counts"]["compared"] > 30
    # The fused qkv projection has no counterpart; the separate q/k/v ones neither.
    assert all(".qkv#" in name for name in mapped["unpaired_b"])
    assert all(re.search(r"\.[qkv]_proj#", name) for name in mapped["unpaired_a"])

    map_file = tmp_path / "map.json"
    map_file.write_text(json.dumps(name_map(pair)))
    run = cli(home, "ref", "port", "--map", str(map_file), "--json")
    assert run.returncode == 0, run.stdout + run.stderr


def test_two_torch_implementations_bug_is_named(home: Path, tmp_path: Path) -> None:
    pair = torch_pair(bug="softmax_scale")
    capture_both(pair)
    map_file = tmp_path / "map.json"
    map_file.write_text(json.dumps(name_map(pair)))
    run = cli(home, "ref", "port", "--map", str(map_file), "--json")
    assert run.returncode == 1, run.stdout + run.stderr
    culprit = json.loads(run.stdout)["first_divergence"]
    assert culprit["module"] == pair.bug_module == "layers.1.attn"


# -- conv: NCHW vs NHWC --------------------------------------------------------------------


def test_conv_nchw_against_nhwc_is_clean_through_the_transpose(home: Path) -> None:
    pair = conv_pair()
    ref, port = capture_both(pair)
    result = mldbg.compare(ref, port).result
    assert result["ok"] and not result["unpaired_a"] and not result["unpaired_b"]
    layouts = {e["module"]: e["layout"] for e in result["entries"] if e["role"] == "out"}
    assert layouts["stem"] == layouts["blocks.1.act"] == "NHWC→NCHW"
    assert layouts["head"] is None  # 2-D outputs have one layout
    conv_entry = next(e for e in result["entries"] if e["name"] == "stem#0.out")
    assert conv_entry["shape_a"] == [1, 8, 16, 16] and conv_entry["shape_b"] == [1, 16, 16, 8]


def test_conv_bug_is_named_through_the_transpose(home: Path) -> None:
    pair = conv_pair(bug="activation")
    capture_both(pair)
    result = mldbg.compare("ref", "port").result
    assert result["first_divergence"]["module"] == "blocks.1.act"
    assert "blocks.1.conv" not in failing_modules(result)


# -- bf16 ----------------------------------------------------------------------------------


def test_bf16_is_stored_as_bf16_and_compared_with_bf16_tolerances(home: Path) -> None:
    pair = mlp_bf16_pair()
    ref, port = capture_both(pair)
    result = mldbg.compare(ref, port).result
    assert result["ok"]
    for entry in result["entries"]:
        assert entry["dtype_a"] == entry["dtype_b"] == "BF16"
        assert entry["rtol"] == pytest.approx(1.6e-2) and entry["atol"] == pytest.approx(1e-5)


def test_bf16_bug_is_named(home: Path) -> None:
    pair = mlp_bf16_pair(bug="bias")
    capture_both(pair)
    result = mldbg.compare("ref", "port").result
    assert result["first_divergence"]["module"] == "fc2"
    # Forcing a tolerance loose enough for a 0.5 bias error makes the run agree.
    assert mldbg.compare("ref", "port", atol=4.0, rtol=0.0).ok


# -- bad input -----------------------------------------------------------------------------


def test_mismatched_shapes_between_captures_are_reported(home: Path) -> None:
    """Different models meeting only at ``<root>``: nothing comparable is bad input (2)."""
    capture_both(mlp_bf16_pair())
    pair = conv_pair()
    with mldbg.capture(pair.ref, "other"):
        pair.run_ref()
    current_run.reset()
    run = cli(home, "ref", "other", "--json")
    assert run.returncode == 2, run.stdout + run.stderr
    error = json.loads(run.stdout)
    assert error["code"] == "nothing_comparable"
    assert "shapes differ: [8, 32] vs [1, 3, 16, 16]" in error["error"]
