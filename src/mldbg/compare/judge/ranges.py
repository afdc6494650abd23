"""An entry that fails because the port's dtype cannot hold the values: overflow, underflow.

An fp16 port whose ``down_proj`` writes 1.5e5 into one channel holds ``inf`` there (float16
stops at 65504) while the float32 reference holds the number; everything after it reads
``inf`` or ``NaN``.  The relative error and cosine of such an entry cover its finite
elements only, so they look small: the verdict must read the non-finite elements and say
what they are, against the numbers of the dtype table (``mldbg.dtypes``):

* **overflow**: where only the port is NaN/inf, the reference holds a value beyond the
  port dtype's largest finite one.  The fix is a wider dtype for that computation.
* **non-finite**: only the port is NaN/inf, and the reference's values there fit the port's
  dtype: an intermediate overflowed or underflowed inside the module (a sum of squares, a
  division by a value the dtype rounds to 0).
* **underflow**: no NaN/inf, but the reference's values lie below the port dtype's
  smallest normal number, where it keeps few bits or none (a variance of 1e-9 in float16).

Read from the metrics of one pair (``metrics.compare_arrays``: ``port_nonfinite``,
``nonfinite_at``, ``rms_a``), so it costs nothing more.
"""

from __future__ import annotations

from ... import dtypes
from ..records import EntryResult, OutOfRange

# A wider dtype to suggest for a computation that overflowed in this one.
_WIDER = {"F16": "float32 (or bfloat16: float32's range)", "BF16": "float32"}


def out_of_range(result: EntryResult) -> OutOfRange | None:
    """What ``result``'s port values show of the port dtype's range, or None."""
    port = dtypes.lookup(result.get("dtype_b") or "")
    if port is None or port.kind != "float" or port.max_finite is None:
        return None
    count = result.get("port_nonfinite") or 0
    at = result.get("nonfinite_at")
    name = port.numpy
    if count and at is not None:
        value = at["a"]
        reference = abs(float(value)) if isinstance(value, int | float) else None
        found: OutOfRange = {
            "kind": "overflow"
            if reference is not None and reference > port.max_finite
            else "nonfinite",
            "dtype": name,
            "limit": port.max_finite,
            "count": count,
            "index": at["index"],
            "reference": value,
            "port": at["b"],
        }
        return found
    rms = result.get("rms_a")
    if (
        not result.get("ok")
        and port.min_normal is not None
        and isinstance(rms, int | float)
        and 0 < rms < port.min_normal
    ):
        return {"kind": "underflow", "dtype": name, "limit": port.min_normal, "count": 0}
    return None


def describe(found: OutOfRange) -> str:
    """One sentence a user acts on: what the dtype could not hold, where, and the fix."""
    dtype, limit = found["dtype"], found["limit"]
    code = dtypes.code(dtype)
    wider = _WIDER.get(code, "a wider dtype")
    if found["kind"] == "underflow":
        return (
            f"underflow: the reference's values lie below {dtype}'s smallest normal number "
            f"({limit:.3g}), where {dtype} keeps few bits or none: compute it in {wider}"
        )
    where = (
        f"at {found.get('index')} the reference has {_number(found.get('reference'))} where the "
        f"port has {found.get('port')} ({found['count']} element(s) NaN/inf in the port only)"
    )
    if found["kind"] == "overflow":
        return f"overflow: {dtype} holds at most {limit:.6g}; {where}: compute it in {wider}"
    return (
        f"the port's output holds NaN/inf where the reference's values fit {dtype} ({where}): "
        f"an intermediate overflowed or underflowed inside this module (a sum of squares, a "
        f"division by a value {dtype} rounds to 0): compute it in {wider}"
    )


def _number(value: object) -> str:
    return f"{value:.6g}" if isinstance(value, int | float) else str(value)
