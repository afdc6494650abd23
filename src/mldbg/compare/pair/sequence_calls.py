"""Two generation loops that split a sequence into model calls differently.

transformers' ``generate`` runs the whole prompt in one model call, then one call per new
token.  mlx-lm's runs all of the prompt but its last token (in chunks of 2,048 when it is
longer), then the last token alone, then one call per new token, one call ahead of what
it returns.  Paired call by call (``model#0`` with ``model#0``), every entry of two such
captures differs in shape or compares one token with another, and a clean port fails.

With a cache, a call on positions ``[a, b)`` computes at every module the rows of those
positions: the same rows a call on a longer range computes for them (a causal model's
position never reads a later one).  So each side's top-level calls are grouped where the
positions they cover meet (A's call 0 on 8 positions with B's calls 0 and 1 on 7 + 1),
the tensors of a group's calls are joined along the sequence axis, and every module's
calls are numbered again group by group, the same on both sides: the comparison then
pairs the reference's prefill with the port's pieces of it, and each decoding step with
its counterpart.  A tensor one side computed for the last positions only (transformers
keeps the logits of the last position in a prefill) is compared with the other side's
last positions.

The positions come from the first module output inside each top-level call (an
embedding's ``[batch, sequence, hidden]``): its one axis whose size changes between
calls is the sequence; every other axis must agree on both sides, or nothing is
regrouped.  Tensors that do not split along the sequence (a mask of another shape) are
left out of a group of several calls, with the reason.  Summaries join by their
statistics, which combine exactly (their sketches do not): such an entry is compared by
the statistics' lower bound, as ranks' gathered summaries are.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypedDict

from ..read.gather import gathered_stats
from ..read.sources import Call, Entry, Source

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

MAX_GROUPS_LISTED = 100


class CallGroup(TypedDict):
    a: list[int]  # the top-level calls of A in this group
    b: list[int]
    positions: int  # how many sequence positions the group covers


class AlignedCalls(TypedDict):
    """How the comparison grouped the two sides' top-level calls (``calls_aligned``)."""

    module: str  # the top-level module whose calls were grouped
    groups: list[CallGroup]  # at most MAX_GROUPS_LISTED, the ones joining calls first
    groups_total: int
    unpaired_calls_a: list[int]  # top-level calls past the other side's last position
    unpaired_calls_b: list[int]
    left_out: dict[str, str]  # entry (A's or B's name) -> why it was not joined
    note: str


@dataclass
class _Joined:
    axis: int
    parts: list[Entry]
    keep_last: int | None = None  # compare only the last positions (the other side's)


@dataclass
class JoinedSource(Source):
    """A source whose calls were regrouped: a joined entry loads its parts' tensors,
    concatenated along the sequence axis (their last ``keep_last`` positions)."""

    base: Source | None = None
    joined: dict[str, _Joined] = field(default_factory=dict)

    def load(self, entry: Entry) -> npt.NDArray[np.generic]:
        import numpy as np

        assert self.base is not None
        join = self.joined.get(entry.name)
        if join is None:
            return self.base.load(entry)
        arrays = [np.asarray(self.base.load(part)) for part in join.parts]
        whole = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=join.axis)
        if join.keep_last is not None:
            index: list[Any] = [slice(None)] * whole.ndim
            index[join.axis] = slice(whole.shape[join.axis] - join.keep_last, None)
            whole = whole[tuple(index)]
        return whole


