"""Row-wise leaves re-run on a sample of rows (capture/sensitivity.py, "What a
measurement costs").

A leaf whose exact type maps each row of its input to the same row of its output
(``Linear``, ``LayerNorm``, ``RMSNorm``, elementwise activations) measures its
sensitivity from ``SAMPLE_ROWS`` rows, importance-sampled, instead of a re-run on all of
them.  What must hold: the estimate of the norm ratio is unbiased (checked exactly,
over every placement of the systematic sample), a row carrying a large share of the
energy (a "massive activation" token) is always in the sample, and on real torch and
MLX modules the sampled measurement agrees with the full re-run of the same weights
(a subclass: an unknown type, re-run in full).  The verdicts it feeds are checked by
the parity suites (tests/test_parity*.py), which run with the sampling on.

A call of another type that reads one tensor and returns one (a user's MLP, a call
with children) is re-run on sampled rows when a re-run of those rows reproduces the
forward's rows: measured on rows, it agrees with its whole re-run; a module whose rows
read one another, or that refuses another row count, is re-run whole.

And a call with children's rounding re-run (inputs kept) does not run again a leaf that
reads the very objects it read in the forward: it answers with its output then, and
the measurement is the same number.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
mnn = pytest.importorskip("mlx.nn")

from torch import nn  # noqa: E402

import mldbg  # noqa: E402
from mldbg.capture.sensitivity import (  # noqa: E402
    SAMPLE_ROWS,
    Perturbations,
    estimate_change,
    row_sample,
)
from mldbg.capture.sensitivity_mlx import measure_mlx  # noqa: E402
from mldbg.capture.sensitivity_torch import TorchFrame, measure_torch, row_dims  # noqa: E402

U32 = 2.0**-24


def test_the_sampled_norm_ratio_is_unbiased_over_the_samples_placements() -> None:
    """Averaged over the offset (uniform in [0, 1): here a fine grid), the estimate of
    ``sum |dy_r|^2 / sum |y_r|^2`` is the exact ratio, for rows whose changes are
    unrelated to their energies (the weights are then no help, only no harm)."""
    rng = np.random.default_rng(0)
    rows = 500
    x_energy = rng.lognormal(0, 2, rows)
    y_energy = rng.lognormal(0, 1, rows)
    changes = rng.lognormal(0, 1.5, rows) * 1e-14
    energy = float(y_energy.sum())
    exact = float(changes.sum()) / energy
    estimates = []
    for offset in np.arange(4000) / 4000:
        picked, counts, weights = row_sample(x_energy, y_energy, SAMPLE_ROWS, float(offset))
        assert counts.sum() == SAMPLE_ROWS
        estimates.append(
            estimate_change(changes[picked], counts, weights, SAMPLE_ROWS, energy) ** 2
        )
    assert abs(np.mean(estimates) / exact - 1) < 1e-3, (np.mean(estimates), exact)
    # One draw is off by a bounded amount: the uniform share caps each row's weight.
    assert min(estimates) / exact > 0.2 and max(estimates) / exact < 5


def test_a_row_holding_much_of_the_energy_is_always_sampled() -> None:
    """A first token 1000x larger than the rest (LLMs' massive activations): its share of
    the weight is over 1/SAMPLE_ROWS, so every placement of the sample holds it."""
    energy = np.ones(1000)
    energy[0] = 1e6
    for offset in (0.0, 0.3, 0.999):
        picked, _counts, _weights = row_sample(energy, energy, SAMPLE_ROWS, offset)
        assert 0 in picked


class _AnyLinear(nn.Linear):  # a subclass: an unknown type, re-run on every row
    pass


class _AnyLayerNorm(nn.LayerNorm):
    pass


def _activations(rows: int, width: int) -> torch.Tensor:
    """Rows of very different scales, one of them 300x the others (a massive activation)."""
    torch.manual_seed(0)
    x = torch.randn(1, rows, width) * torch.rand(1, rows, 1).mul(4).exp()
    x[0, 0] *= 300
    return x


@pytest.mark.parametrize(
    ("known", "unknown"),
    [
        (lambda: nn.Linear(96, 160), lambda: _AnyLinear(96, 160)),
        (lambda: nn.LayerNorm(96), lambda: _AnyLayerNorm(96)),
    ],
    ids=["Linear", "LayerNorm"],
)
def test_a_sampled_torch_leaf_agrees_with_its_full_rerun(known, unknown) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(1)
    sampled_module, full_module = known().eval(), unknown().eval()
    full_module.load_state_dict(sampled_module.state_dict())
    assert row_dims(sampled_module) == 1 and row_dims(full_module) is None
    x = _activations(8 * SAMPLE_ROWS, 96)
    with torch.no_grad():
        y = sampled_module(x)
    sampled = measure_torch(sampled_module, (x,), {}, y, perturbations=Perturbations())
    full = measure_torch(full_module, (x,), {}, y, perturbations=Perturbations())
    assert sampled is not None and full is not None
    assert sampled["step"] == full["step"] == U32
    ratio = sampled["sensitivity"] / full["sensitivity"]
    assert 0.75 < ratio < 1.33, (sampled, full)


def test_few_rows_are_rerun_in_full() -> None:
    """At most 2 * SAMPLE_ROWS rows: the sample would save too little to be worth its
    spread, so the known type gives exactly the full re-run's measurement."""
    torch.manual_seed(2)
    known = nn.Linear(16, 16).eval()
    unknown = _AnyLinear(16, 16).eval()
    unknown.load_state_dict(known.state_dict())
    x = _activations(2 * SAMPLE_ROWS, 16)
    with torch.no_grad():
        y = known(x)
    assert measure_torch(known, (x,), {}, y) == measure_torch(unknown, (x,), {}, y)


def test_an_instance_with_a_replaced_forward_is_unknown() -> None:
    module = nn.Linear(4, 4)
    module.forward = lambda x: x  # type: ignore[method-assign]
    assert row_dims(module) is None


def test_a_sampled_mlx_leaf_agrees_with_its_full_rerun() -> None:
    """MLX's own ``Linear`` is sampled (its ``__call__`` is the one known); the same
    weights behind a subclass's own ``__call__`` are re-run in full."""

    class AnyLinear(mnn.Linear):
        def __call__(self, x: mx.array) -> mx.array:
            return super().__call__(x)

    known = mnn.Linear(96, 160)
    unknown = AnyLinear(96, 160)
    unknown.update(known.parameters())
    x = mx.array(_activations(8 * SAMPLE_ROWS, 96).numpy())
    y = known(x)
    mx.eval(y)
    sampled = measure_mlx(known, mnn.Linear.__call__, (x,), {}, y)
    full = measure_mlx(unknown, AnyLinear.__call__, (x,), {}, y)
    assert sampled is not None and full is not None
    ratio = sampled["sensitivity"] / full["sensitivity"]
    assert 0.75 < ratio < 1.33, (sampled, full)


def test_signs_are_kept_once_per_shape_and_differ_between_operands() -> None:
    """The k-th tensor a measurement perturbs gets the same signs in every call (drawn
    once), and the first and second operands of one call get different ones: ``a - b``
    with ``a ~ b`` must show its cancellation."""
    kept = Perturbations()
    frame = TorchFrame()
    x = torch.ones(64, 64)
    first = kept.signs(frame, x, U32, 0)
    assert kept.signs(frame, x, U32, 0) is first
    second = kept.signs(frame, x, U32, 1)
    assert not torch.equal(first, second)
    assert torch.equal(first.abs(), torch.full_like(x, U32))
    # Past the byte bound nothing is kept, and the same signs are drawn again.
    small = Perturbations(max_bytes=1024)
    drawn = small.signs(frame, x, U32, 0)
    assert small.signs(frame, x, U32, 0) is not drawn and torch.equal(drawn, first)


def test_a_cancellation_between_two_operands_is_still_measured() -> None:
    """``a - b`` with ``b = a (1 + 1e-6)``: relative steps of each operand, independent,
    become ~1e6 of them in the output (the same signs on both would show none)."""

    class Difference(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a - b

    torch.manual_seed(3)
    a = torch.randn(8, 8, dtype=torch.float64)
    b = a * (1 + 1e-6)
    found = measure_torch(Difference().eval(), (a, b), {}, a - b)
    assert found is not None and found["amplification"] > 1e5, found


# -- a call with children: leaves that read the same objects are not run again ---------------


class _Counted(nn.Linear):
    """A Linear that counts its forwards (a subclass: re-run in full as a leaf)."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


class _Mlp(nn.Module):
    """A gated MLP: gate and up read the input as it is, down reads their product.
    ``copy``: the input is copied first, so no child reads the same object twice."""

    def __init__(self, copy: bool) -> None:
        super().__init__()
        self.copy = copy
        self.gate, self.up, self.down = _Counted(16, 32), _Counted(16, 32), _Counted(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.copy:
            x = x.clone()
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def _root_line(path: Path) -> dict[str, object]:
    lines = [json.loads(x) for x in (path / "index.jsonl").read_text().splitlines()]
    root = next(r["seq"] for r in lines if r["event"] == "call" and r["module"] == "")
    found: dict[str, object] = next(r for r in lines if r["event"] == "return" and r["seq"] == root)
    return found


def test_a_leaf_reading_the_same_objects_is_not_run_again(home: Path) -> None:
    """In the MLP's rounding re-run (inputs kept) gate and up read the very tensor they
    read in the forward: they answer with what they returned, and the measurement is the
    same number as where they must run (the input copied first)."""
    torch.manual_seed(4)
    direct, copying = _Mlp(copy=False).eval(), _Mlp(copy=True).eval()
    copying.load_state_dict(direct.state_dict())
    x = torch.randn(3, 16)
    # Every call measured: the three leaves are of one kind, which a default capture
    # re-runs once it proved benign (not the point here).
    with torch.no_grad(), mldbg.capture(direct, "direct", sensitivity="all") as cap_direct:
        direct(x)
    with torch.no_grad(), mldbg.capture(copying, "copying", sensitivity="all") as cap_copying:
        copying(x)
    # forward, its own leaf re-run, the MLP's perturbed re-run; the rounding re-run: held
    assert (direct.gate.calls, direct.up.calls, direct.down.calls) == (3, 3, 4)
    assert (copying.gate.calls, copying.up.calls, copying.down.calls) == (4, 4, 4)
    a, b = _root_line(cap_direct.path), _root_line(cap_copying.path)
    assert a["sensitivity"] == b["sensitivity"] and a["amplification"] == b["amplification"]
    assert isinstance(a["sensitivity"], float) and a["sensitivity"] > 0
    # The instances got their own forward for the re-run only.
    assert "forward" not in vars(direct.gate) and "forward" not in vars(direct.up)


def test_a_leaf_whose_input_changed_in_place_runs_again(home: Path) -> None:
    """A tensor changed in place after the leaf read it (its version moved) is not what
    the leaf read: the rounding re-run runs the leaf."""

    class Updating(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = _Counted(8, 8), _Counted(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.first(x)
            x.mul_(2)  # the input, changed after `first` read it
            return y + self.second(x)

    torch.manual_seed(5)
    model = Updating().eval()
    with torch.no_grad(), mldbg.capture(model, "updating"):
        model(torch.randn(2, 8))
    assert model.first.calls == 4  # forward, leaf re-run, perturbed re-run, rounding re-run


def test_a_leaf_output_changed_in_place_by_its_parent_runs_again(home: Path) -> None:
    """A parent that scales a child's output in place after the call: what the child
    returned is no longer what it holds, so the rounding re-run runs the child."""

    class Scaling(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _Counted(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inner(x)
            h.mul_(2)
            return h.sin()

    torch.manual_seed(6)
    model = Scaling().eval()
    with torch.no_grad(), mldbg.capture(model, "scaling") as cap:
        model(torch.randn(2, 8))
    assert model.inner.calls == 4
    assert _root_line(cap.path)["sensitivity"] < 1e-5  # one rounding step, not a doubling


# -- a module of unknown type observed to be row-wise: measured on sampled rows ------------


class _Rows(nn.Module):
    """A user's MLP (children Linear, GELU, Linear; not a type the capture knows) that
    notes how many rows each of its calls reads.  ``mix``: each row also reads the mean
    of all rows (what attention over tokens or a norm over the sequence does).
    ``strict``: it refuses any other row count than ``rows``.  A keyword argument
    (``extra=...``) makes a call the capture cannot re-run on rows: the full re-run."""

    def __init__(self, width: int, mix: bool = False, strict: int | None = None) -> None:
        super().__init__()
        self.mix, self.strict = mix, strict
        self.up, self.act, self.down = (
            nn.Linear(width, 3 * width),
            nn.GELU(),
            nn.Linear(3 * width, width),
        )
        self.rows: list[int] = []

    def forward(self, x: torch.Tensor, extra: object = None) -> torch.Tensor:
        self.rows.append(x.numel() // x.shape[-1])
        if self.strict is not None and x.shape[-2] != self.strict:
            raise ValueError(f"wants {self.strict} rows")
        if self.mix:
            x = x + x.mean(dim=-2, keepdim=True)
        return self.down(self.act(self.up(x)))


def test_a_row_wise_module_of_unknown_type_is_measured_on_rows(home: Path) -> None:
    """A user's MLP over 8 * SAMPLE_ROWS rows: its re-runs read at most SAMPLE_ROWS rows
    (the base, the perturbed inputs, its children's outputs rounded), and what they
    measure agrees with the same call re-run on every row (a keyword argument makes the
    call one the capture re-runs whole)."""
    torch.manual_seed(7)
    x = _activations(8 * SAMPLE_ROWS, 24)
    found = {}
    for name, kwargs in (("rows", {}), ("whole", {"extra": None})):
        torch.manual_seed(8)  # the same weights for both
        model = _Rows(24).eval()
        with torch.no_grad(), mldbg.capture(model, name) as cap:
            model(x, **kwargs)
        found[name] = (_root_line(cap.path), list(model.rows))
    (rows_line, rows_seen), (whole_line, whole_seen) = found["rows"], found["whole"]
    assert rows_seen[0] == whole_seen[0] == 8 * SAMPLE_ROWS  # the forward
    assert len(rows_seen) == 4 and max(rows_seen[1:]) <= SAMPLE_ROWS, rows_seen
    assert whole_seen[1:] == [8 * SAMPLE_ROWS] * 2, whole_seen
    for key in ("amplification", "sensitivity"):
        ratio = float(rows_line[key]) / float(whole_line[key])  # type: ignore[arg-type]
        assert 0.75 < ratio < 1.33, (key, rows_line, whole_line)
    assert rows_line["step"] == whole_line["step"] == U32


@pytest.mark.parametrize("kind", ["mixes rows", "wants its row count"])
def test_a_module_that_is_not_row_wise_is_rerun_whole(kind: str) -> None:
    """Each row also reading the mean of all rows: a subset computes other rows (the
    base is far from the forward's), so the call is re-run whole and measures exactly
    what the whole re-run does; a module that refuses another row count the same."""
    torch.manual_seed(9)
    x = _activations(8 * SAMPLE_ROWS, 24)
    mixes = kind == "mixes rows"
    model = _Rows(24, mix=mixes, strict=None if mixes else 8 * SAMPLE_ROWS).eval()
    with torch.no_grad():
        y = model(x)
    on_rows = measure_torch(model, (x,), {}, y, perturbations=Perturbations())
    whole = measure_torch(model, (x,), {"extra": None}, y, perturbations=Perturbations())
    assert on_rows == whole and on_rows is not None
    # forward, the subset tried (its base, and its perturbed run where the base ran),
    # the measurement's whole re-run, then the whole measurement's
    assert model.rows[0] == model.rows[-2] == model.rows[-1] == 8 * SAMPLE_ROWS
    assert max(model.rows[1:-2]) <= SAMPLE_ROWS, model.rows


def test_an_mlx_module_of_unknown_type_is_measured_on_rows() -> None:
    """The same for MLX: a user's MLP class over 8 * SAMPLE_ROWS rows, measured on rows,
    agrees with the whole re-run; one whose rows read the mean of all rows is re-run whole."""

    class Mlp(mnn.Module):
        def __init__(self, mix: bool) -> None:
            super().__init__()
            self.mix = mix
            self.up, self.down = mnn.Linear(24, 72), mnn.Linear(72, 24)
            self.rows: list[int] = []

        def __call__(self, x: mx.array, extra: object = None) -> mx.array:
            self.rows.append(x.size // x.shape[-1])
            if self.mix:
                x = x + x.mean(axis=-2, keepdims=True)
            return self.down(mnn.gelu(self.up(x)))

    x = mx.array(_activations(8 * SAMPLE_ROWS, 24).numpy())
    for mix in (False, True):
        model = Mlp(mix)
        y = model(x)
        mx.eval(y)
        on_rows = measure_mlx(model, Mlp.__call__, (x,), {}, y)
        seen = list(model.rows)
        whole = measure_mlx(model, Mlp.__call__, (x,), {"extra": None}, y)
        assert on_rows is not None and whole is not None
        if mix:
            assert on_rows == whole and seen[-1] == 8 * SAMPLE_ROWS
        else:
            assert max(seen[1:]) <= SAMPLE_ROWS, seen
            ratio = on_rows["amplification"] / whole["amplification"]
            assert 0.75 < ratio < 1.33, (on_rows, whole)
