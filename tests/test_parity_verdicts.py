"""Each mechanism of issue 10 on small real models: scale-aware verdicts, culprit by error
growth, boundary differences, pairing (keyword vs positional, ambiguous layouts, map
proposal), quantized ports, ``.pt`` sources and replay.

The models are a few Linear / norm / conv layers (real PyTorch, real MLX on CPU) built so
that the expected answer is known by construction; each test would fail on the
threshold-crossing compare that came before (see the test's docstring for how).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
mnn = pytest.importorskip("mlx.nn")

import numpy as np  # noqa: E402
from torch import nn  # noqa: E402

import mldbg  # noqa: E402
from mldbg.store import current_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("home")  # a private run store (conftest)


def run_torch(model: nn.Module, name: str, *args: Any, **kwargs: Any) -> Any:
    with torch.no_grad(), mldbg.capture(model, name) as cap:
        out = model(*args, **kwargs)
    assert not cap.errors
    current_run.reset()
    return out


def run_mlx(model: Any, name: str, *args: Any) -> Any:
    with mldbg.capture(model, name) as cap:
        out = model(*args)
        mx.eval(out)
    assert not cap.errors
    current_run.reset()
    return out


# -- a tiny pre-norm block, written twice -------------------------------------------------------


class Norm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * y).to(x.dtype)


class Mixer(nn.Module):
    """An attention stand-in: a projection whose output is small (values ~0.05)."""

    def __init__(self, dim: int, scale: float = 1.0) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim, bias=False)
        nn.init.normal_(self.proj.weight, std=0.05 / math.sqrt(dim))
        self.scale = scale

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = self.proj(hidden_states)
        if self.scale != 1.0:  # the bug: a 2% mix of the neighbouring feature
            out = out + (self.scale - 1.0) * out.roll(1, dims=-1)
        return out


class Block(nn.Module):
    def __init__(self, dim: int, scale: float = 1.0) -> None:
        super().__init__()
        self.mixer = Mixer(dim, scale)
        self.norm = Norm(dim)

    def forward(self, x: torch.Tensor, *, keyword: bool = True) -> torch.Tensor:
        h = self.mixer(hidden_states=x) if keyword else self.mixer(x)
        return self.norm(h)


class Stack(nn.Module):
    def __init__(self, dim: int = 64, layers: int = 3, bug_layer: int | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            Block(dim, 1.02 if i == bug_layer else 1.0) for i in range(layers)
        )

    def forward(self, x: torch.Tensor, keyword: bool = True) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x, keyword=keyword)
        return x


def stack_pair(
    dtype: torch.dtype, bug_layer: int | None = None
) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    ref = Stack().to(dtype).eval()
    torch.manual_seed(0)
    port = Stack(bug_layer=bug_layer).to(dtype).eval()
    port.load_state_dict(ref.state_dict())
    x = torch.randn(2, 8, 64).to(dtype)
    return ref, port, x


# -- scale-aware verdicts -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_clean_port_with_other_rounding_passes_at_the_defaults(dtype: torch.dtype) -> None:
    """The port computes the norm in its own dtype (no float32 upcast): rounding differs
    everywhere, which fails the element-wise bf16 defaults at the norm outputs (values
    ~1-3), yet is exactly what a clean chain of ops accumulates."""

    class CheapNorm(Norm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    ref, port, x = stack_pair(dtype)
    for layer in port.layers:
        layer.norm.__class__ = CheapNorm
    run_torch(ref, "ref", x)
    run_torch(port, "port", x, keyword=False)
    result = mldbg.compare("ref", "port").result
    assert result["ok"], [
        (e["name"], e["rel_rms"], e["expected"]) for e in result["entries"] if not e["ok"]
    ]
    assert result["test"] == "scale"
    outputs = [e for e in result["entries"] if e["role"] == "out"]
    assert all(e["test"] == "scale" and e["expected"] > 0 for e in outputs)
    if dtype != torch.float32:
        # The strict element-wise test at assert_close's defaults would not pass them all.
        assert not all(e["elementwise_ok"] for e in outputs)
        strict = mldbg.compare("ref", "port", rtol=1e-6, atol=1e-7).result
        assert not strict["ok"] and strict["test"] == "elementwise"
        assert all(e["test"] == "elementwise" for e in strict["entries"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_error_on_small_values_is_named_where_it_grows(dtype: torch.dtype) -> None:
    """Layer 1's mixer is 2% off on values ~0.05.  Its norm rescales that relative error
    onto values ~1, where an absolute atol sees it first; growth names the mixer."""
    ref, port, x = stack_pair(dtype, bug_layer=1)
    run_torch(ref, "ref", x)
    run_torch(port, "port", x, keyword=False)
    result = mldbg.compare("ref", "port").result
    culprit = result["first_divergence"]
    assert not result["ok"] and culprit is not None
    assert culprit["module"] == "layers.1.mixer", culprit
    assert culprit["inputs_compared"] is True  # hidden_states= paired with the positional x
    norm_out = next(e for e in result["entries"] if e["name"] == "layers.1.norm#0.out")
    mixer_out = next(e for e in result["entries"] if e["name"] == "layers.1.mixer#0.out")
    # The norm passes the mixer's relative error on (it is a victim, not the culprit).
    assert norm_out["rel_rms"] > mixer_out["rel_rms"] / 4
    if dtype == torch.float32:
        # An atol that passes the mixer's small values but not the norm's: the element-wise
        # test fails at the norm first, and growth still names the mixer.
        strict = mldbg.compare("ref", "port", rtol=0.0, atol=mixer_out["max_abs"] * 1.01).result
        assert next(e for e in strict["entries"] if e["name"] == "layers.1.mixer#0.out")["ok"]
        assert strict["first_divergence"]["module"] == "layers.1.mixer"
        # ... without naming an entry that passes: the culprit says why it is named.
        named = strict["first_divergence"]["entries"]
        assert all(not e["ok"] for e in strict["entries"] if e["name"] in named)
        assert not any(e["culprit"] and e["ok"] for e in strict["entries"])
        assert strict["first_divergence"]["passes_elementwise"] is True
        assert "pass the element-wise test" in strict["first_divergence"]["reason"]


def test_keyword_and_positional_inputs_pair_by_shape_and_order() -> None:
    ref, port, x = stack_pair(torch.float32)
    run_torch(ref, "ref", x)
    run_torch(port, "port", x, keyword=False)
    entry = mldbg.compare("ref", "port").entry("layers.0.mixer#0.in.hidden_states")
    assert entry["name_b"] == "layers.0.mixer#0.in.0"
    assert entry["paired_by"] in ("only-tensor", "shape-order")


# -- boundary differences -------------------------------------------------------------------------


class Embed(nn.Module):
    def __init__(self, scale: bool) -> None:
        super().__init__()
        self.table = nn.Embedding(32, 16)
        self.scale = 4.0 if scale else 1.0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids) * self.scale


class Mlp(nn.Module):
    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.down = nn.Linear(64, 16)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x), approximate=self.approximate))


class Tiny(nn.Module):
    """The reference scales inside ``embed``; the port (``inside=False``) right after it."""

    def __init__(self, inside: bool, approximate: str = "none") -> None:
        super().__init__()
        self.embed = Embed(scale=inside)
        self.norm = Norm(16)
        self.mlp = Mlp(approximate)
        self.inside = inside

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        if not self.inside:
            h = h * 4.0
        return self.mlp(self.norm(h))


def test_a_scale_moved_across_a_boundary_is_not_the_culprit() -> None:
    torch.manual_seed(0)
    ref = Tiny(inside=True)
    port = Tiny(inside=False, approximate="tanh")
    port.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 32, (1, 8))
    run_torch(ref, "ref", ids)
    run_torch(port, "port", ids)
    result = mldbg.compare("ref", "port").result
    (boundary,) = result["boundary_differences"]
    assert boundary["module"] == "embed"
    assert boundary["ratio"] == pytest.approx(4.0)
    assert boundary["compensated_by"] == "norm#0"
    assert "x4.000" in boundary["note"]
    assert result["first_divergence"]["module"] == "mlp"


# -- layouts ------------------------------------------------------------------------------------


class TorchConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(32, 32, 3, padding=1)
        self.norm = nn.GroupNorm(8, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv_in(x))


class MlxConv(mnn.Module):
    def __init__(self, groups: int = 8) -> None:
        super().__init__()
        self.conv_in = mnn.Conv2d(32, 32, 3, padding=1)
        self.norm = mnn.GroupNorm(groups, 32, pytorch_compatible=True)

    def __call__(self, x: Any) -> Any:
        return self.norm(self.conv_in(x))


def conv_models(groups: int = 8) -> tuple[nn.Module, Any, torch.Tensor]:
    torch.manual_seed(0)
    ref = TorchConv().eval()
    port = MlxConv(groups)
    port.load_weights(
        [
            ("conv_in.weight", mx.array(ref.conv_in.weight.detach().permute(0, 2, 3, 1).numpy())),
            ("conv_in.bias", mx.array(ref.conv_in.bias.detach().numpy())),
            ("norm.weight", mx.array(ref.norm.weight.detach().numpy())),
            ("norm.bias", mx.array(ref.norm.bias.detach().numpy())),
        ]
    )
    x = torch.randn(1, 32, 32, 32)  # C == H == W: shapes cannot tell NCHW from NHWC
    return ref, port, x


def test_ambiguous_square_layout_is_decided_by_framework_and_class() -> None:
    ref, port, x = conv_models()
    run_torch(ref, "ref", x)
    run_mlx(port, "port", mx.array(x.permute(0, 2, 3, 1).numpy()))
    result = mldbg.compare("ref", "port").result
    assert result["ok"], [(e["name"], e["rel_rms"]) for e in result["entries"] if not e["ok"]]
    assert all(e["layout"] == "NHWC→NCHW" for e in result["entries"])
    forced = mldbg.compare("ref", "port", layout="NCHW").result
    assert not forced["ok"]
    with pytest.raises(mldbg.CompareInputError) as caught:
        mldbg.compare("ref", "port", layout="HWCN")
    assert caught.value.code == "bad_layout"


def test_replay_across_frameworks_names_a_wrong_group_count() -> None:
    ref, port, x = conv_models(groups=4)
    run_torch(ref, "ref", x)
    run_mlx(port, "port", mx.array(x.permute(0, 2, 3, 1).numpy()))
    result = mldbg.compare("ref", "port").result
    assert result["first_divergence"]["module"] == "norm"
    replayed = mldbg.replay(port, "ref")
    assert replayed.culprit == "norm"
    conv = next(e for e in replayed.entries if e["module"] == "conv_in")
    assert conv["ok"] and conv["rel_rms"] < 1e-5
    both = mldbg.compare("ref", "port", replay=replayed.capture).result
    assert both["first_divergence"]["module"] == "norm"
    assert both["first_divergence"].get("local") is True
    norm_out = next(e for e in both["entries"] if e["name"] == "norm#0.out")
    assert norm_out["local"]["ok"] is False


# -- names ----------------------------------------------------------------------------------------


class Renamed(nn.Module):
    """``Stack`` with its own names: ``blocks.N.attention.wq`` and ``blocks.N.ln``."""

    def __init__(self, dim: int = 64, layers: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(RenamedBlock(dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


class RenamedMixer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.wq = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wq(x)


class RenamedBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attention = RenamedMixer(dim)
        self.ln = Norm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.attention(x))


def renamed_state(ref: Stack) -> dict[str, torch.Tensor]:
    state = {}
    for key, value in ref.state_dict().items():
        key = key.replace("layers.", "blocks.").replace(".mixer.proj.", ".attention.wq.")
        state[key.replace(".norm.", ".ln.")] = value
    return state


def test_few_pairs_propose_a_map_that_pairs_everything(home: Path, tmp_path: Path) -> None:
    ref, _, x = stack_pair(torch.float32)
    port = Renamed().eval()
    port.load_state_dict(renamed_state(ref))
    run_torch(ref, "ref", x)
    run_torch(port, "port", x)
    result = mldbg.compare("ref", "port").result
    proposal = result["proposed_map"]
    assert proposal, "few entries paired: a map should be proposed"
    # No culprit among the few that paired by accident; the verdict says why.
    assert result["first_divergence"] is None and result["decided_by"] == "pairing"
    assert "proposed_map" in result["undecided"]
    assert len(result["unpaired_b"]) == result["counts"]["unpaired_b"] > 6  # all listed
    # The proposal, used as the map, pairs every module of the port.
    mapped = mldbg.compare("ref", "port", map=proposal).result
    assert mapped["ok"] and mapped["proposed_map"] is None
    modules = {e["module"] for e in mapped["entries"]}
    assert {"layers.2.mixer.proj", "layers.2.norm", "layers.0.mixer"} <= modules
    # The CLI writes it as a ready map file and shows the unpaired count.
    written = tmp_path / "proposed.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", "ref", "port", "--propose-map", str(written)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MLDBG_HOME": str(home), "NO_COLOR": "1"},
    )
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads(written.read_text()) == proposal
    assert "a map proposed" in proc.stdout and "only in B (after the map)" in proc.stdout


# -- quantized ports ------------------------------------------------------------------------------


class MlxMlp(mnn.Module):
    def __init__(self, act: str = "silu") -> None:
        super().__init__()
        self.up = mnn.Linear(64, 128)
        self.down = mnn.Linear(128, 64)
        self.act = act

    def __call__(self, x: Any) -> Any:
        h = self.up(x)
        h = mnn.silu(h) if self.act == "silu" else mnn.gelu(h)
        return self.down(h)


class TorchMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.up(x)))


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_port_passes_with_its_quantization_noted(bits: int) -> None:
    torch.manual_seed(0)
    ref = TorchMlp().to(torch.bfloat16)
    port = MlxMlp()
    port.load_weights(
        [(k, mx.array(v.float().numpy()).astype(mx.bfloat16)) for k, v in ref.state_dict().items()]
    )
    mnn.quantize(port, group_size=64, bits=bits)
    x = torch.randn(1, 8, 64).to(torch.bfloat16)
    run_torch(ref, "ref", x)
    run_mlx(port, "port", mx.array(x.float().numpy()).astype(mx.bfloat16))
    result = mldbg.compare("ref", "port").result
    up = next(e for e in result["entries"] if e["name"] == "up#0.out")
    assert up["quantized"] == {"bits": bits, "group_size": 64}
    assert up["rel_rms"] > 1e-3  # the quantization really shows
    assert result["ok"], [(e["name"], e["rel_rms"], e["expected"]) for e in result["entries"]]


def test_quantized_port_with_a_real_bug_is_still_named() -> None:
    torch.manual_seed(0)
    ref = TorchMlp()
    port = MlxMlp(act="gelu")
    port.load_weights([(k, mx.array(v.numpy())) for k, v in ref.state_dict().items()])
    mnn.quantize(port, group_size=64, bits=8)
    x = torch.randn(1, 8, 64)
    run_torch(ref, "ref", x)
    run_mlx(port, "port", mx.array(x.numpy()))
    result = mldbg.compare("ref", "port").result
    assert result["first_divergence"]["module"] == "<root>"
    assert next(e for e in result["entries"] if e["name"] == "up#0.out")["ok"]


# -- replay ---------------------------------------------------------------------------------------


def test_replay_names_the_module_and_lists_calls_it_cannot_make() -> None:
    ref, port, x = stack_pair(torch.float32, bug_layer=2)

    class Picky(Norm):
        def forward(self, x: torch.Tensor, needed: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return super().forward(x) + needed

    run_torch(ref, "ref", x)
    replayed = mldbg.replay(port, "ref")
    assert replayed.culprit == "layers.2.mixer"
    assert replayed.result["counts"]["skipped"] == 0
    # A module whose signature does not fit the reference's inputs is listed, not raised.
    port.layers[0].norm.__class__ = Picky
    replayed = mldbg.replay(port, "ref", name="picky")
    assert replayed.capture == "picky"
    reasons = {s["module"]: s["reason"] for s in replayed.result["skipped"]}
    assert "layers.0.norm" in reasons and "cannot be called" in reasons["layers.0.norm"]


# -- torch.save sources ---------------------------------------------------------------------------


def test_pt_files_are_sources(tmp_path: Path) -> None:
    a = {"h": torch.randn(4, 8).to(torch.bfloat16), "ids": torch.arange(5)}
    b = {"h": a["h"].clone(), "ids": torch.arange(5)}
    b["h"][0, 0] += 1.0
    torch.save(a, tmp_path / "a.pt")
    torch.save(b, tmp_path / "b.pt")
    result = mldbg.compare(tmp_path / "a.pt", tmp_path / "b.pt").result
    assert {e["name"] for e in result["entries"]} == {"h", "ids"}
    assert next(e for e in result["entries"] if e["name"] == "ids")["ok"]
    assert not result["ok"] and result["first_divergence"]["name"] == "h"
    assert next(e for e in result["entries"] if e["name"] == "h")["dtype_a"] == "BF16"
    # Pickled code is refused (weights_only=True): bad input, not an executed payload.
    torch.save({"h": a["h"], "obj": np.dtype("float32")}, tmp_path / "c.pt")
    with pytest.raises(mldbg.CompareInputError) as caught:
        mldbg.compare(tmp_path / "a.pt", tmp_path / "c.pt")
    assert caught.value.code == "corrupt_file"


class ResidualBlock(nn.Module):
    """A pre-norm block; ``adds=True`` adds the residual itself (the reference),
    ``adds=False`` returns only the update and leaves the add to its parent (the port)."""

    def __init__(self, dim: int, adds: bool, approximate: str = "none") -> None:
        super().__init__()
        self.norm = Norm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.adds = adds
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = self.down(nn.functional.gelu(self.up(self.norm(x)), approximate=self.approximate))
        return x + update if self.adds else update


class ResidualStack(nn.Module):
    def __init__(self, adds_inside: bool, bug_layer: int | None = None, dim: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            ResidualBlock(dim, adds_inside, "tanh" if i == bug_layer else "none") for i in range(4)
        )
        self.final = Norm(dim)
        self.adds_inside = adds_inside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) if self.adds_inside else x + block(x)
        return self.final(x)


@pytest.mark.parametrize("bug_layer", [None, 2])
def test_a_residual_add_moved_out_of_the_blocks_is_not_the_culprit(
    bug_layer: int | None,
) -> None:
    """The port's blocks return only their update and the parent adds the residual: every
    block's output differs (same shape as its input), yet the next block's input agrees
    again.  Those are boundary differences, not a culprit; a real bug later is still named."""
    torch.manual_seed(0)
    ref = ResidualStack(adds_inside=True)
    port = ResidualStack(adds_inside=False, bug_layer=bug_layer)
    port.load_state_dict(ref.state_dict())
    x = torch.randn(2, 8, 32)
    run_torch(ref, "ref", x)
    run_torch(port, "port", x)
    result = mldbg.compare("ref", "port").result
    moved = {b["module"] for b in result["boundary_differences"]}
    culprit = result["first_divergence"]
    if bug_layer is None:
        assert result["ok"] and culprit is None, json.dumps(culprit)
        assert moved == {"blocks.0", "blocks.1", "blocks.2", "blocks.3"}, moved
    else:
        assert culprit is not None and culprit["module"] == f"blocks.{bug_layer}", json.dumps(
            culprit
        )
        assert {"blocks.0", "blocks.1"} <= moved, moved


class ScalingNorm(nn.Module):
    """A norm that may scale its input first: where the port moved its parent's scale."""

    def __init__(self, dim: int, scale_in: float) -> None:
        super().__init__()
        self.norm = Norm(dim)
        self.scale_in = scale_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x * self.scale_in)


