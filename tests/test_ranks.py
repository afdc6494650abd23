"""Ranks: a 2-rank tensor-parallel MLP under torchrun (gloo, CPU), captured without
editing the script, gathered and compared with the single-process reference."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import mldbg  # noqa: E402
from conftest import Api, Session, wait_until  # noqa: E402
from mldbg import verbs  # noqa: E402
from mldbg.compare import CompareInputError  # noqa: E402
from mldbg.compare.read import gather  # noqa: E402

SCRIPT = Path(__file__).parent / "ranks_scripts" / "tp_mlp.py"
# Megatron-style split: fc1 column parallel, fc2 row parallel (partial sums before the
# all-reduce, which happens in the parent module, whose output is whole on every rank).
SHARDS = {"fc1#*.out*": -1, "act#*": -1, "fc2#*.in*": -1, "fc2#*.out*": "sum"}


def run(api: Api, name: str, cwd: Path, body: dict[str, Any]) -> None:
    session = Session(api, name, cwd)
    try:
        api.post(
            f"{session.base}/start",
            {
                "cwd": str(cwd),
                "stop_on_entry": False,
                "env": {**os.environ, "MLDBG_HOME": str(cwd / ".mldbg")},
                **body,
            },
        )

        def ended() -> dict[str, Any] | None:
            state: dict[str, Any] = session.wait(10.0)
            return None if state["state"] in ("starting", "running", "paused") else state

        state = wait_until(ended, timeout=300, what=f"{name} to end")
        assert state.get("exit_code") == 0, (state, session.output())
    finally:
        api.http.post(f"{session.base}/terminate")


def test_tensor_parallel_ranks_gathered_and_compared(api: Api, tmp_path: Path) -> None:
    shutil.copy(SCRIPT, tmp_path / SCRIPT.name)
    home = tmp_path / ".mldbg"
    run(api, "rank-ref", tmp_path, {"script": SCRIPT.name, "capture": "ref"})
    torchrun = {"module": "torch.distributed.run", "args": ["--nproc_per_node", "2", SCRIPT.name]}
    run(api, "rank-tp", tmp_path, {**torchrun, "capture": "tp"})
    run(
        api,
        "rank-bug",
        tmp_path,
        {**torchrun, "args": [*torchrun["args"], "bug"], "capture": "bug"},
    )
    metas = {
        json.loads(p.read_text())["name"]: json.loads(p.read_text())
        for p in home.glob("runs/*/captures/*/capture.json")
    }
    assert {"tp@rank0", "tp@rank1", "bug@rank0", "bug@rank1"} <= set(metas)
    assert metas["tp@rank1"]["rank"] == 1 and metas["tp@rank1"]["world_size"] == 2

    clean = mldbg.compare("ref", "tp@rank*", shards=SHARDS, home=home)
    assert clean.ok, clean.first_divergence
    fc1 = clean.entry("fc1#0.out")
    assert fc1["shape_b"] == fc1["shape_a"] == [4, 64]  # two halves of 32, concatenated
    assert clean.result["b"]["kind"] == "gathered"

    buggy = mldbg.compare("ref", "bug@rank*", shards=SHARDS, home=home)
    assert not buggy.ok
    assert buggy.first_divergence["module"] == "fc1"
    # Without declaring the split, the shapes say what is wrong.
    unsplit = mldbg.compare("ref", "tp@rank0", home=home)
    assert "shapes differ" in unsplit.entry("fc1#0.out")["error"]

    # The same through the daemon (REST; MCP's tool is derived from the same declaration).
    body = {"a": "ref", "b": "bug@rank*", "shards": SHARDS, "home": str(home)}
    answer = api.post("/v1/compare", body)
    assert answer["b"]["kind"] == "gathered" and answer["first_divergence"]["module"] == "fc1"
    too_many = {f"rule{i}": 0 for i in range(verbs.SHARD_RULES_LIMIT + 1)}
    refused = api.post("/v1/compare", {**body, "shards": too_many}, expect=400)
    assert refused["code"] == "too_long" and refused["limit"] == verbs.SHARD_RULES_LIMIT

    # And from the command line: one --shards GLOB=DIM (or GLOB=sum) per rule.
    rules = [arg for glob, how in SHARDS.items() for arg in ("--shards", f"{glob}={how}")]
    env = {**os.environ, "MLDBG_HOME": str(home)}

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "mldbg", "compare", "--json", *args]
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)

    found = command("ref", "bug@rank*", *rules)
    assert found.returncode == 1, found.stderr
    assert json.loads(found.stdout)["first_divergence"]["module"] == "fc1"
    assert command("ref", "tp@rank*", *rules).returncode == 0
    bad = command("ref", "tp@rank*", "--shards", "fc1#*")  # no =DIM
    assert bad.returncode == 2 and json.loads(bad.stdout)["code"] == "bad_shards", bad.stdout


def test_shard_rules_are_checked(tmp_path: Path) -> None:
    home = tmp_path / ".mldbg"
    too_many = {f"rule{i}": 0 for i in range(verbs.SHARD_RULES_LIMIT + 1)}
    for shards, words in (
        (too_many, "more than the limit of 100"),
        ({"fc1#*": "concat"}, r"takes a dimension \(an integer\) or 'sum'"),
        ({"": 0}, "keys are globs"),
    ):
        with pytest.raises(CompareInputError, match=words) as caught:
            mldbg.compare("ref", "tp@rank*", shards=shards, home=home)
        assert caught.value.code == "bad_shards"
    # The Python API checks the limits the verb table declares for the daemon.
    declared = verbs.get("compare").arg("shards")
    assert (declared.max_items, declared.max_length) == (
        gather.SHARD_RULES_LIMIT,
        gather.PATTERN_LIMIT,
    )


LLAMA = Path(__file__).parent / "ranks_scripts" / "tp_llama.py"
# Split by heads: q/k/v column parallel, o_proj's input the same heads; the MLP's gate/up
# column parallel, down_proj's input the same slices.  o_proj/down_proj outputs are partial
# sums, all-reduced by a hook on their parent (so the parents' outputs are whole).
LLAMA_SHARDS = {
    "*.q_proj#*.out*": -1,
    "*.k_proj#*.out*": -1,
    "*.v_proj#*.out*": -1,
    "*.o_proj#*.in*": -1,
    "*.o_proj#*.out*": "sum",
    "*.gate_proj#*.out*": -1,
    "*.up_proj#*.out*": -1,
    "*.act_fn#*": -1,
    "*.down_proj#*.in*": -1,
    "*.down_proj#*.out*": "sum",
}


def test_a_tensor_parallel_llama_split_by_heads(api: Api, tmp_path: Path) -> None:
    """transformers' Llama split over 2 gloo ranks by attention heads (GQA: one key head
    per rank) and MLP slices, launched through ``torch.distributed.run`` with ``start
    --capture``, gathered with the declared splits and compared with the one-process
    model; a rank that loads the other rank's key head is named at ``k_proj``."""
    shutil.copy(LLAMA, tmp_path / LLAMA.name)
    home = tmp_path / ".mldbg"
    run(api, "llama-ref", tmp_path, {"script": LLAMA.name, "capture": "ref"})
    torchrun = {"module": "torch.distributed.run", "args": ["--nproc_per_node", "2", LLAMA.name]}
    run(api, "llama-tp", tmp_path, {**torchrun, "capture": "tp"})
    run(
        api,
        "llama-bug",
        tmp_path,
        {**torchrun, "args": [*torchrun["args"], "bug"], "capture": "bug"},
    )
    clean = mldbg.compare("ref", "tp@rank*", shards=LLAMA_SHARDS, home=home)
    assert clean.ok, (
        clean.first_divergence,
        [e for e in clean.result["entries"] if not e["ok"]][:3],
    )
    assert clean.entry("layers.0.self_attn.k_proj#0.out")["shape_b"] == [1, 8, 32]
    buggy = mldbg.compare("ref", "bug@rank*", shards=LLAMA_SHARDS, home=home)
    assert not buggy.ok
    assert buggy.first_divergence["module"] == "layers.0.self_attn.k_proj"


