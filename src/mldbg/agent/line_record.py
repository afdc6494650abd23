"""The line step's recorder: what each executed line computes, inside one scope.

``mldbg line`` runs a script again and records, only inside the culprit's scope (a
module's call: its forward and everything it calls; or the script's own lines between
two model calls), each value a line binds: a local it binds or rebinds, an attribute
it sets on an object it holds (``self.x = ...``), an item of a list or dict it grows,
the value a function returns.  The debugger's tracer backend delivers the events (the
recorder is one more :class:`~.tracer.TracerClient` concern of the debugger); outside
the scope nothing is enabled, so the script runs at the debugger's usual speed.

A line event says which line is *about* to run, so what a line bound is seen at the
next event of the same frame (or at its return): the frame's locals are compared, by
identity, with what they were.  Each record also says which earlier records the line
*read* (the names its statement loads, ``line_statements.py``), which is how the
analysis follows a difference through the code.  A value that is the very object of an
earlier record (a callee's return value bound by its caller, an argument) is an *alias*
of it, not a new value.

Only tensors (torch, MLX, numpy) and Python floats are values here; what to keep of
each (statistics, sketches) is the sink's business (``line_scope.py``), which alone
touches the frameworks.  Standard library only.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from types import CodeType, FrameType
from typing import Protocol

from .line_statements import Statement, statement_at

MAX_ITEMS = 16  # items of one container (list, tuple, dict) recorded
MAX_ATTRIBUTES = 512  # objects with more attributes are not watched for new ones
# Packages whose lines are plumbing, not the computation a port is compared by: their
# values are seen where the code that called them binds them.
PLUMBING = ("torch", "mlx", "numpy", "safetensors", "triton", "einops", "functorch", "jax")
TENSOR_MODULES = ("torch", "mlx.core", "numpy")


@dataclass
class Binding:
    """One value a line bound: where, under which name, and what it was computed from."""

    seq: int
    file: str
    line: int  # the first line of its statement
    function: str
    frame: int  # the frame's serial number in this scope (a function called twice: two)
    name: str  # ``q``, ``self.cache``, ``outs[3]``, ``return``, ``sdpa.probs``, ``in.timestep``
    kind: str  # local | attribute | item | return | argument | fused | input
    text: str  # the statement's first line
    reads: list[int]  # the seqs of the records its statement read
    alias: int | None = None  # the earlier record this is the very object of
    hit: int = 1  # the how-manieth value this line bound under this name in the scope


class BindingSink(Protocol):
    """Where bindings go (``line_scope.LineWriter``): it keeps what the budget allows."""

    def record(self, binding: dict[str, object], value: object) -> None:
        """A :class:`Binding` as a dict; ``value`` is None for an alias (its original
        holds the value)."""
        ...


class Backend(Protocol):
    """What the recorder needs of the tracer backend: line and return events from now on."""

    def arm_recording(self, frame: FrameType | None) -> None: ...

    def refresh(self) -> None: ...


@dataclass
class _Frame:
    serial: int
    file: str
    function: str
    statement: Statement | None = None  # the statement running now
    seen: dict[str, int] = field(default_factory=dict)  # name -> id of its value
    sizes: dict[str, int] = field(default_factory=dict)  # name -> len of a container
    bound: dict[str, tuple[int, ...]] = field(default_factory=dict)  # name -> its records
    attributes: dict[str, int] = field(default_factory=dict)  # self's attribute -> id
    returned: list[int] = field(
        default_factory=list
    )  # what calls of the running statement returned


@dataclass
class _Scope:
    thread: int
    codes: Callable[[CodeType, str], bool]  # which code objects run recorded


def _plumbing_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Directories whose code is never recorded: mldbg itself and the tensor frameworks
    (as the script imported them); and the standard library's, whose installed packages
    (``site-packages``, which a virtual environment keeps inside it) are not plumbing."""
    import os
    import sysconfig

    roots = {os.path.dirname(os.path.dirname(os.path.realpath(__file__)))}
    for name in PLUMBING:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None)
        if origin:
            roots.add(os.path.dirname(os.path.realpath(origin)))
        else:  # a namespace package (mlx): each of its directories
            for path in getattr(module, "__path__", None) or ():
                roots.add(os.path.realpath(path))
    standard = set()
    for key in ("stdlib", "platstdlib"):
        try:
            path = sysconfig.get_path(key)
        except KeyError:
            continue
        if path:
            standard.add(os.path.realpath(path))
    return (
        tuple(sorted(root + os.sep for root in roots)),
        tuple(sorted(root + os.sep for root in standard)),
    )


