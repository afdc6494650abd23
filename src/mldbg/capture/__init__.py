"""``mldbg.capture``: record every submodule call of a PyTorch or MLX model.

Standard library only at import time (``import mldbg`` must stay cheap inside any
script); torch or MLX is imported when a model of theirs is captured.
"""

from __future__ import annotations

import fnmatch
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import NoSuchModule
from ..store.current_run import current_run
from .budget import Policy, parse_size
from .recorder import Recorder
from .store import MAX_NAME, CaptureDir, check_capture_name, module_label

__all__ = ["Capture", "capture"]

MAX_MODULES = 100_000  # module paths listed in capture.json
WEIGHTS = "weights.safetensors"  # the model's parameters, when asked (save_weights)


def framework_of(model: object) -> str:
    for cls in type(model).__mro__:
        module = cls.__module__ or ""
        if module.startswith("torch.nn"):
            return "torch"
        if module.startswith("mlx.nn"):
            return "mlx"
    raise TypeError(
        f"mldbg.capture takes a torch.nn.Module or an mlx.nn.Module, not {type(model).__qualname__}"
    )


def _is_pipeline(model: object) -> bool:
    """A dict of models (an MLX module is a dict too: a module is never a pipeline)."""
    if not isinstance(model, Mapping):
        return False
    try:
        framework_of(model)
    except TypeError:
        return True
    return False


def _patterns(value: str | Iterable[str] | None, option: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, Iterable) or isinstance(value, bytes | Mapping):
        raise TypeError(
            f"{option} takes a glob pattern on module paths or a list of them, e.g. "
            f"'model.layers.*', not {type(value).__name__}"
        )
    patterns = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(p, str) and p for p in patterns):
        raise TypeError(f"{option} takes glob patterns on module paths, e.g. 'model.layers.*'")
    return patterns


