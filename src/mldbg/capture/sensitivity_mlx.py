"""The sensitivity measurement's MLX side: signs drawn with numpy, compared in float64.

MLX arrays live in unified memory: reading one through numpy copies it once, so the
comparison stays in float64 numpy as it always was (only the torch side, where a
device's tensors would cross to the host, moved into the framework).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import TypeGuard

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .records import Sensitivity
from .sensitivity import (
    ELEMENTWISE_ACTIVATIONS,
    SEED,
    STATEFUL_IN_TRAINING,
    HeldCall,
    Perturbations,
    inline_work,
    measure,
)


def measure_mlx(
    module: nn.Module,
    call: Callable[..., object],
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    output: object,
    owner: object = None,
    with_children: bool = False,
    perturbations: Perturbations | None = None,
    held: Sequence[HeldCall] = (),
) -> Sensitivity | None:
    """The sensitivity of an MLX module's call; ``call`` is the original ``__call__``;
    the rest as for ``sensitivity_torch.measure_torch``."""
    if getattr(module, "training", False) and any(
        word in type(module).__name__ for word in STATEFUL_IN_TRAINING
    ):
        return None

    def rerun(a: tuple[object, ...], k: dict[str, object]) -> object:
        result = call(module, *a, **k)
        mx.eval(result)
        return result

    return measure(
        _FRAME,
        rerun,
        args,
        kwargs,
        output,
        owner,
        with_children,
        perturbations or Perturbations(),
        None if with_children else row_dims(module, call),
        held,
    )


_FLOATING = (mx.float32, mx.float16, mx.bfloat16)
_ROW_WISE = tuple(
    getattr(nn, name)
    for name in ("Linear", "LayerNorm", "RMSNorm", *ELEMENTWISE_ACTIVATIONS)
    if hasattr(nn, name)
)
_ROW_WISE_CALLS = {kind.__call__ for kind in _ROW_WISE}


def row_dims(module: nn.Module, call: Callable[..., object]) -> int | None:
    """1 when ``call``, the ``__call__`` the module's class runs, is the one of MLX's own
    ``Linear``, ``LayerNorm``, ``RMSNorm`` (all over the last axis) or an elementwise
    activation: each row of the output comes from that row of the input alone.  None
    for any other (a ``QuantizedLinear``, a user's module)."""
    return 1 if call in _ROW_WISE_CALLS else None


def _host(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32), dtype=np.float64)


def _rows(x: mx.array, row_dims: int) -> mx.array:
    return x.reshape(-1, *x.shape[len(x.shape) - row_dims :])


class MlxFrame:
    """:class:`~mldbg.capture.sensitivity.Frame` for MLX arrays."""

    def is_float(self, x: object) -> TypeGuard[mx.array]:
        return isinstance(x, mx.array) and x.dtype in _FLOATING

    def dtype_name(self, x: mx.array) -> str:
        return str(x.dtype).removeprefix("mlx.core.")

    def cast(self, x: mx.array, like: mx.array) -> mx.array:
        return x.astype(like.dtype)

    def shape(self, x: mx.array) -> tuple[int, ...]:
        return tuple(x.shape)

    def signs(self, x: mx.array, u: float, ordinal: int) -> tuple[Hashable, Callable[[], mx.array]]:
        shape, dtype = tuple(x.shape), x.dtype

        def draw() -> mx.array:
            rng = np.random.default_rng(SEED if ordinal == 0 else [SEED, ordinal])
            signs = mx.array(rng.integers(0, 2, size=shape).astype(np.float32) * 2 - 1)
            return (signs * u).astype(dtype)

        return ("mlx", ordinal, shape, str(dtype), u), draw

    def nbytes(self, x: mx.array) -> int:
        return int(x.nbytes)

    def perturb(self, x: mx.array, scaled_signs: mx.array) -> mx.array:
        return x + x * scaled_signs

    def relative_change(self, before: mx.array, after: mx.array) -> float | None:
        a, b = _host(before).reshape(-1), _host(after).reshape(-1)
        if a.shape != b.shape or before.shape != after.shape:
            return None
        norm = float((a * a).sum()) ** 0.5
        if norm == 0 or not np.isfinite(norm):
            return float("nan")
        return float(((b - a) ** 2).sum()) ** 0.5 / norm

    def row_energies(self, x: mx.array, row_dims: int) -> np.ndarray:
        rows = _host(_rows(x, row_dims))
        rows = rows.reshape(rows.shape[0], -1)
        return np.asarray((rows * rows).sum(axis=1))

    def take_rows(self, x: mx.array, row_dims: int, picked: np.ndarray) -> mx.array:
        return _rows(x, row_dims)[mx.array(picked.astype(np.int32))]

    def row_changes(self, before: mx.array, after: mx.array) -> np.ndarray:
        a, b = _host(before), _host(after)
        diff = (b - a).reshape(a.shape[0], -1)
        return np.asarray((diff * diff).sum(axis=1))

    def reshape(self, x: mx.array, shape: tuple[int, ...]) -> mx.array:
        return x.reshape(shape)

    def inline_rounding(
        self, round_one: Callable[[mx.array], mx.array]
    ) -> contextlib.AbstractContextManager[object]:
        return _rounding(round_one)


