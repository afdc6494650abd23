"""The line step inside the debuggee: where to record (``$MLDBG_LINES``) and what to keep.

``mldbg line`` runs each script again, unmodified, with ``$MLDBG_LINES`` set: a
:class:`LineSpec` saying which scope to record.  This module finds that scope as the
zero-edit capture finds its models (the same :class:`~.zero_edit.Tracker`, so the n-th
model of a run is the n-th model here too, and module paths are the capture's):

* **module**: the call number ``call`` of the module at ``module`` inside the run's
  ``model``-th model.  A torch module gets a forward pre-hook and hook, an MLX module a
  marking class (as ``ops=`` does): the recorder records from the call's start to its
  end, on that thread, in every function it reaches (library code too; the frameworks'
  plumbing aside).  A torch ``scaled_dot_product_attention`` inside the scope also
  records what it computes on the way (``capture/ops.sdpa_parts``), so a port that
  spells attention out has counterparts for its scores and probabilities.
* **glue**: the script's own lines around its model calls: the functions (or module)
  holding the call sites compare names, recorded from the script's start until the
  model's call number ``call`` (of ``module``) starts; that call's inputs are recorded
  too, as values of the line that makes it.

:class:`LineWriter` keeps each value the recorder hands it within a byte budget, in
``runs/<run>/lines/``: its shape, dtype and first elements, and all its elements when
it has at most 1021 of them, else its statistics and a sketch (``capture/sketch.py``:
~8 KB whatever the tensor's size).  Sketches do not commute with a transpose, so the
port's run is given the reference's records (``targets``): each port value is also
sketched as read in each reference shape of as many elements
(``compare/pair/readings.py``: unit axes, permutations, heads split or merged), which
is how the analysis aligns them by value (``compare/line/``).
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Protocol

from .zero_edit import Spec, Tracker

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from .compare.pair.readings import Reading
    from .zero_edit import Model

ENV = "MLDBG_LINES"
LINES_DIR = "lines"
RECORDS = "records.jsonl"
NUMBERS = "numbers.f64"  # every kept element and sketch, float64, back to back
SCOPE_JSON = "scope.json"
HEAD = 4  # first elements kept of each value, to show side by side
TARGET_SHAPES = 8  # reference shapes a port value is read into, at most
READINGS_PER_SHAPE = 4
DEFAULT_BUDGET = 64 << 20
_MARK = "_mldbg_capture_layer"  # zero-edit never wraps a class that has it


@dataclass
class LineSpec:
    """What ``mldbg line`` asks one run to record (checked by :meth:`parse`)."""

    side: str  # "a" (the reference) or "b" (the port)
    kind: str  # "module" or "glue"
    model: int  # the run's n-th model (1: NAME, 2: NAME.2, ...)
    module: str  # module path in that model ("" the model itself)
    call: int  # that module's call number (module: the call recorded; glue: the call
    # that ends the scope)
    sites: list[str] = field(default_factory=list)  # glue: "file:line" of the calls
    models: list[str] | None = None  # the capture's --capture-model patterns
    budget: int = DEFAULT_BUDGET
    targets: str | None = None  # the reference's records.jsonl (the port's run)

    @classmethod
    def parse(cls, data: object) -> LineSpec:
        """The settings checked (ValueError saying which is wrong)."""
        if not isinstance(data, dict):
            raise ValueError("the line settings are a JSON object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown line setting(s): {', '.join(sorted(unknown))}")
        side, kind = data.get("side"), data.get("kind")
        if side not in ("a", "b") or kind not in ("module", "glue"):
            raise ValueError("side is a or b, kind is module or glue")
        model, call, budget = (_whole(data, key) for key in ("model", "call", "budget"))
        models = _texts(data, "models", "class names or globs")
        targets = data.get("targets")
        return cls(
            side=str(side),
            kind=str(kind),
            model=max(1, model or 1),
            module=str(data.get("module") or ""),
            call=max(0, call or 0),
            sites=_texts(data, "sites", "FILE:LINE texts") or [],
            models=models or None,
            budget=budget or DEFAULT_BUDGET,
            targets=str(targets) if targets else None,
        )

    def to_env(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    def site_lines(self) -> list[tuple[str, int]]:
        """``sites`` as (canonical file, line)."""
        found = []
        for site in self.sites:
            file, _, line = site.rpartition(":")
            if file and line.isdigit():
                found.append((os.path.realpath(file), int(line)))
        return found


def _whole(data: dict[str, object], key: str) -> int | None:
    value = data.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{key} takes a whole number")
    return value


def _texts(data: dict[str, object], key: str, what: str) -> list[str] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{key} takes {what}")
    return list(value)


class ScopeControl(Protocol):
    """What the scope needs of the debugger's recorder (``agent/line_record.py``)."""

    records: int

    @property
    def recording(self) -> bool: ...

    def open_module_scope(self) -> None: ...

    def open_site_scope(
        self, sites: list[tuple[str, int]], frame: FrameType | None = None
    ) -> None: ...

    def close_scope(self) -> None: ...

    def record_fused(self, parts: list[tuple[str, object]]) -> None: ...

    def record_inputs(self, inputs: list[tuple[str, object]]) -> None: ...


