"""Coarse to fine: summaries, sketches, depth, byte budget, and narrowing to the culprit.

The end-to-end test runs two unmodified scripts (``coarse_to_fine_scripts/``: a deep
model whose full capture would write 23.6 GB, and its port with one planted bug) under
the real daemon, first as summaries of the blocks, then in full inside the block the
first comparison names, each capture under a 1 GB budget.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mldbg  # noqa: E402
from conftest import Api, Session, wait_until  # noqa: E402
from mldbg.capture.budget import parse_size  # noqa: E402
from mldbg.capture.sketch import SKETCH_SIZE, estimate, summarize_numpy, summarize_torch  # noqa: E402
from mldbg.text import compare as compare_render  # noqa: E402
from mldbg.text.console import captured  # noqa: E402

SCRIPTS = Path(__file__).parent / "coarse_to_fine_scripts"
GB = 10**9


def run_captured(session: Session, script: str, **capture: Any) -> None:
    session.start(script, stop_on_entry=False, **capture)

    def ended() -> dict[str, Any] | None:
        state: dict[str, Any] = session.wait(10.0)
        return None if state["state"] in ("starting", "running", "paused") else state

    state = wait_until(ended, timeout=400, what=f"{script} to end")
    assert state.get("exit_code") == 0, (state, session.output())


def capture_meta(home: Path, name: str) -> dict[str, Any]:
    for path in (home / "runs").glob(f"*/captures/{name}/capture.json"):
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    raise AssertionError(f"no capture {name}")


def test_deep_model_culprit_found_within_1gb_in_two_runs_of_each_script(
    api: Api, tmp_path: Path
) -> None:
    for script in SCRIPTS.glob("*.py"):
        shutil.copy(script, tmp_path / script.name)
    sys.path.insert(0, str(SCRIPTS))
    try:
        import deep_model
    finally:
        sys.path.remove(str(SCRIPTS))
    would_be = deep_model.would_be_bytes()
    assert would_be > 20 * GB  # computed from the model's sizes; never written
    home = tmp_path / ".mldbg"
    coarse = {"capture_mode": "summary", "capture_depth": 1, "capture_budget": "1GB"}
    sessions = [Session(api, f"c2f{i}", tmp_path) for i in range(4)]
    try:
        # Run 1 of each script: summaries of the model and its blocks.
        run_captured(sessions[0], "deep_reference.py", capture="ref-coarse", **coarse)
        run_captured(sessions[1], "deep_port.py", capture="port-coarse", **coarse)
        first = mldbg.compare("ref-coarse", "port-coarse", home=home)
        assert first.first_divergence is not None
        assert first.first_divergence["module"] == f"blocks.{deep_model.BUGGY_BLOCK}"
        assert all(e["estimated"]["method"] == "sketch" for e in first.entries)
        narrow = first.result["narrow"]
        assert narrow["within_a"] == narrow["within_b"] == f"blocks.{deep_model.BUGGY_BLOCK}"
        with captured(width=300) as buffer:  # the human answer says where to look next
            compare_render.show(first.result)
        tensor = deep_model.TOKENS * deep_model.HIDDEN * 4
        assert narrow["mode"] == "full" and narrow["full_bytes"] == 11 * 2 * tensor  # 369 MB
        said = buffer.getvalue()
        assert (
            "next: capture both scripts again in full inside the culprit only (about 369MB)" in said
        )
        # the two runs again, as each was started, inside the culprit; then their compare
        for script, name in (("deep_reference.py", "ref-fine"), ("deep_port.py", "port-fine")):
            assert (
                f"--capture {name} --capture-within blocks.{deep_model.BUGGY_BLOCK} --run "
                f"{tmp_path / script}" in said
            )
        assert "mldbg compare ref-fine port-fine" in said
        # Run 2 of each script: in full, inside that block only.
        fine = {"capture_within": narrow["within_a"], "capture_budget": "1GB"}
        run_captured(sessions[2], "deep_reference.py", capture="ref-fine", **fine)
        run_captured(sessions[3], "deep_port.py", capture="port-fine", **fine)
    finally:
        for s in sessions:
            s.end()
    second = mldbg.compare("ref-fine", "port-fine", home=home)
    assert second.first_divergence is not None
    assert second.first_divergence["module"] == f"blocks.{deep_model.BUGGY_BLOCK}.mix"
    assert "narrow" not in second.result  # full tensors: nothing coarser to narrow
    for name in ("ref-coarse", "port-coarse", "ref-fine", "port-fine"):
        budget = capture_meta(home, name)["budget"]
        assert budget["limit"] == GB
        assert budget["used"] <= GB and not budget["exhausted"]
    # The coarse pass says what the blocks alone would have cost in full.
    assert capture_meta(home, "ref-coarse")["budget"]["full_bytes"] == 2 * tensor * (
        1 + deep_model.BLOCKS
    )
    # The fine pass wrote the block's eleven calls in full: real tensors, hundreds of MB.
    assert capture_meta(home, "ref-fine")["budget"]["used"] > 11 * 2 * tensor


class Lin(torch.nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.linear, self.bug = torch.nn.Linear(64, 64), bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.linear(x))
        return y * 1.01 if self.bug else y


class Block(torch.nn.Module):
    def __init__(self, bug: int | None) -> None:
        super().__init__()
        self.inner = torch.nn.ModuleList(Lin(bug == m) for m in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for module in self.inner:
            y = module(y)
        return x + 0.1 * y


class Stage(torch.nn.Module):
    def __init__(self, bug: tuple[int, int] | None) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            Block(bug[1] if bug and bug[0] == b else None) for b in range(8)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class TwoLevels(torch.nn.Module):
    """Six stages of eight blocks of three small modules: a culprit stage's full capture
    is larger than the budget the coarse pass ran under."""

    def __init__(self, bug: tuple[int, int, int] | None) -> None:
        super().__init__()
        self.stages = torch.nn.ModuleList(
            Stage(bug[1:] if bug and bug[0] == s else None) for s in range(6)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return x


def test_a_culprit_too_large_for_the_budget_is_narrowed_by_summaries_first(home: Path) -> None:
    """Coarse, then summaries inside the culprit (its full capture would not fit), then
    in full inside the block that names: three runs of each side, each within budget."""
    torch.manual_seed(0)
    a = TwoLevels(None).eval()
    torch.manual_seed(0)
    b = TwoLevels((3, 5, 1)).eval()
    x = torch.randn(64, 64)
    budget = 1_000_000  # one stage in full: 8 blocks of 7 calls, ~1.9 MB

    def run(model: torch.nn.Module, name: str, **options: Any) -> None:
        with torch.no_grad(), mldbg.capture(model, name, budget=budget, **options):
            model(x)

    run(a, "r1", mode="summary", depth=1)
    run(b, "p1", mode="summary", depth=1)
    first = mldbg.compare("r1", "p1", home=home)
    assert first.first_divergence is not None
    assert first.first_divergence["module"] == "stages.3"
    narrow = first.result["narrow"]
    assert narrow["mode"] == "summary" and narrow["full_bytes"] > budget
    start_a = narrow["calls"][0]["args"]
    assert start_a["capture_within"] == "stages.3" and start_a["capture_depth"] == 1
    assert start_a["capture_mode"] == "summary"
    # The estimate is what a full capture inside the stage writes (tensors of one size).
    with torch.no_grad(), mldbg.capture(a, "whole-stage", within="stages.3") as whole:
        a(x)
    written = json.loads((whole.path / "capture.json").read_text())["budget"]["used"]
    assert abs(narrow["full_bytes"] - written) < 0.02 * written  # the files' headers aside

    run(a, "r2", mode="summary", depth=1, within="stages.3")
    run(b, "p2", mode="summary", depth=1, within="stages.3")
    second = mldbg.compare("r2", "p2", home=home)
    assert second.first_divergence is not None
    assert second.first_divergence["module"] == "stages.3.blocks.5"
    assert second.result["narrow"]["mode"] == "full"  # the block fits: in full next

    run(a, "r3", within="stages.3.blocks.5")
    run(b, "p3", within="stages.3.blocks.5")
    third = mldbg.compare("r3", "p3", home=home)
    assert third.first_divergence is not None
    assert third.first_divergence["module"] == "stages.3.blocks.5.inner.1"
    for name in ("r1", "p1", "r2", "p2", "r3", "p3"):
        report = capture_meta(home, name)["budget"]
        assert report["used"] <= budget and not report["exhausted"], (name, report)


def test_budget_is_enforced_and_reported(home: Path) -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)
    )
    x = torch.randn(64, 256)
    with torch.no_grad(), mldbg.capture(model, "small", budget=200_000) as cap:
        model(x)
    meta = json.loads((cap.path / "capture.json").read_text())
    report = meta["budget"]
    assert report["limit"] == 200_000 and report["exhausted"]
    assert report["used"] <= 200_000 < report["full_bytes"]
    assert report["skipped_tensors"] > 0 and report["first_skipped"]
    lines = [json.loads(line) for line in (cap.path / "index.jsonl").read_text().splitlines()]
    skipped = [why for line in lines for why in (line.get("skipped") or {}).values()]
    assert skipped and all("over the byte budget" in why for why in skipped)
    assert sum(p.stat().st_size for p in cap.path.glob("*.safetensors")) == report["used"]


def test_depth_limits_the_calls_recorded(home: Path) -> None:
    inner = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    model = torch.nn.Sequential(inner, torch.nn.Linear(8, 8))
    with torch.no_grad(), mldbg.capture(model, "shallow", depth=1) as cap:
        model(torch.randn(2, 8))
    lines = [json.loads(line) for line in (cap.path / "index.jsonl").read_text().splitlines()]
    calls = {line["seq"]: line["module"] for line in lines if line["event"] == "call"}
    with_tensors = {calls[line["seq"]] for line in lines if line.get("tensors")}
    assert with_tensors == {"", "0", "1"}  # 0.0 and 0.1 sit at depth 2
    # Still on the index, without tensors: compare sees the whole call tree.
    below = {line.get("module") for line in lines if line.get("below_depth")}
    assert below == {"0.0", "0.1"}
    assert json.loads((cap.path / "capture.json").read_text())["budget"]["calls_below_depth"] == 2
    from mldbg.compare.read.sources import open_source

    source = open_source(str(cap.path), home)
    assert ("0.0", 0) in source.calls and not any(e.module == "0.0" for e in source.entries)


def test_within_names_a_module_or_says_which_exist(home: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with pytest.raises(ValueError, match="no module of that path"):
        mldbg.capture(model, "x", within="layers.3")


@pytest.mark.parametrize("bug", [None, "rope"])
def test_within_bounds_its_inputs_by_the_calls_before_it(home: Path, bug: str | None) -> None:
    """The fine pass of a cross-framework port: the attention's inputs carry what the
    blocks before it rounded (Flux's timestep embedding, sin of ~900, first): a clean
    MLX port agrees inside it, and a RoPE pairing bug is named there.  Before, only the
    attention's calls were on the index, so its first inputs were the capture's first and
    any rounding in them read as "the two runs were given different inputs"."""
    pytest.importorskip("diffusers")
    mx = pytest.importorskip("mlx.core")
    from parity_zoo import flux

    zoo = flux.build("float32", bug)
    within = "transformer_blocks.0.attn"
    with torch.no_grad(), mldbg.capture(zoo.ref, "ref", within=within) as ref:
        zoo.run_ref()
    with mldbg.capture(zoo.port, "port", within=within, sensitivity=False):
        mx.eval(zoo.run_port())
    result = mldbg.compare("ref", "port")
    assert all(e["module"].startswith(within) for e in result.entries)
    if bug is None:
        assert result.ok, json.dumps(result.first_divergence)[:800]
    else:
        assert result.first_divergence is not None
        assert result.first_divergence["module"] == within, result.first_divergence
    # Calls outside are on the index, measured, without tensors.
    lines = [json.loads(line) for line in (ref.path / "index.jsonl").read_text().splitlines()]
    outside = [line for line in lines if line.get("outside_within")]
    assert outside and not any(line.get("tensors") for line in outside)
    recorded = {line["module"] for line in lines if line.get("tensors") and "module" in line}
    assert within in recorded and all(m.startswith(within) for m in recorded)


@pytest.mark.parametrize("where", ["spread", "one_row", "one_channel"])
def test_sketch_estimates_relative_error(where: str) -> None:
    """The sketch's estimate of ||b - a|| / ||a|| against the exact value, for rounding-like
    noise everywhere, an error on one token, and an error in one channel."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 768)).astype(np.float32)
    a[:, 5] += 40.0  # an outlier channel, as real activations have
    d = np.zeros_like(a)
    if where == "spread":
        d = (rng.standard_normal(a.shape) * 1e-3).astype(np.float32)
    elif where == "one_row":
        d[300] = rng.standard_normal(768).astype(np.float32)
    else:
        d[:, 17] = 0.5
    b = a + d
    exact = float(np.linalg.norm(b.astype(np.float64) - a)) / float(
        np.linalg.norm(a.astype(np.float64))
    )
    sa, stats_a = summarize_numpy(a)
    sb, stats_b = summarize_numpy(b)
    found = estimate(sa, sb, stats_a, stats_b)["rel_rms"]
    assert abs(found - exact) <= 4 * exact / np.sqrt(SKETCH_SIZE)
    # The torch version, on the tensor's own device, gives the same sketch.
    st, stats_t = summarize_torch(torch.from_numpy(a))
    np.testing.assert_allclose(st, sa, rtol=1e-12, atol=1e-9)
    assert stats_t["nan"] == stats_a["nan"] == 0


def test_small_tensors_and_nonfinite_values_are_exact() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = a.copy()
    b[1, 2] = np.nan
    sa, stats_a = summarize_numpy(a)
    sb, stats_b = summarize_numpy(b)
    assert stats_b["nan"] == 1 and stats_a["nan"] == 0
    numbers = estimate(sa, sb, stats_a, stats_b)
    assert numbers["exact"]
    # NaN counted apart, its slot taken as 0: the finite part's error is exact.
    assert numbers["rel_rms"] == pytest.approx(6.0 / np.linalg.norm(a))


def test_parse_size() -> None:
    assert parse_size("1GB") == 10**9
    assert parse_size("2GiB") == 2 * 1024**3
    assert parse_size("500mb") == 500 * 10**6
    assert parse_size(1234) == 1234
    with pytest.raises(ValueError, match="byte size"):
        parse_size("lots")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from mldbg.store import current_run

    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / ".mldbg"))
    current_run.reset()
    yield tmp_path / ".mldbg"  # type: ignore[misc]
    current_run.reset()