_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
# mldbg's bundled examples (the demo's and tutorial's port), inside mldbg's own directory
_EXAMPLES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "examples", ""
)


class LineRecorder:
    """The line step's part of the debugger: told by the scope (``line_scope.py``) when
    to record, fed every line and return event of the code it wants by the backend."""

    def __init__(self, sink: BindingSink, backend: Backend) -> None:
        self.sink = sink
        self.backend = backend
        self.scope: _Scope | None = None
        self._frames: dict[FrameType, _Frame] = {}
        self._serials = 0
        self._seq = 0
        # id(value) -> (its record, a weak reference to it): identity survives only while
        # the object lives, so a reused id is never taken for the old value
        self._known: dict[int, tuple[int, Callable[[], object]]] = {}
        self._attribute_records: dict[tuple[int, str], int] = {}
        self._hits: dict[tuple[str, int, str], int] = {}
        self._inside = False  # the sink is working: events it causes are not the script's
        self._roots: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        self._types: dict[type, str | None] = {}
        self.records = 0

    # -- the scope (line_scope.py) ----------------------------------------------------------

    @property
    def recording(self) -> bool:
        return self.scope is not None

    def records_thread(self, ident: int) -> bool:
        scope = self.scope
        return scope is not None and scope.thread == ident

    def open_module_scope(self) -> None:
        """Record this thread's calls from now on (the culprit's call starts here), in every
        function they reach except the frameworks' own plumbing."""
        self._roots = _plumbing_roots()
        self.scope = _Scope(threading.get_ident(), self._not_plumbing)
        self.backend.arm_recording(None)

    def open_site_scope(self, sites: list[tuple[str, int]], frame: FrameType | None = None) -> None:
        """Record the lines of the functions (or module) holding these ``(file, line)``
        sites, on this thread: the script's code around its model calls (glue)."""
        self._roots = _plumbing_roots()
        wanted: dict[str, set[int]] = {}
        for file, line in sites:
            wanted.setdefault(file, set()).add(line)

        # The trace function asks at every call; by id, since hashing a code object
        # hashes its constants too (the code is kept, so its id stays its own).
        decided: dict[int, tuple[CodeType, bool]] = {}

        def holds(code: CodeType, file: str) -> bool:
            lines = wanted.get(file)
            if lines is None:
                return False
            known = decided.get(id(code))
            if known is None:
                known = decided[id(code)] = (code, _holds_line(code, lines))
            return known[1]

        self.scope = _Scope(threading.get_ident(), holds)
        self.backend.arm_recording(frame)

    def close_scope(self) -> None:
        """Stop recording; what the running statements bound so far is not seen."""
        if self.scope is None:
            return
        self.scope = None
        self._frames.clear()
        self.backend.refresh()

    def _not_plumbing(self, code: CodeType, file: str) -> bool:
        frameworks, standard = self._roots
        if file.startswith(_EXAMPLES):  # mldbg's bundled example scripts are a user's code
            return True
        if file.startswith("<") or file.startswith(frameworks):
            return False
        return not file.startswith(standard) or any(part in file for part in _INSTALLED)

    # -- what the backend asks (through the debugger) ---------------------------------------

    def wants_code(self, code: CodeType, file: str) -> bool:
        scope = self.scope
        return scope is not None and scope.codes(code, file)

    def on_line(self, frame: FrameType, file: str, line: int) -> bool:
        """A line of wanted code is about to run; True: keep this line's events (another
        thread's events too: silencing a line silences it for every thread)."""
        scope = self.scope
        if scope is None:
            return False
        if self._inside or threading.get_ident() != scope.thread:
            return True
        if not scope.codes(frame.f_code, file):
            return True
        self._inside = True
        try:
            statement = statement_at(file, line)
            state = self._frames.get(frame)
            if state is None:
                state = self._enter(frame, file)
            elif state.statement is not None and (
                line == statement.start or statement is not state.statement
            ):
                self._completed(frame, state)
            state.statement = statement
        except Exception as exc:  # never an exception in the user's code
            _report(exc)
        finally:
            self._inside = False
        return True

    def on_return(self, frame: FrameType, value: object) -> None:
        """A recorded frame returns ``value``: its last statement completed, and what it
        returns is a value of that statement (its caller will bind it, as an alias)."""
        scope = self.scope
        state = self._frames.get(frame)
        if scope is None or state is None or threading.get_ident() != scope.thread:
            return
        if self._inside:
            return
        self._inside = True
        try:
            self._completed(frame, state)
            statement = state.statement
            if statement is not None and value is not None:
                reads = self._reads(frame, state, statement)
                values = [("", value)] if self._value_kind(value) is not None else _items(value)
                seqs = [
                    self._bind(state, statement, "return" + suffix, "return", item, reads)
                    for suffix, item in values
                    if self._value_kind(item) is not None
                ]
                caller = _recorded_caller(frame, self._frames)
                if caller is not None:  # the caller's running statement read these
                    caller[1].returned.extend(seqs)
        except Exception as exc:
            _report(exc)
        finally:
            self._inside = False
            self._frames.pop(frame, None)

    # -- what line_scope.py adds -------------------------------------------------------------

    def record_fused(self, parts: list[tuple[str, object]]) -> None:
        """Values a fused call computes on the way (the scores and probabilities of
        ``scaled_dot_product_attention``, by its definition), as values of the statement
        that called it, in the innermost recorded frame of this thread."""
        self._at_caller("fused", parts)

    def record_inputs(self, inputs: list[tuple[str, object]]) -> None:
        """The values a model call is about to receive (glue: the call that ends the
        scope), as values of the statement making the call."""
        self._at_caller("input", inputs)

    def _at_caller(self, kind: str, values: list[tuple[str, object]]) -> None:
        scope = self.scope
        if scope is None or threading.get_ident() != scope.thread or self._inside:
            return
        found = _innermost(self._frames)
        if found is None:
            return
        frame, state = found
        statement = state.statement
        if statement is None:
            return
        self._inside = True
        try:
            reads = self._reads(frame, state, statement)
            for name, value in values:
                if self._value_kind(value) is not None:
                    self._bind(state, statement, name, kind, value, reads)
        except Exception as exc:
            _report(exc)
        finally:
            self._inside = False

    # -- seeing what a line bound ---------------------------------------------------------

    def _enter(self, frame: FrameType, file: str) -> _Frame:
        """A frame's first recorded line: its arguments are values it was handed."""
        self._serials += 1
        code = frame.f_code
        state = _Frame(self._serials, file, getattr(code, "co_qualname", code.co_name))
        self._frames[frame] = state
        # Arguments are values of the caller's running statement; the scope's first frame
        # (the culprit's forward) has no recorded caller: its own ``def`` line then.
        caller = _recorded_caller(frame, self._frames) or (frame, state)
        if caller[1] is state:
            line = code.co_firstlineno
            state.statement = Statement(
                line, f"(arguments of {state.function})", frozenset(), frozenset()
            )
        count = code.co_argcount + code.co_kwonlyargcount
        count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
        arguments = set(code.co_varnames[:count])
        f_locals = frame.f_locals
        for name, value in list(f_locals.items()):
            state.seen[name] = id(value)
            if name not in arguments:
                continue
            seqs = self._handed(value, name, state, caller)
            if seqs:
                state.bound[name] = seqs
            if isinstance(value, list | dict):
                state.sizes[name] = len(value)
        self._watch_attributes(f_locals, state, None, ())
        state.statement = None
        return state

    def _handed(
        self,
        value: object,
        name: str,
        state: _Frame,
        caller: tuple[FrameType, _Frame],
    ) -> tuple[int, ...]:
        """The records an argument's value is (known objects), or a new record of it made
        by the caller's running statement (an expression passed straight in)."""
        values = _items(value) if self._value_kind(value) is None else [("", value)]
        seqs = []
        for suffix, item in values:
            if self._value_kind(item) is None:
                continue
            known = self._lookup(item)
            if known is not None:
                seqs.append(known)
                continue
            frame, outer = caller
            if outer.statement is None:
                continue
            statement = outer.statement
            assert statement is not None
            reads = self._reads(frame, outer, statement)
            label = f"{state.function}({name}{suffix})"
            seqs.append(self._bind(outer, statement, label, "argument", item, reads))
        return tuple(seqs)

    def _completed(self, frame: FrameType, state: _Frame) -> None:
        """The frame's running statement finished: record what it bound."""
        statement = state.statement
        if statement is None:
            return
        reads: list[int] | None = None
        f_locals = frame.f_locals
        for name, value in list(f_locals.items()):
            identity = id(value)
            if state.seen.get(name) == identity:
                if isinstance(value, list | dict) and len(value) != state.sizes.get(name):
                    if reads is None:
                        reads = self._reads(frame, state, statement)
                    self._grown(state, statement, name, value, reads)
                continue
            state.seen[name] = identity
            if isinstance(value, list | dict):
                state.sizes[name] = len(value)
            if self._value_kind(value) is not None:
                if reads is None:
                    reads = self._reads(frame, state, statement)
                seq = self._bind(state, statement, name, "local", value, reads)
                state.bound[name] = (seq,)
                continue
            items = _items(value)
            if not items:
                state.bound.pop(name, None)
                continue
            if reads is None:
                reads = self._reads(frame, state, statement)
            seqs = []
            for suffix, item in items:
                if self._value_kind(item) is not None:
                    seqs.append(self._bind(state, statement, name + suffix, "item", item, reads))
            state.bound[name] = tuple(seqs)
        self._watch_attributes(f_locals, state, statement, reads)
        state.returned.clear()

    def _grown(
        self, state: _Frame, statement: Statement, name: str, value: object, reads: list[int]
    ) -> None:
        """A list or dict the frame holds got items: the new ones are this line's values."""
        before = state.sizes.get(name, 0)
        assert isinstance(value, list | dict)
        state.sizes[name] = len(value)
        if isinstance(value, list):
            fresh = [(f"[{i}]", value[i]) for i in range(before, len(value))][:MAX_ITEMS]
        else:
            keys = list(value)[before:][:MAX_ITEMS]
            fresh = [(f"[{key!r}]", value[key]) for key in keys]
        seqs = list(state.bound.get(name, ()))
        for suffix, item in fresh:
            if self._value_kind(item) is not None:
                seqs.append(self._bind(state, statement, name + suffix, "item", item, reads))
        state.bound[name] = tuple(seqs)

    def _watch_attributes(
        self,
        f_locals: Mapping[str, object],
        state: _Frame,
        statement: Statement | None,
        reads: list[int] | tuple[()] | None,
    ) -> None:
        """``self.x = value`` (an attribute, or an MLX module's item): a value of the line."""
        owner = f_locals.get("self")
        if owner is None:
            return
        found = _attributes(owner)
        if found is None:
            return
        for attribute, value in found:
            identity = id(value)
            if state.attributes.get(attribute) == identity:
                continue
            state.attributes[attribute] = identity
            if statement is None or self._value_kind(value) is None:
                continue
            known = self._lookup(value)
            if known is not None and self._attribute_records.get((id(owner), attribute)) == known:
                continue
            line_reads = list(reads) if reads is not None else []
            seq = self._bind(state, statement, f"self.{attribute}", "attribute", value, line_reads)
            self._attribute_records[(id(owner), attribute)] = seq

    def _reads(self, frame: FrameType, state: _Frame, statement: Statement) -> list[int]:
        """The records a statement reads: the values of the names it loads, as last bound
        in this frame, the attributes it loads that a recorded line set, and what the
        calls it made returned."""
        seqs: list[int] = list(state.returned)
        for name in statement.reads:
            seqs.extend(state.bound.get(name, ()))
        if statement.attributes:
            f_locals = frame.f_locals
            for base, attribute in statement.attributes:
                owner = f_locals.get(base)
                if owner is None:
                    continue
                seq = self._attribute_records.get((id(owner), attribute))
                if seq is not None:
                    seqs.append(seq)
        return sorted(set(seqs))

    def _bind(
        self,
        state: _Frame,
        statement: Statement,
        name: str,
        kind: str,
        value: object,
        reads: list[int],
    ) -> int:
        known = self._lookup(value)
        self._seq += 1
        key = (state.file, statement.start, name)
        hit = self._hits[key] = self._hits.get(key, 0) + 1
        binding = Binding(
            self._seq,
            state.file,
            statement.start,
            state.function,
            state.serial,
            name,
            kind,
            statement.text,
            [known] if known is not None else reads,
            known,
            hit,
        )
        if known is None:
            self._remember(value, self._seq)
        self.records += 1
        self.sink.record(asdict(binding), None if known is not None else value)
        return self._seq

    # -- values ------------------------------------------------------------------------------

    def _value_kind(self, value: object) -> str | None:
        """``torch``, ``mlx``, ``numpy`` or ``float`` for a value the step records."""
        kind_of = type(value)
        if kind_of in self._types:
            return self._types[kind_of]
        kind = _kind(kind_of)
        self._types[kind_of] = kind
        return kind

    def _lookup(self, value: object) -> int | None:
        found = self._known.get(id(value))
        if found is None:
            return None
        seq, ref = found
        return seq if ref() is value else None

    def _remember(self, value: object, seq: int) -> None:
        try:
            ref: Callable[[], object] = weakref.ref(value)
        except TypeError:  # a float: kept (it is small), so its id stays its own
            ref = _Held(value)
        self._known[id(value)] = (seq, ref)


