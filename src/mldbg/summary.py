"""One bounded summary of any value, tensor-aware.

Imported inside the debugged process, so it imports only the standard library: a torch
tensor can only exist if the script imported torch, so the frameworks are taken from
``sys.modules`` instead of being imported here.  Tensor statistics are computed on the
tensor's own device (floats of 16 bits in float32) and only a few values ever reach the
host, so a 1e8-element tensor summarizes as quickly and as briefly as a small one.
"""

from __future__ import annotations

import contextlib
import math
import reprlib
import sys
from typing import Any

PREVIEW = 8
REPR_LIMIT = 1000
_JSON_SCALARS = (bool, int, float, str, type(None))


def _framework(value: object) -> str | None:
    module = type(value).__module__ or ""
    if module.startswith("torch") and "torch" in sys.modules:
        if isinstance(value, sys.modules["torch"].Tensor):
            return "torch"
    elif module.startswith("mlx") and "mlx.core" in sys.modules:
        if isinstance(value, sys.modules["mlx.core"].array):
            return "mlx"
    elif (
        module == "numpy"
        and "numpy" in sys.modules
        and isinstance(value, sys.modules["numpy"].ndarray)
    ):
        return "numpy"
    return None


def is_tensor(value: object) -> bool:
    """torch.Tensor (parameters included), mlx.core.array or numpy.ndarray."""
    try:
        return _framework(value) is not None
    except Exception:
        return False


def type_name(value: object) -> str:
    kind = type(value)
    if _safe_framework(value) == "torch":
        return "torch.Tensor"
    if kind.__module__ in ("builtins", None):
        return kind.__qualname__
    module = kind.__module__
    if module == "mlx.core":
        return f"mlx.core.{kind.__qualname__}"
    return f"{module}.{kind.__qualname__}"


def _safe_framework(value: object) -> str | None:
    try:
        return _framework(value)
    except Exception:
        return None


def _bounded_repr() -> reprlib.Repr:
    """reprlib elides inside containers, so a million-element list costs what twenty do."""
    r = reprlib.Repr()
    r.maxlevel = 4
    r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 32
    r.maxdict = 24
    r.maxstring = r.maxlong = r.maxother = 400
    return r


_REPR = _bounded_repr()
_CONTAINERS = (list, tuple, dict, set, frozenset)


def safe_repr(value: object, max_chars: int = 4096) -> str:
    """``repr`` that never raises and never grows past ``max_chars``.

    Containers go through reprlib (elided inside); other objects choose their own repr,
    cut here when long.
    """
    try:
        text = _REPR.repr(value) if isinstance(value, _CONTAINERS) else repr(value)
    except Exception as exc:
        text = f"<repr failed: {type(exc).__name__}: {exc}>"
    if len(text) > max_chars:
        suffix = f"… ({len(text)} chars)"
        return text[: max(0, max_chars - len(suffix))] + suffix
    return text


def _json_number(x: float | int | bool) -> float | int | bool | str:
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


# -- tensors ----------------------------------------------------------------------------------


def _header(kind: str, shape: Any, dtype: str, device: str, numel: int) -> dict[str, Any]:
    """The keys every tensor summary has; preview and stats are filled in when there are values."""
    return {
        "type": kind,
        "shape": list(shape),
        "dtype": dtype,
        "device": device,
        "numel": numel,
        "preview": [],
        "stats": None,
    }


def _torch_summary(t: Any) -> dict[str, Any]:
    torch = sys.modules["torch"]
    requires_grad = bool(getattr(t, "requires_grad", False))
    t = t.detach()
    out = _header(
        "torch.Tensor", t.shape, str(t.dtype).removeprefix("torch."), str(t.device), t.numel()
    )
    out["requires_grad"] = requires_grad
    if t.is_meta or t.numel() == 0:
        return out
    if t.layout != torch.strided:
        out["note"] = f"{t.layout} tensor: statistics not computed"
        return out
    with torch.no_grad():
        out["preview"] = [_json_number(v) for v in _first_values_torch(t, torch).cpu().tolist()]
        out["stats"] = _torch_stats(t, torch)
    return out


def _first_values_torch(t: Any, torch: Any) -> Any:
    """The first values in row-major order; a non-contiguous tensor gathers just those."""
    count = min(PREVIEW, t.numel())
    if t.is_contiguous():
        return t.reshape(-1)[:count]
    index = torch.unravel_index(torch.arange(count, device=t.device), t.shape)
    return t[index]


