"""The shapes of what compare builds: one pair's numbers, the entries it pairs, the rows
it reports.

``results.py`` holds the verbs' answers (``CompareSummary`` and its kin), whose nested
lists stay ``dict[str, Any]`` for the MCP schemas; these TypedDicts say what those dicts
hold, for the code of ``compare/`` that builds and reads them.
"""

from __future__ import annotations

from typing_extensions import TypedDict

# A JSON float: a finite number, or "nan" / "inf" / "-inf" (never a bare NaN).
JsonNumber = float | str


class WorstElement(TypedDict):
    """One element of a pair: its index in the reference's shape and both values."""

    index: list[int]
    a: int | float | str
    b: int | float | str


class ScaleMetrics(TypedDict):
    """The error against the reference's own scale (``rel_rms``, ``rel_max``) and the two
    sides' RMS; ``None`` when no pair is finite in both."""

    rel_rms: JsonNumber | None
    rel_max: JsonNumber | None
    rms_a: JsonNumber | None
    rms_b: JsonNumber | None


class RunningMetrics(ScaleMetrics):
    """What the streamed totals give: the metrics over pairs finite in both, the counts."""

    max_abs: JsonNumber | None
    mean_abs: JsonNumber | None
    max_rel: JsonNumber | None
    cosine: JsonNumber | None
    range_a: list[JsonNumber] | None
    range_b: list[JsonNumber] | None
    range_ratio: JsonNumber | None
    mismatched: int
    nonfinite_mismatched: int
    min_atol: JsonNumber | None
    nan_a: int
    nan_b: int
    inf_a: int
    inf_b: int


class PairMetrics(RunningMetrics):
    """What ``metrics.compare_arrays`` measures for one pair (see its docstring)."""

    numel: int
    head_a: list[int | float | str]
    head_b: list[int | float | str]
    worst: WorstElement | None
    largest: WorstElement | None
    ok: bool