class ScaledIntoChild(nn.Module):
    """The reference scales the embeddings in its own forward (or inside ``embed`` when
    ``in_embed``); the port scales them inside ``norm`` instead."""

    def __init__(self, ref: bool, in_embed: bool = False, approximate: str = "none") -> None:
        super().__init__()
        self.embed = Embed(scale=ref and in_embed)
        self.norm = ScalingNorm(16, 1.0 if ref else 4.0)
        self.mlp = Mlp(approximate)
        self.scale_here = 4.0 if ref and not in_embed else 1.0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm(self.embed(ids) * self.scale_here))


@pytest.mark.parametrize("in_embed", [False, True], ids=["from-parent", "from-sibling"])
@pytest.mark.parametrize("approximate", ["none", "tanh"], ids=["clean", "gelu-bug"])
def test_a_scale_moved_into_the_next_module_is_not_the_culprit(
    in_embed: bool, approximate: str
) -> None:
    """A difference the receiving module absorbs itself (its input differs, its output
    agrees) is a boundary difference, whether the reference applied the scale in the
    parent's code or inside the previous module; a real bug after it is still named."""
    torch.manual_seed(0)
    ref = ScaledIntoChild(ref=True, in_embed=in_embed)
    port = ScaledIntoChild(ref=False, approximate=approximate)
    port.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 32, (1, 8))
    run_torch(ref, "ref", ids)
    run_torch(port, "port", ids)
    result = mldbg.compare("ref", "port").result
    culprit = result["first_divergence"]
    moved = [b for b in result["boundary_differences"] if b["compensated_by"] == "norm#0"]
    assert moved, json.dumps(result["boundary_differences"])
    assert moved[0]["ratio"] == pytest.approx(4.0), moved
    if approximate == "none":
        assert result["ok"] and culprit is None, json.dumps(culprit)
    else:
        assert culprit is not None and culprit["module"] == "mlp", json.dumps(culprit)


