"""Op-level capture inside chosen modules: torch functions and MLX ``mx.*`` calls.

When compare names a culprit module (an attention), the next question is which
operation inside it is wrong (the RoPE rotation, the head repeat, the mask, the softmax
scale).  With ``mldbg.capture(model, name, ops="model.layers.0.self_attn")`` every
framework operation run while a call of a matching module is under way (on that thread)
is recorded like a module call nested in it, at path ``<module>:op<N>.<op name>``
(``N`` counts the operations of that call from 0; the call index is the module's):

* **torch**: a ``TorchFunctionMode`` is pushed for the duration of the module's call:
  every ``torch.*``, ``torch.nn.functional.*`` and ``Tensor`` method that returns a
  tensor (``mul``, ``cat``, ``softmax``, ``linear``, ``__getitem__``…).
* **MLX**: the ``mlx.core`` functions listed in ``MLX_OPS`` and every ``mlx.core.fast``
  function (``rope``, ``scaled_dot_product_attention``, ``rms_norm``…) are wrapped while
  the capture is open.  Array methods and operators (``x.reshape``, ``a * b``) belong to
  a C++ class that cannot be wrapped and are not recorded.

Names differ between frameworks (torch's ``mul`` + ``cat`` + ``add`` is MLX's one
``fast.rope``), so compare aligns operations by value, not name (``compare/culprit/ops.py``).
What the recorder itself does (copying a tensor to write it) is never an operation, nor is
any other work of mldbg's on that thread (``own_work.py``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..own_work import doing_own_work
from .recorder import SKIPPED, Recorder
from .sensitivity import measuring
from .store import module_label

if TYPE_CHECKING:  # the frameworks are imported when their models are captured
    import mlx.nn as mnn
    from torch import nn
    from torch.utils.hooks import RemovableHandle

OP_CLASS_PREFIX = "op:"
MLX_OPS = (
    "matmul",
    "addmm",
    "einsum",
    "softmax",
    "logsumexp",
    "concatenate",
    "stack",
    "split",
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
    "maximum",
    "minimum",
    "clip",
    "where",
    "take",
    "take_along_axis",
    "repeat",
    "tile",
    "broadcast_to",
    "sum",
    "mean",
    "var",
    "max",
    "min",
    "argmax",
    "cumsum",
    "outer",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_general",
    "transpose",
    "swapaxes",
    "reshape",
    "expand_dims",
    "squeeze",
    "flatten",
    "pad",
    "arange",
    "triu",
    "tril",
    "gather_mm",
    "quantized_matmul",
)


@dataclasses.dataclass
class _Frame:
    """A wanted module's call open on this thread: its label and its operations so far."""

    label: str
    ops: int = 0


class OpScope:
    """Which module calls have their operations recorded, and the recording itself."""

    def __init__(self, recorder: Recorder, patterns: Iterable[str]) -> None:
        self.recorder = recorder
        self.patterns = list(patterns)
        self._local = threading.local()

    def wanted(self, path: str) -> bool:
        label = module_label(path)
        return any(fnmatch.fnmatchcase(label, p) for p in self.patterns)

    def _frames(self) -> list[_Frame]:
        frames: list[_Frame] | None = getattr(self._local, "frames", None)
        if frames is None:
            frames = self._local.frames = []
        return frames

    def entered(self, path: str) -> bool:
        """A wanted module's call starts; True when it is the outermost one (push the mode)."""
        frames = self._frames()
        frames.append(_Frame(module_label(path)))
        return len(frames) == 1

    def exited(self) -> bool:
        """It ends; True when no wanted call is left open (pop the mode)."""
        frames = self._frames()
        if frames:
            frames.pop()
        return not frames

    def active(self) -> bool:
        """A wanted call is open on this thread, and what runs now is the model's: not the
        recorder's copies, a sensitivity re-run, or mldbg's own work (``own_work``: a
        checkpoint, ``debug_save``, the debugger at a stop, the capture's measurements)."""
        return (
            bool(self._frames())
            and not self.recorder.busy()
            and not measuring()
            and not doing_own_work()
        )

    def record(
        self,
        name: str,
        function: Callable[..., object],
        args: Sequence[object],
        kwargs: Mapping[str, object] | None,
    ) -> object:
        """Run ``function`` as an operation of the innermost wanted call, recorded."""
        frame = self._frames()[-1]
        path = f"{frame.label}:op{frame.ops}.{name}"
        frame.ops += 1
        seq = self.recorder.enter(path, OP_CLASS_PREFIX + name, tuple(args), dict(kwargs or {}))
        try:
            output = function(*args, **(kwargs or {}))
        except BaseException as exc:
            if seq != SKIPPED:
                self.recorder.exit(seq, path, None, exc)
            raise
        if seq != SKIPPED:
            self.recorder.exit(seq, path, output, None)
        return output