def _mlp_ranks(home: Path, mode: str, monkeypatch: pytest.MonkeyPatch, bias_slip: bool) -> None:
    """The reference MLP and its 2-way split, captured in this process: ``RANK`` and
    ``WORLD_SIZE`` name each capture as torchrun's ranks would (no collective runs: fc2's
    outputs stay partial sums, as before an all-reduce)."""
    import torch
    from torch import nn

    from mldbg.store import current_run

    class MLP(nn.Module):
        def __init__(self, inner: int) -> None:
            super().__init__()
            self.fc1 = nn.Linear(16, inner)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(inner, 16, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.act(self.fc1(x)))

    torch.manual_seed(0)
    full, x = MLP(64), torch.randn(4, 16)
    monkeypatch.setenv("MLDBG_HOME", str(home))
    current_run.reset()
    with torch.no_grad(), mldbg.capture(full, "ref", mode=mode):
        full(x)
    for rank in (0, 1):
        current_run.reset()
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        part = MLP(32)
        start = 0 if bias_slip else rank * 32
        with torch.no_grad():
            part.fc1.weight.copy_(full.fc1.weight[rank * 32 : (rank + 1) * 32])
            part.fc1.bias.copy_(full.fc1.bias[start : start + 32])
            part.fc2.weight.copy_(full.fc2.weight[:, rank * 32 : (rank + 1) * 32])
            with mldbg.capture(part, "tp", mode=mode):
                part(x)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    current_run.reset()