class _Held:
    """A strong reference with a weak reference's call."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __call__(self) -> object:
        return self.value


def _kind(cls: type) -> str | None:
    if cls is float:
        return "float"
    module = getattr(cls, "__module__", "") or ""
    for name in TENSOR_MODULES:
        if module == name or module.startswith(name + "."):
            framework = sys.modules.get(name)
            break
    else:
        return None
    if name == "torch":
        tensor = getattr(framework, "Tensor", None)
        parameter = getattr(getattr(framework, "nn", None), "Parameter", None)
        if tensor is None or not issubclass(cls, tensor):
            return None
        return None if parameter is not None and issubclass(cls, parameter) else "torch"
    if name == "mlx.core":
        array = getattr(framework, "array", None)
        return "mlx" if array is not None and issubclass(cls, array) else None
    ndarray = getattr(framework, "ndarray", None)
    generic = getattr(framework, "generic", None)
    if ndarray is not None and issubclass(cls, ndarray):
        return "numpy"
    if generic is not None and issubclass(cls, generic):
        return "numpy"
    return None


def _items(value: object) -> list[tuple[str, object]]:
    """The first items of a tuple, list or dict (``[0]``, ``['key']``), else []."""
    if isinstance(value, tuple | list):
        return [(f"[{i}]", item) for i, item in enumerate(value[:MAX_ITEMS])]
    if isinstance(value, dict) and type(value) is dict:
        return [(f"[{key!r}]", item) for key, item in list(value.items())[:MAX_ITEMS]]
    return []


def _attributes(owner: object) -> list[tuple[str, object]] | None:
    """An object's own attributes (and an MLX module's items, where it keeps arrays)."""
    found: list[tuple[str, object]] = []
    own = getattr(owner, "__dict__", None)
    if isinstance(own, dict):
        if len(own) > MAX_ATTRIBUTES:
            return None
        found.extend(own.items())
    if isinstance(owner, dict) and type(owner) is not dict:
        if len(owner) > MAX_ATTRIBUTES:
            return None
        found.extend((str(k), v) for k, v in dict.items(owner))
    return found


def _holds_line(code: CodeType, lines: set[int]) -> bool:
    """Whether ``code`` runs one of ``lines`` itself (not in a function it defines)."""
    return any(line in lines for _, _, line in code.co_lines() if line is not None)


def _recorded_caller(
    frame: FrameType, frames: dict[FrameType, _Frame]
) -> tuple[FrameType, _Frame] | None:
    outer = frame.f_back
    while outer is not None:
        state = frames.get(outer)
        if state is not None:
            return outer, state
        outer = outer.f_back
    return None


def _innermost(frames: dict[FrameType, _Frame]) -> tuple[FrameType, _Frame] | None:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        state = frames.get(frame)
        if state is not None:
            return frame, state
        frame = frame.f_back
    return None


def _report(exc: BaseException) -> None:
    stream = sys.__stderr__
    if stream is not None:
        stream.write(
            f"mldbg: internal error in the line recorder (the script goes on): "
            f"{type(exc).__name__}: {exc}\n"
        )
        stream.flush()
