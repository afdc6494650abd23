"""Ranks: a 2-rank tensor-parallel MLP under torchrun (gloo, CPU), captured without
editing the script, gathered and compared with the single-process reference."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import mldbg  # noqa: E402
from conftest import Api, Session, call, wait_until  # noqa: E402
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
        session.call(
            "start",
            cwd=str(cwd),
            stop_on_entry=False,
            env={**os.environ, "MLDBG_HOME": str(cwd / ".mldbg")},
            **body,
        )

        def ended() -> dict[str, Any] | None:
            state: dict[str, Any] = session.wait(10.0)
            return None if state["state"] in ("starting", "running", "paused") else state

        state = wait_until(ended, timeout=300, what=f"{name} to end")
        assert state.get("exit_code") == 0, (state, session.output())
    finally:
        session.end()


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
    answer = call(api.client, "compare", None, **body)
    assert answer["b"]["kind"] == "gathered" and answer["first_divergence"]["module"] == "fc1"
    too_many = {f"rule{i}": 0 for i in range(verbs.SHARD_RULES_LIMIT + 1)}
    refused = call(api.client, "compare", None, 400, **{**body, "shards": too_many})
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


# -- rank sets that do not add up (issue #30, item 5) --------------------------------------------

WEIGHT_SHARDS = {"0.*": 0, "2.weight": 1}
# no all-reduce runs in-process: the model's own output is a partial sum too
MLP_SHARDS = {"0#*.out*": -1, "1#*": -1, "2#*.in*": -1, "2#*.out*": "sum", "<root>#*.out*": "sum"}


def _rank_set(
    home: Path, monkeypatch: pytest.MonkeyPatch, ranks: list[tuple[int, int]], twice: bool = False
) -> None:
    """The reference MLP (``ref``), then a ``tp`` capture for each ``(rank, world size)``,
    each in a run of its own, its weights saved; ``twice``: the last rank captured a
    second time in its run (``tp@rank1`` and ``tp@rank1-2``, both rank 1)."""
    import torch
    from torch import nn

    from mldbg.store import current_run

    monkeypatch.setenv("MLDBG_HOME", str(home))
    torch.manual_seed(0)
    full = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16, bias=False))
    x = torch.randn(4, 16)
    current_run.reset()
    with torch.no_grad(), mldbg.capture(full, "ref") as cap:
        cap.save_weights()
        full(x)
    for n, (rank, world) in enumerate(ranks):
        current_run.reset()
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        part = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16, bias=False))
        half = slice(rank % 2 * 32, rank % 2 * 32 + 32)
        with torch.no_grad():
            part[0].weight.copy_(full[0].weight[half])
            part[0].bias.copy_(full[0].bias[half])
            part[2].weight.copy_(full[2].weight[:, half])
            for _ in range(2 if twice and n == len(ranks) - 1 else 1):
                with mldbg.capture(part, "tp") as cap:
                    cap.save_weights()
                    part(x)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    current_run.reset()


@pytest.mark.parametrize(
    "ranks, twice, said",
    [
        ([(0, 2)], False, ["rank 1", "missing"]),  # warned, then blamed the wrong module
        ([(0, 3), (2, 3)], False, ["rank 1", "missing"]),
        ([(0, 2), (1, 2), (2, 3)], False, ["tp@rank2", "world size"]),  # a stray, older run
        ([(0, 2), (1, 2), (2, 2)], False, ["tp@rank2", "rank 2 of a world of 2"]),
        ([(0, 2), (1, 2)], True, ["rank 1", "tp@rank1", "tp@rank1-2"]),  # captured twice
        # a rank no world has: counting the ranks to look for up to it never ended
        ([(0, 2), (1, 2), (10**20, 2)], False, [f"tp@rank{10**20}", "no rank below"]),
    ],
    ids=["missing", "missing-middle", "stray-world", "stray-rank", "duplicate", "huge-rank"],
)
def test_rank_sets_that_do_not_add_up_are_named_before_any_verdict(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ranks: list[tuple[int, int]],
    twice: bool,
    said: list[str],
) -> None:
    """A rank capture missing, one captured twice, or a stray one from another run: the
    gathered model is not the model.  compare warned (or said nothing) and then named a
    culprit from the wrong tensors; the weight audit gathered the wrong slices.  Now both
    refuse with ``bad_ranks``, naming the ranks, before anything is compared."""
    from mldbg.weights.audit import audit_weights

    home = tmp_path / ".mldbg"
    _rank_set(home, monkeypatch, ranks, twice)
    with pytest.raises(CompareInputError) as compared:
        mldbg.compare("ref", "tp@rank*", shards=MLP_SHARDS, home=home)
    with pytest.raises(CompareInputError) as audited:
        audit_weights("ref", "tp@rank*", shards=WEIGHT_SHARDS, home=home)
    for caught in (compared, audited):
        error = caught.value
        assert error.code == "bad_ranks", error.to_json()
        for words in said:
            assert words in error.message, error.message
        assert set(error.extra) >= {"missing", "duplicates", "stray"}


def test_a_rank_set_that_adds_up_is_gathered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check passes a sound set, and a glob that names the sound ones among others
    (``tp@rank[01]``) gathers those."""
    from mldbg.weights.audit import audit_weights

    home = tmp_path / ".mldbg"
    _rank_set(home, monkeypatch, [(0, 2), (1, 2)])
    assert mldbg.compare("ref", "tp@rank*", shards=MLP_SHARDS, home=home).ok
    assert audit_weights("ref", "tp@rank*", shards=WEIGHT_SHARDS, home=home)["ok"]
    _rank_set(tmp_path / "twice", monkeypatch, [(0, 2), (1, 2)], twice=True)
    picked = mldbg.compare("ref", "tp@rank[01]", shards=MLP_SHARDS, home=tmp_path / "twice")
    assert picked.ok and picked.result["b"]["kind"] == "gathered"