class Capture:
    """A capture in progress or done: ``with mldbg.capture(model, "ref") as cap: model(x)``.

    After the block, ``cap.path`` is the directory, ``cap.name`` its name (``ref``, or
    ``ref-2`` when the run already had a ``ref``) and ``cap.records`` / ``cap.tensors`` /
    ``cap.bytes`` say how much was written; ``cap.errors`` lists what could not be written
    (a full disk: tensor files, index lines, ``capture.json``), which never stops the model.
    """

    def __init__(
        self,
        model: Any,
        name: str,
        *,
        inputs: bool = True,
        include: str | Iterable[str] | None = None,
        exclude: str | Iterable[str] | None = None,
        mode: str = "full",
        depth: int | None = None,
        budget: int | str | None = None,
        within: str | None = None,
        background: bool | None = None,
        sensitivity: bool = True,
        ops: str | Iterable[str] | None = None,
        upstream: list[dict[str, Any]] | None = None,
        index_only: bool = False,
    ) -> None:
        # Several models (a pipeline's): one container holds them under their names.
        self.models = list(model) if _is_pipeline(model) else None
        if self.models is not None:
            from .pipeline import container

            model = container(model, framework_of)
        self.model = model
        self.rank = _rank()
        if self.rank is not None and "@rank" not in name:
            check_capture_name(name)  # the name given, before the suffix takes room
            suffix = f"@rank{self.rank[0]}"
            if len(name) + len(suffix) > MAX_NAME:
                raise ValueError(
                    f"capture name {name[:40]!r}… is too long for its rank suffix {suffix!r}: "
                    f"at most {MAX_NAME - len(suffix)} characters under torchrun"
                )
            name = name + suffix  # one capture per torchrun rank, told apart
        self.name = check_capture_name(name)
        self.requested_name = self.name
        self.framework = framework_of(model)
        self._target = self._backend().prepare(model)  # one that cannot be captured fails here
        self.inputs = inputs
        self.include = _patterns(include, "include")
        self.exclude = _patterns(exclude, "exclude")
        self.policy = Policy(mode=mode, depth=depth, budget=parse_size(budget))  # checked
        self.within = within
        self.ops = _patterns(ops, "ops")
        self.sensitivity = sensitivity
        # The captures of the models this process ran before this one ([{"capture",
        # "ended"}]: how many of their calls had ended), for compare (compare/judge/upstream.py).
        self.upstream = upstream
        # Off the critical path by default: a full capture's writes, and the statistics
        # and sketch of a torch model's summary on the CPU (a summary writes little, but
        # computing it is ~10 passes over each tensor: 2.4x a plain forward inline at 128
        # tokens, 1.8x in the background, benchmarks/parity.md).  On a GPU the summary
        # stays on the device, inline (the writer would copy every tensor to the host for
        # 8 KB).  An MLX summary is computed with MLX operations, which stay on the
        # model's thread: it is always written inline.
        if self.framework == "mlx" and self.policy.mode == "summary":
            self.background = False
        elif background is not None:
            self.background = background
        else:
            self.background = self.policy.mode == "full" or self._backend().on_host(self._target)
        # Calls outside ``within`` are still recorded, on the index only (no tensors, as
        # for calls below ``depth``), and measured: the module's inputs carry what every
        # call before it rounded (an ill-conditioned timestep embedding's floor included),
        # and compare can bound them only from the whole call tree.
        # ``index_only``: every call outside, no tensors at all (a pipeline's model that
        # lacks the fine pass's ``within`` module: the models after it still learn what
        # it rounded); its ``within`` is then not checked, only recorded.
        self.index_only = index_only
        self.within_patterns = (
            []
            if index_only
            else None
            if within is None
            else _within(self._backend(), self._target, within)
        )
        self.path: Path | None = None
        self._entered = False
        self._directory: CaptureDir | None = None
        self._recorder: Recorder | None = None
        self._detach: Callable[[], None] | None = None
        self._started = 0.0
        self._writer: Any = None
        self._errors: list[str] = []  # failures outside the recorder (the directory, capture.json)

    def _backend(self) -> Any:
        if self.framework == "torch":
            from . import torch_hooks

            return torch_hooks
        from . import mlx_wrappers

        return mlx_wrappers

    def _module_paths(self, backend: Any, target: Any) -> tuple[list[str], list[str]]:
        """Every kept module's path, and those of the modules that hold no parameter (in
        them or below): an activation, a dropout, a rotary helper, which a port may compute
        inline instead (compare lists such modules without a counterpart apart)."""
        try:
            kept = [(p, m) for p, m in backend.named_modules(target) if self.keeps(p)]
            free = [path for path, module in kept if not backend.has_parameters(module)]
        except Exception:  # the lists are hints for compare; never fail the capture on them
            return [], []
        return [path for path, _ in kept][:MAX_MODULES], free[:MAX_MODULES]

    def inside(self, path: str) -> bool:
        """Whether call ``path``'s tensors are recorded: inside ``within`` (if given)."""
        patterns = self.within_patterns
        return patterns is None or any(fnmatch.fnmatchcase(module_label(path), p) for p in patterns)

    def keeps(self, path: str) -> bool:
        """Whether module ``path`` is recorded: matches an include (if any), no exclude."""
        label = module_label(path)
        if self.include is not None and not any(
            fnmatch.fnmatchcase(label, p) for p in self.include
        ):
            return False
        return not (self.exclude and any(fnmatch.fnmatchcase(label, p) for p in self.exclude))

    def __enter__(self) -> Capture:
        if self._entered:
            raise RuntimeError(f"capture {self.name!r} was already used; make a new one")
        self._entered = True
        backend = self._backend()
        target = self._target
        modules, parameter_free = self._module_paths(backend, target)
        try:
            self._directory = CaptureDir(
                current_run(),
                self.requested_name,
                {
                    "framework": self.framework,
                    "model_class": f"{type(target).__module__}.{type(target).__qualname__}",
                    "inputs": self.inputs,
                    "include": self.include,
                    "exclude": self.exclude,
                    "mode": self.policy.mode,
                    "depth": self.policy.depth,
                    "budget_limit": self.policy.budget,
                    "within": self.within,
                    "ops": self.ops,
                    **(
                        {"rank": self.rank[0], "world_size": self.rank[1]}
                        if self.rank is not None
                        else {}
                    ),
                    # Every kept module, called or not: compare tells a module the port
                    # has but never calls (a skipped norm) from one it lacks altogether.
                    "modules": modules,
                    "parameter_free": parameter_free,
                    **({"models": self.models} if self.models else {}),
                    **({"upstream": self.upstream} if self.upstream else {}),
                    **({"index_only": True} if self.index_only else {}),
                },
            )
        except OSError as exc:  # no room for even the directory: the model runs uncaptured
            message = f"cannot create the capture: {type(exc).__name__}: {exc}"
            self._errors.append(message)
            warnings.warn(f"mldbg.capture {self.name!r}: {message}", RuntimeWarning, stacklevel=2)
            return self
        self.path = self._directory.path
        self.name = self._directory.name
        writer = None
        if self.background:
            from .writer import BackgroundWriter

            writer = BackgroundWriter()
        self._writer = writer
        self._recorder = Recorder(
            self._directory,
            backend.save,
            self.inputs,
            self.policy,
            backend.summarize,
            writer,
            backend.snapshotter(),
            settle=getattr(backend, "settle", None),
            clock=backend.device_clock() if hasattr(backend, "device_clock") else None,
        )
        self._recorder.sensitivity = self.sensitivity
        self._recorder.models = frozenset(
            id(m) for m in (target, *(getattr(target, n, None) for n in self.models or ()))
        )
        self._recorder.model_paths = frozenset({"", *(self.models or ())})
        if self.within_patterns is not None:
            self._recorder.inside = self.inside
        self._started = time.perf_counter()
        try:
            self._detach = backend.attach(self.model, self._recorder, self.keeps)
            if self.ops:
                self._detach = self._attach_ops(backend, target, self._detach)
        except BaseException as exc:
            if self._writer is not None:
                self._writer.close()
            self._errors.extend(
                self._directory.finish("failed", error=f"{type(exc).__name__}: {exc}")
            )
            raise
        return self

    def _attach_ops(
        self, backend: Any, target: Any, detach_modules: Callable[[], None]
    ) -> Callable[[], None]:
        """Record the framework operations inside the ``ops`` modules; the detach that
        removes them first, then the module capture."""
        from . import ops

        assert self._recorder is not None and self.ops is not None
        scope = ops.OpScope(self._recorder, self.ops)
        named = list(backend.named_modules(target))
        self._unmatched("ops", self.ops, [path for path, _ in named])
        try:
            if self.framework == "torch":
                detach_ops = ops.attach_torch(scope, named)
            else:
                detach_ops = ops.attach_mlx(scope, named)
        except BaseException:
            detach_modules()
            raise

        def detach() -> None:
            try:
                detach_ops()
            finally:
                detach_modules()

        return detach

    def _unmatched(self, option: str, patterns: list[str], paths: list[str]) -> None:
        """Say which ``option`` patterns match no module of the model (a typo records
        nothing, silently): a RuntimeWarning, and ``<option>_unmatched`` in capture.json.
        Not an error: under zero-edit capture one pattern may be meant for another model."""
        labels = [module_label(path) for path in paths]
        unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(x, p) for x in labels)]
        if not unmatched:
            return
        shown = ", ".join(repr(p[:200]) for p in unmatched[:5])
        warnings.warn(
            f"mldbg.capture {self.name!r}: {option} {shown} match(es) no module of the model "
            f"(some it has: {', '.join(labels[:8])})",
            RuntimeWarning,
            stacklevel=4,  # the script's `with mldbg.capture(...)` line
        )
        if self._directory is not None:
            self._directory.meta[f"{option}_unmatched"] = [p[:200] for p in unmatched[:50]]

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Restore the model and write ``capture.json``; never raises, never hides ``exc``."""
        try:
            if self._detach is not None:
                detach, self._detach = self._detach, None
                detach()
        except Exception as error:  # restoring must not replace the model's own exception
            self._errors.append(f"restoring the model: {type(error).__name__}: {error}")
        if self._directory is None or self._recorder is None:
            return
        writer = self._writer
        if writer is not None:  # everything queued is on disk before capture.json says so
            try:
                writer.close()
            except Exception as error:
                self._errors.append(f"background writer: {type(error).__name__}: {error}")
        recorder = self._recorder
        fields: dict[str, Any] = {
            "records": recorder.records,
            "tensors": recorder.tensors,
            "bytes": recorder.bytes,
            "seconds": round(time.perf_counter() - self._started, 3),
            "budget": self.policy.report(),
            "background": None if writer is None else {"waits": writer.waits},
        }
        if recorder.error_count:
            fields["write_errors"] = recorder.errors[:100]
            fields["write_error_count"] = recorder.error_count
        if exc is not None:
            try:
                fields["error"] = f"{type(exc).__name__}: {exc}"
            except Exception:
                fields["error"] = type(exc).__name__
        state = (
            "failed" if exc is not None else "incomplete" if recorder.error_count else "complete"
        )
        try:
            self._errors.extend(self._directory.finish(state, **fields))
        except Exception as error:
            self._errors.append(f"finishing the capture: {type(error).__name__}: {error}")

    def close_when_idle(self) -> None:
        """Close the capture now or, while a call of the model is under way on this thread,
        as soon as it ends.  (An MLX model's recording class records a call's end after
        the code it called returns: ``start --capture-calls N``'s last call would
        otherwise lose its end.)"""
        recorder = self._recorder
        if recorder is not None and recorder.busy_here():
            recorder.on_idle = lambda: self.__exit__(None, None, None)
        else:
            self.__exit__(None, None, None)

    def save_weights(self) -> Path | None:
        """Write the model's parameters and buffers, as they are now, to ``weights.safetensors``
        in the capture (for ``mldbg weights``); None when the capture has no directory.
        Zero-edit capture calls it at the model's first call: after loading, before use."""
        if self._directory is None:
            return None
        backend = self._backend()
        quantized: dict[str, dict[str, Any]] = {}
        buffers: list[str] = []
        if self.framework == "torch":
            tensors = dict(self._target.state_dict())
            buffers = [name for name, _ in self._target.named_buffers() if name in tensors]
        else:
            from mlx.utils import tree_flatten

            tensors = dict(tree_flatten(self._target.parameters()))
            quantized = _quantized_modules(self._target)
        final = self._directory.path / WEIGHTS
        tmp = self._directory.path / f".{WEIGHTS}.{os.getpid()}.safetensors"
        try:
            written, skipped = backend.save(tensors, tmp)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        self._directory.meta["weights"] = {
            "file": WEIGHTS,
            "tensors": len(written),
            "bytes": final.stat().st_size,
            **({"skipped": dict(list(skipped.items())[:50])} if skipped else {}),
            **({"quantization": quantized} if quantized else {}),
            **({"buffers": buffers[:10_000]} if buffers else {}),
        }
        return final

    @property
    def calls_ended(self) -> int:
        """How many recorded calls have ended so far (the index's ``end`` counter)."""
        return self._recorder.calls_ended if self._recorder is not None else 0

    @property
    def records(self) -> int:
        return self._recorder.records if self._recorder else 0

    @property
    def tensors(self) -> int:
        return self._recorder.tensors if self._recorder else 0

    @property
    def bytes(self) -> int:
        return self._recorder.bytes if self._recorder else 0

    @property
    def errors(self) -> list[str]:
        return (list(self._recorder.errors) if self._recorder else []) + self._errors

    def __repr__(self) -> str:
        return (
            f"<mldbg capture {self.name!r} ({self.framework}) {self.records} calls at {self.path}>"
        )


