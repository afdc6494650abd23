"""One reference parameter against the port's of the same name: the row that says why.

The explanations are tried in a fixed order (within rounding, never loaded, a layout,
axes of size 1, a shape, then how the values differ) and the first that fits decides:
a row names one cause, the one a porter fixes first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .closeness import (
    AGREEMENT_SAMPLE,
    agreement,
    close,
    cosine_of,
    is_constant,
    nonfinite_mismatch,
    rel_rms_of,
    underflow_slack,
    unit_rounding,
    worst_ratio,
)
from .layouts import EXPECTED_LAYOUTS, is_transposed_conv, layout_hint, permuted_layout, unit_axes
from .quantized import QuantSpec, input_rounding

if TYPE_CHECKING:
    from .params import Params, Row, Values


def pair_row(
    ref: Params, port: Params, name: str, other: str | None, status: str, note: str
) -> Row:
    row: Row = {
        "name": name,
        "name_port": other,
        "status": status,
        "shape_ref": list(ref.shapes[name]),
        "dtype_ref": ref.dtypes[name],
        "note": note,
    }
    if other is not None:
        row["shape_port"] = list(port.shapes[other])
        row["dtype_port"] = port.dtypes[other]
    return row


def judge_pair(ref: Params, port: Params, name: str, other: str, fresh: Params | None) -> Row:
    """One parameter of the reference against the port's: the first explanation that
    fits decides its row (NaN or Inf against another value, within rounding, never
    loaded, a layout, axes of size 1, a shape, then how the values differ)."""
    if other in port.unresolved or name in ref.unresolved:
        row = pair_row(ref, port, name, other, "shape", "")
        row["note"] = port.unresolved.get(other) or ref.unresolved[name]
        return row
    pair = _Judged.read(ref, port, name, other)
    if pair.nonfinite() or pair.within_rounding():
        return pair.row
    fresh_name = other if fresh is not None and other in fresh.shapes else None
    if fresh_name is not None and fresh is not None and pair.as_initialized(fresh.read(fresh_name)):
        return pair.row
    transposed_conv = is_transposed_conv(ref, name) or is_transposed_conv(port, other)
    if pair.through_layout(transposed_conv) or pair.through_unit_axes(transposed_conv):
        return pair.row
    pair.by_values()
    return pair.row


@dataclass
class _Judged:
    """A parameter pair's values and what rounding allows between them, and the row that
    says what was found."""

    a: Values
    b: Values
    slack_a: Values | float
    slack_b: Values | float
    u: float
    quant: QuantSpec | None
    dtype_changed: bool
    row: Row

    @classmethod
    def read(cls, ref: Params, port: Params, name: str, other: str) -> _Judged:
        a, slack_a = ref.read_with_allowance(name)
        b, slack_b = port.read_with_allowance(other)
        slack_b = slack_b + underflow_slack(ref.dtypes[name], port.dtypes[other])
        quant = port.quant.get(other) or ref.quant.get(name)
        u = unit_rounding(ref.dtypes[name], port.dtypes[other])
        for side, key in ((port, other), (ref, name)):
            if key in side.quant:
                u = max(u, input_rounding(side.packed[key], side.quant[key]))
        row = pair_row(ref, port, name, other, "ok", "")
        if quant is not None:
            row["quant"] = _quant_fields(ref, port, name, other)
        row["rel_rms"] = rel_rms_of(a, b) if a.shape == b.shape else None
        dtype_changed = ref.dtypes[name] != port.dtypes[other]
        return cls(a, b, slack_a, slack_b, u, quant, dtype_changed, row)

    def nonfinite(self) -> bool:
        """NaN or Inf on one side where the other holds another value: a finding of its
        own (a NaN agrees with nothing, however loose the tolerance)."""
        found = nonfinite_mismatch(self.a, self.b)
        if found is None:
            return False
        where = f" (first at {found['first']})" if found["first"] is not None else ""
        said = [
            f"{found[key]} {word}"
            for key, word in (("nan_port", "NaN"), ("inf_port", "Inf"))
            if found[key]
        ]
        if said:
            note = f"{' and '.join(said)} in the port where the reference holds another value"
        else:
            note = (
                f"{found['nonfinite_ref']} NaN or Inf in the reference where the port holds "
                "another value: is the reference itself loaded right?"
            )
        self.row.update(status="nonfinite", note=note + where, nonfinite=found)
        return True

    def _agreeing_status(self) -> str:
        """The status of values that agree: quantized, a changed dtype, or plainly ok."""
        return "quantized" if self.quant is not None else "dtype" if self.dtype_changed else "ok"

    def within_rounding(self) -> bool:
        a, b, row, quant = self.a, self.b, self.row, self.quant
        if a.shape != b.shape or not close(a, b, self.u, self.slack_a, self.slack_b):
            return False
        if quant is not None:
            row["quant"]["worst"] = worst_ratio(a, b, self.u, self.slack_a, self.slack_b)
            row.update(
                status="quantized",
                note=f"within what {quant.describe()} explains "
                f"(worst element at {row['quant']['worst']:.2g} of its allowance)",
            )
        elif self.dtype_changed:
            row.update(
                status="dtype",
                note=f"{row['dtype_ref']} → {row['dtype_port']}, values within one rounding",
            )
        return True

    def as_initialized(self, initial: Values) -> bool:
        import numpy as np

        if initial.shape == self.b.shape and np.array_equal(initial, self.b):
            self.row.update(
                status="never_loaded", note="identical to a fresh initialization of the port"
            )
            return True
        return False

    def through_layout(self, transposed_conv: bool) -> bool:
        layout = permuted_layout(
            self.a, self.b, self.u, self.slack_a, self.slack_b, transposed_conv
        )
        if layout is None:
            return False
        expected = layout in EXPECTED_LAYOUTS
        quant = self.quant
        self.row.update(
            layout=layout,
            status=self._agreeing_status() if expected else "layout",
            note=(
                f"stored as {layout.split('→')[1]}, the port framework's layout"
                if expected
                else f"equal only through the permutation {layout}: transposed by mistake"
                + layout_hint(layout, transposed_conv)
            )
            + (f", within what {quant.describe()} explains" if quant is not None else ""),
        )
        return True

    def through_unit_axes(self, transposed_conv: bool) -> bool:
        unit = unit_axes(self.a, self.b, self.u, self.slack_a, self.slack_b, transposed_conv)
        if unit is None:
            return False
        layout, same_order = unit
        dropped = "dropped" if self.a.ndim > self.b.ndim else "added"
        self.row.update(
            layout=layout,
            status=self._agreeing_status() if same_order else "layout",
            note=(
                f"the same values with axes of size 1 {dropped}"
                " (a 1×1 convolution's kernel and a linear weight)"
                if same_order
                else f"equal only through the permutation {layout} (axes of size 1 aside): "
                "transposed by mistake"
            ),
        )
        return True

    def by_values(self) -> None:
        """Values that differ: as initialized, a shape no permutation explains, loaded
        from the wrong place in part, or outside what quantization explains."""
        import numpy as np

        a, b, row, quant = self.a, self.b, self.row, self.quant
        if is_constant(b) and not is_constant(a):
            row.update(status="never_loaded", note="holds one constant value, as initialized")
            return
        if a.shape != b.shape:
            row.update(
                status="shape",
                note=f"shapes {list(a.shape)} vs {list(b.shape)}: "
                "no permutation maps one onto the other",
            )
            return
        cosine = cosine_of(a, b)
        row["cosine"] = cosine
        agree, chance = agreement(a, b, self.u, self.slack_a, self.slack_b)
        row["agree"] = agree
        counted = max(1, min(int(np.count_nonzero(a)), AGREEMENT_SAMPLE))
        by_chance = agree <= chance + 4.0 * math.sqrt(max(chance, 1.0 / counted) / counted)
        uncorrelated = a.size >= 64 and cosine is not None and abs(cosine) < 4.0 / math.sqrt(a.size)
        if uncorrelated and by_chance:
            row.update(
                status="never_loaded",
                note="uncorrelated with the reference: a random initialization",
            )
        elif not by_chance and quant is None:
            row.update(
                status="values",
                note=f"{agree:.0%} of the elements agree, the rest differ: loaded from the "
                "wrong place in part (a slice, an offset, a shard)",
            )
        elif quant is not None:
            row["quant"]["worst"] = worst_ratio(a, b, self.u, self.slack_a, self.slack_b)
            row.update(
                status="values",
                note=f"outside what {quant.describe()} explains: an element is "
                f"{row['quant']['worst']:.3g}x its allowance",
            )
        else:
            row.update(status="values", note="same name and shape, different values")


def _quant_fields(ref: Params, port: Params, name: str, other: str) -> dict[str, object]:
    """The quantization of the pair's weights (the port's; the reference's as ``reference``
    when it is quantized too)."""
    fields: dict[str, object] = {}
    if other in port.quant:
        fields.update(port.quant[other].as_dict())
        fields["scales_dtype"] = port.packed[other].scales_dtype
    if name in ref.quant:
        fields["reference"] = ref.quant[name].as_dict()
    return fields