# -- keeping values ------------------------------------------------------------------------------


class LineWriter:
    """The recorder's sink: each value as statistics, head and sketches, within the budget."""

    def __init__(self, directory: Path, budget: int, targets: list[list[int]] | None) -> None:
        from .store.runs import JsonlWriter, make_private_dirs, open_private

        make_private_dirs(directory)
        self.directory = directory
        self.budget = budget
        self.targets = [tuple(t) for t in targets or []]
        self.records = JsonlWriter(directory / RECORDS)
        fd = open_private(directory / NUMBERS, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self._file = os.fdopen(fd, "wb")
        self.written = 0  # float64 numbers in the number file
        self.used = 0  # bytes: numbers and record lines
        self.values = 0
        self.aliases = 0
        self.skipped = 0
        self.needed = 0  # bytes the skipped values' sketches would have taken
        self.errors: list[str] = []

    def record(self, binding: dict[str, object], value: object) -> None:
        line = dict(binding)
        if value is None:
            self.aliases += 1
        else:
            self.values += 1
            try:
                line.update(self._keep(value))
            except Exception as exc:  # a value that cannot be read: said, never raised
                line["error"] = f"{type(exc).__name__}: {exc}"[:300]
                if len(self.errors) < 20:
                    self.errors.append(
                        f"{binding.get('file')}:{binding.get('line')} {line['error']}"
                    )
        try:
            self.used += len(json.dumps(line, default=str, allow_nan=False)) + 1
        except ValueError:  # an infinite statistic (a norm past float64): not kept
            line.pop("stats", None)
            self.used += len(json.dumps(line, default=str)) + 1
        self.records.append(line)

    def _keep(self, value: object) -> dict[str, object]:
        """What is kept of one value: shape, dtype, head, statistics, and its elements
        when it has at most ``EXACT`` of them (a sketch of so few would be a copy), else
        its sketches (its own, and, in the port's run, as read in each reference shape
        it fits)."""
        if type(value) is float:  # no numpy needed: the tracer tests run without it
            scalar: dict[str, object] = {"shape": [], "dtype": "F64", "head": [_number(value)]}
            sentinel = abs(value) >= SENTINEL and value == value
            return self._write(scalar, [(1.0 if value > 0 else -1.0) if sentinel else value], [])
        from .capture.sketch import SKETCH_SIZE, summarize_numpy
        from .compare.pair.readings import readings

        raw, dtype = as_numpy(value)
        shape = tuple(int(n) for n in raw.shape)
        kept: dict[str, object] = {
            "shape": list(shape),
            "dtype": dtype,
            "head": [_number(x) for x in raw.reshape(-1)[:HEAD].tolist()],
        }
        array, sentinels = _signed_sentinels(raw, dtype)
        if sentinels:
            kept["sentinels"] = sentinels
        flat = array.reshape(-1)
        if flat.size <= SKETCH_SIZE:
            return self._write(kept, [float(x) for x in flat.tolist()], [])
        sketch, stats = summarize_numpy(array)
        kept["stats"] = stats
        views: list[_View] = [(shape, None, sketch, [])]
        count = int(array.size)
        for target in [t for t in self.targets if _count(t) == count][:TARGET_SHAPES]:
            for reading in readings(shape, target, READINGS_PER_SHAPE):
                if target == shape and reading.identity:
                    continue  # the native sketch is this one
                moved = reading.apply(array)  # type: ignore[arg-type]
                head = [_number(x) for x in moved.reshape(-1)[:HEAD].tolist()]
                views.append((reading.target, reading, summarize_numpy(moved)[0], head))
        return self._write(kept, None, views)

    def _write(
        self, kept: dict[str, object], exact: list[float] | None, views: list[_View]
    ) -> dict[str, object]:
        """The value's numbers appended to the number file, within the budget: its
        elements (``exact``) or its sketches."""
        size = 8 * (len(exact) if exact is not None else sum(len(v[2]) for v in views))
        if self.used + size > self.budget:
            self.skipped += 1
            self.needed += size
            kept["skipped"] = f"over the byte budget ({self.budget} bytes)"
            return kept
        if exact is not None:
            kept["exact"] = {"offset": self.written, "size": len(exact)}
            self._numbers(exact)
        sketches = []
        for target, read_as, numbers, moved_head in views:
            entry: dict[str, object] = {
                "shape": list(target),
                "offset": self.written,
                "size": len(numbers),
            }
            if read_as is not None:
                entry.update(split=list(read_as.split), order=list(read_as.order), head=moved_head)
            self._numbers(numbers)
            sketches.append(entry)
        if sketches:
            kept["sketches"] = sketches
        self._file.flush()  # before the line that points into it
        self.used += size
        return kept

    def _numbers(self, numbers: npt.NDArray[np.float64] | list[float]) -> None:
        if isinstance(numbers, list):
            self._file.write(struct.pack(f"<{len(numbers)}d", *numbers))
        else:
            self._file.write(numbers.astype("<f8").tobytes())
        self.written += len(numbers)

    def finish(self, **fields: object) -> dict[str, object]:
        from .store.runs import write_json_atomic

        try:
            self._file.close()
        finally:
            self.records.close()
        summary: dict[str, object] = {
            **fields,
            "values": self.values,
            "aliases": self.aliases,
            "bytes": self.used,
            "budget": self.budget,
            "skipped": self.skipped,
            "needed_bytes": self.needed,
            "errors": self.errors,
        }
        write_json_atomic(self.directory / SCOPE_JSON, summary)
        return summary


def _count(shape: Sequence[int]) -> int:
    total = 1
    for n in shape:
        total *= int(n)
    return total


Number = float | int | str  # a JSON number, or "nan" / "inf" / "-inf"
# a value's sketch as read in one shape: (shape, the reading or None, sketch, head)
_View = tuple[
    tuple[int, ...], "Reading | None", "npt.NDArray[np.float64] | list[float]", list[Number]
]


def _number(x: object) -> Number:
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, int):
        return x
    value = float(x)  # type: ignore[arg-type]
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return value