# -- torch ---------------------------------------------------------------------------------------


def attach_torch(scope: OpScope, named: list[tuple[str, nn.Module]]) -> Callable[[], None]:
    """Hooks that push a recording ``TorchFunctionMode`` around each wanted module's call."""
    from torch.overrides import TorchFunctionMode

    class _Recording(TorchFunctionMode):
        def __torch_function__(
            self,
            func: Callable[..., object],
            types: Iterable[type],
            args: Sequence[object] = (),
            kwargs: Mapping[str, object] | None = None,
        ) -> object:
            if not scope.active() or not _returns_tensors(func):
                return func(*args, **(kwargs or {}))
            name = _torch_name(func)
            output = scope.record(name, func, args, kwargs)
            if name == "scaled_dot_product_attention":
                for part, tensor in sdpa_parts(args, kwargs or {}):
                    scope.record(f"{name}.{part}", _given(tensor), (), None)
            elif name == "linear":
                unbiased = linear_without_bias(args, kwargs or {})
                if unbiased is not None:
                    scope.record(f"{name}.without_bias", _given(unbiased), (), None)
            return output

    mode = _Recording()
    handles: list[RemovableHandle] = []

    def make_before(path: str) -> Callable[..., None]:
        def before(_module: nn.Module, _args: tuple[object, ...]) -> None:
            if scope.entered(path):
                mode.__enter__()

        return before

    def after(_module: nn.Module, _args: tuple[object, ...], _output: object) -> None:
        if scope.exited():
            mode.__exit__(None, None, None)

    for path, module in named:
        if scope.wanted(path):
            # Registered after the capture's own hooks: the call is open when ops start.
            handles.append(module.register_forward_pre_hook(make_before(path)))
            handles.append(module.register_forward_hook(after, always_call=True))

    def detach() -> None:
        for handle in handles:
            handle.remove()

    return detach


SDPA_PARTS_LIMIT = 1 << 24  # elements of the attention scores above which none is recorded


def sdpa_parts(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """What ``F.scaled_dot_product_attention`` computes on the way, by its definition:
    the keys and values repeated per query head (``enable_gqa``), the scaled scores
    ``q kᵀ · scale`` and the probabilities ``softmax(scores + mask)``.  A port that
    spells attention out (``repeat``, ``softmax``) has these as operations; a reference
    whose fused kernel keeps them inside would give those no counterpart, and an eager
    port's clean ``repeat`` was named as diverging.  Recorded as operations
    ``scaled_dot_product_attention.keys`` / ``.values`` / ``.scores`` / ``.probs`` after
    the call itself (none when the scores would hold more than ``SDPA_PARTS_LIMIT``
    elements, or the arguments are not tensors of at least 2 axes)."""
    import torch

    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in (q, k, v)):
        return []
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
    assert isinstance(v, torch.Tensor)
    length, source = q.shape[-2], k.shape[-2]
    if q.numel() // q.shape[-1] * source > SDPA_PARTS_LIMIT:
        return []
    parts: list[tuple[str, Any]] = []
    with torch.no_grad():
        if q.dim() >= 3 and k.dim() >= 3 and q.shape[-3] != k.shape[-3]:
            if q.shape[-3] % k.shape[-3]:
                return []
            repeat = q.shape[-3] // k.shape[-3]
            k = k.repeat_interleave(repeat, dim=-3)
            v = v.repeat_interleave(repeat, dim=-3)
            parts += [("keys", k), ("values", v)]
        scale = bound.get("scale")
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        parts.append(("scores", scores))
        mask = bound.get("attn_mask")
        if bound.get("is_causal"):
            keep = torch.ones(length, source, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        if isinstance(mask, torch.Tensor):
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, float("-inf"))
            else:
                scores = scores + mask
        parts.append(("probs", torch.softmax(scores, dim=-1)))
    return parts


