"""``mldbg.compare``: does the port match the reference, and where does it stop matching?

Standard library only at import (``import mldbg`` stays cheap); numpy is loaded when a
comparison runs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import BAD_ARGUMENT, BAD_TOLERANCE
from .read.sources import CompareInputError
from .records import Boundary, Culprit, EntryResult
from .replay import ReplayResult, replay  # standard library only at import

__all__ = ["CompareInputError", "Comparison", "ReplayResult", "compare", "compare_answer", "replay"]


class Comparison:
    """The outcome of :func:`compare`; ``.result`` is the JSON document ``--json`` prints."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result

    @property
    def ok(self) -> bool:
        return bool(self.result["ok"])

    @property
    def exit_code(self) -> int:
        """What ``mldbg compare`` exits with: 0 everything agrees, 1 something diverges,
        2 no verdict because a capture lost data the other side has (missing data is
        never agreement; bad input raises before there is a comparison)."""
        if self.ok:
            return 0
        undecided = self.result.get("decided_by") in ("missing", "pipeline")
        return 2 if undecided and self.first_divergence is None else 1

    @property
    def first_divergence(self) -> Culprit | None:
        return self.result["first_divergence"]

    @property
    def entries(self) -> list[EntryResult]:
        return self.result["entries"]

    @property
    def boundary_differences(self) -> list[Boundary]:
        return self.result["boundary_differences"]

    @property
    def proposed_map(self) -> dict[str, Any] | None:
        return self.result.get("proposed_map")

    @property
    def unpaired_a(self) -> list[str]:
        return self.result["unpaired_a"]

    @property
    def unpaired_b(self) -> list[str]:
        return self.result["unpaired_b"]

    def entry(self, name: str) -> EntryResult:
        for item in self.entries:
            if item["name"] == name:
                return item
        raise KeyError(name)

    def write_html(self, path: str | os.PathLike[str]) -> Path:
        from .report.html import write_html

        return write_html(self.result, Path(path))

    def __repr__(self) -> str:
        counts = self.result["counts"]
        verdict = "match" if self.ok else "diverges"
        culprit = self.first_divergence
        where = f", first divergence {culprit['name']}" if culprit else ""
        return (
            f"<mldbg comparison: {verdict}, {counts['passed']}/{counts['compared']} agree{where}>"
        )


def _spec(value: Any) -> str:
    path = getattr(value, "path", None)  # a Capture from mldbg.capture
    if path is not None and not isinstance(value, str | os.PathLike):
        return str(path)
    return os.fspath(value)