SENTINEL = 1e8  # magnitudes from here on are mask values (-1e9, finfo.min, -inf), not data
_LARGEST = {"F16": 65504.0, "F8_E4M3": 448.0, "F8_E5M2": 57344.0}  # below SENTINEL


def _signed_sentinels(
    array: npt.NDArray[np.generic], dtype: str
) -> tuple[npt.NDArray[np.generic], int]:
    """``array`` with each mask value kept as its sign (±1), and how many there were.

    A port masks with ``-1e9`` or ``-inf`` where its reference uses ``finfo.min``; either
    only saturates what it is added to (a softmax gives those positions 0), so they are
    the same mask.  Compared as they are, ``-1e9`` against ``-3.4e38`` is a relative error
    of 1 and the mask line would be named in a clean port.  A value at or beyond
    ``SENTINEL`` (or half the largest value of a narrow dtype, whose masks are
    ``finfo.min``) is a mask value: kept as -1 or 1, the same whatever it was, while
    *which* positions are masked still counts.  NaN stays NaN (sketches count it, as 0)."""
    import numpy as np

    if array.dtype.kind != "f":
        return array, 0
    limit = min(SENTINEL, _LARGEST.get(dtype, SENTINEL * 2) / 2)
    with np.errstate(invalid="ignore"):
        masked = np.abs(array) >= limit
    count = int(np.count_nonzero(masked))
    if not count:
        return array, 0
    return np.where(masked, np.sign(array), array), count


