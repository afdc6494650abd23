"""How much a leaf module's output moves when its inputs move by one rounding step.

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
change over its float outputs).  ``u`` is the unit roundoff of the finer of each
input's and the outputs' dtype: a timestep embedding fed a bfloat16 timestep that
returns float32 computes in float32, and both implementations get the same input.  Compare turns it into a bound (see
``compare.verdict``).

Nothing here may change what the model computes or raises: a module in training mode
(dropout draws random numbers, batch norm updates its statistics), a call with an
argument that is neither a tensor nor a plain value (a KV cache it would update), or
any failure is simply not measured.
"""

from __future__ import annotations

import contextlib
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


def measure_torch(
    module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], output: Any
) -> float | None:
    """The sensitivity of a torch module's call (None when it is not measured)."""
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
        args, kwargs, output, is_float, perturb, rerun, as_float64, _torch_dtype, _torch_cast
    )


def measure_mlx(
    module: Any,
    call: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    output: Any,
) -> float | None:
    """The sensitivity of an MLX module's call; ``call`` is the original ``__call__``."""
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
        args, kwargs, output, is_float, perturb, rerun, as_float64, _mlx_dtype, _mlx_cast
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
    is_float: Callable[[Any], bool],
    perturb: Callable[[Any, float], Any],
    rerun: Callable[[tuple[Any, ...], dict[str, Any]], Any],
    as_float64: Callable[[Any], Any],
    dtype_of: Callable[[Any], str],
    cast: Callable[[Any, Any], Any],
) -> float | None:
    try:
        outputs = [x for x in _leaves(output) if is_float(x)]
        values = [*_leaves(args), *_leaves(tuple(kwargs.values()))]
        if not outputs or not any(is_float(x) for x in values):
            return None
        if not all(is_float(x) or _is_plain_or_tensor(x) for x in values):
            return None  # an object the call may update (a cache): never run it twice
        finest = min(outputs, key=lambda x: _UNIT.get(dtype_of(x), _UNIT["float32"]))
        u_out = _UNIT.get(dtype_of(finest), _UNIT["float32"])

        def moved(x: Any) -> Any:
            if not is_float(x):
                return x
            if _UNIT.get(dtype_of(x), _UNIT["float32"]) > u_out:
                # A step the input's own dtype cannot hold (a bfloat16 timestep into a
                # float32 embedding): perturbed in the dtype the op computes in.
                x = cast(x, finest)
            return perturb(x, u_out)

        new_args = tuple(_map(moved, a) for a in args)
        new_kwargs = {k: _map(moved, v) for k, v in kwargs.items()}
        with _rerunning():
            again = [x for x in _leaves(rerun(new_args, new_kwargs)) if is_float(x)]
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
            change = float(((b - a) ** 2).sum()) ** 0.5 / norm
            if math.isfinite(change):
                worst = max(worst, change)
        return worst
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


def _is_plain_or_tensor(x: Any) -> bool:
    """A value a call cannot update in place: plain Python values, and tensors (integer
    ids or masks), which are passed to the re-run unchanged."""
    return isinstance(x, _PLAIN) or type(x).__name__ in ("Tensor", "array", "ndarray")