def compare(
    a: Any,
    b: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    map: str | os.PathLike[str] | Mapping[str, Any] | None = None,  # noqa: A002 - the CLI's name
    layout: str | None = None,
    replay: Any = None,
    better: object = None,
    html: str | os.PathLike[str] | None = None,
    home: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    shards: Mapping[str, int | str] | None = None,
) -> Comparison:
    """Compare ``a`` (the reference) with ``b`` (the port).

    Each of ``a``/``b`` is a capture name, a run id, ``RUN/NAME``, a directory or file of
    tensors, or a :class:`mldbg.capture.Capture`.  Tolerances default per dtype (those of
    ``torch.testing.assert_close``) for the element-wise numbers; without ``rtol`` /
    ``atol`` each entry is judged by the scale-aware test (docs/verdict.md), with them by
    the strict element-wise one.  ``map`` is a map file or the same dict inline; ``layout`` (``"NCHW"``, ``"NHWC"``, ``"auto"``) is B's activation
    layout when shapes alone cannot tell; ``replay`` names a capture written by
    :func:`mldbg.replay` (or a :class:`ReplayResult`), whose local errors are shown
    beside the propagated ones and name the culprit.  ``better`` names a run of the
    reference that rounds less (the same weights in float32 or float64, or, for a
    quantized port, the reference on the port's dequantized weights): each entry is then
    judged by B's error against it beside A's own (docs/parity-precision.md).
    ``shards`` makes ``b`` the captures
    of several ranks (``b="tp@rank*"``) gathered into one model: ``{glob: dim}`` for
    tensors the ranks slice along ``dim``, ``{glob: "sum"}`` for partial sums, the rest
    replicated (docs/ranks.md).
    Raises :class:`CompareInputError` for bad input (the CLI's exit code 2).
    """
    from ..store.runs import mldbg_home
    from .comparison import compare_sources
    from .culprit.check import check_enabled, refuse_contradictions
    from .pair.mapping import load_map, parse_map
    from .read.sources import Source, open_source
    from .records import Document

    for option, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise CompareInputError(
                f"{option} must be a finite number, 0 or more, not {value}", code=BAD_TOLERANCE
            )
    base = Path(home) if home is not None else mldbg_home()
    names = parse_map(dict(map), "map") if isinstance(map, Mapping) else load_map(map)
    from .pair.layout import check_layout

    check_layout(layout)
    if html is not None:  # a report path that cannot be written: said before comparing
        from ..store.output_files import check_output
        from .report.html import DOCTYPE

        try:
            check_output(html, DOCTYPE.encode())
        except OSError as exc:
            raise _html_refused(html, exc) from None
    if shards is not None:  # bad rules are bad input, whatever the captures
        from .read.gather import check_shards

        check_shards(shards)
    source_a = open_source(_spec(a), base)
    if shards is not None:
        from .read.gather import open_gathered

        source_b: Any = open_gathered(_spec(b), base, shards)
    else:
        source_b = open_source(_spec(b), base)
    from .pair.sequence_calls import align_calls
    from .pipeline import compare_pipeline, is_pipeline

    replay_source = None
    if replay is not None:
        replay_source = open_source(_spec(getattr(replay, "capture", replay)), base)
    better_source = open_source(_spec(better), base) if better is not None else None

    def one(
        source_a: Source, source_b: Source, replayed: Source | None, improved: Source | None
    ) -> Document:
        source_a, source_b, aligned = align_calls(source_a, source_b)
        result = compare_sources(
            source_a,
            source_b,
            rtol=rtol,
            atol=atol,
            names=names,
            layout=layout,
            replay=replayed,
            better=improved,
            progress=progress,
        )
        if aligned is not None:  # generation loops that split the sequence differently
            result["calls_aligned"] = aligned
        return result

    if shards is None and is_pipeline(source_a, source_b):  # every model of both runs
        result = compare_pipeline(source_a, source_b, (replay_source, better_source), one)
        if check_enabled():
            refuse_contradictions(result)
    else:
        result = one(source_a, source_b, replay_source, better_source)
    from .report.answer import json_numbers

    comparison = Comparison(json_numbers(result))
    if html is not None:
        try:
            comparison.write_html(html)
        except OSError as exc:
            raise _html_refused(html, exc) from None
    return comparison


def compare_answer(
    home: Path,
    *,
    a: str,
    b: str,
    rtol: float | None = None,
    atol: float | None = None,
    map: dict[str, Any] | str | None = None,
    layout: str | None = None,
    replay: str | None = None,
    better: str | None = None,
    shards: dict[str, int | str] | None = None,
    html: str | None = None,
    passing: bool = False,
    inputs: bool = False,
    module: str | None = None,
    call: int | None = None,
    status: str | None = None,
    kind: str | None = None,
    offset: int = 0,
    limit: int = 20,
) -> dict[str, Any]:
    """Run ``mldbg.compare`` and bound its answer (:func:`bounded`); paths are the
    caller's to resolve (the daemon makes a client's relative to where the client runs)."""
    from .report.answer import bounded

    result = compare(
        a,
        b,
        rtol=rtol,
        atol=atol,
        map=map,
        layout=layout,
        replay=replay,
        better=better,
        html=html,
        home=home,
        shards=shards,
    ).result
    answer = bounded(
        result,
        passing=passing,
        inputs=inputs,
        offset=offset,
        limit=limit,
        module=module,
        call=call,
        status=status,
        kind=kind,
    )
    if html:
        answer["html"] = html
    return answer


def _html_refused(html: str | os.PathLike[str], exc: OSError) -> CompareInputError:
    return CompareInputError(
        f"html {os.fspath(html)[:500]}: {exc.strerror or exc}", code=BAD_ARGUMENT
    )