def linear_without_bias(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """``F.linear(x, W)`` of a biased ``F.linear(x, W, b)`` call (None without a bias): a
    port that adds its bias apart (MLX's quantized Linear: ``mx.quantized_matmul``, then
    ``+ bias``, an operator that is not recorded) has this as an operation."""
    import torch

    names = ("input", "weight", "bias")
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    x, weight, bias = bound.get("input"), bound.get("weight"), bound.get("bias")
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return None
    if not isinstance(bias, torch.Tensor):
        return None
    with torch.no_grad():
        return torch.nn.functional.linear(x, weight)


def _given(tensor: object) -> Callable[[], object]:
    return lambda: tensor


_NOT_OPS = {"__get__", "__set__", "dim", "size", "numel", "is_floating_point", "__len__"}


def _returns_tensors(func: object) -> bool:
    name = getattr(func, "__name__", "")
    return name not in _NOT_OPS and not name.startswith("_has_")


def _torch_name(func: object) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    return str(name).strip("_") or "op"


# -- MLX -------------------------------------------------------------------------------------------


def attach_mlx(scope: OpScope, named: list[tuple[str, mnn.Module]]) -> Callable[[], None]:
    """Wrap ``mx.*``/``mx.fast.*`` functions, and mark each wanted module's calls (a class
    layer over the one the capture put on the instance)."""
    import mlx.core as mx

    patched: list[tuple[ModuleType, str, object]] = []

    def wrap(namespace: ModuleType, attribute: str, label: str) -> None:
        original = getattr(namespace, attribute, None)
        if original is None or not callable(original) or isinstance(original, type):
            return

        def recorded(*args: object, **kwargs: object) -> object:
            if not scope.active():
                return original(*args, **kwargs)
            return scope.record(label, original, args, kwargs)

        recorded.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(namespace, attribute, recorded)
        patched.append((namespace, attribute, original))

    for name in MLX_OPS:
        wrap(mx, name, name)
    for name in dir(mx.fast):
        if not name.startswith("_"):
            wrap(mx.fast, name, f"fast.{name}")

    swapped: list[tuple[mnn.Module, type]] = []
    for path, module in named:
        if not scope.wanted(path):
            continue
        found = type(module)
        module.__class__ = _marking_class(found, scope, path)
        swapped.append((module, found))

    def detach() -> None:
        for namespace, attribute, original in reversed(patched):
            setattr(namespace, attribute, original)
        for module, found in reversed(swapped):
            if type(module).__bases__[0] is found:
                module.__class__ = found

    return detach


def _marking_class(found: type, scope: OpScope, path: str) -> type:
    call = found.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        scope.entered(path)
        try:
            return call(self, *args, **kwargs)
        finally:
            scope.exited()

    return type(
        found.__name__,
        (found,),
        {
            "__call__": __call__,
            "__module__": found.__module__,
            "__qualname__": found.__qualname__,
            "_mldbg_capture_layer": _DeadLayer(),  # zero-edit never wraps this class
        },
    )


class _DeadLayer:
    live = True
