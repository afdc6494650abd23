"""Checks that the pairs in ``parity_models`` are what parity tests assume they are.

A clean pair must agree at every module present on both sides (within the dtype's
``torch.testing.assert_close`` defaults), and a bugged pair must go wrong first at
exactly ``bug_module``: its inputs agree, its output does not, every module that ran
before it agrees, and every other module fed matching inputs still agrees.  Otherwise a
parity tool tested on these pairs could be right for the wrong reason.

Module inputs and outputs are recorded with torch forward hooks on the torch side and,
since MLX has no hooks, by swapping each MLX module's class for a recording subclass.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # real models, both frameworks
mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")
pytest.importorskip("transformers")

from parity_models import BUGS, PAIRS, Pair, as_numpy  # noqa: E402

# torch.testing.assert_close defaults.
TOLERANCES = {"float32": (1.3e-6, 1e-5), "bfloat16": (1.6e-2, 1e-5)}

# Modules that exist on one side only (by design); every other module must be shared.
ONE_SIDED = {
    "llama": (r"^model\.rotary_emb$", r"\.act_fn$", r"\.rope$"),
    "torch": (r"\.attn\.[qkv]_proj$", r"\.attn\.qkv$"),
    "conv": (),
    "mlp_bf16": (),
}


@dataclass
class Call:
    """One module call: when it started and finished, its first tensor in and out."""

    start: int
    end: int
    input: np.ndarray | None
    output: np.ndarray | None


Calls = dict[str, list[Call]]


def _first_tensor(value: Any) -> Any:
    """The main tensor of a module's arguments or output (tuples, dicts, ModelOutputs)."""
    if isinstance(value, torch.Tensor | mx.array):
        return value
    if isinstance(value, dict):
        if "hidden_states" in value:
            return _first_tensor(value["hidden_states"])
        value = list(value.values())
    if isinstance(value, list | tuple):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _array(value: Any) -> np.ndarray | None:
    tensor = _first_tensor(value)
    return None if tensor is None else as_numpy(tensor)


