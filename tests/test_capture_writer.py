"""The background writer: same files and index as a direct capture, bounded memory,
values as they were at the call even when the model changes them in place later."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import mldbg  # noqa: E402
from conftest import wait_until  # noqa: E402
from mldbg.capture import writer as writer_module  # noqa: E402
from mldbg.store import current_run  # noqa: E402


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / ".mldbg"))
    current_run.reset()
    yield tmp_path / ".mldbg"  # type: ignore[misc]
    current_run.reset()


class InPlace(torch.nn.Module):
    """Its parent changes the child's output in place right after the call."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        y.mul_(0)  # the captured lin output must still hold what lin returned
        return y + x


def index(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (path / "index.jsonl").read_text().splitlines()]


def test_background_capture_matches_direct_capture(home: Path) -> None:
    torch.manual_seed(0)
    model = InPlace()
    x = torch.randn(4, 16)
    with torch.no_grad(), mldbg.capture(model, "direct", background=False) as direct:
        model(x)
    with torch.no_grad(), mldbg.capture(model, "queued") as queued:
        model(x)
    assert queued.background and not direct.background
    strip = ("file", "site", "seconds", "sensitivity")  # where and how long: per run
    lines_a = [{k: v for k, v in r.items() if k not in strip} for r in index(direct.path)]
    lines_b = [{k: v for k, v in r.items() if k not in strip} for r in index(queued.path)]
    assert lines_a == lines_b  # same calls, same order, same tensors
    result = mldbg.compare("direct", "queued", home=home)
    assert result.ok and result.result["counts"]["compared"] == len(result.entries)
    # The in-place change after the call is not in the capture: lin's output is not zero.
    lin_out = result.entry("lin#0.out")
    assert lin_out["rms_a"] > 0.1
    meta = json.loads((queued.path / "capture.json").read_text())
    assert meta["state"] == "complete" and meta["background"] == {"waits": 0}


def test_a_torch_summary_is_computed_off_the_model_thread_with_the_same_numbers(
    home: Path,
) -> None:
    """A torch summary (statistics and sketch) is computed by the writer from the call's
    copy, by default: the same index lines and sketches as computed inline, and the
    in-place change after the call is not in it."""
    torch.manual_seed(1)
    model = InPlace()
    x = torch.randn(64, 16)
    with torch.no_grad(), mldbg.capture(model, "inline", mode="summary", background=False) as a:
        model(x)
    with torch.no_grad(), mldbg.capture(model, "queued", mode="summary") as b:
        model(x)
    assert b.background and not a.background
    strip = ("file", "site", "seconds", "sensitivity")
    lines_a = [{k: v for k, v in r.items() if k not in strip} for r in index(a.path)]
    lines_b = [{k: v for k, v in r.items() if k not in strip} for r in index(b.path)]
    assert lines_a == lines_b  # the statistics are in the index lines
    for line_a, line_b in zip(index(a.path), index(b.path), strict=True):
        if line_a.get("file"):
            assert (a.path / line_a["file"]).read_bytes() == (b.path / line_b["file"]).read_bytes()
    lin_out = next(
        r for r in index(b.path) if r["event"] == "return" and r["seq"] == 1 and r.get("tensors")
    )
    assert all(t["stats"]["rms"] > 0.1 for t in lin_out["tensors"].values()), lin_out