# The ``mlx.core`` functions whose float results round (``mx.fast``'s too), and those
# among them that read their argument where one rounding step of it moves the result
# far (a sine of 1000): their float arguments are rounded as they arrive, standing for
# the rounding of the operators (``a * b``) that computed them, which cannot be wrapped.
ROUNDING_OPS = [
    "matmul",
    "addmm",
    "einsum",
    "softmax",
    "logsumexp",
    "multiply",
    "add",
    "subtract",
    "divide",
    "power",
    "square",
    "sqrt",
    "rsqrt",
    "exp",
    "log",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "erf",
    "sum",
    "mean",
    "var",
    "cumsum",
    "outer",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_general",
    "gather_mm",
    "quantized_matmul",
]
ILL_CONDITIONED = frozenset(
    ["sin", "cos", "exp", "log", "power", "tanh", "sigmoid", "erf", "softmax", "logsumexp"]
)
_LOCAL = threading.local()
_LOCK = threading.Lock()
_installed: list[tuple[ModuleType, str, object]] = []
_users = [0]


@contextlib.contextmanager
def _rounding(round_one: Callable[[mx.array], mx.array]) -> Iterator[None]:
    """While open: the wrapped ``mx`` functions called on this thread round their
    float results (and an ill-conditioned one its float arguments) with ``round_one``.
    The wrappers are installed once for every thread that measures and removed when the
    last one is done; other threads' calls pass through."""
    previous = getattr(_LOCAL, "round_one", None)
    with _LOCK:
        if not _users[0]:
            _install()
        _users[0] += 1
    _LOCAL.round_one = round_one
    try:
        yield
    finally:
        _LOCAL.round_one = previous
        with _LOCK:
            _users[0] -= 1
            if not _users[0]:
                for namespace, attribute, original in reversed(_installed):
                    setattr(namespace, attribute, original)
                _installed.clear()


def _install() -> None:
    for namespace, names in ((mx, ROUNDING_OPS), (mx.fast, dir(mx.fast))):
        for name in names:
            original = getattr(namespace, name, None)
            if name.startswith("_") or not callable(original) or isinstance(original, type):
                continue
            setattr(namespace, name, _rounding_call(original, name in ILL_CONDITIONED))
            _installed.append((namespace, name, original))


def _rounding_call(original: Callable[..., object], arguments: bool) -> Callable[..., object]:
    def call(*args: object, **kwargs: object) -> object:
        round_one = getattr(_LOCAL, "round_one", None)
        if round_one is None or not inline_work():
            return original(*args, **kwargs)
        if arguments:
            args = tuple(round_one(a) if _FRAME.is_float(a) else a for a in args)
        out = original(*args, **kwargs)
        return round_one(out) if _FRAME.is_float(out) else out

    call.__wrapped__ = original  # type: ignore[attr-defined]
    return call


_FRAME = MlxFrame()
