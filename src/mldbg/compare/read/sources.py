"""What ``mldbg compare A B`` compares: a capture, a run, a directory or a file of tensors.

A spec is tried as a path first (a capture directory, a run directory holding one
capture, a directory of ``.safetensors`` / ``.npy`` / ``.npz`` files, or one such
file), then as ``RUN/NAME``, then as a capture name (the newest capture with that
name wins), then as a run id.  Every source lists its entries in the order they were
recorded, without reading any tensor data.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...capture.ops import OP_CLASS_PREFIX
from ...capture.safetensors_header import CorruptTensorFile, read_header
from ...capture.store import CAPTURE_JSON, CAPTURES, INDEX, module_label
from ...errors import (
    AMBIGUOUS_CAPTURE,
    AMBIGUOUS_RUN,
    CORRUPT_CAPTURE,
    CORRUPT_FILE,
    NO_CAPTURES,
    NO_TENSORS,
    NOT_TENSORS,
    TOO_LARGE,
    UNKNOWN_CAPTURE,
    UNKNOWN_SOURCE,
    UNREADABLE,
    CompareInputError,
    MldbgError,
)
from ...store import reading
from ...store.runs import JsonRecord, RunDir, numbered_jsonl, resolve_run, runs_root
from . import arrays

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

TENSOR_SUFFIXES = (".safetensors", ".npy", ".npz", ".pt")


@dataclass
class Entry:
    """One stored tensor, located but not read."""

    name: str
    shape: list[int]
    dtype: str
    file: Path
    key: str
    order: int
    module: str | None = None
    call: int | None = None
    role: str | None = None
    # A summary capture's tensor: its statistics; the file holds its sketch, not the tensor.
    stats: dict[str, Any] | None = None
    sketch: int | None = None  # the sketch's length (its file holds that many float64)

    @property
    def call_key(self) -> tuple[str, int] | None:
        return None if self.module is None or self.call is None else (self.module, self.call)


@dataclass
class Call:
    """One module call of a capture: where it sits in the run's order and nesting."""

    module: str
    call: int
    seq: int
    class_name: str = ""
    parent: int | None = None
    depth: int = 0
    end: int | None = None
    error: str | None = None
    start_order: int = 0  # position of its start / end in the capture's event order
    end_order: int | None = None
    quant: dict[str, Any] | None = None  # {"bits", "group_size", "mode"} of a quantized module
    # Relative output change of a call (its children included) under a one-rounding-step
    # perturbation of what it reads (measured at capture time, ``capture.sensitivity``); None when not measured.
    sensitivity: float | None = None
    # The relative step ``u`` its inputs were perturbed by for that measurement; the ratio
    # ``sensitivity / step`` is how much the call amplifies a relative error it reads.
    step: float | None = None
    # How many times a relative error in its inputs comes out larger (measured with its
    # inputs perturbed by ``step``; for a call with children ``sensitivity`` is measured
    # apart, with its inputs kept and its descendants' outputs rounded).
    amplification: float | None = None
    site: str | None = None  # "file:line" of the script line that made a top-level call

    @property
    def is_operation(self) -> bool:
        """A framework operation recorded inside a module with ``ops=``, not a module."""
        return self.class_name.startswith(OP_CLASS_PREFIX)


