"""Scale-aware verdicts: how much error a clean port may show at each point of a model.

A fixed ``atol`` cannot judge a port: rounding at an RMSNorm output (values ~3) is
larger than a real bug's error at an attention output (values ~0.05).  Each entry is
judged instead against its own scale and dtype:

* **The measure** is relative to the reference tensor: ``rel_rms = ||b - a|| / ||a||``
  and ``rel_max = max|b - a| / max|a|`` (from :mod:`.metrics`).  Both are invariant to
  the tensor's magnitude, so a norm that rescales its input's error onto larger values
  shows the same number before and after.
* **The bound** is what a clean port accumulates: two implementations of one chain of
  ops in a dtype with unit roundoff ``u`` (2**-8 bf16, 2**-11 fp16, 2**-24 fp32) round
  at different places, and the independent rounding errors add up like a random walk,
  so after ``d`` ops the relative error is about ``u * sqrt(d)``.  ``d`` is the number of
  leaf module calls that have finished in the reference by that point (the depth of the
  op chain the capture can see).  ``ROUNDING_C`` is measured: clean Llama/Qwen2/Gemma
  and conv ports in fp32/bf16/fp16 stay below ``1.5 u sqrt(1 + d)`` (bf16: 2.5 u at
  d = 38; fp32 is relatively worst at 8 u, reductions reorder more there), and the
  constant 4 leaves room for other architectures while real bugs (a wrong RoPE base,
  a missing attention scale, a skipped norm) sit at 0.1 to 1, far outside.
* **Quantized port modules** (MLX ``QuantizedLinear``, 4/8 bit) add the error of their
  weights' rounding: a group of ``g`` weights spans about ``2 sqrt(2 ln g)`` standard
  deviations, split into ``2**bits - 1`` steps, each step's rounding uniform (RMS
  step / sqrt 12); measured: 0.09 relative for 4 bit with groups of 64, 0.0054 for 8
  bit.  Downstream entries inherit that noise (measured: 1.1 to 2.4 times one module's
  over a whole clean 4-bit Qwen2; the bound is 3.5 times, added to the rounding bound).  Single elements are not held to
  ``rel_max`` there: a product of two quantized values (gate x up) can move one element
  by more than the largest value, which rounding never does.

* **Ill-conditioned ops** (a sine of arguments ~1000, as in every diffusion model's
  timestep embedding) turn one rounding step of their inputs into far more than ``u``
  at their outputs.  The capture measures each leaf call's sensitivity (its output's
  relative change when its inputs move by one rounding step; ``capture.sensitivity``),
  and that of the inline work of each call one above its leaves (an attention's softmax):
  ``COND_C`` times it bounds the call's own outputs and, riding on what is computed from
  them, every later entry (see ``_Floors``).  An ill-conditioned call also amplifies the
  error its inputs arrive with, by its measured ``amplification`` (see ``amplified``).
  The larger of those floors and the rounding bound is the bound; entries say when a
  floor set it.

The strict element-wise test (``|b - a| <= atol + rtol |a|``) decides only when the
user gives ``--rtol``/``--atol``; integer and bool pairs always compare exactly.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ... import dtypes
from ..read.sources import Call, Source
from ..records import EntryResult

ROUNDING_C = 2.0  # bound on rel_rms, in units of u * sqrt(1 + depth)
MAX_FACTOR = 4.0  # rel_max may exceed the rel_rms bound by this much (one unlucky element)
QUANT_C = 3.5  # bound on quantization noise, in units of one module's expected error
# An output error up to GROWTH x its inputs' error (plus its own rounding) is "explained"
# by them.  Relative error mostly passes through a module unchanged (x1, a norm
# rescales values, not their relative error); clean attention in bf16 measured up to
# x1.9.  Only used to pick the culprit among entries that already fail.
GROWTH = 2.0

# The unit a bound counts in, per dtype: its unit roundoff times its ``accumulation``
# (``dtypes.py``: float32 counts 4 u, float64 8 u, where both sides reorder long sums).


def canonical_dtype(dtype: str) -> str:
    """The safetensors name of a dtype (``F32`` for ``float32``)."""
    return dtypes.code(dtype)


def unit_roundoff(dtype_a: str, dtype_b: str) -> float | None:
    """The larger unit of the two dtypes' bounds; None when both are exact (integers)."""
    found = [_unit(d) for d in (dtype_a, dtype_b)]
    known = [u for u in found if u is not None]
    return max(known) if known else None


