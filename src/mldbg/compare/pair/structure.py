"""Identity modules one tree has and the other lacks: their siblings paired past them.

diffusers' ``FeedForward`` is ``net = [GELU, Dropout, Linear]``; a port that leaves the
dropout out (an identity at inference) has ``net = [GELU, Linear]``, so its ``net.1`` is
the reference's ``net.2``, and pairing by name put the port's ``Linear`` against the
reference's ``Dropout``: shapes differed, and a clean port failed.  The same holds for
``nn.Identity`` placeholders (a disabled norm) and for a port that keeps a dropout the
reference does not.

For each container whose children are numbered (``ModuleList``, ``Sequential``, an MLX
list), the children of both sides are lined up after dropping the identity modules
(``Dropout``, ``Identity``) from each; when the rest then match one for one, in order
and by output shape, each of B's children is renamed to the A child it lines up with.
The renames are applied after the user's map and reported (``structure`` in the
comparison), so nothing is paired silently.
"""

from __future__ import annotations

import re

from ..read.sources import Call, Source
from .mapping import NameMap, split_name
from .transposes import layout_permutation, merged_layout

IDENTITY = re.compile(r"^(Alpha|FeatureAlpha)?Dropout(\dd)?$|^Identity$")
_NUMBERED = re.compile(r"^(?:(?P<parent>.*)\.)?(?P<index>\d+)$")


def identity_shifts(a: Source, b: Source, names: NameMap) -> dict[str, str]:
    """B's module paths (in A's terms, after ``names``) to rename past identity modules,
    each to the A path it lines up with."""
    children_a = _numbered_children(a, NameMap())
    children_b = _numbered_children(b, names)
    shapes_a, shapes_b = _out_shapes(a, NameMap()), _out_shapes(b, names)
    shifts: dict[str, str] = {}
    for parent, ours in children_a.items():
        theirs = children_b.get(parent)
        if theirs is None or sorted(ours) == sorted(theirs):
            continue
        real_a = [i for i in sorted(ours) if not IDENTITY.match(ours[i])]
        real_b = [j for j in sorted(theirs) if not IDENTITY.match(theirs[j])]
        if len(real_a) != len(real_b) or real_a == real_b:
            continue
        pairs = [(_path(parent, j), _path(parent, i)) for i, j in zip(real_a, real_b, strict=True)]
        if not all(_same_shape(shapes_a.get(pa), shapes_b.get(pb)) for pb, pa in pairs):
            continue
        renamed = {pb: pa for pb, pa in pairs if pb != pa}
        taken = set(renamed.values())
        for j in sorted(theirs):  # B's own identities step aside from the names now taken
            if IDENTITY.match(theirs[j]) and _path(parent, j) in taken:
                renamed[_path(parent, j)] = f"{_path(parent, j)}~identity"
        shifts.update(renamed)
    return shifts


def _path(parent: str, index: int) -> str:
    return f"{parent}.{index}" if parent else str(index)


def _in_a(names: NameMap, call: Call) -> str:
    mapped = split_name(names.to_a(f"{call.module}#{call.call}.out"))
    return mapped[0] if mapped else call.module


def _numbered_children(source: Source, names: NameMap) -> dict[str, dict[int, str]]:
    """``{parent path: {index: class}}`` of the modules numbered within their parent."""
    found: dict[str, dict[int, str]] = {}
    for call in source.calls.values():
        if call.call != 0 or call.is_operation:
            continue
        match = _NUMBERED.match(_in_a(names, call))
        if match is not None:
            found.setdefault(match["parent"] or "", {})[int(match["index"])] = call.class_name
    return found


def _out_shapes(source: Source, names: NameMap) -> dict[str, tuple[int, ...]]:
    """Each module's first output shape (its first call), by path in A's terms."""
    paths = {(c.module, c.call): _in_a(names, c) for c in source.calls.values() if c.call == 0}
    found: dict[str, tuple[int, ...]] = {}
    for entry in source.entries:
        key = entry.call_key
        if entry.role == "out" and key in paths and paths[key] not in found:
            found[paths[key]] = tuple(entry.shape)
    return found


def _same_shape(a: tuple[int, ...] | None, b: tuple[int, ...] | None) -> bool:
    """Shapes that one layout change makes equal (unknown shapes do not forbid it)."""
    if a is None or b is None or a == b:
        return True
    if layout_permutation(a, b) is not None:
        return True
    return merged_layout(a, b, channels_last_b=True) is not None