class Rotary(nn.Module):
    """Reads its input only for its length, like transformers' rotary embeddings."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[-2], dtype=torch.float32)
        return torch.cos(positions[:, None] * torch.arange(1, 5, dtype=torch.float32))


class ForgetsScale(nn.Module):
    def __init__(self, scaled: bool) -> None:
        super().__init__()
        self.embed = Embed(scale=scaled)
        self.rotary = Rotary()
        self.mlp = Mlp("none")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        angles = self.rotary(h)
        return self.mlp(h) + angles.sum()


def test_a_module_that_ignores_its_input_values_does_not_excuse_a_real_bug() -> None:
    """The port forgets the embedding scale (nothing compensates it): the rotary module
    that reads the embeddings only for their length returns the same either way, which
    must not make the missing scale look like a boundary difference."""
    torch.manual_seed(0)
    ref = ForgetsScale(scaled=True)
    port = ForgetsScale(scaled=False)
    port.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 32, (1, 8))
    run_torch(ref, "ref", ids)
    run_torch(port, "port", ids)
    result = mldbg.compare("ref", "port").result
    assert not result["ok"]
    assert result["first_divergence"]["module"] == "embed", json.dumps(result["first_divergence"])
    assert not [b for b in result["boundary_differences"] if b["module"] == "embed"]
