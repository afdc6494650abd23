"""The non-finite tripwire: stop in the first module call whose output goes bad.

A NaN, an infinity or the denormal garbage of an out-of-bounds read (``1.58e-43``) is the
classic porting bug, and it is found by hand hours after it appeared, many modules
downstream.  ``break --nonfinite`` (optionally ``--max-abs X``, ``--subnormal``) checks the
tensors every module call returns and stops the script in the frame that made the call,
live, with the module's path named, at the call where the values first go bad:

* a call whose tensor inputs were already bad is a victim and does not stop;
* a call inside which a submodule already tripped does not stop either (the parent's
  output is bad because its child's was): the deepest call where it appears is named.

PyTorch: global forward hooks (``torch.nn.modules.module.register_module_forward_*``).
MLX, whose modules have no hooks: the ``__call__`` of every ``mlx.nn.Module`` subclass is
wrapped while the tripwire is set (classes defined later too), and restored when it is
removed.  MLX outputs are evaluated to be checked (the tripwire costs MLX its laziness
while set), and tracers inside ``mx.compile`` cannot be checked: they are passed over.

The garbage of an out-of-bounds read is not always subnormal, and a read inline in the
script is no module's output: MLX, which does not check indices, has its indexing checked
too while the tripwire is set (``bounds.py``), stopping before an out-of-range read.

Standard library only, like the rest of the agent: a framework is touched only once the
script has imported it (``sys.modules``); an import watcher arms it when that happens.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, TypeVar

from ..own_work import own_work
from .bounds import IndexGuard, OutOfRange
from .paths import canonical_code_file, is_mldbg_file

if TYPE_CHECKING:
    from typing import Unpack

    from .breakpoints import Tripwire
    from .paused import StopDetails


class Stopper(Protocol):
    """What the tripwire needs of the debugger (``debugger.Debugger``): the threads inside
    the debugger itself (never checked), and a stop."""

    _busy: set[int]

    def stop(
        self,
        frame: FrameType,
        reason: str,
        all_threads: bool = True,
        **details: Unpack[StopDetails],
    ) -> None: ...


MAX_TENSORS = 64  # tensors checked in one call's inputs or outputs
MAX_DEPTH = 4  # nesting of tuples, lists and dicts walked into
_TORCH_CALL_FILE = os.path.join("torch", "nn", "modules", "module.py")
_DYNAMO_DIR = os.sep + os.path.join("torch", "_dynamo") + os.sep  # torch.compile's wrappers


class Found(TypedDict, total=False):
    """One bad tensor of a call: where it sits in the inputs or outputs, and what is wrong."""

    name: str  # "out.0.hidden": walked into tuples, lists and dicts
    shape: list[int]
    dtype: str
    nan: int
    inf: int
    above_max_abs: int
    subnormal: int
    # an index out of range (kind "out_of_bounds"): the index, its axis (None: into the
    # flattened array) and the axis' size; shape and dtype are the indexed array's
    index: int
    axis: int | None
    size: int


class _Removable(Protocol):
    """A torch hook's handle."""

    def remove(self) -> None: ...


_Hook = TypeVar("_Hook", bound=Callable[..., object])


@dataclass
class _Call:
    module: object
    bad_inputs: bool
    tripped_inside: bool = False


@dataclass
class Tripped:
    """The call that tripped: ``mldbg.tripped()`` in ``eval`` returns it."""

    path: str
    module: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any
    found: list[Found] = field(default_factory=list)


_last: Tripped | None = None


def tripped() -> Tripped | None:
    """The last module call the tripwire stopped in (module, args, kwargs, output), or None."""
    return _last