def align_calls(a: Source, b: Source) -> tuple[Source, Source, AlignedCalls | None]:
    """``a`` and ``b`` with their top-level calls regrouped where they split one sequence
    differently, and how; the sources unchanged (and None) where they do not."""
    tops_a, tops_b = _top_calls(a), _top_calls(b)
    if not tops_a or not tops_b or tops_a[0].module != tops_b[0].module:
        return a, b, None
    probes_a, probes_b = _probes(a, tops_a), _probes(b, tops_b)
    if any(p is None for p in probes_a) or any(p is None for p in probes_b):
        return a, b, None
    shapes = [list(p.shape) for p in (*probes_a, *probes_b) if p is not None]
    axis = _sequence_axis(shapes)
    if axis is None:
        return a, b, None
    lengths_a = [int(p.shape[axis]) for p in probes_a if p is not None]
    lengths_b = [int(p.shape[axis]) for p in probes_b if p is not None]
    groups, rest_a, rest_b = _group(lengths_a, lengths_b)
    if not groups or all(len(ga) == 1 and len(gb) == 1 for ga, gb, _n in groups):
        return a, b, None  # call for call already: nothing to regroup
    left_out: dict[str, str] = {}
    joined_a = _regroup(a, tops_a, [ga for ga, _gb, _n in groups], rest_a, lengths_a, left_out)
    joined_b = _regroup(b, tops_b, [gb for _ga, gb, _n in groups], rest_b, lengths_b, left_out)
    _trim_to_last_positions(joined_a, joined_b, left_out)
    listed = sorted(groups, key=lambda g: -(len(g[0]) + len(g[1])))[:MAX_GROUPS_LISTED]
    listed.sort(key=lambda g: g[0][0])
    several = [g for g in groups if len(g[0]) > 1 or len(g[1]) > 1]
    first = several[0]
    info: AlignedCalls = {
        "module": tops_a[0].module,
        "groups": [{"a": ga, "b": gb, "positions": n} for ga, gb, n in listed],
        "groups_total": len(groups),
        "unpaired_calls_a": rest_a,
        "unpaired_calls_b": rest_b,
        "left_out": dict(sorted(left_out.items())[:MAX_GROUPS_LISTED]),
        "note": (
            f"the two sides split the sequence into calls differently (A's calls "
            f"{'+'.join(map(str, first[0]))} cover the positions of B's calls "
            f"{'+'.join(map(str, first[1]))}, {first[2]} in all): each group's tensors "
            f"are joined along the sequence axis and its calls numbered as one"
            + (f"; {len(left_out)} tensors that do not split are left out" if left_out else "")
        ),
    }
    return joined_a, joined_b, info


def _top_calls(source: Source) -> list[Call]:
    """The top-level calls of one module (a capture's model), in order; empty for
    anything else (tensor files, several models, operations)."""
    tops = sorted(
        (c for c in source.calls.values() if c.parent is None and not c.is_operation),
        key=lambda c: c.seq,
    )
    if not tops or len({c.module for c in tops}) != 1:
        return []
    return tops


def _descendants(source: Source) -> dict[int, int]:
    """Each call's top-level ancestor, by ``seq``."""
    by_seq = {c.seq: c for c in source.calls.values()}
    top: dict[int, int] = {}
    for seq in sorted(by_seq):
        call = by_seq[seq]
        parent = call.parent
        top[seq] = seq if parent is None else top.get(parent, parent)
    return top


def _probes(source: Source, tops: list[Call]) -> list[Entry | None]:
    """For each top-level call, the first module output inside it (an embedding's)."""
    ancestors = _descendants(source)
    by_key = {(c.module, c.call): c for c in source.calls.values()}
    best: dict[int, Entry] = {}
    for entry in source.entries:
        if entry.role != "out" or entry.call_key is None:
            continue
        call = by_key.get(entry.call_key)
        if call is None or call.parent is None or call.is_operation:
            continue
        top = ancestors.get(call.seq)
        if top is not None and (top not in best or entry.order < best[top].order):
            best[top] = entry
    return [best.get(top.seq) for top in tops]


def _sequence_axis(shapes: list[list[int]]) -> int | None:
    """The one axis whose size varies over ``shapes`` while every other axis agrees."""
    if len({len(s) for s in shapes}) != 1 or not shapes[0]:
        return None
    varying = [i for i in range(len(shapes[0])) if len({s[i] for s in shapes}) > 1]
    return varying[0] if len(varying) == 1 else None


