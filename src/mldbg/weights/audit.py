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
* ``missing`` / ``extra``: in the reference only / in the port only; a missing and an
  extra parameter holding the same values are one ``renamed`` parameter instead, with
  the map rule that pairs them in ``proposed_map``; a missing one holding another's
  values exactly is ``tied`` (an output head tied to the embedding), a missing buffer
  is ``buffer``, and parts one side concatenates into one tensor are ``fused``.

``ok``/``dtype``/``quantized``/``extra``/``renamed``/``tied``/``buffer``/``fused`` do not
fail the audit; the rest do.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from .. import dtypes
from ..compare.pair.mapping import NameMap, load_map, parse_map
from ..compare.read.sources import CompareInputError, Entry, Source, find_captures, open_source
from ..errors import BAD_WEIGHTS_INPUT
from .quantized import (
    Packed,
    QuantSpec,
    config_quantization,
    decode,
    find_packed,
    infer_spec,
    input_rounding,
    parse_quantization,
    settings_block,
    spec_from_settings,
)

if TYPE_CHECKING:  # numpy is imported where parameters are read
    import numpy as np
    import numpy.typing as npt

    Values: TypeAlias = npt.NDArray[np.float64]  # a parameter's values, in float64

FAILING = ("missing", "never_loaded", "layout", "shape", "values")
WARNING = ("renamed", "fused", "tied", "buffer", "quantized", "dtype", "extra")
# Layout conversions a port is expected to make (MLX convolutions are channels-last; a
# torch ConvTranspose kernel is (in, out, k…), MLX's (out, k…, in)).
EXPECTED_LAYOUTS = {
    "OIHW→OHWI",
    "OIL→OLI",
    "OIDHW→ODHWI",
    "IOHW→OHWI",
    "IOL→OLI",
    "IODHW→ODHWI",
    "IO→OI",
}
_LETTERS = {2: "OI", 3: "OIL", 4: "OIHW", 5: "OIDHW"}
# Kernels stored input-first: torch's ConvTranspose (in, out, k…) and transformers'
# ``Conv1D`` (GPT-2's projections: (in, out), a Linear's weight transposed).
_INPUT_FIRST_LETTERS = {2: "IO", 3: "IOL", 4: "IOHW", 5: "IODHW"}
MAX_PERMUTED_DIMS = 5
AGREEMENT_SAMPLE = 1 << 20  # elements drawn for the element agreement test (never_loaded)


# One parameter's row of the audit: name, name_port, status, note, shapes and dtypes, and
# per status its own fields (layout, quant, fused, cosine, agree): results.WeightAudit.
Row: TypeAlias = "dict[str, Any]"


@dataclass
class Params:
    """Parameters by name, each read (as float64 numpy) only when compared.

    A quantized weight (``quant``) reads as the values its codes decode to, with each
    element's allowance beside them (see ``quantized.py``); its ``scales``/``biases``
    are folded into it.  ``packed`` holds the quantized weights found but not yet
    resolved (their settings may need the reference's shape); ``unresolved`` the reason
    for those whose settings no source gives."""

    label: str
    framework: str | None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    readers: dict[str, Callable[[], Values]] = field(default_factory=dict)
    packed: dict[str, Packed] = field(default_factory=dict)
    settings: dict[str, Any] | None = None  # quantization given or from config.json
    settings_source: str = ""
    quant: dict[str, QuantSpec] = field(default_factory=dict)
    decoders: dict[str, Callable[[], tuple[Values, Values]]] = field(default_factory=dict)
    unresolved: dict[str, str] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)  # module path: class, when known
    ranks: list[str] = field(default_factory=list)  # the captures gathered, rank by rank
    buffers: set[str] = field(default_factory=set)  # names that are buffers, when known

    def read(self, name: str) -> Values:
        if name in self.decoders:
            return self.decoders[name]()[0]
        return self.readers[name]()

    def read_with_allowance(self, name: str) -> tuple[Values, Values | float]:
        """The values and how far each may be from the reference's for a reason other
        than a bug (quantization); 0.0 for a plain parameter."""
        if name in self.decoders:
            return self.decoders[name]()
        return self.readers[name](), 0.0


