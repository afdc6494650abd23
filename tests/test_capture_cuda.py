"""A capture of a model on a CUDA GPU: copies queued on the model's stream into pinned
memory (the host never waits for them), calls timed with events.

These tests need a GPU and are skipped without one; they are the checks that the
asynchronous copies hold the values each call computed, whatever the model does to
its tensors after the call, and that every call still gets its time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import mldbg  # noqa: E402
from mldbg.capture.device_async import PendingCopy  # noqa: E402
from mldbg.compare.read.load import captured_tensor  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("home"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class Overwrites(torch.nn.Module):
    """Changes its children's outputs in place right after each call, on the GPU, and
    hands a transposed (non-contiguous) view along."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(256, 256)
        self.second = torch.nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.first(x)
        y.mul_(0)  # queued after the copy of first's output: the capture keeps y
        z = self.second(x).t()
        z.add_(1)
        for _ in range(20):  # GPU work queued behind the copies
            z = z @ torch.eye(z.shape[1], device=z.device)
        return z.t() + y


def index(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (path / "index.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cuda_capture_holds_what_each_call_computed(home: Path, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = Overwrites().cuda().to(dtype)
    x = torch.randn(512, 256, device="cuda", dtype=dtype)
    with torch.no_grad():
        expected_first = model.first(x).cpu()
        expected_second = model.second(x).cpu()
        with mldbg.capture(model, f"gpu-{str(dtype)[6:]}") as cap:
            out = model(x)
        assert cap.background
        first = captured_tensor(cap.name, "first#0.out", to="torch", home=home)
        second = captured_tensor(cap.name, "second#0.out", to="torch", home=home)
        root = captured_tensor(cap.name, "<root>#0.out", to="torch", home=home)
    assert torch.equal(first, expected_first)
    assert torch.equal(second, expected_second)
    assert torch.equal(root, out.cpu())
    returns = [r for r in index(cap.path) if r["event"] == "return"]
    assert all(r.get("seconds", -1.0) >= 0.0 for r in returns), returns
    # every call timed from the device's events (how long is for benchmarks/, not here)


def test_a_cuda_tensor_is_copied_without_waiting_for_the_gpu() -> None:
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(50):  # queued GPU work the copy waits behind
        big = torch.tanh(big @ big)
    pending = PendingCopy.start(big)
    assert pending is not None and pending.host.is_pinned()
    assert pending.nbytes == big.numel() * 4
    expected = big.clone()
    big.zero_()  # queued behind the copy on the same stream
    assert torch.equal(pending.wait(), expected.cpu())