def _group(
    lengths_a: list[int], lengths_b: list[int]
) -> tuple[list[tuple[list[int], list[int], int]], list[int], list[int]]:
    """Group both sides' calls where the positions they cover meet; the calls past the
    last common boundary are left over."""
    groups: list[tuple[list[int], list[int], int]] = []
    i = j = 0
    while i < len(lengths_a) and j < len(lengths_b):
        ga, gb = [i], [j]
        sa, sb = lengths_a[i], lengths_b[j]
        i, j = i + 1, j + 1
        while sa != sb:
            if sa < sb and i < len(lengths_a):
                ga.append(i)
                sa += lengths_a[i]
                i += 1
            elif sb < sa and j < len(lengths_b):
                gb.append(j)
                sb += lengths_b[j]
                j += 1
            else:  # one side ran out inside a group: the rest is left over
                return groups, [*ga, *range(i, len(lengths_a))], [*gb, *range(j, len(lengths_b))]
        groups.append((ga, gb, sa))
    return groups, list(range(i, len(lengths_a))), list(range(j, len(lengths_b)))


def _regroup(
    source: Source,
    tops: list[Call],
    groups: list[list[int]],
    rest: list[int],
    lengths: list[int],
    left_out: dict[str, str],
) -> JoinedSource:
    """``source`` with each group of its top-level calls made one call of every module."""
    ancestors = _descendants(source)
    top_index = {call.seq: n for n, call in enumerate(tops)}
    # module -> top-level call index -> that module's calls inside it, in order
    inside: dict[str, dict[int, list[Call]]] = {}
    for call in sorted(source.calls.values(), key=lambda c: c.seq):
        top = top_index.get(ancestors.get(call.seq, -1))
        if top is not None:
            inside.setdefault(call.module, {}).setdefault(top, []).append(call)
    by_call: dict[tuple[str, int], list[Entry]] = {}
    for entry in source.entries:
        if entry.call_key is not None:
            by_call.setdefault(entry.call_key, []).append(entry)
    out = JoinedSource(
        source.spec,
        source.kind,
        source.path,
        source.label,
        meta=source.meta,
        warnings=list(source.warnings),
        base=source,
    )
    for module, per_top in inside.items():
        number = 0
        for group in [*groups, *([[r] for r in rest])]:
            pieces = [per_top.get(t, []) for t in group]
            counts = {len(p) for p in pieces}
            if len(counts) != 1:
                for piece in pieces:
                    for call in piece:
                        for entry in by_call.get((call.module, call.call), []):
                            left_out[f"{source.label}: {entry.name}"] = (
                                f"{module} is called a different number of times in the "
                                f"calls {group} it would join"
                            )
                continue
            for t in range(counts.pop()):
                parts = [piece[t] for piece in pieces]
                sizes = [lengths[g] for g in group]
                _join_call(out, source, parts, number, sizes, by_call, left_out)
                number += 1
    out.entries.sort(key=lambda e: e.order)
    return out


def _join_call(
    out: JoinedSource,
    source: Source,
    parts: list[Call],
    number: int,
    lengths: list[int],
    by_call: dict[tuple[str, int], list[Entry]],
    left_out: dict[str, str],
) -> None:
    """One call of the regrouped source, numbered ``number``, from ``parts`` (a module's
    calls inside the grouped top-level calls)."""
    first = parts[0]
    measured = [p.sensitivity for p in parts if p.sensitivity is not None]
    amplified = [p.amplification for p in parts if p.amplification is not None]
    call = replace(
        first,
        call=number,
        sensitivity=max(measured) if measured else None,
        amplification=max(amplified) if amplified else None,
    )
    out.calls[(call.module, number)] = call
    suffix_entries = [
        {_suffix(entry.name): entry for entry in by_call.get((p.module, p.call), [])} for p in parts
    ]
    for suffix, entry in suffix_entries[0].items():
        name = f"{call.module}#{number}.{suffix}"
        pieces = [found.get(suffix) for found in suffix_entries]
        if len(parts) == 1:
            out.entries.append(replace(entry, name=name, call=number))
            continue
        why = _why_not_joined(pieces, lengths)
        if isinstance(why, str):
            left_out[f"{source.label}: {entry.name}"] = why
            continue
        axis = why
        present = [p for p in pieces if p is not None]
        shape = list(entry.shape)
        shape[axis] = sum(int(p.shape[axis]) for p in present)
        stats = None
        if entry.stats is not None:  # summaries: their statistics join exactly, sketches not
            stats = gathered_stats(axis, [(source, p) for p in present])
        out.entries.append(replace(entry, name=name, call=number, shape=shape, stats=stats))
        out.joined[name] = _Joined(axis, present)


