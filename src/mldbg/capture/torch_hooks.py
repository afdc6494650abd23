"""Capture for ``torch.nn.Module``: forward pre-hooks and forward hooks on each submodule.

Hooks are the supported way to see every submodule call in PyTorch; removing their
handles restores the modules exactly.  ``always_call=True`` makes the forward hook run
also when the forward raises, so the record of that call is closed with the error.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .. import dtypes
from .device_async import DeviceClock, PendingCopy
from .recorder import Recorder
from .records import TensorInfo
from .safetensors_header import header_entries
from .sensitivity import HeldCall, enter_descendant, exit_descendant, measuring, rounded_output
from .sensitivity_torch import measure_torch, output_versions, versions

if TYPE_CHECKING:  # torch is imported when a torch model is captured
    import numpy as np
    import torch
    from torch import nn
    from torch.utils.hooks import RemovableHandle


# A forward pre-hook or forward hook (what torch.compiler.disable wraps and returns).
Hook = TypeVar("Hook", bound=Callable[..., object])


def prepare(model: nn.Module) -> nn.Module:
    """The module to hook: ``model``, or the eager module inside a ``torch.compile`` one.

    Raises TypeError, naming the module, for TorchScript modules (``torch.jit.script`` /
    ``trace``), which take no Python hooks.
    """
    named_modules(model)
    return _unwrap(model)


def has_parameters(module: nn.Module) -> bool:
    """Whether ``module`` or a module inside it holds a parameter (buffers do not count)."""
    return next(iter(module.parameters()), None) is not None


def named_modules(
    model: nn.Module, wrappers: list[nn.Module] | None = None
) -> list[tuple[str, nn.Module]]:
    """``model.named_modules()``, with each ``torch.compile`` wrapper replaced by the module
    it wraps under the wrapper's own path: the names are those of the eager model.  The
    wrappers met are added to ``wrappers``."""
    import torch

    script = getattr(torch.jit, "ScriptModule", ())
    found: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()

    def visit(module: nn.Module, path: str) -> None:
        while (inner := _compiled_inner(module)) is not None:
            _check_fullgraph(module, path)
            if wrappers is not None:
                wrappers.append(module)
            module = inner
        if id(module) in seen:
            return
        if isinstance(module, script):
            where = "the model" if not path else f"its submodule {path!r}"
            raise TypeError(
                f"mldbg.capture cannot record a TorchScript module ({where} is a "
                f"{type(module).__name__}, from torch.jit.script or torch.jit.trace): "
                "TorchScript takes no Python hooks. Capture the eager torch.nn.Module instead."
            )
        seen.add(id(module))
        found.append((path, module))
        for name, child in module.named_children():
            visit(child, f"{path}.{name}" if path else name)

    visit(model, "")
    return found


def _check_fullgraph(module: nn.Module, path: str) -> None:
    """A ``torch.compile(fullgraph=True)`` wrapper cannot run the hooks: say so before writing."""
    context = getattr(module, "dynamo_ctx", None)
    if getattr(context, "fullgraph", False) or getattr(context, "error_on_graph_break", False):
        where = "the model" if not path else f"its submodule {path!r}"
        raise TypeError(
            f"mldbg.capture cannot record {where}: it was compiled with "
            "torch.compile(..., fullgraph=True), and the capture's hooks need graph breaks. "
            "Capture the eager module (compiled._orig_mod) or compile without fullgraph=True."
        )


def _eager(hook: Hook) -> Hook:
    import torch

    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is None:
        return hook
    try:
        return disable(hook, reason=_GRAPH_BREAK)  # type: ignore[no-any-return]
    except TypeError:  # a torch without `reason`
        return disable(hook)  # type: ignore[no-any-return]


_GRAPH_BREAK = (
    "mldbg.capture records module calls in Python hooks, which break the graph; "
    "compile without fullgraph=True while capturing"
)


def _unwrap(module: nn.Module) -> nn.Module:
    """The eager module inside a ``torch.compile`` (dynamo ``OptimizedModule``) wrapper."""
    while (inner := _compiled_inner(module)) is not None:
        module = inner
    return module


def _compiled_inner(module: nn.Module) -> nn.Module | None:
    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(dynamo, "OptimizedModule", None)
    if wrapper is not None and isinstance(module, wrapper):
        inner: nn.Module = getattr(module, "_orig_mod")  # noqa: B009 - a dynamo attribute
        return inner
    return None


def attach(model: nn.Module, recorder: Recorder, keep: Callable[[str], bool]) -> Callable[[], None]:
    """Hook every kept submodule of ``model``; returns the function that removes the hooks.

    Dynamo does not guard compiled code on module hooks: with a ``torch.compile`` module
    in the tree its caches are reset when the hooks come and again when they go, so the
    capture sees every call and the model afterwards runs without them.
    """
    handles: list[RemovableHandle] = []
    live = [True]  # code compiled during the capture may still call the hooks after it
    wrappers: list[nn.Module] = []
    hooks = _Hooks(recorder, live)

    def detach() -> None:
        live[0] = False
        for handle in reversed(handles):
            handle.remove()
        handles.clear()
        hooks.handled_at_entry.clear()
        if wrappers:
            _reset_dynamo()

    try:
        for path, module in named_modules(model, wrappers):
            if keep(path) and id(module) not in hooks.modules:
                hooks.modules[id(module)] = (path, type(module).__name__)
                handles.append(module.register_forward_pre_hook(hooks.before, with_kwargs=True))
                handles.append(
                    module.register_forward_hook(hooks.after, with_kwargs=True, always_call=True)
                )
        if wrappers:
            _reset_dynamo()
    except BaseException:
        detach()
        raise
    return detach


def _reset_dynamo() -> None:
    try:
        import torch._dynamo

        torch._dynamo.reset()
    except Exception:  # a torch without it: compiled code keeps what it had
        pass


class _Hooks:
    """The two hooks of one capture, shared by every module it records (each module's
    path and class looked up by the module): one ``torch.compiler.disable`` wrapper each
    for the whole capture.  A wrapper per module cost ~0.15 ms to make, twice per module:
    a capture's largest cost on a deep model of small modules (0.19 s for 631 modules
    against a 0.04 s forward)."""

    def __init__(self, recorder: Recorder, live: list[bool]) -> None:
        self.recorder = recorder
        self.live = live
        self.modules: dict[int, tuple[str, str]] = {}  # id(module): (path, class name)
        # The exception being handled around each open call (a call inside an `except`).
        self.handled_at_entry: dict[int, BaseException | None] = {}
        # Under torch.compile the hooks run eagerly (a graph break), not traced.
        self.before = _eager(self._before)
        self.after = _eager(self._after)

    def _before(
        self, module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        recorder = self.recorder
        if self.live[0] and measuring():  # inside a parent's re-run: not its inline work
            enter_descendant(recorder)
            return
        known = self.modules.get(id(module))
        if not self.live[0] or known is None:
            return
        seq = recorder.enter(known[0], known[1], args, kwargs)
        self.handled_at_entry[seq] = sys.exc_info()[1]

    def _after(
        self,
        module: nn.Module,
        args: tuple[object, ...],
        kwargs: dict[str, object],
        output: object,
    ) -> object:
        recorder = self.recorder
        if self.live[0] and measuring():  # inside a parent's re-run: its output rounded
            exit_descendant(recorder)
            rounded, value = rounded_output(recorder, output)
            return value if rounded else None
        known = self.modules.get(id(module))
        seq = recorder.open_seq(known[0]) if self.live[0] and known is not None else None
        if seq is None or known is None:
            return None
        path, class_name = known
        handled = self.handled_at_entry.pop(seq, None)
        # When the forward raises, torch calls always_call hooks inside its `except` block:
        # an exception other than the one handled at entry is the forward's own.
        current = sys.exc_info()[1]
        error = current if output is None and current is not handled else None
        if error is not None:
            recorder.exit(seq, path, output, error)
            return None
        extra = recorder.sensitivity_of(
            seq,
            lambda parent: measure_torch(
                module,
                args,
                kwargs,
                output,
                recorder,
                parent,
                recorder.perturbations,
                recorder.held_by(seq),
            ),
            output,
            class_name,
        )
        held = _held_call(module, args, kwargs, output) if recorder.sensitivity else None
        recorder.exit(seq, path, output, None, extra, held)
        return None


def settle(output: object) -> None:
    """Wait for the kernels that compute ``output`` (CUDA and MPS run asynchronously), so a
    call's time is its work, not its launch; nothing to wait for on the CPU."""
    import torch

    devices = {t.device.type for t in _tensors_in(output, 0)}
    if "cuda" in devices:
        torch.cuda.synchronize()
    if "mps" in devices:
        torch.mps.synchronize()