def _unit(dtype: str) -> float | None:
    found = dtypes.lookup(dtype)
    if found is None:  # a name no table holds is held to float32's bound
        return None if dtypes.is_exact(dtype) else _unit("F32")
    u = found.unit_roundoff
    return None if u is None else u * found.accumulation


def quantization_error(bits: int, group_size: int) -> float:
    """Expected relative error of a matmul with ``bits``-bit affine group quantization."""
    levels = max(1, (1 << int(bits)) - 1)
    spread = 2.0 * math.sqrt(2.0 * math.log(max(2, int(group_size))))
    return spread / math.sqrt(12.0) / levels


def rounding_bound(u: float, depth: int) -> float:
    return ROUNDING_C * u * math.sqrt(1 + max(0, depth))


@dataclass(frozen=True)
class Floor:
    """The error an ill-conditioned call leaves on everything after it: ``bound`` (a
    relative RMS error), set by call ``source`` whose measured ``sensitivity`` it is.
    ``amplification`` and ``input_rel_rms`` are set when the bound is the call's measured
    amplification of the error its inputs arrived with (see :func:`amplified`)."""

    bound: float = 0.0
    source: tuple[str, int] | None = None
    sensitivity: float = 0.0
    amplification: float | None = None
    input_rel_rms: float | None = None


NO_FLOOR = Floor()


@dataclass
class Depths:
    """Per reference call: how many leaf calls ended before it started / by its end,
    how many leaves it holds, and the quantization noise upstream / inside."""

    before: dict[tuple[str, int], int] = field(default_factory=dict)
    through: dict[tuple[str, int], int] = field(default_factory=dict)
    leaves: dict[tuple[str, int], int] = field(default_factory=dict)
    quant_before: dict[tuple[str, int], float] = field(default_factory=dict)
    quant_through: dict[tuple[str, int], float] = field(default_factory=dict)
    quant_inside: dict[tuple[str, int], float] = field(default_factory=dict)
    # Conditioning floors (see ``conditioning``): (bound, call that sets it) per call.
    cond_before: dict[tuple[str, int], Floor] = field(default_factory=dict)
    cond_through: dict[tuple[str, int], Floor] = field(default_factory=dict)
    cond_inside: dict[tuple[str, int], Floor] = field(default_factory=dict)


