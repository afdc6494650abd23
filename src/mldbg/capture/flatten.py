"""Stable names for the tensors inside a module's inputs and outputs.

A forward returns a tensor, a tuple, a dict, a ``ModelOutput``, a dataclass or a
namedtuple; parity needs the same name for the same tensor in two runs.  Names are
paths of keys and positions (``out.0``, ``out.logits``, ``in.hidden_states``); values
that are not tensors (None, caches, strings) are left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from ..summary import is_tensor

MAX_DEPTH = 6
MAX_TENSORS = 256


def flatten(value: Any, prefix: str) -> list[tuple[str, Any]]:
    """``(name, tensor)`` pairs in a stable order, at most ``MAX_TENSORS`` of them."""
    found: list[tuple[str, Any]] = []
    for item in _walk(value, prefix, 0):
        found.append(item)
        if len(found) >= MAX_TENSORS:
            break
    return found


def flatten_call(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """A call's inputs: positional ones by position, keyword ones by name."""
    pairs = flatten(args, "in") if args else []
    for key, value in kwargs.items():
        pairs.extend(flatten(value, f"in.{key}"))
    return pairs[:MAX_TENSORS]


def _walk(value: Any, prefix: str, depth: int) -> Iterator[tuple[str, Any]]:
    if is_tensor(value):
        yield prefix, value
        return
    if value is None or depth >= MAX_DEPTH or isinstance(value, str | bytes | int | float):
        return
    for key, item in _children(value):
        yield from _walk(item, f"{prefix}.{key}", depth + 1)


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
