"""break --nonfinite: the first module call whose output goes bad stops the script, live."""

from __future__ import annotations

import pytest

from conftest import Session, line_of

torch = pytest.importorskip("torch")

TORCH_NET = """
import sys
import torch
from torch import nn

SCALE = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0

class Bad(nn.Module):
    def forward(self, x):
        return torch.log(x.abs() - 10) * SCALE  # NaN where |x| < 10

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bad = Bad()
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        h = self.lin(x)
        h = self.bad(h)  # call bad
        return self.norm(input=h)  # by keyword: the global pre-hook never sees it

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

torch.manual_seed(0)
net = Net()
with torch.no_grad():
    out = net(torch.randn(2, 4))
print("done", bool(torch.isnan(out).any()))
"""

MLX_NET = """
import mlx.core as mx
import mlx.nn as nn

class Gather(nn.Module):
    def __call__(self, x):
        return x * 1e-40  # subnormal garbage, like an out-of-bounds read

class Blow(nn.Module):
    def __call__(self, x):
        return mx.exp(mx.abs(x) * 1000 + 100)  # inf

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.gather = Gather()
        self.blow = Blow()

    def __call__(self, x):
        h = self.proj(x)
        g = self.gather(h)  # call gather
        return self.blow(h) + g  # call blow

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = [Block()]

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return x

mx.random.seed(0)
net = Net()
out = net(mx.ones((2, 4)))
mx.eval(out)
print("done")
"""


def test_torch_stops_where_nan_first_appears(session: Session, write) -> None:
    script = write("net.py", TORCH_NET)
    state = session.start(script)  # stops at entry, before torch is imported
    assert state["reason"] == "entry"
    bp = session.brk(None, None, nonfinite=True)
    assert bp["nonfinite"] is True and bp["id"] >= 1
    assert any("nonfinite" in b for b in session.call("breaks")["breakpoints"])

    state = session.cont(wait=60)
    assert state["reason"] == "tripwire", state
    trip = state["tripwire"]
    assert (
        trip["module"] == "layers.0.bad" and trip["class"] == "Bad" and trip["framework"] == "torch"
    )
    assert trip["found"][0]["name"] == "out" and trip["found"][0]["nan"] > 0
    # the frame that made the call, live: the block's forward, at the call
    assert state["location"]["line"] == line_of(script, "call bad")
    assert state["location"]["function"] == "forward"
    assert "layers.0.bad" in state["note"]
    assert session.value("h.shape") == "torch.Size([2, 4])"  # the caller's locals
    assert session.value("import mldbg; mldbg.tripped().path") == "'layers.0.bad'"
    assert session.value("bool(torch.isnan(mldbg.tripped().output).any())") == "True"
    assert session.value("bool(torch.isfinite(mldbg.tripped().args[0]).all())") == "True"

    # everything downstream receives the NaN: victims, never a second stop
    state = session.cont(wait=60)
    assert state["state"] == "exited" and state["exit_code"] == 0, state
    assert "done True" in session.output()


def test_torch_max_abs_and_removal(session: Session, write) -> None:
    script = write("net.py", TORCH_NET.replace("x.abs() - 10", "x.abs() + 1"))
    session.start(script, "1e6")  # finite, but huge
    bp = session.brk(None, None, max_abs=1e4)
    assert bp["max_abs"] == 1e4
    state = session.cont(wait=60)
    assert state["reason"] == "tripwire" and state["tripwire"]["module"] == "layers.0.bad", state
    assert state["tripwire"]["found"][0]["above_max_abs"] == 8
    session.call("remove", id=bp["id"])
    state = session.cont(wait=60)  # removed: the next block's bad output no longer stops
    assert state["state"] == "exited" and state["exit_code"] == 0, state


def test_tripwire_refuses_a_file_or_a_bad_bound(session: Session, write) -> None:
    script = write("net.py", TORCH_NET)
    session.start(script)
    error = session.brk(script, 3, expect=400, nonfinite=True)
    assert error["code"] == "bad_argument" and "tripwire" in error["error"]


