"""Capture a script's models without editing the script (``mldbg start --capture NAME``).

The agent installs this before the script's first line when the environment holds
``MLDBG_CAPTURE`` (a JSON ``capture_options.Spec``, which ``start --capture`` puts there; child
processes inherit it, so each ``torchrun`` rank captures its own models).  Nothing of
torch or MLX is imported here: an import hook patches each framework when the script
imports it (or at once, when it already has).

* **torch**: ``torch.nn.Module.__call__`` is wrapped.  Torch's global module hooks
  (``register_module_forward_pre_hook``) would see every call too, but they are not
  given keyword arguments, and transformers passes ``hidden_states=`` and
  ``attention_mask=`` by keyword; so the wrapper only decides which calls are models,
  and each model is captured by :class:`mldbg.capture.Capture`, whose per-module hooks
  see keywords.
* **MLX**: ``mlx.nn.Module`` has no hooks and no common ``__call__``; every subclass's
  own ``__call__`` is wrapped as the class is defined (``__init_subclass__``) or, for
  classes that exist already, at install.  A model is then captured by the same
  per-instance recording classes as ``mldbg.capture``.

**Which models**: by default, the outermost module calls (a module called while no
other module call is under way: the model the script calls, not its layers).  With
``models``, the outermost calls of modules whose class name matches one of the glob
patterns (``LlamaModel``, ``*UNet*``), wherever they are called from.  A module whose
method calls its own submodules (``vae.decode(z)``) is the model of those calls.  Each such
model becomes one capture, open from its first call to the end of the script (or to
its ``calls``-th call): the first model is ``NAME``, the next ones ``NAME.2``,
``NAME.3``… in the order of their first calls, which is the same in a reference script
and its port when both call their models in the same order.
"""

from __future__ import annotations

import fnmatch
import importlib.abc
import importlib.machinery
import json
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any

from .capture_options import ENV, MAX_MODELS, Spec

if TYPE_CHECKING:  # the capture and replay types (loaded only when a model is captured)
    from .capture import Capture
    from .compare.replay import ReplayResult

MAX_CALLED = 20  # class names of outermost calls kept, to say what a pattern could match
MAX_PROBLEM = 2_000  # characters of one problem kept in run.json
MAX_PROBLEMS = 20  # problems kept in run.json
_MARK = "_mldbg_zero_edit"
_RECORDING = "_mldbg_capture_layer"  # mlx_wrappers' recording classes: never wrapped


class _Thread(threading.local):
    depth = 0  # module calls under way on this thread
    in_model = 0  # captured model calls under way on this thread


class Model:
    """One captured model: its capture, open from its first call."""

    def __init__(
        self, module: object, capture: Capture | None, name: str = "", open: bool | None = None
    ) -> None:
        self.module = module  # kept alive: its id keys the table
        self.capture = capture
        self.name = name
        self.calls = 0
        # its calls go through the tracker: captured, or watched (the line step's, open
        # without a capture: line_scope.py)
        self.open = capture is not None if open is None else open
        self.replay_pending = False
        self.replayed: ReplayResult | None = None