def audit_weights(
    reference: Any,
    port: Any,
    *,
    map: str | os.PathLike[str] | Mapping[str, Any] | None = None,  # noqa: A002 - compare's name
    fresh: Any = None,
    home: str | os.PathLike[str] | None = None,
    quantization: Any = None,
    shards: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
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
    if _names_ranks(port, base):
        prt = _from_ranks(str(port), base, shards or {})
    else:
        prt = collect(port, base, "port")
    init = collect(fresh, base, "fresh") if fresh is not None else None
    for side in (prt, init):
        if side is not None and given is not None:
            side.settings, side.settings_source = given, "given"
    resolve_quantized(prt, ref, names.to_a)
    resolve_quantized(ref, prt, _inverse(prt, names))
    if init is not None:
        resolve_quantized(init, ref, names.to_a)
    return audit(ref, prt, names, init)


def collect(value: Any, home: Path, role: str) -> Params:
    """Parameters of a module, a dict of tensors or a path."""
    if isinstance(value, str | os.PathLike):
        return _from_path(os.fspath(value), home)
    kind = _framework_of(value)
    if kind == "torch":
        state = value.state_dict()
        params = _from_dict(state, f"{type(value).__name__} (torch)", "torch")
        params.classes = {path: type(m).__name__ for path, m in value.named_modules()}
        params.buffers = {name for name, _ in value.named_buffers() if name in state}
        return params
    if kind == "mlx":
        from mlx.utils import tree_flatten

        flat = dict(tree_flatten(value.parameters()))
        params = _from_dict(flat, f"{type(value).__name__} (mlx)", "mlx")
        for path, module in value.named_modules():
            params.classes[path] = type(module).__name__
            spec = _module_spec(module)
            weight = f"{path}.weight" if path else "weight"
            if spec is not None and weight in params.packed:
                params.packed[weight].spec = spec
        return params
    if isinstance(value, Mapping):
        return _from_dict(dict(value), f"{role} (dict of {len(value)})", None)
    raise CompareInputError(
        f"{role}: give a torch or MLX module, a dict of tensors, or a .safetensors/.npz/.pt "
        f"file or directory, not {type(value).__name__}",
        code=BAD_WEIGHTS_INPUT,
    )


def _names_ranks(value: Any, home: Path) -> bool:
    """Whether ``value`` is a glob over capture names (``tp@rank*``), not a path."""
    if not isinstance(value, str) or not any(c in value for c in "*?["):
        return False
    return not Path(value).expanduser().exists()


def _from_ranks(spec: str, home: Path, shards: Mapping[str, Any]) -> Params:
    """The parameters of a model split over ranks, gathered from each rank's capture
    (``NAME@rank<r>``, saved with ``--capture-weights``): a parameter matching a
    ``shards`` glob is the ranks' slices concatenated along its dimension, in rank
    order; any other is replicated (rank 0's)."""
    import fnmatch

    import numpy as np

    from ..compare.read.gather import check_shards, ranked_captures

    rules = check_shards(shards)
    for pattern, rule in rules.items():
        if rule == "sum":
            raise CompareInputError(
                f"shards: {pattern!r}: parameters are split along a dimension, not summed "
                "('sum' is for activations' partial sums)",
                code=BAD_WEIGHTS_INPUT,
            )
    ranked = ranked_captures(spec, home)
    sides = [_from_path(str(m["path"]), home) for m in ranked]
    base = sides[0]
    params = Params(f"{spec} ({len(sides)} ranks gathered)", None)
    params.ranks = [str(m["name"]) for m in ranked]
    params.classes, params.buffers = base.classes, base.buffers
    for name in base.shapes:
        split = next((r for p, r in rules.items() if fnmatch.fnmatchcase(name, p)), None)
        params.dtypes[name] = base.dtypes[name]
        if split is None or name in base.packed:
            params.shapes[name] = base.shapes[name]
            params.readers[name] = base.readers[name]
            continue
        missing = [side.label for side in sides if name not in side.shapes]
        if missing:
            raise CompareInputError(
                f"{name} is split over the ranks but {missing[0]} lacks it", code=BAD_WEIGHTS_INPUT
            )
        shape = list(base.shapes[name])
        axis = int(split) % len(shape) if shape else 0
        shape[axis] = sum(side.shapes[name][axis] for side in sides)
        params.shapes[name] = tuple(shape)
        readers = [side.readers[name] for side in sides]
        params.readers[name] = functools.partial(
            lambda parts, dim: np.concatenate([read() for read in parts], axis=dim), readers, axis
        )
    params.packed = {k: v for k, v in base.packed.items() if k in params.shapes}
    params.settings, params.settings_source = base.settings, base.settings_source
    return params


def _module_spec(module: Any) -> QuantSpec | None:
    """What an MLX quantized module (``QuantizedLinear``, ``QuantizedEmbedding``, mlx-lm's
    ``QuantizedSwitchLinear``…) says of itself: its ``mode``, ``bits``, ``group_size``."""
    bits, group = getattr(module, "bits", None), getattr(module, "group_size", None)
    if not isinstance(bits, int) or not isinstance(group, int):
        return None
    return QuantSpec(str(getattr(module, "mode", "affine") or "affine"), bits, group, "module")


def _inverse(port: Params, names: NameMap) -> Callable[[str], str]:
    """The port's name for a reference name (for a quantized reference's shape hints)."""
    back = {names.to_a(name): name for name in port.shapes}
    return lambda name: back.get(name, name)


def resolve_quantized(side: Params, other: Params, other_name: Callable[[str], str]) -> None:
    """Fold each packed weight of ``side`` and its scales/biases into one parameter that
    reads as its decoded values (``Params.quant``), its settings from the module, the
    settings given or in ``config.json``, or else the shapes against ``other``'s
    parameter of the same name."""
    for name, packed in side.packed.items():
        spec: QuantSpec | str | None = packed.spec
        if spec is None and side.settings is not None:
            said = spec_from_settings(side.settings, packed.prefix, side.settings_source)
            if said is False:
                continue  # the settings say this module is not quantized
            spec = said if isinstance(said, QuantSpec) else None
        if spec is None:
            spec = infer_spec(packed, other.shapes.get(other_name(name)))
        for companion in (packed.scales, packed.biases):
            if companion is not None:
                side.shapes.pop(companion, None)
                side.dtypes.pop(companion, None)
                side.readers.pop(companion, None)
        if isinstance(spec, str):
            side.unresolved[name] = spec
            continue
        if not _fits(packed, spec):
            side.unresolved[name] = (
                f"a packed quantized weight ({list(packed.shape)} words, "
                f"{list(packed.scales_shape)} scales) that {spec.describe()} does not fit"
            )
            continue
        side.quant[name] = spec
        side.shapes[name] = packed.logical_shape(spec)
        side.decoders[name] = functools.partial(decode, packed, spec)


def _fits(packed: Packed, spec: QuantSpec) -> bool:
    n = packed.shape[-1] * 32
    return (
        n % spec.bits == 0
        and (n // spec.bits) == packed.scales_shape[-1] * spec.group_size
        and (packed.biases is not None) == (spec.mode == "affine")
    )


def _framework_of(value: Any) -> str | None:
    for cls in type(value).__mro__:
        module = cls.__module__ or ""
        if module.startswith("torch.nn"):
            return "torch"
        if module.startswith("mlx.nn"):
            return "mlx"
    return None


def _from_path(spec: str, home: Path) -> Params:
    weights = _capture_weights(spec, home)
    path = weights if weights is not None else Path(spec).expanduser()
    found = _parameter_files(path) if path.exists() else None
    # A capture or run named, or the error that says why; else each file of the checkpoint.
    sources = (
        [open_source(spec, home)]
        if found is None
        else [open_source(str(file), home) for file in found]
    )
    params = Params(str(path) if len(sources) > 1 else sources[0].label, None)
    raw: dict[str, tuple[Source, Entry]] = {}
    for source in sources:
        for entry in source.entries:
            # Keyed by the name inside the file: compare names a one-tensor file by its stem.
            name = entry.key or entry.name
            if name in raw:
                raise CompareInputError(
                    f"{path}: {name!r} is in both {raw[name][0].label} and {source.label}",
                    code=BAD_WEIGHTS_INPUT,
                )
            raw[name] = (source, entry)
            params.shapes[name] = tuple(entry.shape)
            params.dtypes[name] = entry.dtype
            params.readers[name] = functools.partial(_read_entry, source, entry)
    params.packed = find_packed(
        params.shapes, params.dtypes, lambda name: raw[name][0].load(raw[name][1]), to_float64
    )
    if weights is None:
        params.settings = config_quantization(path)
        params.settings_source = "config.json"
    else:
        saved = _capture_saved(weights.parent)
        block = saved.get("quantization")
        where = "capture.json: weights.quantization"
        params.settings = settings_block(block, where) if block else None
        params.settings_source = "capture"
        params.buffers = {str(name) for name in saved.get("buffers") or ()}
        params.classes = _capture_classes(weights.parent, home)
    return params


def _capture_classes(directory: Path, home: Path) -> dict[str, str]:
    """Module path: class, from the capture's recorded calls (a ConvTranspose kernel's
    layout depends on it)."""
    try:
        source = open_source(str(directory), home)
    except CompareInputError:
        return {}
    return {call.module: call.class_name for call in source.calls.values()}


def _parameter_files(path: Path) -> list[Path] | None:
    """The files of a checkpoint: the file itself, or a directory's own tensor files
    (shards, as transformers, diffusers and mlx-lm save them); None for a directory that
    is a capture or run (``open_source`` reads those)."""
    from ..compare.read.sources import TENSOR_SUFFIXES

    if path.is_file():
        return [path]
    if not path.is_dir():  # a FIFO, a device: open_source says what it is, with its code
        return None
    if (path / "capture.json").is_file() or (path / "run.json").is_file():
        return None
    files = sorted(
        p
        for p in path.iterdir()
        if p.is_file() and p.suffix in TENSOR_SUFFIXES and not p.name.startswith(".")
    )
    return files or None


def _capture_saved(directory: Path) -> dict[str, Any]:
    """What a capture's ``save_weights`` recorded in ``capture.json`` (``weights``): the
    quantized modules' settings, one entry per module path, and the buffers' names."""
    from ..store.reading import read_json

    try:
        meta = read_json(directory / "capture.json")  # regular files only: a FIFO never blocks
    except (OSError, ValueError):
        return {}
    saved = meta.get("weights") if isinstance(meta, dict) else None
    return saved if isinstance(saved, dict) else {}


def _capture_weights(spec: str, home: Path) -> Path | None:
    """A capture's ``weights.safetensors`` (``start --capture-weights``), by the capture's
    directory or name; None for anything else."""
    from ..capture import WEIGHTS

    path = Path(spec).expanduser()
    if path.is_dir() and (path / WEIGHTS).is_file():
        return path / WEIGHTS
    if path.exists():
        return None
    found = [c for c in find_captures(home) if c["name"] == spec]
    if found and (Path(found[-1]["path"]) / WEIGHTS).is_file():
        return Path(found[-1]["path"]) / WEIGHTS
    if found:
        raise CompareInputError(
            f"capture {spec!r} holds no parameters: capture with --capture-weights "
            "(or save them and give the file)",
            code=BAD_WEIGHTS_INPUT,
        )
    return None


def _from_dict(values: dict[str, Any], label: str, framework: str | None) -> Params:
    from ..capture.sketch import dtype_name

    params = Params(label, framework)
    for name, value in values.items():
        params.shapes[name] = tuple(int(n) for n in value.shape)
        params.dtypes[name] = dtype_name(value.dtype)
        params.readers[name] = functools.partial(to_float64, value)
    params.packed = find_packed(params.shapes, params.dtypes, values.__getitem__, to_float64)
    return params


def _read_entry(source: Source, entry: Entry) -> Values:
    """One stored parameter, in float64 (bad files answer compare's codes)."""
    return to_float64(source.load_checked(entry))


def to_float64(value: Any) -> Values:
    """Any tensor as a float64 numpy array (bf16 exactly)."""
    import numpy as np

    module = type(value).__module__
    if module.startswith("torch"):
        return value.detach().to(dtype=_torch_float64()).cpu().numpy()
    if module.startswith("mlx"):
        import mlx.core as mx

        if mx.issubdtype(value.dtype, mx.floating) and value.dtype != mx.float32:
            value = value.astype(mx.float32)
        return np.array(value).astype(np.float64)
    return np.asarray(value).astype(np.float64)


def _torch_float64() -> Any:
    import torch

    return torch.float64


# -- the audit ---------------------------------------------------------------------------------


def audit(ref: Params, port: Params, names: NameMap, fresh: Params | None) -> dict[str, Any]:
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
        rows.append(_pair(ref, port, name, other, fresh))
    extra = list(port_by_ref_name.items())  # (name in A's terms, port's own name)
    renames: dict[str, str] = {}
    fused_rows, missing, extra = _fused(ref, port, missing, extra)
    rows.extend(fused_rows)
    for name in missing:
        found = _renamed(ref, port, name, extra)
        tie = _tied(ref, name, missing) if found is None else None
        if tie is not None:
            note = (
                f"tied to {tie!r} in the reference (the same values); the port keeps "
                f"{tie!r} only and uses it for both"
            )
            rows.append(_row(ref, port, name, None, "tied", note))
            continue
        if found is None and name in ref.buffers:
            note = "a buffer of the reference, not in the port: computed there, or not needed?"
            rows.append(_row(ref, port, name, None, "buffer", note))
            continue
        if found is None:
            rows.append(_row(ref, port, name, None, "missing", "not in the port"))
            continue
        extra = [e for e in extra if e[1] != found[1]]
        renames[found[1]] = name
        row = _row(ref, port, name, found[1], "renamed", f"in the port as {found[1]!r}")
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


def _row(ref: Params, port: Params, name: str, other: str | None, status: str, note: str) -> Row:
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


def _pair(ref: Params, port: Params, name: str, other: str, fresh: Params | None) -> Row:
    """One parameter of the reference against the port's: the first explanation that
    fits decides its row (within rounding, never loaded, a layout, axes of size 1, a
    shape, then how the values differ)."""
    if other in port.unresolved or name in ref.unresolved:
        row = _row(ref, port, name, other, "shape", "")
        row["note"] = port.unresolved.get(other) or ref.unresolved[name]
        return row
    pair = _Judged.read(ref, port, name, other)
    if pair.within_rounding():
        return pair.row
    fresh_name = other if fresh is not None and other in fresh.shapes else None
    if fresh_name is not None and fresh is not None and pair.as_initialized(fresh.read(fresh_name)):
        return pair.row
    transposed_conv = _is_transposed_conv(ref, name) or _is_transposed_conv(port, other)
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
        slack_b = slack_b + _underflow(ref.dtypes[name], port.dtypes[other])
        quant = port.quant.get(other) or ref.quant.get(name)
        u = _rounding(ref.dtypes[name], port.dtypes[other])
        for side, key in ((port, other), (ref, name)):
            if key in side.quant:
                u = max(u, input_rounding(side.packed[key], side.quant[key]))
        row = _row(ref, port, name, other, "ok", "")
        if quant is not None:
            row["quant"] = _quant_fields(ref, port, name, other)
        row["rel_rms"] = _rel_rms(a, b) if a.shape == b.shape else None
        dtype_changed = ref.dtypes[name] != port.dtypes[other]
        return cls(a, b, slack_a, slack_b, u, quant, dtype_changed, row)

    def _agreeing_status(self) -> str:
        """The status of values that agree: quantized, a changed dtype, or plainly ok."""
        return "quantized" if self.quant is not None else "dtype" if self.dtype_changed else "ok"

    def within_rounding(self) -> bool:
        a, b, row, quant = self.a, self.b, self.row, self.quant
        if a.shape != b.shape or not _close(a, b, self.u, self.slack_a, self.slack_b):
            return False
        if quant is not None:
            row["quant"]["worst"] = _worst(a, b, self.u, self.slack_a, self.slack_b)
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
        layout = _layout(self.a, self.b, self.u, self.slack_a, self.slack_b, transposed_conv)
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
                + _layout_hint(layout, transposed_conv)
            )
            + (f", within what {quant.describe()} explains" if quant is not None else ""),
        )
        return True

    def through_unit_axes(self, transposed_conv: bool) -> bool:
        unit = _unit_axes(self.a, self.b, self.u, self.slack_a, self.slack_b, transposed_conv)
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
        if _constant(b) and not _constant(a):
            row.update(status="never_loaded", note="holds one constant value, as initialized")
            return
        if a.shape != b.shape:
            row.update(
                status="shape",
                note=f"shapes {list(a.shape)} vs {list(b.shape)}: "
                "no permutation maps one onto the other",
            )
            return
        cosine = _cosine(a, b)
        row["cosine"] = cosine
        agree, chance = _agreement(a, b, self.u, self.slack_a, self.slack_b)
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
            row["quant"]["worst"] = _worst(a, b, self.u, self.slack_a, self.slack_b)
            row.update(
                status="values",
                note=f"outside what {quant.describe()} explains: an element is "
                f"{row['quant']['worst']:.3g}x its allowance",
            )
        else:
            row.update(status="values", note="same name and shape, different values")


