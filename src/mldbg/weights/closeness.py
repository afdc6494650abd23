"""How close two parameters are: within one rounding, element agreement, cosine, error.

The audit's numbers, apart from any status: each judgement (``judge.py``), layout
(``layouts.py``) and structure (``structure.py``) asks these the same questions, so one
rounding rule (``|p - r| <= u |r| + η``) holds everywhere a pair is called equal.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .. import dtypes

if TYPE_CHECKING:
    from .params import Values

AGREEMENT_SAMPLE = 1 << 20  # elements drawn for the element agreement test (never_loaded)


def unit_rounding(dtype_a: str, dtype_b: str) -> float:
    from ..compare.judge.bounds import unit_roundoff

    u = unit_roundoff(dtype_a, dtype_b)
    return 0.0 if u is None else u


def underflow_slack(dtype_a: str, dtype_b: str) -> float:
    """Half the coarser subnormal spacing of the two dtypes (0 for integers): below the
    smallest normal a conversion rounds to a grid of that spacing, an absolute error the
    relative ``u·|r|`` does not cover (float16 weights of std 0.02 have such elements)."""
    spacings = [
        (found.min_subnormal if found else None) for found in map(dtypes.lookup, (dtype_a, dtype_b))
    ]
    return max((s for s in spacings if s is not None), default=0.0) / 2.0


def close(
    a: Values, b: Values, u: float, slack_a: Values | float = 0.0, slack_b: Values | float = 0.0
) -> bool:
    """``|b − a| ≤ u·|a| + slack`` element by element (exact when both are zero)."""
    import numpy as np

    if u == 0.0 and np.isscalar(slack_a) and np.isscalar(slack_b) and not (slack_a or slack_b):
        return bool(np.array_equal(a, b, equal_nan=True))
    with np.errstate(invalid="ignore"):
        allowed = u * np.abs(a) + slack_a + slack_b
        same = (a == b) | (np.isnan(a) & np.isnan(b))  # an Inf or a NaN where the other has it
        return bool(np.all((np.abs(b - a) <= allowed) | same))


def worst_ratio(
    a: Values, b: Values, u: float, slack_a: Values | float, slack_b: Values | float
) -> float:
    """The largest ``|b − a|`` over its allowance (≤ 1 when every element is explained),
    over the elements finite on both sides (the others are judged by ``nonfinite``)."""
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        allowed = u * np.abs(a) + slack_a + slack_b
        ratio = np.where(allowed > 0, np.abs(b - a) / allowed, np.where(a == b, 0.0, np.inf))
    counted = np.isfinite(a) & np.isfinite(b) & ~np.isnan(ratio)
    worst = float(np.max(ratio[counted])) if counted.any() else 0.0
    return worst if math.isfinite(worst) else float(np.finfo(np.float64).max)


def nonfinite_mismatch(a: Values, b: Values) -> dict[str, object] | None:
    """Where NaN or Inf on one side meets another value on the other: ``{"nan_port",
    "inf_port", "nonfinite_ref", "first"}`` (``first`` the index of the first such
    element; None for shapes that differ, compared by their counts alone), or None when
    the non-finite elements agree (the same NaN and the same signed Inf in the same
    places, or none).  A NaN never agrees within a tolerance, and its numbers are no JSON:
    this is the pair's finding before any rounding is judged."""
    import numpy as np

    finite_a, finite_b = np.isfinite(a), np.isfinite(b)
    if finite_a.all() and finite_b.all():
        return None
    if a.shape != b.shape:

        def kinds(x: Values) -> tuple[int, int, int]:
            return (
                int(np.count_nonzero(np.isnan(x))),
                int(np.count_nonzero(x == np.inf)),
                int(np.count_nonzero(x == -np.inf)),
            )

        if kinds(a) == kinds(b):
            return None
        port, ref, first = ~finite_b, ~finite_a, None
    else:
        wrong = ~((finite_a & finite_b) | (a == b) | (np.isnan(a) & np.isnan(b)))
        if not wrong.any():
            return None
        port, ref = wrong & ~finite_b, wrong & ~finite_a
        at = np.unravel_index(int(np.argmax(wrong)), a.shape)
        first = [int(i) for i in at]
    return {
        "nan_port": int(np.count_nonzero(port & np.isnan(b))),
        "inf_port": int(np.count_nonzero(port & np.isinf(b))),
        "nonfinite_ref": int(np.count_nonzero(ref)),
        "first": first,
    }


def is_constant(x: Values) -> bool:
    return bool(x.size > 1 and (x == x.flat[0]).all())


def agreement(
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
    nonzero = (flat_a != 0) & np.isfinite(flat_a) & np.isfinite(flat_b)
    if int(nonzero.sum()) < 2:
        return 0.0, 0.0
    order = np.random.default_rng(0).permutation(flat_a.size)
    shuffled = flat_a[order]
    moved = allowed_a if isinstance(allowed_a, float) else allowed_a[order]
    with np.errstate(invalid="ignore"):
        agree = np.abs(flat_b - flat_a) <= u * np.abs(flat_a) + allowed_a + allowed_b
        chance = np.abs(flat_b - shuffled) <= u * np.abs(shuffled) + moved + allowed_b
    counted = (shuffled != 0) & np.isfinite(shuffled) & np.isfinite(flat_b)
    if not counted.any():
        return float(np.mean(agree[nonzero])), 0.0
    return float(np.mean(agree[nonzero])), float(np.mean(chance[counted]))


def _finite_parts(a: Values, b: Values) -> tuple[Values, Values]:
    """The elements finite on both sides (all of them, unflattened, when all are)."""
    import numpy as np

    both = np.isfinite(a) & np.isfinite(b)
    return (a, b) if both.all() else (a[both], b[both])


def _finite(value: float) -> float | None:
    """A number the answer can carry (JSON has no NaN nor Inf): None when it is not."""
    return value if math.isfinite(value) else None


def cosine_of(a: Values, b: Values) -> float | None:
    """The cosine of the finite elements (None for zero vectors, or an overflow)."""
    import numpy as np

    a, b = _finite_parts(a, b)
    with np.errstate(over="ignore", invalid="ignore"):
        na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
        if na == 0 or nb == 0:
            return None
        return _finite(float(np.vdot(a, b)) / (na * nb))


def rel_rms_of(a: Values, b: Values) -> float | None:
    """``‖b − a‖ / ‖a‖`` over the finite elements (None where that is no number)."""
    import numpy as np

    a, b = _finite_parts(a, b)
    with np.errstate(over="ignore", invalid="ignore"):
        na = float(np.linalg.norm(a))
        diff = float(np.linalg.norm(b - a))
    if not (math.isfinite(na) and math.isfinite(diff)):
        return None
    return diff / na if na else (0.0 if diff == 0 else None)