@dataclass
class Source:
    spec: str
    kind: str
    path: Path
    label: str
    entries: list[Entry] = field(default_factory=list)
    calls: dict[tuple[str, int], Call] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # tensors the capture recorded but did not write (its index's ``skipped``: over the
    # byte budget, past the per-call limit): how many, and the first with its reason
    not_written: int = 0
    first_not_written: str | None = None
    # what the capture recorded and lost, for compare's "never match on missing data":
    # each tensor not written (its name, why), each call whose tensors of one role
    # could not be written at all ((module, call, role), the error)
    lost: dict[str, str] = field(default_factory=dict)
    lost_calls: dict[tuple[str, int, str], str] = field(default_factory=dict)
    # named ``NAME.1``: the first model of a zero-edit run alone, not its whole pipeline
    one_model: bool = False

    def load(self, entry: Entry) -> npt.NDArray[np.generic]:
        """The entry's tensor as a read-only numpy array (memory-mapped where possible)."""
        suffix = entry.file.suffix
        if suffix == ".npy":
            return arrays.map_npy(entry.file)
        if suffix == ".npz":
            return arrays.map_npz(entry.file, entry.key)
        if suffix == ".pt":
            return arrays.map_pt(entry.file, entry.key)
        return arrays.map_safetensors(entry.file, entry.key, self._expected(entry))

    def verify(self, entry: Entry) -> None:
        """:class:`CorruptTensorFile` when the capture's file holds another shape or dtype
        than its index says: checked before "shapes differ" is reported as a divergence."""
        expected = self._expected(entry)
        if expected is not None and entry.file.suffix == ".safetensors":
            header = arrays.header_of(entry.file, entry.key)
            arrays.check_expected(entry.file, entry.key, header, expected)

    def _expected(self, entry: Entry) -> arrays.TensorHeader | None:
        """What a capture's index says ``entry``'s file holds (a summary's file holds its
        sketch instead: nothing to check against); None for plain files."""
        if self.kind != "capture":
            return None
        if entry.stats is not None:
            return None if entry.sketch is None else {"shape": [entry.sketch], "dtype": "F64"}
        return {"shape": entry.shape, "dtype": entry.dtype}

    def load_checked(self, entry: Entry) -> npt.NDArray[np.generic]:
        """``load``, a file that turns out corrupt or unreadable being bad input with
        compare's codes (``corrupt_file``, ``unreadable``)."""
        try:
            return self.load(entry)
        except CorruptTensorFile as exc:
            raise CompareInputError(str(exc), code=CORRUPT_FILE) from None
        except OSError as exc:
            raise CompareInputError(
                f"cannot read {exc.filename or entry.file}: {exc.strerror or exc}", code=UNREADABLE
            ) from None

    def describe(self) -> dict[str, str]:
        return {"spec": self.spec, "kind": self.kind, "path": str(self.path), "label": self.label}

    def is_operation(self, entry: Entry) -> bool:
        """Whether ``entry`` is a tensor of a framework operation recorded with ``ops=``
        (path ``<module>:op<N>.<op>``, class ``op:<op>``).  Operations are aligned by value
        inside their module call (``ops.py``), never by name: their names differ across
        frameworks (torch's ``mul``/``cat``/``add`` rotation is MLX's one ``fast.rope``)
        and their numbers shift with any extra operation."""
        key = entry.call_key
        if key is None or ":op" not in key[0]:
            return False
        call = self.calls.get(key)
        return call is not None and call.is_operation


# -- resolving a spec ------------------------------------------------------------------------


def open_source(spec: str, home: Path) -> Source:
    """The source ``spec`` names; unreadable files become bad input (exit 2), named."""
    try:
        return _open_source(spec, home)
    except CorruptTensorFile as exc:
        raise CompareInputError(str(exc), code=CORRUPT_FILE) from None
    except OSError as exc:
        raise CompareInputError(
            f"cannot read {exc.filename or spec}: {exc.strerror}", code=UNREADABLE
        ) from None


def _at_path(spec: str, home: Path) -> Source | None:
    """What ``spec`` names as a path (``DIR/NAME.1``: the first model's capture alone),
    or None when no such path exists."""
    path = Path(spec).expanduser()
    stem, _dot, number = spec.rpartition(".")
    if not path.exists() and number == "1" and (Path(stem).expanduser() / INDEX).is_file():
        source = open_capture(spec, Path(stem).expanduser())
        source.one_model = True
        return source
    if not path.exists():
        return None
    try:
        return _from_path(spec, path)
    except CompareInputError as exc:
        # A folder named like a capture (``ref/`` beside the script) must not hide it.
        found = [c for c in find_captures(home) if c["name"] == spec]
        if exc.code not in (NO_TENSORS, NOT_TENSORS) or not found:
            raise
        source = open_capture(spec, Path(found[-1]["path"]))
        source.warnings.append(
            f"{path} is not a tensor file or folder: compared the capture {spec!r} instead"
        )
        return source


