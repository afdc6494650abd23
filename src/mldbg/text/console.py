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
from collections.abc import Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

    from ..results import Call
    from ..verbs import Surface


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


# -- tables -----------------------------------------------------------------------------------

PIPED_WIDTH = 240  # piped output (an agent, a log file) has no width to respect: rows stay whole
SHRUNK = 4  # the narrowest an ellipsized column gets (its header's width when that is wider)
FOLDED = 16  # the narrowest a folded column (a value's summary) gets


def print_table(table: Table, keep: Collection[str] = (), fold: Collection[str] = ()) -> None:
    """Print ``table`` to fit the terminal, never splitting a name.

    The columns in ``keep`` (names: modules, runs, sessions, tensors) are as wide as their
    longest cell and never wrap; the others give way: those in ``fold`` wrap onto more
    lines, the rest are cut with an ellipsis, the widest first.  When even that cannot fit
    (a name wider than the terminal), the rows are printed wider than the terminal rather
    than cut: a terminal wraps the line, the name stays whole to copy.  Piped output is
    printed as on a terminal ``PIPED_WIDTH`` wide.
    """
    width = out.width if out.is_terminal else PIPED_WIDTH
    needed = _fit(table, width, set(keep), set(fold))
    stacked = needed > width and bool(keep)
    before = out.width
    out.width = width if stacked else max(width, needed)
    try:
        if stacked:
            _print_stacked(table, width, set(keep), set(fold))
        else:
            out.print(table)
    finally:
        out.width = before


STACK_INDENT = 2


def _print_stacked(table: Table, width: int, keep: set[str], fold: set[str]) -> None:
    """The names too wide to share a line with the other columns: each row's names on a
    line of their own, its other cells on the next, indented, under one header."""
    from rich.padding import Padding
    from rich.table import Table as RichTable

    columns = table.columns
    kept = [i for i, c in enumerate(columns) if str(c.header) in keep]
    rest = [i for i in range(len(columns)) if i not in kept]
    rows: list[tuple[RenderableType, ...]] = list(zip(*(c._cells for c in columns), strict=True))

    def part(cells: list[tuple[RenderableType, ...]], header: bool) -> RichTable:
        part = RichTable(
            box=None, pad_edge=False, show_header=header, header_style=table.header_style
        )
        for i in rest:
            c = columns[i]
            part.add_column(c.header, justify=c.justify, style=c.style)
        for cell in cells:
            part.add_row(*(cell[i] for i in rest))
        return part

    whole = part(rows, True)
    _fit(whole, width - STACK_INDENT, set(), fold)
    widths = [c.width for c in whole.columns]

    def shaped(cells: list[tuple[RenderableType, ...]], header: bool) -> Padding:
        one = part(cells, header)
        for column, fixed in zip(one.columns, widths, strict=True):
            column.width = fixed
            column.no_wrap = str(column.header) not in fold
            column.overflow = "fold" if str(column.header) in fold else "ellipsis"
        return Padding(one, (0, 0, 0, STACK_INDENT))

    if table.show_header:
        style = str(table.header_style or "")
        heads = "  ".join(escape(str(columns[i].header)) for i in kept)
        out.print(f"[{style}]{heads}[/]" if style else heads)
        out.print(shaped([], True))
    for row in rows:
        names = [row[i] for i in kept if _text_width(row[i])]
        together = sum(_text_width(n) for n in names) + 2 * (len(names) - 1) <= width
        for line in ["  ".join(map(str, names))] if together else names:
            out.print(line)
        if any(_text_width(row[i]) for i in rest):
            out.print(shaped([row], False))


def _fit(table: Table, width: int, keep: set[str], fold: set[str]) -> int:
    """Set every column's width for ``width``; returns the width the rows need."""
    columns = table.columns
    natural = [
        max([_text_width(c.header)] + [_text_width(cell) for cell in c._cells]) for c in columns
    ]
    pads = table._extra_width + sum(table._get_padding_width(i) for i in range(len(columns)))
    kept = [i for i, c in enumerate(columns) if str(c.header) in keep]
    rest = [i for i in range(len(columns)) if i not in kept]
    floors = {
        i: min(natural[i], FOLDED if str(columns[i].header) in fold else SHRUNK) for i in rest
    }
    for i in rest:
        floors[i] = max(floors[i], min(natural[i], _text_width(columns[i].header)))
    room = width - pads - sum(natural[i] for i in kept)
    widths = _water_fill({i: natural[i] for i in rest}, floors, room)
    for i, column in enumerate(columns):
        column.width = natural[i] if i in kept else widths[i]
        column.no_wrap = str(column.header) not in fold
        column.overflow = "fold" if str(column.header) in fold else "ellipsis"
    return pads + sum(c.width or 0 for c in columns)


def _water_fill(wanted: dict[int, int], floors: dict[int, int], room: int) -> dict[int, int]:
    """Widths within ``room``: the widest columns are cut first, none below its floor."""
    if sum(wanted.values()) <= room:
        return dict(wanted)
    level = max(wanted.values(), default=0)
    while level > 0 and sum(max(floors[i], min(n, level)) for i, n in wanted.items()) > room:
        level -= 1
    widths = {i: max(floors[i], min(n, level)) for i, n in wanted.items()}
    spare = room - sum(widths.values())
    for i in sorted(wanted, key=lambda i: wanted[i] - widths[i], reverse=True):
        if spare <= 0:
            break
        if widths[i] < wanted[i]:
            widths[i] += 1
            spare -= 1
    return widths


def _text_width(cell: object) -> int:
    """The widest line of a cell as shown (markup removed)."""
    from rich.text import Text

    text = cell if isinstance(cell, Text) else Text.from_markup(str(cell))
    return max((line.cell_len for line in text.split("\n")), default=0)


_out = _LazyConsole(highlight=False, soft_wrap=True)
_err = _LazyConsole(stderr=True, highlight=False, soft_wrap=True)
# what renderers print to: each a rich Console to them (every attribute is the console's)
out = cast("Console", _out)
err = cast("Console", _err)


_CAPTURE_LOCK = threading.Lock()
# Who reads what the renderers print: a person at the command line, or an agent through
# MCP (``captured(surface="mcp")``).  The calls an answer hands out (``next``, ``fix``, a
# hint's ``calls``) are worded for it: a command line, or a tool call.
_SURFACE: Surface = "cli"


def call_text(call: Mapping[str, object]) -> str:
    """A call an answer hands out, as the surface printing it makes it."""
    from .. import verbs

    return verbs.word(cast("Call", call), _SURFACE)


@contextlib.contextmanager
def captured(
    width: int = 120, terminal: bool = False, surface: Surface = "cli"
) -> Iterator[io.StringIO]:
    """Everything printed to ``out`` and ``err`` inside the block, as plain text in the
    yielded buffer (one capture at a time: the consoles are the process's).

    ``terminal``: printed as on a terminal that wide (renderers fit its width), still
    without escape codes.  ``surface``: who reads it (the calls it hands out are worded
    for them)."""
    from rich.console import Console

    global _SURFACE
    with _CAPTURE_LOCK:
        buffer = io.StringIO()
        console = Console(
            file=buffer,
            width=width,
            no_color=True,
            highlight=False,
            soft_wrap=True,
            force_terminal=terminal or None,
            color_system=None if terminal else "auto",
        )
        _out._redirect = _err._redirect = console
        _SURFACE = surface
        try:
            yield buffer
        finally:
            _out._redirect = _err._redirect = None
            _SURFACE = "cli"
