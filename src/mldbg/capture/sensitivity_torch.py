"""The sensitivity measurement's torch side: signs, norms and rows on the tensor's device.

Everything here runs where the tensors are (CPU or GPU) and only scalars, or one float
per row, reach the host: the measurement's comparison used to copy each output to a
float64 numpy array, about as much work as the re-run of a cheap op.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import TypeGuard

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .records import Sensitivity
from .sensitivity import (
    ELEMENTWISE_ACTIVATIONS,
    SEED,
    HeldCall,
    Perturbations,
    held_output,
    inline_work,
    measure,
    unit,
)


def measure_torch(
    module: nn.Module,
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    output: object,
    owner: object = None,
    with_children: bool = False,
    perturbations: Perturbations | None = None,
    held: Sequence[HeldCall] = (),
) -> Sensitivity | None:
    """The sensitivity of a torch module's call (None when it is not measured): a call
    ``with_children`` is also re-run with the outputs of the descendants that ``owner``'s
    hooks see rounded.  ``perturbations`` keeps the capture's drawn signs; ``held``, the
    call's leaf children as they ran (their outputs are reused where they read the same
    objects again)."""
    if module.training:
        return None

    def rerun(a: tuple[object, ...], k: dict[str, object]) -> object:
        with torch.no_grad(), _answering(held, owner):
            return module.forward(*a, **k)

    return measure(
        _FRAME,
        rerun,
        args,
        kwargs,
        output,
        owner,
        with_children,
        perturbations or Perturbations(),
        None if with_children else row_dims(module),
        held,
    )


def versions(args: tuple[object, ...], kwargs: Mapping[str, object]) -> tuple[int, ...]:
    """The in-place version counter of each tensor among a call's arguments (nested in
    tuples, lists and dicts as ``sensitivity._leaves`` walks them)."""
    found: list[int] = []
    pending: list[object] = [*args, *kwargs.values()]
    while pending:
        value = pending.pop(0)
        if isinstance(value, torch.Tensor):
            found.append(value._version)
        elif isinstance(value, tuple | list):
            pending[:0] = value
        elif isinstance(value, dict):
            pending[:0] = value.values()
    return tuple(found)


def output_versions(output: object) -> tuple[int, ...]:
    """The in-place version counter of each tensor of a call's output."""
    return versions((output,), {})


@contextlib.contextmanager
def _answering(held: Sequence[HeldCall], owner: object) -> Iterator[None]:
    """Each held child's ``forward`` answers from what it returned when it reads the same
    objects again (``sensitivity.held_output``, active only in a rounding re-run on this
    thread), and runs otherwise.  A hook cannot skip a forward, so the instance gets its
    own ``forward`` for the re-run, and loses it after; an instance that already has one
    (a library patched it) is left alone."""
    patched: list[nn.Module] = []
    try:
        for call in held:
            module = call.module
            if isinstance(module, nn.Module) and "forward" not in vars(module):
                object.__setattr__(module, "forward", _answer(module, owner))
                patched.append(module)
    except BaseException:
        for module in patched:
            vars(module).pop("forward", None)
        raise
    try:
        yield
    finally:
        for module in patched:
            vars(module).pop("forward", None)


def _answer(module: nn.Module, owner: object) -> Callable[..., object]:
    forward = type(module).forward

    def answer(*args: object, **kwargs: object) -> object:
        found, output = held_output(
            owner, module, args, kwargs, versions(args, kwargs), output_versions
        )
        return output if found else forward(module, *args, **kwargs)

    return answer


# Seeds of successive perturbed tensors: SEED, SEED + _STRIDE, ...  (the first tensor a
# measurement perturbs gets the signs it got before signs were kept).
_STRIDE = 1_000_003