def _fused(
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
            _row_port(port, other, "fused", f"the concatenation of {listed} along axis {axis}")
        )
        for name, start, stop in spans:
            row = _row(ref, port, name, other, "fused", "")
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
            _row(
                ref, port, name, None, "fused", f"split in the port into {listed} along axis {axis}"
            )
        )
        for other, start, stop in spans:
            row = _row_port(port, other, "fused", f"[{start}:{stop}] along axis {axis} of {name!r}")
            row["fused"] = {"into": name, "axis": axis, "start": start, "stop": stop}
            rows.append(row)
            del by_port[other]
        missing.remove(name)
    return rows, missing, [(mapped, other) for other, mapped in by_port.items()]


def _row_port(port: Params, other: str, status: str, note: str) -> Row:
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
            part_slack = part_slack + _underflow(whole_side.dtypes[whole], parts_side.dtypes[c])
            u = _rounding(whole_side.dtypes[whole], parts_side.dtypes[c])
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
                if _close(part, piece, u, part_slack, piece_slack):
                    spans.append((c, int(begin), stop))
                    taken[begin:stop] = True
                    break
        if len(spans) >= 2 and taken.all():
            return axis, sorted(spans, key=lambda span: span[1])
    return None


def _tied(ref: Params, name: str, missing: list[str]) -> str | None:
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
    if _constant(values) or values.size < 2:
        return None  # equal constants (norms at 1) are no evidence of a tie
    for other in candidates:
        if np.array_equal(ref.read(other), values):
            return other
    return None


