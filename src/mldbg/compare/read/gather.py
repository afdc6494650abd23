"""Compare a model split over ranks (tensor parallel, FSDP) with a one-process reference.

Under torchrun every rank captures its own part of the model as ``NAME@rank<r>``
(``capture.json`` says ``rank`` and ``world_size``).  Given the captures of all ranks
(``"tp@rank*"``) and, per tensor, how the ranks split it, this makes one source that
looks like the whole model's capture:

* a dimension (``-1``, ``0``…): the ranks hold consecutive slices along it (a
  column-parallel linear's output, the next row-parallel linear's input), concatenated
  in rank order;
* ``"sum"``: each rank holds a partial sum (a row-parallel linear's output before its
  all-reduce), added up;
* not declared: every rank holds the whole tensor (replicated: inputs, norms, outputs
  after an all-reduce); rank 0's is used.

Rules are globs on entry names (``*.fc1#*.out*``) or module paths (``*.fc1``), first
match wins.  Calls and order are rank 0's: tensor parallelism runs the same module calls
on every rank.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from ...errors import BAD_RANKS, BAD_SHARDS, UNKNOWN_SOURCE
from .sources import CompareInputError, Entry, Source, find_captures, open_capture

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# The limits on ``shards`` the verb table declares for the daemon (verbs.SHARD_RULES_LIMIT,
# verbs.TEXT_LIMIT; a test holds them equal), checked here for the Python API too.
SHARD_RULES_LIMIT = 100
PATTERN_LIMIT = 4_096
# A capture as ``find_captures`` lists it: its capture.json's fields, ``name`` and ``path``.
CaptureMeta: TypeAlias = "dict[str, Any]"


@dataclass
class _Split:
    rule: int | str  # a dimension, or "sum"
    parts: list[tuple[Source, Entry]]


@dataclass
class GatheredSource(Source):
    """A capture assembled from the captures of several ranks."""

    splits: dict[str, _Split] = field(default_factory=dict)

    def load(self, entry: Entry) -> npt.NDArray[np.generic]:
        import numpy as np

        split = self.splits.get(entry.name)
        if split is None:
            return super().load(entry)
        arrays = [source.load(part) for source, part in split.parts]
        if split.rule == "sum":
            return np.sum([np.asarray(a, dtype=np.float64) for a in arrays], axis=0)
        return np.concatenate([np.asarray(a) for a in arrays], axis=int(split.rule))


def check_shards(shards: Mapping[str, object]) -> dict[str, int | str]:
    """The rules, checked: at most ``SHARD_RULES_LIMIT``, each a glob and a dimension
    or ``"sum"``."""
    if not isinstance(shards, Mapping):
        raise CompareInputError(
            "shards: a mapping of globs to a dimension or 'sum'", code=BAD_SHARDS
        )
    if len(shards) > SHARD_RULES_LIMIT:
        raise CompareInputError(
            f"shards: {len(shards)} rules, more than the limit of {SHARD_RULES_LIMIT}",
            code=BAD_SHARDS,
        )
    rules: dict[str, int | str] = {}
    for pattern, rule in shards.items():
        if not isinstance(pattern, str) or not pattern or len(pattern) > PATTERN_LIMIT:
            raise CompareInputError(
                f"shards: keys are globs on entry names or module paths, 1 to {PATTERN_LIMIT} "
                "characters",
                code=BAD_SHARDS,
            )
        if rule == "sum" or (isinstance(rule, int) and not isinstance(rule, bool)):
            rules[pattern] = rule
        else:
            raise CompareInputError(
                f"shards: {pattern!r} takes a dimension (an integer) or 'sum', not {rule!r}",
                code=BAD_SHARDS,
            )
    return rules


def ranked_captures(spec: str, home: Path) -> list[CaptureMeta]:
    """The newest capture of each name matching ``spec`` (``tp@rank*``), in rank order,
    checked to be one model's ranks (:func:`check_rank_set`)."""
    newest: dict[str, CaptureMeta] = {}
    for meta in find_captures(home):  # oldest first: the newest of each name wins
        if fnmatch.fnmatchcase(str(meta["name"]), spec):
            newest[str(meta["name"])] = meta
    if not newest:
        raise CompareInputError(
            f"no captures match {spec!r} (ranks are captured as NAME@rank0, NAME@rank1, …)",
            code=UNKNOWN_SOURCE,
        )
    ranked = sorted(newest.values(), key=lambda m: (_rank_of(m), str(m["name"])))
    check_rank_set(spec, ranked)
    return ranked


MAX_NAMED = 20  # ranks and captures named in a message
MAX_LISTED = 1000  # missing ranks listed in the error's fields (``missing_count``: all)
MAX_WORLD = 1 << 20  # a larger rank or world size is no run's: a stray capture (and the
# ranks to look for stay countable: a capture.json saying rank 10**20 made that a hang)