@contextmanager
def _record_torch(model: Any, calls: Calls, clock: Iterator[int]) -> Iterator[None]:
    handles = []
    for path, module in model.named_modules():

        def before(_m: Any, args: Any, kwargs: Any, path: str = path) -> None:
            calls.setdefault(path, []).append(Call(next(clock), -1, _array((args, kwargs)), None))

        def after(_m: Any, _a: Any, _k: Any, out: Any, path: str = path) -> None:
            calls[path][-1].end, calls[path][-1].output = next(clock), _array(out)

        handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(module.register_forward_hook(after, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _record_mlx(model: Any, calls: Calls, clock: Iterator[int]) -> Iterator[None]:
    swapped = []
    for path, module in model.named_modules():
        original = type(module)

        def call(self: Any, *args: Any, _path: str = path, _original: type = original, **kw: Any):
            this = Call(next(clock), -1, _array((args, kw)), None)
            calls.setdefault(_path, []).append(this)
            out = _original.__call__(self, *args, **kw)
            this.end, this.output = next(clock), _array(out)
            return out

        module.__class__ = type(original.__name__, (original,), {"__call__": call})
        swapped.append((module, original))
    try:
        yield
    finally:
        for module, original in reversed(swapped):
            module.__class__ = original


def record(pair: Pair) -> tuple[Calls, Calls]:
    """Every module call of one forward of each side, the port's in reference names."""
    clock = itertools.count()
    ref: Calls = {}
    port: Calls = {}
    recorders: dict[str, Callable[..., Any]] = {"torch": _record_torch, "mlx": _record_mlx}
    with recorders[pair.ref_framework](pair.ref, ref, clock):
        pair.run_ref()
    with recorders[pair.port_framework](pair.port, port, clock):
        pair.run_port()
    renamed = {}
    for name, calls in port.items():
        for pattern, replacement in pair.name_map.items():
            name = re.sub(pattern, replacement, name)
        if pair.port_channels_last:
            for call in calls:
                call.input, call.output = _to_nchw(call.input), _to_nchw(call.output)
        renamed[name] = calls
    return ref, renamed


def _to_nchw(array: np.ndarray | None) -> np.ndarray | None:
    return array.transpose(0, 3, 1, 2) if array is not None and array.ndim == 4 else array


def mismatch(actual: np.ndarray | None, expected: np.ndarray | None, dtype: str) -> str | None:
    """None when close by assert_close's rule, else how far apart (max abs and rel)."""
    assert actual is not None and expected is not None
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != {expected.shape}"
    rtol, atol = TOLERANCES[dtype]
    actual, expected = actual.astype(np.float64), expected.astype(np.float64)
    diff = np.abs(actual - expected)
    if np.all(diff <= atol + rtol * np.abs(expected)):
        return None
    nonzero = expected != 0
    rel = (diff[nonzero] / np.abs(expected[nonzero])).max() if nonzero.any() else np.inf
    return f"max abs {diff.max():.3g}, max rel {rel:.3g}"


def shared(pair_name: str, ref: Calls, port: Calls) -> dict[str, tuple[Call, Call]]:
    """(ref call, port call) of each module on both sides, in the reference's call order.

    Checks on the way that the other modules are one-sided by design and that each shared
    module runs once per forward on both sides.
    """
    one_sided = ref.keys() ^ port.keys()
    unexpected = [n for n in one_sided if not any(re.search(p, n) for p in ONE_SIDED[pair_name])]
    assert not unexpected, f"modules on one side only: {unexpected}"
    names = sorted(ref.keys() & port.keys(), key=lambda n: ref[n][0].start)
    assert all(len(ref[n]) == len(port[n]) == 1 for n in names)
    return {n: (ref[n][0], port[n][0]) for n in names}


def is_ancestor(name: str, of: str) -> bool:
    return name == "" or of.startswith(name + ".")


@pytest.mark.parametrize("pair_name", list(PAIRS))
def test_clean_pair_agrees_at_every_shared_module(pair_name: str) -> None:
    pair = PAIRS[pair_name]()
    assert pair.bug_module is None
    modules = shared(pair_name, *record(pair))
    assert len(modules) >= 6
    bad = {
        name: why
        for name, (ref, port) in modules.items()
        if (why := mismatch(port.output, ref.output, pair.dtype)) is not None
    }
    assert not bad, f"clean {pair_name} pair disagrees at {bad}"
    assert mismatch(as_numpy(pair.run_port()), as_numpy(pair.run_ref()), pair.dtype) is None


BUG_CASES = [(name, bug) for name, bugs in BUGS.items() for bug in bugs]


@pytest.mark.parametrize(("pair_name", "bug"), BUG_CASES)
def test_bug_is_first_seen_at_bug_module(pair_name: str, bug: str) -> None:
    pair = PAIRS[pair_name](bug)
    culprit = pair.bug_module
    assert culprit is not None and pair.bug_module_port is not None
    mapped = pair.bug_module_port
    for pattern, replacement in pair.name_map.items():
        mapped = re.sub(pattern, replacement, mapped)
    assert mapped == culprit
    modules = shared(pair_name, *record(pair))
    assert culprit in modules

    ref, port = modules[culprit]
    assert mismatch(port.input, ref.input, pair.dtype) is None
    assert port.output is not None and ref.output is not None
    off_by = np.abs(port.output - ref.output).max()
    assert off_by > 100 * TOLERANCES[pair.dtype][1], f"{culprit} is only off by {off_by:.3g}"
    assert mismatch(as_numpy(pair.run_port()), as_numpy(pair.run_ref()), pair.dtype) is not None

    for name, (ref_call, port_call) in modules.items():
        if name == culprit or is_ancestor(name, culprit):
            continue
        finished_before = ref_call.end < ref.start
        inputs_agree = mismatch(port_call.input, ref_call.input, pair.dtype) is None
        if finished_before or inputs_agree:
            why = mismatch(port_call.output, ref_call.output, pair.dtype)
            assert why is None, f"{name} (before the bug, or fed equal inputs) disagrees: {why}"


@pytest.mark.parametrize("pair_name", list(PAIRS))
def test_same_seed_same_pair(pair_name: str) -> None:
    first, second = PAIRS[pair_name](), PAIRS[pair_name]()
    np.testing.assert_array_equal(as_numpy(first.run_ref()), as_numpy(second.run_ref()))
    np.testing.assert_array_equal(as_numpy(first.run_port()), as_numpy(second.run_port()))


def test_unknown_bug_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown bug"):
        PAIRS["conv"]("nope")


def test_llama_bfloat16_pair_is_close() -> None:
    """bf16 end to end: only loosely close, so no bf16 bug cases are built on this pair.

    q/k/v projections still match at bf16 assert_close defaults, but from layer 0's
    attention on (rope, scores and softmax round differently in bf16) modules drift by a
    few bf16 ulps: about 0.03-0.045 max abs on logits of magnitude ~3.
    """
    pair = PAIRS["llama"](dtype="bfloat16")
    ref, port = as_numpy(pair.run_ref()), as_numpy(pair.run_port())
    assert pair.port.model.embed_tokens.weight.dtype == mx.bfloat16
    np.testing.assert_allclose(port, ref, atol=0.1, rtol=0.05)
