"""How much a module's own work moves its output when its operands move by one rounding step.

Two correct implementations of one op differ by their rounding, and a backward-stable
op computes the exact result of inputs perturbed by about one unit roundoff ``u``.  So
what two clean implementations may differ by at a module is the module's own
*sensitivity*: the relative change of its output when each float input element is
multiplied by ``1 +- u``.  For most ops that is about ``u`` (a matmul, a norm); for an
ill-conditioned op it is much more: ``sin(1000 x)`` moves by ``1000 u``, which is why a
diffusion model's sinusoidal timestep embedding differs between PyTorch and MLX by
far more than one rounding step while both are right.

This is msprobe's "benchmark-free perturbation check" done per module, at capture time:
each leaf call (one that calls no captured submodule) runs once more, on perturbed
copies of its inputs, and its index line gets ``sensitivity`` (the largest relative RMS
change over its float outputs) and ``step``, the ``u`` it was perturbed by: their ratio
is the call's measured amplification of a relative error in what it reads, which
compare applies to the error its inputs actually arrive with.

**A call with children** measures its inline work.  An attention whose q/k/v/out
projections are ``Linear`` children computes the softmax of its logits, the rotary
embedding, the mask and the SDPA inline (diffusers' Flux and SD3 processors, every
hand-written MLX DiT): that is where its conditioning lives, and its leaves'
measurements cannot see it.  So the call runs twice more, its children running again
each time (unrecorded):

* with its inputs perturbed as a leaf's are: ``amplification`` is its outputs' relative
  change over ``step``, what a relative error in what it reads becomes at its outputs
  (the softmax of large logits: 5 to 30; a ``Linear``: 1 to 3).  Compare applies it to
  the error its inputs actually arrive with (``compare.verdict.amplified``).
* with its inputs kept, every captured descendant's output multiplied by ``1 +- u``
  of its own dtype as it returns (the forward hook's or the recording class's return
  value) and every intermediate its own code computes rounded the same way as it is
  computed (:meth:`Frame.inline_rounding`: each torch operation's float result; in MLX,
  whose operators cannot be wrapped, each ``mx`` function's result and the arguments of
  its ill-conditioned ones, a sine's): ``sensitivity`` is what one rounding step at
  each of its module boundaries and of each inline intermediate becomes, its own
  rounding.  A time embedding that computes ``[cos, sin](t * freqs)`` inline with ``t``
  up to 1000 and then calls its ``Linear`` children rounds ``t * freqs`` by ~6e-5 at
  1000: its sines move ~1000 steps, which the children's outputs alone never showed
  (issue 33: a clean such embedding "differed" and hid a schedule bug's glue).  Not
  its inputs' steps: those are what the amplification applies to, measured (an exact
  timestep into a bfloat16 time embedding carries no error, and one bfloat16 step of
  900 would move a sine by 3.5).

A leaf that reads no float (an embedding of integer ids, a time embedding of an integer
timestep) has no input to perturb: its ``sensitivity`` is that rounding re-run's, its
intermediates rounded (no ``amplification``).

The children's share is not subtracted, but it is not counted twice either: compare
takes the *largest* floor (the call's own or any child's), never a sum.  Why not hold
the children's outputs and re-run only the inline work: an attention's output *is* its
``to_out`` child's output, so a held child would hide the softmax whose result flows
into it.

The cost is bounded by height: a call with children is re-run when its subtree is at
most ``MAX_HEIGHT`` (1) call deep below it and all of it is recorded (not below the
capture's ``depth``), so each op of the forward runs at most three more times (once
for its leaf, twice for its parent), never once per level of a deep model; blocks and
roots, whose inline work is residual additions and modulation, are not re-run.  A module
whose forward updates state outside its arguments (a counter on ``self``, a caching
hook) is updated by the re-runs too: capture with ``sensitivity=False`` for such a model.

**What a measurement costs, and what is done to keep it off the forward.**  The re-runs
are the measurement and stay; what surrounds them is made cheap without changing what is
measured:

* *Signs drawn once.*  The k-th tensor a measurement perturbs gets the signs seeded by
  ``(SEED, k)`` for its shape, dtype and device, drawn once per capture and kept
  (:class:`Perturbations`, at most ``SIGN_CACHE_BYTES``; past that they are drawn each
  time, the same signs).  Two operands of one call still get independent signs (``a - b``
  with ``a ~ b`` must show its cancellation), and every call of a shape sees the same
  ones, as before this cache (each measurement re-seeded its generator).
* *Compared where the tensors are.*  The relative RMS change is two norms computed by the
  framework on the tensor's device (float32 for float32 and narrower outputs, float64
  when that overflows or for float64 outputs; the difference of two nearby floats is
  exact), and only the two scalars reach the host: no float64 copy of every output.
* *Row-wise leaves re-run on a sample of rows.*  A leaf whose type says it maps each row
  of its input to the same row of its output and nothing else (``ROW_WISE``: torch's and
  MLX's own ``Linear``, ``LayerNorm``, ``RMSNorm`` and elementwise activations, decided by
  exact type, never by name; a subclass or an instance whose ``forward`` was replaced is
  unknown) re-runs on ``SAMPLE_ROWS`` rows drawn by :func:`row_sample` instead of all of
  them when it has more than ``2 * SAMPLE_ROWS``.  The statistic is a norm ratio,
  ``sum_r |dy_r|^2 / sum_r |y_r|^2``: the denominator is known exactly from the output
  already computed, and the numerator is estimated without bias by importance sampling
  (systematic sampling with probabilities ``w_r``, each sampled row weighted by
  ``1 / (n w_r)``).  ``w_r`` mixes three shares (the row's share of the input's energy,
  of the output's energy, and ``1/N``): the perturbation's effect on a row of a ``Linear``
  scales with the row's input energy, a norm's with its output's, so the sampled ratios
  are nearly constant and the estimate's spread small, while the uniform share bounds
  every ratio by ``3 N`` times the row's change (never worse than a uniform sample by
  more than 3x in variance: defensive importance sampling, Hesterberg 1995); a row
  holding ``1/n`` of the weight (a "massive activation" token) is always in the sample.
  Small inputs keep the full re-run.
* *Calls observed to be row-wise re-run on a sample of rows too.*  A call of any other
  type (a user's MLP, a norm subclass, a call with children) that reads one tensor and
  returns one with the same leading dimensions re-runs on the sampled rows of its last
  dimension first, unperturbed (the *base*), and counts as row-wise only when the base
  reproduces the forward's rows to within what one rounding step of its inputs moves
  them (:func:`_observed_change`): a call whose rows read one another (attention over
  tokens, a norm over the sequence) misses by orders of magnitude and is re-run whole,
  as is one that fails on the subset.  Its perturbed and rounding re-runs then run on
  the rows alone, measured against the base: an MLP's two re-runs, a whole MLP forward
  each at 4,096 tokens, become three runs of 32 rows.
* *Children that read what they read before are not run again.*  A call with children's
  rounding re-run keeps its inputs, so a child that reads them as they are (an MLP's
  gate and up projections, an attention's q/k/v projections) is called with the very
  objects it got in the forward: it returns the output it returned then (kept for the
  parent while it is open, as :class:`HeldCall`; only leaves, and only for a parent at
  most ``MAX_HEIGHT`` deep, at most ``MAX_HELD_BYTES`` of outputs per parent: past
  that its children run again), which its hook then rounds as ever.  "The very objects":
  every tensor of its arguments identical (``is``), torch's in-place version counter
  unchanged, every plain value equal; anything else runs.  The measurement is the same
  number (``tests/test_capture_sampling.py`` checks it against a parent that passes a
  copy): a re-run already assumes a module's output is a function of its inputs.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol, TypeGuard, TypeVar

from .. import dtypes
from .records import Sensitivity

if TYPE_CHECKING:  # numpy is imported when a capture measures (``import mldbg`` stays light)
    import numpy as np

_PLAIN = (int, float, bool, str, bytes, type(None))


def unit(dtype_name: str) -> float:
    """Unit roundoff (half an ulp at 1) of a float dtype, as torch and MLX spell it
    (``float32``, ``torch.float32``, ``mlx.core.float32``); float32's for a dtype that
    does not round."""
    name = dtype_name.rsplit(".", 1)[-1]
    return dtypes.unit_roundoff(name) or dtypes.BY_CODE["F32"].unit_roundoff or 0.0


STATEFUL_IN_TRAINING = ("Dropout", "BatchNorm")
SEED = 20  # the perturbation's signs: the same on every run, whatever the user's seeds
_STATE = threading.local()
# A call with children is re-run (children included) only when its subtree is at most
# this many calls deep: each op then runs at most 1 + 2 * MAX_HEIGHT more times.
MAX_HEIGHT = 1
# Rows a row-wise leaf re-runs on (when it has more than twice as many): the estimate's
# relative spread is about the spread of the sampled rows' ratios over sqrt(SAMPLE_ROWS).
SAMPLE_ROWS = 32
# Activation classes that map each element on its own, by the name both torch.nn and
# mlx.nn give them (each side keeps those its framework has): re-run on sampled rows.
ELEMENTWISE_ACTIVATIONS = (
    "ReLU",
    "ReLU6",
    "LeakyReLU",
    "ELU",
    "SELU",
    "CELU",
    "GELU",
    "SiLU",
    "Mish",
    "Tanh",
    "Sigmoid",
    "Softplus",
    "Hardswish",
    "Hardsigmoid",
    "Hardtanh",
)
# Signs kept per capture (bytes, on the tensors' devices); past it they are drawn again.
SIGN_CACHE_BYTES = 128 * 1024 * 1024
# Leaf outputs kept per open parent for its rounding re-run; past it they run again.
MAX_HELD_BYTES = 256 * 1024 * 1024

T = TypeVar("T")  # a framework's tensor type (torch.Tensor, mlx.core.array)

# The measured module's call again, on (args, kwargs).
Rerun = Callable[[tuple[object, ...], dict[str, object]], object]


class Frame(Protocol[T]):
    """What measuring needs of a framework (torch: ``sensitivity_torch``, MLX:
    ``sensitivity_mlx``), for its tensors of type ``T``."""

    def is_float(self, x: object) -> TypeGuard[T]: ...

    def dtype_name(self, x: T) -> str: ...

    def cast(self, x: T, like: T) -> T: ...

    def shape(self, x: T) -> tuple[int, ...]: ...

    def signs(self, x: T, u: float, ordinal: int) -> tuple[Hashable, Callable[[], T]]:
        """The cache key of ``x``'s scaled signs and how to draw them: ``+-u`` in x's
        dtype, seeded by ``(SEED, ordinal)``, on x's device."""
        ...

    def nbytes(self, x: T) -> int: ...

    def perturb(self, x: T, scaled_signs: T) -> T: ...

    def relative_change(self, before: T, after: T) -> float | None:
        """``|after - before| / |before|`` (RMS over all elements; nan when ``before`` is
        zero or not finite), None when the shapes differ."""
        ...

    def row_energies(self, x: T, row_dims: int) -> np.ndarray:
        """The sum of squares of each row of ``x`` (its last ``row_dims`` dimensions), as
        float64 on the host."""
        ...

    def take_rows(self, x: T, row_dims: int, picked: np.ndarray) -> T:
        """Rows ``picked`` of ``x``, stacked: shape ``(len(picked), *x.shape[-row_dims:])``."""
        ...

    def row_changes(self, before: T, after: T) -> np.ndarray:
        """Per row of two equal-shaped tensors of rows: ``|after - before|^2``, float64."""
        ...

    def reshape(self, x: T, shape: tuple[int, ...]) -> T: ...

    def inline_rounding(self, round_one: Callable[[T], T]) -> AbstractContextManager[object]:
        """While open, on this thread: each float intermediate the running code computes
        with the framework's operations passes through ``round_one`` (one rounding step
        of it) before the code reads it.  Operations that do not round (a reshape, a
        slice, a concatenation, a widening cast) are left alone, and so are the
        measurement's own work and a captured descendant's (:func:`inline_work`)."""
        ...


