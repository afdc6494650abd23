"""Exception breakpoints: ``break --raised [TYPE...]`` and ``break --uncaught [TYPE...]``.

``raised`` stops where an exception is raised, even if something catches it later.
Library frames are filtered like just-my-code stepping: an exception raised inside torch
or the standard library stops at the first frame of the user's code it passes through
(the line that called into the library), saying where it was raised; one caught inside
the library before reaching the user's code never stops.  Each exception stops at most
once, however many frames it passes through.

``uncaught`` is what the debugger always does (a post-mortem stop before the script
ends); with types, only those types stop there.

The tracer backends only report "raised in this frame" and "this frame received an
exception from a callee"; the decision is :meth:`ExceptionBreaks.should_stop`'s.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import BAD_ARGUMENT, BreakpointError

if TYPE_CHECKING:
    from .. import results as R

# Exceptions Python raises to drive control flow, never worth a stop unless named.
_CONTROL_FLOW = frozenset({"StopIteration", "StopAsyncIteration", "GeneratorExit"})


@dataclass
class ExceptionBreak:
    mode: str  # "raised" or "uncaught"
    types: tuple[str, ...] = ()
    id: int = 0
    hit_count: int = 0

    def to_json(self) -> R.BreakpointInfo:
        return {
            "id": self.id,
            "exception": self.mode,
            "types": list(self.types),
            "hit_count": self.hit_count,
        }

    def matches(self, exc: BaseException) -> bool:
        names = set()
        for klass in type(exc).__mro__:
            names.add(klass.__name__)
            names.add(klass.__qualname__)
            names.add(f"{klass.__module__}.{klass.__qualname__}")
        if self.types:
            return any(t in names for t in self.types)
        return isinstance(exc, Exception) and type(exc).__name__ not in _CONTROL_FLOW


def parse_types(types: str | Iterable[object] | None) -> tuple[str, ...]:
    """Type names from a list (``["ValueError", "torch.OutOfMemoryError"]``) or one string."""
    if types is None:
        return ()
    if isinstance(types, str):
        types = types.replace(",", " ").split()
    names = []
    for name in types:
        name = str(name).strip()
        if not name or name == "*":
            continue
        if not all(part.isidentifier() for part in name.split(".")):
            raise BreakpointError(
                f"{name!r} is not an exception type name (e.g. ValueError, torch.OutOfMemoryError)",
                code=BAD_ARGUMENT,
            )
        names.append(name)
    return tuple(dict.fromkeys(names))


@dataclass
class ExceptionBreaks:
    """The exception breakpoints of a session, and which exceptions already stopped."""

    items: dict[int, ExceptionBreak] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _seen: weakref.WeakSet[BaseException] = field(default_factory=weakref.WeakSet)
    _seen_ids: set[int] = field(default_factory=set)

    raising: bool = False  # must the tracers report raised exceptions at all? (hot path)

    def changed(self) -> None:
        """Recompute ``raising`` after ``items`` changed (the breakpoint table calls this)."""
        self.raising = any(item.mode == "raised" for item in self.items.values())

    def add(
        self, item: ExceptionBreak, ids: Iterator[int], keep_id: bool = False
    ) -> ExceptionBreak:
        """Set ``item``; one per mode: setting it again replaces it, under the old id
        unless ``keep_id`` (the daemon gave it the id it has in the script's process)."""
        with self.lock:
            old = next((o for o in self.items.values() if o.mode == item.mode), None)
            if old is not None:
                del self.items[old.id]
            if not keep_id:
                item.id = old.id if old is not None else next(ids)
            self.items[item.id] = item
            return item

    def match(self, mode: str, exc: BaseException) -> ExceptionBreak | None:
        for item in list(self.items.values()):
            if item.mode == mode and item.matches(exc):
                return item
        return None

    def uncaught_allows(self, exc: BaseException) -> bool:
        """Post-mortem stops happen unless an ``uncaught`` filter with types leaves this out."""
        filters = [i for i in self.items.values() if i.mode == "uncaught" and i.types]
        return not filters or any(i.matches(exc) for i in filters)

    def first_time(self, exc: BaseException) -> bool:
        """True once per exception object: it stops at one frame, not at every frame."""
        try:
            if exc in self._seen:
                return False
            self._seen.add(exc)
            return True
        except TypeError:  # not weak-referenceable: fall back to its id
            if id(exc) in self._seen_ids:
                return False
            self._seen_ids.add(id(exc))
            return True
