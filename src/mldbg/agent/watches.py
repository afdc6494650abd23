"""Watch expressions: evaluated at every stop and shown with it (``watch EXPR``).

Each is compiled once when it is set (a syntax error is refused then), evaluated in the
stopped frame, and shown as one bounded line; an error is shown as the error, and an
expression that runs too long is interrupted, so a watch never blocks a stop.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from types import CodeType
from typing import TYPE_CHECKING, Protocol

from ..errors import BAD_ARGUMENT, BAD_EXPRESSION, NO_SUCH_WATCH, TOO_MANY_WATCHES, BreakpointError
from .compiling import compile_text

if TYPE_CHECKING:
    from .. import results as R

MAX_WATCHES = 32
VALUE_CHARS = 300
WATCH_TIMEOUT = 5.0  # seconds for all of a stop's watches... each, at most
_ids = itertools.count(1)


class WatchEvaluator(Protocol):
    """Where watches are evaluated: the paused thread (on its own thread, in its frame)."""

    def watch_value(self, watch_id: int, expression: str, code: CodeType) -> R.Watch: ...


@dataclass
class Watch:
    id: int
    expression: str
    code: CodeType

    def to_json(self) -> R.Watch:
        return {"id": self.id, "expression": self.expression}


class Watches:
    def __init__(self) -> None:
        self.items: dict[int, Watch] = {}
        self.lock = threading.Lock()

    def add(self, expression: str) -> Watch:
        expression = (expression or "").strip()
        if not expression:
            raise BreakpointError("watch needs an expression", code=BAD_ARGUMENT)
        with self.lock:
            for item in self.items.values():
                if item.expression == expression:
                    return item
            if len(self.items) >= MAX_WATCHES:
                raise BreakpointError(
                    f"at most {MAX_WATCHES} watch expressions; unwatch some first",
                    code=TOO_MANY_WATCHES,
                )
            try:
                code = compile_text(expression, "<watch>", "eval")
            except (SyntaxError, ValueError) as exc:
                message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
                raise BreakpointError(
                    f"watch {expression!r} is not a Python expression: {message}",
                    code=BAD_EXPRESSION,
                ) from None
            item = Watch(next(_ids), expression, code)
            self.items[item.id] = item
            return item

    def remove(self, id: int | None = None, expression: str | None = None) -> list[Watch]:
        with self.lock:
            if id is None and not expression:
                gone = list(self.items.values())
                self.items.clear()
                return gone
            for key, item in list(self.items.items()):
                if item.id == id or (expression and item.expression == expression.strip()):
                    return [self.items.pop(key)]
        known = ", ".join(f"#{w.id} {w.expression}" for w in self.items.values()) or "none"
        raise BreakpointError(
            f"no watch {('#' + str(id)) if id is not None else repr(expression)}; watches: "
            + known[:1000],
            code=NO_SUCH_WATCH,
        )

    def listing(self) -> list[R.Watch]:
        with self.lock:
            return [w.to_json() for w in self.items.values()]

    def evaluate(self, paused: WatchEvaluator) -> list[R.Watch]:
        """Every watch's value in the paused thread's selected frame (on that thread)."""
        with self.lock:
            items = list(self.items.values())
        return [paused.watch_value(item.id, item.expression, item.code) for item in items]
