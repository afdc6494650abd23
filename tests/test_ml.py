"""The engine on real model code: torch and MLX tensors, and a breakpoint inside transformers."""

from __future__ import annotations

import inspect
import sys

import pytest

from conftest import Session, line_of

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # real models, both frameworks


def test_tensor_eval_is_summarized_not_printed(session: Session, write) -> None:
    script = write(
        "tensors.py",
        """
        import torch
        big = torch.arange(10_000_000, dtype=torch.float32).reshape(1000, 10_000)
        half = torch.tensor([1.5, -2.0, float("nan")], dtype=torch.bfloat16)
        print("ready")  # stop
    """,
    )
    session.start(
        script,
        python=sys.executable,
        breakpoints=[{"file": str(script), "line": line_of(script, "stop")}],
    )
    assert session.cont()["reason"] == "breakpoint"
    result = session.eval("big")
    assert result["type"] == "torch.Tensor"
    assert len(result["result"]) < 1000  # one line, not ten million numbers
    summary = result["summary"]
    assert (
        summary["shape"] == [1000, 10_000]
        and summary["dtype"] == "float32"
        and summary["device"] == "cpu"
    )
    assert summary["stats"]["min"] == 0 and summary["stats"]["max"] == 9_999_999
    assert summary["preview"][:3] == [0.0, 1.0, 2.0]
    half = session.eval("half")["summary"]
    assert half["dtype"] == "bfloat16" and half["stats"]["nan"] == 1
    assert half["stats"]["min"] == -2.0 and half["stats"]["max"] == 1.5
    variables = {v["name"]: v for v in session.call("vars")["variables"]}
    assert (
        variables["big"]["type"] == "torch.Tensor"
        and "float32[1000, 10000]" in variables["big"]["summary"]
    )
    assert session.eval("big.sum().item()")["type"] == "float"


def test_large_tensor_summary_is_fast(session: Session, write) -> None:
    script = write(
        "huge.py",
        """
        import torch
        huge = torch.randn(100_000_000)
        print("made")  # stop
    """,
    )
    session.start(
        script,
        python=sys.executable,
        breakpoints=[{"file": str(script), "line": line_of(script, "stop")}],
    )
    session.cont(wait=30)
    summary = session.eval("huge")["summary"]  # its speed is measured in benchmarks/
    assert summary["numel"] == 100_000_000
    assert abs(summary["stats"]["mean"]) < 0.01 and abs(summary["stats"]["std"] - 1) < 0.01


def test_mlx_arrays_are_summarized_lazily_and_evaluated_on_request(session: Session, write) -> None:
    pytest.importorskip("mlx.core")
    script = write(
        "mlx_prog.py",
        """
        import mlx.core as mx
        a = mx.arange(12, dtype=mx.float32).reshape(3, 4)
        lazy = (a * 2).astype(mx.bfloat16)  # not evaluated yet
        print("ok")  # stop
    """,
    )
    session.start(
        script,
        python=sys.executable,
        breakpoints=[{"file": str(script), "line": line_of(script, "stop")}],
    )
    state = session.cont(wait=30)
    # every stop says what MLX's allocator holds, and the process
    assert set(state["memory"]["mlx"]) == {"active_bytes", "peak_bytes", "cache_bytes", "device"}
    assert state["memory"]["process"]["rss_bytes"] > 0
    # listing variables shows the lazy array as it is: shape, dtype, not evaluated
    listed = session.call("vars")["variables"]
    line = next(v["summary"] for v in listed if v["name"] == "lazy")
    assert "bfloat16[3, 4]" in line and "not evaluated" in line, line
    before = session.value("mx.get_active_memory()")
    session.call("vars")
    assert session.value("mx.get_active_memory()") == before  # vars allocated nothing
    result = session.eval("lazy")  # asked for: evaluated, and it says so
    assert result["type"] == "mlx.core.array"
    summary = result["summary"]
    assert summary["shape"] == [3, 4] and summary["dtype"] == "bfloat16"
    assert summary["stats"]["max"] == 22.0 and summary["preview"][:3] == [0.0, 2.0, 4.0]
    assert "evaluated now" in summary["note"] and "evaluated now" in result["result"]
    assert session.value("a.sum().item()") == "66.0"  # evaluation runs on the paused thread


def test_breakpoint_inside_transformers_llama(session: Session, write) -> None:
    pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    # The function's own code, past any decorator's wrapper (transformers 5 wraps forward
    # in another module): file and line both come from the function the line is in.
    forward = inspect.unwrap(modeling_llama.LlamaAttention.forward)
    source, start = inspect.getsourcelines(forward)
    offset = next(i for i, text in enumerate(source) if "attn_output = attn_output.reshape" in text)
    library_file = inspect.getsourcefile(forward)
    library_line = start + offset
    script = write(
        "llama.py",
        """
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        model = LlamaForCausalLM(config).eval()
        with torch.no_grad():
            logits = model(torch.tensor([[1, 2, 3, 4, 5]])).logits
        print("logits", tuple(logits.shape))
    """,
    )
    session.start(
        script,
        python=sys.executable,
        stop_on_entry=False,
        breakpoints=[{"file": library_file, "line": library_line}],
    )
    state = session.wait(60)
    assert state["reason"] == "breakpoint", state
    assert (
        state["location"]["file"].endswith("modeling_llama.py")
        and state["location"]["line"] == library_line
    )
    assert session.value("self.layer_idx") == "0"
    shape = session.eval("attn_output")["summary"]["shape"]
    assert shape[0] == 1 and shape[1] == 5  # batch, sequence
    frames = session.stack()["frames"]
    assert frames[0]["function"] == "forward" and frames[-1]["function"] == "<module>"
    state = session.cont(wait=60)
    assert state["reason"] == "breakpoint" and session.value("self.layer_idx") == "1"
    session.call("clear")
    final = session.run_to_end()
    assert final["exit_code"] == 0 and "logits (1, 5, 64)" in session.output()
