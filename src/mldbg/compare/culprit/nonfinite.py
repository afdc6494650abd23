"""The first module call of a capture whose outputs hold NaN or Inf from finite inputs.

The tripwire (``break --nonfinite``) finds it live; this finds it afterwards, in a capture
already written (the reference's, the port's, one from a run that took hours), without
running anything again.  Calls are visited in the order they finished (a child finishes
before its parent), so the first call whose outputs are non-finite while its recorded
inputs are finite is the deepest place the values went bad; a call whose inputs were
already bad is a victim and is passed over.  Tensors are read memory-mapped, chunk by
chunk, and the scan stops at the answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..read.sources import Entry, Source

CHUNK = 1 << 22  # elements checked at a time


def first_nonfinite(source: str | Path, *, home: str | Path | None = None) -> dict[str, Any]:
    """``{"source", "first": {"module", "call", "class", "entries": [{"name", "shape",
    "dtype", "nan", "inf"}], "inputs_checked"} | None, "calls_checked", "victims"}``.

    ``source`` is anything ``compare`` takes; ``first`` is None when every captured value
    is finite (or the source has no module calls: a plain tensor directory is checked
    entry by entry in its order instead).
    """
    from ...store.runs import mldbg_home
    from ..read.sources import open_source

    store = Path(home).expanduser().resolve() if home is not None else mldbg_home()
    found = open_source(str(source), store)
    described = found.describe()
    by_call: dict[tuple[str, int], dict[str, list[Entry]]] = {}
    loose = []
    for entry in found.entries:
        key = entry.call_key
        if key is None:
            loose.append(entry)
            continue
        by_call.setdefault(key, {"in": [], "out": []})[entry.role or "out"].append(entry)
    if not found.calls:  # plain tensors: the first entry holding NaN/Inf
        for entry in loose:
            counts = _counts(found, entry)
            if counts:
                return {
                    "source": described,
                    "first": {"entries": [_describe(entry, counts)]},
                    "calls_checked": 0,
                    "victims": 0,
                }
        return {"source": described, "first": None, "calls_checked": 0, "victims": 0}
    ended = sorted(
        (c for c in found.calls.values() if c.end_order is not None),
        key=lambda c: c.end_order or 0,
    )
    checked = victims = 0
    for call in ended:
        tensors = by_call.get((call.module, call.call))
        if not tensors or not tensors["out"]:
            continue
        checked += 1
        bad_out = [(e, c) for e in tensors["out"] if (c := _counts(found, e))]
        if not bad_out:
            continue
        if any(_counts(found, e) for e in tensors["in"]):
            victims += 1
            continue
        return {
            "source": described,
            "first": {
                "module": call.module,
                "call": call.call,
                "class": call.class_name,
                "entries": [_describe(e, c) for e, c in bad_out[:16]],
                "inputs_checked": bool(tensors["in"]),
            },
            "calls_checked": checked,
            "victims": victims,
        }
    return {"source": described, "first": None, "calls_checked": checked, "victims": victims}


def _counts(found: Source, entry: Entry) -> dict[str, int] | None:
    """NaN and Inf counts of one stored tensor (None when it holds neither): a summary's
    from its statistics (its file holds a sketch, where NaN/Inf were taken as 0)."""
    import numpy as np

    if entry.stats is not None:
        nan, inf = entry.stats.get("nan"), entry.stats.get("inf")
        counted = {
            "nan": nan if isinstance(nan, int) and nan > 0 else 0,
            "inf": inf if isinstance(inf, int) and inf > 0 else 0,
        }
        return counted if counted["nan"] or counted["inf"] else None
    data = found.load_checked(entry)
    if data.dtype.kind not in "fcV" or data.size == 0:  # V: ml_dtypes' bf16 and fp8
        return None
    flat = data.reshape(-1)
    nan = inf = 0
    for start in range(0, flat.size, CHUNK):
        chunk = np.asarray(flat[start : start + CHUNK])
        if chunk.dtype.kind == "V":
            chunk = chunk.astype(np.float32)
        nan += int(np.count_nonzero(np.isnan(chunk)))
        inf += int(np.count_nonzero(np.isinf(chunk)))
    return {"nan": nan, "inf": inf} if nan or inf else None


def _describe(entry: Entry, counts: dict[str, int]) -> dict[str, object]:
    return {"name": entry.name, "shape": entry.shape, "dtype": entry.dtype, **counts}