ELEMENTWISE: tuple[type[nn.Module], ...] = tuple(
    getattr(nn, name) for name in ELEMENTWISE_ACTIVATIONS if hasattr(nn, name)
)
NORMS = tuple(getattr(nn, name) for name in ("LayerNorm", "RMSNorm") if hasattr(nn, name))


def row_dims(module: nn.Module) -> int | None:
    """How many trailing dimensions make one row of what ``module`` reads, when its exact
    type says each row of its output is computed from that row of its input alone
    (torch's own ``Linear``, ``LayerNorm``, ``RMSNorm``, elementwise activations); None
    for any other type, a subclass, or an instance whose ``forward`` was replaced."""
    kind = type(module)
    if "forward" in vars(module):
        return None
    if kind is nn.Linear or kind in ELEMENTWISE:
        return 1
    if kind in NORMS:
        shape = getattr(module, "normalized_shape", None)
        return len(shape) if isinstance(shape, tuple | list) and shape else None
    return None


def _wide(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 tensors, float32 for the rest (half types widened)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _difference(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``after - before``, exact for nearby values (in float32 for half types: a
    float16 difference of large values would overflow)."""
    wide = _wide(before.dtype)
    return after.to(wide) - before.to(wide)


def _norm(x: torch.Tensor) -> float:
    value = float(torch.linalg.vector_norm(x, dtype=_wide(x.dtype)))
    if not math.isfinite(value) and x.dtype != torch.float64:  # float32 overflowed
        value = float(torch.linalg.vector_norm(x, dtype=torch.float64))
    return value


def _row_squares(x: torch.Tensor) -> np.ndarray:
    """``|row|^2`` of each row of a 2-D tensor, float64 on the host."""
    squares = np.asarray(torch.linalg.vector_norm(x, dim=1, dtype=_wide(x.dtype)).cpu()) ** 2
    if x.dtype != torch.float64 and not math.isfinite(float(squares.sum())):  # overflowed
        norms = torch.linalg.vector_norm(x, dim=1, dtype=torch.float64).cpu()
        squares = np.asarray(norms) ** 2
    return squares.astype(np.float64)


def _rows(x: torch.Tensor, row_dims: int) -> torch.Tensor:
    return x.reshape(-1, *x.shape[x.dim() - row_dims :])


class TorchFrame:
    """:class:`~mldbg.capture.sensitivity.Frame` for torch tensors."""

    def is_float(self, x: object) -> TypeGuard[torch.Tensor]:
        return isinstance(x, torch.Tensor) and x.is_floating_point() and not x.is_complex()

    def dtype_name(self, x: torch.Tensor) -> str:
        return str(x.dtype).removeprefix("torch.")

    def cast(self, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return x.to(like.dtype)

    def shape(self, x: torch.Tensor) -> tuple[int, ...]:
        return tuple(x.shape)

    def signs(
        self, x: torch.Tensor, u: float, ordinal: int
    ) -> tuple[Hashable, Callable[[], torch.Tensor]]:
        shape, dtype, device = tuple(x.shape), x.dtype, x.device

        def draw() -> torch.Tensor:
            generator = torch.Generator().manual_seed(SEED + _STRIDE * ordinal)
            signs = torch.randint(0, 2, shape, generator=generator).to(device, dtype) * 2 - 1
            return signs * u

        return ("torch", ordinal, shape, dtype, str(device), u), draw

    def nbytes(self, x: torch.Tensor) -> int:
        return x.numel() * x.element_size()

    def perturb(self, x: torch.Tensor, scaled_signs: torch.Tensor) -> torch.Tensor:
        return x + x * scaled_signs

    def relative_change(self, before: torch.Tensor, after: torch.Tensor) -> float | None:
        if before.shape != after.shape:
            return None
        with torch.no_grad():
            norm = _norm(before.detach())
            if norm == 0 or not math.isfinite(norm):
                return math.nan
            return _norm(_difference(before.detach(), after.detach())) / norm

    def row_energies(self, x: torch.Tensor, row_dims: int) -> np.ndarray:
        with torch.no_grad():
            return _row_squares(_rows(x.detach(), row_dims).flatten(1))

    def take_rows(self, x: torch.Tensor, row_dims: int, picked: np.ndarray) -> torch.Tensor:
        index = torch.as_tensor(picked, dtype=torch.long, device=x.device)
        return _rows(x.detach(), row_dims).index_select(0, index)

    def row_changes(self, before: torch.Tensor, after: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return _row_squares(_difference(before, after.detach()).flatten(1))

    def reshape(self, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return x.reshape(shape)

    def inline_rounding(
        self, round_one: Callable[[torch.Tensor], torch.Tensor]
    ) -> contextlib.AbstractContextManager[object]:
        return _Rounding(round_one)


# Operations whose result is exact: it moves, selects, joins or makes values without
# rounding them (names as torch's function or method, underscores stripped).
EXACT_OPS = frozenset(
    [
        "getitem",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "permute",
        "transpose",
        "t",
        "contiguous",
        "clone",
        "detach",
        "expand",
        "expand_as",
        "repeat",
        "repeat_interleave",
        "tile",
        "squeeze",
        "unsqueeze",
        "flatten",
        "unflatten",
        "narrow",
        "select",
        "index_select",
        "gather",
        "take_along_dim",
        "cat",
        "concat",
        "concatenate",
        "stack",
        "hstack",
        "vstack",
        "flip",
        "roll",
        "movedim",
        "moveaxis",
        "swapaxes",
        "swapdims",
        "chunk",
        "split",
        "unbind",
        "tensor_split",
        "pad",
        "zeros",
        "ones",
        "zeros_like",
        "ones_like",
        "empty",
        "empty_like",
        "full",
        "full_like",
        "arange",
        "tensor",
        "as_tensor",
        "new_zeros",
        "new_ones",
        "new_full",
        "new_empty",
        "new_tensor",
        "masked_fill",
        "where",
        "abs",
        "neg",
        "relu",
        "maximum",
        "minimum",
        "clamp",
        "clip",
        "max",
        "min",
        "amax",
        "amin",
        "tril",
        "triu",
        "diag",
        "diagonal",
        "embedding",
        "one_hot",
        "dropout",
        "floor",
        "ceil",
        "round",
        "trunc",
        "sign",
    ]
)
CASTS = frozenset(("to", "type", "float", "double", "half", "bfloat16"))


class _Rounding(TorchFunctionMode):
    """Rounds the float result of each torch operation the running code calls by one
    step of its dtype (``round_one``), on the thread that opened it: what each
    implementation's own rounding of its intermediates is.  Results that alias an
    input (in-place operations, views) and exact operations (:data:`EXACT_OPS`; a cast
    unless it narrows) are returned as they are; so is the measurement's own work."""

    def __init__(self, round_one: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.round_one = round_one

    def __torch_function__(
        self,
        func: Callable[..., object],
        types: object,
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
    ) -> object:
        out = func(*args, **(kwargs or {}))
        if not inline_work() or not _rounds(func, out, args):
            return out
        assert isinstance(out, torch.Tensor)
        return self.round_one(out)


def _rounds(func: Callable[..., object], out: object, args: Sequence[object]) -> bool:
    """Whether ``out``, the result of ``func(*args)``, is a new float tensor that
    ``func`` rounded."""
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.is_complex():
        return False
    raw = getattr(func, "__name__", "")
    name = raw.strip("_")
    if raw.endswith("_") and not raw.startswith("__") or raw.startswith("__i"):
        return False  # in place
    if out._base is not None or any(out is a for a in args):
        return False  # a view of, or the very tensor it read
    if name in CASTS:
        source = args[0] if args else None
        return isinstance(source, torch.Tensor) and unit(str(out.dtype)) > unit(str(source.dtype))
    return name not in EXACT_OPS


_FRAME = TorchFrame()
