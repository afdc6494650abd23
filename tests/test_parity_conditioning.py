"""Bounds that know the op's conditioning (issue 20, item 1).

A sinusoidal timestep embedding takes sin/cos of arguments up to ~1000: one float32 step
of the argument (~6e-5) moves the output by about as much, so PyTorch and MLX, both
right, differ there by ~1e-5 relative, ten times what rounding alone explains.  The
capture measures each leaf call's sensitivity (its output's change when its inputs move
by one rounding step) and compare bounds the entry, and everything computed from it, by
that measurement; the entry says so (``conditioning``).

The models here are a few lines of real PyTorch and real MLX with the same weights: a
timestep embedding (the ill-conditioned op), a Linear on it, a SiLU, a Linear.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
mnn = pytest.importorskip("mlx.nn")

from torch import nn  # noqa: E402

import mldbg  # noqa: E402
from mldbg.compare.judge.bounds import AMPLIFYING  # noqa: E402
from mldbg.store import current_run  # noqa: E402

U32 = 2.0**-24
HALF = 32  # sines and cosines of 32 frequencies each


pytestmark = pytest.mark.usefixtures("home")  # a private run store (conftest)


class TorchTimesteps(nn.Module):
    """[cos, sin] of t * 10000^(-i/half), in float32 (diffusers' ``Timesteps``)."""

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        freqs = torch.exp(-math.log(10000) * torch.arange(HALF, dtype=torch.float32) / HALF)
        args = t.float()[:, None] * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TorchTimeEmbed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.time_proj = TorchTimesteps()
        self.linear_1 = nn.Linear(2 * HALF, 16)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(16, 16)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(self.time_proj(t))))


class MLXTimesteps(mnn.Module):
    def __init__(self, freq_scale: float = 1.0) -> None:
        super().__init__()
        self.freq_scale = freq_scale  # != 1: the planted bug (a wrong max_period)

    def __call__(self, t: mx.array) -> mx.array:
        freqs = mx.exp(-math.log(10000) * mx.arange(HALF, dtype=mx.float32) / HALF)
        args = t.astype(mx.float32)[:, None] * (freqs * self.freq_scale)[None]
        return mx.concatenate([mx.cos(args), mx.sin(args)], axis=-1)


class MLXTimeEmbed(mnn.Module):
    def __init__(self, freq_scale: float = 1.0) -> None:
        super().__init__()
        self.time_proj = MLXTimesteps(freq_scale)
        self.linear_1 = mnn.Linear(2 * HALF, 16)
        self.act = mnn.SiLU()
        self.linear_2 = mnn.Linear(16, 16)

    def __call__(self, t: mx.array) -> mx.array:
        return self.linear_2(self.act(self.linear_1(self.time_proj(t))))


def pair(freq_scale: float = 1.0) -> tuple[TorchTimeEmbed, MLXTimeEmbed]:
    torch.manual_seed(0)
    ref = TorchTimeEmbed().eval()
    port = MLXTimeEmbed(freq_scale)
    port.load_weights([(k, mx.array(v.detach().numpy())) for k, v in ref.state_dict().items()])
    return ref, port


def capture_both(ref: TorchTimeEmbed, port: MLXTimeEmbed, t: float = 937.0) -> None:
    with torch.no_grad(), mldbg.capture(ref, "ref"):
        ref(torch.tensor([t]))
    current_run.reset()
    with mldbg.capture(port, "port"):
        mx.eval(port(mx.array([t])))
    current_run.reset()


def returns(capture_path: Path) -> dict[str, dict[str, Any]]:
    """The return line of each call, by module path."""
    lines = [json.loads(x) for x in (capture_path / "index.jsonl").read_text().splitlines()]
    calls = {r["seq"]: r["module"] for r in lines if r["event"] == "call"}
    return {calls[r["seq"]]: r for r in lines if r["event"] == "return"}


def test_capture_measures_each_leaf_calls_sensitivity() -> None:
    """The sine of large arguments moves ~1000x more than one rounding step; a Linear
    about one step.  A call with children (the root: its subtree is one call deep) is
    measured twice: its inputs perturbed (``amplification``: the sine's, through it) and
    its descendants' outputs rounded, inputs kept (``sensitivity``: its own rounding,
    which a sine fed an exact timestep does not amplify)."""
    ref, port = pair()
    with torch.no_grad(), mldbg.capture(ref, "ref") as cap_ref:
        ref(torch.tensor([937.0]))
    with mldbg.capture(port, "port") as cap_port:
        mx.eval(port(mx.array([937.0])))
    for cap in (cap_ref, cap_port):
        lines = returns(cap.path)
        assert lines["time_proj"]["sensitivity"] > 100 * U32, lines["time_proj"]
        assert lines["linear_1"]["sensitivity"] < 8 * U32, lines["linear_1"]
        assert lines[""]["amplification"] > 100, lines[""]
        assert lines[""]["sensitivity"] < 8 * U32, lines[""]
        assert lines["time_proj"]["amplification"] > 100, lines["time_proj"]
    # Measuring runs nothing the capture records: one call per module, as before.
    assert cap_ref.records == 5 and cap_port.records == 5