class Perturbations:
    """One capture's drawn perturbation signs (bounded by bytes, least recently used first
    out) and its row-sample draws (seeded: the same model and inputs give the same
    samples).  Thread-safe: captured models may run on several threads."""

    def __init__(self, max_bytes: int = SIGN_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._signs: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._draws: np.random.Generator | None = None

    def signs(self, frame: Frame[T], x: T, u: float, ordinal: int) -> T:
        key, draw = frame.signs(x, u, ordinal)
        with self._lock:
            found = self._signs.get(key)
            if found is not None and frame.is_float(found[0]):
                self._signs.move_to_end(key)
                return found[0]
        drawn = draw()
        size = frame.nbytes(drawn)
        if size > self.max_bytes:
            return drawn
        with self._lock:
            if key not in self._signs:
                self._signs[key] = (drawn, size)
                self._bytes += size
                while self._bytes > self.max_bytes:
                    _key, (_value, evicted) = self._signs.popitem(last=False)
                    self._bytes -= evicted
        return drawn

    def offset(self) -> float:
        """A uniform draw in [0, 1): where a systematic sample starts."""
        import numpy as np

        with self._lock:
            if self._draws is None:
                self._draws = np.random.default_rng([SEED, 1])
            return float(self._draws.random())


@dataclasses.dataclass
class HeldCall:
    """A leaf call's arguments (the objects themselves), the version of each tensor among
    them and its output, kept while its parent is open (see "Children that read what
    they read before")."""

    module: object
    args: tuple[object, ...]
    kwargs: Mapping[str, object]
    versions: tuple[int, ...]
    output: object
    # The version of each tensor of its output when it returned: a parent that changes
    # a child's output in place (``h = self.gate(x); h.mul_(2)``) must not get it back.
    output_versions: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors among its outputs (what holding it may keep alive)."""
        return sum(int(getattr(x, "nbytes", 0) or 0) for x in _leaves(self.output))

    def reads(
        self, args: tuple[object, ...], kwargs: Mapping[str, object], versions: tuple[int, ...]
    ) -> bool:
        """Whether ``(args, kwargs)`` are the objects this call read, unchanged."""
        if len(args) != len(self.args) or list(kwargs) != list(self.kwargs):
            return False
        now = _leaves((args, tuple(kwargs.values())))
        then = _leaves((self.args, tuple(self.kwargs.values())))
        if len(now) != len(then) or versions != self.versions:
            return False
        return all(
            a is b or (isinstance(a, _PLAIN) and type(a) is type(b) and a == b)
            for a, b in zip(now, then, strict=True)
        )


def held_output(
    owner: object,
    module: object,
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    versions: tuple[int, ...] = (),
    output_versions: Callable[[object], tuple[int, ...]] | None = None,
) -> tuple[bool, object]:
    """During ``owner``'s rounding re-run: ``(True, output)`` when this call of ``module``
    is the next one held for it, reads the same objects and its output is as it returned
    it (``output_versions``: the framework's versions of an output's tensors; MLX arrays
    never change); ``(False, None)`` otherwise (then the call runs).  The k-th call of a
    module in the re-run is matched with its k-th call in the forward."""
    active = getattr(_STATE, "held", None)
    if active is None or active[0] is not owner:
        return False, None
    queue = active[1].get(id(module))
    if not queue:
        return False, None
    held = queue.pop(0)
    if held.module is not module or not held.reads(args, kwargs, versions):
        return False, None
    if output_versions is not None and output_versions(held.output) != held.output_versions:
        return False, None
    return True, held.output


@contextlib.contextmanager
def _holding(owner: object, held: Sequence[HeldCall]) -> Iterator[None]:
    previous = getattr(_STATE, "held", None)
    queues: dict[int, list[HeldCall]] = {}
    for call in held:
        queues.setdefault(id(call.module), []).append(call)
    _STATE.held = (owner, queues)
    try:
        yield
    finally:
        _STATE.held = previous


def measuring() -> bool:
    """A re-run is under way on this thread: no capture records it (captures may nest,
    and a leaf of one capture can hold modules another capture records)."""
    return bool(getattr(_STATE, "depth", 0))


def inline_work() -> bool:
    """An operation run now on this thread is the measured call's own inline work: not
    the measurement's (drawing or applying a perturbation) and not inside a captured
    descendant (whose output its hook rounds as it returns, one step for all of it, as
    when the descendant answers from the forward without running).  What
    :meth:`Frame.inline_rounding` rounds."""
    return not getattr(_STATE, "own", 0) and not getattr(_STATE, "descendants", 0)


@contextlib.contextmanager
def descendant(owner: object) -> Iterator[None]:
    """A captured descendant's call runs inside ``owner``'s rounding re-run (its hook or
    recording class says so): its operations are not the measured call's inline work."""
    active = getattr(_STATE, "rounding", None)
    if active is None or active[0] is not owner:
        yield
        return
    _STATE.descendants = getattr(_STATE, "descendants", 0) + 1
    try:
        yield
    finally:
        _STATE.descendants -= 1


def enter_descendant(owner: object) -> None:
    """:func:`descendant`'s entry, for a framework whose hooks split a call in two (a
    torch pre-hook); :func:`exit_descendant` must follow, in the forward hook."""
    active = getattr(_STATE, "rounding", None)
    if active is not None and active[0] is owner:
        _STATE.descendants = getattr(_STATE, "descendants", 0) + 1


def exit_descendant(owner: object) -> None:
    active = getattr(_STATE, "rounding", None)
    depth: int = getattr(_STATE, "descendants", 0)
    if active is not None and active[0] is owner and depth:
        _STATE.descendants = depth - 1


@contextlib.contextmanager
def _own() -> Iterator[None]:
    _STATE.own = getattr(_STATE, "own", 0) + 1
    try:
        yield
    finally:
        _STATE.own -= 1


@contextlib.contextmanager
def _rerunning() -> Iterator[None]:
    _STATE.depth = getattr(_STATE, "depth", 0) + 1
    try:
        yield
    finally:
        _STATE.depth -= 1


def rounded_output(owner: object, output: object) -> tuple[bool, object]:
    """During a re-run made by ``owner`` (a capture's recorder): a captured descendant's
    output rounded by one step of its dtype, as its hook or wrapper returns it
    (``(True, output)``); ``(False, None)`` outside one."""
    active = getattr(_STATE, "rounding", None)
    if active is None or active[0] is not owner:
        return False, None
    return True, _rebuild(active[1], output)


@contextlib.contextmanager
def _rounding(owner: object, round_one: Callable[[object], object]) -> Iterator[None]:
    previous = getattr(_STATE, "rounding", None), getattr(_STATE, "descendants", 0)
    _STATE.rounding, _STATE.descendants = (owner, round_one), 0
    try:
        yield
    finally:
        _STATE.rounding, _STATE.descendants = previous


def measure(
    frame: Frame[T],
    rerun: Rerun,
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    output: object,
    owner: object,
    with_children: bool,
    perturbations: Perturbations,
    row_dims: int | None,
    held: Sequence[HeldCall] = (),
) -> Sensitivity | None:
    """A call's sensitivity, from re-runs of it (``rerun``) on perturbed inputs; None
    when it is not measured.  A call ``with_children`` is also re-run with the outputs of
    the descendants that ``owner``'s hooks see rounded.  ``row_dims``: the module maps
    each row of its input (its last ``row_dims`` dimensions) to the same row of its
    output, by its type (None when unknown): a leaf's re-run is then on sampled rows.
    ``held``: the call's leaf children as they ran, for the rounding re-run.

    All of it runs as a re-run (:func:`measuring`): drawing the perturbations and
    comparing the outputs are the capture's work, so neither a capture nor the operations
    recorded inside a module (``ops=``) see them."""
    with _rerunning():
        try:
            outputs = [x for x in _leaves(output) if frame.is_float(x)]
            values = [*_leaves(args), *_leaves(tuple(kwargs.values()))]
            float_inputs = any(frame.is_float(x) for x in values)
            if not outputs:
                return None
            if not all(frame.is_float(x) or _is_plain_or_tensor(x) for x in values):
                return None  # an object the call may update (a cache): never run it twice
            finest = min(outputs, key=lambda x: unit(frame.dtype_name(x)))
            u_out = unit(frame.dtype_name(finest))
            drawn = [0]  # tensors perturbed so far by this re-run: each gets its own signs

            def perturb(x: T, u: float) -> T:
                ordinal, drawn[0] = drawn[0], drawn[0] + 1
                with _own():
                    return frame.perturb(x, perturbations.signs(frame, x, u, ordinal))

            def moved(x: object) -> object:
                if not frame.is_float(x):
                    return x
                u_in = unit(frame.dtype_name(x))
                if u_in > u_out:
                    # A step the input's own dtype cannot hold (a bfloat16 timestep into a
                    # float32 embedding): perturbed in the dtype the op computes in.
                    x = frame.cast(x, finest)
                # A finer input than the output (a float32 timestep into a bfloat16 model's
                # time embedding) moves by its own step: both sides read it at that precision.
                return perturb(x, min(u_in, u_out))

            def rounded(x: object) -> object:
                # A descendant's output is rounded to its own dtype by each implementation:
                # one step of that dtype, kept in it (what reads it reads the same dtype).
                if not frame.is_float(x):
                    return x
                return perturb(x, unit(frame.dtype_name(x)))

            def intermediate(x: T) -> T:
                # What the call's own code computes is rounded as it is computed, to the
                # dtype it is computed in: one step of that dtype.
                return perturb(x, unit(frame.dtype_name(x)))

            def change(again_output: object) -> float | None:
                again = [x for x in _leaves(again_output) if frame.is_float(x)]
                if len(again) != len(outputs):
                    return None
                worst = 0.0
                for before, after in zip(outputs, again, strict=True):
                    moved_by = frame.relative_change(before, after)
                    if moved_by is None:
                        return None
                    if math.isfinite(moved_by):
                        worst = max(worst, moved_by)
                return worst

            def rounding_rerun(
                a: tuple[object, ...], k: Mapping[str, object], held: Sequence[HeldCall] = ()
            ) -> object:
                """A re-run with every captured descendant's output and every
                intermediate of its own code rounded (``held``: the children that may
                answer from the forward, when ``a`` is its input)."""
                drawn[0] = 0
                with (
                    _rounding(owner, rounded),
                    _holding(owner, held),
                    frame.inline_rounding(intermediate),
                ):
                    return rerun(a, dict(k))

            found: Sensitivity = {"step": u_out}
            own: float | None = None  # its own rounding's effect, when measured on rows
            if float_inputs:  # what one rounding step of its inputs becomes
                through: float | None = None
                one_to_one = len(outputs) == 1 and not kwargs and len(args) == 1
                if one_to_one and row_dims is not None:
                    through = _sampled_change(
                        frame, rerun, args[0], outputs[0], row_dims, moved, perturbations
                    )
                elif one_to_one:
                    rows = _observed_change(
                        frame,
                        rerun,
                        args[0],
                        outputs[0],
                        moved,
                        perturbations,
                        rounding_rerun if with_children else None,
                    )
                    if rows is not None:
                        through, own = rows
                if through is None:
                    drawn[0] = 0
                    new_args = tuple(_map(moved, a) for a in args)
                    new_kwargs = {k: _map(moved, v) for k, v in kwargs.items()}
                    through = change(rerun(new_args, new_kwargs))
                if through is None:
                    return None
                found["amplification"] = through / u_out
                found["sensitivity"] = through
            if own is None and (with_children or not float_inputs):
                # What its own rounding becomes, inputs as they were: its descendants'
                # outputs and its inline intermediates rounded (a leaf that reads no
                # float, a time embedding of an integer timestep, has only the latter).
                own = change(rounding_rerun(args, kwargs, held))
                if own is None:
                    return None
            if own is not None:
                found["sensitivity"] = own
            return found
        except Exception:  # measuring must never break the model or the capture
            return None


# A measured call is benign when compare would set no floor from it: its amplification
# at most compare's AMPLIFYING (``compare/judge/bounds.py``: 4, where an amplified floor
# starts) and its own floor (COND_C = 2 times its sensitivity) below the rounding bound
# at its depth (2 u' sqrt(1 + d), u' its step times its dtype's ``accumulation``).
BENIGN_AMPLIFICATION = 4.0


def benign(found: Sensitivity, depth: int) -> bool:
    """Whether a call measured as ``found``, ``depth`` leaf calls into the capture, gives
    compare nothing to bound by: no amplification it applies, a floor below rounding's."""
    step, sensitivity = found.get("step"), found.get("sensitivity")
    if not step or sensitivity is None or not math.isfinite(sensitivity):
        return False
    amplification = found.get("amplification")
    if amplification is not None and amplification > BENIGN_AMPLIFICATION:
        return False
    counted = next(
        (d.accumulation for d in dtypes.TABLE if d.kind == "float" and d.unit_roundoff == step),
        1.0,
    )
    return sensitivity <= step * counted * math.sqrt(1 + max(0, depth))


def row_sample(
    input_energy: np.ndarray, output_energy: np.ndarray, size: int, offset: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A systematic sample of ``size`` draws over the rows, with probabilities ``w``
    mixing each row's share of the input's energy, of the output's and ``1/N``
    (a share whose total is zero or not finite is left out): the distinct rows drawn,
    how many times each, and ``w`` of each.  Row ``r`` is drawn ``n w_r`` times in
    expectation (``offset``, uniform in [0, 1), places the draws), which is what makes
    the weighted sum of :func:`estimate_change` unbiased."""
    import numpy as np

    rows = len(output_energy)
    shares = [np.full(rows, 1.0 / rows)]
    for energy in (input_energy, output_energy):
        total = float(energy.sum())
        if total > 0 and math.isfinite(total) and np.all(np.isfinite(energy)):
            shares.append(energy / total)
    weights = np.sum(shares, axis=0) / len(shares)
    cumulative = np.cumsum(weights)
    cumulative[-1] = 1.0
    points = (np.arange(size) + offset) / size
    drawn = np.minimum(np.searchsorted(cumulative, points, side="right"), rows - 1)
    picked, counts = np.unique(drawn, return_counts=True)
    return picked, counts, weights[picked]


def estimate_change(
    changes: np.ndarray, counts: np.ndarray, weights: np.ndarray, size: int, energy: float
) -> float:
    """``sqrt(sum_r |dy_r|^2 / energy)`` estimated from the sampled rows' ``changes``:
    each weighted by how often it was drawn over ``size * w_r``."""
    total = float((changes * counts / (size * weights)).sum())
    return math.sqrt(total / energy)


def _drawn_rows(
    frame: Frame[T], x: T, y: T, row_dims: int, perturbations: Perturbations
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float] | None:
    """The rows of a call that reads ``x`` and returns ``y`` to re-run, as
    :func:`row_sample` draws them, and ``y``'s energy; None when ``x`` has other leading
    dimensions than ``y`` (rows: all but the last ``row_dims``), at most
    ``2 * SAMPLE_ROWS`` rows, or ``y`` no finite energy (then the whole call is re-run)."""
    x_shape, y_shape = frame.shape(x), frame.shape(y)
    lead = len(x_shape) - row_dims
    if lead < 1 or len(y_shape) != len(x_shape) or y_shape[:lead] != x_shape[:lead]:
        return None
    if math.prod(x_shape[:lead]) <= 2 * SAMPLE_ROWS:
        return None
    y_energy = frame.row_energies(y, row_dims)
    energy = float(y_energy.sum())
    if not energy > 0 or not math.isfinite(energy):
        return None
    picked, counts, weights = row_sample(
        frame.row_energies(x, row_dims), y_energy, SAMPLE_ROWS, perturbations.offset()
    )
    return picked, counts, weights, energy


def _sampled_change(
    frame: Frame[T],
    rerun: Rerun,
    x: object,
    y: T,
    row_dims: int,
    moved: Callable[[object], object],
    perturbations: Perturbations,
) -> float | None:
    """A row-wise leaf's relative output change, from a re-run on ``SAMPLE_ROWS`` of its
    rows; None where the call does not fit (then the whole call is re-run).  Called by
    :func:`measure`, within its re-run."""
    if not frame.is_float(x):
        return None
    drawn = _drawn_rows(frame, x, y, row_dims, perturbations)
    if drawn is None:
        return None
    picked, counts, weights, energy = drawn
    again = rerun((moved(frame.take_rows(x, row_dims, picked)),), {})
    if not frame.is_float(again):
        return None
    before = frame.take_rows(y, row_dims, picked)
    if frame.shape(again) != frame.shape(before):
        return None
    changes = frame.row_changes(before, again)
    if not math.isfinite(float(changes.sum())):
        return None
    return estimate_change(changes, counts, weights, SAMPLE_ROWS, energy)


def _observed_change(
    frame: Frame[T],
    rerun: Rerun,
    x: object,
    y: T,
    moved: Callable[[object], object],
    perturbations: Perturbations,
    rounding: Callable[[tuple[object, ...], Mapping[str, object]], object] | None,
) -> tuple[float, float | None] | None:
    """A call of unknown type that reads one tensor and returns one, measured on
    ``SAMPLE_ROWS`` rows of its last dimension when it is *observed* to be row-wise:
    ``(input change, own rounding's change or None)`` as relative output changes, or
    None (then the whole call is re-run, as before).

    The sampled rows run three times (twice without ``rounding``): as they are (the
    *base*), with their inputs moved, and with ``rounding`` (the descendants' outputs
    rounded); the changes are taken against the base, so the subset's own rounding
    (another row count may take another kernel) is not counted as a perturbation's.
    The base is also compared with the forward's own rows: a call whose output rows
    read other rows (attention over tokens, a norm over the sequence) computes
    different rows from a subset, by orders of magnitude more than a rounding step.  It
    counts as row-wise only when the base reproduces the forward's rows to within what
    one rounding step of its input moves them (the measured input change): then what
    the subset misses of the other rows' influence is below the measurement itself.
    Called by :func:`measure`, within its re-run; any failure of the subset (a module
    that wants its input's shape) falls back to the whole call."""
    try:
        if not frame.is_float(x):
            return None
        drawn = _drawn_rows(frame, x, y, 1, perturbations)
        if drawn is None:
            return None
        picked, counts, weights, energy = drawn
        x_shape, y_shape = frame.shape(x), frame.shape(y)
        size = len(picked)
        # The sample keeps the input's rank (a leading 1 per outer dimension): a module
        # that unpacks ``batch, tokens, features`` still reads it.
        subset = frame.reshape(
            frame.take_rows(x, 1, picked), (1,) * (len(x_shape) - 2) + (size, x_shape[-1])
        )
        out_shape = (1,) * (len(y_shape) - 2) + (size, y_shape[-1])

        def rows_of(output: object) -> T | None:
            if not frame.is_float(output) or frame.shape(output) != out_shape:
                return None
            return frame.reshape(output, (size, y_shape[-1]))

        def estimated(before: T, after: T | None) -> float:
            if after is None:
                return math.nan
            changes = frame.row_changes(before, after)
            return estimate_change(changes, counts, weights, SAMPLE_ROWS, energy)

        base = rows_of(rerun((subset,), {}))
        if base is None:
            return None
        apart = estimated(frame.take_rows(y, 1, picked), base)
        through = estimated(base, rows_of(rerun((moved(subset),), {})))
        if not (math.isfinite(apart) and math.isfinite(through)) or apart > through:
            return None
        if rounding is None:
            return through, None
        own = estimated(base, rows_of(rounding((subset,), {})))
        return (through, own) if math.isfinite(own) else None
    except Exception:
        return None


def _leaves(value: object) -> list[object]:
    """Tensors and plain values of a nest of tuples, lists and dicts (one value otherwise)."""
    if isinstance(value, tuple | list):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    to_tuple = getattr(value, "to_tuple", None)
    if callable(to_tuple):  # a transformers / diffusers ModelOutput
        return _leaves(to_tuple())
    return [value]


def _map(fn: Callable[[object], object], value: object) -> object:
    if isinstance(value, tuple | list):
        return type(value)(_map(fn, item) for item in value)
    if isinstance(value, dict):
        return {k: _map(fn, item) for k, item in value.items()}
    return fn(value)


def _rebuild(fn: Callable[[object], object], value: object) -> object:
    """``value`` with ``fn`` applied to each leaf, of the same types (a named tuple, a
    ``ModelOutput``): what a held child returns must read like what it returned."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        named: Callable[..., object] = type(value)  # a namedtuple takes its fields
        return named(*(_rebuild(fn, item) for item in value))
    if isinstance(value, tuple | list):
        return type(value)(_rebuild(fn, item) for item in value)
    if isinstance(value, dict):
        rebuilt = copy.copy(value)
        for key, item in value.items():
            rebuilt[key] = _rebuild(fn, item)
        return rebuilt
    return fn(value)


def _is_plain_or_tensor(x: object) -> bool:
    """A value a call cannot update in place: plain Python values, and tensors (integer
    ids or masks), which are passed to the re-run unchanged."""
    return isinstance(x, _PLAIN) or type(x).__name__ in ("Tensor", "array", "ndarray")