def _is_transposed_conv(side: Params, name: str) -> bool:
    """Whether ``name`` is an input-first kernel: a ConvTranspose module's, or the weight
    of transformers' ``Conv1D`` (known from a module or a capture's classes; files do
    not say)."""
    cls = side.classes.get(name.rpartition(".")[0], "")
    return "ConvTranspose" in cls or (cls == "Conv1D" and len(side.shapes.get(name, ())) == 2)


def _layout_hint(layout: str, transposed_conv: bool) -> str:
    if layout == "OI→IO":
        return " (a transposed linear weight)"
    if transposed_conv and layout.startswith("IO") and layout.endswith("O"):
        return " (a transposed convolution converted as a convolution: MLX wants it O…I)"
    if not transposed_conv and layout in ("OIHW→IHWO", "OIL→ILO", "OIDHW→IDHWO"):
        return (
            " unless this is a ConvTranspose kernel (torch IO…, MLX O…I: this is then its "
            "right layout): audit the modules or captures so the class is known"
        )
    return ""


def _quant_fields(ref: Params, port: Params, name: str, other: str) -> dict[str, Any]:
    """The quantization of the pair's weights (the port's; the reference's as ``reference``
    when it is quantized too)."""
    fields: dict[str, Any] = {}
    if other in port.quant:
        fields.update(port.quant[other].as_dict())
        fields["scales_dtype"] = port.packed[other].scales_dtype
    if name in ref.quant:
        fields["reference"] = ref.quant[name].as_dict()
    return fields