def _open_source(spec: str, home: Path) -> Source:
    at_path = _at_path(spec, home)
    if at_path is not None:
        return at_path
    if "/" in spec and not spec.startswith((".", "/", "~")):
        run_spec, name = spec.rsplit("/", 1)
        try:
            run = resolve_run(home, run_spec)
        except MldbgError:
            run = None
        if run is not None:
            return _capture_in_run(spec, run, name)
    named = _named(spec, find_captures(home))
    if named is not None:
        return named
    try:
        run = resolve_run(home, spec)
    except MldbgError as exc:
        if exc.code == AMBIGUOUS_RUN:
            raise CompareInputError(exc.message) from None
        run = None
    if run is not None:
        return _capture_in_run(spec, run, None)
    names = _closest_first(spec, sorted({c["name"] for c in find_captures(home)}))
    more = len(names) - min(len(names), 20)
    known = (
        f"captures under {home}, closest first: {', '.join(names[:20])}"
        + (f" … and {more} more (mldbg captures)" if more else "")
        if names
        else f"no captures under {home}"
    )
    raise CompareInputError(
        f"{spec!r} is not a file, a directory, a capture name or a run id ({known})",
        code=UNKNOWN_SOURCE,
        captures=names[:50],
        captures_total=len(names),
    )


def _closest_first(spec: str, names: list[str]) -> list[str]:
    """``names`` with the ones most like ``spec`` first (``port.6`` brings ``port.5``,
    ``port.4``… ahead of an alphabetical run of other captures), the rest in order."""
    import difflib

    close = difflib.get_close_matches(spec, names, n=20, cutoff=0.5)
    return close + [n for n in names if n not in close]


def _from_path(spec: str, path: Path) -> Source:
    if not path.is_file() and not path.is_dir():  # a FIFO, /dev/zero, a socket: never read
        raise CompareInputError(
            f"{path} is not a regular file or a directory (a FIFO, a device or a socket): "
            "compare takes tensor files, directories of them, capture names and run ids",
            code=NOT_TENSORS,
        )
    if path.is_file():
        if path.name in (INDEX, CAPTURE_JSON):
            return open_capture(spec, path.parent)
        return _file_source(spec, path)
    if (path / INDEX).exists() or (path / CAPTURE_JSON).exists():
        return open_capture(spec, path)
    if (path / CAPTURES).is_dir():
        return _capture_in_run(spec, RunDir(path), None)
    return _directory_source(spec, path)


def _named(spec: str, captures: list[dict[str, object]]) -> Source | None:
    """The newest capture named ``spec``; or, for ``NAME.1`` where none is, the first
    model of a zero-edit run alone (``NAME``, not the pipeline of models its run
    captured after it); None when neither exists."""
    found = [c for c in captures if c["name"] == spec]
    if found:
        return open_capture(spec, Path(str(found[-1]["path"])))
    stem, _dot, number = spec.rpartition(".")
    found = [c for c in captures if c["name"] == stem] if number == "1" and stem else []
    if not found:
        return None
    source = open_capture(spec, Path(str(found[-1]["path"])))
    source.one_model = True
    return source


def _capture_in_run(spec: str, run: RunDir, name: str | None) -> Source:
    captures = find_captures_in(run.path)
    if name is not None:
        first = None if any(c["name"] == name for c in captures) else _named(name, captures)
        if first is not None:  # NAME.1: the first model alone
            first.spec = spec
            return first
        captures = [c for c in captures if c["name"] == name]
        if not captures:
            raise CompareInputError(
                f"run {run.run_id} has no capture named {name!r}"
                + _listing(find_captures_in(run.path)),
                code=UNKNOWN_CAPTURE,
            )
    if not captures:
        raise CompareInputError(
            f"run {run.run_id} has no captures: record one with `with mldbg.capture(model, NAME):`",
            code=NO_CAPTURES,
        )
    if len(captures) > 1 and name is None:
        raise CompareInputError(
            f"run {run.run_id} has several captures; name one as {run.run_id}/NAME"
            + _listing(captures),
            code=AMBIGUOUS_CAPTURE,
        )
    return open_capture(spec, Path(captures[-1]["path"]))


