"""Capture for ``mlx.nn.Module``: MLX has no hooks, so each instance gets a recording class.

Every kept module's ``__class__`` is swapped for a subclass made once per original
class whose ``__call__`` records and then calls the original one; ``isinstance`` and
``type(m).__name__`` still answer as before.  Arrays are evaluated as they are
written: what lands on disk is what the model computed at that point.

Captures may overlap and end in any order: a capture entered on top of another one
subclasses the recording class it finds.  Detaching marks the capture's classes dead
(their ``__call__`` then only passes through) and puts back, on each module still on
its own class, the class it found with every dead recording class peeled off, so the
last capture to end leaves each module exactly on its original class.

Module paths follow torch's ``named_modules()``: a depth-first walk in the order the
children were set (lists and dicts of modules included), each instance once, under
the first path that reaches it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import dtypes
from .recorder import Recorder
from .records import Quantization, TensorInfo
from .sensitivity import HeldCall, descendant, held_output, measuring, rounded_output
from .sensitivity_mlx import measure_mlx

if TYPE_CHECKING:  # MLX is imported when an MLX model is captured
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np

_LAYER = "_mldbg_capture_layer"


class _Layer:
    """The state one capture shares with its recording classes."""

    def __init__(self) -> None:
        self.live = True


def prepare(model: nn.Module) -> nn.Module:
    return model


def has_parameters(module: nn.Module) -> bool:
    """Whether ``module`` or a module inside it holds a parameter (a quantized layer's
    packed weight counts; frozen ones too)."""
    from mlx.utils import tree_flatten

    return bool(tree_flatten(module.parameters()))


def named_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, module)`` depth-first in insertion order, each instance once, first path wins.

    mlx's own ``named_modules()`` walks children last-first, so a module set under two
    names would get its last name there; torch gives the first one.
    """
    import mlx.nn as nn

    found: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    containers: set[int] = set()

    def visit(value: object, path: str) -> None:
        if isinstance(value, nn.Module):
            if id(value) in seen:
                return
            seen.add(id(value))
            found.append((path, value))
            for key, child in value.items():
                if isinstance(child, dict | list):  # mlx's valid_child_filter
                    visit(child, _join(path, key))
        elif isinstance(value, dict | list):
            if id(value) in containers:  # a list or dict that holds itself
                return
            containers.add(id(value))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                visit(child, _join(path, key))
            containers.discard(id(value))

    visit(model, "")
    return found


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def attach(model: nn.Module, recorder: Recorder, keep: Callable[[str], bool]) -> Callable[[], None]:
    layer = _Layer()
    paths: dict[int, str] = {}
    classes: dict[type, type] = {}
    swapped: list[tuple[nn.Module, type, type]] = []  # module, class found, recording class

    def detach() -> None:
        layer.live = False
        paths.clear()
        for module, found, recording in reversed(swapped):
            if type(module) is recording:  # otherwise a later capture sits on top: it restores
                module.__class__ = _peel(found)
        swapped.clear()

    try:
        for path, module in named_modules(model):
            if not keep(path):
                continue
            found = type(module)
            if found not in classes:
                classes[found] = _recording_class(found, recorder, paths, layer)
            paths[id(module)] = path
            module.__class__ = classes[found]
            swapped.append((module, found, classes[found]))
    except BaseException:
        detach()
        raise
    return detach


def _peel(cls: type) -> type:
    """``cls`` without the recording classes of captures that have ended."""
    while True:
        layer = vars(cls).get(_LAYER)
        if layer is None or layer.live:
            return cls
        cls = cls.__bases__[0]


def quantization(module: nn.Module) -> Quantization | None:
    """``{"bits", "group_size", "mode"}`` of an MLX quantized module (``QuantizedLinear``,
    ``QuantizedEmbedding``, or any module holding ``bits``/``group_size`` and packed
    ``scales``), else None.  Compare widens its expected error by the quantization's."""
    bits, group_size = getattr(module, "bits", None), getattr(module, "group_size", None)
    if not isinstance(bits, int) or not isinstance(group_size, int):
        return None
    try:
        has_scales = "scales" in module
    except Exception:
        has_scales = False
    if not has_scales and "Quantized" not in type(module).__name__:
        return None
    found: Quantization = {"bits": bits, "group_size": group_size}
    mode = getattr(module, "mode", None)
    if isinstance(mode, str):
        found["mode"] = mode
    return found


def _recording_class(
    original: type, recorder: Recorder, paths: dict[int, str], layer: _Layer
) -> type:
    call = original.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        path = paths.get(id(self))
        if path is None or measuring():
            # In a parent's rounding re-run a leaf reading what it read returns what it
            # returned (MLX arrays never change in place: identity is enough).
            held, output = (
                (False, None) if path is None else held_output(recorder, self, args, kwargs)
            )
            if not held:
                with descendant(recorder):  # in a parent's re-run: not its inline work
                    output = call(self, *args, **kwargs)
            if path is None:  # its capture has ended
                return output
            rounded, value = rounded_output(recorder, output)  # inside a parent's re-run
            return value if rounded else output
        quant = quantization(self)
        seq = recorder.enter(
            path, original.__name__, args, kwargs, {"quant": quant} if quant else None
        )
        try:
            output = call(self, *args, **kwargs)
        except BaseException as exc:
            recorder.exit(seq, path, None, exc)
            raise
        extra = recorder.sensitivity_of(
            seq,
            lambda parent: measure_mlx(
                self,
                call,
                args,
                kwargs,
                output,
                recorder,
                parent,
                recorder.perturbations,
                recorder.held_by(seq),
            ),
            output,
            original.__name__,
        )
        held_call = HeldCall(self, args, kwargs, (), output) if recorder.sensitivity else None
        recorder.exit(seq, path, output, None, extra, held_call)
        return output

    recording = type(
        original.__name__,
        (original,),
        {
            "__call__": __call__,
            "__module__": original.__module__,
            "__qualname__": original.__qualname__,
            "__doc__": original.__doc__,
            _LAYER: layer,
        },
    )
    return recording