def _renamed(
    ref: Params, port: Params, name: str, extra: list[tuple[str, str]]
) -> tuple[dict[str, Any], str] | None:
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
        slack_b = slack_b + _underflow(ref.dtypes[name], port.dtypes[other])
        u = _rounding(ref.dtypes[name], port.dtypes[other])
        if other in port.quant:
            u = max(u, input_rounding(port.packed[other], port.quant[other]))
        if a.shape == b.shape and _close(a, b, u, slack_a, slack_b):
            return {"rel_rms": _rel_rms(a, b)}, other
        layout = _layout(a, b, u, slack_a, slack_b)
        if layout is not None:
            return {"layout": layout}, other
    return None


def _rounding(dtype_a: str, dtype_b: str) -> float:
    from ..compare.judge.bounds import unit_roundoff

    u = unit_roundoff(dtype_a, dtype_b)
    return 0.0 if u is None else u


def _underflow(dtype_a: str, dtype_b: str) -> float:
    """Half the coarser subnormal spacing of the two dtypes (0 for integers): below the
    smallest normal a conversion rounds to a grid of that spacing, an absolute error the
    relative ``u·|r|`` does not cover (float16 weights of std 0.02 have such elements)."""
    spacings = [
        (found.min_subnormal if found else None) for found in map(dtypes.lookup, (dtype_a, dtype_b))
    ]
    return max((s for s in spacings if s is not None), default=0.0) / 2.0