def test_a_summary_of_a_model_off_the_cpu_stays_on_its_device(home: Path) -> None:
    """A model with a tensor on another device (``meta`` here, as a GPU's would be): its
    summary is computed where its tensors are, inline, not from host copies; full
    captures copy to the host anyway and stay in the background."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4, device="meta"))
    assert not mldbg.capture(model, "m", mode="summary").background
    assert mldbg.capture(model, "f").background
    assert mldbg.capture(torch.nn.Linear(4, 4), "c", mode="summary").background


def test_writer_makes_the_producer_wait_when_full() -> None:
    """A writer stuck on a slow disk: the next submission past ``max_bytes`` waits until
    the queued bytes are written, then goes in; everything runs in submission order."""
    release = threading.Event()
    done: list[int] = []
    writer = writer_module.BackgroundWriter(max_bytes=100)
    writer.submit(lambda: (release.wait(30), done.append(1)), 80)
    submitted = threading.Event()

    def producer() -> None:
        writer.submit(lambda: done.append(2), 50)  # 80 + 50 > 100: must wait
        submitted.set()

    thread = threading.Thread(target=producer)
    thread.start()
    wait_until(lambda: writer.waits == 1, what="the producer to wait for room")
    assert not submitted.is_set()
    release.set()
    wait_until(submitted.is_set, what="the producer to get room")
    thread.join()
    writer.close()
    assert done == [1, 2]


def test_background_capture_under_a_tight_bound(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for about one call's tensors, every file is still written, in order."""
    monkeypatch.setattr(writer_module, "DEFAULT_MAX_BYTES", 64 * 1024)
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(8)])
    x = torch.randn(64, 128)  # 32 KB per tensor
    with torch.no_grad(), mldbg.capture(model, "tight") as cap:
        model(x)
    meta = json.loads((cap.path / "capture.json").read_text())
    assert meta["state"] == "complete" and meta["tensors"] == 2 * 9
    assert isinstance(meta["background"]["waits"], int)  # how often the model waited
    seqs = [r["seq"] for r in index(cap.path) if r["event"] == "call"]
    assert seqs == sorted(seqs)
    assert all((cap.path / r["file"]).exists() for r in index(cap.path) if r.get("file"))