def depths(
    source: Source,
    quantized: dict[tuple[str, int], float],
    amplified: dict[tuple[str, int], Floor] | None = None,
    upstream: tuple[int, Floor] = (0, NO_FLOOR),
) -> Depths:
    """Op-chain depths of every call of ``source`` (the reference); ``quantized`` maps
    the reference calls whose port counterpart is quantized to their expected error;
    ``amplified`` the floors of calls that amplify their inputs' error (:func:`amplified`);
    ``upstream`` the leaf calls and the floor of the models that ran before it in its
    process (a later model of a pipeline, :mod:`.upstream`), on every call's inputs."""
    before_all, floor_before_all = upstream
    calls = source.calls
    by_seq = {c.seq: key for key, c in calls.items()}
    children: dict[int, list[int]] = {}
    for call in calls.values():
        if call.parent is not None and call.parent in by_seq:
            children.setdefault(call.parent, []).append(call.seq)
    leaves = [c for c in calls.values() if c.seq not in children]
    never = 1 << 62  # a call that never ended sorts after every other
    ends: list[int] = sorted(never if c.end_order is None else c.end_order for c in leaves)
    quant_ends: list[tuple[int, Any]] = sorted(
        (never if calls[k].end_order is None else int(calls[k].end_order or 0), q)
        for k, q in quantized.items()
        if k in calls
    )
    result = Depths()
    floors = _Floors(calls, amplified or {})
    for key, call in calls.items():
        end = call.end_order if call.end_order is not None else 1 << 62
        result.before[key] = before_all + bisect.bisect_left(ends, call.start_order)
        result.through[key] = before_all + bisect.bisect_right(ends, end)
        start = call.start_order or 0
        result.quant_before[key] = _quant_noise(q for e, q in quant_ends if e < start)
        result.quant_through[key] = _quant_noise(q for e, q in quant_ends if e <= end)
        # A call's ancestors compute inline what their children read (the softmax whose
        # output an attention's ``to_out`` projects): their own floors bound it too.
        around = floors.around(call, calls, by_seq)
        around = _larger(around, floor_before_all)
        result.cond_before[key] = _larger(floors.ended_before(call.start_order), around)
        result.cond_through[key] = _larger(floors.through(key, call, end), around)
    # Leaves and quantized calls inside each subtree (a call counts itself when a leaf).
    measured_inside: dict[tuple[str, int], Floor] = {}
    for key, call in sorted(calls.items(), key=lambda kv: -kv[1].depth):
        kids = [by_seq[s] for s in children.get(call.seq, [])]
        result.leaves[key] = sum(result.leaves[k] for k in kids) if kids else 1
        inside = [result.quant_inside[k] for k in kids if result.quant_inside.get(k)]
        own = quantized.get(key)
        if own:
            inside.append(own)
        result.quant_inside[key] = _quant_noise(inside) if inside else 0.0
        # Its own floors and what its descendants measured (not what they amplified:
        # a call is judged by its own inputs, see ``_Floors``).
        below = [measured_inside[k] for k in kids]
        measured_inside[key] = max([floors.measured(key), *below], key=lambda f: f.bound)
        result.cond_inside[key] = max([floors.own(key), *below], key=lambda f: f.bound)
    return result


COND_C = 2.0  # bound on the difference two clean implementations show, in sensitivities


AMPLIFYING = COND_C * GROWTH  # see ``amplified``


def amplification(call: Call) -> float | None:
    """How many times a relative error in what ``call`` reads comes out larger at its
    outputs, as measured at capture time (``sensitivity / step``); None when unmeasured."""
    if call.amplification is not None:
        return call.amplification
    if call.sensitivity is None or not call.step:
        return None
    return call.sensitivity / call.step


def amplified(
    calls: dict[tuple[str, int], Call], input_errors: dict[tuple[str, int], float]
) -> dict[tuple[str, int], Floor]:
    """The floors of calls that amplify the error their inputs actually arrive with.

    A call's measured sensitivity bounds what *its own rounding* of its operands makes
    of them (``COND_C * sensitivity``).  An ill-conditioned call also multiplies the
    difference its inputs already carry: an attention whose logits are large turns a
    1e-5 difference in its input (an upstream timestep embedding's, itself explained)
    into 1e-4 at its output.  Its measured amplification ``a`` (its outputs' relative
    change when its inputs move by one ``step``, over that step) is that factor, so ``a
    * (its inputs' relative error)`` is what the inputs explain at its outputs, on top
    of the ``sensitivity`` its own rounding explains (for a call with children measured
    apart, inputs kept, descendants' outputs rounded): ``COND_C * (sensitivity + a *
    error)`` bounds its outputs and, riding on what is computed from them, what comes
    after.  Only calls with ``a > AMPLIFYING`` get such a floor: a relative error passed
    on about unchanged is what the rounding bound and the growth rule (which grants every
    call ``GROWTH x`` its inputs' error) already model, and one random draw of signs
    measures ``a`` within about ``COND_C x`` (a ``Linear`` on random weights measures 1 to
    3; an attention over large logits 5 to 30): a call amplifies when even the low end of
    its measurement, ``a / COND_C``, is beyond ``GROWTH``.  Floors of calls that merely
    pass errors on would otherwise ratchet every bound up by ``COND_C x`` per call.  ``input_errors`` are the measured relative RMS errors of
    each call's inputs (the worst one).  The error is the *measured* one, not a bound:
    an ill-conditioned call is not excused for more than its inputs actually brought."""
    found: dict[tuple[str, int], Floor] = {}
    for key, error in input_errors.items():
        call = calls.get(key)
        if call is None:
            continue
        factor = amplification(call)
        if factor is None or factor <= AMPLIFYING or not error or not math.isfinite(error):
            continue
        own = call.sensitivity or 0.0
        found[key] = Floor(
            COND_C * (own + factor * error),
            key,
            own,
            amplification=factor,
            input_rel_rms=error,
        )
    return found


