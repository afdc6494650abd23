"""The shapes of what compare builds: one pair's numbers, the entries it pairs, the rows
it reports.

``results.py`` holds the verbs' answers (``CompareSummary`` and its kin), whose nested
lists stay ``dict[str, Any]`` for the MCP schemas; these TypedDicts say what those dicts
hold, for the code of ``compare/`` that builds and reads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from typing_extensions import NotRequired, TypedDict

if TYPE_CHECKING:
    from ..results import Call

# A JSON float: a finite number, or "nan" / "inf" / "-inf" (never a bare NaN).
JsonNumber = float | str
# A comparison as ``--json`` prints it (docs/verdict.md): built key by key by the
# driver, its parts typed below.
Document: TypeAlias = dict[str, Any]


class WorstElement(TypedDict):
    """One element of a pair: its index in the reference's shape and both values."""

    index: list[int]
    a: int | float | str
    b: int | float | str


class ScaleMetrics(TypedDict, total=False):
    """The error against the reference's own scale (``rel_rms``, ``rel_max``) and the two
    sides' RMS; ``None`` when no pair is finite in both."""

    rel_rms: JsonNumber | None
    rel_max: JsonNumber | None
    rms_a: JsonNumber | None
    rms_b: JsonNumber | None


class RunningMetrics(ScaleMetrics, total=False):
    """What the streamed totals give: the metrics over pairs finite in both, the counts."""

    max_abs: JsonNumber | None
    mean_abs: JsonNumber | None
    max_rel: JsonNumber | None
    cosine: JsonNumber | None
    # [min, max] of the finite values; a summary capture's entries: the range's width
    range_a: list[JsonNumber] | float | None
    range_b: list[JsonNumber] | float | None
    range_ratio: JsonNumber | None
    mismatched: int | None
    nonfinite_mismatched: int | None
    min_atol: JsonNumber | None
    nan_a: int | None
    nan_b: int | None
    inf_a: int | None
    inf_b: int | None
    # How many elements the statistics above cover (finite in both), and how many are
    # NaN/inf in the port only.
    finite_pairs: int | None
    port_nonfinite: int | None


class PairMetrics(RunningMetrics, total=False):
    """What ``metrics.compare_arrays`` measures for one pair (see its docstring; it fills
    every key, and only the metrics ``None``).  In a comparison's entries every key is
    ``None`` when nothing could be measured (an error, shapes that differ)."""

    numel: int | None
    head_a: list[int | float | str] | None
    head_b: list[int | float | str] | None
    worst: WorstElement | None
    largest: WorstElement | None
    # the port's NaN/inf element whose reference value is largest (an overflow's evidence)
    nonfinite_at: WorstElement | None
    ok: bool


# "from" and "class" are Python keywords: these two are spelled the functional way.
Conditioning = TypedDict(
    "Conditioning",
    {
        "bound": float,
        "from": str,
        "sensitivity": "float | None",
        "amplification": float,
        "input_rel_rms": "float | None",
    },
    total=False,
)
"""The ill-conditioned call that sets an entry's bound (``comparison.judge``)."""


class Estimated(TypedDict):
    """How a summary capture's numbers were estimated (``sketched.py``)."""

    method: str
    buckets: int
    accuracy: float
    # rel_rms is a lower bound of the error, not an estimate (summaries of two layouts)
    lower_bound: NotRequired[bool]


class OutOfRange(TypedDict):
    """What the port's dtype could not hold (``judge/ranges.py``): ``kind`` is
    ``overflow`` (the reference's value beyond the dtype's largest finite one where the
    port is NaN/inf), ``nonfinite`` (the port NaN/inf where the reference fits) or
    ``underflow`` (the reference below the dtype's smallest normal); ``limit`` the dtype's
    number that decided; the element with the largest reference value where the port
    went NaN/inf, and how many did."""

    kind: str
    dtype: str
    limit: float
    count: int
    index: NotRequired[list[int]]
    reference: NotRequired[int | float | str]
    port: NotRequired[int | float | str]


class LocalError(TypedDict, total=False):
    """A reference output against the replayed port's output for the same call."""

    rel_rms: JsonNumber | None
    rel_max: JsonNumber | None
    max_abs: JsonNumber | None
    expected: float | None
    ok: bool
    error: str | None


class QuantizedPort(TypedDict):
    bits: int | None
    group_size: int | None


class BetterNumbers(TypedDict, total=False):
    """An entry judged beside a better run of the reference (``judge/better.py``): the
    reference's own error against it, the bound that gave, and which kind of run."""

    rel_rms: float  # B's error against the better run
    reference_rel_rms: float  # A's
    bound: float  # what B's may be
    ok: bool
    mode: str


class EntryResult(PairMetrics, total=False):
    """One paired tensor as the comparison reports it (docs/verdict.md): where
    it sits, the metrics (``PairMetrics``, or estimates of them from a summary capture),
    and the judgement the rules add."""

    name: str
    name_b: str
    paired_by: str
    module: str | None
    call: int | None
    role: str | None
    shape_a: list[int]
    shape_b: list[int]
    dtype_a: str
    dtype_b: str
    transpose: list[int] | None
    layout: str | None
    reshape: str
    rtol: float
    atol: float
    error: str | None
    estimated: Estimated
    # the judgement
    elementwise_ok: bool | None
    scale_ok: bool
    test: str
    depth: int
    expected: float | None
    expected_local: float | None
    quant_noise: float
    quantized: QuantizedPort
    conditioning: Conditioning
    better: BetterNumbers
    headroom: float  # rel_rms / expected: 1 is the bound
    local: LocalError
    culprit: bool
    compensated_by: str
    note: str
    out_of_range: OutOfRange


