"""Byte budgets: no text that reaches a client is unbounded.

Standard library only: the agent uses it too, to bound what it sends (an exception
message of 100 MB must not become a 100 MB reply).  Every cut is visible: the text
says how much was left out, and callers set ``truncated`` beside it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypedDict, TypeVar, cast

if TYPE_CHECKING:  # the call's shape, for the type checker (the agent never imports it)
    from .results import Call

MESSAGE = 2_000  # an error message or an exception's str()
TRACEBACK = 8_000  # a formatted traceback: its end matters most
VALUE = 4_000  # a repr or an eval result
OUTPUT_TAIL = 4_000  # the output tail carried in every state
OUTPUT = 16_384  # an output page
EVAL_OUTPUT = 8_000  # what an evaluation printed
ERROR = 12_000  # a whole error answer: a message, a traceback, and what else it carries


def cap(text: str, limit: int, keep: str = "head", dropped: int = 0) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` bytes of UTF-8, marker included, keeping its head
    or its tail.

    The cut is marked inside the text, so it can never be mistaken for the whole, and
    the marker says everything left out: ``dropped``, bytes the collector of ``text``
    already left out on the side not kept (a bounded buffer of output), and a marker of
    an earlier cut on that side (the agent caps a message, the daemon caps it again):
    one marker, the total (a 100 MB message read "…[26 bytes cut]…").  A text that fits
    is never cut again.
    """
    if not dropped and (
        len(text) <= limit // 4 or len(text.encode("utf-8", "surrogatepass")) <= limit
    ):
        return text, False
    earlier = _TAIL_MARK.match(text) if keep == "tail" else _HEAD_MARK.search(text)
    if earlier is not None:
        dropped += int(earlier[1])
        text = text[earlier.end() :] if keep == "tail" else text[: earlier.start()]
    data = text.encode("utf-8", "surrogatepass")
    room = max(limit - len(_marker(len(data) + dropped).encode()), 0)
    if keep == "tail":
        kept = data[len(data) - room :].decode("utf-8", "ignore")
    else:
        kept = data[:room].decode("utf-8", "ignore")
    left = len(data) - len(kept.encode("utf-8", "surrogatepass")) + dropped
    return (_marker(left) + kept if keep == "tail" else kept + _marker(left)), True


def _marker(left: int) -> str:
    return f"…[{left} bytes cut]…"


_HEAD_MARK = re.compile(r"…\[(\d+) bytes cut\]…$")  # ends a text whose head was kept
_TAIL_MARK = re.compile(r"^…\[(\d+) bytes cut\]…")  # starts one whose tail was kept


def capped(text: str, limit: int, keep: str = "head") -> str:
    return cap(text, limit, keep)[0]


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogate(match: re.Match[str]) -> str:
    point = ord(match.group())
    if 0xDC80 <= point <= 0xDCFF:  # a byte ``surrogateescape`` could not decode
        return f"\\x{point - 0xDC00:02x}"
    return f"\\u{point:04x}"


def encodable(value: object) -> object:
    """``value`` with every string (keys too) encodable as UTF-8.

    Python text can hold lone surrogates: ``os.fsdecode(b"caf\\xe9.txt")`` is how a
    file name that is not UTF-8 reads on Linux.  No UTF-8 writer takes them (the MCP SDK's
    stdout writer died on one), so they become visible escapes, ``caf\\xe9.txt``: the
    undecodable byte as ``\\xNN``, any other lone surrogate as ``\\udXXX``.  Values
    without one are returned as they are (the same objects).
    """
    if isinstance(value, str):
        return (
            _LONE_SURROGATE.sub(_escape_surrogate, value)
            if _LONE_SURROGATE.search(value)
            else value
        )
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encodable(item) for item in value]
    return value


def _size(value: object) -> int:
    return len(json.dumps(value, default=str))


MIN_ITEM = 512  # a list item is never cut below this: below it, fewer items are kept


def _fit(value: object, limit: int, path: str, cuts: dict[str, dict[str, int]]) -> object:
    """``value`` cut to about ``limit`` bytes of JSON, keeping its type: a string keeps a
    marked head, a list its items (each cut to its share, and only as many as fit), a dict
    its keys (the largest values cut first).  Each list that lost items is noted in
    ``cuts`` under its path, with how many of how many it kept."""
    size = _size(value)
    if size <= limit:
        return value
    if isinstance(value, str):
        return capped(value, max(limit - 64, 16))
    if isinstance(value, list):
        if not value:
            return value
        share = max(limit // len(value), MIN_ITEM)
        kept: list[object] = []
        used = 2
        for index, item in enumerate(value):
            room = min(share, limit - used)
            if room < min(MIN_ITEM, share):
                break
            item = _fit(item, room, f"{path}[{index}]", cuts)
            item_size = _size(item) + 2  # and its ", "
            if used + item_size > limit and kept:
                break
            kept.append(item)
            used += item_size
        if len(kept) < len(value):
            cuts[path or "."] = {"shown": len(kept), "total": len(value)}
        return kept
    if isinstance(value, dict):
        cut = dict(value)
        sizes = {key: _size(item) for key, item in cut.items()}
        for key in sorted(sizes, key=sizes.__getitem__, reverse=True):
            rest = _size(cut) - _size(cut[key])
            cut[key] = _fit(cut[key], max(limit - rest, MIN_ITEM // 4), f"{path}.{key}", cuts)
            if _size(cut) <= limit:
                break
        return cut
    return value  # a number, a bool, None: nothing to cut


Record = TypeVar("Record", bound=Mapping[str, object])


def shrink(record: Record, limit: int) -> Record:
    """``record`` as it is, or, if its JSON is over ``limit`` bytes, cut to fit without
    changing its shape: every value keeps its type (a list of sessions stays a list of
    session states, each cut to its share, and only as many as fit), so whatever reads
    the answer (the CLI's renderers, an MCP output schema) still can.  The cut record says
    so: ``truncated`` is true, and ``cut`` maps the path of each shortened list
    (``.sessions``) to ``{"shown", "total"}``."""
    if _size(record) <= limit:
        return record
    cuts: dict[str, dict[str, int]] = {}
    cut = _fit(dict(record), limit - 256, "", cuts)
    assert isinstance(cut, dict)  # a dict is cut to a dict
    cut["truncated"] = True
    if cuts:
        cut["cut"] = dict(list(cuts.items())[:8])
    # the same keys, each value of its own type (only shorter), and ``truncated``/``cut``,
    # which every record that may be cut declares
    return cast("Record", cut)


class PageInfo(TypedDict, total=False):
    """What a paged listing adds to its items (``results.Truncation``)."""

    total: int
    shown: int
    truncated: bool
    next: Call


def page_info(
    total: int, offset: int, shown: int, verb: str, args: Mapping[str, object]
) -> PageInfo:
    """The counts every paged listing carries, and the exact call that gets the next page.

    ``{"total", "shown", "truncated"}`` plus, when something is left after this page,
    ``"next": {"verb": verb, "args": {...args, "offset": offset + shown}}`` (arguments that
    are None are left out, so the call reads as a person would write it).
    """
    info: PageInfo = {
        "total": total,
        "shown": shown,
        "truncated": offset + shown < total,
    }
    if info["truncated"]:
        kept = {k: v for k, v in args.items() if v is not None}
        info["next"] = {"verb": verb, "args": {**kept, "offset": offset + shown}}
    return info
