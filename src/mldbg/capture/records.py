"""The lines a capture appends to its ``index.jsonl``, as types (docs/formats.md).

One line when a module call starts (:class:`CallLine`) and one when it ends
(:class:`ReturnLine`); either carries the :class:`TensorFields` of the tensors written
for it.  Compare reads them back as plain JSON (``compare/read/sources.py``): these types say
what the recorder writes, so a field added here is a field to document there.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class TensorInfo(TypedDict):
    """One written tensor: its key in the file, shape and safetensors dtype name; a
    summary adds its sketch's length and its statistics (``numel``, ``nan``, ``inf``,
    ``min``, ``max``, ``mean``, ``rms``, ``norm``: ``capture/sketch.py``)."""

    shape: list[int]
    dtype: str
    key: NotRequired[str]
    sketch: NotRequired[int]
    stats: NotRequired[dict[str, float | int | None]]


class TensorFields(TypedDict, total=False):
    """What writing a call's inputs or outputs adds to its line."""

    file: str
    tensors: dict[str, TensorInfo]
    skipped: dict[str, str]
    renamed: dict[str, str]
    write_error: str


class Quantization(TypedDict):
    """An MLX quantized module's scheme (compare widens its expected error by it)."""

    bits: int
    group_size: int
    mode: NotRequired[str]


class CallExtra(TypedDict, total=False):
    """Fields a backend adds to a call's start line."""

    quant: Quantization


class Sensitivity(TypedDict, total=False):
    """A call's measured conditioning (``capture/sensitivity.py``): ``step``, the unit
    roundoff its inputs were perturbed by; ``amplification``, its outputs' relative
    change over ``step``; ``sensitivity``, its own rounding's effect."""

    step: float
    sensitivity: float
    amplification: float


# A call's start: its place in the call tree (and its inputs' tensors).  Spelled as a
# call because one field is a keyword: "class", the module's class name.
CallLine = TypedDict(
    "CallLine",
    {
        "event": str,  # "call"
        "seq": int,
        "module": str,
        "call": int,
        "class": str,
        "parent": int | None,
        "depth": int,
        "site": NotRequired[str],
        "below_depth": NotRequired[bool],
        "outside_within": NotRequired[bool],
        "quant": NotRequired[Quantization],
        "file": NotRequired[str],
        "tensors": NotRequired[dict[str, TensorInfo]],
        "skipped": NotRequired[dict[str, str]],
        "renamed": NotRequired[dict[str, str]],
        "write_error": NotRequired[str],
    },
)


class ReturnLine(TensorFields, Sensitivity):
    """A call's end: its outputs' tensors or the error it raised, its own seconds and
    its measured sensitivity."""

    event: str  # "return"
    seq: int
    end: int
    seconds: NotRequired[float]
    error: NotRequired[str]