class Wire:
    """The installed hooks for one debugger; ``arm(rule)`` / ``arm(None)`` switch them."""

    def __init__(self, debugger: Stopper) -> None:
        self.debugger = debugger
        self.rule: Tripwire | None = None
        self._local = threading.local()
        self._torch_handles: list[_Removable] = []
        self._mlx_originals: dict[type, Callable[..., object]] = {}  # class -> its own __call__
        # (mlx.nn.Module, its own __init_subclass__ or None) while classes defined later are
        # wrapped too
        self._mlx_subclass_hook: tuple[type, object] | None = None
        self._paths: dict[int, tuple[object, dict[int, str]]] = {}  # root id -> (root, paths)
        # MLX indices out of range, checked before the read (bounds.py)
        self._bounds = IndexGuard(self._out_of_range, self._quiet)

    # -- arming -----------------------------------------------------------------------------

    def arm(self, rule: Tripwire | None) -> None:
        self.rule = rule
        if rule is None:
            self._uninstall()
        else:
            self.install_available()

    def frameworks_missing(self) -> list[str]:
        """Modules whose import should arm the tripwire (for the import watcher)."""
        if self.rule is None:
            return []
        missing = []
        if not self._torch_handles:
            missing.append("torch.nn.modules.module")
        if self._mlx_subclass_hook is None:
            missing.append("mlx.nn.layers.base")
        if not self._bounds.installed:
            missing.append("mlx.core")
        return missing

    def install_available(self) -> None:
        """Hook every framework the script has imported by now."""
        if self.rule is None:
            return
        # a module still being imported lacks what comes later in it: wait for the next try
        torch_module = sys.modules.get("torch.nn.modules.module")
        if (
            not self._torch_handles
            and torch_module is not None
            and hasattr(torch_module, "register_module_forward_hook")
        ):
            self._install_torch(torch_module)
        base = sys.modules.get("mlx.nn.layers.base")
        if self._mlx_subclass_hook is None and base is not None and hasattr(base, "Module"):
            self._install_mlx(base)
        mx = sys.modules.get("mlx.core")
        if not self._bounds.installed and mx is not None and hasattr(mx, "array"):
            self._bounds.install(mx)

    def _install_torch(self, module_py: ModuleType) -> None:
        torch = sys.modules.get("torch")
        pre = module_py.register_module_forward_pre_hook(_eager(torch, self._torch_pre))
        try:
            post = module_py.register_module_forward_hook(
                _eager(torch, self._torch_post), with_kwargs=True, always_call=True
            )
        except TypeError:  # an older torch: no with_kwargs / always_call
            post = module_py.register_module_forward_hook(
                lambda module, args, output: self._torch_post(module, args, {}, output)
            )
        self._torch_handles = [pre, post]

    def _install_mlx(self, nn: ModuleType) -> None:
        base = nn.Module
        for cls in _subclasses(base):
            self._wrap_mlx_class(cls)
        wire = self
        original = base.__dict__.get("__init_subclass__")

        def __init_subclass__(cls: type, **kwargs: object) -> None:
            if original is not None:
                original.__func__(cls, **kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
            if wire.rule is not None:
                wire._wrap_mlx_class(cls)

        base.__init_subclass__ = classmethod(__init_subclass__)
        self._mlx_subclass_hook = (base, original)

    def _wrap_mlx_class(self, cls: type) -> None:
        call = cls.__dict__.get("__call__")
        if call is None or cls in self._mlx_originals or getattr(call, "_mldbg_tripwire", False):
            return
        wire = self

        @functools.wraps(call)
        def __call__(module: object, *args: object, **kwargs: object) -> object:
            token = wire._before(module, args, kwargs, "mlx")
            try:
                output = call(module, *args, **kwargs)
            except BaseException:
                wire._abandon(token)
                raise
            wire._after(token, module, args, kwargs, output, "mlx")
            return output

        __call__._mldbg_tripwire = True  # type: ignore[attr-defined]
        self._mlx_originals[cls] = call
        with contextlib.suppress(AttributeError, TypeError):
            type.__setattr__(cls, "__call__", __call__)

    def _uninstall(self) -> None:
        self._bounds.uninstall()
        for handle in self._torch_handles:
            with contextlib.suppress(Exception):
                handle.remove()
        self._torch_handles = []
        for cls, call in self._mlx_originals.items():
            with contextlib.suppress(AttributeError, TypeError):
                type.__setattr__(cls, "__call__", call)
        self._mlx_originals = {}
        if self._mlx_subclass_hook is not None:
            base, original = self._mlx_subclass_hook
            with contextlib.suppress(AttributeError, TypeError):
                if original is None:
                    delattr(base, "__init_subclass__")
                else:
                    # (as ``base.__init_subclass__ = original``, which the type checker
                    # reads as assigning to a method)
                    setattr(base, "__init_subclass__", original)  # noqa: B010
            self._mlx_subclass_hook = None
        self._paths.clear()

    # -- one module call --------------------------------------------------------------------

    def _stack(self) -> list[_Call]:
        stack: list[_Call] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _quiet(self) -> bool:
        """Calls made by the debugger itself (an eval at a stop) are never checked."""
        return self.rule is None or threading.get_ident() in self.debugger._busy

    def _before(
        self,
        module: object,
        args: tuple[object, ...],
        kwargs: Mapping[str, object],
        framework: str,
    ) -> _Call | None:
        if self._quiet():
            return None
        stack = self._stack()
        if not stack:
            self._remember_root(module)
        # inside a call that received bad values, everything is downstream of them
        bad = bool(stack and stack[-1].bad_inputs) or bool(
            _check((args, kwargs), self.rule, framework, "in")
        )
        call = _Call(module, bad)
        stack.append(call)
        return call

    def _abandon(self, token: _Call | None) -> None:
        if token is None:
            return
        stack = self._stack()
        if stack and stack[-1] is token:
            stack.pop()

    def _after(
        self,
        token: _Call | None,
        module: object,
        args: tuple[object, ...],
        kwargs: Mapping[str, object],
        output: object,
        framework: str,
    ) -> None:
        if token is None:
            return
        stack = self._stack()
        if not stack or stack[-1] is not token:
            return
        stack.pop()
        if not token.bad_inputs and kwargs and framework == "torch":
            # torch's global pre-hook sees positional arguments only: keywords are checked
            # here (a module handed hidden_states=NaN is a victim, not an origin)
            token.bad_inputs = bool(_check(kwargs, self.rule, framework, "in"))
        if token.bad_inputs or token.tripped_inside or self.rule is None:
            if token.tripped_inside and stack:
                stack[-1].tripped_inside = True
            return
        found = _check(output, self.rule, framework, "out")
        if not found:
            return
        if stack:
            stack[-1].tripped_inside = True
        self._trip(module, args, kwargs, output, found, framework)

    def _trip(
        self,
        module: object,
        args: tuple[object, ...],
        kwargs: Mapping[str, object],
        output: object,
        found: list[Found],
        framework: str,
    ) -> None:
        global _last
        rule = self.rule
        frame = _caller_frame()
        if rule is None or frame is None:
            return
        rule.hit_count += 1
        path = self._path_of(module)
        _last = Tripped(path, module, tuple(args), dict(kwargs or {}), output, found)
        details = {
            "id": rule.id,
            "kind": "module_output",
            "module": path,
            "class": type(module).__name__,
            "framework": framework,
            "rule": rule.describe(),
            "found": found,
            "hit_count": rule.hit_count,
        }
        note = (
            f"{path} ({type(module).__name__}) returned {_what(found)} from finite inputs; "
            "stopped in the frame that called it. In eval, `import mldbg; mldbg.tripped()` "
            "has the module (.module), its inputs (.args, .kwargs) and its output (.output)"
        )
        self.debugger.stop(frame, "tripwire", tripwire=details, note=note)

    def _out_of_range(self, array: object, index: object, problem: OutOfRange) -> None:
        """An MLX index out of range: stop where the script reads (or writes) with it,
        before MLX does; every such read stops, whatever values it would return."""
        global _last
        rule = self.rule
        frame = _caller_frame()
        if rule is None or frame is None:
            return
        rule.hit_count += 1
        found: Found = {
            "name": "index",
            "shape": list(problem.shape),
            "dtype": problem.dtype,
            "index": problem.index,
            "axis": problem.axis,
            "size": problem.size,
        }
        _last = Tripped(problem.operation, None, (array, index), {}, None, [found])
        details = {
            "id": rule.id,
            "kind": "out_of_bounds",
            "operation": problem.operation,
            "framework": "mlx",
            "rule": rule.describe(),
            "found": [found],
            "hit_count": rule.hit_count,
        }
        where = "the flattened array" if problem.axis is None else f"axis {problem.axis}"
        writes = problem.operation.endswith("=") or problem.operation.startswith("mx.put")
        note = (
            f"{problem.operation}: index {problem.index} is out of range for {where} "
            f"(size {problem.size}) of a {problem.dtype}{list(problem.shape)} array. MLX does "
            f"not check indices: this {'write would corrupt memory' if writes else 'read would return whatever memory holds'}. "
            "Stopped before it runs; in eval, `import mldbg; mldbg.tripped().args` has the "
            "array and the index"
        )
        self.debugger.stop(frame, "tripwire", tripwire=details, note=note)

    def _torch_pre(self, module: object, args: tuple[object, ...]) -> None:
        if _compiling():
            return
        self._torch_token(module).append(self._before(module, args, {}, "torch"))

    def _torch_post(
        self,
        module: object,
        args: tuple[object, ...],
        kwargs: Mapping[str, object],
        output: object,
    ) -> None:
        if _compiling():
            return
        tokens = self._torch_token(module)
        token = tokens.pop() if tokens else None
        self._after(token, module, args, kwargs, output, "torch")

    def _torch_token(self, module: object) -> list[_Call | None]:
        tokens: dict[int, list[_Call | None]] | None = getattr(self._local, "tokens", None)
        if tokens is None:
            tokens = self._local.tokens = {}
        return tokens.setdefault(id(module), [])

    # -- module paths -----------------------------------------------------------------------

    def _remember_root(self, root: Any) -> None:  # a torch or MLX module
        if id(root) in self._paths:
            return
        paths: dict[int, str] = {}
        with contextlib.suppress(Exception):
            for name, sub in root.named_modules():
                paths.setdefault(id(sub), name or "<root>")
        if len(self._paths) > 64:  # roots come and go (a new model per step): keep few
            self._paths.clear()
        self._paths[id(root)] = (root, paths)

    def _path_of(self, module: object) -> str:
        for _root, paths in self._paths.values():
            if id(module) in paths:
                return paths[id(module)]
        return f"<{type(module).__name__}>"


def _compiling() -> bool:
    """Inside a graph torch.compile is tracing: no values to check (passed over)."""
    torch = sys.modules.get("torch")
    check = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(check is not None and check())


def _eager(torch: ModuleType | None, hook: _Hook) -> _Hook:
    """The hook run eagerly under ``torch.compile`` (a graph break), never traced: it reads
    values and may stop the script, which a traced graph cannot do."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is None:
        return hook
    try:
        return disable(hook)
    except Exception:  # a torch whose disable cannot wrap a bound method: plain hook
        return hook


def _subclasses(base: type) -> list[type]:
    seen: list[type] = []
    todo = [base]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        with contextlib.suppress(TypeError):
            todo.extend(cls.__subclasses__())
    return seen


def _caller_frame() -> FrameType | None:
    """The frame that called the module: past the agent and torch's call machinery."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        file = canonical_code_file(frame.f_code.co_filename)
        machinery = file.endswith(_TORCH_CALL_FILE) or _DYNAMO_DIR in file
        if not is_mldbg_file(file) and not machinery:
            return frame
        frame = frame.f_back
    return None


def _what(found: list[Found]) -> str:
    kinds = []
    for key, text in (("nan", "NaN"), ("inf", "Inf"), ("above_max_abs", "|x| > max_abs")):
        if any(item.get(key) for item in found):
            kinds.append(text)
    if any(item.get("subnormal") for item in found):
        kinds.append("subnormal values")
    return " and ".join(kinds) or "bad values"


# -- checking values --------------------------------------------------------------------------


def _check(value: object, rule: Tripwire | None, framework: str, prefix: str) -> list[Found]:
    """Every tensor in ``value`` (walked into tuples, lists, dicts) that breaks ``rule``."""
    if rule is None:
        return []
    with own_work():  # its checks are not the model's operations
        return _checked(value, rule, framework, prefix)


def _checked(value: object, rule: Tripwire, framework: str, prefix: str) -> list[Found]:
    found: list[Found] = []
    count = 0
    for name, tensor in _tensors(value, prefix, 0):
        count += 1
        if count > MAX_TENSORS:
            break
        try:
            item = _torch_check(tensor, rule) if framework == "torch" else _mlx_check(tensor, rule)
        except Exception:  # a tracer, a meta tensor, an exotic dtype: not checkable
            continue
        if item:
            found.append({"name": name, **item})
    return found


def _tensors(value: object, name: str, depth: int) -> Iterator[tuple[str, object]]:
    if _is_tensor(value):
        yield name, value
        return
    if depth >= MAX_DEPTH:
        return
    if isinstance(value, dict) or hasattr(value, "items") and callable(value.items):
        with contextlib.suppress(Exception):
            for key, item in list(value.items()):
                yield from _tensors(item, f"{name}.{key}", depth + 1)
        return
    if isinstance(value, tuple | list):
        for index, item in enumerate(value):
            yield from _tensors(item, f"{name}.{index}", depth + 1)


def _is_tensor(value: object) -> bool:
    module = type(value).__module__ or ""
    return (module.startswith("torch") and hasattr(value, "is_floating_point")) or (
        module.startswith("mlx") and type(value).__name__ == "array"
    )


def _torch_check(t: Any, rule: Tripwire) -> Found | None:
    torch = sys.modules["torch"]
    if _is_tensor(t) and type(t).__module__.startswith("mlx"):
        return None
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0 or t.device.type == "meta":
        return None
    with torch.no_grad():
        data = t.detach()
        if data.is_complex():
            data = torch.view_as_real(data)
        finite = torch.isfinite(data)
        all_finite = bool(finite.all())
        item: Found = {}
        if rule.nonfinite and not all_finite:
            nan = int(torch.isnan(data).sum())
            item["nan"], item["inf"] = nan, int((~finite).sum()) - nan
        magnitude = data.abs()
        if rule.max_abs is not None:
            over = int(((magnitude > rule.max_abs) & finite).sum())
            if over:
                item["above_max_abs"] = over
        if rule.subnormal:
            tiny = torch.finfo(data.dtype).tiny
            count = int(((magnitude < tiny) & (data != 0)).sum())
            if count:
                item["subnormal"] = count
    if not item:
        return None
    return {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), **item}


