"""mldbg.capture on real torch and MLX modules: names, order, nesting, exact values, restore."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as mnn
import numpy as np
import pytest
import torch
from torch import nn

import mldbg
from conftest import Session, line_of
from mldbg import current_run
from mldbg.compare.arrays import map_safetensors


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / "store"))
    current_run.reset()
    yield tmp_path / "store"
    current_run.reset()


def index(cap: mldbg.Capture) -> list[dict]:
    assert cap.path is not None
    return [json.loads(line) for line in (cap.path / "index.jsonl").read_text().splitlines()]


def stored(cap: mldbg.Capture) -> dict[str, np.ndarray]:
    """Every captured tensor by entry name, read back from disk."""
    assert cap.path is not None
    found = {}
    for record in index(cap):
        for name, info in record.get("tensors", {}).items():
            found[name] = np.array(map_safetensors(cap.path / record["file"], info["key"]))
    return found


class Pair(nn.Module):
    """Returns a tuple and a dict, and calls one child twice."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> tuple:
        h = self.act(self.proj(x))
        h2 = self.act(self.proj(h) * scale)
        return h, {"second": h2, "none": None}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Pair()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, extra = self.block(x, scale=torch.tensor(2.0))
        return self.head(h + extra["second"])


def test_torch_capture_names_order_nesting_and_exact_values(home: Path) -> None:
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(3, 4)
    with torch.no_grad(), mldbg.capture(net, "ref") as cap:
        y = net(x)
    assert cap.path is not None and cap.path.parent.parent.parent == home / "runs"
    meta = json.loads((cap.path / "capture.json").read_text())
    assert meta["state"] == "complete" and meta["framework"] == "torch"
    assert meta["records"] == cap.records == 7  # root, block, proj x2, act x2, head
    records = index(cap)
    calls = [(r["module"], r["call"], r["depth"]) for r in records if r["event"] == "call"]
    assert calls == [
        ("", 0, 0),
        ("block", 0, 1),
        ("block.proj", 0, 2),
        ("block.act", 0, 2),
        ("block.proj", 1, 2),
        ("block.act", 1, 2),
        ("head", 0, 1),
    ]
    values = stored(cap)
    assert set(values) >= {
        "<root>#0.in.0",
        "<root>#0.out",
        "block#0.in.0",
        "block#0.in.scale",
        "block#0.out.0",
        "block#0.out.1.second",
        "block.proj#1.out",
        "block.act#1.out",
    }
    assert not any(name.endswith(".none") for name in values)
    np.testing.assert_array_equal(values["<root>#0.in.0"], x.numpy())
    np.testing.assert_array_equal(values["<root>#0.out"], y.numpy())
    with torch.no_grad():
        h = net.block.act(net.block.proj(x))
    np.testing.assert_array_equal(values["block.act#0.out"], h.numpy())
    np.testing.assert_array_equal(values["block.proj#1.in.0"], h.numpy())
    # Hooks are gone: the model runs exactly as before and records nothing more.
    for module in net.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    with torch.no_grad():
        assert torch.equal(net(x), y)
    assert len(index(cap)) == len(records)


def test_torch_capture_keeps_bf16_and_closes_calls_when_forward_raises(home: Path) -> None:
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("kaboom")

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4).to(torch.bfloat16)
            self.boom = Boom()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.boom(self.lin(x))

    model = Outer()
    x = torch.randn(2, 4, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="kaboom"), mldbg.capture(model, "boom") as cap:
        model(x)
    meta = json.loads((cap.path / "capture.json").read_text())
    assert meta["state"] == "failed" and "kaboom" in meta["error"]
    ends = {r["seq"]: r for r in index(cap) if r["event"] == "return"}
    assert "kaboom" in ends[2]["error"] and "kaboom" in ends[0]["error"]
    assert "error" not in ends[1]
    lin_out = [r for r in index(cap) if r["event"] == "return" and r["seq"] == 1][0]
    assert lin_out["tensors"]["lin#0.out"]["dtype"] == "BF16"
    raw = map_safetensors(cap.path / lin_out["file"], "out")
    expected = model.lin(x).detach().view(torch.int16).numpy()
    np.testing.assert_array_equal(np.asarray(raw).view(np.int16), expected)
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


def test_include_exclude_and_inputs_off(home: Path) -> None:
    net = Net().eval()
    with (
        torch.no_grad(),
        mldbg.capture(net, "some", include="block*", exclude="*.act", inputs=False) as cap,
    ):
        net(torch.randn(1, 4))
    modules = [r["module"] for r in index(cap) if r["event"] == "call"]
    assert modules == ["block", "block.proj", "block.proj"]
    assert all(".in" not in name for name in stored(cap))


def test_same_name_twice_in_one_run_keeps_both(home: Path) -> None:
    net = Net().eval()
    paths = []
    for _ in range(2):
        with torch.no_grad(), mldbg.capture(net, "again") as cap:
            net(torch.randn(1, 4))
        paths.append(cap.path)
    assert paths[0].name == "again" and paths[1].name == "again-2"
    assert json.loads((paths[1] / "capture.json").read_text())["name"] == "again"


def test_bad_arguments_say_what_to_do() -> None:
    with pytest.raises(TypeError, match="torch.nn.Module or an mlx.nn.Module"):
        mldbg.capture(object(), "x")
    with pytest.raises(ValueError, match="bad capture name"):
        mldbg.capture(Net(), "../escape")
    with pytest.raises(TypeError, match="glob patterns"):
        mldbg.capture(Net(), "x", include=[3])  # type: ignore[list-item]


