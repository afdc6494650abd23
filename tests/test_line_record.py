"""The line step's recording (``$MLDBG_LINES``): what each line of a scope computes.

Scripts run unmodified under the real daemon and agent with ``$MLDBG_LINES`` set, as
``mldbg line`` runs them; the records they leave in ``runs/<run>/lines/`` are read back.
Plain Python floats need no framework, so the tracer part runs on every backend (the
other Pythons here have no numpy, torch or MLX); torch and MLX scopes run on the suite's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from conftest import Session, backend_params, line_of, wait_until

FLOATS = """
import math


def scale(x, factor):
    y = x * factor
    return y + 0.5


def main():
    total = 0.0
    values = []
    for step in range(3):
        a = math.sqrt(step + 1.0)
        b = scale(a, 2.0)
        values.append(b)
        total = total + b
    return total


main()
"""


def run_lines(
    session: Session, script: Path, spec: dict[str, Any], python: str | None = None
) -> Path:
    """Run ``script`` to its end with ``spec`` as ``$MLDBG_LINES``; its lines directory."""
    env = {**os.environ, "MLDBG_HOME": str(session.cwd / ".mldbg"), "MLDBG_LINES": json.dumps(spec)}
    session.start(script, python=python, stop_on_entry=False, env=env)

    def ended() -> dict[str, Any] | None:
        state: dict[str, Any] = session.wait(10.0)
        return None if state["state"] in ("starting", "running", "paused") else state

    state = wait_until(ended, timeout=240, what=f"{script.name} to end")
    assert state.get("exit_code") == 0, (state, session.output())
    runs = sorted(
        (session.cwd / ".mldbg" / "runs").glob("*/lines"), key=lambda p: p.stat().st_mtime
    )
    assert runs, session.output()
    return runs[-1]


def records_of(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / "records.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("python", backend_params())
def test_site_scope_records_each_line_of_the_function_on_every_backend(
    session: Session, write: Any, python: str
) -> None:
    script = write("floats.py", FLOATS)
    site = f"{script}:{line_of(script, 'b = scale(a, 2.0)')}"
    spec = {"side": "a", "kind": "glue", "model": 1, "module": "", "call": 0, "sites": [site]}
    lines = run_lines(session, script, spec, python)
    records = records_of(lines)
    scope = json.loads((lines / "scope.json").read_text())
    assert scope["reached"] is False  # no model in this script: the scope ran to the end
    by_name: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_name.setdefault(record["name"], []).append(record)
    # each iteration's values, on the line that bound them, with its text
    assert [r["line"] for r in by_name["a"]] == [line_of(script, "a = math.sqrt")] * 3
    assert [r["head"][0] for r in by_name["a"]] == pytest.approx([1.0, 2**0.5, 3**0.5])
    assert [r["head"][0] for r in by_name["b"]] == pytest.approx(
        [2 * x + 0.5 for x in (1.0, 2**0.5, 3**0.5)]
    )
    assert by_name["b"][0]["text"] == "b = scale(a, 2.0)"
    # scale() itself is not the site's function: only main's own lines are recorded
    assert "y" not in by_name
    # b was computed from a (the names its line reads), and values.append(b) grew a list
    a0, b0 = by_name["a"][0], by_name["b"][0]
    assert b0["reads"] == [a0["seq"]]
    assert [r["name"] for r in by_name["values[0]"]] == ["values[0]"]
    assert by_name["values[0]"][0]["alias"] == b0["seq"]  # the very object b holds
    totals = by_name["total"]
    assert totals[-1]["head"][0] == pytest.approx(sum(r["head"][0] for r in by_name["b"]))
    assert b0["seq"] in totals[1]["reads"]
    assert all(r["hit"] == i + 1 for i, r in enumerate(by_name["a"]))
    # what main returns (the return event, on every backend): the object total holds
    (returned,) = by_name["return"]
    assert returned["function"] == "main" and returned["alias"] == totals[-1]["seq"]


TORCH_MODEL = """
import torch
import torch.nn.functional as F


def rotate(x, cos, sin):
    x1, x2 = x[..., ::2], x[..., 1::2]
    turned = torch.stack([-x2, x1], dim=-1).flatten(-2)
    return x * cos + turned * sin


class Attention(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x, cos, sin):
        b, n, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, n, self.heads, -1).transpose(1, 2)
        k = k.view(b, n, self.heads, -1).transpose(1, 2)
        v = v.view(b, n, self.heads, -1).transpose(1, 2)
        q = rotate(q, cos, sin)
        k = rotate(k, cos, sin)
        self.last_q = q
        attn = F.scaled_dot_product_attention(q, k, v)
        merged = attn.transpose(1, 2).reshape(b, n, d)
        return self.out(merged)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.attn = Attention(32, 4)

    def forward(self, x, cos, sin):
        return x + self.attn(self.norm(x), cos, sin)


torch.manual_seed(0)
block = Block().eval()
x = torch.randn(1, 6, 32)
angles = torch.arange(6.0)[:, None] * torch.ones(8)
cos, sin = angles.cos(), angles.sin()
with torch.no_grad():
    for _ in range(2):
        x = block(x, cos, sin)
