"""The script's threads as the user sees them: ``threads`` and ``thread N``.

When one thread stops, the others stop too at their next line of Python (as debugpy
does; ``--this-thread`` on a breakpoint keeps them running).  Each stopped thread
serves commands the way the thread that hit the breakpoint does, so ``thread N``
selects one and ``stack``/``vars``/``eval``/``step`` act on it.  A thread inside a long
call into C (a sleep, a lock, a big tensor op) stops when it returns to Python; until
then ``threads`` lists it as running.

Threads are never held inside the standard library (``threading``, ``queue``, ``logging``
and importlib hold locks between lines that an evaluation may need) nor in the agent's
own code: they are held at their next line outside it.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import threading
from typing import Any

from .paths import canonical_code_file, is_library_file, is_mldbg_file

AGENT_THREAD = "mldbg-agent"
MAX_THREADS = 100
_THREADING_FILE = canonical_code_file(threading.__file__)


def _stdlib_root() -> str | None:
    try:
        path = sysconfig.get_path("stdlib")
    except KeyError:
        return None
    return os.path.realpath(path) + os.sep if path else None


_STDLIB = _stdlib_root()


@functools.cache
def may_freeze_in(file: str) -> bool:
    """Can a thread be held at a line of this file without risking a deadlock?

    Not in the standard library: its code holds locks between lines (``queue``,
    ``logging``, ``threading``, importlib) that an evaluation on the stopped thread may need.
    Such a thread is held at its next line outside it.
    """
    if file.startswith("<") or file == _THREADING_FILE or is_mldbg_file(file):
        return False
    if _STDLIB and file.startswith(_STDLIB):
        parts = file.split(os.sep)
        return "site-packages" in parts or "dist-packages" in parts
    return True


def user_threads() -> dict[int, threading.Thread]:
    """The script's threads by ident; read without ``threading``'s lock (a held thread may own it)."""
    active: dict[int, threading.Thread] = dict(threading._active)  # type: ignore[attr-defined]
    return {ident: t for ident, t in active.items() if t.name != AGENT_THREAD}


def where(ident: int, frames: dict[int, Any]) -> dict[str, Any] | None:
    """A thread's innermost frame outside the agent, preferring the user's code."""
    frame = frames.get(ident)
    first = None
    while frame is not None:
        file = canonical_code_file(frame.f_code.co_filename)
        if not is_mldbg_file(file):
            info = {"file": file, "line": frame.f_lineno, "function": frame.f_code.co_name}
            if first is None:
                first = info
            if not is_library_file(file):
                return info if info is first else {**info, "innermost": first}
        frame = frame.f_back
    return first


def listing(stopped: int | None, held: set[int], selected: int | None) -> dict[str, Any]:
    frames = sys._current_frames()
    threads = user_threads()
    items = []
    for number, (ident, thread) in enumerate(threads.items(), start=1):
        items.append(
            {
                "number": number,
                "id": ident,
                "native_id": thread.native_id,
                "name": thread.name,
                "daemon": thread.daemon,
                "paused": ident == stopped or ident in held,
                "stopped_here": ident == stopped,
                "selected": ident == (selected if selected is not None else stopped),
                "where": where(ident, frames),
            }
        )
    shown = items[:MAX_THREADS]
    result: dict[str, Any] = {
        "threads": shown,
        "total": len(items),
        "shown": len(shown),
        "truncated": len(items) > len(shown),
        "pid": os.getpid(),
    }
    return result


def resolve(number_or_id: int) -> int | None:
    """``thread N``: N is the number ``threads`` shows, or a thread id."""
    threads = list(user_threads())
    if 1 <= number_or_id <= len(threads):
        return threads[number_or_id - 1]
    return number_or_id if number_or_id in threads else None