def check_rank_set(spec: str, ranked: list[CaptureMeta]) -> None:
    """``bad_ranks`` unless the captures are each rank of one world exactly once.

    Gathered, a missing rank (a process that crashed before capturing), a rank captured
    twice (``NAME@rank1`` and ``NAME@rank1-2``) or a stray capture (a rank of another
    run, past the world size, or none at all) makes a model that is not the model:
    compare named a culprit from the wrong slices.  The world size is what the captures'
    ``capture.json`` says (most of them, when they disagree), else one past the highest
    rank; the error names every capture that does not fit and what is missing."""
    census = _RankCensus.of(ranked)
    world = census.world()
    stray = census.stray(world)
    missing = [r for r in range(world) if r not in census.ranks]
    duplicates = {r: names for r, names in sorted(census.ranks.items()) if len(names) > 1}
    if not (missing or duplicates or stray):
        return
    said = []
    if missing:
        listed = ", ".join(str(r) for r in missing[:MAX_NAMED])
        more = f" and {len(missing) - MAX_NAMED} more" if len(missing) > MAX_NAMED else ""
        ranks = "ranks" if len(missing) > 1 else "rank"
        said.append(f"{ranks} {listed}{more} of a world of {world} missing")
    for rank, names in list(duplicates.items())[:MAX_NAMED]:
        said.append(f"rank {rank} captured more than once ({', '.join(names[:MAX_NAMED])})")
    said.extend(list(stray.values())[:MAX_NAMED])
    raise CompareInputError(
        f"{spec}: the captures are not one model's ranks: {'; '.join(said)}. Capture the "
        "ranks again, or name the ones to gather with a narrower glob (NAME@rank[0-3])",
        code=BAD_RANKS,
        world_size=world,
        missing=missing[:MAX_LISTED],
        missing_count=len(missing),
        duplicates={str(r): names for r, names in duplicates.items()},
        stray=sorted(stray),
    )


@dataclass
class _RankCensus:
    """Who says which rank and which world size, capture by capture."""

    ranks: dict[int, list[str]] = field(default_factory=dict)  # rank: the captures saying it
    worlds: dict[int, list[str]] = field(default_factory=dict)  # world size: the captures
    rankless: list[str] = field(default_factory=list)  # captures that say no rank

    @classmethod
    def of(cls, ranked: list[CaptureMeta]) -> _RankCensus:
        census = cls()
        for meta in ranked:
            name, rank, world = str(meta["name"]), _rank_number(meta), meta.get("world_size")
            if isinstance(world, int) and not isinstance(world, bool) and 0 < world <= MAX_WORLD:
                census.worlds.setdefault(world, []).append(name)
            if rank is None or rank >= MAX_WORLD:
                census.rankless.append(name)
            else:
                census.ranks.setdefault(rank, []).append(name)
        return census

    def world(self) -> int:
        """The world size most captures say, else one past the highest rank."""
        if self.worlds:
            return max(self.worlds, key=lambda w: (len(self.worlds[w]), w))
        return max(self.ranks, default=-1) + 1

    def stray(self, world: int) -> dict[str, str]:
        """The captures that are no rank of ``world``, each with why."""
        found = {
            name: f"{name} is no rank's capture (no rank below {MAX_WORLD} in its "
            "capture.json or name)"
            for name in self.rankless
        }
        for other, names in self.worlds.items():
            for name in names if other != world else ():
                found[name] = f"{name} says a world size of {other}, the others {world}"
        for rank, names in self.ranks.items():
            for name in names if rank >= world else ():
                found.setdefault(name, f"{name} is rank {rank} of a world of {world}")
        return found


def open_gathered(spec: str, home: Path, shards: Mapping[str, object]) -> GatheredSource:
    """The captures whose names match ``spec`` (``tp@rank*``), one per rank, as one source."""
    rules = check_shards(shards)
    ranked = ranked_captures(spec, home)
    ranks = [open_capture(str(m["name"]), Path(m["path"])) for m in ranked]
    base = ranks[0]
    gathered = GatheredSource(
        spec,
        "gathered",
        base.path,
        f"{spec} ({len(ranks)} ranks gathered)",
        calls=base.calls,
        meta={**base.meta, "ranks": [str(m["name"]) for m in ranked]},
        warnings=[w for r in ranks for w in r.warnings],
    )
    by_rank = [{e.name: e for e in r.entries} for r in ranks]
    for entry in base.entries:
        rule = _rule(rules, entry)
        if rule is None:
            gathered.entries.append(entry)
            continue
        parts = []
        for source, entries in zip(ranks, by_rank, strict=True):
            part = entries.get(entry.name)
            if part is None:
                raise CompareInputError(
                    f"{entry.name} is split over the ranks but {source.label} lacks it",
                    code=BAD_SHARDS,
                )
            parts.append((source, part))
        shape = _gathered_shape(entry, rule, [part for _s, part in parts])
        stats = gathered_stats(rule, parts) if entry.stats is not None else None
        gathered.splits[entry.name] = _Split(rule, parts)
        gathered.entries.append(
            Entry(
                name=entry.name,
                shape=shape,
                dtype=entry.dtype,
                file=entry.file,
                key=entry.key,
                order=entry.order,
                module=entry.module,
                call=entry.call,
                role=entry.role,
                stats=stats,
            )
        )
    return gathered


