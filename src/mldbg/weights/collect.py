"""Collecting one side's parameters: from a module, a dict of tensors, files or a capture.

Each source says different things about its parameters (a torch module its classes and
buffers, an MLX module its quantization, a capture what ``save_weights`` recorded, a
checkpoint directory its ``config.json``); this gathers them into one :class:`Params`,
packed quantized weights folded into values they decode to (``resolve_quantized``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..compare.pair.mapping import NameMap
from ..compare.read.sources import CompareInputError, Entry, Source, find_captures, open_source
from ..errors import BAD_WEIGHTS_INPUT, CORRUPT_CAPTURE
from .params import Params, to_float64
from .quantized import (
    Packed,
    QuantSpec,
    config_quantization,
    decode,
    find_packed,
    infer_spec,
    settings_block,
    spec_from_settings,
)

if TYPE_CHECKING:
    from .params import Values


def collect(value: Any, home: Path, role: str) -> Params:
    """Parameters of a module, a dict of tensors or a path."""
    if isinstance(value, str | os.PathLike):
        return from_path(os.fspath(value), home)
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


def _module_spec(module: object) -> QuantSpec | None:
    """What an MLX quantized module (``QuantizedLinear``, ``QuantizedEmbedding``, mlx-lm's
    ``QuantizedSwitchLinear``…) says of itself: its ``mode``, ``bits``, ``group_size``."""
    bits, group = getattr(module, "bits", None), getattr(module, "group_size", None)
    if not isinstance(bits, int) or not isinstance(group, int):
        return None
    return QuantSpec(str(getattr(module, "mode", "affine") or "affine"), bits, group, "module")


def inverse_names(port: Params, names: NameMap) -> Callable[[str], str]:
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


def _framework_of(value: object) -> str | None:
    for cls in type(value).__mro__:
        module = cls.__module__ or ""
        if module.startswith("torch.nn"):
            return "torch"
        if module.startswith("mlx.nn"):
            return "mlx"
    return None


def from_path(spec: str, home: Path) -> Params:
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
    layout depends on it).  A capture without calls gives none; one whose index is
    corrupt is said (``corrupt_capture``, its line), as compare says it."""
    try:
        source = open_source(str(directory), home)
    except CompareInputError as exc:
        if exc.code == CORRUPT_CAPTURE:
            raise
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
            f"capture {spec!r} holds no parameters: capture it again with its "
            "parameters (start's capture_weights), or give the checkpoint file",
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
