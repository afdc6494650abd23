"""Pair the entries of two sources: by name, then by what a port plausibly changed.

After exact names (with the map applied to B), two fallbacks pair the tensors of the
same module call and role: a bare ``out`` with the first element ``out.0`` of a tuple
(an attention that also returns its weights), and, when one tensor is left on each
side with the same number of elements, those two (``in.input_ids`` passed by keyword
in one run, ``in.0`` positionally in the other); with more tensors left, they pair in
order, each with the first unused tensor of the same shape (``hidden_states=`` with
``x``, while ``position_embeddings`` stays unpaired).  Two sources of one tensor each are
paired whatever their names.

Tensors of framework operations (captures made with ``ops=``) take no part: they are
aligned by value inside their module call (``ops.py``), and are only counted here.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ...errors import BAD_MAP
from ..read.sources import CompareInputError, Entry, Source
from .mapping import NameMap, split_name


@dataclass
class Pair:
    a: Entry
    b: Entry
    b_name: str  # B's name as stored (before the map)
    how: str  # "name", "tuple-first", "only-tensor", "shape-order", "single"


@dataclass
class Alignment:
    pairs: list[Pair]
    unpaired_a: list[str]
    unpaired_b: list[str]
    operations_a: int = 0  # operation tensors set aside for ops.py
    operations_b: int = 0


def _numel(entry: Entry) -> int:
    count = 1
    for n in entry.shape:
        count *= n
    return count


def align(a: Source, b: Source, names: NameMap) -> Alignment:
    operations_a = [e for e in a.entries if a.is_operation(e)]
    operations_b = [e for e in b.entries if b.is_operation(e)]
    a_entries = [e for e in a.entries if not names.ignored(e.name) and not a.is_operation(e)]
    b_by_name: dict[str, Entry] = {}
    for entry in b.entries:
        if b.is_operation(entry):
            continue
        mapped = names.to_a(entry.name)
        if names.ignored(mapped):
            continue
        if mapped in b_by_name:  # only a map can do this: names within a source are unique
            raise CompareInputError(
                f"the map sends {b_by_name[mapped].name!r} and {entry.name!r} of {b.label} "
                f"both to {mapped!r}; make the rules tell them apart, or ignore one",
                code=BAD_MAP,
            )
        b_by_name[mapped] = entry
    if len(a_entries) == 1 and len(b_by_name) == 1:
        (b_only,) = b_by_name.values()
        return Alignment(
            [Pair(a_entries[0], b_only, b_only.name, "single")],
            [],
            [],
            len(operations_a),
            len(operations_b),
        )

    matched: dict[str, tuple[Entry, str, str]] = {}  # A name -> (B entry, B mapped name, how)
    for entry in a_entries:
        if entry.name in b_by_name:
            matched[entry.name] = (b_by_name[entry.name], entry.name, "name")
    used = {mapped for _, mapped, _ in matched.values()}
    _pair_within_calls(
        [e for e in a_entries if e.name not in matched],
        {n: e for n, e in b_by_name.items() if n not in used},
        matched,
    )
    used = {mapped for _, mapped, _ in matched.values()}
    pairs = [
        Pair(entry, matched[entry.name][0], matched[entry.name][0].name, matched[entry.name][2])
        for entry in a_entries
        if entry.name in matched
    ]
    return Alignment(
        pairs,
        [e.name for e in a_entries if e.name not in matched],
        [n for n in b_by_name if n not in used],  # in A's terms: after the map
        len(operations_a),
        len(operations_b),
    )


def _group(names: list[str]) -> dict[tuple[str, int, str], list[str]]:
    groups: dict[tuple[str, int, str], list[str]] = defaultdict(list)
    for name in names:
        parts = split_name(name)
        if parts is not None:
            module, call, key = parts
            groups[(module, call, key.split(".", 1)[0])].append(name)
    return groups


def _pair_within_calls(
    a_left: list[Entry],
    b_left: dict[str, Entry],
    matched: dict[str, tuple[Entry, str, str]],
) -> None:
    a_by_name = {e.name: e for e in a_left}
    a_groups = _group(list(a_by_name))
    b_groups = _group(list(b_left))
    for group, a_names in a_groups.items():
        b_names = b_groups.get(group)
        if not b_names:
            continue
        module, call, role = group
        bare = f"{module}#{call}.{role}"
        first = f"{bare}.0"
        for x, y in ((bare, first), (first, bare)):
            if x in a_names and y in b_names:
                matched[x] = (b_left[y], y, "tuple-first")
                a_names = [n for n in a_names if n != x]
                b_names = [n for n in b_names if n != y]
        if (
            len(a_names) == 1
            and len(b_names) == 1
            and _numel(a_by_name[a_names[0]]) == _numel(b_left[b_names[0]])
        ):
            matched[a_names[0]] = (b_left[b_names[0]], b_names[0], "only-tensor")
            continue
        # Keyword in one run, positional in the other (``hidden_states=`` vs ``x``):
        # the tensors of one call pair in order, each with the first unused tensor of
        # the same shape (up to a channels-last permutation).
        a_sorted = sorted(a_names, key=lambda n: a_by_name[n].order)
        b_sorted = sorted(b_names, key=lambda n: b_left[n].order)
        taken: set[str] = set()
        for a_name in a_sorted:
            shape = tuple(a_by_name[a_name].shape)
            for b_name in b_sorted:
                if b_name in taken:
                    continue
                other = tuple(b_left[b_name].shape)
                if other == shape or _permuted(shape, other):
                    matched[a_name] = (b_left[b_name], b_name, "shape-order")
                    taken.add(b_name)
                    break


def _permuted(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> bool:
    from .transposes import layout_permutation

    return layout_permutation(shape_a, shape_b) is not None