def test_bad_ranks_over_rest(api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / ".mldbg"
    _rank_set(home, monkeypatch, [(0, 2)])
    body = {"a": "ref", "b": "tp@rank*", "shards": MLP_SHARDS, "home": str(home)}
    answer = api.post("/v1/compare", body, expect=400)
    assert answer["code"] == "bad_ranks" and answer["missing"] == [1], answer
    body = {"reference": "ref", "port": "tp@rank*", "shards": WEIGHT_SHARDS, "home": str(home)}
    answer = api.post("/v1/weights", body, expect=400)
    assert answer["code"] == "bad_ranks" and answer["missing"] == [1], answer


def test_split_parameters_are_checked_before_any_rank_is_read(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dimension the parameter lacks was taken modulo its rank (gathered along another
    axis); slices that differ outside the split made the read fail (REST 500, internal).
    Both are ``bad_shards`` now, naming the parameter."""
    import torch
    from torch import nn

    from mldbg.store import current_run
    from mldbg.weights.audit import audit_weights

    home = tmp_path / ".mldbg"
    monkeypatch.setenv("MLDBG_HOME", str(home))
    torch.manual_seed(0)
    full = nn.Sequential(nn.Linear(16, 64))
    current_run.reset()
    with torch.no_grad(), mldbg.capture(full, "ref") as cap:
        cap.save_weights()
        full(torch.randn(2, 16))
    for rank, inputs in ((0, 16), (1, 8)):  # rank 1 built with another input size
        current_run.reset()
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        part = nn.Sequential(nn.Linear(inputs, 32))
        with torch.no_grad(), mldbg.capture(part, "tp") as cap:
            cap.save_weights()
            part(torch.randn(2, inputs))
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    current_run.reset()
    for shards, words in (
        ({"0.bias": 1}, "0.bias has 1 dimension(s), no dimension 1"),
        ({"0.*": 0}, "0.weight: the ranks' slices differ in shape outside dimension 0"),
    ):
        with pytest.raises(CompareInputError, match=re.escape(words)) as caught:
            audit_weights("ref", "tp@rank*", shards=shards, home=home)
        assert caught.value.code == "bad_shards"
    body = {"reference": "ref", "port": "tp@rank*", "shards": {"0.*": 0}, "home": str(home)}
    assert api.post("/v1/weights", body, expect=400)["code"] == "bad_shards"


def test_a_rank_no_world_has_is_stray_not_counted_to() -> None:
    """Without a world size the ranks to look for run up to the highest rank: one
    ``capture.json`` saying rank 10**20 made that count never end (the capture fuzz)."""
    ranked = [{"name": "tp@rank0", "rank": 0}, {"name": "tp@rank1", "rank": 10**20}]
    with pytest.raises(CompareInputError, match="no rank below") as caught:
        gather.check_rank_set("tp@rank*", ranked)
    assert caught.value.extra["stray"] == ["tp@rank1"] and caught.value.extra["missing"] == []