def _listing(captures: list[dict[str, Any]]) -> str:
    names = ", ".join(c["name"] for c in captures)
    return f" (captures: {names})" if names else ""


# -- captures --------------------------------------------------------------------------------


def find_captures_in(run_path: Path) -> list[dict[str, Any]]:
    """The captures of one run, oldest first."""
    root = run_path / CAPTURES
    if not root.is_dir():
        return []
    found = []
    for directory in root.iterdir():
        meta = _read_meta(directory)
        if meta is None:
            continue
        meta["path"] = str(directory)
        # A capture's name is its directory's, its run the run's (what CaptureDir writes
        # in capture.json too): a capture.json that says otherwise (copied, or claiming
        # "ref" with a later "created") must not answer to another capture's name.
        meta["name"] = directory.name
        meta["run_id"] = run_path.name
        found.append(meta)
    return sorted(found, key=_age)


def _age(meta: dict[str, Any]) -> tuple[float, str]:
    """The order captures are listed in: by ``created`` (a damaged capture.json's
    ``created`` of another type sorts first instead of breaking every listing), then path."""
    created = meta.get("created")
    number = created if isinstance(created, int | float) and not isinstance(created, bool) else 0
    return (float(number) if math.isfinite(number) else 0.0, str(meta["path"]))


def find_captures(home: Path) -> list[dict[str, Any]]:
    """Every capture under ``home``, oldest first (so the last of a name is the newest)."""
    root = runs_root(home)
    if not root.is_dir():
        return []
    found: list[dict[str, Any]] = []
    for run_path in root.iterdir():
        if run_path.is_dir() and not run_path.name.startswith("."):
            found.extend(find_captures_in(run_path))
    return sorted(found, key=_age)


def _read_meta(directory: Path) -> dict[str, Any] | None:
    if not directory.is_dir() or directory.name.startswith("."):
        return None
    try:
        meta = reading.read_json(directory / CAPTURE_JSON)
        return meta if isinstance(meta, dict) else {"state": "unreadable capture.json"}
    except FileNotFoundError:
        return {} if (directory / INDEX).exists() else None
    except (OSError, ValueError):  # a FIFO, /dev/zero, not JSON: listed, never read whole
        return {"state": "unreadable capture.json"}


def open_capture(spec: str, directory: Path) -> Source:
    meta = _read_meta(directory) or {}
    index = directory / INDEX
    if not index.exists():
        raise CompareInputError(f"{directory} is not a capture: it has no {INDEX}")
    records, bad = _numbered_records(index)
    name = meta.get("name") or directory.name
    run_id = meta.get("run_id") or directory.parent.parent.name
    source = Source(spec, "capture", directory, f"{name} (run {run_id})", meta=meta)
    if bad and not records:
        raise CompareInputError(
            f"{index} is corrupt: none of its {bad} line(s) is a record (JSON objects, one "
            "per line, each at most 32 MiB)",
            code=CORRUPT_CAPTURE,
        )
    if bad:
        source.warnings.append(f"{index}: {bad} unreadable line(s) skipped (a run cut short?)")
    if meta.get("state") == "unreadable capture.json":
        source.warnings.append(
            f"{directory / CAPTURE_JSON} is unreadable (not a JSON object, or not a regular "
            "file of at most 64 MiB): comparing the index without the capture's settings"
        )
    if meta.get("state") == "capturing":
        source.warnings.append(
            f"capture {name!r} never finished (its process ended inside the capture): "
            "comparing what it wrote"
        )
    tree = _CallTree()
    for position, (line, record) in enumerate(records):
        _count_skipped(source, record)
        try:
            _add_record(source, directory, record, tree, position, line)
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
            raise CompareInputError(
                f"{index}, line {line}: a corrupt record ({str(exc)[:300]}): "
                f"{json.dumps(record)[:200]}",
                code=CORRUPT_CAPTURE,
                file=str(index),
                line=line,
            ) from None
    if source.not_written:
        source.warnings.append(
            f"capture {name!r}: {source.not_written} tensor(s) recorded but not written "
            f"(first {source.first_not_written})"
        )
    return source


