"""How much a module's own work moves its output when its operands move by one rounding step.

Two correct implementations of one op differ by their rounding, and a backward-stable
op computes the exact result of inputs perturbed by about one unit roundoff ``u``.  So
what two clean implementations may differ by at a module is the module's own
*sensitivity*: the relative change of its output when each float input element is
multiplied by ``1 +- u``.  For most ops that is about ``u`` (a matmul, a norm); for an
ill-conditioned op it is much more: ``sin(1000 x)`` moves by ``1000 u``, which is why a
diffusion model's sinusoidal timestep embedding differs between PyTorch and MLX by
far more than one rounding step while both are right.

This is msprobe's "benchmark-free perturbation check" done per module, at capture time:
each leaf call (one that calls no captured submodule) runs once more, on perturbed
copies of its inputs, and its index line gets ``sensitivity`` (the largest relative RMS
change over its float outputs) and ``step``, the ``u`` it was perturbed by: their ratio
is the call's measured amplification of a relative error in what it reads, which
compare applies to the error its inputs actually arrive with.

**A call with children** measures its inline work.  An attention whose q/k/v/out
projections are ``Linear`` children computes the softmax of its logits, the rotary
embedding, the mask and the SDPA inline (diffusers' Flux and SD3 processors, every
hand-written MLX DiT): that is where its conditioning lives, and its leaves'
measurements cannot see it.  So the call runs twice more, its children running again
each time (unrecorded):

* with its inputs perturbed as a leaf's are: ``amplification`` is its outputs' relative
  change over ``step``, what a relative error in what it reads becomes at its outputs
  (the softmax of large logits: 5 to 30; a ``Linear``: 1 to 3).  Compare applies it to
  the error its inputs actually arrive with (``compare.verdict.amplified``).
* with its inputs kept and every captured descendant's output multiplied by ``1 +- u``
  of its own dtype as it returns (the forward hook's or the recording class's return
  value): ``sensitivity`` is what one rounding step at each of its module boundaries
  becomes through its inline ops, its own rounding.  Not its inputs' steps: those are
  what the amplification applies to, measured (an exact timestep into a bfloat16 time
  embedding carries no error, and one bfloat16 step of 900 would move a sine by 3.5).

The children's share is not subtracted, but it is not counted twice either: compare
takes the *largest* floor (the call's own or any child's), never a sum.  Why not hold
the children's outputs and re-run only the inline work: an attention's output *is* its
``to_out`` child's output, so a held child would hide the softmax whose result flows
into it.

The cost is bounded by height: a call with children is re-run when its subtree is at
most ``MAX_HEIGHT`` (1) call deep below it and all of it is recorded (not below the
capture's ``depth``), so each op of the forward runs at most three more times (once
for its leaf, twice for its parent), never once per level of a deep model; blocks and
roots, whose inline work is residual additions and modulation, are not re-run.  A module
whose forward updates state outside its arguments (a counter on ``self``, a caching
hook) is updated by the re-runs too: capture with ``sensitivity=False`` for such a model.
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# Unit roundoff (half an ulp at 1) per float dtype name, as torch and MLX spell them.
_UNIT = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
_PLAIN = (int, float, bool, str, bytes, type(None))
_STATEFUL_IN_TRAINING = ("Dropout", "BatchNorm")
SEED = 20  # the perturbation's signs: the same on every run, whatever the user's seeds
_STATE = threading.local()
# A call with children is re-run (children included) only when its subtree is at most
# this many calls deep: each op then runs at most 1 + 2 * MAX_HEIGHT more times.
MAX_HEIGHT = 1


def measuring() -> bool:
    """A re-run is under way on this thread: no capture records it (captures may nest,
    and a leaf of one capture can hold modules another capture records)."""
    return bool(getattr(_STATE, "depth", 0))


@contextlib.contextmanager
def _rerunning() -> Iterator[None]:
    _STATE.depth = getattr(_STATE, "depth", 0) + 1
    try:
        yield
    finally:
        _STATE.depth -= 1


def rounded_output(owner: Any, output: Any) -> tuple[bool, Any]:
    """During a re-run made by ``owner`` (a capture's recorder): a captured descendant's
    output rounded by one step of its dtype, as its hook or wrapper returns it
    (``(True, output)``); ``(False, None)`` outside one."""
    active = getattr(_STATE, "rounding", None)
    if active is None or active[0] is not owner:
        return False, None
    return True, _rebuild(active[1], output)


@contextlib.contextmanager
def _rounding(owner: Any, round_one: Callable[[Any], Any]) -> Iterator[None]:
    previous = getattr(_STATE, "rounding", None)
    _STATE.rounding = (owner, round_one)
    try:
        yield
    finally:
        _STATE.rounding = previous


def measure_torch(
    module: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    output: Any,
    owner: Any = None,
    with_children: bool = False,
) -> dict[str, float] | None:
    """The sensitivity of a torch module's call (None when it is not measured): a call
    ``with_children`` is also re-run with the outputs of the descendants that ``owner``'s
    hooks see rounded."""
    import torch

    if getattr(module, "training", False):
        return None
    generator = torch.Generator().manual_seed(SEED)

    def is_float(x: Any) -> bool:
        return isinstance(x, torch.Tensor) and x.is_floating_point() and not x.is_complex()

    def perturb(x: Any, u: float) -> Any:
        signs = torch.randint(0, 2, x.shape, generator=generator).to(x.device, x.dtype) * 2 - 1
        return x + x * (signs * u)

    def rerun(a: tuple[Any, ...], k: dict[str, Any]) -> Any:
        with torch.no_grad():
            return module.forward(*a, **k)

    def as_float64(x: Any) -> Any:
        return x.detach().to("cpu", torch.float64).reshape(-1).numpy()

    return _measure(
        args,
        kwargs,
        output,
        owner,
        with_children,
        is_float,
        perturb,
        rerun,
        as_float64,
        _torch_dtype,
        _torch_cast,
    )


def measure_mlx(
    module: Any,
    call: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    output: Any,
    owner: Any = None,
    with_children: bool = False,
) -> dict[str, float] | None:
    """The sensitivity of an MLX module's call; ``call`` is the original ``__call__``;
    ``owner`` and ``with_children`` as for :func:`measure_torch`."""
    import mlx.core as mx
    import numpy as np

    if getattr(module, "training", False) and any(
        word in type(module).__name__ for word in _STATEFUL_IN_TRAINING
    ):
        return None
    rng = np.random.default_rng(SEED)
    floating = (mx.float32, mx.float16, mx.bfloat16)

    def is_float(x: Any) -> bool:
        return isinstance(x, mx.array) and x.dtype in floating

    def perturb(x: Any, u: float) -> Any:
        signs = mx.array(rng.integers(0, 2, size=x.shape).astype(np.float32) * 2 - 1)
        return x + x * (signs * u).astype(x.dtype)

    def rerun(a: tuple[Any, ...], k: dict[str, Any]) -> Any:
        result = call(module, *a, **k)
        mx.eval(result)
        return result

    def as_float64(x: Any) -> Any:
        return np.array(x.astype(mx.float32), dtype=np.float64).reshape(-1)

    return _measure(
        args,
        kwargs,
        output,
        owner,
        with_children,
        is_float,
        perturb,
        rerun,
        as_float64,
        _mlx_dtype,
        _mlx_cast,
    )


def _torch_dtype(x: Any) -> str:
    return str(x.dtype).removeprefix("torch.")


def _mlx_dtype(x: Any) -> str:
    return str(x.dtype).removeprefix("mlx.core.")


def _torch_cast(x: Any, like: Any) -> Any:
    return x.to(like.dtype)


def _mlx_cast(x: Any, like: Any) -> Any:
    return x.astype(like.dtype)


def _measure(
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    output: Any,
    owner: Any,
    with_children: bool,
    is_float: Callable[[Any], bool],
    perturb: Callable[[Any, float], Any],
    rerun: Callable[[tuple[Any, ...], dict[str, Any]], Any],
    as_float64: Callable[[Any], Any],
    dtype_of: Callable[[Any], str],
    cast: Callable[[Any, Any], Any],
) -> dict[str, float] | None:
    try:
        outputs = [x for x in _leaves(output) if is_float(x)]
        values = [*_leaves(args), *_leaves(tuple(kwargs.values()))]
        float_inputs = any(is_float(x) for x in values)
        if not outputs or not (float_inputs or with_children):
            return None
        if not all(is_float(x) or _is_plain_or_tensor(x) for x in values):
            return None  # an object the call may update (a cache): never run it twice
        finest = min(outputs, key=lambda x: _UNIT.get(dtype_of(x), _UNIT["float32"]))
        u_out = _UNIT.get(dtype_of(finest), _UNIT["float32"])

        def moved(x: Any) -> Any:
            if not is_float(x):
                return x
            u_in = _UNIT.get(dtype_of(x), _UNIT["float32"])
            if u_in > u_out:
                # A step the input's own dtype cannot hold (a bfloat16 timestep into a
                # float32 embedding): perturbed in the dtype the op computes in.
                x = cast(x, finest)
            # A finer input than the output (a float32 timestep into a bfloat16 model's
            # time embedding) moves by its own step: both sides read it at that precision.
            return perturb(x, min(u_in, u_out))

        def rounded(x: Any) -> Any:
            # A descendant's output is rounded to its own dtype by each implementation:
            # one step of that dtype, kept in it (what reads it reads the same dtype).
            if not is_float(x):
                return x
            return perturb(x, _UNIT.get(dtype_of(x), _UNIT["float32"]))

        def change(again_output: Any) -> float | None:
            again = [x for x in _leaves(again_output) if is_float(x)]
            if len(again) != len(outputs):
                return None
            worst = 0.0
            for before, after in zip(outputs, again, strict=True):
                a, b = as_float64(before), as_float64(after)
                if a.shape != b.shape:
                    return None
                norm = float((a * a).sum()) ** 0.5
                if norm == 0 or not math.isfinite(norm):
                    continue
                moved_by = float(((b - a) ** 2).sum()) ** 0.5 / norm
                if math.isfinite(moved_by):
                    worst = max(worst, moved_by)
            return worst

        found: dict[str, float] = {"step": u_out}
        if float_inputs:  # what one rounding step of its inputs becomes
            new_args = tuple(_map(moved, a) for a in args)
            new_kwargs = {k: _map(moved, v) for k, v in kwargs.items()}
            with _rerunning():
                through = change(rerun(new_args, new_kwargs))
            if through is None:
                return None
            found["amplification"] = through / u_out
            found["sensitivity"] = through
        if with_children:  # what its own rounding becomes (inputs as they were)
            with _rerunning(), _rounding(owner, rounded):
                own = change(rerun(args, dict(kwargs)))
            if own is None:
                return None
            found["sensitivity"] = own
        return found
    except Exception:  # measuring must never break the model or the capture
        return None


def _leaves(value: Any) -> list[Any]:
    """Tensors and plain values of a nest of tuples, lists and dicts (one value otherwise)."""
    if isinstance(value, tuple | list):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if hasattr(value, "to_tuple"):  # a transformers / diffusers ModelOutput
        return _leaves(value.to_tuple())
    return [value]


def _map(fn: Callable[[Any], Any], value: Any) -> Any:
    if isinstance(value, tuple | list):
        return type(value)(_map(fn, item) for item in value)
    if isinstance(value, dict):
        return {k: _map(fn, item) for k, item in value.items()}
    return fn(value)


def _rebuild(fn: Callable[[Any], Any], value: Any) -> Any:
    """``value`` with ``fn`` applied to each leaf, of the same types (a named tuple, a
    ``ModelOutput``): what a held child returns must read like what it returned."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_rebuild(fn, item) for item in value))
    if isinstance(value, tuple | list):
        return type(value)(_rebuild(fn, item) for item in value)
    if isinstance(value, dict):
        rebuilt = copy.copy(value)
        for key, item in value.items():
            rebuilt[key] = _rebuild(fn, item)
        return rebuilt
    return fn(value)


def _is_plain_or_tensor(x: Any) -> bool:
    """A value a call cannot update in place: plain Python values, and tensors (integer
    ids or masks), which are passed to the re-run unchanged."""
    return isinstance(x, _PLAIN) or type(x).__name__ in ("Tensor", "array", "ndarray")
