"""The function and generator objects of given source files, in the live process.

Setting a breakpoint that is compiled into code means finding every function object
(and suspended generator) made from that file.  A pass over ``gc.get_objects()`` in
Python costs ~0.25 s in a process that imported torch and transformers (hundreds of
thousands of objects), on every breakpoint change.  What matters is much smaller:

* every function defined in a module has that module's namespace as ``__globals__``,
  closures and decorated originals included, so ``gc.get_referrers(namespace)`` finds
  them all in one pass in C (about 4x cheaper);
* generators refer to their code object, so a second pass, only when the file has
  generator or coroutine code, finds the suspended ones.

A file that no module in ``sys.modules`` comes from (run through ``exec`` with other
globals) falls back to the full scan: finding fewer functions would miss breakpoints.
"""

from __future__ import annotations

import gc
import sys
import types
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import CodeType, FunctionType

from ..errors import InterpreterUnsupported
from .instrument import Instrumented
from .paths import canonical_code_file

GENERATOR_CODE = {
    types.GeneratorType: ("gi_code", "gi_frame", "gi_running"),
    types.CoroutineType: ("cr_code", "cr_frame", "cr_running"),
    types.AsyncGeneratorType: ("ag_code", "ag_frame", "ag_running"),
}
_SUSPENDING = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR


@dataclass
class Applied:
    """What one file's instrumented code changed in the live process, to undo it exactly:
    the function objects given new code, and the constants (nested code objects) replaced
    in code that frames are still running.  Shared by both backends that compile into
    code (3.10/3.11 breakpoints, 3.12+ conditions)."""

    instr: Instrumented
    swapped: list[tuple[weakref.ref[FunctionType], CodeType, CodeType]] = field(
        default_factory=list
    )
    consts: list[tuple[CodeType, int, object, object]] = field(default_factory=list)

    def patch_consts(
        self,
        holder: CodeType,
        plain_of: Callable[[CodeType], CodeType],
        replace_const: Callable[[CodeType, int, object], object],
    ) -> None:
        """Frames already running ``holder`` create their nested functions from its
        constants: give those the instrumented code too."""
        for index, const in enumerate(holder.co_consts):
            if not isinstance(const, CodeType):
                continue
            new = self.instr.changed.get(plain_of(const))
            if new is None or new is const:
                continue
            try:
                old = replace_const(holder, index, new)
            except (InterpreterUnsupported, IndexError):
                continue
            self.consts.append((holder, index, old, new))

    def undo(
        self,
        functions: Iterable[FunctionType],
        replace_const: Callable[[CodeType, int, object], object],
    ) -> None:
        """Put back every constant and function code this changed, and the code of
        ``functions`` made from instrumented code since (closures, later imports)."""
        for holder, index, old, new in reversed(self.consts):
            if index < len(holder.co_consts) and holder.co_consts[index] is new:
                replace_const(holder, index, old)
        restored: dict[int, CodeType] = {}
        for ref, old_code, new_code in self.swapped:
            restored[id(new_code)] = old_code
            func = ref()
            if func is not None and func.__code__ is new_code:
                func.__code__ = old_code
        origin = self.instr.origin
        for func in functions:
            entry = origin.get(id(func.__code__))
            if entry is not None and entry[0] is func.__code__:
                try:
                    func.__code__ = restored.get(id(entry[0]), entry[1])
                except ValueError:
                    continue


@dataclass
class Live:
    """Function and generator objects of the files asked for, by canonical file."""

    functions: dict[str, list[FunctionType]] = field(default_factory=dict)
    generators: dict[str, list[object]] = field(default_factory=dict)  # and coroutines


def scan(files: set[str], known_codes: Iterable[CodeType] = ()) -> Live:
    """Functions and generators whose code comes from ``files`` (canonical paths).

    ``known_codes``: code objects of those files no function may hold any more (the
    plain code an instrumented function replaced), whose generators must be found too.
    """
    live = Live()
    if not files:
        return live
    namespaces = _namespaces(files)
    if namespaces is None:
        return _full_scan(files)
    seen: set[int] = set()
    suspending: dict[int, CodeType] = {}
    for code in known_codes:
        _suspending_codes(code, suspending)
    for obj in gc.get_referrers(*namespaces):
        if type(obj) is not FunctionType or id(obj) in seen:
            continue
        seen.add(id(obj))
        file = canonical_code_file(obj.__code__.co_filename)
        if file in files:
            live.functions.setdefault(file, []).append(obj)
            _suspending_codes(obj.__code__, suspending)
    if suspending:
        for obj in gc.get_referrers(*suspending.values()):
            kind = type(obj)
            if kind in GENERATOR_CODE:
                code = getattr(obj, GENERATOR_CODE[kind][0])
                file = canonical_code_file(code.co_filename)
                if file in files:
                    live.generators.setdefault(file, []).append(obj)
    return live


def _namespaces(files: set[str]) -> list[dict[str, object]] | None:
    """The namespaces of the modules loaded from ``files``; None if one file has none."""
    found: dict[str, list[dict[str, object]]] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str):
            continue
        file = canonical_code_file(path)
        if file in files:
            namespace = getattr(module, "__dict__", None)
            if isinstance(namespace, dict):
                found.setdefault(file, []).append(namespace)
    if set(found) != files:
        return None
    return [namespace for spaces in found.values() for namespace in spaces]


def _suspending_codes(code: CodeType, into: dict[int, CodeType]) -> None:
    if code.co_flags & _SUSPENDING:
        into[id(code)] = code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            _suspending_codes(const, into)


def _full_scan(files: set[str]) -> Live:
    live = Live()
    for obj in gc.get_objects():
        kind = type(obj)
        if kind is FunctionType:
            file = canonical_code_file(obj.__code__.co_filename)
            if file in files:
                live.functions.setdefault(file, []).append(obj)
        elif kind in GENERATOR_CODE:
            code = getattr(obj, GENERATOR_CODE[kind][0])
            file = canonical_code_file(code.co_filename)
            if file in files:
                live.generators.setdefault(file, []).append(obj)
    return live