def _numbered_records(index: Path) -> tuple[list[tuple[int, JsonRecord]], int]:
    """The index's records with their line numbers, and how many lines were unreadable."""
    records: list[tuple[int, JsonRecord]] = []
    bad = 0
    for line, record in numbered_jsonl(index):
        if record is None:
            bad += 1
        else:
            records.append((line, record))
    return records, bad


def _count_skipped(source: Source, record: JsonRecord) -> None:
    """Tensors the capture recorded but did not write (over its byte budget...)."""
    skipped = record.get("skipped")
    if isinstance(skipped, dict) and skipped:
        source.not_written += len(skipped)
        if source.first_not_written is None:
            entry, why = next(iter(skipped.items()))
            source.first_not_written = f"{str(entry)[:200]}: {str(why)[:200]}"
        for entry, why in skipped.items():
            source.lost[str(entry)[:_TEXT_CHARS]] = str(why)[:200]


@dataclass
class _CallTree:
    """The calls read so far, by ``seq``, and the line of each call and return.

    What keeps every later walk of the tree finite and sound: a call's ``parent`` is a
    call on an earlier line that has not returned yet (so following parents always goes
    up the file and ends), its ``depth`` one more than its parent's (the readers that sum
    subtrees go deepest first), each ``seq`` and each module call is read once, and each
    call returns once.  The writer keeps all of this (a call's line is written while its
    parent is on the stack of the same thread)."""

    by_seq: dict[int, Call] = field(default_factory=dict)
    call_lines: dict[int, int] = field(default_factory=dict)
    module_lines: dict[tuple[str, int], int] = field(default_factory=dict)
    return_lines: dict[int, int] = field(default_factory=dict)

    def add_call(self, call: Call, line: int) -> None:
        if call.seq in self.call_lines:
            raise ValueError(
                f"seq {call.seq} is already the call on line {self.call_lines[call.seq]}"
            )
        if call.parent is not None and call.parent not in self.call_lines:
            raise ValueError(
                f"parent {call.parent} is no call on an earlier line (a dangling parent, "
                "or parents that form a cycle)"
            )
        if call.parent is not None and call.parent in self.return_lines:
            raise ValueError(
                f"parent {call.parent} returned on line {self.return_lines[call.parent]}, "
                "before this call started"
            )
        depth = 0 if call.parent is None else self.by_seq[call.parent].depth + 1
        if call.depth != depth:
            raise ValueError(f"depth {call.depth}, not its parent's depth + 1 ({depth})")
        key = (call.module, call.call)
        if key in self.module_lines:
            raise ValueError(
                f"call {call.call} of module {call.module[:200]!r} is already on line "
                f"{self.module_lines[key]}"
            )
        self.by_seq[call.seq] = call
        self.call_lines[call.seq] = line
        self.module_lines[key] = line

    def add_return(self, seq: int, line: int) -> Call | None:
        """The call that returns on ``line`` (None for a call the index never opened)."""
        known = self.by_seq.get(seq)
        if known is None:
            return None
        if seq in self.return_lines:
            raise ValueError(f"call {seq} already returned on line {self.return_lines[seq]}")
        self.return_lines[seq] = line
        return known


_SITE_CHARS = 1000  # a call site is a path and a line number; a longer one is cut
_TEXT_CHARS = 4096  # an entry name, module path or class name (verbs.TEXT_LIMIT); longer: corrupt
_ERROR_CHARS = 2000  # a call's error message as the index keeps it; a longer one is cut


def _text(value: object, what: str) -> str:
    text = str(value)
    if len(text) > _TEXT_CHARS:
        raise ValueError(f"a {what} of {len(text)} characters (at most {_TEXT_CHARS})")
    return text


