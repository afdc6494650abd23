"""Stable names for the tensors inside a module's inputs and outputs.

A forward returns a tensor, a tuple, a dict, a ``ModelOutput``, a dataclass or a
namedtuple; parity needs the same name for the same tensor in two runs.  Names are
paths of keys and positions (``out.0``, ``out.logits``, ``in.hidden_states``); values
that are not tensors (None, caches, strings) are left out.

Nothing is dropped silently: tensors past ``MAX_TENSORS`` in one call, or nested deeper
than ``MAX_DEPTH``, are reported in ``skipped``; a key whose name another tensor of the
call already has (``{"a.b": t}`` beside ``{"a": {"b": t}}``) gets a ``~2`` suffix,
reported in ``renamed``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..summary import is_tensor

MAX_DEPTH = 6
MAX_TENSORS = 256
_SEARCH_BUDGET = 10_000  # containers looked into below MAX_DEPTH to tell whether tensors hide there


@dataclasses.dataclass
class Flat:
    """The tensors of one call's inputs or outputs, and what could not be named as is."""

    pairs: list[tuple[str, Any]] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> why not recorded
    renamed: dict[str, str] = dataclasses.field(default_factory=dict)  # new name -> why


def flatten(value: Any, prefix: str) -> Flat:
    """``(name, tensor)`` pairs in a stable order, at most ``MAX_TENSORS`` of them."""
    walker = _Walker()
    walker.walk(value, prefix, 0)
    return walker.done()


def flatten_call(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Flat:
    """A call's inputs: positional ones by position, keyword ones by name."""
    walker = _Walker()
    if args:
        walker.walk(args, "in", 0)
    for key, value in kwargs.items():
        walker.walk(value, f"in.{key}", 1)
    return walker.done()


class _Walker:
    def __init__(self) -> None:
        self.flat = Flat()
        self.names: set[str] = set()
        self.over = 0
        self.first_over: str | None = None

    def walk(self, value: Any, prefix: str, depth: int) -> None:
        if is_tensor(value):
            self.add(prefix, value)
            return
        if value is None or isinstance(value, str | bytes | int | float):
            return
        children = _children(value)
        if not children:
            return
        if depth >= MAX_DEPTH:
            found = _holds_tensor(children)
            if found is not False:
                self.flat.skipped[prefix] = (
                    f"nested more than {MAX_DEPTH} levels deep: the tensors inside are not recorded"
                    if found
                    else f"nested more than {MAX_DEPTH} levels deep: not looked into"
                )
            return
        for key, item in children:
            self.walk(item, f"{prefix}.{key}", depth + 1)

    def add(self, name: str, tensor: Any) -> None:
        if len(self.flat.pairs) >= MAX_TENSORS:
            self.over += 1
            if self.first_over is None:
                self.first_over = name
            return
        if name in self.names:
            original, n = name, 2
            while f"{original}~{n}" in self.names:
                n += 1
            name = f"{original}~{n}"
            self.flat.renamed[name] = (
                f"named {original!r} like another tensor of this call (a key holding '.')"
            )
        self.names.add(name)
        self.flat.pairs.append((name, tensor))

    def done(self) -> Flat:
        if self.first_over is not None:
            self.flat.skipped[self.first_over] = (
                f"over the limit of {MAX_TENSORS} tensors per call: this tensor and the "
                f"{self.over - 1} after it are not recorded"
            )
        return self.flat


def _children(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping):  # dicts, and transformers' ModelOutput (an OrderedDict)
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return [(name, getattr(value, name)) for name in value._fields]
    if isinstance(value, list | tuple):
        return [(str(i), v) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value)]
    return []


def _holds_tensor(children: list[tuple[str, Any]]) -> bool | None:
    """Whether a tensor lies somewhere below; None when the search ran out of budget."""
    pending = [value for _key, value in children]
    seen: set[int] = set()
    budget = _SEARCH_BUDGET
    while pending:
        value = pending.pop()
        if is_tensor(value):
            return True
        if value is None or isinstance(value, str | bytes | int | float) or id(value) in seen:
            continue
        seen.add(id(value))
        budget -= 1
        if budget < 0:
            return None
        pending.extend(item for _key, item in _children(value))
    return False
