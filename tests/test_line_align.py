"""The line step's analysis on records written by its own writer: readings of one shape
as another, alignment by value, the first wrong line, fused reference calls, lines that
ran more times on one side.  No script runs here (test_line.py runs real ones): each
case writes two runs' records with ``line_scope.LineWriter`` as the agent does, then
reads and decides as ``mldbg line`` does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mldbg.compare.line.read import RECORDS, read_lines
from mldbg.compare.line.verdict import decide
from mldbg.compare.pair.readings import readings
from mldbg.line_scope import LineWriter, read_targets

BOUND = 1e-5


def test_readings_split_and_merge_heads_and_refuse_a_reinterpretation() -> None:
    b, n, h, d = 2, 5, 3, 4
    x = np.random.default_rng(0).standard_normal((b, n, h * d))
    heads = x.reshape(b, n, h, d).transpose(0, 2, 1, 3)  # (B, H, L, D)
    (merge,) = readings(heads.shape, x.shape)
    assert np.array_equal(merge.apply(heads), x)
    (split,) = readings(x.shape, heads.shape)
    assert np.array_equal(split.apply(x), heads)
    # the classic bug: heads read straight from the projection's memory
    wrong = x.reshape(b, h, n, d)
    assert all(not np.allclose(r.apply(wrong), x) for r in readings(wrong.shape, x.shape))
    # channels-last, unit axes, and equal axes read as they are (never transposed)
    image = np.random.default_rng(1).standard_normal((1, 3, 5, 7))
    (layout,) = readings((1, 5, 7, 3), image.shape)
    assert np.array_equal(layout.apply(image.transpose(0, 2, 3, 1)), image)
    assert [r.identity for r in readings((1, 6, 6), (6, 6))] == [True]
    assert readings((6,), (7,)) == []


class Run:
    """One side's records, written as the agent writes them."""

    def __init__(self, directory: Path, targets: Path | None = None) -> None:
        self.writer = LineWriter(
            directory, 1 << 30, read_targets(str(targets) if targets else None)
        )
        self.directory = directory
        self.seq = 0

    def bind(
        self,
        line: int,
        name: str,
        value: np.ndarray | None,
        reads: tuple[int, ...] | list[int] = (),
        *,
        alias: int | None = None,
        kind: str = "local",
        frame: int = 1,
        hit: int = 1,
    ) -> int:
        self.seq += 1
        binding = {
            "seq": self.seq,
            "file": f"{self.directory.name}.py",
            "line": line,
            "function": "forward",
            "frame": frame,
            "name": name,
            "kind": kind,
            "text": f"{name} = ...",
            "reads": [alias] if alias is not None else list(reads),
            "alias": alias,
            "hit": hit,
        }
        self.writer.record(binding, value)
        return self.seq

    def close(self) -> Path:
        self.writer.finish(side="a", kind="module", reached=True)
        return self.directory


def attention(
    run: Run, q: np.ndarray, k: np.ndarray, v: np.ndarray, fused: bool, scale: float
) -> None:
    """softmax(q kᵀ · scale) v, fused (the reference's one call) or spelled out."""
    iq, ik, iv = run.bind(1, "q", q), run.bind(2, "k", k), run.bind(3, "v", v)
    scores = q @ k.swapaxes(-1, -2) * scale
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = probs @ v
    if fused:
        made = run.bind(10, "out", out, [iq, ik, iv])
    else:
        s = run.bind(4, "scores", scores, [iq, ik])
        p = run.bind(5, "probs", probs, [s])
        made = run.bind(6, "out", out, [p, iv])
    merged = run.bind(7, "merged", out.transpose(0, 2, 1, 3).reshape(1, 6, -1), [made])
    run.bind(8, "return", None, alias=merged, kind="return")


@pytest.mark.parametrize("scale", [0.25, 0.5])
def test_a_spelled_out_port_of_a_fused_reference_call(tmp_path: Path, scale: float) -> None:
    """The reference's SDPA leaves no scores or probabilities: a clean port's are
    absorbed by the output that agrees again; a wrong scale is named at the first port
    value the fused call's output contradicts, the lines inside it said as such."""
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 6, 4)) for _ in range(3))
    ref = Run(tmp_path / "ref")
    attention(ref, q, k, v, fused=True, scale=0.25)
    port = Run(tmp_path / "port", tmp_path / "ref" / RECORDS)
    attention(port, q.astype(np.float32), k, v, fused=False, scale=scale)
    verdict = decide(read_lines(ref.close()), read_lines(port.close()), BOUND, "module")
    if scale == 0.25:
        assert verdict.first_wrong is None, verdict.reason
        assert "no line of the port differs" in verdict.reason
        return
    first = verdict.first_wrong
    assert first is not None and first["b"]["name"] == "out" and first["ok"] is False
    assert first["nearest"][0]["a"]["name"] == "out"
    fused = verdict.fused
    assert fused is not None and [v["name"] for v in fused["inside"]] == ["scores", "probs"]
    assert verdict.last_agreeing is not None and verdict.last_agreeing["b"]["name"] == "v"


def test_a_loop_over_heads_is_said_to_run_more_times(tmp_path: Path) -> None:
    """A port that works head by head binds its per-head value once per head: nothing of
    its size in the reference, and the merged value that follows differs; the answer
    says how many times each line ran on each side."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 6, 4))
    ref = Run(tmp_path / "ref")
    got = ref.bind(1, "x", x)
    out = ref.bind(2, "y", np.tanh(x), [got])
    ref.bind(3, "return", None, alias=out, kind="return")
    port = Run(tmp_path / "port", tmp_path / "ref" / RECORDS)
    got = port.bind(1, "x", x)
    heads = [port.bind(2, "y", np.tanh(x) * 1.5, [got], hit=i + 1) for i in range(3)]
    port.bind(3, "return", None, alias=heads[-1], kind="return")
    verdict = decide(read_lines(ref.close()), read_lines(port.close()), BOUND, "module")
    assert verdict.first_wrong is not None and verdict.first_wrong["b"]["runs"] == 3
    assert "ran 3 time(s) in the port, 1 in the reference" in verdict.reason
