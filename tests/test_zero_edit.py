"""Zero-edit capture: unmodified scripts captured by ``start --capture`` and compared.

The two scripts in ``zero_edit_scripts/`` never mention mldbg: a transformers Llama
(which writes its weights and token ids) and its mlx-lm port (which loads them; its
first argument is the RoPE base, so a planted config slip needs no edit either).  They
run under the real daemon and agent, as a user would run them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import mldbg  # noqa: E402
from conftest import Api, Session, call, wait_until  # noqa: E402
from mldbg.compare import CompareInputError  # noqa: E402
from mldbg.text import compare as compare_render  # noqa: E402
from mldbg.text.console import captured  # noqa: E402
from mldbg.weights.audit import audit_weights  # noqa: E402

SCRIPTS = Path(__file__).parent / "zero_edit_scripts"
REFERENCE = "hf_llama_reference.py"
PORT = "mlx_lm_llama_port.py"


def run_captured(session: Session, script: str, *args: str, **capture: Any) -> dict[str, Any]:
    """Run ``script`` to its end under the debugger with ``capture`` options."""
    session.start(script, *args, stop_on_entry=False, **capture)

    def ended() -> dict[str, Any] | None:
        state: dict[str, Any] = session.wait(10.0)
        return None if state["state"] in ("starting", "running", "paused") else state

    state = wait_until(ended, timeout=240, what=f"{script} to end")
    assert state.get("exit_code") == 0, (state, session.output())
    return state


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    for name in (REFERENCE, PORT):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    return tmp_path


def captures_of(home: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for meta in (home / "runs").glob("*/captures/*/capture.json"):
        data = json.loads(meta.read_text())
        found[data["name"]] = data
    return found


def _measured_calls(home: Path, name: str) -> int:
    """How many of capture ``name``'s calls carry a measured sensitivity."""
    (index,) = (home / "runs").glob(f"*/captures/{name}/index.jsonl")
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    return sum(1 for line in lines if line["event"] == "return" and "sensitivity" in line)


def test_unmodified_transformers_and_mlx_lm_scripts_captured_and_compared(
    api: Api, scripts: Path, tmp_path: Path
) -> None:
    home = tmp_path / ".mldbg"
    sessions = [Session(api, f"ze{i}", tmp_path) for i in range(4)]
    try:
        # The operations inside the first attention too (torch functions, mx.fast calls).
        ops = {"capture_ops": ["model.layers.0.self_attn"]}
        run_captured(sessions[0], REFERENCE, capture="ref", capture_weights=True, **ops)
        run_captured(sessions[1], PORT, capture="port", capture_weights=True)
        run_captured(sessions[2], PORT, "1000000", capture="bug", **ops)  # RoPE base 100x
        # Replay, unmodified too: each port module fed the reference's captured inputs.
        run_captured(sessions[3], PORT, "1000000", capture="bug-replay", capture_replay="ref")
    finally:
        for s in sessions:
            s.end()
    found = captures_of(home)
    assert found["ref"]["framework"] == "torch"
    assert found["ref"]["model_class"].endswith("LlamaForCausalLM")
    assert found["port"]["framework"] == "mlx"
    assert found["port"]["state"] == found["ref"]["state"] == "complete"
    # The scripts' other module calls (none here) would be NAME.2...; one model each.
    assert not any(name.startswith("ref.") for name in found)

    clean = mldbg.compare("ref", "port", home=home)
    assert clean.ok, clean.first_divergence
    assert clean.result["counts"]["compared"] > 40  # every layer paired, kwargs and all
    buggy = mldbg.compare("ref", "bug", home=home)
    assert not buggy.ok
    assert buggy.first_divergence is not None
    assert buggy.first_divergence["module"] == "model.layers.0.self_attn"
    replayed = mldbg.compare("ref", "bug", replay="bug-replay", home=home)
    assert replayed.first_divergence["module"] == "model.layers.0.self_attn"
    assert replayed.first_divergence.get("local") is True  # named by its own local error
    hint = buggy.result["weights_hint"]  # inputs agree, outputs differ: weights first
    assert hint["module"] == "model.layers.0.self_attn"
    # not saved: both scripts run again with their parameters saved, then the audit
    starts = [c["args"] for c in hint["calls"] if c["verb"] == "start"]
    assert len(starts) == 2 and all(s["capture_weights"] is True for s in starts)
    assert hint["calls"][-1]["verb"] == "weights"
    (inside,) = buggy.result["ops"]
    assert inside["first_divergence"]["class_b"] == "fast.rope"
    with captured(width=300) as buffer:  # the human answer shows both next steps
        compare_render.show(buggy.result)
    text = buffer.getvalue()
    assert "weights: model.layers.0.self_attn" in text and "--capture-weights" in text
    assert "first diverging operation" in text and "fast.rope" in text

    # The parameters each model had at its first call, audited by capture name.
    audit = audit_weights("ref", "port", home=home)
    assert audit["ok"], audit["problems"]
    assert audit["counts"] == {"ok": found["ref"]["weights"]["tensors"]}
    with pytest.raises(CompareInputError, match="capture_weights"):
        audit_weights("ref", "bug", home=home)


