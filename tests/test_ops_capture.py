"""Op-level capture: which operation inside the culprit attention diverges.

A transformers Llama (torch) against its mlx-lm port, operations recorded inside the
first layer's attention on both sides: torch's rotation is ``mul``/``cat``/``neg``/
``add``, mlx-lm's one ``mx.fast.rope``; with the port's RoPE base 100x too big, compare
names ``fast.rope`` as the first operation whose output the reference never computed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")
pytest.importorskip("transformers")

import mldbg  # noqa: E402
from mldbg.compare import Comparison  # noqa: E402
from mldbg.store import current_run  # noqa: E402
from mldbg.text import compare as compare_render  # noqa: E402
from mldbg.text.console import captured  # noqa: E402
from parity_zoo import llama_family  # noqa: E402

ATTENTION = "model.layers.0.self_attn"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / ".mldbg"))
    current_run.reset()
    yield tmp_path / ".mldbg"  # type: ignore[misc]
    current_run.reset()


def capture_pair(home: Path, rope_theta: float) -> Comparison:
    ref, ids = llama_family.reference("llama", "float32")
    port = llama_family.mlx_model("llama", rope_theta)
    llama_family.load_from(port, ref)
    attention_class = type(port.model.layers[0].self_attn)
    rope = mx.fast.rope
    with torch.no_grad(), mldbg.capture(ref, "ref", ops=ATTENTION) as ref_cap:
        ref(ids)
    with mldbg.capture(port, "port", ops=ATTENTION):
        mx.eval(port(mx.array(ids.numpy())))
    # Everything put back: the functions and the module's class.
    assert mx.fast.rope is rope
    assert type(port.model.layers[0].self_attn) is attention_class
    names = [
        json.loads(line)["class"]
        for line in (ref_cap.path / "index.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "call"
    ]
    ops = [n for n in names if n.startswith("op:")]
    assert "op:softmax" in ops and "op:cat" in ops
    # The capture's own copies of tensors are not operations of the model.
    assert not {"op:clone", "op:detach", "op:cpu", "op:contiguous"} & set(ops[:3])
    return mldbg.compare("ref", "port", home=home)


def test_ops_name_the_rope_rotation_inside_the_attention(home: Path) -> None:
    result = capture_pair(home, rope_theta=10000.0 * 100)
    assert result.first_divergence["module"] == ATTENTION
    (item,) = result.result["ops"]
    assert item["name"] == f"{ATTENTION}#0"
    first = item["first_divergence"]
    assert first["class_b"] == "fast.rope"
    assert first["class_a"] == "add"  # q * cos + rotate_half(q) * sin, the rotated queries
    assert first["rel_rms"] > 100 * first["expected"]
    # The human answer says it too, in a few lines: the operation, its closest counterpart.
    text = rendered(result.result)
    line = next(x for x in text.splitlines() if "first diverging operation" in x)
    assert f"operations inside {ATTENTION}#0" in line and first["op_b"] in line
    wrong = next(x for x in text.splitlines() if "✗" in x)
    assert "fast.rope" in wrong and first["closest_a"] in wrong and "(add)" in wrong
    # Bounded: a comparison with operations in many module calls lists a few of them.
    many = {**result.result, "ops": [{**item, "name": f"m{i}#0"} for i in range(10)]}
    text = rendered(many)
    assert text.count("operations inside") == compare_render.OP_CALLS_SHOWN
    assert "operations of 6 more module calls in --json" in text


def rendered(result: dict) -> str:  # type: ignore[type-arg]
    with captured(width=300) as buffer:
        compare_render.show(result)
    return buffer.getvalue()


def test_ops_of_a_clean_port_all_have_a_counterpart(home: Path) -> None:
    result = capture_pair(home, rope_theta=10000.0)
    assert result.ok
    (item,) = result.result["ops"]
    assert item["first_divergence"] is None
    assert [op["class_b"] for op in item["ops"]] == [
        "fast.rope",
        "fast.rope",
        "fast.scaled_dot_product_attention",
    ]
    assert all(op["ok"] for op in item["ops"])
    # Operations are aligned by value (above), never by name: none is listed unpaired or
    # offered in a name map (which once paired v_proj with a torch `linear` operation and
    # fast.rope with an `add`), and the counts say how many were set aside.
    listed = result.result["unpaired_a"] + result.result["unpaired_b"]
    assert not [name for name in listed if ":op" in name]
    assert result.result["proposed_map"] is None
    assert result.result["counts"]["operations_b"] == 8  # two ropes, the attention: in + out
    assert result.result["counts"]["operations_a"] > 8
    assert result.result["counts"]["unpaired_b"] == 8  # mlx-lm's rope modules (2 layers)
    text = rendered(result.result)
    assert f"operations inside {ATTENTION}#0 (3 in B" in text
    assert "each of B's has a counterpart in A within rounding" in text
    assert "diverging operation" not in text


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_the_sensitivity_re_runs_own_work_is_not_recorded_as_operations(
    home: Path, framework: str
) -> None:
    """The measurement a capture makes after each call (perturbing inputs, re-running,
    comparing outputs) is the capture's work, not the model's: the operations recorded
    inside the attention are the same with the sensitivity re-run on (the default) as
    with it off."""
    ref, ids = llama_family.reference("llama", "float32")
    port = llama_family.mlx_model("llama", 10000.0)
    llama_family.load_from(port, ref)

    def operations(name: str, sensitivity: bool) -> list[str]:
        if framework == "torch":
            with (
                torch.no_grad(),
                mldbg.capture(ref, name, ops=ATTENTION, sensitivity=sensitivity) as cap,
            ):
                ref(ids)
        else:
            with mldbg.capture(port, name, ops=ATTENTION, sensitivity=sensitivity) as cap:
                mx.eval(port(mx.array(ids.numpy())))
        lines = [json.loads(line) for line in (cap.path / "index.jsonl").read_text().splitlines()]
        return [r["class"] for r in lines if r["event"] == "call" and r["class"].startswith("op:")]

    plain = operations("without", sensitivity=False)
    measured = operations("with", sensitivity=True)
    assert plain, "no operation recorded"
    assert measured == plain


def _manual_attention(bug: str | None) -> type:
    """mlx-lm's Llama attention spelled out as many ports write it: the key/value heads
    repeated for the query heads, softmax of the scaled, causally masked scores; with
    ``bug``: the heads tiled (``[0, 1, 0, 1]`` instead of ``[0, 0, 1, 1]``), no mask, or
    the scale doubled."""
    from mlx_lm.models import llama

    class ManualAttention(llama.Attention):
        def __call__(self, x: mx.array, mask: object = None, cache: object = None) -> mx.array:
            batch, length, _ = x.shape
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            q = q.reshape(batch, length, self.n_heads, -1).transpose(0, 2, 1, 3)
            k = k.reshape(batch, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
            v = v.reshape(batch, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
            q, k = self.rope(q), self.rope(k)
            repeat = self.n_heads // self.n_kv_heads
            if bug == "tiled_heads":
                k, v = mx.tile(k, (1, repeat, 1, 1)), mx.tile(v, (1, repeat, 1, 1))
            else:
                k, v = mx.repeat(k, repeat, axis=1), mx.repeat(v, repeat, axis=1)
            scale = self.scale * (2.0 if bug == "scale" else 1.0)
            scores = (q @ k.swapaxes(-1, -2)) * scale
            if bug != "no_mask":
                scores = scores + mx.triu(mx.full((length, length), -mx.inf), k=1)
            out = mx.softmax(scores, axis=-1) @ v
            return self.o_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, -1))

    return ManualAttention


@pytest.mark.parametrize(
    ("bug", "diverging"),
    [(None, None), ("tiled_heads", "tile"), ("no_mask", "softmax"), ("scale", "softmax")],
)
def test_a_spelled_out_attention_against_torch_sdpa(
    home: Path, bug: str | None, diverging: str | None
) -> None:
    """transformers' "sdpa" attention runs one fused ``F.scaled_dot_product_attention``
    (with ``enable_gqa``: the key heads are never repeated in memory), so a port's
    ``repeat`` and ``softmax`` had nothing to match: a clean port's ``repeat`` was named
    as the first diverging operation, and every bug was blamed on it.  The capture now
    records what SDPA computes on the way (the repeated keys and values, the scores, the
    probabilities), so the head repeat, the mask and the scale are each told apart."""
    from parity_zoo.core import swap_class

    ref, ids = llama_family.reference("llama", "float32")
    port = llama_family.mlx_model("llama", 10000.0)
    llama_family.load_from(port, ref)
    for layer in port.model.layers:
        swap_class(layer.self_attn, lambda _cls: _manual_attention(bug))
    attention = ref.model.layers[0].self_attn
    implementation = attention.config._attn_implementation
    attention.config._attn_implementation = "sdpa"
    try:
        with torch.no_grad(), mldbg.capture(ref, "ref", ops=ATTENTION):
            ref(ids)
    finally:
        attention.config._attn_implementation = implementation
    current_run.reset()
    with mldbg.capture(port, "port", ops=ATTENTION):
        mx.eval(port(mx.array(ids.numpy())))
    result = mldbg.compare("ref", "port", home=home).result
    (item,) = result["ops"]
    classes = [op["class_a"] for op in item["ops"] if op.get("class_a")]
    assert "scaled_dot_product_attention.probs" in classes
    if diverging is None:
        assert result["ok"] and item["first_divergence"] is None, item
    else:
        assert not result["ok"]
        assert item["first_divergence"]["class_b"] == diverging, item["first_divergence"]


class FusedNormBlock(torch.nn.Module):
    """A reference whose norm is one fused ``F.rms_norm`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16))
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.nn.functional.rms_norm(x, (16,), self.weight, 1e-6))


class FusedNormModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = FusedNormBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def test_a_module_that_agrees_has_no_diverging_operation(home: Path) -> None:
    """The port spells the norm out (``square``, ``mean``, ``rsqrt``): steps the fused
    reference never shows, so they have no counterpart within rounding; the block's
    outputs agree, so none of them is named diverging (before, ``square`` was).  With
    the port's eps wrong, the block diverges and an operation is named."""
    import mlx.nn as mnn

    torch.manual_seed(0)
    ref = FusedNormModel().eval()
    x = torch.randn(1, 8, 16)

    class Block(mnn.Module):
        def __init__(self, eps: float) -> None:
            super().__init__()
            self.weight = mx.array(ref.block.weight.detach().numpy())
            self.fc = mnn.Linear(16, 16)
            self.fc.weight = mx.array(ref.block.fc.weight.detach().numpy())
            self.fc.bias = mx.array(ref.block.fc.bias.detach().numpy())
            self.eps = eps

        def __call__(self, h: mx.array) -> mx.array:
            mean_square = mx.mean(mx.square(h), axis=-1, keepdims=True)
            return self.fc(h * mx.rsqrt(mean_square + self.eps) * self.weight)

    class Model(mnn.Module):
        def __init__(self, eps: float) -> None:
            super().__init__()
            self.block = Block(eps)

        def __call__(self, h: mx.array) -> mx.array:
            return self.block(h)

    with torch.no_grad(), mldbg.capture(ref, "ref", ops="block"):
        ref(x)
    for eps, name in ((1e-6, "clean"), (1.0, "bug")):
        current_run.reset()
        port = Model(eps)
        with mldbg.capture(port, name, ops="block"):
            mx.eval(port(mx.array(x.numpy())))
    clean = mldbg.compare("ref", "clean", home=home).result
    (item,) = clean["ops"]
    assert clean["ok"] and item["module_ok"] is True
    assert item["first_divergence"] is None, item["first_divergence"]
    assert any(op["ok"] is False for op in item["ops"])  # square: no counterpart, still listed
    assert "agree" in item["note"]
    assert "outputs agree" in rendered(clean)
    bug = mldbg.compare("ref", "bug", home=home).result
    (item,) = bug["ops"]
    assert not bug["ok"] and item["module_ok"] is False
    assert item["first_divergence"] is not None


@pytest.mark.parametrize("bug", [None, "rope"])
def test_ops_inside_a_flux_attention_carry_the_drift_of_its_inputs(
    home: Path, bug: str | None
) -> None:
    """diffusers' Flux attention (its processor applies the rotary tables with
    ``apply_rotary_emb``: real cos/sin, interleaved pairs) against a hand-written MLX
    port.  The first block's inputs already differ by ~4e-6 (the timestep's sines of
    arguments near 900 upstream): before, every operation inside was out of its bound
    (2e-6, from its own depth alone) and the first ``linear`` was named.  An operation
    is now allowed what compare allowed its module; the port that rotates halves instead
    of pairs is named at its rotation."""
    from parity_zoo import flux

    attention = "transformer_blocks.0.attn"
    z = flux.build("float32", bug)
    with torch.no_grad(), mldbg.capture(z.ref, "ref", ops=attention):
        z.ref(*z.ref_inputs)
    current_run.reset()
    with mldbg.capture(z.port, "port", ops=attention):
        mx.eval(z.port(*z.port_inputs))
    result = mldbg.compare("ref", "port", home=home).result
    (item,) = result["ops"]
    if bug is None:
        assert result["ok"] and item["first_divergence"] is None
        assert all(op["ok"] is not False for op in item["ops"]), item["ops"]
    else:
        first = item["first_divergence"]
        assert first["class_b"] == "concatenate", first  # [-x[..., d:], x[..., :d]]
        assert first["class_a"] == "flatten"  # diffusers' stack([-imag, real]).flatten(3)
        before = item["ops"][: item["ops"].index(first)]
        assert before and all(op["ok"] for op in before if op["ok"] is not None)


def test_ops_pair_through_the_name_map(home: Path) -> None:
    """mlx-lm's GPT-2 names its modules ``model.h.0…`` where transformers says
    ``transformer.h.0…``: compare pairs them through the map, and the operations inside
    the attention must be paired the same way (before, no ``ops`` item came out)."""
    from parity_zoo import gpt2

    z = gpt2.build("float32", "attn_scale")
    with torch.no_grad(), mldbg.capture(z.ref, "ref", ops="transformer.h.1.attn"):
        z.ref(*z.ref_inputs)
    current_run.reset()
    with mldbg.capture(z.port, "port", ops="model.h.1.attn"):
        mx.eval(z.port(*z.port_inputs))
    result = mldbg.compare("ref", "port", map=z.map, home=home).result
    (item,) = result["ops"]
    assert item["name"] == "transformer.h.1.attn#0"
    assert item["module_ok"] is False
    assert item["first_divergence"]["class_b"] == "fast.scaled_dot_product_attention"


@pytest.mark.parametrize("bug", [None, "attn_scale"])
def test_a_quantized_projection_meets_the_reference_linear_before_its_bias(
    home: Path, bug: str | None
) -> None:
    """MLX's quantized Linear is ``mx.quantized_matmul`` then ``+ bias`` (an operator, not
    recorded); torch's ``F.linear`` adds the bias inside.  Qwen2's q/k/v have biases: at 8
    bits their ``quantized_matmul`` sat 0.09 from the closest ``linear`` (the bias), beyond
    its bound, and an attention-scale bug was blamed on the first projection.  The
    reference now also records each biased ``linear`` without its bias."""
    z = llama_family.build("qwen2", "float32", bug, quantize=(8, 32))
    attention = "model.layers.1.self_attn"
    with torch.no_grad(), mldbg.capture(z.ref, "ref", ops=attention):
        z.ref(*z.ref_inputs)
    current_run.reset()
    with mldbg.capture(z.port, "port", ops=attention):
        mx.eval(z.port(*z.port_inputs))
    result = mldbg.compare("ref", "port", home=home).result
    (item,) = result["ops"]
    matmuls = [op for op in item["ops"] if op["class_b"] == "quantized_matmul"]
    assert matmuls and all(op["ok"] for op in matmuls[:3]), matmuls
    assert matmuls[0]["class_a"] == "linear.without_bias"
    if bug is None:
        assert item["first_divergence"] is None
    else:
        assert item["first_divergence"]["class_b"] == "fast.scaled_dot_product_attention"
