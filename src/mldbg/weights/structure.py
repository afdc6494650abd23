"""Parameters loaded right under another structure: fused, tied, renamed.

What the name pairing leaves over (missing in the port, extra in it) is often not lost:
a ``qkv_proj`` the reference splits in three, an output head tied to the embedding, a
module the port names otherwise.  Each is found by its values, so the audit reports it
as a warning with what pairs it, not as a missing parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .closeness import close, is_constant, rel_rms_of, underflow_slack, unit_rounding
from .judge import pair_row
from .layouts import permuted_layout
from .quantized import input_rounding

if TYPE_CHECKING:
    from .params import Params, Row


def find_fused(
    ref: Params, port: Params, missing: list[str], extra: list[tuple[str, str]]
) -> tuple[list[Row], list[str], list[tuple[str, str]]]:
    """Parameters one side keeps fused (``qkv_proj``, ``gate_up_proj``) and the other
    split: a tensor that is exactly the concatenation, along one axis, of parameters of
    the other side's same module (``…self_attn.q_proj.weight`` … for
    ``…self_attn.qkv_proj.weight``), each within rounding.  Each part and the whole get a
    ``fused`` row (loaded right, under another structure); the rest is returned."""
    rows: list[Row] = []
    by_port = {other: mapped for mapped, other in extra}
    # The port fuses what the reference splits, then the other way round.
    for mapped, other in list(extra):
        parts = _concatenation(port, other, mapped, ref, [n for n in missing])
        if parts is None:
            continue
        axis, spans = parts
        listed = ", ".join(name for name, _, _ in spans)
        rows.append(
            port_row(port, other, "fused", f"the concatenation of {listed} along axis {axis}")
        )
        for name, start, stop in spans:
            row = pair_row(ref, port, name, other, "fused", "")
            row["note"] = f"[{start}:{stop}] along axis {axis} of the port's fused {other!r}"
            row["fused"] = {"into": other, "axis": axis, "start": start, "stop": stop}
            rows.append(row)
            missing = [n for n in missing if n != name]
        del by_port[other]
    for name in list(missing):
        candidates = [(by_port[o], o) for o in by_port]
        parts = _concatenation(ref, name, name, port, [o for _, o in candidates], by_port)
        if parts is None:
            continue
        axis, spans = parts
        listed = ", ".join(other for other, _, _ in spans)
        rows.append(
            pair_row(
                ref, port, name, None, "fused", f"split in the port into {listed} along axis {axis}"
            )
        )
        for other, start, stop in spans:
            row = port_row(port, other, "fused", f"[{start}:{stop}] along axis {axis} of {name!r}")
            row["fused"] = {"into": name, "axis": axis, "start": start, "stop": stop}
            rows.append(row)
            del by_port[other]
        missing.remove(name)
    return rows, missing, [(mapped, other) for other, mapped in by_port.items()]


def port_row(port: Params, other: str, status: str, note: str) -> Row:
    return {
        "name": None,
        "name_port": other,
        "status": status,
        "shape_port": list(port.shapes[other]),
        "dtype_port": port.dtypes[other],
        "note": note,
    }


def _module_and_leaf(name: str) -> tuple[str, str]:
    """``model.layers.0.self_attn`` and ``weight`` for ``model.layers.0.self_attn.q_proj.weight``."""
    head, _, leaf = name.rpartition(".")
    return head.rpartition(".")[0], leaf


def _concatenation(
    whole_side: Params,
    whole: str,
    whole_mapped: str,
    parts_side: Params,
    candidates: list[str],
    mapped: Mapping[str, str] | None = None,
) -> tuple[int, list[tuple[str, int, int]]] | None:
    """``(axis, [(part, start, stop)…])`` when ``whole`` is exactly the concatenation of
    some ``candidates`` (siblings of the same module, the same leaf name) along one axis."""
    import numpy as np

    shape = whole_side.shapes[whole]
    home = _module_and_leaf(whole_mapped)
    siblings = [
        c
        for c in candidates
        if _module_and_leaf(mapped[c] if mapped else c) == home
        and len(parts_side.shapes[c]) == len(shape)
        and c not in parts_side.unresolved
    ]
    if len(siblings) < 2 or whole in whole_side.unresolved:
        return None
    values, slack = whole_side.read_with_allowance(whole)
    for axis in range(len(shape)):
        fitting = [
            c
            for c in siblings
            if all(
                n == m or i == axis
                for i, (n, m) in enumerate(zip(parts_side.shapes[c], shape, strict=True))
            )
        ]
        if sum(parts_side.shapes[c][axis] for c in fitting) < shape[axis]:
            continue
        spans: list[tuple[str, int, int]] = []
        taken = np.zeros(shape[axis], dtype=bool)
        rows = np.moveaxis(values, axis, 0).reshape(shape[axis], -1)
        row_slack = (
            slack if isinstance(slack, float) else np.moveaxis(slack, axis, 0).reshape(rows.shape)
        )
        for c in fitting:
            part, part_slack = parts_side.read_with_allowance(c)
            part_slack = part_slack + underflow_slack(
                whole_side.dtypes[whole], parts_side.dtypes[c]
            )
            u = unit_rounding(whole_side.dtypes[whole], parts_side.dtypes[c])
            length = part.shape[axis]
            first = np.moveaxis(part, axis, 0).reshape(length, -1)[0]
            first_slack = (
                part_slack
                if isinstance(part_slack, float)
                else np.moveaxis(part_slack, axis, 0).reshape(length, -1)[0]
            )
            # Where the part's first slice sits in the whole: the only starts worth a look.
            with np.errstate(invalid="ignore"):
                fits = np.all(
                    np.abs(rows - first) <= u * np.abs(first) + first_slack + row_slack, axis=1
                )
            for begin in np.flatnonzero(fits[: shape[axis] - length + 1]):
                stop = int(begin) + length
                if taken[begin:stop].any():
                    continue
                piece = np.take(values, range(begin, stop), axis=axis)
                piece_slack = (
                    slack
                    if isinstance(slack, float)
                    else np.take(slack, range(begin, stop), axis=axis)
                )
                if close(part, piece, u, part_slack, piece_slack):
                    spans.append((c, int(begin), stop))
                    taken[begin:stop] = True
                    break
        if len(spans) >= 2 and taken.all():
            return axis, sorted(spans, key=lambda span: span[1])
    return None


def find_tied(ref: Params, name: str, missing: list[str]) -> str | None:
    """The reference parameter the port has whose values ``name`` shares exactly (an
    output head tied to the embedding: transformers' state dict lists both)."""
    import numpy as np

    shape = ref.shapes[name]
    candidates = [
        other
        for other in ref.shapes
        if other != name and other not in missing and ref.shapes[other] == shape
    ]
    if not candidates or not shape:
        return None
    values = ref.read(name)
    if is_constant(values) or values.size < 2:
        return None  # equal constants (norms at 1) are no evidence of a tie
    for other in candidates:
        if np.array_equal(ref.read(other), values, equal_nan=True):
            return other
    return None


def find_renamed(
    ref: Params, port: Params, name: str, extra: list[tuple[str, str]]
) -> tuple[dict[str, object], str] | None:
    """The port parameter (among ``extra``) holding ``name``'s values under another name."""
    shape = ref.shapes[name]
    candidates = [
        other
        for _mapped, other in extra
        if sorted(port.shapes[other]) == sorted(shape) and port.shapes[other]
    ]
    if not candidates:
        return None
    a, slack_a = ref.read_with_allowance(name)
    for other in candidates:
        b, slack_b = port.read_with_allowance(other)
        slack_b = slack_b + underflow_slack(ref.dtypes[name], port.dtypes[other])
        u = unit_rounding(ref.dtypes[name], port.dtypes[other])
        if other in port.quant:
            u = max(u, input_rounding(port.packed[other], port.quant[other]))
        if a.shape == b.shape and close(a, b, u, slack_a, slack_b):
            return {"rel_rms": rel_rms_of(a, b)}, other
        layout = permuted_layout(a, b, u, slack_a, slack_b)
        if layout is not None:
            return {"layout": layout}, other
    return None
