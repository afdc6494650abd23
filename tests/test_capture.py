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
from mldbg.compare.read.arrays import map_safetensors

pytestmark = pytest.mark.usefixtures("home")  # a private run store (conftest)


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


def test_a_model_under_inference_mode_is_captured_and_measured(home: Path) -> None:
    """Tensors made under ``torch.inference_mode()`` keep no version counter: reading it
    (to hold a leaf's output for its parent's rounding re-run) raised RuntimeError into
    the model's forward, so a script that ran its model that way crashed under capture."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4)).eval()
    x = torch.randn(2, 8)
    # sensitivity="all": the two Linears are one kind, which a default capture re-runs
    # once it proved benign; here every call's measurement must survive inference mode.
    with torch.inference_mode(), mldbg.capture(model, "inference", sensitivity="all") as cap:
        model(x)
    lines = [json.loads(line) for line in (cap.path / "index.jsonl").read_text().splitlines()]
    returns = [line for line in lines if line["event"] == "return"]
    assert len(returns) == 4 and all("error" not in line for line in returns)
    assert sum("sensitivity" in line for line in returns) == 4  # three leaves, their parent
    result = mldbg.compare("inference", "inference")
    assert result.ok


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


def test_same_name_twice_in_one_run_keeps_both_under_their_own_names(
    home: Path, tmp_path: Path
) -> None:
    net = Net().eval()
    caps = []
    for _ in range(2):
        with torch.no_grad(), mldbg.capture(net, "again") as cap:
            net(torch.randn(1, 4))
        caps.append(cap)
    assert [c.path.name for c in caps] == ["again", "again-2"]
    assert [c.name for c in caps] == ["again", "again-2"]
    metas = [json.loads((c.path / "capture.json").read_text()) for c in caps]
    assert metas[0]["name"] == "again" and "requested_name" not in metas[0]
    assert metas[1]["name"] == "again-2" and metas[1]["requested_name"] == "again"
    env = {**__import__("os").environ, "MLDBG_HOME": str(home)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mldbg", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    listed = cli("captures", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(c["name"] for c in json.loads(listed.stdout)["captures"]) == ["again", "again-2"]
    compared = cli("compare", "--json", "again-2", "again")
    assert compared.returncode in (0, 1), compared.stdout + compared.stderr
    result = json.loads(compared.stdout)
    assert Path(result["a"]["path"]) == caps[1].path and Path(result["b"]["path"]) == caps[0].path


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


# -- write failures, odd values, odd modules ---------------------------------------------------

FULL_DISK_SCRIPT = """
import json, os, resource, signal, sys
import torch, mldbg

class Step(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x):
        for _ in range(20):
            x = torch.tanh(self.lin(x))
        if self.fail:
            raise ValueError("the model's own error")
        return x

torch.manual_seed(0)
model, x = Step(), torch.randn(16, 64)
model.fail = False
with torch.no_grad():
    expected = model(x)
model.fail = sys.argv[1] == "raise"
# Every file this process writes is cut at 3000 bytes: the capture's tensor files (4 KiB
# each), then its index and its final capture.json fail with EFBIG, as on a full disk.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
raised = None
try:
    with torch.no_grad(), mldbg.capture(model, "full") as cap:
        y = model(x)
except BaseException as exc:
    raised = f"{type(exc).__name__}: {exc}"
    y = expected