def as_numpy(value: object) -> tuple[npt.NDArray[np.generic], str]:
    """A recorded value as a host numpy array (float32 at least for floats, bfloat16
    widened) and its own dtype's name.  MLX arrays are evaluated here: recording is the
    only thing that forces them, and evaluating changes no value."""
    import numpy as np

    from .capture.sketch import dtype_name

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        tensor = value.detach()
        if tensor.is_complex():
            raise TypeError(f"complex values are not recorded ({tensor.dtype})")
        name = dtype_name(tensor.dtype)
        if tensor.dtype in (torch.bfloat16, torch.float16) or name.startswith("F8"):
            tensor = tensor.float()
        return tensor.cpu().numpy(), name
    mx = sys.modules.get("mlx.core")
    if mx is not None and isinstance(value, mx.array):
        mx.eval(value)
        name = dtype_name(value.dtype)
        if mx.issubdtype(value.dtype, mx.complexfloating):
            raise TypeError(f"complex values are not recorded ({value.dtype})")
        if value.dtype in (mx.bfloat16, mx.float16):
            value = value.astype(mx.float32)
        return np.array(value), name
    array = np.asarray(value)
    if array.dtype.kind == "c":
        raise TypeError(f"complex values are not recorded ({array.dtype})")
    return array, dtype_name(array.dtype)


# -- finding the scope ---------------------------------------------------------------------------