def _top_level_calls(home: Path, name: str) -> list[dict[str, Any]]:
    (index,) = (home / "runs").glob(f"*/captures/{name}/index.jsonl")
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    return [line for line in lines if line["event"] == "call" and line["module"] == ""]


def test_generation_loops_that_split_the_prompt_differently_are_aligned(
    api: Api, scripts: Path, tmp_path: Path
) -> None:
    """transformers' generate (the prompt in one call) against mlx-lm's generate_step
    (the prompt's last token alone, one call ahead), both unmodified: the prefill is
    compared with the port's two calls joined, each step with its counterpart."""
    home = tmp_path / ".mldbg"
    sessions = [Session(api, f"gen{i}", tmp_path) for i in range(3)]
    try:
        run_captured(sessions[0], REFERENCE, "generate", capture="ref")
        run_captured(sessions[1], PORT, "10000", "generate", capture="port")
        run_captured(sessions[2], PORT, "1000000", "generate", capture="bug", capture_calls=3)
    finally:
        for s in sessions:
            s.end()
    # Every call of the MLX model recorded once, at the top (not again inside itself).
    port_calls = _top_level_calls(home, "port")
    assert [c["call"] for c in port_calls] == list(range(6))
    assert all(c["parent"] is None for c in port_calls)
    assert len(_top_level_calls(home, "bug")) == 3  # --capture-calls 3, each one closed
    (index,) = (home / "runs").glob("*/captures/bug/index.jsonl")
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    assert sum(1 for x in lines if x["event"] == "call") == sum(
        1 for x in lines if x["event"] == "return"
    )

    clean = mldbg.compare("ref", "port", home=home)
    assert clean.ok, clean.first_divergence
    aligned = clean.result["calls_aligned"]
    assert aligned["groups"][0] == {"a": [0], "b": [0, 1], "positions": 8}
    assert [g["b"] for g in aligned["groups"][1:]] == [[2], [3], [4]]
    assert aligned["unpaired_calls_b"] == [5]  # mlx-lm's call one token ahead
    joined = clean.entry("model.layers.1.mlp#0.out")
    assert joined["shape_a"] == joined["shape_b"] == [1, 8, 64]
    logits = clean.entry("lm_head#0.out")  # the reference kept the last position only
    assert logits["shape_b"] == [1, 1, 128] and logits["ok"]
    assert clean.entry("model.layers.1.mlp#3.out")["shape_b"] == [1, 1, 64]

    buggy = mldbg.compare("ref", "bug", home=home)
    assert not buggy.ok and buggy.first_divergence is not None
    assert buggy.first_divergence["module"] == "model.layers.0.self_attn"
    assert buggy.first_divergence["call"] == 0  # in the prefill, the port's calls joined
    with captured(width=300) as buffer:
        compare_render.show(clean.result)
    assert "calls aligned" in buffer.getvalue()


def test_one_command_makes_the_better_run(api: Api, scripts: Path, tmp_path: Path) -> None:
    """``start --capture ref64 --capture-precision float64``: the unmodified reference
    script runs its model in float64 for the capture (its float32 weights widened, its
    inputs cast as they arrive), and compare takes it as the better run."""
    home = tmp_path / ".mldbg"
    sessions = [Session(api, f"zb{i}", tmp_path) for i in range(3)]
    try:
        run_captured(sessions[0], REFERENCE, capture="ref")
        run_captured(sessions[1], REFERENCE, capture="ref64", capture_precision="float64")
        run_captured(sessions[2], PORT, capture="port")
    finally:
        for s in sessions:
            api.http.post(f"{s.base}/terminate")
    found = captures_of(home)
    assert found["ref64"]["precision"] == "float64" and found["ref64"]["state"] == "complete"
    (index,) = (home / "runs").glob("*/captures/ref64/index.jsonl")
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    logits = next(line for line in lines if line["event"] == "return" and line["seq"] == 0)
    assert {t["dtype"] for t in logits["tensors"].values()} == {"F64"}, logits
    result = mldbg.compare("ref", "port", better="ref64", home=home).result
    assert result["ok"] and result["better"]["mode"] == "precision", result["first_divergence"]
    judged = [e for e in result["entries"] if e.get("better")]
    assert judged and all(e["better"]["reference_rel_rms"] > 0 for e in judged)