def _rank() -> tuple[int, int] | None:
    """``(rank, world size)`` of a process torchrun (or any launcher setting ``RANK`` and
    ``WORLD_SIZE``) started, when there is more than one; else None."""
    import os

    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return (rank, world) if world > 1 else None


def has_module(model: Any, path: str) -> bool:
    """Whether ``model`` (torch or MLX) has a module at ``path`` (``<root>``: itself).
    True when that cannot be told (a model capture refuses): the capture says why."""
    try:
        framework = framework_of(model)
        if framework == "torch":
            from . import torch_hooks as backend
        else:
            from . import mlx_wrappers as backend  # type: ignore[no-redef]
        target = backend.prepare(model)
        label = module_label(path)
        return any(module_label(p) == label for p, _ in backend.named_modules(target))
    except Exception:
        return True


def _within(backend: Any, target: Any, within: str) -> list[str]:
    """Include patterns for "module ``within`` and everything inside it", checked."""
    if not isinstance(within, str):
        raise TypeError(
            f"within takes a module path, e.g. 'model.layers.7', not {type(within).__name__}"
        )
    label = module_label(within)
    paths = [module_label(path) for path, _ in backend.named_modules(target)]
    if label not in paths:
        close = [p for p in paths if label.rsplit(".", 1)[-1] in p][:10] or paths[:10]
        shown = repr(within) if len(within) <= 200 else repr(within[:200]) + "…"
        raise NoSuchModule(
            f"within={shown}: the model has no module of that path (some it has: "
            + ", ".join(close)
            + ")"
        )
    return [label, f"{label}.*"] if label != module_label("") else ["*"]