def test_a_module_in_training_mode_is_not_rerun() -> None:
    """Dropout draws random numbers and batch norm updates its statistics in training
    mode: running them twice would change the model, so they are not measured."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.BatchNorm1d(4))
    model.train()
    stats = model[2].running_mean.clone()
    with torch.no_grad(), mldbg.capture(model, "train") as cap:
        model(torch.randn(3, 4))
    lines = returns(cap.path)
    assert all("sensitivity" not in line for line in lines.values())
    # One forward, one update of the running mean (momentum 0.1), as without mldbg.
    assert not torch.equal(model[2].running_mean, stats)
    assert model[2].num_batches_tracked.item() == 1


def test_an_ill_conditioned_op_is_bounded_by_its_measured_sensitivity() -> None:
    """Before this bound the clean port failed at ``time_proj`` (rel ~1e-5 against a
    bound of ~5e-7) and at everything after it; now it agrees, and the entries say
    where their bound came from."""
    capture_both(*pair())
    result = mldbg.compare("ref", "port").result
    assert result["ok"], json.dumps(result["first_divergence"])
    proj = next(e for e in result["entries"] if e["name"] == "time_proj#0.out")
    assert proj["rel_rms"] > 4 * 2.0 * 2.0**-22  # far outside what rounding explains
    later = next(e for e in result["entries"] if e["name"] == "linear_2#0.out")
    assert later["conditioning"]["from"] == "time_proj#0"
    assert later["conditioning"]["sensitivity"] > 100 * U32
    assert later["expected"] >= later["conditioning"]["bound"]


def test_a_real_timestep_bug_is_still_named_at_the_embedding() -> None:
    capture_both(*pair(freq_scale=1.01))  # 1% off in every frequency: ~10 rad at t ~ 900
    result = mldbg.compare("ref", "port").result
    assert not result["ok"]
    assert result["first_divergence"]["module"] == "time_proj"
    assert result["decided_by"] == "growth"


def test_replay_judges_local_errors_by_the_same_sensitivity() -> None:
    ref, port = pair()
    with torch.no_grad(), mldbg.capture(ref, "ref"):
        ref(torch.tensor([937.0]))
    current_run.reset()
    replayed = mldbg.replay(port, "ref")
    assert replayed.culprit is None, replayed.result
    assert replayed.ok


def test_bf16_input_into_a_float32_op_is_perturbed_in_float32() -> None:
    """A bfloat16 timestep into a float32 embedding: a step of the bf16 input would be
    ~0.4% of 900, far more than the op's own rounding; the op computes in float32, so it
    is perturbed at float32's step (in float32)."""
    ref, _ = pair()
    with torch.no_grad(), mldbg.capture(ref, "ref") as cap:
        ref(torch.tensor([900.0], dtype=torch.bfloat16))
    found = returns(cap.path)["time_proj"]["sensitivity"]
    assert 100 * U32 < found < 1e-3, found
    assert np.isfinite(found)


def test_without_the_measurement_the_clean_port_fails_at_the_embedding() -> None:
    """``sensitivity=False`` (no re-runs: a faster capture) is what compare saw before
    this bound: the clean port is blamed at the sine of large arguments.  The port's
    own measurement (taken here) is not used in its place: the floors come from the
    reference alone, or a port's ill-conditioned formula would excuse itself."""
    ref, port = pair()
    with torch.no_grad(), mldbg.capture(ref, "ref", sensitivity=False) as cap:
        ref(torch.tensor([937.0]))
    current_run.reset()
    assert all("sensitivity" not in line for line in returns(cap.path).values())
    with mldbg.capture(port, "port"):
        mx.eval(port(mx.array([937.0])))
    current_run.reset()
    result = mldbg.compare("ref", "port").result
    assert not result["ok"]
    assert result["first_divergence"]["module"] == "time_proj"


class TorchSharpAttention(nn.Module):
    """q/k/v as Linear children, the softmax of large logits inline (what diffusers'
    attention processors do)."""

    def __init__(self) -> None:
        super().__init__()
        self.to_q, self.to_k, self.to_v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.to_q(x) @ self.to_k(x).transpose(-1, -2)
        return torch.softmax(logits, dim=-1) @ self.to_v(x)


class MLXSharpAttention(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.to_q, self.to_k, self.to_v = mnn.Linear(16, 16), mnn.Linear(16, 16), mnn.Linear(16, 16)

    def __call__(self, x: mx.array) -> mx.array:
        logits = self.to_q(x) @ self.to_k(x).transpose(0, 2, 1)
        return mx.softmax(logits, axis=-1) @ self.to_v(x)


class TorchBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = TorchSharpAttention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(x)


class MLXBlock(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = MLXSharpAttention()

    def __call__(self, x: mx.array) -> mx.array:
        return x + self.attn(x)


def test_a_call_with_children_measures_its_inline_work_at_bounded_cost() -> None:
    """The attention (children: its projections) is re-run: its amplification is the
    inline softmax's, far beyond a Linear's; the block above it (two calls deep) is not
    re-run; nothing the re-runs do is recorded and the model's output is unchanged."""
    torch.manual_seed(0)
    ref = TorchBlock().eval()
    with torch.no_grad():  # logits of ~5 over 32 tokens: a softmax far from saturated
        for proj in (ref.attn.to_q, ref.attn.to_k):
            proj.weight.normal_(0.0, 0.5)
    port = MLXBlock()
    port.load_weights([(k, mx.array(v.detach().numpy())) for k, v in ref.state_dict().items()])
    x = torch.randn(1, 32, 16)
    with torch.no_grad():
        expected = ref(x)
        with mldbg.capture(ref, "ref") as cap_ref:
            got = ref(x)
    assert torch.equal(got, expected)
    plain = port(mx.array(x.numpy()))
    with mldbg.capture(port, "port") as cap_port:
        again = port(mx.array(x.numpy()))
    assert mx.array_equal(plain, again).item()
    for cap in (cap_ref, cap_port):
        lines = returns(cap.path)
        assert cap.records == 5  # block, attention, three projections: nothing re-run recorded
        attn, proj = lines["attn"], lines["attn.to_q"]
        assert attn["amplification"] > max(AMPLIFYING, 2 * proj["amplification"]), (attn, proj)
        assert attn["sensitivity"] > proj["sensitivity"], (attn, proj)
        assert "sensitivity" not in lines[""] and "amplification" not in lines[""]
