"""Capture for ``mlx.nn.Module``: MLX has no hooks, so each instance gets a recording class.

Every kept module's ``__class__`` is swapped for a subclass made once per original
class whose ``__call__`` records and then calls the original one; ``isinstance`` and
``type(m).__name__`` still answer as before.  Detaching puts every original class back,
in reverse order, so nested captures unwind cleanly.  Arrays are evaluated as they are
written: what lands on disk is what the model computed at that point.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .recorder import Recorder
from .safetensors_header import header_entries


def attach(model: Any, recorder: Recorder, keep: Callable[[str], bool]) -> Callable[[], None]:
    paths: dict[int, str] = {}
    classes: dict[type, type] = {}
    swapped: list[tuple[Any, type]] = []

    def detach() -> None:
        for module, original in reversed(swapped):
            module.__class__ = original
        swapped.clear()
        paths.clear()

    try:
        for path, module in model.named_modules():
            if not keep(path) or id(module) in paths:
                continue
            original = type(module)
            if original not in classes:
                classes[original] = _recording_class(original, recorder, paths)
            paths[id(module)] = path
            module.__class__ = classes[original]
            swapped.append((module, original))
    except BaseException:
        detach()
        raise
    return detach


def _recording_class(original: type, recorder: Recorder, paths: dict[int, str]) -> type:
    call = original.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        path = paths.get(id(self))
        if path is None:
            return call(self, *args, **kwargs)
        seq = recorder.enter(path, original.__name__, args, kwargs)
        try:
            output = call(self, *args, **kwargs)
        except BaseException as exc:
            recorder.exit(seq, path, None, exc)
            raise
        recorder.exit(seq, path, output, None)
        return output

    recording = type(
        original.__name__,
        (original,),
        {
            "__call__": __call__,
            "__module__": original.__module__,
            "__qualname__": original.__qualname__,
            "__doc__": original.__doc__,
        },
    )
    return recording


def save(tensors: dict[str, Any], tmp: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Evaluate and write MLX arrays (numpy arrays too) to ``tmp`` with their dtypes."""
    import mlx.core as mx

    ready: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for key, value in tensors.items():
        if isinstance(value, mx.array):
            ready[key] = value
        elif type(value).__module__.startswith("numpy"):
            ready[key] = mx.array(value)
        else:
            skipped[key] = f"{type(value).__module__}.{type(value).__name__} in an MLX model"
    if not ready:
        return {}, skipped
    mx.eval(list(ready.values()))
    mx.save_safetensors(str(tmp), ready)
    return header_entries(tmp), skipped
