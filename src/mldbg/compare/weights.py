"""Weight audit: the port's loaded parameters against the reference's, name by name.

Porting guides name weight loading as the first cause of garbage output: a name that
does not match, a parameter never loaded (left at its initial value), a convolution
kernel moved into the wrong layout, a dtype conversion that lost precision.  Activations
show the symptom; this shows the cause, before any forward runs.

Each reference parameter is paired with the port's parameter of the same name after the
map (the ``--map`` file compare takes), then classified:

* ``ok``: same values up to one rounding of the coarser dtype (``|p - r| <= u |r|``
  element by element; exact for integers), possibly through the layout the port's
  framework uses (``OIHW→OHWI``, ``OIL→OLI``: MLX convolutions are channels-last).
* ``dtype``: as ``ok``, but stored in another dtype (reported, not a failure).
* ``never_loaded``: the port's value is its fresh initialization: identical to ``fresh``
  (the port model built again, same seed, nothing loaded) when given; otherwise a
  constant tensor (norm weights start at 1, biases at 0) where the reference's is not,
  or values uncorrelated with the reference's (``|cosine| < 4/sqrt(n)``) that no layout
  explains: a random initialization.
* ``layout``: equal only through another permutation of the axes (a transposed linear,
  a conv kernel with height and width swapped): the loader transposed it wrongly.
* ``shape``: the shapes differ and no permutation maps one onto the other.
* ``values``: paired, same layout, different values (a wrong conversion, a wrong file).
* ``missing`` / ``extra``: in the reference only / in the port only; a missing and an
  extra parameter holding the same values are one ``renamed`` parameter instead, with
  the map rule that pairs them in ``proposed_map``.

``ok``/``dtype``/``extra``/``renamed`` do not fail the audit; the rest do.
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

from ..capture.safetensors_header import CorruptTensorFile
from ..errors import BAD_WEIGHTS_INPUT, CORRUPT_FILE, UNREADABLE
from .mapping import NameMap, load_map, parse_map
from .sources import CompareInputError, Entry, Source, find_captures, open_source

if TYPE_CHECKING:  # numpy is imported where parameters are read
    import numpy as np
    import numpy.typing as npt

    Values: TypeAlias = npt.NDArray[np.float64]  # a parameter's values, in float64

FAILING = ("missing", "never_loaded", "layout", "shape", "values")
WARNING = ("renamed", "dtype", "extra")
# Layout conversions a port is expected to make (MLX convolutions are channels-last).
EXPECTED_LAYOUTS = {"OIHW→OHWI", "OIL→OLI", "OIDHW→ODHWI"}
_LETTERS = {2: "OI", 3: "OIL", 4: "OIHW", 5: "OIDHW"}
MAX_PERMUTED_DIMS = 5


@dataclass
class Params:
    """Parameters by name, each read (as float64 numpy) only when compared."""

    label: str
    framework: str | None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    readers: dict[str, Callable[[], Values]] = field(default_factory=dict)

    def read(self, name: str) -> Values:
        return self.readers[name]()


def audit_weights(
    reference: Any,
    port: Any,
    *,
    map: str | os.PathLike[str] | Mapping[str, Any] | None = None,  # noqa: A002 - compare's name
    fresh: Any = None,
    home: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Audit ``port``'s parameters against ``reference``'s (see the module docstring).

    Each of ``reference``/``port``/``fresh`` is a torch or MLX module (its parameters and
    buffers as loaded), a dict of tensors (torch, MLX or numpy), or a path: a
    ``.safetensors``/``.npz``/``.pt`` file or a directory of them.  Raises
    :class:`CompareInputError` for bad input."""
    from ..store.runs import mldbg_home

    base = Path(home) if home is not None else mldbg_home()
    names = parse_map(dict(map), "map") if isinstance(map, Mapping) else load_map(map)
    ref = collect(reference, base, "reference")
    prt = collect(port, base, "port")
    init = collect(fresh, base, "fresh") if fresh is not None else None
    return audit(ref, prt, names, init)