@pytest.mark.parametrize("mode", ["summary", "full"])
def test_summary_captures_of_ranks_are_gathered_by_what_their_statistics_allow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A coarse pass at scale captures summaries (statistics + a sketch) on every rank.
    Sketches do not concatenate (each rank's is of its own slice, bucketed by its own
    element indices): gathered along a dimension, two clean ranks were compared sketch
    against sketch and fc1 was named at a relative error of 1.4.  Along a dimension the
    ranks' statistics combine exactly and bound the error from below; partial sums' sketches
    add up exactly (the sketch is linear), so "sum" keeps its estimate.  A rank that
    loads the wrong slice of fc1's bias is still named."""
    home = tmp_path / ".mldbg"
    shards = {"fc1#*.out*": -1, "act#*": -1, "fc2#*.in*": -1, "fc2#*.out*": "sum"}
    _mlp_ranks(home, mode, monkeypatch, bias_slip=False)
    clean = mldbg.compare("ref", "tp@rank*", shards=shards, home=home)
    by_name = {e["name"]: e for e in clean.result["entries"]}
    for name in ("fc1#0.out", "act#0.out", "fc2#0.out"):
        assert by_name[name]["ok"], by_name[name]
    if mode == "summary":
        fc1 = by_name["fc1#0.out"]["estimated"]
        assert fc1["lower_bound"] and "gathered" in fc1["method"]
        assert by_name["fc2#0.out"]["estimated"]["method"] != fc1["method"]
    _mlp_ranks(tmp_path / "bug", mode, monkeypatch, bias_slip=True)
    buggy = mldbg.compare("ref", "tp@rank*", shards=shards, home=tmp_path / "bug")
    assert buggy.first_divergence is not None
    assert buggy.first_divergence["module"] == "fc1"


def test_the_weights_of_ranks_are_gathered_for_the_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank saves its own slice (``--capture-weights``); ``audit_weights`` gathers
    them with the same globs on parameter names, and the rank that loaded the wrong
    slice of fc1's bias is named (``values``) before any activation is compared."""
    import torch
    from torch import nn

    from mldbg.store import current_run
    from mldbg.weights.audit import audit_weights
    from mldbg.weights.render import render_audit

    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / ".mldbg"))
    torch.manual_seed(0)
    full = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16, bias=False))
    for name, slip in (("tp", False), ("bug", True)):
        for rank in (0, 1):
            current_run.reset()
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", "2")
            part = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16, bias=False))
            start = 0 if slip else rank * 32
            with torch.no_grad():
                part[0].weight.copy_(full[0].weight[rank * 32 : (rank + 1) * 32])
                part[0].bias.copy_(full[0].bias[start : start + 32])
                part[2].weight.copy_(full[2].weight[:, rank * 32 : (rank + 1) * 32])
                with mldbg.capture(part, name) as cap:
                    cap.save_weights()
                    part(torch.randn(2, 16))
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    current_run.reset()
    shards = {"0.*": 0, "2.weight": 1}
    clean = audit_weights(full, "tp@rank*", shards=shards)
    assert clean["ok"], render_audit(clean)
    assert clean["port"]["ranks"] == ["tp@rank0", "tp@rank1"]
    bug = audit_weights(full, "bug@rank*", shards=shards)
    statuses = {row["name"]: row["status"] for row in bug["parameters"]}
    assert statuses == {"0.weight": "ok", "0.bias": "values", "2.weight": "ok"}
    undeclared = audit_weights(full, "tp@rank*")
    assert {r["status"] for r in undeclared["parameters"]} == {"shape"}
    with pytest.raises(CompareInputError, match="sum"):
        audit_weights(full, "tp@rank*", shards={"0.*": "sum"})


def test_cli_weights_takes_shards(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mldbg weights REF 'tp@rank*' --shards GLOB=DIM``: the same rules from the command
    line (the daemon's REST answer underneath)."""
    import torch
    from safetensors.torch import save_file
    from torch import nn

    from mldbg.store import current_run

    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / ".mldbg"))
    torch.manual_seed(0)
    full = nn.Sequential(nn.Linear(16, 64))
    save_file(
        {k: v.contiguous() for k, v in full.state_dict().items()}, str(tmp_path / "ref.safetensors")
    )
    for rank in (0, 1):
        current_run.reset()
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        part = nn.Sequential(nn.Linear(16, 32))
        with torch.no_grad():
            part[0].weight.copy_(full[0].weight[rank * 32 : (rank + 1) * 32])
            part[0].bias.copy_(full[0].bias[rank * 32 : (rank + 1) * 32])
            with mldbg.capture(part, "tp") as cap:
                cap.save_weights()
                part(torch.randn(2, 16))
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    current_run.reset()
    answer = cli("weights", "ref.safetensors", "tp@rank*", "--shards", "0.*=0", json_out=True)
    assert answer["ok"] is True and answer["port"]["ranks"] == ["tp@rank0", "tp@rank1"]
    bad = cli(
        "weights", "ref.safetensors", "tp@rank*", "--shards", "0.*", expect=None, json_out=True
    )
    assert bad["code"] == "bad_shards"
