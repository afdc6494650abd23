"""``mldbg.replay``: each port module on the reference's own inputs, one call at a time.

A propagated comparison mixes two things at every module: what the module itself does
differently, and the drift it received from upstream.  Replay separates them (PaDiff's
single-step idea, across frameworks): the port model runs once, on the reference's
root inputs, and at the start of every module call its tensor arguments are swapped
for the reference's captured inputs of the same call (converted to the port's
framework, dtype and layout; arguments that are not tensors, such as mlx-lm's
``mask="causal"``, keep the port's own values), the module is called alone on them
(its submodules unhooked), and its outputs are written to a capture named like the
reference.  Comparing that capture with the reference gives each module's *local*
error; the culprit is the deepest call whose local error is out of bounds.

Pairing the port's arguments with the reference's follows compare's rules: the same
key, a tuple's first element, then the same shape in order (``x`` positionally vs
``hidden_states=``), a channels-last permutation allowed.  A module that cannot be
called on the reference's inputs (a signature mismatch, shapes it rejects) is listed
with the reason, never raised.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import NO_INPUTS, NO_ROOT_INPUTS, NOT_A_CAPTURE
from .pair.mapping import NameMap, load_map, parse_map, split_name
from .read.sources import CompareInputError, Entry, Source
from .records import LocalCall

MAX_SKIPPED = 200  # skipped calls listed in the result (all are counted)


@dataclass
class ReplayResult:
    """What :func:`replay` did: ``capture`` is the replayed capture's name (pass it to
    ``mldbg.compare(a, b, replay=...)`` or ``mldbg compare A B --replay NAME``),
    ``culprit`` the deepest module whose own local error is out of bounds (or None),
    ``entries`` the local error per compared output, ``result`` all of it as JSON."""

    capture: str
    path: str
    result: dict[str, Any]
    entries: list[LocalCall] = field(default_factory=list)

    @property
    def culprit(self) -> str | None:
        found = self.result.get("culprit")
        return found["module"] if found else None

    @property
    def ok(self) -> bool:
        return bool(self.result.get("ok"))

    def __repr__(self) -> str:
        return (
            f"<mldbg replay {self.capture!r}: {len(self.entries)} outputs, "
            f"culprit {self.culprit or 'none'}>"
        )


class _State(threading.local):
    replaying = False


def replay(
    port_model: Any,
    ref: Any,
    *,
    name: str | None = None,
    map: str | os.PathLike[str] | Mapping[str, Any] | None = None,  # noqa: A002
    layout: str | None = None,
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    home: str | os.PathLike[str] | None = None,
    root_call: tuple[tuple[Any, ...], Mapping[str, Any]] | None = None,
) -> ReplayResult:
    """Run every module of ``port_model`` on the reference capture ``ref``'s inputs.

    ``root_call`` is ``(args, kwargs)`` as the port's own code calls its root (zero-edit
    replay passes the script's first call): the reference's root inputs replace its
    tensors, paired as at every module call (the same key, then the same shape in
    order), so a port whose root takes ``(latents, text, pooled, sigma, ...)`` replays a
    reference called with ``hidden_states=``, ``encoder_hidden_states=``...  Without
    it, the root's arguments are built from the reference's by name and position.

    ``ref`` is any source :func:`mldbg.compare` accepts that holds a capture with inputs;
    ``map`` maps the port's names onto the reference's (as for compare); ``layout`` is
    the port's activation layout when shapes cannot tell (``NCHW``, ``NHWC``, ``auto``).
    The replayed outputs are written to the capture ``name`` (default ``<ref>-replay``)
    of the current run, under the reference's module names.
    """
    from pathlib import Path

    from ..capture import Capture, framework_of
    from ..capture.recorder import Recorder
    from ..capture.store import CaptureDir, check_capture_name
    from ..store.current_run import current_run
    from ..store.runs import mldbg_home
    from .comparison import local_errors
    from .pair.layout import check_layout
    from .read.sources import open_source

    mode = check_layout(layout)
    base = Path(home) if home is not None else mldbg_home()
    spec = getattr(ref, "path", None)
    spec = str(spec) if spec is not None and not isinstance(ref, str | os.PathLike) else str(ref)
    source = open_source(spec, base)
    if not source.calls:
        raise CompareInputError(
            f"{source.label} is not a capture of module calls: replay needs one made with "
            "mldbg.capture(model, NAME) (inputs included)",
            code=NOT_A_CAPTURE,
        )
    if not any(e.role == "in" for e in source.entries):
        raise CompareInputError(
            f"{source.label} was captured without inputs (inputs=False): nothing to replay",
            code=NO_INPUTS,
        )
    names = parse_map(dict(map), "map") if isinstance(map, Mapping) else load_map(map)
    framework = framework_of(port_model)
    ref_name = str(source.meta.get("name") or Path(spec).name)
    target_name = check_capture_name(name or f"{ref_name}-replay"[:100])
    selector = Capture(port_model, target_name, include=include, exclude=exclude)
    backend = selector._backend()
    model = backend.prepare(port_model)
    directory = CaptureDir(
        current_run(),
        target_name,
        {
            "framework": framework,
            "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
            "inputs": True,
            "replay_of": str(source.path),
            "modules": [
                names.to_a(f"{p or '<root>'}#0.out").split("#", 1)[0]
                for p, _ in backend.named_modules(model)
            ],
        },
    )
    recorder = Recorder(directory, backend.save, True)
    player = _Player(source, names, framework, mode, recorder)
    started = time.perf_counter()
    error: str | None = None
    try:
        args, kwargs = (
            player.root_inputs(model) if root_call is None else player.root_inputs_like(*root_call)
        )
        detach = _attach(framework, model, backend, selector.keeps, player)
        try:
            player.run_root(model, args, kwargs)
        finally:
            detach()
    except CompareInputError:
        directory.finish("failed", error="no root inputs")
        raise
    except Exception as exc:  # the port's own forward failed: keep what was replayed
        error = f"{type(exc).__name__}: {exc}"
    state = "failed" if error else "incomplete" if recorder.error_count else "complete"
    directory.finish(
        state,
        records=recorder.records,
        tensors=recorder.tensors,
        bytes=recorder.bytes,
        seconds=round(time.perf_counter() - started, 3),
        **({"error": error} if error else {}),
    )
    replayed = open_source(str(directory.path), base)
    local = local_errors(source, replayed, layout=mode)
    entries = local["list"]
    failed = sum(1 for e in entries if not e["ok"])
    result = {
        "ok": failed == 0 and not error,
        "capture": directory.name,
        "path": str(directory.path),
        "reference": source.describe(),
        "culprit": local["culprit"],
        "boundary_differences": local["boundaries"],
        "entries": entries,
        "skipped": player.skipped[:MAX_SKIPPED],
        "error": error,
        "counts": {
            "replayed": player.replayed,
            "compared": len(entries),
            "failed": failed,
            "skipped": len(player.skipped),
        },
    }
    return ReplayResult(directory.name, str(directory.path), result, entries)


def _attach(
    framework: str, model: Any, backend: Any, keep: Callable[[str], bool], player: _Player
) -> Callable[[], None]:
    if framework == "torch":
        handles = []
        for path, module in backend.named_modules(model):
            if keep(path):
                handles.append(
                    module.register_forward_pre_hook(player.torch_hook(path), with_kwargs=True)
                )

        def detach() -> None:
            for handle in handles:
                handle.remove()

        return detach
    swapped: list[tuple[Any, type]] = []
    classes: dict[type, type] = {}
    for path, module in backend.named_modules(model):
        if not keep(path):
            continue
        found = type(module)
        if found not in classes:
            classes[found] = player.mlx_class(found)
        player.paths[id(module)] = path
        module.__class__ = classes[found]
        swapped.append((module, found))

    def restore() -> None:
        for module, found in reversed(swapped):
            module.__class__ = found

    return restore


class _Player:
    """Swaps inputs, calls modules alone, records their outputs."""

    def __init__(
        self, source: Source, names: NameMap, framework: str, layout: str, recorder: Any
    ) -> None:
        self.source = source
        self.names = names
        self.framework = framework
        self.layout = layout
        self.recorder = recorder
        self.state = _State()
        self.counts: dict[str, int] = {}
        self.paths: dict[int, str] = {}
        self.skipped: list[dict[str, Any]] = []
        self.replayed = 0
        self.channels_last = False
        self.inputs: dict[tuple[str, int], list[Entry]] = {}
        for entry in source.entries:
            if entry.role == "in" and entry.call_key is not None:
                self.inputs.setdefault(entry.call_key, []).append(entry)

    # -- the root call ---------------------------------------------------------------

    def root_inputs(self, model: Any) -> tuple[list[Any], dict[str, Any]]:
        """The reference's root inputs, as the port's root takes them."""
        import inspect

        entries = self.inputs.get(("<root>", 0), [])
        if not entries:
            raise CompareInputError(
                f"{self.source.label} holds no inputs of the model itself (<root>#0.in…): "
                "capture the whole model to replay it",
                code=NO_ROOT_INPUTS,
            )
        forward = model.forward if self.framework == "torch" else model.__call__
        try:
            params = [
                p
                for p in inspect.signature(forward).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            ]
        except (TypeError, ValueError):
            params = []
        by_name = {p.name: p for p in params}
        dtype = self._model_dtype(model)
        positional: list[tuple[int, Any]] = []
        by_order: list[Any] = []
        kwargs: dict[str, Any] = {}
        # A capture file lists its tensors by dtype, then name (safetensors' order): the
        # positions come from the names (a bf16 model's float32 position ids are ``in.4``).
        for entry in entries:
            key = entry.name.split("#0.", 1)[1]  # in.0, in.input_ids
            parts = key.split(".")
            if len(parts) != 2:
                continue  # nested root inputs are not rebuilt
            value = self._convert(entry, None, dtype)
            if self._root_channels_last(entry):
                value = self._to_channels_last(value)
            if parts[1].isdigit():
                positional.append((int(parts[1]), value))
            elif (
                parts[1] in by_name and by_name[parts[1]].kind != by_name[parts[1]].POSITIONAL_ONLY
            ):
                kwargs[parts[1]] = value
            else:
                by_order.append(value)  # a keyword the port calls otherwise: by order
        args = [value for _, value in sorted(positional, key=lambda p: p[0])] + by_order
        return args, kwargs

    def root_inputs_like(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The port's own root arguments with the reference's root inputs in place of
        its tensors, paired as for every module call (see :meth:`_pair`)."""
        from ..capture.flatten import flatten_call

        entries = self.inputs.get(("<root>", 0), [])
        if not entries:
            self.root_inputs(None)  # raises, saying so
        replacements = self._pair(entries, flatten_call(args, kwargs).pairs, "<root>", 0)
        if replacements is None:
            raise CompareInputError(
                f"none of the port's root arguments pairs with {self.source.label}'s root "
                "inputs (<root>#0.in…) by name or shape",
                code=NO_ROOT_INPUTS,
            )
        new_args = _substitute(tuple(args), "in", replacements)
        new_kwargs = {k: _substitute(v, f"in.{k}", replacements) for k, v in kwargs.items()}
        return list(new_args), new_kwargs

    def _root_channels_last(self, entry: Entry) -> bool:
        """An image or volume given to an MLX port of a PyTorch model goes in NHWC (MLX
        convolutions are channels-last); ``layout="NCHW"`` says the port takes NCHW."""
        if len(entry.shape) not in (4, 5) or self.layout == "NCHW":
            return False
        if entry.dtype.startswith(("I", "U", "BOOL")):
            return False
        if self.layout == "NHWC":
            return True
        return self.framework == "mlx" and self.source.meta.get("framework") == "torch"

    def _to_channels_last(self, value: Any) -> Any:
        ndim = len(value.shape)
        axes = (0, *range(2, ndim), 1)
        self.channels_last = True
        if self.framework == "torch":
            return value.permute(*axes).contiguous()
        import mlx.core as mx

        return (
            mx.contiguous(value.transpose(axes))
            if hasattr(mx, "contiguous")
            else (value.transpose(axes))
        )

    def _model_dtype(self, model: Any) -> Any:
        try:
            if self.framework == "torch":
                return next(iter(model.parameters())).dtype
            from mlx.utils import tree_flatten

            leaves: Any = tree_flatten(model.parameters())
            return leaves[0][1].dtype if leaves else None
        except Exception:
            return None

    def run_root(self, model: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
        if self.framework == "torch":
            import torch

            with torch.no_grad():
                model(*args, **kwargs)
            return
        import mlx.core as mx

        mx.eval(model(*args, **kwargs))

    # -- hooks -----------------------------------------------------------------------

    def torch_hook(self, path: str) -> Callable[..., None]:
        def before(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not self.state.replaying:
                self.play(path, module, args, kwargs, lambda a, k: module(*a, **k))

        return before

    def mlx_class(self, original: type) -> type:
        call = original.__call__
        player = self

        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            path = player.paths.get(id(module))
            if path is not None and not player.state.replaying:
                player.play(path, module, args, kwargs, lambda a, k: call(module, *a, **k))
            return call(module, *args, **kwargs)

        return type(
            original.__name__,
            (original,),
            {
                "__call__": __call__,
                "__module__": original.__module__,
                "__qualname__": original.__qualname__,
            },
        )

    # -- one call ----------------------------------------------------------------------

    def play(
        self,
        path: str,
        module: Any,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        call: Callable[[tuple[Any, ...], dict[str, Any]], Any],
    ) -> None:
        from ..capture.flatten import flatten_call
        from ..capture.mlx_wrappers import quantization
        from ..capture.store import module_label

        index = self.counts.get(path, 0)
        self.counts[path] = index + 1
        label = module_label(path)
        mapped = split_name(self.names.to_a(f"{label}#{index}.out"))
        ref_module, ref_call = (mapped[0], mapped[1]) if mapped else (label, index)
        if (ref_module, ref_call) not in self.source.calls:
            self._skip(ref_module, ref_call, "the reference has no such call")
            return
        ref_inputs = self.inputs.get((ref_module, ref_call), [])
        if not ref_inputs:
            self._skip(ref_module, ref_call, "the reference recorded no tensor inputs for it")
            return
        flat = flatten_call(args, kwargs)
        replacements = self._pair(ref_inputs, flat.pairs, ref_module, ref_call)
        if replacements is None:
            return
        new_args = _substitute(tuple(args), "in", replacements)
        new_kwargs = {k: _substitute(v, f"in.{k}", replacements) for k, v in dict(kwargs).items()}
        quant = quantization(module) if self.framework == "mlx" else None
        seq = self.recorder.enter(
            ref_module,
            type(module).__name__,
            new_args,
            new_kwargs,
            {"quant": quant, "port_module": label} if quant else {"port_module": label},
        )
        output: Any = None
        failure: BaseException | None = None
        self.state.replaying = True
        try:
            with self._no_grad():
                output = call(new_args, new_kwargs)
                if self.framework == "mlx":
                    import mlx.core as mx

                    mx.eval(output)
        except Exception as exc:
            failure = exc
            self._skip(
                ref_module,
                ref_call,
                f"cannot be called on the reference's inputs: {type(exc).__name__}: {exc}"[:500],
            )
        finally:
            self.state.replaying = False
        self.recorder.exit(seq, ref_module, output, failure)
        if failure is None:
            self.replayed += 1

    def _no_grad(self) -> Any:
        if self.framework == "torch":
            import torch

            return torch.no_grad()
        return contextlib.nullcontext()

    def _skip(self, module: str, call: int, reason: str) -> None:
        self.skipped.append({"module": module, "call": call, "reason": reason})

    def _pair(
        self, ref_inputs: list[Entry], port: list[tuple[str, Any]], module: str, call: int
    ) -> dict[str, Any] | None:
        """``{port key: converted reference tensor}``; None (and a skip) when nothing pairs."""
        from .pair.transposes import layout_permutation

        ref_by_key = {e.name.split(f"#{call}.", 1)[1]: e for e in ref_inputs}
        port_by_key = dict(port)
        matched: dict[str, Entry] = {}
        for key in port_by_key:
            if key in ref_by_key:
                matched[key] = ref_by_key[key]
        for x, y in (("in.0", "in.0.0"), ("in.0.0", "in.0")):
            if x in port_by_key and x not in matched and y in ref_by_key:
                matched[x] = ref_by_key[y]
        used = {id(e) for e in matched.values()}
        for key, tensor in port:
            if key in matched:
                continue
            shape = tuple(int(n) for n in tensor.shape)
            for entry in ref_inputs:
                if id(entry) in used:
                    continue
                if tuple(entry.shape) == shape or layout_permutation(tuple(entry.shape), shape):
                    matched[key] = entry
                    used.add(id(entry))
                    break
        if not matched:
            self._skip(module, call, "none of its tensor arguments pairs with the reference's")
            return None
        return {key: self._convert(entry, port_by_key[key], None) for key, entry in matched.items()}

    def _convert(self, entry: Entry, like: Any, dtype: Any) -> Any:
        """The reference's tensor as the port's framework, dtype and layout."""
        import numpy as np

        array = np.asarray(self.source.load(entry))
        if like is not None:
            perm = self._permutation(tuple(entry.shape), tuple(int(n) for n in like.shape))
            if perm is not None:
                array = np.ascontiguousarray(array.transpose(perm))
            dtype = like.dtype
        exact = array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer)
        if not exact:
            array = np.asarray(array, dtype=np.float32)  # bf16/fp16 -> fp32 is exact
        if self.framework == "torch":
            import torch

            tensor = torch.from_numpy(np.array(array))
            if dtype is not None and (not exact or like is not None):
                tensor = tensor.to(dtype)
            if like is not None and hasattr(like, "device"):
                tensor = tensor.to(like.device)
            return tensor
        import mlx.core as mx

        value = mx.array(array)
        if dtype is not None and (not exact or like is not None):
            value = value.astype(dtype)
        return value

    def _permutation(
        self, shape_ref: tuple[int, ...], shape_port: tuple[int, ...]
    ) -> tuple[int, ...] | None:
        """Axes taking the reference's tensor to the port's layout."""
        from .pair.transposes import layout_permutation

        ndim = len(shape_ref)
        if self.layout == "NCHW" or ndim != len(shape_port) or ndim not in (3, 4, 5):
            return None
        to_last = (0, *range(2, ndim), 1)
        fits = tuple(shape_ref[i] for i in to_last) == shape_port
        if shape_ref != shape_port:
            back = layout_permutation(shape_ref, shape_port)  # port -> ref axes
            if back is None:
                return None
            if ndim in (4, 5):
                self.channels_last = True
            inverse = [0] * ndim
            for i, axis in enumerate(back):
                inverse[axis] = i
            return tuple(inverse)
        if (
            fits
            and ndim in (4, 5)
            and (self.layout == "NHWC" or (self.channels_last and self.framework == "mlx"))
        ):
            return to_last
        return None


def _substitute(value: Any, prefix: str, replacements: dict[str, Any]) -> Any:
    """``value`` with the tensors at the keys of ``replacements`` swapped (the naming of
    :func:`mldbg.capture.flatten.flatten_call`); other values kept as they are."""
    if prefix in replacements:
        return replacements[prefix]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_substitute(v, f"{prefix}.{i}", replacements) for i, v in enumerate(value))
    if isinstance(value, list):
        return [_substitute(v, f"{prefix}.{i}", replacements) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _substitute(v, f"{prefix}.{k}", replacements) for k, v in value.items()}
    return value