print(json.dumps({
    "raised": raised,
    "same": bool(torch.equal(y, expected)),
    "errors": cap.errors,
    "path": str(cap.path),
}))
"""


@pytest.mark.parametrize("mode", ["return", "raise"])
def test_a_full_disk_never_reaches_the_model(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK_SCRIPT)
    env = {**__import__("os").environ, "MLDBG_HOME": str(tmp_path / "store")}
    result = subprocess.run(
        [sys.executable, str(script), mode],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    if mode == "raise":  # the model's exception, not an OSError from the capture
        assert report["raised"] == "ValueError: the model's own error"
    else:
        assert report["raised"] is None and report["same"]
    errors = report["errors"]
    assert any(e.startswith("<root>#0.in: ") and "File too large" in e for e in errors), errors
    assert any(e.startswith("lin#") and "File too large" in e for e in errors), errors
    assert any(": index.jsonl: " in e and "File too large" in e for e in errors), errors
    assert any(e.startswith("capture.json: ") for e in errors), errors
    capture_dir = Path(report["path"])
    assert not [p.name for p in capture_dir.iterdir() if p.name.startswith(".")]  # no temp files
    lines = (capture_dir / "index.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert first["module"] == "" and "File too large" in first["write_error"]


def test_one_unsavable_tensor_skips_alone(home: Path) -> None:
    class Spectrum(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple:
            return torch.fft.fft(x.double()), x * 2, {"ok": x + 1}

    model = Spectrum()
    x = torch.randn(2, 4)
    with mldbg.capture(model, "cplx") as cap:
        model(x)
    assert cap.errors == []
    (out,) = [r for r in index(cap) if r["event"] == "return"]
    assert set(out["tensors"]) == {"<root>#0.out.1", "<root>#0.out.2.ok"}
    assert "complex128" in out["skipped"]["<root>#0.out.0"]
    np.testing.assert_array_equal(stored(cap)["<root>#0.out.1"], (x * 2).numpy())


def test_one_unsavable_mlx_array_skips_alone(home: Path) -> None:
    class Wide(mnn.Module):
        def __call__(self, x: mx.array) -> tuple:
            return x.astype(mx.float64), x * 2

    model = Wide()
    x = mx.ones((2, 3))
    with mx.stream(mx.cpu), mldbg.capture(model, "f64") as cap:
        model(x)
    assert cap.errors == []
    (out,) = [r for r in index(cap) if r["event"] == "return"]
    assert set(out["tensors"]) == {"<root>#0.out.1"}
    assert "float64" in out["skipped"]["<root>#0.out.0"]
    np.testing.assert_array_equal(stored(cap)["<root>#0.out.1"], np.full((2, 3), 2.0))


def test_a_call_inside_an_except_block_is_not_an_error(home: Path) -> None:
    class Silent(nn.Module):
        def forward(self, x: torch.Tensor) -> None:
            return None

    class Handler(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = Silent()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            try:
                raise KeyError("unrelated")
            except KeyError:
                self.c(x)
                try:
                    self.c.forward = lambda x: (_ for _ in ()).throw(ValueError("own"))
                    self.c(x)
                except ValueError:
                    pass
                del self.c.forward
            return x

    model = Handler()
    with mldbg.capture(model, "handled") as cap:
        model(torch.ones(2))
    ends = {r["seq"]: r for r in index(cap) if r["event"] == "return"}
    assert "error" not in ends[1]  # returned None inside the `except KeyError`
    assert ends[2]["error"] == "ValueError: own"  # raised its own exception there
    assert "error" not in ends[0]


def test_torch_compile_is_captured_under_eager_names(home: Path) -> None:
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    compiled = torch.compile(eager, backend="eager")
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = eager(x)
        compiled(x)  # compiled before the capture: dynamo recompiles for the hooks
        with mldbg.capture(compiled, "comp") as cap:
            y = compiled(x)
        assert torch.equal(compiled(x), expected)
    assert torch.equal(y, expected) and cap.errors == []
    calls = [r["module"] for r in index(cap) if r["event"] == "call"]
    assert calls == ["", "0", "1", "2"]
    assert len(index(cap)) == 8  # the call after the capture recorded nothing
    meta = json.loads((cap.path / "capture.json").read_text())
    assert meta["model_class"] == "torch.nn.modules.container.Sequential"
    np.testing.assert_array_equal(stored(cap)["<root>#0.out"], expected.numpy())
    for module in eager.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_and_fullgraph_are_refused_before_anything_is_written(home: Path) -> None:
    eager = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="TorchScript.*Capture the eager torch.nn.Module"):
        mldbg.capture(torch.jit.script(eager), "js")
    holder = nn.Sequential(nn.ReLU())
    holder.add_module("traced", torch.jit.trace(nn.Linear(2, 2), torch.ones(1, 2)))
    with pytest.raises(TypeError, match="submodule 'traced'"):
        mldbg.capture(holder, "jt")
    with pytest.raises(TypeError, match="fullgraph=True"):
        mldbg.capture(torch.compile(eager, backend="eager", fullgraph=True), "fg")
    assert not home.exists()


def test_mlx_captures_may_end_in_any_order(home: Path) -> None:
    net = MNet()
    before = {name: type(m) for name, m in net.named_modules()}
    first, second = mldbg.capture(net, "first"), mldbg.capture(net, "second")
    first.__enter__()
    second.__enter__()
    net(mx.ones((1, 4)))
    first.__exit__(None, None, None)
    net(mx.ones((1, 4)))  # only the second capture still records
    second.__exit__(None, None, None)
    assert {name: type(m) for name, m in net.named_modules()} == before
    assert sum(r["event"] == "call" for r in index(first)) == 12
    assert sum(r["event"] == "call" for r in index(second)) == 24
    with mldbg.capture(net, "third") as third:  # and a later capture works as usual
        net(mx.ones((1, 4)))
    assert sum(r["event"] == "call" for r in index(third)) == 12
    assert {name: type(m) for name, m in net.named_modules()} == before


def test_a_shared_module_gets_its_first_name_in_mlx_as_in_torch(home: Path) -> None:
    class TShared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            lin = nn.Linear(2, 2)
            self.first = lin
            self.layers = nn.ModuleList([nn.ReLU(), lin])
            self.table = nn.ModuleDict({"b": nn.Tanh(), "a": lin})
            self.second = lin

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.second(self.layers[0](x))
            return self.first(self.table["b"](x))

    class MShared(mnn.Module):
        def __init__(self) -> None:
            super().__init__()
            lin = mnn.Linear(2, 2)
            self.first = lin
            self.layers = [mnn.ReLU(), lin]
            self.table = {"b": mnn.Tanh(), "a": lin}
            self.second = lin

        def __call__(self, x: mx.array) -> mx.array:
            x = self.second(self.layers[0](x))
            return self.first(self.table["b"](x))

    with torch.no_grad(), mldbg.capture(t := TShared(), "t") as tcap:
        t(torch.ones(1, 2))
    with mldbg.capture(m := MShared(), "m") as mcap:
        m(mx.ones((1, 2)))
    torch_calls = [(r["module"], r["call"]) for r in index(tcap) if r["event"] == "call"]
    mlx_calls = [(r["module"], r["call"]) for r in index(mcap) if r["event"] == "call"]
    assert torch_calls == [("", 0), ("layers.0", 0), ("first", 0), ("table.b", 0), ("first", 1)]
    assert mlx_calls == torch_calls


def test_flatten_reports_truncation_depth_and_collisions(home: Path) -> None:
    class Odd(nn.Module):
        def forward(self, x: torch.Tensor) -> dict:
            return {
                "a.b": x,
                "a": {"b": x + 1},
                "many": [x * i for i in range(300)],
                "deep": [[[[[[[x - 1]]]]]]],
            }

    model = Odd()
    x = torch.arange(3.0)
    with mldbg.capture(model, "odd") as cap:
        model(x)
    (out,) = [r for r in index(cap) if r["event"] == "return"]
    values = stored(cap)
    np.testing.assert_array_equal(values["<root>#0.out.a.b"], x.numpy())
    np.testing.assert_array_equal(values["<root>#0.out.a.b~2"], (x + 1).numpy())
    assert "'out.a.b'" in out["renamed"]["<root>#0.out.a.b~2"]
    assert len(out["tensors"]) == 256
    assert "<root>#0.out.many.253" in values and "<root>#0.out.many.254" not in values
    assert "45 after it" in out["skipped"]["<root>#0.out.many.254"]
    assert "nested more than 6 levels" in out["skipped"]["<root>#0.out.deep.0.0.0.0.0"]


def test_no_room_for_the_capture_directory_leaves_the_model_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("MLDBG_HOME", str(blocker))
    net = Net().eval()
    x = torch.randn(1, 4)
    with (
        torch.no_grad(),
        pytest.warns(RuntimeWarning, match="cannot create the capture"),
        mldbg.capture(net, "nowhere") as cap,
    ):
        y = net(x)
    with torch.no_grad():
        assert torch.equal(y, net(x))
    assert cap.path is None and cap.records == 0
    assert len(cap.errors) == 1 and "cannot create the capture" in cap.errors[0]
    for module in net.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


def test_a_captured_tensor_by_its_entry_name(home: Path, tmp_path: Path) -> None:
    """mldbg.captured_tensor: the reference's tensor in any framework, bits kept, no index
    reading; a tuple's first element answers to the bare name."""
    torch.manual_seed(0)
    model = Net().to(torch.bfloat16)
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    with torch.no_grad(), mldbg.capture(model, "ref") as cap:
        model(x)
        expected = model.block.proj(x)
    got = mldbg.captured_tensor("ref", "block.proj#0.out", to="torch")
    assert got.dtype == torch.bfloat16 and torch.equal(
        got.view(torch.int16), expected.view(torch.int16)
    )
    as_mlx = mldbg.captured_tensor("ref", "block.proj#0.out", to="mlx")
    assert as_mlx.dtype == mx.bfloat16
    np.testing.assert_array_equal(
        np.array(as_mlx.view(mx.uint16)), expected.view(torch.int16).numpy().view(np.uint16)
    )
    as_numpy = mldbg.captured_tensor(str(cap.path), "block.proj#0.out", to="numpy")
    assert as_numpy.dtype.name == "bfloat16" and as_numpy.shape == (3, 4)
    # the tuple's first element, by the bare name, from another store (another repository)
    first = mldbg.captured_tensor("ref", "block#0.out", to="torch", home=home)
    assert torch.equal(first, mldbg.captured_tensor("ref", "block#0.out.0", to="torch"))
    # no `to`: this module imports both frameworks, so the capture's own (torch)
    assert isinstance(mldbg.captured_tensor("ref", "head#0.out"), torch.Tensor)
    with pytest.raises(KeyError, match=r"block\.proj#0\.out"):
        mldbg.captured_tensor("ref", "block.proj#0.outt")
    with pytest.raises(mldbg.CompareInputError, match="no-such"):
        mldbg.captured_tensor("no-such", "block#0.out")


