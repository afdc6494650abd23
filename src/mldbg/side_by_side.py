"""One expression's values in two paused sessions, set side by side, and their difference.

The porting loop is two paused sessions, the reference and the port, and the same
expression evaluated in both (``eval EXPR --against SESSION``).  Each agent writes its
tensor to a ``.npy`` file (``agent/export.py``); this module reads both and answers how
they differ, in float64, within a bounded answer.  Plain numbers differ by subtraction;
anything else is equal or not by its repr.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from .summary import relative

if TYPE_CHECKING:  # the result shapes, for the type checker
    from typing import TypeGuard

    import numpy as np
    from numpy.typing import NDArray

    from . import results as R

FIRST_VALUES = 8  # elements shown side by side where the two differ


class Evaluates(Protocol):
    """A paused session that evaluates (the daemon's ``Session``)."""

    name: str

    def evaluate(
        self, expression: str, timeout: float = ..., export: str | None = None
    ) -> R.Evaluation: ...


def tensor_difference(a_path: Path, b_path: Path) -> R.TensorDifference:
    """How the tensor in ``a_path`` differs from the one in ``b_path`` (a: the session
    asked, the port; b: the one it is set against, the reference).  Relative errors are on
    the reference's scale (``rel_rms = ||b - a|| / ||b||``), as ``compare``'s are."""
    import numpy as np

    a = np.load(a_path, allow_pickle=False)
    b = np.load(b_path, allow_pickle=False)
    out: R.TensorDifference = {"shape_a": list(a.shape), "shape_b": list(b.shape)}
    if a.shape != b.shape:
        if a.size == b.size:
            out["note"] = "shapes differ, sizes agree: compared in row-major order"
            b = b.reshape(a.shape)
        else:
            out["error"] = f"shapes differ: {list(a.shape)} vs {list(b.shape)}"
            return out
    x = a.astype(np.float64).reshape(-1)
    y = b.astype(np.float64).reshape(-1)
    both = np.isfinite(x) & np.isfinite(y)
    same = (np.isnan(x) & np.isnan(y)) | (x == y)  # NaN meets NaN, an infinity itself
    delta = np.abs(np.subtract(y, x, where=both, out=np.zeros_like(x)))
    out["equal"] = bool(np.all(same))
    out["mismatched"] = int(np.count_nonzero(~same))
    out["max_abs"] = _json(float(delta.max()) if delta.size else 0.0)
    out["mean_abs"] = _json(float(delta[both].mean()) if both.any() else None)
    norm_a = float(np.sqrt(np.sum(np.square(x[both])))) if both.any() else 0.0
    norm_d = float(np.sqrt(np.sum(np.square(delta[both])))) if both.any() else 0.0
    norm_b = float(np.sqrt(np.sum(np.square(y[both])))) if both.any() else 0.0
    out["rel_rms"] = _json(relative(norm_d, norm_b))
    dot = float(np.dot(x[both], y[both])) if both.any() else 0.0
    out["cosine"] = _json(dot / (norm_a * norm_b) if norm_a and norm_b else None)
    out["nonfinite_a"] = int(np.count_nonzero(~np.isfinite(x)))
    out["nonfinite_b"] = int(np.count_nonzero(~np.isfinite(y)))
    if out["mismatched"]:
        where = int(np.flatnonzero(~same)[0])
        worst = int(np.argmax(delta)) if delta.size else where
        out["first_mismatch"] = _element(a.shape, where, x, y)
        out["worst"] = _element(a.shape, worst, x, y)
    return out


def _element(
    shape: tuple[int, ...], flat: int, x: NDArray[np.float64], y: NDArray[np.float64]
) -> R.ElementPair:
    import numpy as np

    index = [int(i) for i in np.unravel_index(flat, shape)] if shape else []
    return {"index": index, "a": _json(float(x[flat])), "b": _json(float(y[flat]))}


def scalar_difference(a: object, b: object) -> R.ScalarDifference:
    """Two plain values (their summaries' ``value``): numbers subtract, others compare;
    ``rel`` is on the reference's (``b``'s) scale."""
    if _number(a) and _number(b):
        delta = float(b) - float(a)
        return {"equal": a == b, "b_minus_a": _json(delta), "rel": _json(relative(delta, b))}
    return {"equal": a == b}


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json(value: float | None) -> float | str | None:
    """A number as JSON can carry it: ``inf``/``nan`` as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def evaluate_both(
    first: Evaluates, second: Evaluates, expression: str, timeout: float
) -> R.Evaluation:
    """``expression`` in the paused sessions ``first`` and ``second`` (server ``Session``s):
    ``first``'s answer, with ``against`` (``second``'s) and ``difference`` added."""
    scratch = Path(tempfile.mkdtemp(prefix="mldbg-side-"))  # 0700: private to this user
    try:
        a_path, b_path = scratch / "a.npy", scratch / "b.npy"
        result = cast("dict[str, Any]", first.evaluate(expression, timeout, export=str(a_path)))
        other = second.evaluate(expression, timeout, export=str(b_path))
        wrote_a = (result.pop("export", None) or {}).get("written")
        wrote_b = (other.pop("export", None) or {}).get("written")
        other.pop("expression", None)
        result["session"] = first.name
        result["against"] = {"session": second.name, **other}
        if wrote_a and wrote_b:
            result["difference"] = tensor_difference(a_path, b_path)
        elif not wrote_a and not wrote_b and "shape" not in (result.get("summary") or {}):
            a_value = (result.get("summary") or {}).get("value", result.get("result"))
            b_value = (other.get("summary") or {}).get("value", other.get("result"))
            result["difference"] = scalar_difference(a_value, b_value)
        else:
            result["difference"] = {
                "error": "one side is a tensor and the other is not (or too large to read)"
            }
        return cast("R.Evaluation", result)  # an evaluation, with against and difference
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