def gathered_stats(rule: int | str, parts: list[tuple[Source, Entry]]) -> dict[str, Any]:
    """The statistics of a summary tensor gathered from the ranks' summaries.

    Along a dimension they combine exactly (counts add, extremes and the sum of squares
    too); the sketches do not (each rank's buckets its own slice by its own element
    indices), so the entry is marked ``gathered: "concatenated"`` and compare bounds its
    error by the statistics alone.  Partial sums have the same shape on every rank, so
    their sketches add up to the sketch of the sum (the sketch is linear; ``load`` adds
    them): ``gathered: "summed"``, its mean exact (means add), its norm the summed
    sketch's (an estimate; exact for small tensors), its extremes unknown."""
    import math

    import numpy as np

    stats = [dict(part.stats or {}) for _source, part in parts]
    nan = sum(int(s.get("nan") or 0) for s in stats)
    inf = sum(int(s.get("inf") or 0) for s in stats)
    if rule == "sum":
        total = np.sum(
            [np.asarray(src.load(part), dtype=np.float64) for src, part in parts], axis=0
        )
        means = [float(s["mean"]) for s in stats if s.get("mean") is not None]
        mean = sum(means) if len(means) == len(stats) else None
        numel = int(stats[0].get("numel") or 0)
        norm = float(np.linalg.norm(total))
        return {
            "numel": numel,
            "nan": nan,
            "inf": inf,
            "min": None,
            "max": None,
            "mean": mean,
            "norm": norm,
            "rms": norm / math.sqrt(numel) if numel else None,
            "gathered": "summed",
        }
    numel = sum(int(s.get("numel") or 0) for s in stats)
    finite = [
        int(s.get("numel") or 0) - int(s.get("nan") or 0) - int(s.get("inf") or 0) for s in stats
    ]
    norm = math.sqrt(sum(float(s.get("norm") or 0.0) ** 2 for s in stats))
    weighted = [
        (float(s["mean"]), n)
        for s, n in zip(stats, finite, strict=True)
        if s.get("mean") is not None
    ]
    count = sum(n for _m, n in weighted)
    lows = [float(s["min"]) for s in stats if s.get("min") is not None]
    highs = [float(s["max"]) for s in stats if s.get("max") is not None]
    return {
        "numel": numel,
        "nan": nan,
        "inf": inf,
        "min": min(lows) if lows else None,
        "max": max(highs) if highs else None,
        "mean": sum(m * n for m, n in weighted) / count if count else None,
        "norm": norm,
        "rms": norm / math.sqrt(sum(finite)) if sum(finite) else None,
        "gathered": "concatenated",
    }


def _gathered_shape(entry: Entry, rule: int | str, parts: list[Entry]) -> list[int]:
    """The shape the ranks' parts make together, checked before any is read: a dimension
    the tensor has, the same shape on every other axis (or, to ``"sum"``, on all), and
    and summaries on every rank or on none."""
    if len({part.stats is None for part in parts}) != 1:
        raise CompareInputError(
            f"{entry.name} is a summary on some ranks only: capture every rank alike",
            code=BAD_SHARDS,
        )
    shapes = [list(part.shape) for part in parts]
    if rule == "sum":
        if any(shape != shapes[0] for shape in shapes):
            raise CompareInputError(
                f"{entry.name}: the ranks' partial sums differ in shape "
                f"({', '.join(str(s) for s in shapes[:4])})",
                code=BAD_SHARDS,
            )
        return shapes[0]
    dim = int(rule)
    if not -len(shapes[0]) <= dim < len(shapes[0]):
        raise CompareInputError(
            f"shards: {entry.name} has {len(shapes[0])} dimension(s), no dimension {dim}",
            code=BAD_SHARDS,
        )
    axis = dim % len(shapes[0])
    rest = [[n for i, n in enumerate(shape) if i != axis] for shape in shapes]
    if any(len(shape) != len(shapes[0]) for shape in shapes) or any(r != rest[0] for r in rest):
        raise CompareInputError(
            f"{entry.name}: the ranks' slices differ in shape outside dimension {dim} "
            f"({', '.join(str(s) for s in shapes[:4])})",
            code=BAD_SHARDS,
        )
    gathered = list(shapes[0])
    gathered[axis] = sum(shape[axis] for shape in shapes)
    return gathered


def _rank_number(meta: CaptureMeta) -> int | None:
    """The rank a capture says it is (``capture.json``'s ``rank``, else its name's
    ``@rank<r>``); None when neither says one."""
    rank = meta.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
        return rank
    tail = str(meta.get("name", "")).rsplit("@rank", 1)[-1]
    return int(tail) if tail.isdigit() and len(tail) < 10 else None


def _rank_of(meta: CaptureMeta) -> int:
    rank = _rank_number(meta)
    return 1 << 30 if rank is None else rank


def _rule(rules: dict[str, int | str], entry: Entry) -> int | str | None:
    for pattern, rule in rules.items():
        if fnmatch.fnmatchcase(entry.name, pattern) or (
            entry.module is not None and fnmatch.fnmatchcase(entry.module, pattern)
        ):
            return rule
    return None