def _count(value: object, what: str) -> int:
    """A whole number of the index (a sequence number, a size): an int, 0 or more."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} {str(value)[:40]!r} is not a whole number")
    return value


def _add_record(
    source: Source,
    directory: Path,
    record: JsonRecord,
    tree: _CallTree,
    position: int,
    line: int,
) -> None:
    seq = _count(record["seq"], "seq")
    if record.get("event") == "call":
        call = _call(record, seq, position)
        tree.add_call(call, line)
        source.calls[(call.module, call.call)] = call
        role = "in"
    else:
        known = tree.add_return(seq, line)
        if known is None:
            return
        _returned(known, record, position)
        call = known
        role = "out"
    if record.get("write_error"):  # a full disk: none of the call's tensors of this role
        source.lost_calls[(call.module, call.call, role)] = str(record["write_error"])[:200]
    _add_tensors(source, directory, record, call, role)


def _call(record: JsonRecord, seq: int, position: int) -> Call:
    """A call line as a :class:`Call`, its fields checked."""
    parent = record.get("parent")
    return Call(
        module=module_label(_text(record["module"], "module path")),
        call=_count(record["call"], "call"),
        seq=seq,
        class_name=_text(record.get("class", ""), "class name"),
        parent=None if parent is None else _count(parent, "parent"),
        depth=_count(record.get("depth", 0), "depth"),
        start_order=position,
        quant=record.get("quant") if isinstance(record.get("quant"), dict) else None,
        site=str(record["site"])[:_SITE_CHARS] if record.get("site") else None,
    )


def _returned(known: Call, record: JsonRecord, position: int) -> None:
    """What a return line adds to its call: its end, error and measured sensitivity."""
    known.end = _count(record.get("end", 0), "end")
    error = record.get("error")
    known.error = None if error is None else str(error)[:_ERROR_CHARS]
    known.end_order = position
    sensitivity = record.get("sensitivity")
    if isinstance(sensitivity, int | float) and math.isfinite(sensitivity):
        known.sensitivity = float(sensitivity)
        step = record.get("step")
        if isinstance(step, int | float) and math.isfinite(step) and step > 0:
            known.step = float(step)
        gain = record.get("amplification")
        if isinstance(gain, int | float) and math.isfinite(gain):
            known.amplification = float(gain)


def _add_tensors(
    source: Source, directory: Path, record: JsonRecord, call: Call, role: str
) -> None:
    file = record.get("file")
    tensors = record.get("tensors") or {}
    if tensors and not _plain_file_name(file):
        raise ValueError(f"file {str(file)[:200]!r} is not a file of the capture's own directory")
    for name, info in tensors.items():
        if not isinstance(info["shape"], list):
            raise ValueError(f"the shape of {name[:200]!r} is not a list")
        stats = _stats(info.get("stats"))
        if stats is not None and "numel" in stats and stats["numel"] != math.prod(info["shape"]):
            raise ValueError(f"the statistics of {name[:200]!r} count another number of elements")
        source.entries.append(
            Entry(
                name=_text(name, "tensor name"),
                shape=[_count(n, "a size") for n in info["shape"]],
                dtype=str(info["dtype"]),
                file=directory / str(file),
                key=str(info["key"]),
                order=len(source.entries),
                module=call.module,
                call=call.call,
                role=role,
                stats=stats,
                sketch=None if info.get("sketch") is None else _count(info["sketch"], "sketch"),
            )
        )


_STAT_COUNTS = ("numel", "nan", "inf")
_STAT_VALUES = ("min", "max", "mean", "rms", "norm")


def _stats(stats: object) -> dict[str, Any] | None:
    """A summary's statistics (``capture/sketch.py``), checked: counts are whole numbers,
    the rest finite numbers (or null), ``rms`` and ``norm`` not negative.  A wrong one
    made compare report nonsense as agreement, or print a non-JSON ``inf`` and crash."""
    if stats is None:
        return None
    if not isinstance(stats, dict):
        raise ValueError("stats is not an object")
    if "numel" not in stats:  # every summary counts its elements: without, no number holds
        raise ValueError("stats without numel (how many elements they summarise)")
    for key in _STAT_COUNTS:
        if key in stats:
            _count(stats[key], f"stats.{key}")
    for key in _STAT_VALUES:
        value = stats.get(key)
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"stats.{key} {str(value)[:40]!r} is not a number")
        if not math.isfinite(value) or (key in ("rms", "norm") and value < 0):
            raise ValueError(f"stats.{key} is {value}")
    return stats


def _plain_file_name(file: object) -> bool:
    """Whether an index line's ``file`` names a file beside it, as the writer does
    (``000012.out.safetensors``): a path (``../../x``, ``/dev/zero``) would make compare
    read what the capture does not hold."""
    return (
        isinstance(file, str)
        and 0 < len(file) <= 255
        and "/" not in file
        and "\\" not in file
        and "\0" not in file
        and file not in (".", "..")
    )


# -- plain tensors ---------------------------------------------------------------------------


def _natural(text: str) -> list[int | str]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


# A directory of tensors is walked whole; one with more entries than this is not a
# directory of tensors but a home or a disk named by mistake (``compare ~ ~``): refused.
MAX_DIRECTORY_ENTRIES = 1_000_000


def _directory_source(spec: str, directory: Path) -> Source:
    found: list[Path] = []
    seen = 0
    for root, dirs, names in os.walk(directory):  # symlinked directories not followed
        seen += len(dirs) + len(names)
        if seen > MAX_DIRECTORY_ENTRIES:
            raise CompareInputError(
                f"{directory} holds more than {MAX_DIRECTORY_ENTRIES} files and folders: "
                "name the directory of the tensors themselves",
                code=TOO_LARGE,
            )
        dirs.sort()
        for name in names:
            path = Path(root) / name
            if path.suffix in TENSOR_SUFFIXES and not name.startswith(".") and path.is_file():
                found.append(path)
    files = sorted(found, key=lambda p: _natural(str(p.relative_to(directory))))
    if not files:
        raise CompareInputError(
            f"{directory} holds no .safetensors, .npy, .npz or .pt files "
            "(and is not a capture or a run)",
            code=NO_TENSORS,
        )
    source = Source(spec, "directory", directory, str(directory))
    for file in files:
        stem = str(file.relative_to(directory).with_suffix("")).replace("\\", "/")
        _add_file(source, file, stem)
    _check_unique(source)
    return source


def _file_source(spec: str, path: Path) -> Source:
    if path.suffix not in TENSOR_SUFFIXES:
        raise CompareInputError(
            f"{path} is not a tensor file: compare takes .safetensors, .npy, .npz or .pt files, "
            "directories of them, capture names and run ids",
            code=NOT_TENSORS,
        )
    source = Source(spec, "file", path, str(path))
    _add_file(source, path, path.stem)
    return source


def _add_file(source: Source, file: Path, stem: str) -> None:
    if file.suffix == ".npy":
        info = arrays.npy_header(file)
        _append(source, stem, info, file, "")
        return
    if file.suffix == ".pt":
        headers = arrays.pt_headers(file)
        for key, info in headers.items():
            if len(headers) == 1 or not key:
                name = stem
            else:
                name = key if source.kind == "file" else f"{stem}.{key}"
            _append(source, name, info, file, key)
        return
    if file.suffix == ".npz":
        for key, info in arrays.npz_headers(file).items():
            _append(source, key if source.kind == "file" else f"{stem}.{key}", info, file, key)
        return
    header, _ = read_header(file)
    keys = [k for k in header if k != "__metadata__"]
    for key in keys:
        entry = header[key]
        stored: arrays.TensorHeader = {
            "shape": [int(n) for n in entry.get("shape", [])],
            "dtype": str(entry.get("dtype", "?")),
        }
        # A one-tensor file (the tensor store's kind) is named by its file; several, by key.
        name = stem if len(keys) == 1 else (key if source.kind == "file" else f"{stem}.{key}")
        _append(source, name, stored, file, key)


def _append(source: Source, name: str, info: arrays.TensorHeader, file: Path, key: str) -> None:
    source.entries.append(
        Entry(
            name=name,
            shape=[int(n) for n in info["shape"]],
            dtype=str(info["dtype"]),
            file=file,
            key=key,
            order=len(source.entries),
        )
    )


def _check_unique(source: Source) -> None:
    seen: set[str] = set()
    for entry in source.entries:
        if entry.name in seen:
            raise CompareInputError(f"{source.path}: two tensors are named {entry.name!r}")
        seen.add(entry.name)
