"""Weight audit: the port's loaded parameters against the reference's, name by name.

Porting guides name weight loading as the first cause of garbage output: a name that
does not match, a parameter never loaded (left at its initial value), a convolution
kernel moved into the wrong layout, a dtype conversion that lost precision.  Activations
show the symptom; this shows the cause, before any forward runs.

Each reference parameter is paired with the port's parameter of the same name after the
map (the ``--map`` file compare takes), then classified:

* ``ok``: same values up to one rounding of the coarser dtype (``|p - r| <= u |r| + η``
  element by element, ``η`` half its smallest subnormal; exact for integers), possibly
  through the layout the port's framework uses (``OIHW→OHWI``, ``OIL→OLI``: MLX
  convolutions are channels-last; ``IOHW→OHWI`` for a ConvTranspose kernel, ``IO→OI``
  for transformers' ``Conv1D``) or with axes of size 1 dropped or added (a 1×1
  convolution's kernel kept as a linear weight).
* ``dtype``: as ``ok``, but stored in another dtype (reported, not a failure).
* ``quantized``: an MLX-quantized weight whose every element is within what its
  quantization explains (``quantized.py`` decodes it and derives the bound).
* ``never_loaded``: the port's value is its fresh initialization: identical to ``fresh``
  (the port model built again, same seed, nothing loaded) when given; otherwise a
  constant tensor (norm weights start at 1, biases at 0) where the reference's is not,
  or values uncorrelated with the reference's (``|cosine| < 4/sqrt(n)``) that no layout
  explains and that agree element by element no more often than chance: a random
  initialization.
* ``layout``: equal only through another permutation of the axes (a transposed linear,
  a conv kernel with height and width swapped): the loader transposed it wrongly.
* ``shape``: the shapes differ and no permutation maps one onto the other.
* ``values``: paired, same layout, different values (a wrong conversion, a wrong file,
  a wrong slice when part of the elements agree).
* ``nonfinite``: a NaN or an Inf on one side where the other holds another value (a
  broken conversion, an overflow to float16): counted (``nonfinite``: ``nan_port``,
  ``inf_port``, ``nonfinite_ref``) with the first place.  NaN and Inf in both at the same
  places agree, and the rest of the pair is judged by its finite elements.
* ``missing`` / ``extra``: in the reference only / in the port only; a missing and an
  extra parameter holding the same values are one ``renamed`` parameter instead, with
  the map rule that pairs them in ``proposed_map``; a missing one holding another's
  values exactly is ``tied`` (an output head tied to the embedding), a missing buffer
  is ``buffer``, and parts one side concatenates into one tensor are ``fused``.

``ok``/``dtype``/``quantized``/``extra``/``renamed``/``tied``/``buffer``/``fused`` do not
fail the audit; the rest do.

This module is the audit's face and its order of work; each step is its own module:
collecting parameters (``collect.py``, ``ranks.py``), judging a pair (``judge.py``,
``layouts.py``, ``closeness.py``), what the pairing leaves over (``structure.py``) and
the human form (``render.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..compare.pair.mapping import NameMap, load_map, parse_map
from .collect import collect, inverse_names, resolve_quantized
from .judge import judge_pair, pair_row
from .params import Audit, Params, Row
from .quantized import parse_quantization
from .ranks import from_ranks, names_ranks
from .structure import find_fused, find_renamed, find_tied

FAILING = ("missing", "nonfinite", "never_loaded", "layout", "shape", "values")
WARNING = ("renamed", "fused", "tied", "buffer", "quantized", "dtype", "extra")


def audit_weights(
    reference: Any,
    port: Any,
    *,
    map: str | os.PathLike[str] | Mapping[str, Any] | None = None,  # noqa: A002 - compare's name
    fresh: Any = None,
    home: str | os.PathLike[str] | None = None,
    quantization: Any = None,
    shards: Mapping[str, Any] | None = None,
) -> Audit:
    """Audit ``port``'s parameters against ``reference``'s (see the module docstring).

    Each of ``reference``/``port``/``fresh`` is a torch or MLX module (its parameters and
    buffers as loaded), a dict of tensors (torch, MLX or numpy), or a path: a
    ``.safetensors``/``.npz``/``.pt`` file or a directory of them.  ``quantization``
    (``{"mode", "bits", "group_size"}``, a mode name, or ``"bits=4,group_size=64"``) says
    how the port's packed weights are quantized where no module or ``config.json`` says
    it and the shapes leave it open.  ``port`` may name the captures of a model's ranks
    (``"tp@rank*"``, each saved with ``--capture-weights``): ``shards`` (``{glob on
    parameter names: dim}``, as compare takes) says along which dimension each parameter
    is split; the others are replicated (rank 0's).  Raises :class:`CompareInputError`
    for bad input."""
    from ..store.runs import mldbg_home

    base = Path(home) if home is not None else mldbg_home()
    names = parse_map(dict(map), "map") if isinstance(map, Mapping) else load_map(map)
    given = parse_quantization(quantization)
    ref = collect(reference, base, "reference")
    if names_ranks(port, base):
        prt = from_ranks(str(port), base, shards or {})
    else:
        prt = collect(port, base, "port")
    init = collect(fresh, base, "fresh") if fresh is not None else None
    for side in (prt, init):
        if side is not None and given is not None:
            side.settings, side.settings_source = given, "given"
    resolve_quantized(prt, ref, names.to_a)
    resolve_quantized(ref, prt, inverse_names(prt, names))
    if init is not None:
        resolve_quantized(init, ref, names.to_a)
    return audit(ref, prt, names, init)


def audit(ref: Params, port: Params, names: NameMap, fresh: Params | None) -> Audit:
    port_by_ref_name = {}
    for name in port.shapes:
        mapped = names.to_a(name)
        if not names.ignored(mapped):
            port_by_ref_name[mapped] = name
    rows: list[Row] = []
    missing: list[str] = []
    for name in ref.shapes:
        if names.ignored(name):
            continue
        other = port_by_ref_name.pop(name, None)
        if other is None:
            missing.append(name)
            continue
        rows.append(judge_pair(ref, port, name, other, fresh))
    extra = list(port_by_ref_name.items())  # (name in A's terms, port's own name)
    renames: dict[str, str] = {}
    fused_rows, missing, extra = find_fused(ref, port, missing, extra)
    rows.extend(fused_rows)
    for name in missing:
        found = find_renamed(ref, port, name, extra)
        tie = find_tied(ref, name, missing) if found is None else None
        if tie is not None:
            note = (
                f"tied to {tie!r} in the reference (the same values); the port keeps "
                f"{tie!r} only and uses it for both"
            )
            rows.append(pair_row(ref, port, name, None, "tied", note))
            continue
        if found is None and name in ref.buffers:
            note = "a buffer of the reference, not in the port: computed there, or not needed?"
            rows.append(pair_row(ref, port, name, None, "buffer", note))
            continue
        if found is None:
            rows.append(pair_row(ref, port, name, None, "missing", "not in the port"))
            continue
        extra = [e for e in extra if e[1] != found[1]]
        renames[found[1]] = name
        row = pair_row(ref, port, name, found[1], "renamed", f"in the port as {found[1]!r}")
        row.update(found[0])
        rows.append(row)
    for _mapped, other in extra:
        note = "in the port only (a buffer it computes, or a name the map misses)"
        rows.append(
            {
                "name": None,
                "name_port": other,
                "status": "extra",
                "shape_port": list(port.shapes[other]),
                "dtype_port": port.dtypes[other],
                "note": note + (f"; {port.unresolved[other]}" if other in port.unresolved else ""),
                **({"quant": port.quant[other].as_dict()} if other in port.quant else {}),
            }
        )
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    order = {status: i for i, status in enumerate((*FAILING, *WARNING, "ok"))}
    problems = sorted(
        (r for r in rows if r["status"] != "ok"), key=lambda r: order.get(r["status"], 99)
    )
    return {
        "ok": not any(r["status"] in FAILING for r in rows),
        "reference": {"label": ref.label, "framework": ref.framework, "count": len(ref.shapes)},
        "port": {
            "label": port.label,
            "framework": port.framework,
            "count": len(port.shapes),
            **({"ranks": port.ranks} if port.ranks else {}),
        },
        "fresh": None if fresh is None else {"label": fresh.label, "count": len(fresh.shapes)},
        "counts": counts,
        "problems": problems,
        "parameters": rows,
        "proposed_map": {"rename": renames} if renames else None,
    }