def test_mlx_background_capture_writes_the_inline_bytes(home: Path) -> None:
    """MLX arrays are evaluated and exported on the model's thread, written on the
    writer's: the files are byte for byte those of an inline capture, for lazy inputs,
    bfloat16, a transposed (non-contiguous) output, a numpy input and a float64 array
    (skipped with the same reason), and other tools read them."""
    mx = pytest.importorskip("mlx.core")
    mnn = pytest.importorskip("mlx.nn")
    np = pytest.importorskip("numpy")
    from safetensors.torch import load_file

    class Mixed(mnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = mnn.Linear(8, 8)
            self.half = mnn.Linear(8, 8)
            self.half.set_dtype(mx.bfloat16)

        def __call__(self, x: object, extra: object) -> tuple[object, ...]:
            y = self.lin(x * 2 + 1)  # a lazy input: evaluated for the capture, not before
            return y.T, self.half(y.astype(mx.bfloat16)), extra, mx.ones((2,), dtype=mx.float64)

    class Outer(mnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Mixed()

        def __call__(self, x: object) -> object:
            return self.inner(x, np.arange(6, dtype=np.int32).reshape(2, 3))

    mx.random.seed(0)
    model = Outer()
    x = mx.random.normal((4, 8))
    with mldbg.capture(model, "inline", background=False) as inline:
        model(x)
    with mldbg.capture(model, "queued") as queued:
        model(x)
    assert queued.background and not inline.background
    # A summary is computed with MLX operations: on the model's thread, whatever is asked.
    assert not mldbg.capture(model, "s", mode="summary", background=True).background
    strip = ("file", "site", "seconds", "sensitivity")
    lines_a = [{k: v for k, v in r.items() if k not in strip} for r in index(inline.path)]
    lines_b = [{k: v for k, v in r.items() if k not in strip} for r in index(queued.path)]
    assert lines_a == lines_b
    files = sorted(p.name for p in inline.path.glob("*.safetensors"))
    assert files == sorted(p.name for p in queued.path.glob("*.safetensors")) and files
    for name in files:
        assert (inline.path / name).read_bytes() == (queued.path / name).read_bytes(), name
    out = next(r for r in index(queued.path) if r["event"] == "return" and r["seq"] == 1)
    assert out["tensors"]["inner#0.out.1"]["dtype"] == "BF16"
    assert "float64" in out["skipped"]["inner#0.out.3"]
    loaded = load_file(str(queued.path / out["file"]))  # the safetensors package reads it
    y = model.inner.lin(x * 2 + 1)
    np.testing.assert_array_equal(loaded["out.0"].numpy(), np.array(y.T))
    np.testing.assert_array_equal(
        loaded["out.2"].numpy(), np.arange(6, dtype=np.int32).reshape(2, 3)
    )
    half = mx.load(str(queued.path / out["file"]))["out.1"]  # and MLX, bfloat16 included
    assert half.dtype == mx.bfloat16
    np.testing.assert_array_equal(
        np.array(half.view(mx.uint16)),
        np.array(model.inner.half(y.astype(mx.bfloat16)).view(mx.uint16)),
    )


class Shared(torch.nn.Module):
    """One tensor fed to several calls, changed in place between them: by torch (its
    version counter moves) and behind its back (a numpy view: the counter stays, as for
    a collective's all-reduce or a custom kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        first = self.b(h)
        h.add_(1)
        second = self.c(h)
        h.numpy()[:] *= 2  # untracked: h._version does not move
        return first + second + self.d(h)


def test_each_call_is_captured_as_it_saw_a_shared_tensor(home: Path) -> None:
    from safetensors.torch import load_file

    torch.manual_seed(0)
    model = Shared()
    x = torch.randn(4, 8)
    with torch.no_grad(), mldbg.capture(model, "shared") as cap:
        model(x)
    files = {
        name: load_file(str(cap.path / r["file"]))  # the safetensors package reads them
        for r in index(cap.path)
        if r.get("file")
        for name in r["tensors"]
    }
    with torch.no_grad():
        h = model.a(x)
    torch.testing.assert_close(files["a#0.out"]["out"], h, rtol=0, atol=0)
    torch.testing.assert_close(files["b#0.in.0"]["in.0"], h, rtol=0, atol=0)
    torch.testing.assert_close(files["c#0.in.0"]["in.0"], h + 1, rtol=0, atol=0)
    torch.testing.assert_close(files["d#0.in.0"]["in.0"], (h + 1) * 2, rtol=0, atol=0)


class EveryDtype(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pairs = x.reshape(-1, 2).contiguous()
        return (
            x.sum(),  # 0-d
            x[:0],  # empty
            x.to(torch.bfloat16),
            x > 0,
            x.to(torch.float8_e4m3fn),
            torch.view_as_complex(pairs),
            x.t(),  # not contiguous
            (x * 100).to(torch.int16),
            torch.view_as_complex(pairs).conj(),  # a lazy conjugate: resolved, not skipped
            (x[0, 0] / 2).expand(1),  # stride 0, "contiguous" to torch: a diffusers timestep
        )


@pytest.mark.parametrize("background", [True, False])
def test_every_dtype_reads_back_through_safetensors(home: Path, background: bool) -> None:
    """The files are written from the tensors' memory (safetensors_writer), not by the
    safetensors package: it must read them back exactly, 0-d, empty, bf16, fp8, complex,
    non-contiguous, conjugate and expanded views included."""
    from safetensors.torch import load_file

    model = EveryDtype()
    x = torch.randn(4, 2)
    with mldbg.capture(model, "dtypes", background=background) as cap:
        expected = model(x)
    (line,) = [r for r in index(cap.path) if r["event"] == "return"]
    assert not line.get("skipped") and cap.errors == []
    loaded = load_file(str(cap.path / line["file"]))
    assert len(loaded) == len(expected)
    for i, want in enumerate(expected):
        got = loaded[f"out.{i}"]
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(bits(got), bits(want))


def bits(tensor: torch.Tensor) -> torch.Tensor:
    dense = torch.empty(tensor.shape, dtype=tensor.dtype).copy_(tensor)  # unit strides
    return dense.reshape(-1).view(torch.uint8)