def _close(
    a: Values, b: Values, u: float, slack_a: Values | float = 0.0, slack_b: Values | float = 0.0
) -> bool:
    """``|b − a| ≤ u·|a| + slack`` element by element (exact when both are zero)."""
    import numpy as np

    if u == 0.0 and np.isscalar(slack_a) and np.isscalar(slack_b) and not (slack_a or slack_b):
        return bool(np.array_equal(a, b, equal_nan=True))
    with np.errstate(invalid="ignore"):
        allowed = u * np.abs(a) + slack_a + slack_b
        return bool(np.all((np.abs(b - a) <= allowed) | (np.isnan(a) & np.isnan(b))))


def _worst(
    a: Values, b: Values, u: float, slack_a: Values | float, slack_b: Values | float
) -> float:
    """The largest ``|b − a|`` over its allowance (≤ 1 when every element is explained)."""
    import numpy as np

    allowed = u * np.abs(a) + slack_a + slack_b
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(allowed > 0, np.abs(b - a) / allowed, np.where(a == b, 0.0, np.inf))
    return float(np.max(ratio)) if ratio.size else 0.0


def _layout(
    a: Values,
    b: Values,
    u: float,
    slack_a: Values | float = 0.0,
    slack_b: Values | float = 0.0,
    transposed_conv: bool = False,
    letters: str | None = None,
) -> str | None:
    """``"OIHW→OHWI"``: the port's axes, in the reference's letters (``IOHW`` for a
    ConvTranspose kernel), when ``b`` equals ``a`` only through a permutation (None when
    none does)."""
    import numpy as np

    if a.ndim != b.ndim or a.ndim < 2 or a.ndim > MAX_PERMUTED_DIMS:
        return None
    if letters is None:
        letters = _INPUT_FIRST_LETTERS[a.ndim] if transposed_conv else _LETTERS[a.ndim]
    identity = tuple(range(a.ndim))
    for perm in itertools.permutations(range(a.ndim)):
        if perm == identity:
            continue
        if tuple(b.shape[p] for p in perm) != a.shape:
            continue
        moved = slack_b if isinstance(slack_b, float) else np.transpose(slack_b, perm)
        if _close(a, b.transpose(perm), u, slack_a, moved):
            port_letters = [""] * a.ndim
            for i, p in enumerate(perm):
                port_letters[p] = letters[i]
            return f"{letters}→{''.join(port_letters)}"
    return None