def _mlx_check(a: Any, rule: Tripwire) -> Found | None:
    mx = sys.modules["mlx.core"]
    if not mx.issubdtype(a.dtype, mx.inexact) or a.size == 0:
        return None
    data = mx.abs(a) if mx.issubdtype(a.dtype, mx.complexfloating) else a
    nan, inf = mx.isnan(data).sum(), mx.isinf(data).sum()
    checks = [nan, inf]
    magnitude = mx.abs(data)
    if rule.max_abs is not None:
        checks.append((mx.isfinite(data) & (magnitude > rule.max_abs)).sum())
    if rule.subnormal:
        tiny = mx.finfo(data.dtype).smallest_normal
        checks.append(((magnitude < tiny) & (data != 0)).sum())
    mx.eval(*checks)  # raises inside mx.compile: the caller passes the tensor over
    values = [int(c.item()) for c in checks]
    item: Found = {}
    if rule.nonfinite and (values[0] or values[1]):
        item["nan"], item["inf"] = values[0], values[1]
    index = 2
    if rule.max_abs is not None:
        if values[index]:
            item["above_max_abs"] = values[index]
        index += 1
    if rule.subnormal and values[index]:
        item["subnormal"] = values[index]
    if not item:
        return None
    return {"shape": list(a.shape), "dtype": str(a.dtype).removeprefix("mlx.core."), **item}