print("done")
"""


def test_module_scope_records_the_forward_and_what_it_calls_in_torch(
    session: Session, write: Any
) -> None:
    pytest.importorskip("torch")
    script = write("attention.py", TORCH_MODEL)
    spec = {"side": "a", "kind": "module", "model": 1, "module": "attn", "call": 1}
    lines = run_lines(session, script, spec)
    scope = json.loads((lines / "scope.json").read_text())
    assert scope["reached"] is True and scope["skipped"] == 0, scope
    records = records_of(lines)
    names = [(r["function"], r["name"]) for r in records]
    # the culprit's forward, the helper it calls, and nothing of torch's own code
    assert ("Attention.forward", "q") in names and ("rotate", "turned") in names
    assert not any("torch" in r["file"] for r in records)
    # its arguments (the block's norm output, passed straight in) and its return value
    assert ("Attention.forward", "Attention.forward(x)") in names
    assert ("Attention.forward", "return") in names
    # one call only: the second (call 1); the first was not recorded
    forwards = {r["frame"] for r in records if r["function"] == "Attention.forward"}
    assert len(forwards) == 1
    # rotate's return value is the object q is then bound to: an alias, its reads the return
    q_lines = [r for r in records if r["function"] == "Attention.forward" and r["name"] == "q"]
    rotated = q_lines[-1]
    returned = next(r for r in records if r["seq"] == rotated["alias"])
    assert returned["function"] == "rotate" and returned["name"] == "return"
    assert returned["text"] == "return x * cos + turned * sin"
    # rotate's x is the q the forward passed: its reads reach the forward's records
    turned = next(r for r in records if r["name"] == "turned")
    x1 = next(r for r in records if r["function"] == "rotate" and r["name"] == "x1")
    assert x1["seq"] in turned["reads"]
    # self.last_q = q is an attribute the line set (an alias of q); sdpa's parts are values
    # of the line that called it, before the line's own value
    attribute = next(r for r in records if r["name"] == "self.last_q")
    assert attribute["alias"] == returned["seq"]  # the object, whatever name bound it first
    fused = [r for r in records if r["kind"] == "fused"]
    assert [r["name"] for r in fused] == ["sdpa.scores", "sdpa.probs"]
    attn = next(r for r in records if r["name"] == "attn")
    assert fused[0]["line"] == attn["line"] and fused[-1]["seq"] < attn["seq"]
    assert attn["shape"] == [1, 4, 6, 8] and attn["dtype"] == "F32"
    assert all("exact" in r or "sketches" in r for r in records if r["alias"] is None)


MLX_MODEL = """
import mlx.core as mx
import mlx.nn as nn


def rotate(x, cos, sin):
    x1, x2 = x[..., ::2], x[..., 1::2]
    turned = mx.stack([-x2, x1], axis=-1).reshape(x.shape)
    return x * cos + turned * sin


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def __call__(self, x, cos, sin):
        b, n, d = x.shape
        q, k, v = mx.split(self.qkv(x), 3, axis=-1)
        q = q.reshape(b, n, self.heads, -1).transpose(0, 2, 1, 3)
        k = k.reshape(b, n, self.heads, -1).transpose(0, 2, 1, 3)
        v = v.reshape(b, n, self.heads, -1).transpose(0, 2, 1, 3)
        q = rotate(q, cos, sin)
        k = rotate(k, cos, sin)
        scores = (q @ k.transpose(0, 1, 3, 2)) * (q.shape[-1] ** -0.5)
        attn = mx.softmax(scores, axis=-1) @ v
        merged = attn.transpose(0, 2, 1, 3).reshape(b, n, d)
        return self.out(merged)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.attn = Attention(32, 4)

    def __call__(self, x, cos, sin):
        return x + self.attn(self.norm(x), cos, sin)


mx.random.seed(0)
block = Block()
x = mx.random.normal((1, 6, 32))
angles = mx.arange(6.0)[:, None] * mx.ones(8)
cos, sin = mx.cos(angles), mx.sin(angles)
for _ in range(2):
    x = block(x, cos, sin)
mx.eval(x)
print("done")
"""


def test_module_scope_records_an_mlx_forward_its_operators_included(
    session: Session, write: Any
) -> None:
    pytest.importorskip("mlx.core")
    script = write("attention_mlx.py", MLX_MODEL)
    spec = {"side": "b", "kind": "module", "model": 1, "module": "attn", "call": 0}
    lines = run_lines(session, script, spec)
    scope = json.loads((lines / "scope.json").read_text())
    assert scope["reached"] is True, scope
    records = records_of(lines)
    by_name = {(r["function"], r["name"]): r for r in records}
    # array operators and methods (@, *, .reshape, [..., ::2]) are lines like any other
    scores = by_name[("Attention.__call__", "scores")]
    assert scores["shape"] == [1, 4, 6, 6] and scores["dtype"] == "F32"
    q = [r for r in records if r["function"] == "Attention.__call__" and r["name"] == "q"][-1]
    k = [r for r in records if r["function"] == "Attention.__call__" and r["name"] == "k"][-1]
    assert scores["reads"] == sorted([q["seq"], k["seq"]])
    assert ("rotate", "x1") in by_name and ("rotate", "return") in by_name
    assert not any("/mlx/" in r["file"] for r in records)
    assert {r["frame"] for r in records if r["function"] == "Attention.__call__"} == {1}