def _unit_axes(
    a: Values,
    b: Values,
    u: float,
    slack_a: Values | float,
    slack_b: Values | float,
    transposed_conv: bool,
) -> tuple[str, bool] | None:
    """Two shapes that differ only by axes of size 1 (a 1×1 convolution's kernel
    ``(O, I, 1, 1)`` kept as a linear weight ``(O, I)``, or a linear weight as MLX's 1×1
    convolution ``(O, 1, 1, I)``): ``("OIHW→OI", True)`` when the values agree in the same
    order (the port's unit axes written ``1``), ``("OIHW→IO", False)`` when only through a
    permutation of the other axes; None otherwise."""
    import numpy as np

    if a.size != b.size or a.shape == b.shape or a.ndim > MAX_PERMUTED_DIMS:
        return None
    if b.ndim > MAX_PERMUTED_DIMS or max(a.ndim, b.ndim) < 2:
        return None
    full = (
        _INPUT_FIRST_LETTERS.get(a.ndim, _LETTERS.get(a.ndim, ""))
        if transposed_conv
        else _LETTERS.get(a.ndim, "")
    ) or "X" * a.ndim
    kept = [i for i, n in enumerate(a.shape) if n != 1]
    letters = "".join(full[i] for i in kept)
    squeezed_a = a.reshape([a.shape[i] for i in kept])
    squeezed_b = b.reshape([n for n in b.shape if n != 1])

    def squeezed(slack: Values | float, shape: tuple[int, ...]) -> Values | float:
        return slack if isinstance(slack, float) else np.reshape(slack, shape)

    slack_a2 = squeezed(slack_a, squeezed_a.shape)
    slack_b2 = squeezed(slack_b, squeezed_b.shape)
    if squeezed_a.shape == squeezed_b.shape and _close(
        squeezed_a, squeezed_b, u, slack_a2, slack_b2
    ):
        order = iter(letters)
        port = "".join("1" if n == 1 else next(order) for n in b.shape)
        return f"{full}→{port}", True
    moved = _layout(squeezed_a, squeezed_b, u, slack_a2, slack_b2, letters=letters)
    if moved is not None:
        return f"{full}→{moved.split('→')[1]}", False
    return None