def _torch_stats(t: Any, torch: Any) -> dict[str, Any]:
    """min/max first: they propagate NaN and Inf, so finite extremes prove the common case
    (no non-finite values) without scanning for them, which on CPU costs more than the stats."""
    if t.is_complex():
        t = t.abs()
    integer = not (t.is_floating_point() or t.dtype == torch.bool)
    if integer:
        low, high = torch.aminmax(t)
        values = t.to(torch.float64)
        return {"min": int(low), "max": int(high), **_torch_moments(values), "nan": 0, "inf": 0}
    values = t.to(torch.float32) if t.dtype == torch.bool or t.element_size() < 4 else t
    low, high = torch.aminmax(values)
    nan = inf = 0
    if not (math.isfinite(float(low)) and math.isfinite(float(high))):
        nan = int(torch.count_nonzero(torch.isnan(values)))
        inf = int(torch.count_nonzero(torch.isinf(values)))
        values = values[torch.isfinite(values)]
        if values.numel() == 0:
            return {"min": None, "max": None, "mean": None, "std": None, "nan": nan, "inf": inf}
        low, high = torch.aminmax(values)
    low_v: Any = float(low)
    high_v: Any = float(high)
    if t.dtype == torch.bool:
        low_v, high_v = bool(low_v), bool(high_v)
    return {"min": low_v, "max": high_v, **_torch_moments(values), "nan": nan, "inf": inf}


def _torch_moments(values: Any) -> dict[str, float]:
    mean = float(values.mean())
    std = float(values.std()) if values.numel() > 1 else 0.0
    return {"mean": mean, "std": std}


def _mlx_summary(a: Any) -> dict[str, Any]:
    mx = sys.modules["mlx.core"]
    mx.eval(a)
    dtype = str(a.dtype).removeprefix("mlx.core.")
    out = _header("mlx.core.array", a.shape, dtype, _mlx_device(mx), int(a.size))
    if a.size == 0:
        return out
    flat = a.reshape(-1)
    head = flat[:PREVIEW]
    if head.dtype in (mx.bfloat16, mx.float16):
        head = head.astype(mx.float32)
    out["preview"] = [_json_number(v) for v in head.tolist()]
    out["stats"] = _mlx_stats(flat, mx)
    return out


def _mlx_device(mx: Any) -> str:
    device = str(mx.default_device())
    return device.removeprefix("Device(").removesuffix(")").split(",")[0].strip()


def _mlx_stats(flat: Any, mx: Any) -> dict[str, Any]:
    """Masked reductions: non-finite values are left out without leaving the device."""
    if mx.issubdtype(flat.dtype, mx.complexfloating):
        flat = mx.abs(flat)
    is_bool = flat.dtype == mx.bool_
    integer = mx.issubdtype(flat.dtype, mx.integer)
    values = (
        flat.astype(mx.float32)
        if (is_bool or integer or flat.dtype in (mx.bfloat16, mx.float16))
        else flat
    )
    nan = inf = 0
    count = int(values.size)
    finite = None
    if not (integer or is_bool):
        mask = mx.isfinite(values)
        n_finite = int(mask.sum().item())
        if n_finite != count:
            nan = int(mx.isnan(values).sum().item())
            inf = count - n_finite - nan
            finite, count = mask, n_finite
    if count == 0:
        return {"min": None, "max": None, "mean": None, "std": None, "nan": nan, "inf": inf}
    if integer:
        low: Any = int(mx.min(flat).item())
        high: Any = int(mx.max(flat).item())
    elif finite is not None:
        low = float(mx.min(mx.where(finite, values, math.inf)).item())
        high = float(mx.max(mx.where(finite, values, -math.inf)).item())
    else:
        low, high = float(mx.min(values).item()), float(mx.max(values).item())
    if is_bool:
        low, high = bool(low), bool(high)
    if finite is not None:
        kept = mx.where(finite, values, 0.0)
        mean_a = kept.sum() / count
        var_a = mx.where(finite, (values - mean_a) ** 2, 0.0).sum() / max(count - 1, 1)
    else:
        mean_a = mx.mean(values)
        var_a = mx.var(values, ddof=1) if count > 1 else mx.array(0.0)
    std = math.sqrt(max(float(var_a.item()), 0.0)) if count > 1 else 0.0
    return {
        "min": low,
        "max": high,
        "mean": float(mean_a.item()),
        "std": std,
        "nan": nan,
        "inf": inf,
    }