def capture(
    model: Any,
    name: str,
    *,
    inputs: bool = True,
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    mode: str = "full",
    depth: int | None = None,
    budget: int | str | None = None,
    within: str | None = None,
    background: bool | None = None,
    sensitivity: bool = True,
    ops: str | Iterable[str] | None = None,
) -> Capture:
    """Record every submodule call of ``model`` while the ``with`` block runs.

    ``model`` may be a dict of models of one framework (a pipeline's text encoder,
    denoiser, VAE): each module path then starts with the model's name.

    Inputs (unless ``inputs=False``) and outputs of each call go to the current run's
    ``captures/<name>/``; ``include`` / ``exclude`` are glob patterns on module paths
    (``<root>`` is the model itself).  Compare two captures with ``mldbg compare``.

    Coarse to fine (README, "Parity at scale"): ``mode="summary"`` keeps statistics and a
    seeded sketch per tensor instead of the tensor; ``depth`` records only calls nested at
    most that deep (0: the model's own call); ``budget`` (bytes, or ``"1GB"``) caps what
    tensor files may take, skipping (and reporting) what does not fit; ``within`` records
    only module ``within`` and what it contains, in full.  ``background`` (default: on,
    except for summaries of MLX models and of torch models on an accelerator) writes
    files, and computes torch summaries, on a writer thread with bounded memory.
    ``sensitivity`` (default on) re-runs each leaf call once on inputs perturbed by one
    rounding step, and each call one call above its leaves twice (its inline work: an
    attention's softmax), so compare can bound ill-conditioned ops (README, "How a verdict
    is reached"); ``sensitivity=False`` saves that time and leaves such ops unexcused.
    ``ops`` (globs on module paths) also records the framework operations inside those
    modules (torch functions, ``mx.*`` / ``mx.fast.*`` calls), for compare to say which
    operation inside a culprit first diverges.
    """
    return Capture(
        model,
        name,
        inputs=inputs,
        include=include,
        exclude=exclude,
        mode=mode,
        depth=depth,
        budget=budget,
        within=within,
        background=background,
        sensitivity=sensitivity,
        ops=ops,
    )


def _quantized_modules(model: Any) -> dict[str, dict[str, Any]]:
    """``{module path: {mode, bits, group_size}}`` for each quantized MLX module (what
    the packed ``weight``/``scales``/``biases`` in ``weights.safetensors`` mean: the
    weights audit decodes them with it)."""
    found: dict[str, dict[str, Any]] = {}
    for path, module in model.named_modules():
        bits, group = getattr(module, "bits", None), getattr(module, "group_size", None)
        if isinstance(bits, int) and isinstance(group, int) and "scales" in module:
            mode = str(getattr(module, "mode", "affine") or "affine")
            found[path] = {"mode": mode, "bits": bits, "group_size": group}
    return found
