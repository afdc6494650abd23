"""Generation loops that split one sequence into model calls differently are compared by
the positions they cover (compare/sequence_calls.py): a prefill in one call against the
same prefill in chunks, each decoding step with its counterpart."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import mldbg  # noqa: E402
from mldbg.compare.pair.sequence_calls import _group  # noqa: E402

pytestmark = pytest.mark.usefixtures("home")


class CachedAttention(torch.nn.Module):
    """Causal single-head attention over a cache of the keys and values seen so far."""

    def __init__(self, width: int, offset_bug: bool = False) -> None:
        super().__init__()
        self.q = torch.nn.Linear(width, width)
        self.k = torch.nn.Linear(width, width)
        self.v = torch.nn.Linear(width, width)
        self.offset_bug = offset_bug
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = sum(k.shape[1] for k in self.keys)
        self.keys.append(self.k(x))
        self.values.append(self.v(x))
        keys, values = torch.cat(self.keys, 1), torch.cat(self.values, 1)
        scores = self.q(x) @ keys.transpose(1, 2) / math.sqrt(x.shape[-1])
        rows = torch.arange(x.shape[1])[:, None] + start
        if self.offset_bug and start:  # a chunk after the first forgets where it starts
            rows = rows - start
        scores = scores.masked_fill(torch.arange(keys.shape[1])[None, :] > rows, -torch.inf)
        return torch.softmax(scores, -1) @ values


class TinyLM(torch.nn.Module):
    def __init__(self, offset_bug: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.attn = CachedAttention(16, offset_bug)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)
        )
        self.head = torch.nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        h = self.embed(ids)
        h = h + self.attn(h)
        h = h + self.mlp(h)
        return self.head(h[:, -1:] if last_only else h)


def generate(
    model: TinyLM, ids: torch.Tensor, chunks: list[int], steps: int, name: str, mode: str = "full"
) -> list[int]:
    """Greedy decoding: the prompt in ``chunks``, then ``steps`` tokens, one call each."""
    model.attn.keys, model.attn.values = [], []
    out: list[int] = []
    with torch.no_grad(), mldbg.capture(model, name, mode=mode):
        start = 0
        for size in chunks:
            logits = model(ids[:, start : start + size], last_only=len(chunks) == 1)
            start += size
        for _ in range(steps):
            token = int(logits[0, -1].argmax())
            out.append(token)
            logits = model(torch.tensor([[token]]))
    return out


def test_a_chunked_prefill_is_compared_with_a_whole_one(home: Path) -> None:
    torch.manual_seed(0)
    reference = TinyLM()
    port = TinyLM()
    port.load_state_dict(reference.state_dict())
    ids = torch.randint(0, 32, (1, 8), generator=torch.Generator().manual_seed(3))
    assert generate(reference, ids, [8], 3, "ref") == generate(port, ids, [3, 4, 1], 3, "port")
    result = mldbg.compare("ref", "port", home=home)
    assert result.ok, result.first_divergence
    aligned = result.result["calls_aligned"]
    assert aligned["groups"][0] == {"a": [0], "b": [0, 1, 2], "positions": 8}
    assert [g["b"] for g in aligned["groups"][1:]] == [[3], [4], [5]]
    assert result.entry("mlp#0.out")["shape_b"] == [1, 8, 16]
    assert result.entry("head#0.out")["shape_b"] == [1, 1, 32]  # the reference's last only
    # The other way round: the reference in chunks, the port whole.
    swapped = mldbg.compare("port", "ref", home=home)
    assert swapped.ok and swapped.result["calls_aligned"]["groups"][0]["a"] == [0, 1, 2]

    buggy = TinyLM(offset_bug=True)
    buggy.load_state_dict(reference.state_dict())
    generate(buggy, ids, [3, 4, 1], 3, "bug")
    found = mldbg.compare("ref", "bug", home=home)
    assert not found.ok and found.first_divergence is not None
    assert found.first_divergence["module"] == "attn"
    assert found.first_divergence["call"] == 0


def test_summaries_of_a_chunked_prefill_join_by_their_statistics(home: Path) -> None:
    torch.manual_seed(0)
    reference = TinyLM()
    port = TinyLM()
    port.load_state_dict(reference.state_dict())
    ids = torch.randint(0, 32, (1, 8), generator=torch.Generator().manual_seed(3))
    generate(reference, ids, [8], 2, "ref", mode="summary")
    generate(port, ids, [3, 4, 1], 2, "port", mode="summary")
    result = mldbg.compare("ref", "port", home=home)
    assert result.ok, result.first_divergence
    joined = result.entry("mlp#0.out")
    assert joined["shape_b"] == [1, 8, 16] and joined["estimated"]["lower_bound"]
    assert result.entry("mlp#1.out")["estimated"]["method"] != joined["estimated"]["method"]
    # the reference's last-position logits cannot be cut from a summary of all 8
    assert "head#0.out" in result.unpaired_a


def test_calls_that_do_not_meet_are_left_unpaired() -> None:
    assert _group([8, 1, 1], [7, 1, 1, 1, 1]) == (
        [([0], [0, 1], 8), ([1], [2], 1), ([2], [3], 1)],
        [],
        [4],
    )
    assert _group([4, 4], [3, 3, 3]) == ([], [0, 1], [0, 1, 2])  # 8 positions against 9
    assert _group([5, 5], [5, 5]) == ([([0], [0], 5), ([1], [1], 5)], [], [])
