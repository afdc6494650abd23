"""A capture in a wider dtype: the better run ``compare --better`` judges a port against.

A bfloat16 reference rounds at every op; run in float64 on the same weights and inputs
it rounds ~2**45 times less, so its difference from the bfloat16 run is what bfloat16
rounding really did there (docs/parity-precision.md).  ``mldbg.capture(model,
"ref64", precision="float64")`` makes that run without editing the model: for the
capture's duration every floating parameter and buffer is cast to the wider dtype (a
widening cast, undone exactly afterwards) and every floating tensor the model's own
call receives is cast as it arrives, before the capture records it.  The model then
returns the wider dtype to the script (a denoising loop carries on in it, which is what
a better run of the pipeline wants).  Code that casts explicitly (``x.float()``) keeps
its cast: that precision is the reference's own.

PyTorch models only: an MLX model is made wider with ``model.set_dtype`` and its inputs
cast by the script (MLX computes float64 on the CPU only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.utils.hooks import RemovableHandle

PRECISIONS = ("float32", "float64")


def check_precision(precision: str | None, framework: str) -> str | None:
    """``precision`` when it is one this capture can run in; ValueError otherwise."""
    if precision is None:
        return None
    if precision not in PRECISIONS:
        raise ValueError(f"precision takes {' or '.join(PRECISIONS)}, not {precision!r}")
    if framework != "torch":
        raise ValueError(
            "precision= widens PyTorch models; make an MLX model wider with "
            "model.set_dtype(...) and cast its inputs in the script"
        )
    return precision


def widen(models: list[torch.nn.Module], precision: str) -> Callable[[], None]:
    """Cast ``models``' floating parameters and buffers to ``precision`` and each model's
    floating inputs as they arrive; returns what undoes it (each tensor back to its own
    dtype, the input hooks removed)."""
    import torch

    wide = getattr(torch, precision)
    kept: list[tuple[torch.Tensor, torch.dtype]] = []
    handles: list[RemovableHandle] = []
    try:
        for model in models:
            for tensor in [*model.parameters(), *model.buffers()]:
                if tensor.is_floating_point() and _narrower(tensor.dtype, wide):
                    kept.append((tensor, tensor.dtype))
                    tensor.data = tensor.data.to(wide)
            handles.append(
                model.register_forward_pre_hook(_casting(wide), with_kwargs=True, prepend=True)
            )
    except BaseException:
        _undo(kept, handles)
        raise
    return lambda: _undo(kept, handles)


def _narrower(dtype: torch.dtype, wide: torch.dtype) -> bool:
    import torch

    return torch.finfo(dtype).eps > torch.finfo(wide).eps


def _undo(kept: list[tuple[torch.Tensor, torch.dtype]], handles: Sequence[RemovableHandle]) -> None:
    for handle in handles:
        handle.remove()
    for tensor, dtype in kept:
        tensor.data = tensor.data.to(dtype)


def _casting(
    wide: torch.dtype,
) -> Callable[
    [torch.nn.Module, tuple[object, ...], dict[str, object]],
    tuple[tuple[object, ...], dict[str, object]],
]:
    def cast(
        _module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> tuple[tuple[object, ...], dict[str, object]]:
        return tuple(_cast(v, wide) for v in args), {k: _cast(v, wide) for k, v in kwargs.items()}

    return cast


def _cast(value: object, wide: torch.dtype) -> object:
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and _narrower(value.dtype, wide):
            return value.to(wide)
        return value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_cast(v, wide) for v in value)
    if isinstance(value, list):
        return [_cast(v, wide) for v in value]
    if isinstance(value, dict):
        return {k: _cast(v, wide) for k, v in value.items()}
    return value