def _numpy_summary(a: Any) -> dict[str, Any]:
    np = sys.modules["numpy"]
    out = _header("numpy.ndarray", a.shape, str(a.dtype), "cpu", int(a.size))
    if a.size == 0:
        return out
    flat = a.reshape(-1)
    head = flat[:PREVIEW]
    if head.dtype.kind not in "biufc":
        head = head.astype(np.float32)
    out["preview"] = [_json_number(v) for v in head.tolist()]
    out["stats"] = _numpy_stats(flat, np)
    return out


def _numpy_stats(flat: Any, np: Any) -> dict[str, Any]:
    kind = flat.dtype.kind
    if kind == "c":
        flat, kind = np.abs(flat), "f"
    if kind not in "biuf":  # ml_dtypes bfloat16 and friends
        flat, kind = flat.astype(np.float32), "f"
    nan = inf = 0
    values = flat
    if kind == "f":
        if flat.dtype.itemsize < 4:
            values = flat.astype(np.float32)
        finite = np.isfinite(values)
        n_finite = int(finite.sum())
        if n_finite != values.size:
            nan = int(np.isnan(values).sum())
            inf = int(values.size) - n_finite - nan
            values = values[finite]
    if values.size == 0:
        return {"min": None, "max": None, "mean": None, "std": None, "nan": nan, "inf": inf}
    if kind == "b":
        low: Any = bool(values.min())
        high: Any = bool(values.max())
        values = values.astype(np.float64)
    elif kind in "iu":
        low, high = int(values.min()), int(values.max())
        values = values.astype(np.float64)
    else:
        low, high = float(values.min()), float(values.max())
    std = float(values.std(ddof=1)) if values.size > 1 else 0.0
    return {
        "min": low,
        "max": high,
        "mean": float(values.mean()),
        "std": std,
        "nan": nan,
        "inf": inf,
    }


_TENSOR_SUMMARIES = {"torch": _torch_summary, "mlx": _mlx_summary, "numpy": _numpy_summary}


def summarize(value: object) -> dict[str, Any]:
    """A JSON-ready description of ``value``; never raises.

    Tensors: ``{"type", "shape", "dtype", "device", "numel", "preview", "stats"}`` where
    stats are over finite values (``nan``/``inf`` counted apart) and ``std`` is the
    sample standard deviation (torch's default).  Anything else: its type and a bounded
    repr, plus ``len`` for containers and ``value`` for plain JSON scalars.
    """
    framework = _safe_framework(value)
    if framework is not None:
        try:
            return _TENSOR_SUMMARIES[framework](value)
        except Exception as exc:  # an exotic dtype or device must not break the session
            return {
                "type": type_name(value),
                "repr": safe_repr(value, REPR_LIMIT),
                "note": f"summary failed: {exc}",
            }
    out: dict[str, Any] = {"type": type_name(value), "repr": safe_repr(value, REPR_LIMIT)}
    if isinstance(value, _JSON_SCALARS) and not (
        isinstance(value, str) and len(value) > REPR_LIMIT
    ):
        out["value"] = _json_number(value) if isinstance(value, float) else value
    if isinstance(value, list | tuple | dict | set | frozenset | str | bytes):
        out["len"] = len(value)
    module = sys.modules.get("torch.nn")
    if module is not None and isinstance(value, module.Module):
        with contextlib.suppress(Exception):
            out["parameters"] = sum(p.numel() for p in value.parameters())
    return out


def one_line(value: object, max_chars: int = 200) -> str:
    """One line for variable lists and eval results, e.g. ``torch.Tensor float32[2, 3] cpu min=…``."""
    if _safe_framework(value) is None:
        return safe_repr(value, max_chars).replace("\n", "\\n")
    s = summarize(value)
    if "shape" not in s:
        return safe_repr(value, max_chars)
    shape = ", ".join(str(n) for n in s["shape"])
    parts = [f"{s['type']} {s['dtype']}[{shape}] {s['device']}"]
    stats = s.get("stats")
    if stats:
        for key in ("min", "max", "mean", "std"):
            if stats.get(key) is not None:
                parts.append(f"{key}={_short(stats[key])}")
        for key in ("nan", "inf"):
            if stats.get(key):
                parts.append(f"{key}={stats[key]}")
    if s.get("preview"):
        more = ", …" if s["numel"] > len(s["preview"]) else ""
        parts.append("[" + ", ".join(_short(v) for v in s["preview"]) + more + "]")
    text = " ".join(parts)
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def _short(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)