def _tensors_in(value: object, depth: int) -> list[torch.Tensor]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 4:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    elif callable(to_tuple := getattr(value, "to_tuple", None)):  # a transformers ModelOutput
        value = list(to_tuple())
    if isinstance(value, list | tuple):
        return [t for item in value[:64] for t in _tensors_in(item, depth + 1)]
    return []


def save(tensors: dict[str, Any], tmp: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Write torch tensors (numpy arrays too) to ``tmp`` exactly: dtype kept, moved to CPU.

    Each tensor goes to the file as a view of its memory (``safetensors_writer``: one
    ``writev``, the GIL released, no copy of a CPU tensor that is already contiguous);
    a tensor that cannot be viewed so is skipped alone, with the reason.  A dtype without
    a safetensors name there sends the whole file through ``safetensors.torch.save_file``.
    """
    import torch

    ready: dict[str, torch.Tensor] = {}
    skipped: dict[str, str] = {}
    for key, value in tensors.items():
        try:
            ready[key] = _writable(value)[0]
        except Exception as exc:
            skipped[key] = f"{type(exc).__name__}: {exc}"
    if not ready:
        return {}, skipped
    names = _safetensors_names()
    if sys.byteorder != "little" or not all(t.dtype in names for t in ready.values()):
        from safetensors.torch import save_file

        save_file({key: _owned(t) for key, t in ready.items()}, str(tmp))
        return header_entries(tmp), skipped
    from .safetensors_writer import write_buffers

    entries = []
    for key, tensor in ready.items():
        try:
            raw = _flat(tensor).view(torch.uint8).numpy()
        except Exception as exc:  # a tensor subclass without plain memory: skipped alone
            skipped[key] = f"{type(exc).__name__}: {exc}"
            continue
        entries.append((key, names[tensor.dtype], list(tensor.shape), raw))
    if not entries:
        return {}, skipped
    return write_buffers(tmp, entries), skipped


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as one row of elements with a unit stride.  torch calls a one-element
    tensor contiguous whatever its stride, so an expanded scalar (``t.expand(1)``, stride
    0: diffusers' timestep) survives ``contiguous()``, ``reshape`` and ``clone`` as is."""
    import torch

    flat = tensor.reshape(-1)
    if flat.numel() and flat.stride(0) != 1:
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return flat


def _owned(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor that owns its whole storage (``safetensors.torch`` refuses shared memory)."""
    return tensor.clone()


_NAMES: dict[torch.dtype, str] = {}


def _safetensors_names() -> dict[torch.dtype, str]:
    """Torch dtype -> safetensors dtype name, for the dtypes this torch has (a cache: it is
    read at every captured tensor)."""
    import torch

    if not _NAMES:
        for found in dtypes.TABLE:
            dtype = getattr(torch, found.numpy, None)
            if found.safetensors and found.bits % 8 == 0 and isinstance(dtype, torch.dtype):
                _NAMES[dtype] = found.code
    return _NAMES


def _writable(value: object) -> tuple[torch.Tensor, bool]:
    """``value`` (a torch tensor or a numpy array) as a dense, contiguous CPU tensor, and
    whether it still shares the memory of ``value`` (no copy was needed); raises for what
    cannot be captured."""
    import torch

    from .device_async import ready

    value = ready(value)  # a copy from a GPU, once it is done
    if not isinstance(value, torch.Tensor):
        import numpy as np

        value = torch.from_numpy(np.ascontiguousarray(value))  # shares the array's memory
    tensor = value.detach()
    if tensor.layout != torch.strided:
        raise TypeError(f"{tensor.layout} tensors are not captured")
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    unsupported = _unsupported_dtype(tensor.dtype)
    if unsupported:
        raise TypeError(unsupported)
    tensor = tensor.cpu().contiguous().resolve_conj().resolve_neg()
    try:
        shared = tensor.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()
    except Exception:  # no storage to ask (a quantized original): assume the worst
        shared = True
    return tensor, shared


def on_host(model: nn.Module) -> bool:
    """Every parameter and buffer of ``model`` is on the CPU (a summary computed from the
    writer's CPU copies then costs no transfer)."""
    tensors = (*model.parameters(), *model.buffers())
    return all(t.device.type == "cpu" for t in tensors)


def snapshot(value: object) -> torch.Tensor | PendingCopy:
    """A CPU copy of ``value`` the background writer can write later (the model may change
    its own tensors in place meanwhile); raises for what cannot be captured.  Moving to
    the CPU or making contiguous already copies: only a tensor still sharing the model's
    memory is cloned.  A CUDA tensor's copy is only queued on its stream, into pinned
    memory, and the writer waits for it (capture/device_async.py)."""
    import torch

    if isinstance(value, torch.Tensor) and _unsupported_dtype(value.dtype) is None:
        pending = PendingCopy.start(value.detach())
        if pending is not None:
            return pending
    tensor, shared = _writable(value)
    return tensor.clone() if shared else tensor


def device_clock() -> DeviceClock | None:
    """Event timing for a process that uses CUDA (calls timed without waiting for the
    GPU); None otherwise: calls are timed on the host's clock, as on the CPU."""
    if not DeviceClock.active():
        return None
    return DeviceClock(_first_tensor)


def _first_tensor(value: object) -> torch.Tensor | None:
    """The first CUDA tensor in a call's arguments or output (the device it runs on)."""
    for tensor in _tensors_in(value, 0):
        if tensor.device.type == "cuda":
            return tensor
    return None


def snapshotter() -> Callable[[object], torch.Tensor | PendingCopy]:
    """The background writer's hand-off: a copy of every tensor, every time.

    One copy per tensor per call, even when calls pass one tensor along (a layer's
    output is the next one's input).  Reusing a copy while the tensor's ``_version`` is
    unchanged looked safe and is not: writes that bypass the dispatcher (a collective's
    in-place all-reduce, a Triton or custom kernel, a numpy view of the tensor) leave
    the version as it was, and the capture would show the value from before them."""
    return snapshot


_DTYPES: dict[torch.dtype, str | None] = {}


def _unsupported_dtype(dtype: torch.dtype) -> str | None:
    """Why safetensors cannot store ``dtype`` (asked once per dtype, in memory), or None."""
    import torch

    if dtype not in _DTYPES:
        from safetensors.torch import save as to_bytes

        try:
            to_bytes({"probe": torch.empty(0, dtype=dtype)})
            _DTYPES[dtype] = None
        except Exception as exc:
            _DTYPES[dtype] = (
                f"{dtype} cannot be stored in safetensors ({type(exc).__name__}: {exc})"
            )
    return _DTYPES[dtype]


def summarize(value: object) -> tuple[np.ndarray, dict[str, Any], list[int], str]:
    """A summary capture's record of one tensor: sketch and statistics, on its device."""
    import torch

    from .device_async import ready
    from .sketch import dtype_name, summarize_torch

    value = ready(value)
    if not isinstance(value, torch.Tensor):
        import numpy as np

        value = torch.from_numpy(np.ascontiguousarray(value))
    tensor = value.detach()
    if tensor.layout != torch.strided:
        raise TypeError(f"{tensor.layout} tensors are not captured")
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    sketch, stats = summarize_torch(tensor)
    return sketch, stats, list(tensor.shape), dtype_name(value.dtype)


def _held_call(
    module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
) -> HeldCall | None:
    """The call as it ran, for its parent's rounding re-run; None when its tensors keep
    no version counter (made under ``torch.inference_mode()``: reading ``_version``
    raises), so it cannot be told unchanged: it then runs again in that re-run."""
    try:
        return HeldCall(
            module, args, kwargs, versions(args, kwargs), output, output_versions(output)
        )
    except RuntimeError:
        return None