class _Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)  # NaN for negative inputs


class _Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.root = _Sqrt()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.root(self.lin(x)))


def test_first_nonfinite_names_where_nan_appears(home: Path, cli) -> None:
    torch.manual_seed(0)
    model = _Chain()
    x = torch.randn(3, 4)
    with torch.no_grad(), mldbg.capture(model, "nan"):
        model(x)
    with torch.no_grad(), mldbg.capture(model, "nan-outputs", inputs=False):
        model(x)
    with torch.no_grad(), mldbg.capture(model.head, "clean"):
        model.head(x)
    expected_nan = int(torch.isnan(torch.sqrt(model.lin(x))).sum())
    assert expected_nan > 0
    found = mldbg.first_nonfinite("nan")
    first = found["first"]
    assert first["module"] == "root" and first["class"] == "_Sqrt" and first["inputs_checked"]
    assert first["entries"] == [
        {"name": "root#0.out", "shape": [3, 4], "dtype": "F32", "nan": expected_nan, "inf": 0}
    ]
    assert found["victims"] == 0  # the scan stops at the origin: head is never read
    assert mldbg.first_nonfinite("nan-outputs")["first"]["module"] == "root"
    assert mldbg.first_nonfinite("clean")["first"] is None
    store = ["--home", str(home)]
    shown = cli("nonfinite", "nan", *store, json_out=True)
    assert shown["first"]["module"] == "root"
    human = cli("nonfinite", "nan", *store).stdout
    assert "root#0 (_Sqrt) returned non-finite values first" in human
    error = cli("nonfinite", "no-such", *store, json_out=True, expect=1)
    assert error["code"] == "unknown_source"


