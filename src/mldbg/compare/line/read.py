"""A run's line records (``runs/<run>/lines/``, written by ``line_scope.py``), read back.

Each record is one value a line bound: where (file, line, function, the frame's serial
number in the scope), under which name, what it read (earlier records), and the value
itself: its first elements (``head``) and either all its elements (``exact``, at most
1021) or its sketches (its own, and in the port's run as read in each reference shape
of as many elements).  Records of the very object of an earlier one are aliases.
Everything is validated as read: a record of the wrong types is counted and left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import CORRUPT_CAPTURE, UNREADABLE
from ...store import reading
from ...store.runs import iter_jsonl
from ..read.sources import CompareInputError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

RECORDS = "records.jsonl"
NUMBERS = "numbers.f64"
SCOPE_JSON = "scope.json"
MAX_RECORDS = 200_000  # records read from one run


@dataclass(frozen=True)
class View:
    """One sketch of a value: as read in ``shape`` (``order`` None: its own layout)."""

    shape: tuple[int, ...]
    offset: int
    size: int
    order: tuple[int, ...] | None = None
    split: tuple[int, ...] | None = None
    head: list[float | int | str] | None = None


@dataclass
class LineRecord:
    """One value a line bound, as recorded."""

    seq: int
    file: str
    line: int
    function: str
    frame: int
    name: str
    kind: str
    text: str
    reads: list[int]
    alias: int | None
    hit: int
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    head: list[float | int | str] = field(default_factory=list)
    stats: dict[str, object] | None = None
    exact: View | None = None
    views: list[View] = field(default_factory=list)
    skipped: str | None = None
    error: str | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def numel(self) -> int | None:
        if self.shape is None:
            return None
        total = 1
        for n in self.shape:
            total *= n
        return total

    @property
    def kept(self) -> bool:
        """Its value can be compared (kept exactly, or sketched)."""
        return self.exact is not None or bool(self.views)


@dataclass
class LineRun:
    """One run's line records, and its ``scope.json``."""

    path: Path
    scope: dict[str, object]
    records: list[LineRecord]
    by_seq: dict[int, LineRecord]
    unreadable: int = 0
    _numbers: npt.NDArray[np.float64] | None = None

    def numbers(self, view: View) -> npt.NDArray[np.float64]:
        """The float64 numbers of one view (a memory map of the run's number file)."""
        import numpy as np

        if self._numbers is None:
            file = self.path / NUMBERS
            size = file.stat().st_size if file.is_file() else 0
            self._numbers = (
                np.memmap(file, dtype="<f8", mode="r") if size else np.zeros(0, dtype="<f8")
            )
        numbers = self._numbers
        if view.offset < 0 or view.offset + view.size > numbers.size:
            raise CompareInputError(
                f"{self.path / NUMBERS} is shorter than its records say (cut short?)",
                code=CORRUPT_CAPTURE,
            )
        return np.asarray(numbers[view.offset : view.offset + view.size], dtype=np.float64)

    def original(self, record: LineRecord) -> LineRecord:
        """The record holding the value an alias names (itself when it is no alias)."""
        seen = 0
        while record.alias is not None and record.alias in self.by_seq and seen < 64:
            record = self.by_seq[record.alias]
            seen += 1
        return record


def _ints(value: object) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(
        isinstance(n, int) and not isinstance(n, bool) for n in value
    ):
        return tuple(value)
    return None


def _view(data: object) -> View | None:
    if not isinstance(data, dict):
        return None
    offset, size = data.get("offset"), data.get("size")
    if not isinstance(offset, int) or not isinstance(size, int):
        return None
    shape = _ints(data.get("shape")) or ()
    head = data.get("head")
    return View(
        shape=shape,
        offset=offset,
        size=size,
        order=_ints(data.get("order")),
        split=_ints(data.get("split")),
        head=list(head) if isinstance(head, list) else None,
    )


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _optional_text(data: dict[str, object], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) else None


def _where(data: dict[str, object]) -> tuple[str, str, str, str, str, int, int, int, int] | None:
    """A record's required fields (where, what, which), or None when one is missing."""
    texts = [_optional_text(data, k) for k in ("file", "function", "name", "kind", "text")]
    numbers = [_whole(data.get(k)) for k in ("seq", "line", "frame", "hit")]
    file, function, name, kind, text = texts
    seq, line, frame, hit = numbers
    if file is None or function is None or name is None or kind is None or text is None:
        return None
    if seq is None or line is None or frame is None or hit is None:
        return None
    return file, function, name, kind, text, seq, line, frame, hit


def _views(
    data: dict[str, object], shape: tuple[int, ...] | None
) -> tuple[View | None, list[View]]:
    """A value's kept elements (``exact``) and its sketches."""
    exact = data.get("exact")
    sketches = data.get("sketches")
    whole = _view({**exact, "shape": list(shape or ())}) if isinstance(exact, dict) else None
    found = [_view(d) for d in (sketches if isinstance(sketches, list) else [])]
    return whole, [v for v in found if v is not None]


def _record(data: dict[str, object]) -> LineRecord | None:
    """A record line as a :class:`LineRecord`; None when it has the wrong types."""
    where = _where(data)
    reads = _ints(data.get("reads"))
    alias = data.get("alias")
    if where is None or reads is None or not (alias is None or _whole(alias) is not None):
        return None
    file, function, name, kind, text, seq, line, frame, hit = where
    shape = _ints(data.get("shape"))
    exact, views = _views(data, shape)
    head = data.get("head")
    stats = data.get("stats")
    return LineRecord(
        seq=seq,
        file=file,
        line=line,
        function=function,
        frame=frame,
        name=name,
        kind=kind,
        text=text,
        reads=list(reads),
        alias=_whole(alias),
        hit=hit,
        shape=shape,
        dtype=_optional_text(data, "dtype"),
        head=list(head) if isinstance(head, list) else [],
        stats=stats if isinstance(stats, dict) else None,
        exact=exact,
        views=views,
        skipped=_optional_text(data, "skipped"),
        error=_optional_text(data, "error"),
    )


def read_lines(path: Path) -> LineRun:
    """The line records in ``path`` (a run's ``lines`` directory)."""
    try:
        scope = reading.read_json(path / SCOPE_JSON) if (path / SCOPE_JSON).is_file() else {}
    except (OSError, ValueError):
        scope = {}
    records: list[LineRecord] = []
    bad = 0
    try:
        for data in iter_jsonl(path / RECORDS):
            if data is None:
                bad += 1
                continue
            record = _record(data)
            if record is None:
                bad += 1
                continue
            records.append(record)
            if len(records) >= MAX_RECORDS:
                break
    except OSError as exc:
        raise CompareInputError(
            f"cannot read {path / RECORDS}: {exc.strerror or exc}", code=UNREADABLE
        ) from None
    return LineRun(
        path=path,
        scope=scope if isinstance(scope, dict) else {},
        records=records,
        by_seq={r.seq: r for r in records},
        unreadable=bad,
    )