def test_mlx_subnormal_garbage_then_inf(session: Session, write) -> None:
    pytest.importorskip("mlx.core")
    script = write("mlx_net.py", MLX_NET)
    session.start(script)
    session.brk(None, None, nonfinite=True, subnormal=True)
    state = session.cont(wait=60)
    assert state["reason"] == "tripwire", state
    trip = state["tripwire"]
    assert trip["module"] == "blocks.0.gather" and trip["framework"] == "mlx", trip
    assert trip["found"][0]["subnormal"] == 8 and trip["found"][0]["dtype"] == "float32"
    assert state["location"]["line"] == line_of(script, "call gather")
    state = session.cont(wait=60)
    assert state["reason"] == "tripwire" and state["tripwire"]["module"] == "blocks.0.blow"
    assert state["tripwire"]["found"][0]["inf"] == 8
    assert state["location"]["line"] == line_of(script, "call blow")
    assert session.value("h.shape") == "(2, 4)"
    wrapped = "getattr(type(net.blocks[0].gather).__call__, '_mldbg_tripwire', False)"
    assert session.value(wrapped) == "True"
    session.call("remove", id=state["tripwire"]["id"])
    assert session.value(wrapped) == "False"  # removed: every class is as it was
    state = session.cont(wait=60)
    assert state["state"] == "exited" and state["exit_code"] == 0, state
    assert "done" in session.output()


@pytest.mark.slow
def test_a_compiled_model_is_checked_as_a_whole(session: Session, write) -> None:
    """Inside a torch.compile graph nothing is checked (no values while tracing): the
    compiled module's own output trips, in the script's frame, not in dynamo's."""
    script = write(
        "compiled.py",
        """
        import torch
        from torch import nn

        class Bad(nn.Module):
            def forward(self, x):
                return torch.log(x - 100)

        net = torch.compile(nn.Sequential(nn.Linear(4, 4), Bad(), nn.Linear(4, 2)))
        with torch.no_grad():
            out = net(torch.randn(2, 4))  # call compiled
        print("done", bool(out.isnan().any()))
        """,
    )
    session.start(script)
    session.brk(None, None, nonfinite=True)
    state = session.cont(wait=120)
    assert state["reason"] == "tripwire", state
    assert state["tripwire"]["class"] == "OptimizedModule"
    assert state["location"]["line"] == line_of(script, "call compiled")
    assert session.run_to_end(120)["exit_code"] == 0


OUT_OF_RANGE = """
import mlx.core as mx

steps = 1000
sigmas = mx.linspace(1.0, 0.0, steps)  # a schedule of 1000 noise levels
ids = mx.array([3, 7, 1000])
table = mx.ones((4, 1000))
total = mx.array(0.0)
for i in range(steps + 1):  # one step too many
    sigma = sigmas[i]  # read sigma
    total = total + sigma
rows = mx.take(table[0], ids)  # read rows
mx.eval(total, rows)
print("done")
"""


def test_mlx_read_out_of_range_stops_where_it_is_read(session: Session, write) -> None:
    """``sigmas[1000]`` on 1000 elements: MLX returns whatever memory holds (subnormal
    garbage, or a plausible number, or it crashes), inline, in no module's output.  The
    tripwire checks the index, not the garbage: it stops at the read, before it runs."""
    pytest.importorskip("mlx.core")
    script = write("schedule.py", OUT_OF_RANGE)
    session.start(script)
    session.brk(None, None, nonfinite=True, subnormal=True)
    state = session.cont(wait=60)
    assert state["reason"] == "tripwire", state
    trip = state["tripwire"]
    assert trip["kind"] == "out_of_bounds" and trip["framework"] == "mlx", trip
    assert trip["operation"] == "array[...]"
    found = trip["found"][0]
    assert (found["index"], found["axis"], found["size"]) == (1000, 0, 1000), found
    assert found["shape"] == [1000] and found["dtype"] == "float32"
    assert state["location"]["line"] == line_of(script, "read sigma")
    assert session.value("i") == "1000"  # the caller's frame, live, before the read
    assert "out of range" in state["note"] and "1000" in state["note"]
    assert session.value("import mldbg; mldbg.tripped().args[1]") == "1000"
    # an index held in an array, through mx.take
    state = session.cont(wait=60)
    assert state["reason"] == "tripwire", state
    assert state["tripwire"]["operation"] == "mx.take"
    assert state["tripwire"]["found"][0]["index"] == 1000
    assert state["location"]["line"] == line_of(script, "read rows")
    session.api.post(f"{session.base}/remove", {"id": state["tripwire"]["id"]})
    assert session.value("type(mx.array.__getitem__).__name__") != "function"  # restored
    state = session.cont(wait=60)  # removed: the reads run, with whatever MLX reads there
    assert state["state"] in ("exited", "crashed"), state