class _Floors:
    """Conditioning floors of a capture's calls, looked up by event order.

    A call with a measured sensitivity ``s`` (``capture.sensitivity``: its output's
    relative change when what it reads moves by one rounding step) may differ between
    two clean implementations by about ``s`` each way: ``COND_C * s`` bounds it
    (measured: the sinusoidal timestep embedding of a tiny Flux differs by 0.55 s
    between PyTorch and MLX in float32).  That difference then rides on everything
    computed from it, as quantization noise does, and it does not grow where the ops
    after it are well conditioned (measured on the same Flux: every later module within
    1.2x of it), so the floor of a call is the largest one that ended before it.

    An *amplified* floor (:func:`amplified`: a call's amplification of the error its
    inputs arrived with) rides on what comes after it the same way, but never on the
    call's ancestors: an ancestor is judged by its own inputs.  Otherwise a bug inside an
    attention's inline softmax would be excused by its own ``to_out`` child, which merely
    amplifies the bug's error it reads."""

    def __init__(
        self, calls: dict[tuple[str, int], Call], amplified: dict[tuple[str, int], Floor]
    ) -> None:
        self._measured = {
            key: Floor(COND_C * c.sensitivity, key, c.sensitivity)
            for key, c in calls.items()
            if c.sensitivity
        }
        self._amplified = {k: f for k, f in amplified.items() if k in calls}
        self._by_measured = _Running(calls, self._measured)
        self._by_amplified = _Running(calls, self._amplified)

    def measured(self, key: tuple[str, int]) -> Floor:
        return self._measured.get(key, NO_FLOOR)

    def own(self, key: tuple[str, int]) -> Floor:
        return _larger(self.measured(key), self._amplified.get(key, NO_FLOOR))

    def around(
        self,
        call: Call,
        calls: dict[tuple[str, int], Call],
        by_seq: dict[int, tuple[str, int]],
    ) -> Floor:
        """The largest own floor of ``call``'s ancestors (their inline work feeds it)."""
        best = NO_FLOOR
        parent = call.parent
        while parent is not None and parent in by_seq:
            key = by_seq[parent]
            best = _larger(best, self.own(key))
            parent = calls[key].parent
        return best

    def ended_before(self, order: int) -> Floor:
        return _larger(self._by_measured.before(order), self._by_amplified.before(order))

    def through(self, key: tuple[str, int], call: Call, end: int) -> Floor:
        """What bounds ``call``'s outputs: measured floors that ended by its end, its own,
        and amplified ones that ended before it started (not its descendants')."""
        return _larger(
            _larger(self._by_measured.by(end), self._by_amplified.before(call.start_order)),
            self._amplified.get(key, NO_FLOOR),
        )


class _Running:
    """The largest of some calls' floors that ended before / by a point of the order."""

    def __init__(self, calls: dict[tuple[str, int], Call], own: dict[tuple[str, int], Floor]):
        never = 1 << 62
        ordered = sorted(
            (never if calls[k].end_order is None else int(calls[k].end_order or 0), k) for k in own
        )
        self._ends = [end for end, _ in ordered]
        self._running: list[Floor] = []
        best = NO_FLOOR
        for _, key in ordered:
            best = _larger(best, own[key])
            self._running.append(best)

    def before(self, order: int) -> Floor:
        found = bisect.bisect_left(self._ends, order)
        return self._running[found - 1] if found else NO_FLOOR

    def by(self, order: int) -> Floor:
        found = bisect.bisect_right(self._ends, order)
        return self._running[found - 1] if found else NO_FLOOR