class _Upcasting(nn.Module):
    """A bf16 block whose norm works in float32 (the reference) or not (the port)."""

    def __init__(self, upcast: bool) -> None:
        super().__init__()
        self.upcast = upcast
        self.proj = nn.Linear(4, 4).to(torch.bfloat16)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        if self.upcast:
            return self.norm(h.float()).to(torch.bfloat16)
        return self.norm.to(torch.bfloat16)(h)


def test_module_table_times_and_dtypes_side_by_side(home: Path, cli) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, dtype=torch.bfloat16)
    with torch.no_grad(), mldbg.capture(_Upcasting(upcast=True), "ref") as ref:
        ref.model(x)
    with torch.no_grad(), mldbg.capture(_Upcasting(upcast=False), "port") as port:
        port.model(x)
    alone = mldbg.module_table("ref")
    rows = {r["module"]: r for r in alone["rows"]}
    assert list(rows) == ["<root>", "proj", "norm"]  # execution order
    assert rows["norm"]["a"]["in_dtypes"] == ["F32"] and rows["norm"]["a"]["out_dtypes"] == ["F32"]
    root = rows["<root>"]["a"]
    assert root["seconds"] >= rows["proj"]["a"]["seconds"] + rows["norm"]["a"]["seconds"] >= 0
    assert root["self_seconds"] == pytest.approx(
        root["seconds"] - rows["proj"]["a"]["seconds"] - rows["norm"]["a"]["seconds"]
    )
    both = mldbg.module_table("ref", "port")
    paired = {r["module"]: r for r in both["rows"]}
    assert paired["norm"]["dtype_differs"] is True and paired["norm"]["b"]["in_dtypes"] == ["BF16"]
    assert paired["proj"]["dtype_differs"] is False
    assert both["summary"]["dtype_differences"] == 1
    assert both["summary"]["first_dtype_difference"]["module"] == "norm"
    by_time = mldbg.module_table("ref", "port", sort="time")["rows"]
    assert by_time[0]["module"] == "<root>"  # its time includes its children's
    store = ["--home", str(home)]
    assert cli("module-table", "ref", "port", *store, json_out=True)["summary"]["paired"] == 3
    human = cli("module-table", "ref", "port", *store).stdout
    assert "F32→F32" in human and "BF16→BF16" in human and "first: norm#0" in human


def test_module_table_of_an_mlx_capture_has_times(home: Path) -> None:
    model = mnn.Sequential(mnn.Linear(8, 8), mnn.ReLU(), mnn.Linear(8, 2))
    with mldbg.capture(model, "mlx-timed"):
        mx.eval(model(mx.ones((4, 8))))
    rows = mldbg.module_table("mlx-timed")["rows"]
    assert len(rows) == 4 and all(r["a"]["seconds"] is not None for r in rows), rows
    assert rows[0]["a"]["out_dtypes"] == ["F32"]