def _suffix(name: str) -> str:
    """``out.logits`` of ``model#3.out.logits``: the entry's name after its call number."""
    return name.rsplit("#", 1)[1].split(".", 1)[1]


def _why_not_joined(pieces: list[Entry | None], lengths: list[int]) -> int | str:
    """The axis the pieces join along (where their sizes are the calls' lengths and
    every other axis agrees), or why they cannot be joined."""
    if any(p is None for p in pieces):
        return "not in every call of the group"
    entries = [p for p in pieces if p is not None]
    if len({e.stats is None for e in entries}) != 1:
        return "a summary in some of the calls only"
    if len({len(e.shape) for e in entries}) != 1:
        return "its calls' tensors have different numbers of axes"
    for axis in range(len(entries[0].shape)):
        sizes = [int(e.shape[axis]) for e in entries]
        others = {tuple(e.shape[:axis] + e.shape[axis + 1 :]) for e in entries}
        if sizes == lengths and len(others) == 1:
            return axis
    return (
        f"no axis of its shapes ({', '.join(str(e.shape) for e in entries)}) follows the "
        f"calls' sequence lengths {lengths}"
    )


def _trim_to_last_positions(a: JoinedSource, b: JoinedSource, left_out: dict[str, str]) -> None:
    """Where one side kept only the last positions of a joined tensor (transformers
    computes a prefill's logits for its last position), compare the other side's last
    positions: a module call's one entry of a role, or entries of the same name."""
    for joined, other in ((a, b), (b, a)):
        mine = _by_role(joined)
        theirs = _by_role(other)
        named = {e.name: e for e in joined.entries}
        other_named = {e.name: e for e in other.entries}
        dropped: set[str] = set()
        for name, join in joined.joined.items():
            entry = named.get(name)
            if entry is None or entry.call_key is None:
                continue
            key = (*entry.call_key, entry.role)
            match = other_named.get(name)
            if match is None and len(mine.get(key, [])) == 1 and len(theirs.get(key, [])) == 1:
                match = theirs[key][0]
            if match is None or len(match.shape) != len(entry.shape):
                continue
            ax = join.axis
            same_elsewhere = all(
                int(x) == int(y)
                for i, (x, y) in enumerate(zip(entry.shape, match.shape, strict=True))
                if i != ax
            )
            if same_elsewhere and 0 < int(match.shape[ax]) < int(entry.shape[ax]):
                if entry.stats is not None:  # a summary's last positions are not kept
                    dropped.add(name)
                    left_out[f"{joined.label}: {name}"] = (
                        "a summary of all positions cannot be cut to the last ones the other "
                        "side kept"
                    )
                    continue
                join.keep_last = int(match.shape[ax])
                entry.shape = list(match.shape)
        if dropped:
            joined.entries = [e for e in joined.entries if e.name not in dropped]


def _by_role(source: JoinedSource) -> dict[tuple[str, int, str | None], list[Entry]]:
    found: dict[tuple[str, int, str | None], list[Entry]] = {}
    for entry in source.entries:
        if entry.call_key is not None:
            found.setdefault((*entry.call_key, entry.role), []).append(entry)
    return found