def test_the_better_run_names_a_bf16_slip_the_rounding_bound_misses(
    api: Api, scripts: Path, tmp_path: Path
) -> None:
    """The better run at work, zero-edit throughout: the reference script in bfloat16
    (``ref``), the same script once more as ``--capture-precision float64`` (``ref64``),
    and a port whose layer-1 norm weight is 2% off (``norm=1.02``).  The rounding bound
    alone lets the norm's output pass (bfloat16's bound is several times what a clean
    port shows: the norm sits at 0.7 of it) and blames the MLP that amplifies the slip,
    or nothing; beside the float64 run the norm is named (1.8x its bound), by the
    daemon's compare verb."""
    home = tmp_path / ".mldbg"
    sessions = [Session(api, f"zbb{i}", tmp_path) for i in range(3)]
    try:
        run_captured(sessions[0], REFERENCE, "bfloat16", capture="ref")
        run_captured(
            sessions[1], REFERENCE, "bfloat16", capture="ref64", capture_precision="float64"
        )
        run_captured(sessions[2], PORT, "10000", "norm=1.02", capture="port")
    finally:
        for s in sessions:
            s.end()
    norm = "model.layers.1.post_attention_layernorm"
    plain = mldbg.compare("ref", "port", home=home).result
    within = next(e for e in plain["entries"] if e["name"] == f"{norm}#0.out")
    assert within["ok"] and within["headroom"] < 1, within  # under the rounding bound
    culprit = plain["first_divergence"]
    assert culprit is None or culprit["module"] != norm, culprit
    answer = call(api.client, "compare", None, a="ref", b="port", better="ref64", home=str(home))
    assert not answer["ok"] and answer["first_divergence"]["module"] == norm, answer
    judged = next(e for e in answer["entries"] if e["name"] == f"{norm}#0.out")
    assert not judged["better"]["ok"] and judged["headroom"] > 1, judged


def test_capture_options_are_checked_at_start(session: Session, scripts: Path) -> None:
    answer = session.start(REFERENCE, capture="ref", capture_budget="lots", expect=400)
    assert answer["code"] == "bad_argument"
    assert "byte size" in answer["error"]
    answer = session.start(REFERENCE, capture_depth=2, expect=400)
    assert answer["code"] == "bad_argument"
    assert "capture name" in answer["error"]
    answer = session.start(REFERENCE, capture_no_sensitivity=True, expect=400)
    assert answer["code"] == "bad_argument"
    assert "capture_no_sensitivity needs a capture name" in answer["error"]
    answer = session.start(REFERENCE, capture="ref", capture_precision="float16", expect=400)
    assert answer["code"] == "bad_argument"


def test_cli_start_capture_summary_then_calls_limit(
    cli: Any, scripts: Path, tmp_path: Path
) -> None:
    """The CLI spelling; a summary capture of the first call only, compared with a full one."""
    cli(
        "start",
        "--capture",
        "ref",
        "--capture-mode",
        "summary",
        "--capture-calls",
        "1",
        "--capture-weights",
        "--run",
        REFERENCE,
    )
    wait_until(
        lambda: cli("wait", "--max-wait", "10", json_out=True)["state"] == "exited",
        timeout=240,
        what="the reference to end",
    )
    cli(
        "start",
        "--capture",
        "port",
        "--capture-weights",
        "--capture-no-sensitivity",
        "--run",
        PORT,
    )
    wait_until(
        lambda: cli("wait", "--max-wait", "10", json_out=True)["state"] == "exited",
        timeout=240,
        what="the port to end",
    )
    found = captures_of(tmp_path / ".mldbg")
    assert found["ref"]["mode"] == "summary"
    # The reference's calls were measured (the default), the port's were not.
    assert _measured_calls(tmp_path / ".mldbg", "ref") > 0
    assert _measured_calls(tmp_path / ".mldbg", "port") == 0
    budget = found["ref"]["budget"]
    # At most one 1021-float64 sketch (and a header) per tensor, whatever its size.
    assert budget["used"] <= found["ref"]["tensors"] * (8 * 1021 + 4096)
    assert budget["full_bytes"] > 0 and budget["limit"] is None
    result = mldbg.compare("ref", "port", home=tmp_path / ".mldbg")
    assert result.ok, result.first_divergence
    assert all(e.get("estimated") for e in result.entries)
    # The weights both models had at their first call, audited by capture name.
    audit = cli("weights", "ref", "port", json_out=True)
    assert audit["ok"] and audit["problems"] == [], audit