class MBlock(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = mnn.Linear(4, 4)
        self.act = mnn.ReLU()

    def __call__(self, x: mx.array, scale: float = 1.0) -> tuple:
        h = self.act(self.proj(x))
        return h, {"second": self.act(self.proj(h) * scale)}


class MNet(mnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = [MBlock(), MBlock()]
        self.head = mnn.Linear(4, 2)

    def __call__(self, x: mx.array) -> mx.array:
        for block in self.blocks:
            h, extra = block(x, scale=2.0)
            x = h + extra["second"]
        return self.head(x)


def test_mlx_capture_wraps_instances_and_restores_them(home: Path) -> None:
    mx.random.seed(0)
    net = MNet()
    classes = {name: type(m) for name, m in net.named_modules()}
    x = mx.random.normal((3, 4))
    expected = net(x)
    with mldbg.capture(net, "port") as cap:
        assert isinstance(net.blocks[0], MBlock) and type(net.blocks[0]).__name__ == "MBlock"
        y = net(x)
    assert {name: type(m) for name, m in net.named_modules()} == classes
    assert "__call__" not in vars(MBlock) or MBlock.__call__.__qualname__ == "MBlock.__call__"
    np.testing.assert_array_equal(np.array(y), np.array(expected))
    calls = [(r["module"], r["call"]) for r in index(cap) if r["event"] == "call"]
    assert calls[:5] == [
        ("", 0),
        ("blocks.0", 0),
        ("blocks.0.proj", 0),
        ("blocks.0.act", 0),
        ("blocks.0.proj", 1),
    ]
    values = stored(cap)
    np.testing.assert_array_equal(values["<root>#0.out"], np.array(expected))
    np.testing.assert_array_equal(values["head#0.out"], np.array(expected))
    assert "blocks.0#0.out.1.second" in values and "blocks.0#0.out.0" in values
    np.testing.assert_array_equal(
        values["blocks.0.act#0.out"], np.array(net.blocks[0].act(net.blocks[0].proj(x)))
    )


def test_mlx_capture_restores_on_error_and_keeps_bf16(home: Path) -> None:
    class Fails(mnn.Module):
        def __call__(self, x: mx.array) -> mx.array:
            raise ValueError("bad shapes")

    class Holder(mnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = mnn.Linear(4, 4)
            self.lin.set_dtype(mx.bfloat16)
            self.fails = Fails()

        def __call__(self, x: mx.array) -> mx.array:
            return self.fails(self.lin(x))

    model = Holder()
    before = {name: type(m) for name, m in model.named_modules()}
    x = mx.random.normal((2, 4)).astype(mx.bfloat16)
    with pytest.raises(ValueError, match="bad shapes"), mldbg.capture(model, "err") as cap:
        model(x)
    assert {name: type(m) for name, m in model.named_modules()} == before
    records = index(cap)
    lin_out = next(r for r in records if r["event"] == "return" and r["seq"] == 1)
    assert lin_out["tensors"]["lin#0.out"]["dtype"] == "BF16"
    got = np.asarray(map_safetensors(cap.path / lin_out["file"], "out")).view(np.uint16)
    want = np.array(model.lin(x).view(mx.uint16))
    np.testing.assert_array_equal(got, want)
    assert json.loads((cap.path / "capture.json").read_text())["state"] == "failed"


def test_nested_mlx_captures_unwind(home: Path) -> None:
    net = MNet()
    original = type(net.head)
    with mldbg.capture(net, "outer") as outer:
        with mldbg.capture(net, "inner", include="head") as inner:
            net(mx.ones((1, 4)))
        assert type(net.head) is not original
    assert type(net.head) is original
    assert [r["module"] for r in index(inner) if r["event"] == "call"] == ["head"]
    assert (
        sum(1 for r in index(outer) if r["event"] == "call") == 12
    )  # root, 2 x (block, proj x2, act x2), head


def test_capture_in_a_plain_script_lands_in_its_run(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(
        "import torch, mldbg\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh())\n"
        "with mldbg.capture(m, 'seq'):\n"
        "    m(torch.ones(1, 2))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "MLDBG_HOME"}
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "mldbg", "captures", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    (item,) = json.loads(listed.stdout)["captures"]
    assert item["name"] == "seq" and item["records"] == 3 and item["state"] == "complete"
    assert Path(item["path"]).is_relative_to(tmp_path / ".mldbg" / "runs")


def test_capture_under_the_debugger_lands_in_the_session_run(session: Session, write) -> None:
    """A breakpoint inside a captured forward stops as usual; the capture joins the run."""
    script = write(
        "dbg_capture.py",
        """
        import torch, mldbg

        class Scale(torch.nn.Module):
            def forward(self, x):
                y = x * 2  # inside
                return y

        model = torch.nn.Sequential(torch.nn.Linear(2, 2), Scale())
        with torch.no_grad(), mldbg.capture(model, "dbg") as cap:
            model(torch.ones(1, 2))
        print("records", cap.records)
    """,
    )
    assert session.start(script, python=sys.executable)["reason"] == "entry"
    session.brk(script, line_of(script, "# inside"))
    state = session.cont()
    assert state["reason"] == "breakpoint", state
    assert session.value("tuple(x.shape)") == "(1, 2)"
    final = session.run_to_end()
    assert final["exit_code"] == 0 and "records 3" in session.output()
    meta = json.loads((Path(final["run_dir"]) / "captures" / "dbg" / "capture.json").read_text())
    assert meta["state"] == "complete" and meta["records"] == 3