class Tracker:
    """Decides which module calls are models, opens their captures, closes them at the end."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.bases: tuple[type, ...] = ()  # the module classes patched (torch's, MLX's)
        self.thread = _Thread()
        self.lock = threading.RLock()
        self.models: dict[int, Model] = {}
        self.closed = False
        self.problems: list[str] = []
        self.without_within: list[str] = []  # models without the ``within`` module
        # classes of the outermost module calls: what a ``models`` pattern could have named
        self.called: dict[str, None] = {}

    # -- the wrapper body shared by both frameworks -------------------------------------------

    def call(
        self,
        module: object,
        function: Callable[..., object],
        args: tuple[object, ...],
        kwargs: dict[str, object],
        mlx: bool,
    ) -> object:
        """One call of a module (``module.__call__`` is ``function``): captured when it is
        a model's, else passed through; its result, whatever the module returns."""
        state = self.thread
        model = None
        opened = False  # this call opened the model's capture
        target = None if self.closed else self._model_of(module, state)
        if target is not None:
            model, opened = self._model_for(target)
        state.depth += 1
        if model is None:
            try:
                return function(module, *args, **kwargs)
            finally:
                state.depth -= 1
        if model.replay_pending:  # nested calls pass through: depth is already counted
            model.replay_pending = False
            try:
                self._replay(model, module, args, kwargs)
                return function(module, *args, **kwargs)  # the script's own call, plain
            finally:
                state.depth -= 1
        state.in_model += 1
        try:
            self._starting(model, module, args, kwargs)
            if mlx and opened:
                # Python chose the instance's class before the capture swapped in its
                # recording class: go through it once.  Every later call enters that
                # recording class first (it records, then calls this wrapper), so going
                # through it again would record the call twice, one inside the other.
                return type(module).__call__(module, *args, **kwargs)
            return function(module, *args, **kwargs)  # torch: the capture's hooks record it
        finally:
            state.in_model -= 1
            state.depth -= 1
            if module is model.module:  # not a submodule its method called (vae.decode)
                self._called(model)

    def _model_of(self, module: object, state: _Thread) -> object | None:
        """The model this call belongs to (None: not a model's call).

        By default the outermost call (no module call under way on this thread); with
        ``models``, a call of a class those patterns name, outside any captured model.
        Either way, a module whose *method* is running and called this one, its own
        submodule, is the model instead: diffusers' ``vae.decode(z)`` calls
        ``post_quant_conv`` and ``decoder`` itself, and the VAE, never called as such,
        is the model (the outermost such module; ``--capture-model AutoencoderKL``
        names it).  Only calls no module call encloses are looked at that way."""
        if self.spec.models is None:
            if state.depth:
                return None
            owners = self._owners(module)
            return owners[-1] if owners else module
        if state.in_model:
            return None
        if not state.depth:
            if len(self.called) < MAX_CALLED:
                self.called.setdefault(type(module).__name__)
            matching = [m for m in self._owners(module) if self._matches(m)]
            if matching:
                return matching[-1]
        return module if self._matches(module) else None

    def _matches(self, module: object) -> bool:
        cls = type(module)
        names = (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")
        return any(fnmatch.fnmatchcase(n, p) for p in self.spec.models or () for n in names)

    def _owners(self, module: object) -> list[object]:
        """Modules whose methods are running on this thread and that hold ``module``
        (itself included), innermost first: each frame whose first parameter is
        ``self`` and holds a module of a patched framework."""
        found: list[object] = []
        looked: set[int] = set()
        frame: FrameType | None = sys._getframe(1)  # this module's own frames are skipped
        while frame is not None:
            code = frame.f_code
            if code.co_argcount and code.co_varnames[0] == "self" and code.co_filename != __file__:
                value = frame.f_locals.get("self")
                if value is not None and id(value) not in looked:
                    looked.add(id(value))
                    if isinstance(value, self.bases) and _holds(value, module):
                        found.append(value)
            frame = frame.f_back
        return found

    def _model_for(self, module: object) -> tuple[Model | None, bool]:
        """The model ``module`` is (None: not captured), and whether it was opened now."""
        with self.lock:
            known = self.models.get(id(module))
            if known is not None:
                return (known if known.open else None), False
            index = len(self.models)
            if index >= MAX_MODELS:
                return None, False
            name = self.spec.name if index == 0 else f"{self.spec.name}.{index + 1}"
            if self.spec.replay is not None:  # replayed once, at its first call
                model = self.models[id(module)] = Model(module, None, name)
                model.replay_pending = True
                return model, True
            model = self.models[id(module)] = self._make_model(module, name)
            return (model if model.open else None), True

    def _make_model(self, module: object, name: str) -> Model:
        """A model seen for the first time: its capture opened."""
        return Model(module, self._open(module, name), name)

    def _starting(
        self, model: Model, called: object, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        """A call of ``model`` (``called``: the model, or the submodule its method calls)
        is about to run: nothing to do for a capture, whose hooks see it."""

    def _open(self, module: object, name: str) -> Capture | None:
        from .capture import Capture, has_module

        spec = self.spec
        lacking = spec.within is not None and not has_module(module, spec.within)
        if lacking:
            # A pipeline's other models lack the module the fine pass looks inside: each
            # is captured index-only, quietly (its calls and their rounding, which the
            # models after it read; no tensors); ``finish`` speaks up if none had it.
            try:  # its message lists paths the model has
                Capture(module, name, within=spec.within)
                why = ""
            except Exception as exc:
                why = f": {exc}"
            self.without_within.append(f"{name} ({type(module).__name__}){why}")
        try:
            capture = Capture(
                module,
                name,
                inputs=spec.inputs,
                mode=spec.mode,
                depth=spec.depth,
                budget=spec.budget,
                within=spec.within,
                ops=spec.ops,
                sensitivity=spec.sensitivity,
                precision=spec.precision,
                upstream=self._upstream(),
                index_only=lacking,
            )
            capture.__enter__()
        except Exception as exc:  # never break the script: say why this model is not captured
            message = f"mldbg capture {name!r} ({type(module).__name__}): not captured: {exc}"
            self.problems.append(message)
            print(message, file=sys.stderr)
            return None
        if spec.weights:  # the parameters as loaded: the model is about to be used
            try:
                capture.save_weights()
            except Exception as exc:
                message = f"mldbg capture {name!r}: weights not saved: {exc}"
                self.problems.append(message)
                print(message, file=sys.stderr)
        return capture

    def _upstream(self) -> list[dict[str, Any]]:
        """The captures of the models called before this one, each with how many of its
        calls have ended: what this model's inputs may already carry (compare bounds its
        first inputs by their rounding, compare/judge/upstream.py)."""
        return [
            {"capture": m.capture.name, "ended": m.capture.calls_ended}
            for m in self.models.values()
            if m.capture is not None and m.capture.path is not None
        ]

    def _replay(
        self, model: Model, called: object, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        """``mldbg.replay`` of this model on its reference capture (``REF``, ``REF.2``… for
        the second and later models), written as the capture ``NAME`` (``NAME.2``…).  The
        script's own first call (``args``, ``kwargs``) says how the port's root takes its
        inputs; the reference's replace its tensors."""
        from .compare.replay import replay

        assert self.spec.replay is not None
        suffix = model.name[len(self.spec.name) :]  # "", ".2", ...
        reference = self.spec.replay + suffix
        where = f"mldbg replay {model.name!r} on {reference!r}"
        if called is not model.module:  # vae.decode(z): no call of the model to feed
            message = (
                f"{where}: not replayed: the script drives {type(model.module).__name__} "
                f"through a method (its first call is of a submodule, "
                f"{type(called).__name__}), and replay feeds the model's own call"
            )
            self.problems.append(message)
            print(message, file=sys.stderr)
            return
        try:
            model.replayed = replay(
                model.module, reference, name=model.name, root_call=(args, kwargs)
            )
        except Exception as exc:  # never break the script: say why
            message = f"{where}: {type(exc).__name__}: {exc}"
            self.problems.append(message)
            print(message, file=sys.stderr)
            return
        failed = model.replayed.result.get("error")
        if failed:  # the port's forward failed on the reference's inputs: say so
            message = f"{where}: the port's forward failed on the reference's inputs: {failed}"
            self.problems.append(message[:2000])
            print(message[:2000], file=sys.stderr)

    def _called(self, model: Model) -> None:
        with self.lock:
            model.calls += 1
            if self.spec.calls is not None and model.calls >= self.spec.calls and model.open:
                self._close(model)

    def _close(self, model: Model) -> None:
        model.open = False
        if model.capture is not None:
            model.capture.close_when_idle()

    def finish(self) -> None:
        """Close every open capture (writes each ``capture.json``); later calls run plain.
        What could not be done is said on stderr and kept in run.json (``capture_problems``):
        a pattern that matched no model made no capture, so no capture.json can say it."""
        with self.lock:
            self.closed = True
            for model in self.models.values():
                if model.open:
                    self._close(model)
            if self.spec.models is not None and not self.models:
                self._say(self._matched_nothing())
            if self.without_within and all(c.index_only for c in self.captures()):
                shown = self.without_within[:3]
                more = len(self.without_within) - len(shown)
                message = (
                    f"mldbg capture {self.spec.name!r}: no model has the module "
                    f"within={self.spec.within!r}, no tensor was captured: "
                    + "; ".join(shown)
                    + (f"; and {more} more" if more else "")
                )
                self._say(message)
            self._keep_problems()

    def _matched_nothing(self) -> str:
        patterns = ", ".join(repr(p) for p in self.spec.models or ())
        called = ", ".join(self.called) or "none (no torch or MLX module was called)"
        more = " …" if len(self.called) >= MAX_CALLED else ""
        return (
            f"mldbg capture {self.spec.name!r}: no model matched --capture-model {patterns}; "
            f"nothing was captured. Classes of the outermost module calls: {called}{more}"
        )

    def _say(self, message: str) -> None:
        self.problems.append(message)
        print(message, file=sys.stderr)

    def _keep_problems(self) -> None:
        """Add this process's problems to its run's run.json, bounded (never raises: the
        script's end must not fail on it)."""
        if not self.problems:
            return
        from .store.current_run import current_run

        try:
            run = current_run()
            kept = run.read_meta().get("capture_problems") or []
            problems = [*kept, *(p[:MAX_PROBLEM] for p in self.problems)][:MAX_PROBLEMS]
            run.update_meta(capture_problems=problems)
        except (OSError, ValueError) as exc:
            print(f"mldbg capture: run.json not updated: {exc}", file=sys.stderr)

    def captures(self) -> list[Capture]:
        return [m.capture for m in self.models.values() if m.capture is not None]

    # -- patching the frameworks ---------------------------------------------------------------

    def patch_torch(self, module_py: ModuleType) -> None:
        """Wrap ``torch.nn.Module.__call__`` (given ``torch.nn.modules.module``)."""
        base = module_py.Module
        original = base.__call__
        if getattr(original, _MARK, False):
            return
        tracker = self
        self.bases = (*self.bases, base)

        def __call__(self: object, *args: object, **kwargs: object) -> object:
            return tracker.call(self, original, args, kwargs, mlx=False)

        setattr(__call__, _MARK, True)
        base.__call__ = __call__

    def patch_mlx(self, base_py: ModuleType) -> None:
        """Wrap the ``__call__`` of every ``mlx.nn.Module`` subclass, now and as defined."""
        base = base_py.Module
        tracker = self
        self.bases = (*self.bases, base)
        previous = base.__dict__.get("__init_subclass__")

        def __init_subclass__(cls: type, **kwargs: object) -> None:
            if previous is not None:
                previous.__func__(cls, **kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
            tracker.wrap_mlx_class(cls)

        base.__init_subclass__ = classmethod(__init_subclass__)
        pending = list(base.__subclasses__())
        while pending:
            cls = pending.pop()
            self.wrap_mlx_class(cls)
            pending.extend(cls.__subclasses__())

    def wrap_mlx_class(self, cls: type) -> None:
        function = cls.__dict__.get("__call__")
        if function is None or getattr(function, _MARK, False) or _RECORDING in cls.__dict__:
            return
        tracker = self

        def __call__(self: object, *args: object, **kwargs: object) -> object:
            return tracker.call(self, function, args, kwargs, mlx=True)

        setattr(__call__, _MARK, True)
        __call__.__wrapped__ = function  # type: ignore[attr-defined]
        __call__.__doc__ = function.__doc__
        setattr(cls, "__call__", __call__)  # noqa: B010 - the class attribute, on purpose


def _holds(owner: Any, module: object) -> bool:
    """Whether ``module`` is ``owner`` or one of its submodules (torch and MLX modules
    both list theirs, themselves included, with ``modules()``)."""
    if owner is module:
        return True
    try:
        return any(m is module for m in owner.modules())
    except Exception:  # an odd module: not an owner
        return False


# -- patch on import ---------------------------------------------------------------------------


class _Loader(importlib.abc.Loader):
    """The real loader, then ``after(module)``; everything else is the real loader's."""

    def __init__(self, inner: importlib.abc.Loader, after: Callable[[ModuleType], None]) -> None:
        self.inner = inner
        self.after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.after(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package…
        return getattr(self.inner, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, actions: dict[str, Callable[[ModuleType], None]]) -> None:
        self.actions = actions

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        action = self.actions.get(fullname)
        if action is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        self.actions.pop(fullname, None)
        spec.loader = _Loader(spec.loader, action)
        return spec


TORCH_MODULE = "torch.nn.modules.module"
MLX_MODULE = "mlx.nn.layers.base"


def install(spec: Spec) -> Tracker:
    """Start capturing this process's models as ``spec`` says; call ``finish()`` at the end."""
    return watch(Tracker(spec))


def watch(tracker: Tracker) -> Tracker:
    """Patch torch and MLX (now, or as the script imports them) so that ``tracker`` sees
    every module call: the capture's tracker, or the line step's (``line_scope.py``)."""
    actions: dict[str, Callable[[ModuleType], None]] = {}
    for name, patch in ((TORCH_MODULE, tracker.patch_torch), (MLX_MODULE, tracker.patch_mlx)):
        loaded = sys.modules.get(name)
        if loaded is not None:
            patch(loaded)
        else:
            actions[name] = patch
    if actions:
        sys.meta_path.insert(0, _PatchOnImport(actions))
    return tracker


def install_from_environment(environ: dict[str, str] | None = None) -> Tracker | None:
    """``install`` with the settings in ``$MLDBG_CAPTURE``; None when it is unset.
    Raises ValueError, saying what is wrong, for settings that do not parse."""
    import os

    raw = (environ if environ is not None else os.environ).get(ENV)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"${ENV} is not JSON: {exc}") from None
    return install(Spec.parse(data))