def settle(output: object) -> None:
    """Evaluate ``output`` (MLX builds a graph and computes nothing until asked), so a
    call's time is its computation; the capture evaluates it to save it anyway."""
    import mlx.core as mx

    mx.eval(output)


class Prepared:
    """An MLX array made ready to write: evaluated, its bytes seen through numpy.

    MLX computes lazily and its graph is not for sharing between threads (a stream
    belongs to the thread that made it: evaluating a lazy array on another one fails,
    ml-explore/mlx#3529, and ``mx.save_safetensors`` evaluates), so everything MLX does
    happens on the model's thread: evaluating the array (which the model's own
    ``mx.eval`` would do anyway) and exporting its memory as a numpy array, which copies
    nothing (``bfloat16``, which numpy lacks, through a ``uint16`` view).  MLX arrays are
    never changed in place, so that view stays what the call computed; the writer thread
    touches only numpy and the file.
    """

    __slots__ = ("array", "dtype", "nbytes", "shape")

    def __init__(self, value: object) -> None:
        import mlx.core as mx
        import numpy as np

        if not isinstance(value, mx.array):
            if not type(value).__module__.startswith("numpy"):
                raise TypeError(f"{type(value).__module__}.{type(value).__name__} in an MLX model")
            # a copy: the script may change its numpy array later
            value = mx.array(np.asarray(value))
        unsupported = _unsupported_dtype(value.dtype)
        if unsupported:
            raise TypeError(unsupported)
        name = _safetensors_name(value.dtype)
        if name is None:
            raise TypeError(f"{value.dtype} has no safetensors name here")
        exported = value.view(mx.uint16) if value.dtype == mx.bfloat16 else value
        mx.eval(exported)
        self.array = np.asarray(exported)
        self.dtype = name
        self.shape = list(value.shape)
        self.nbytes = int(value.nbytes)


class Unwritable:
    """What the writer gets for a value that could not be prepared: the reason only, so
    the writer thread never touches the MLX array (it skips the value with that reason,
    the one an inline capture gives)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def on_host(model: nn.Module) -> bool:
    """Unified memory, but a summary is computed with MLX operations, which stay on the
    model's thread: never computed by the writer."""
    return False


def snapshotter() -> Callable[[object], Prepared | Unwritable]:
    """The background writer's hand-off, taken on the model's thread."""

    def prepare(value: object) -> Prepared | Unwritable:
        try:
            return Prepared(value)
        except Exception as exc:
            return Unwritable(f"{type(exc).__name__}: {exc}")

    return prepare


def save(tensors: dict[str, Any], tmp: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Evaluate and write MLX arrays (numpy arrays too) to ``tmp`` with their dtypes.

    A value that cannot be stored (a float64 array, an object array) is skipped alone.
    Values the background writer hands over arrive already :class:`Prepared`; an inline
    capture prepares them here, so both write the same bytes.
    """
    import numpy as np

    from .safetensors_writer import write_buffers

    entries = []
    skipped: dict[str, str] = {}
    for key, value in tensors.items():
        if isinstance(value, Unwritable):
            skipped[key] = value.reason
            continue
        try:
            ready = value if isinstance(value, Prepared) else Prepared(value)
        except Exception as exc:
            skipped[key] = f"{type(exc).__name__}: {exc}"
            continue
        raw = np.ascontiguousarray(ready.array).reshape(-1).view(np.uint8)
        entries.append((key, ready.dtype, ready.shape, raw))
    if not entries:
        return {}, skipped
    return write_buffers(tmp, entries), skipped


def _safetensors_name(dtype: mx.Dtype) -> str | None:
    found = dtypes.lookup(dtype)
    return found.code if found is not None and found.safetensors else None


_DTYPES: dict[mx.Dtype, str | None] = {}


def _unsupported_dtype(dtype: mx.Dtype) -> str | None:
    """Why MLX cannot write ``dtype`` to safetensors (asked once per dtype, in memory), or None."""
    import mlx.core as mx

    if dtype not in _DTYPES:
        import io

        try:
            mx.save_safetensors(io.BytesIO(), {"probe": mx.zeros((0,), dtype=dtype)})
            _DTYPES[dtype] = None
        except Exception as exc:
            _DTYPES[dtype] = (
                f"{dtype} cannot be stored in safetensors ({type(exc).__name__}: {exc})"
            )
    return _DTYPES[dtype]


def summarize(value: object) -> tuple[np.ndarray, dict[str, Any], list[int], str]:
    """A summary capture's record of one array: sketch and statistics (via numpy)."""
    import mlx.core as mx
    import numpy as np

    from .sketch import dtype_name, summarize_numpy

    if not isinstance(value, mx.array):
        array = np.asarray(value)
        sketch, stats = summarize_numpy(array)
        return sketch, stats, list(array.shape), dtype_name(array.dtype)
    if mx.issubdtype(value.dtype, mx.complexfloating):
        raise TypeError(f"complex arrays are not summarized ({value.dtype})")
    widened = (
        value.astype(mx.float32)
        if mx.issubdtype(value.dtype, mx.floating) and value.dtype != mx.float64
        else value
    )
    sketch, stats = summarize_numpy(np.asarray(widened))
    return sketch, stats, list(value.shape), dtype_name(value.dtype)