def _constant(x: Values) -> bool:
    return bool(x.size > 1 and (x == x.flat[0]).all())


def _agreement(
    a: Values, b: Values, u: float, slack_a: Values | float, slack_b: Values | float
) -> tuple[float, float]:
    """The share of the reference's non-zero elements the port equals within rounding,
    and the share chance gives: the same test against the reference's elements in a
    seeded random order (values as alike as the reference's own, paired at random).  A
    random initialization agrees no more than chance; a parameter loaded from the wrong
    slice agrees in the part it got right.  Zeros are left out: a zero agrees with any
    multiple of itself."""
    import numpy as np

    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    allowed_b = slack_b if isinstance(slack_b, float) else np.reshape(slack_b, -1)
    allowed_a = slack_a if isinstance(slack_a, float) else np.reshape(slack_a, -1)
    if flat_a.size > AGREEMENT_SAMPLE:  # a seeded sample keeps a large tensor's cost bounded
        rows = np.random.default_rng(1).choice(flat_a.size, AGREEMENT_SAMPLE, replace=False)
        flat_a, flat_b = flat_a[rows], flat_b[rows]
        allowed_a = allowed_a if isinstance(allowed_a, float) else allowed_a[rows]
        allowed_b = allowed_b if isinstance(allowed_b, float) else allowed_b[rows]
    nonzero = flat_a != 0
    if int(nonzero.sum()) < 2:
        return 0.0, 0.0
    order = np.random.default_rng(0).permutation(flat_a.size)
    shuffled = flat_a[order]
    moved = allowed_a if isinstance(allowed_a, float) else allowed_a[order]
    with np.errstate(invalid="ignore"):
        agree = np.abs(flat_b - flat_a) <= u * np.abs(flat_a) + allowed_a + allowed_b
        chance = np.abs(flat_b - shuffled) <= u * np.abs(shuffled) + moved + allowed_b
    return float(np.mean(agree[nonzero])), float(np.mean(chance[shuffled != 0]))


def _cosine(a: Values, b: Values) -> float | None:
    import numpy as np

    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 or nb == 0:
        return None
    return float(np.vdot(a, b)) / (na * nb)


def _rel_rms(a: Values, b: Values) -> float | None:
    import numpy as np

    na = float(np.linalg.norm(a))
    diff = float(np.linalg.norm(b - a))
    return diff / na if na else (0.0 if diff == 0 else None)


def render_audit(result: dict[str, Any], limit: int = 20) -> str:
    """The human report: the verdict, then each problem (failures first)."""
    counts = ", ".join(f"{n} {status}" for status, n in sorted(result["counts"].items()))
    lines = [
        f"weights: {'OK' if result['ok'] else 'PROBLEMS'} - {result['reference']['label']} "
        f"({result['reference']['count']}) vs {result['port']['label']} ({result['port']['count']}): {counts}"
    ]
    for row in result["problems"][:limit]:
        name = row["name"] or row["name_port"]
        port = f" (port: {row['name_port']})" if row.get("name_port") not in (None, name) else ""
        lines.append(f"  {row['status']:<13} {name}{port}: {row['note']}")
    more = len(result["problems"]) - limit
    if more > 0:
        lines.append(f"  … {more} more (--limit, or --json for all)")
    if result.get("proposed_map"):
        lines.append("  map for the renamed ones: " + str(result["proposed_map"]))
    return "\n".join(lines)