Boundary = TypedDict(
    "Boundary",
    {
        "name": str,
        "module": str,
        "call": int,
        "class": str,
        "entries": "list[str]",
        "ratio": "float | None",
        "compensated_by": str,
        "rel_rms": "JsonNumber",
        "note": str,
    },
    total=False,
)
"""A difference the next module undoes (a scale moved across a boundary)."""


class Note(TypedDict, total=False):
    """A difference beyond its bound that no output shows: reported, never a failure."""

    name: str
    module: str | None
    call: int | None
    entries: list[str]
    rel_rms: JsonNumber
    expected: float
    note: str
    replay_checked: bool


class Site(TypedDict):
    """Where each script made a top-level call (file:line), as captured."""

    call: str
    site_a: str | None
    site_b: str | None


class SideBySide(TypedDict):
    """A differing entry's first values on each side and its worst element."""

    name: str
    head_a: list[int | float | str] | None
    head_b: list[int | float | str] | None
    worst: WorstElement | None
    rel_rms: JsonNumber | None
    max_abs: JsonNumber | None


class Glue(TypedDict):
    """The script's code between two top-level calls: the culprit of a ``glue`` verdict."""

    after: Site | None
    before: Site
    input: SideBySide


Culprit = TypedDict(
    "Culprit",
    {
        "name": str,
        "module": "str | None",
        "call": "int | None",
        "class": str,
        "reason": str,
        "entries": "list[str]",
        "max_abs": "JsonNumber | None",
        "rel_rms": "JsonNumber | None",
        "input_rel_rms": float,
        "expected": float,
        "nonfinite_mismatched": int,
        "inputs_compared": bool,
        "model": str,
        "step": int,
        "never_called_in_b": bool,
        "local": bool,
        "by_growth": "dict[str, str] | None",
        "glue": Glue,
        "unpaired_children": "list[str]",
        "hint": str,
        "passes_elementwise": bool,
        "out_of_range": OutOfRange,
        "capture": str,
    },
    total=False,
)
"""The first divergence (docs/verdict.md, "First divergence"): the call named and why."""


LocalCall = TypedDict(
    "LocalCall",
    {
        "name": str,
        "module": "str | None",
        "call": "int | None",
        "class": "str | None",
        "rel_rms": "JsonNumber | None",
        "rel_max": "JsonNumber | None",
        "max_abs": "JsonNumber | None",
        "expected": "float | None",
        "ok": bool,
        "error": "str | None",
        "quantized": QuantizedPort,
        "compensated_by": str,
    },
    total=False,
)
"""One replayed call's own error, as listed under ``replay_culprit``'s evidence."""


class LocalErrors(TypedDict):
    """The port's own errors on the reference's inputs (``comparison.local_errors``)."""

    entries: dict[str, LocalError]
    culprit: Culprit | None
    list: list[LocalCall]
    boundaries: list[Boundary]


class MissingSide(TypedDict):
    """What one capture lost (``pair/missing.py``): tensors it did not write (budget,
    per-call limit, a dtype it cannot store), calls whose tensors of a role it could not
    write (a full disk), calls that never returned or raised, index lines lost."""

    label: str
    state: str
    not_written: int
    first_not_written: str | None
    calls_not_written: int
    unfinished: list[str]
    index_lines_lost: int


class UncheckedEntry(TypedDict):
    name: str
    why: str


class Missing(TypedDict):
    """The entries no comparison could check because a capture lost them: never
    agreement (docs/verdict.md)."""

    a: MissingSide | None
    b: MissingSide | None
    unchecked: int
    entries: list[UncheckedEntry]  # the first ones, in A's order
    last_agreeing: str | None  # the last output compared and agreeing before the first
    note: str


class NarrowHint(TypedDict):
    """Where a coarse comparison says to capture next (``report/narrow.py``): in full inside the
    culprit, or, when that would not fit the coarse pass's budget, as summaries one
    level down inside it."""

    within_a: str
    within_b: str
    mode: str  # "full" | "summary"
    # What a full capture inside the culprit would write (side A), about: None unknown.
    full_bytes: int | None
    hint: str
    calls: list[Call]  # the two captures to make, then the comparison of them


class PipelineCulprit(TypedDict):
    name: str
    reason: str


class PipelineModel(TypedDict):
    """One model of a pipeline's comparison (``pipeline.py``): its captures, classes and
    verdict; ``error`` when it could not be compared (or has no counterpart)."""

    position: int
    a: str | None
    b: str | None
    class_a: str | None
    class_b: str | None
    ok: bool
    decided_by: str | None
    first_divergence: PipelineCulprit | None
    counts: dict[str, int] | None
    error: str | None
    code: NotRequired[str]


class OtherModels(TypedDict):
    """The later models a zero-edit run captured beside the first (``judge/upstream.py``)."""

    models_a: list[str]
    models_b: list[str]
    hint: str
    counterpart_b: NotRequired[str]  # the capture of B's run that holds A's modules


class WeightsHint(TypedDict):
    """The culprit's own parameters as the first suspect (``report/narrow.py``)."""

    module: str | None
    hint: str
    calls: list[Call]  # the audit (after capturing both with their parameters, if needed)


class OpMatch(TypedDict, total=False):
    """One of the port's operation outputs and its closest reference operation."""

    op_b: str
    class_b: str
    shape_b: list[int]
    closest_a: str | None
    class_a: str
    rel_rms: float | None
    expected: float | None
    ok: bool | None


class OpsItem(TypedDict):
    """The operations recorded inside one module call (``ops.py``)."""

    module: str
    call: int
    name: str
    ops_a: int
    ops_b: int
    first_divergence: OpMatch | None
    ops: list[OpMatch]
    truncated: bool
    module_ok: bool | None  # the module call's outputs passed compare (None: not paired)
    note: str | None  # why no operation is named although some have no counterpart