class LineTracker(Tracker):
    """The zero-edit model tracking, opening the line step's scope instead of captures."""

    def __init__(self, spec: LineSpec, control: ScopeControl, writer: LineWriter) -> None:
        super().__init__(Spec(name="line", models=spec.models))
        self.line_spec = spec
        self.control = control
        self.writer = writer
        self.target: object | None = None
        self.calls = 0  # calls of the module seen (module scope)
        self.top_calls: dict[str, int] = {}  # top-level calls per path (glue)
        self.paths: dict[int, str] = {}  # id(module) -> path, in the target model
        self.reached = False
        self.detach: Callable[[], None] | None = None
        self._mode: AbstractContextManager[object] | None = None
        self.problems: list[str] = []

    def start(self) -> None:
        """Before the script runs: a glue scope opens now (the script's own lines)."""
        if self.line_spec.kind == "glue":
            self.control.open_site_scope(self.line_spec.site_lines())

    def _make_model(self, module: object, name: str) -> Model:
        from .zero_edit import Model

        if len(self.models) + 1 != self.line_spec.model:
            return Model(module, None, name, open=False)
        self.target = module
        try:
            self._watch(module)
        except Exception as exc:  # never break the script: say why nothing is recorded
            self._problem(f"{name} ({type(module).__name__}): {exc}")
        return Model(module, None, name, open=True)

    def _watch(self, model: object) -> None:
        from .capture import framework_of
        from .capture.store import module_label

        if framework_of(model) == "torch":
            from .capture import torch_hooks as backend
        else:
            from .capture import mlx_wrappers as backend  # type: ignore[no-redef]
        target = backend.prepare(model)  # type: ignore[arg-type]
        named = backend.named_modules(target)
        self.paths = {id(module): path for path, module in named}
        if self.line_spec.kind != "module":
            return
        wanted = module_label(self.line_spec.module)
        found = [module for path, module in named if module_label(path) == wanted]
        if not found:
            some = ", ".join(module_label(p) for p, _ in named[:8])
            raise LookupError(f"no module {wanted!r} in the model (it has: {some}, ...)")
        module = found[0]
        if framework_of(model) == "torch":
            before = module.register_forward_pre_hook(lambda *_: self._enter())
            after = module.register_forward_hook(lambda *_: self._exit(), always_call=True)

            def detach() -> None:
                before.remove()
                after.remove()

        else:
            found_class = type(module)
            module.__class__ = _marking_class(found_class, self._enter, self._exit)

            def detach() -> None:
                if type(module).__bases__[0] is found_class:
                    module.__class__ = found_class

        self.detach = detach

    def _enter(self) -> None:
        number = self.calls
        self.calls += 1
        if number != self.line_spec.call or self.control.recording:
            return
        self.reached = True
        self.control.open_module_scope()
        self._mode = _fused_parts_mode(self.control)
        if self._mode is not None:
            self._mode.__enter__()

    def _exit(self) -> None:
        if self.calls - 1 != self.line_spec.call or not self.control.recording:
            return
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        self.control.close_scope()

    def _starting(
        self, model: Model, called: object, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        if self.line_spec.kind != "glue" or model.module is not self.target:
            return
        from .capture.store import module_label

        path = module_label(self.paths.get(id(called), ""))
        number = self.top_calls.get(path, 0)
        self.top_calls[path] = number + 1
        if path != module_label(self.line_spec.module) or number != self.line_spec.call:
            return
        self.reached = True
        inputs: list[tuple[str, object]] = [(f"in.{i}", v) for i, v in enumerate(args)]
        inputs += [(f"in.{k}", v) for k, v in kwargs.items()]
        self.control.record_inputs(inputs)
        self.control.close_scope()

    def _problem(self, message: str) -> None:
        text = f"mldbg line: {message}"
        self.problems.append(text)
        print(text, file=sys.stderr)

    def finish(self) -> None:
        """Close the scope and the writer (``scope.json`` says what was recorded)."""
        with self.lock:
            self.closed = True
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        self.control.close_scope()
        if self.detach is not None:
            self.detach()
        spec = self.line_spec
        self.writer.finish(
            side=spec.side,
            kind=spec.kind,
            model=spec.model,
            module=spec.module,
            call=spec.call,
            sites=spec.sites,
            reached=self.reached,
            records=self.control.records,
            models_seen=len(self.models),
            problems=self.problems,
        )


def _marking_class(found: type, enter: Callable[[], None], leave: Callable[[], None]) -> type:
    """``found`` with a ``__call__`` that brackets each call (an MLX module has no hooks)."""
    call = found.__call__

    def __call__(self: object, *args: object, **kwargs: object) -> object:
        enter()
        try:
            return call(self, *args, **kwargs)
        finally:
            leave()

    return type(
        found.__name__,
        (found,),
        {
            "__call__": __call__,
            "__module__": found.__module__,
            "__qualname__": found.__qualname__,
            _MARK: True,
        },
    )


def _fused_parts_mode(control: ScopeControl) -> AbstractContextManager[object] | None:
    """A ``TorchFunctionMode`` that records what ``scaled_dot_product_attention`` computes
    on the way (None without torch): the reference's fused attention gets values for the
    port's spelled-out scores and probabilities to meet."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    from torch.overrides import TorchFunctionMode

    from .capture.ops import sdpa_parts

    sdpa = torch.nn.functional.scaled_dot_product_attention

    class _Parts(TorchFunctionMode):
        def __torch_function__(
            self,
            func: Callable[..., object],
            types: object,
            args: Sequence[object] = (),
            kwargs: dict[str, object] | None = None,
        ) -> object:
            output = func(*args, **(kwargs or {}))
            if func is sdpa:
                try:
                    parts = sdpa_parts(args, kwargs or {})
                except Exception:  # the parts are a help, never a failure of the script
                    parts = []
                control.record_fused([(f"sdpa.{name}", value) for name, value in parts])
            return output

    return _Parts()


# -- install ---------------------------------------------------------------------------------------


def read_targets(path: str | None) -> list[list[int]] | None:
    """The distinct shapes of the reference's recorded values (the port reads its own
    values into them)."""
    if not path:
        return None
    from .store.runs import iter_jsonl

    shapes: dict[tuple[int, ...], None] = {}
    for record in iter_jsonl(Path(path)):
        shape = record.get("shape") if record else None
        if isinstance(shape, list) and all(isinstance(n, int) for n in shape):
            shapes.setdefault(tuple(shape), None)
    return [list(s) for s in shapes]


def spec_from_environment(environ: dict[str, str] | None = None) -> LineSpec | None:
    """``$MLDBG_LINES`` parsed; None when unset; ValueError saying what is wrong."""
    raw = (environ if environ is not None else os.environ).get(ENV)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"${ENV} is not JSON: {exc}") from None
    return LineSpec.parse(data)


def writer_for(spec: LineSpec, run_dir: str) -> LineWriter:
    """The writer of this run's line records, in ``<run>/lines``."""
    return LineWriter(Path(run_dir) / LINES_DIR, spec.budget, read_targets(spec.targets))


def install(spec: LineSpec, control: ScopeControl, writer: LineWriter) -> LineTracker:
    """Watch this process's models for the scope; call ``finish()`` at the end."""
    from .zero_edit import watch

    tracker = LineTracker(spec, control, writer)
    watch(tracker)
    tracker.start()
    return tracker
