"""Capture for ``torch.nn.Module``: forward pre-hooks and forward hooks on each submodule.

Hooks are the supported way to see every submodule call in PyTorch; removing their
handles restores the modules exactly.  ``always_call=True`` makes the forward hook run
also when the forward raises, so the record of that call is closed with the error.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .recorder import Recorder
from .safetensors_header import header_entries


def attach(model: Any, recorder: Recorder, keep: Callable[[str], bool]) -> Callable[[], None]:
    """Hook every kept submodule of ``model``; returns the function that removes the hooks."""
    handles: list[Any] = []

    def detach() -> None:
        for handle in reversed(handles):
            handle.remove()
        handles.clear()

    try:
        for path, module in model.named_modules():
            if keep(path):
                handles.extend(_hook(module, path, recorder))
    except BaseException:
        detach()
        raise
    return detach


def _hook(module: Any, path: str, recorder: Recorder) -> list[Any]:
    class_name = type(module).__name__

    def before(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        recorder.enter(path, class_name, args, kwargs)

    def after(_module: Any, _args: Any, _kwargs: Any, output: Any) -> None:
        seq = recorder.open_seq(path)
        if seq is None:
            return
        # On the error path torch calls always_call hooks inside its `except` block.
        error = sys.exc_info()[1] if output is None else None
        recorder.exit(seq, path, output, error)

    return [
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after, with_kwargs=True, always_call=True),
    ]


def save(tensors: dict[str, Any], tmp: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Write torch tensors (numpy arrays too) to ``tmp`` exactly: dtype kept, moved to CPU."""
    import torch
    from safetensors.torch import save_file

    ready: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for key, value in tensors.items():
        try:
            ready[key] = _cpu_copy(torch, value)
        except Exception as exc:
            skipped[key] = f"{type(exc).__name__}: {exc}"
    if not ready:
        return {}, skipped
    save_file(ready, str(tmp))
    return header_entries(tmp), skipped


def _cpu_copy(torch: Any, value: Any) -> Any:
    """A dense CPU tensor that owns its whole storage (safetensors refuses shared memory)."""
    if not isinstance(value, torch.Tensor):
        import numpy as np

        value = torch.from_numpy(np.ascontiguousarray(value))
    tensor = value.detach()
    if tensor.layout != torch.strided:
        raise TypeError(f"{tensor.layout} tensors are not captured")
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    tensor = tensor.cpu().contiguous()
    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        tensor = tensor.clone()
    elif tensor.data_ptr() == value.data_ptr() and value.device.type == "cpu":
        tensor = tensor.clone()  # the caller's own memory: another entry may alias it
    return tensor
