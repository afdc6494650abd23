"""Quantized weights (MLX's ``mx.quantize`` formats), decoded for the weight audit.

An MLX model quantized with ``mlx.nn.quantize`` (or mlx-lm's conversion) stores each
quantized ``Linear``/``Embedding`` as ``weight`` (codes packed into ``uint32``),
``scales`` and, in the affine mode, ``biases``.  To judge such a weight against a float
reference, the audit decodes it to the values the port computes with, and asks how far
quantization at those settings may move each element, from the stored scales alone:

* **affine** (2, 3, 4, 5, 6 or 8 bits; groups of 32, 64 or 128): ``ŵ = s·q + b`` with an
  integer code ``q``.  MLX picks the group's step ``s`` from its range, then re-anchors
  it so that the group's larger-magnitude edge is a whole number of steps from zero
  (zero stays representable); the other edge may then land up to one step past the last
  code, where it is clamped.  So each element is within one step ``|s|`` of its code's
  value, plus the rounding of ``s`` and ``b`` themselves to the scales' dtype
  (``u·(q·|s| + |b|)``, which at 8 bits in bfloat16 is larger than the step).
* **mxfp4 / mxfp8 / nvfp4**: ``ŵ = S·e``, ``e`` on the FP4 (e2m1) or FP8 (e4m3) grid, ``S``
  a power of two (e8m0, groups of 32) or an e4m3 number (nvfp4, groups of 16).  Rounding
  to the nearest grid value moves an element by at most half the larger gap beside its
  code; the top code also holds the elements above it, up to how far the scale's own
  rounding let the group's maximum exceed ``top·S`` (``√2`` for a power of two chosen in
  log2, half the e4m3 spacing at ``S`` for nvfp4).

The settings (mode, bits, group size) come, in this order, from the MLX module that holds
the weight, the settings given (``quantization=``), the ``quantization`` block of an
mlx-lm ``config.json`` beside the files, or the shapes: a packed last axis of ``P`` words
and ``G`` scale groups for a reference axis of ``n`` elements means ``bits = 32·P/n`` and
``group_size = n/G``.  No MLX install is needed to read the shapes; decoding uses
``mx.dequantize``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..compare.read.sources import CompareInputError
from ..errors import BAD_WEIGHTS_INPUT

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Values = npt.NDArray[np.float64]

MODES = ("affine", "mxfp4", "mxfp8", "nvfp4")
AFFINE_BITS = (2, 3, 4, 5, 6, 8)
AFFINE_GROUPS = (32, 64, 128)
FLOAT_MODES = {"mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}  # mode: (bits, group)
PACKED_DTYPES = ("U32", "uint32")


@dataclass(frozen=True)
class QuantSpec:
    """How one weight is quantized, and where that was learnt (module, given, config, shapes)."""

    mode: str
    bits: int
    group_size: int
    source: str

    def describe(self) -> str:
        if self.mode == "affine":
            return f"{self.bits}-bit affine, groups of {self.group_size}"
        return f"{self.mode} ({self.bits}-bit, groups of {self.group_size})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "bits": self.bits,
            "group_size": self.group_size,
            "source": self.source,
        }


@dataclass
class Packed:
    """A packed weight and its companions, as found among a side's tensors."""

    prefix: str  # the module path: ``model.layers.0.mlp.up_proj``
    weight: str
    scales: str
    biases: str | None
    shape: tuple[int, ...]  # the packed weight's
    scales_shape: tuple[int, ...]
    scales_dtype: str
    read: Callable[[str], Any]  # a tensor by name, as stored (numpy, torch or MLX)
    to_float: Callable[[Any], Values]  # a stored tensor as float64 numpy
    spec: QuantSpec | None = None  # known from the module; else resolved at pairing

    def logical_shape(self, spec: QuantSpec) -> tuple[int, ...]:
        return (*self.shape[:-1], self.shape[-1] * 32 // spec.bits)


def parse_quantization(value: Any) -> dict[str, Any] | None:
    """``quantization=`` as given: a dict ``{mode, bits, group_size}`` (an mlx-lm
    ``config.json`` block, per-module entries included), a mode name (``mxfp4``), or
    ``bits=4,group_size=64[,mode=affine]``.  Raises ``bad_weights_input`` otherwise."""
    if value is None or isinstance(value, Mapping):
        return None if value is None else settings_block(value, "quantization")
    text = str(value).strip()
    if text in FLOAT_MODES:
        return _checked({"mode": text}, "quantization")
    fields: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, raw = part.partition("=")
        if not sep or key.strip() not in ("mode", "bits", "group_size"):
            raise CompareInputError(
                f"quantization {text!r}: give a mode (mxfp4, mxfp8, nvfp4) or "
                "bits=B,group_size=G[,mode=affine]",
                code=BAD_WEIGHTS_INPUT,
            )
        fields[key.strip()] = raw.strip()
    return _checked(fields, "quantization")


def _checked(fields: dict[str, Any], where: str) -> dict[str, Any]:
    mode = str(fields.get("mode") or "affine")
    if mode not in MODES:
        raise CompareInputError(
            f"{where}: unknown mode {mode!r} (known: {', '.join(MODES)})", code=BAD_WEIGHTS_INPUT
        )
    default_bits, default_group = FLOAT_MODES.get(mode, (4, 64))
    try:
        bits = int(fields.get("bits") or default_bits)
        group = int(fields.get("group_size") or default_group)
    except (TypeError, ValueError):
        raise CompareInputError(
            f"{where}: bits and group_size must be integers", code=BAD_WEIGHTS_INPUT
        ) from None
    allowed = (
        bits in AFFINE_BITS and group in AFFINE_GROUPS
        if mode == "affine"
        else (bits, group) == FLOAT_MODES[mode]
    )
    if not allowed:
        raise CompareInputError(
            f"{where}: MLX has no {mode} quantization with {bits} bits in groups of {group}",
            code=BAD_WEIGHTS_INPUT,
        )
    out: dict[str, Any] = {
        key: val for key, val in fields.items() if isinstance(val, Mapping | bool)
    }
    out.update(mode=mode, bits=bits, group_size=group)
    return out


def settings_block(fields: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A block of per-module entries (``{"model.layers.0.mlp.up_proj": {mode, bits,
    group_size}}``), with its own defaults when it has ``bits``; each entry checked."""
    if "bits" in fields or "mode" in fields:
        return _checked(dict(fields), where)
    return {
        key: val if isinstance(val, bool) else _checked(dict(val), f"{where}[{key!r}]")
        for key, val in fields.items()
        if isinstance(val, Mapping | bool)
    }


def config_quantization(path: Path) -> dict[str, Any] | None:
    """The ``quantization`` block of the mlx-lm ``config.json`` in or beside ``path``."""
    folder = path if path.is_dir() else path.parent
    config = folder / "config.json"
    if not config.is_file():
        return None
    try:
        block = json.loads(config.read_text()).get("quantization")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(block, Mapping):
        return None
    return settings_block(block, f"{config}: quantization")


def spec_from_settings(
    settings: Mapping[str, Any], prefix: str, source: str
) -> QuantSpec | bool | None:
    """The spec ``settings`` give the module ``prefix``: its own entry first (mlx-lm writes
    one per module quantized differently; ``False`` there means not quantized), then the
    block's own ``mode``/``bits``/``group_size``; None when they say nothing of it."""
    own = settings.get(prefix)
    if own is False:
        return False
    if isinstance(own, Mapping):
        chosen = _checked(dict(own), f"quantization[{prefix!r}]")
    elif "bits" in settings and "group_size" in settings:
        chosen = dict(settings)
    else:
        return None
    return QuantSpec(str(chosen["mode"]), int(chosen["bits"]), int(chosen["group_size"]), source)


def find_packed(
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, str],
    read: Callable[[str], Any],
    to_float: Callable[[Any], Values],
) -> dict[str, Packed]:
    """Every ``X.weight`` stored as packed ``uint32`` codes beside an ``X.scales``."""
    found: dict[str, Packed] = {}
    for name, dtype in dtypes.items():
        if not name.endswith("weight") or dtype not in PACKED_DTYPES:
            continue
        prefix = name[: -len("weight")]
        scales = prefix + "scales"
        if scales not in shapes:
            continue
        biases = prefix + "biases" if prefix + "biases" in shapes else None
        found[name] = Packed(
            prefix=prefix.rstrip("."),
            weight=name,
            scales=scales,
            biases=biases,
            shape=tuple(shapes[name]),
            scales_shape=tuple(shapes[scales]),
            scales_dtype=dtypes[scales],
            read=read,
            to_float=to_float,
        )
    return found


def infer_spec(packed: Packed, reference_shape: tuple[int, ...] | None) -> QuantSpec | str:
    """The spec the shapes allow (a reason when none or several do).

    The packed last axis holds ``32/bits`` codes per word and the scales one number per
    group, so the logical last axis ``n`` gives ``bits = 32·P/n`` and ``group = n/G``.
    ``n`` is taken from the reference's parameter (any of its axes: a transposed weight
    still pairs); without it, the settings MLX allows are tried and must agree."""
    words, groups = packed.shape[-1], packed.scales_shape[-1]
    affine = packed.biases is not None
    candidates: list[QuantSpec] = []
    axes = _unpacked_axes(packed.shape[:-1], reference_shape)
    for n in axes or [words * 32 // b for b in AFFINE_BITS if words * 32 % b == 0]:
        if n <= 0 or (words * 32) % n or n % groups:
            continue
        bits, group = words * 32 // n, n // groups
        if affine and bits in AFFINE_BITS and group in AFFINE_GROUPS:
            candidates.append(QuantSpec("affine", bits, group, "shapes"))
        for mode, settings in FLOAT_MODES.items():
            if not affine and settings == (bits, group):
                candidates.append(QuantSpec(mode, bits, group, "shapes"))
    unique = {(c.mode, c.bits, c.group_size): c for c in candidates}
    if len(unique) == 1:
        return next(iter(unique.values()))
    where = f"{list(packed.shape)} packed words, {list(packed.scales_shape)} scales"
    if not unique:
        return f"a packed quantized weight ({where}) that no MLX quantization fits" + (
            f" against the reference's {list(reference_shape)}" if reference_shape else ""
        )
    listed = ", ".join(c.describe() for c in unique.values())
    return f"a packed quantized weight ({where}) that fits {listed}: give quantization="


def _unpacked_axes(lead: tuple[int, ...], reference: tuple[int, ...] | None) -> list[int]:
    """The reference's axis that the packed one holds: what is left of the reference's
    shape once the packed weight's leading axes are taken out of it (as a multiset, so a
    weight transposed before quantizing still finds its axis)."""
    if not reference or len(reference) != len(lead) + 1:
        return []
    left = list(reference)
    for n in lead:
        if n not in left:
            return []
        left.remove(n)
    return left


def decode(packed: Packed, spec: QuantSpec) -> tuple[Values, Values]:
    """The weight's values as the port computes with them, and each element's allowance
    (how far quantization at ``spec`` may have moved it), both in float64."""
    import mlx.core as mx
    import numpy as np

    words = _as_mlx(packed.read(packed.weight), mx.uint32)
    lead = words.shape[:-1]
    words = words.reshape(-1, words.shape[-1])
    if spec.mode == "affine" and packed.biases is not None:
        scales = packed.to_float(packed.read(packed.scales)).reshape(words.shape[0], -1)
        biases = packed.to_float(packed.read(packed.biases)).reshape(words.shape[0], -1)
        unit = mx.ones(scales.shape, dtype=mx.float32)
        codes = np.array(
            mx.dequantize(
                words,
                unit,
                mx.zeros_like(unit),
                group_size=spec.group_size,
                bits=spec.bits,
                mode="affine",
                dtype=mx.float32,
            )
        ).astype(np.float64)
        step = np.repeat(scales, spec.group_size, axis=1)
        offset = np.repeat(biases, spec.group_size, axis=1)
        values = step * codes + offset
        u = _unit(packed.scales_dtype)
        allowance = np.abs(step) + u * (codes * np.abs(step) + np.abs(offset))
    else:
        raw = _as_mlx(packed.read(packed.scales), mx.uint8).reshape(words.shape[0], -1)
        scale = _decode_scale(raw, spec.mode)
        ones = mx.full(raw.shape, _UNIT_SCALE[spec.mode], dtype=mx.uint8)
        elements = np.array(
            mx.dequantize(
                words,
                ones,
                group_size=spec.group_size,
                bits=spec.bits,
                mode=spec.mode,
                dtype=mx.float32,
            )
        ).astype(np.float64)
        group_scale = np.repeat(scale, spec.group_size, axis=1)
        values = group_scale * elements
        allowance = group_scale * _half_gaps(
            elements, spec, np.repeat(_overshoot(raw, spec.mode), spec.group_size, axis=1)
        )
    shape = (*lead, values.shape[-1])
    return values.reshape(shape), allowance.reshape(shape)


_UNIT_SCALE = {"mxfp4": 127, "mxfp8": 127, "nvfp4": 0x38}  # the code of 1.0: e8m0, e4m3


def _decode_scale(raw: Any, mode: str) -> Values:
    import mlx.core as mx
    import numpy as np

    if mode == "nvfp4":
        return np.array(mx.from_fp8(raw, dtype=mx.float32)).astype(np.float64)
    return np.exp2(np.array(raw).astype(np.float64) - 127.0)


def _overshoot(raw: Any, mode: str) -> Values:
    """How far above ``top·S`` a group's largest element may lie, as a ratio minus one:
    the scale's own rounding (a power of two chosen in log2: ``√2``; an e4m3 scale: half
    the e4m3 spacing at ``S``, wide for subnormal scales)."""
    import mlx.core as mx
    import numpy as np

    codes = np.array(raw).astype(np.int64)
    if mode != "nvfp4":
        return np.full(codes.shape, math.sqrt(2.0) - 1.0)
    here = _decode_scale(raw, mode)
    above = np.minimum(codes + 1, 0x7E).astype(np.uint8)
    nxt = np.array(mx.from_fp8(mx.array(above), dtype=mx.float32)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(here > 0, (nxt - here) / (2.0 * here), 0.0)
    return ratio


def _grid(spec: QuantSpec) -> Values:
    """The element format's non-negative values, ascending."""
    import mlx.core as mx
    import numpy as np

    if spec.bits == 4:
        return np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    codes = mx.arange(0, 0x7F, dtype=mx.uint8)  # e4m3: 0x7F is NaN
    return np.unique(np.array(mx.from_fp8(codes, dtype=mx.float32)).astype(np.float64))


def _half_gaps(elements: Values, spec: QuantSpec, overshoot: Values) -> Values:
    """Per element: half the larger gap beside its code on the grid; for the top code, also
    what the elements clamped to it may have lost (``top·overshoot``)."""
    import numpy as np

    grid = _grid(spec)
    gaps = np.diff(grid)
    below = np.concatenate([[gaps[0]], gaps])  # 0's lower neighbour is -grid[1]
    above = np.concatenate([gaps, [0.0]])
    half = np.maximum(below, above) / 2.0
    index = np.clip(np.searchsorted(grid, np.abs(elements)), 0, len(grid) - 1)
    result = half[index]
    top = index == len(grid) - 1
    return np.where(top, np.maximum(result, grid[-1] * overshoot), result)


def input_rounding(packed: Packed, spec: QuantSpec) -> float:
    """The unit roundoff of the dtype the quantizer read: the scales' dtype in the affine
    mode (MLX keeps them in the input's dtype); the float modes' scales are bytes, so the
    coarsest dtype MLX quantizes (bfloat16) is assumed."""
    if spec.mode == "affine":
        return _unit(packed.scales_dtype)
    return _unit("BF16")


def _unit(dtype: str) -> float:
    from ..compare.judge.bounds import unit_roundoff

    u = unit_roundoff(dtype, dtype)
    return 0.0 if u is None else u


def _as_mlx(value: Any, dtype: Any) -> Any:
    import mlx.core as mx
    import numpy as np

    module = type(value).__module__
    if module.startswith("mlx"):
        return value.astype(dtype)
    if module.startswith("torch"):
        value = value.detach().cpu().numpy()
    return mx.array(np.ascontiguousarray(value)).astype(dtype)
