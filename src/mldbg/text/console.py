"""The CLI's two consoles (stdout, stderr) and the few rich helpers every renderer uses.

Kept apart from the renderers so that ``render`` and ``compare_render`` both build on it
without importing each other.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


class _LazyConsole:
    """A rich ``Console`` made on first use: importing rich costs more than the rest of a
    CLI command (~60 ms), and a command that prints a plain value never needs it.

    Every renderer prints through the two module-level instances, so :func:`captured` can
    send all of their output to a buffer (MCP's text form) by redirecting these two
    objects, whatever module the renderer lives in.
    """

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None
        self._redirect: Console | None = None

    def _made(self) -> Console:
        if self._redirect is not None:
            return self._redirect
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._made(), name)

    def __setattr__(self, name: str, value: object) -> None:
        # ``out.width = 240`` must reach the console, not stick to this wrapper
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._made(), name, value)


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


# C0 controls but the tab, DEL and the C1 controls: what a terminal acts on instead of showing.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def one_line(text: str) -> str:
    """:func:`escape`, and every control character made visible (``\\n``, ``\\x1b``): for
    a name from a file someone else wrote (a capture's directory or index), which must
    stay on its row and may not drive the terminal (an ESC sequence, a bell)."""
    return escape(_CONTROL.sub(lambda m: repr(m.group())[1:-1], text))


if not TYPE_CHECKING:  # rich's Table to the type checker; imported when first used

    def Table(*args, **kwargs):  # noqa: N802
        from rich.table import Table as RichTable

        return RichTable(*args, **kwargs)


def plain_line(text: str) -> None:
    """Print ``text`` as it is (no markup, no emoji codes): without rich while ``out`` is
    the process's own console and rich is not loaded yet."""
    if _out._console is None and _out._redirect is None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    else:
        out.print(escape(text))


_out = _LazyConsole(highlight=False, soft_wrap=True)
_err = _LazyConsole(stderr=True, highlight=False, soft_wrap=True)
# what renderers print to: each a rich Console to them (every attribute is the console's)
out = cast("Console", _out)
err = cast("Console", _err)


_CAPTURE_LOCK = threading.Lock()
_SURFACE = ["cli"]  # who the text is for: calls are worded for it (text/calls.py)


def surface() -> str:
    """``cli``, or ``mcp`` while the MCP server renders an answer's text."""
    return _SURFACE[-1]


@contextlib.contextmanager
def captured(width: int = 120, surface: str = "cli") -> Iterator[io.StringIO]:
    """Everything printed to ``out`` and ``err`` inside the block, as plain text in the
    yielded buffer (one capture at a time: the consoles are the process's), with the
    calls it names worded for ``surface``."""
    from rich.console import Console

    with _CAPTURE_LOCK:
        buffer = io.StringIO()
        console = Console(file=buffer, width=width, no_color=True, highlight=False, soft_wrap=True)
        _out._redirect = _err._redirect = console
        _SURFACE.append(surface)
        try:
            yield buffer
        finally:
            _SURFACE.pop()
            _out._redirect = _err._redirect = None