def _larger(a: Floor, b: Floor) -> Floor:
    return b if b.bound > a.bound else a


def _quant_noise(errors: Iterable[float]) -> float:
    """The noise quantized modules upstream leave: the largest one's expected error.
    They do not add up like rounding does: each quantized matmul's relative error lands
    on a residual stream that the next norm rescales, so measured clean 4-bit ports stay
    within 1.1-2.4x one module's error over whole models, not sqrt(n) x."""
    return max(errors, default=0.0)


def expected_error(
    u: float | None, depth: int, quant: float, floor: Floor = NO_FLOOR
) -> float | None:
    """The relative RMS error a clean port may show after ``depth`` leaf ops, with
    ``quant`` quantization noise and an ill-conditioned op's ``floor`` upstream."""
    if u is None:
        return None
    # Rounding and quantization noise add (an 8-bit port in bf16 has both, comparable).
    # Conditioning is the same rounding seen through an op that amplifies it: whichever
    # of the two explains more is the bound, never both.
    return max(rounding_bound(u, depth), floor.bound) + QUANT_C * quant


def scale_test(result: EntryResult, bound: float, *, check_max: bool = True) -> bool:
    """Pass when the error relative to the reference's scale is within ``bound`` (RMS)
    and ``MAX_FACTOR * bound`` (the largest element against the largest value), with no
    NaN/Inf mismatch."""
    if result.get("nonfinite_mismatched"):
        return False
    rel_rms, rel_max = result.get("rel_rms"), result.get("rel_max")
    if rel_rms is None:  # nothing finite in both: decided by the NaN/Inf pattern alone
        return not result.get("mismatched")
    if isinstance(rel_rms, str) or isinstance(rel_max, str):
        return False
    if not check_max or rel_max is None:
        return rel_rms <= bound
    return rel_rms <= bound and rel_max <= MAX_FACTOR * bound


def exact_scale(result: EntryResult, bound: float) -> float | None:
    """``s`` when ``b`` is ``s * a`` up to rounding (a scale moved across a boundary).

    ``b`` is ``s a`` when what is left of it beyond the best scale (the residual,
    ``sqrt(1 - cos^2)``) is within ``MAX_FACTOR`` times the bound, and the scale is one
    when the norms' ratio differs from 1 by more than ``MAX_FACTOR`` times the smaller of
    the bound and that residual: noise of relative size ``r`` moves the ratio by about
    ``r^2 / 2`` only, so a bound widened by quantization noise (0.39 at a 4-bit
    embedding) must not hide Gemma's x8 embedding scale (``|1/8 - 1| = 0.875``), which
    replay then blamed on a clean 4-bit port's ``embed_tokens``."""
    cosine, rms_a, rms_b = result.get("cosine"), result.get("rms_a"), result.get("rms_b")
    if result.get("nonfinite_mismatched"):
        return None  # the finite elements' cosine says nothing of the NaN/inf ones
    if not (
        isinstance(cosine, float | int)
        and isinstance(rms_a, float | int)
        and isinstance(rms_b, float | int)
    ):
        return None
    if rms_a == 0:
        return None
    residual = math.sqrt(max(0.0, 1.0 - float(cosine) ** 2))  # |b - s a| / |b| at the best s
    if residual > max(MAX_FACTOR * bound, 1e-6):
        return None
    ratio = rms_b / rms_a * (1.0 if cosine >= 0 else -1.0)
    moved = MAX_FACTOR * min(bound, max(residual, 1e-6))
    return ratio if abs(abs(ratio) - 1.0) > moved else None


def rel(value: float | str | None) -> float:
    """A relative error as a float for comparisons ("inf"/"nan"/None made comparable)."""
    if value is None:
        return 0.0
    if isinstance(value, str):
        return math.inf
    return float(value)


__all__ = [
    "Call",
    "Depths",
    "AMPLIFYING",
    "Floor",
    "NO_FLOOR",
    "amplification",
    "amplified",
    "depths",
    "exact_scale",
    "expected_error",
    "quantization_error",
    "rel",
    "rounding_bound",
    "scale_test",
    "unit_roundoff",
]