def collect(value: Any, home: Path, role: str) -> Params:
    """Parameters of a module, a dict of tensors or a path."""
    if isinstance(value, str | os.PathLike):
        return _from_path(os.fspath(value), home)
    kind = _framework_of(value)
    if kind == "torch":
        return _from_dict(value.state_dict(), f"{type(value).__name__} (torch)", "torch")
    if kind == "mlx":
        from mlx.utils import tree_flatten

        flat = dict(tree_flatten(value.parameters()))
        return _from_dict(flat, f"{type(value).__name__} (mlx)", "mlx")
    if isinstance(value, Mapping):
        return _from_dict(dict(value), f"{role} (dict of {len(value)})", None)
    raise CompareInputError(
        f"{role}: give a torch or MLX module, a dict of tensors, or a .safetensors/.npz/.pt "
        f"file or directory, not {type(value).__name__}",
        code=BAD_WEIGHTS_INPUT,
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
    source = open_source(str(weights) if weights is not None else spec, home)
    params = Params(source.label, None)
    for entry in source.entries:
        params.shapes[entry.name] = tuple(entry.shape)
        params.dtypes[entry.name] = entry.dtype
        params.readers[entry.name] = functools.partial(_read_entry, source, entry)
    return params


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
        params.readers[name] = functools.partial(_float64, value)
    return params


def _read_entry(source: Source, entry: Entry) -> Values:
    """One stored parameter; a file that turns out corrupt or unreadable is bad input
    with compare's codes (``corrupt_file``, ``unreadable``)."""
    try:
        return _float64(source.load(entry))
    except CorruptTensorFile as exc:
        raise CompareInputError(str(exc), code=CORRUPT_FILE) from None
    except OSError as exc:
        raise CompareInputError(
            f"cannot read {exc.filename or entry.file}: {exc.strerror or exc}", code=UNREADABLE
        ) from None


def _float64(value: Any) -> Values:
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
    rows: list[dict[str, Any]] = []
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
    for name in missing:
        found = _renamed(ref, port, name, extra)
        if found is None:
            rows.append(_row(ref, port, name, None, "missing", "not in the port"))
            continue
        extra = [e for e in extra if e[1] != found[1]]
        renames[found[1]] = name
        row = _row(ref, port, name, found[1], "renamed", f"in the port as {found[1]!r}")
        row.update(found[0])
        rows.append(row)
    for _mapped, other in extra:
        rows.append(
            {
                "name": None,
                "name_port": other,
                "status": "extra",
                "shape_port": list(port.shapes[other]),
                "dtype_port": port.dtypes[other],
                "note": "in the port only (a buffer it computes, or a name the map misses)",
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
        "port": {"label": port.label, "framework": port.framework, "count": len(port.shapes)},
        "fresh": None if fresh is None else {"label": fresh.label, "count": len(fresh.shapes)},
        "counts": counts,
        "problems": problems,
        "parameters": rows,
        "proposed_map": {"rename": renames} if renames else None,
    }


def _row(
    ref: Params, port: Params, name: str, other: str | None, status: str, note: str
) -> dict[str, Any]:
    row: dict[str, Any] = {
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


def _pair(ref: Params, port: Params, name: str, other: str, fresh: Params | None) -> dict[str, Any]:
    import numpy as np

    a, b = ref.read(name), port.read(other)
    u = _rounding(ref.dtypes[name], port.dtypes[other])
    row = _row(ref, port, name, other, "ok", "")
    row["rel_rms"] = _rel_rms(a, b) if a.shape == b.shape else None
    dtype_changed = ref.dtypes[name] != port.dtypes[other]
    if a.shape == b.shape and _close(a, b, u):
        if dtype_changed:
            row.update(
                status="dtype",
                note=f"{ref.dtypes[name]} → {port.dtypes[other]}, values within one rounding",
            )
        return row
    fresh_name = other if fresh is not None and other in fresh.shapes else None
    if fresh_name is not None and fresh is not None:
        initial = fresh.read(fresh_name)
        if initial.shape == b.shape and np.array_equal(initial, b):
            row.update(
                status="never_loaded", note="identical to a fresh initialization of the port"
            )
            return row
    layout = _layout(a, b, u)
    if layout is not None:
        expected = layout in EXPECTED_LAYOUTS
        row.update(
            layout=layout,
            status="dtype" if expected and dtype_changed else "ok" if expected else "layout",
            note=(
                f"stored as {layout.split('→')[1]}, the port framework's layout"
                if expected
                else f"equal only through the permutation {layout}: transposed by mistake"
                + (" (a transposed linear weight)" if layout == "OI→IO" else "")
            ),
        )
        return row
    if a.shape != b.shape:
        if _constant(b) and not _constant(a):
            row.update(status="never_loaded", note="holds one constant value, as initialized")
            return row
        row.update(
            status="shape",
            note=f"shapes {list(a.shape)} vs {list(b.shape)}: no permutation maps one onto the other",
        )
        return row
    if _constant(b) and not _constant(a):
        row.update(status="never_loaded", note="holds one constant value, as initialized")
        return row
    cosine = _cosine(a, b)
    row["cosine"] = cosine
    if a.size >= 64 and cosine is not None and abs(cosine) < 4.0 / math.sqrt(a.size):
        row.update(
            status="never_loaded", note="uncorrelated with the reference: a random initialization"
        )
        return row
    row.update(status="values", note="same name and shape, different values")
    return row


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
    a = ref.read(name)
    for other in candidates:
        b = port.read(other)
        u = _rounding(ref.dtypes[name], port.dtypes[other])
        if a.shape == b.shape and _close(a, b, u):
            return {"rel_rms": _rel_rms(a, b)}, other
        layout = _layout(a, b, u)
        if layout is not None:
            return {"layout": layout}, other
    return None


def _rounding(dtype_a: str, dtype_b: str) -> float:
    from .verdict import unit_roundoff

    u = unit_roundoff(dtype_a, dtype_b)
    return 0.0 if u is None else u


def _close(a: Values, b: Values, u: float) -> bool:
    import numpy as np

    if u == 0.0:
        return bool(np.array_equal(a, b, equal_nan=True))
    with np.errstate(invalid="ignore"):
        return bool(np.all((np.abs(b - a) <= u * np.abs(a)) | (np.isnan(a) & np.isnan(b))))


def _layout(a: Values, b: Values, u: float) -> str | None:
    """``"OIHW→OHWI"``: the port's axes, in the reference's letters, when ``b`` equals
    ``a`` only through a permutation (None when none does)."""
    if a.ndim != b.ndim or a.ndim < 2 or a.ndim > MAX_PERMUTED_DIMS:
        return None
    identity = tuple(range(a.ndim))
    for perm in itertools.permutations(range(a.ndim)):
        if perm == identity:
            continue
        if tuple(b.shape[p] for p in perm) != a.shape:
            continue
        if _close(a, b.transpose(perm), u):
            letters = _LETTERS[a.ndim]
            port_letters = [""] * a.ndim
            for i, p in enumerate(perm):
                port_letters[p] = letters[i]
            return f"{letters}→{''.join(port_letters)}"
    return None


def _constant(x: Values) -> bool:
    return bool(x.size > 1 and (x == x.flat[0]).all())


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
