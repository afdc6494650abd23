"""Breakpoint records and the table the tracers consult.

A breakpoint is validated when it is set (the file exists, compiles, and the line holds
code), so that a mistake is reported at once instead of silently never stopping.
"""

from __future__ import annotations

import bisect
import fnmatch
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Protocol, TypedDict

from ..errors import (
    BAD_ARGUMENT,
    BAD_HITS,
    BAD_LOG,
    FILE_NOT_FOUND,
    NO_CODE_AT_LINE,
    NO_SUCH_BREAKPOINT,
    NOT_A_SOURCE_FILE,
    BreakpointError,
)
from .compiling import compile_text
from .exception_breaks import ExceptionBreak, ExceptionBreaks
from .paths import canonical, canonical_code_file

if TYPE_CHECKING:
    from .. import results as R
    from .logtemplate import Part

MAX_SOURCE_BYTES = 16 * 1024 * 1024  # larger "source files" are generated data, not code
_SOURCE_SUFFIXES = (".py", ".pyw", ".pyi")


_HITS = re.compile(r"^\s*(>=|%|==)?\s*(\d+)\s*$")


def parse_hits(spec: str | int | None) -> tuple[str, int] | None:
    """``N`` / ``==N`` stop on the Nth hit only, ``>=N`` on every hit from the Nth, ``%N`` every Nth."""
    if spec is None or spec == "":
        return None
    match = _HITS.match(str(spec))
    if not match or int(match.group(2)) < 1:
        raise BreakpointError(
            f"bad hit count {spec!r}: use N (the Nth hit), >=N (from the Nth on) or %N (every Nth)",
            code=BAD_HITS,
        )
    return (match.group(1) or "==", int(match.group(2)))


def compile_expression(text: str, what: str, code: str = "bad_condition") -> CodeType:
    try:
        return compile_text(text, f"<{what}>", "eval")
    except (SyntaxError, ValueError) as exc:
        message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise BreakpointError(
            f"{what} {text!r} is not a valid Python expression: {message}", code=code
        ) from None


def compile_log_template(template: str) -> list[Part]:
    """Parse a logpoint message as the body of an f-string (see :mod:`.logtemplate`)."""
    from .logtemplate import TemplateError, compile_template

    try:
        return compile_template(template)
    except TemplateError as exc:
        raise BreakpointError(
            f"log message {template!r} is not a valid f-string body: {exc} "
            "(write {{ and }} for literal braces)",
            code=BAD_LOG,
        ) from None


def _code_lines(code: CodeType) -> set[int]:
    return {line for _, _, line in code.co_lines() if line is not None}


def _walk_codes(code: CodeType) -> list[CodeType]:
    codes = [code]
    for const in code.co_consts:
        if isinstance(const, CodeType):
            codes.extend(_walk_codes(const))
    return codes


_EXECUTABLE_CACHE: dict[str, tuple[float, int, list[int]]] = {}
_EXECUTABLE_LOCK = threading.Lock()


def executable_lines(path: str) -> list[int]:
    """Sorted line numbers that hold code in ``path``, by compiling it as this Python would."""
    stat = check_source_file(path)
    key = (stat.st_mtime, stat.st_size)
    with _EXECUTABLE_LOCK:
        cached = _EXECUTABLE_CACHE.get(path)
        if cached and cached[:2] == key:
            return cached[2]
    try:
        with open(path, "rb") as fh:
            source = fh.read()
        module = compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise BreakpointError(
            f"cannot set a breakpoint in {path}: it does not compile ({exc.msg}, line {exc.lineno})",
            code=NOT_A_SOURCE_FILE,
            file=path,
        ) from None
    except (OSError, ValueError) as exc:
        raise BreakpointError(
            f"cannot read {path}: {exc}", code=NOT_A_SOURCE_FILE, file=path
        ) from None
    lines: set[int] = set()
    for code in _walk_codes(module):
        lines |= _code_lines(code)
    # Line 0 marks compiler-made code (e.g. the module's RESUME) and can never be a breakpoint.
    result = sorted(line for line in lines if line > 0)
    with _EXECUTABLE_LOCK:
        _EXECUTABLE_CACHE[path] = (key[0], key[1], result)
    return result


def check_source_file(path: str) -> os.stat_result:
    """A breakpoint file must be a regular Python source file of sane size.

    Checked before anything reads it: ``/dev/zero`` would be read forever and a named
    pipe would block the session.  A file without a ``.py`` suffix needs a python shebang
    (an executable script), so ``/etc/hostname`` is refused rather than "compiled".
    """
    import stat as stat_module

    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise BreakpointError(f"no such file: {path}", code=FILE_NOT_FOUND, file=path) from None
    except OSError as exc:
        raise BreakpointError(
            f"cannot set a breakpoint in {path}: {exc.strerror}", code=FILE_NOT_FOUND, file=path
        ) from None
    if stat_module.S_ISDIR(info.st_mode):
        raise BreakpointError(
            f"{path} is a directory, not a Python file", code=NOT_A_SOURCE_FILE, file=path
        )
    if not stat_module.S_ISREG(info.st_mode):
        raise BreakpointError(
            f"{path} is not a regular file (a device, pipe or socket): breakpoints go in "
            "Python source files",
            code=NOT_A_SOURCE_FILE,
            file=path,
        )
    if info.st_size > MAX_SOURCE_BYTES:
        raise BreakpointError(
            f"{path} is {info.st_size} bytes: too large for a Python source file",
            code=NOT_A_SOURCE_FILE,
            file=path,
        )
    if not path.endswith(_SOURCE_SUFFIXES):
        try:
            with open(path, "rb") as fh:
                first = fh.readline(256)
        except OSError as exc:
            raise BreakpointError(
                f"cannot read {path}: {exc.strerror}", code=NOT_A_SOURCE_FILE, file=path
            ) from None
        if not (first.startswith(b"#!") and b"python" in first):
            raise BreakpointError(
                f"{path} is not a Python source file (no .py suffix, no python #! line)",
                code=NOT_A_SOURCE_FILE,
                file=path,
            )
    return info


def nearest_lines(lines: list[int], line: int) -> list[int]:
    """The closest executable line before and after ``line``."""
    at = bisect.bisect_left(lines, line)
    near = []
    if at > 0:
        near.append(lines[at - 1])
    if at < len(lines):
        near.append(lines[at])
    return near


class _Ids:
    """This process's breakpoint ids: the next free one, or one the daemon gives.

    A breakpoint keeps its id in every process of a run (the daemon copies the root's
    breakpoints into child processes and restarts with their ids), so ``remove #3`` on the
    root reaches the same breakpoint in each child; an id given is claimed, and the ones
    handed out later come after it.
    """

    def __init__(self) -> None:
        self._next = 1
        self._lock = threading.Lock()

    def __iter__(self) -> _Ids:
        return self

    def __next__(self) -> int:
        with self._lock:
            number = self._next
            self._next += 1
            return number

    def claim(self, wanted: int) -> int:
        wanted = int(wanted)
        if wanted < 1:
            raise BreakpointError(f"breakpoint ids start at 1, not {wanted}", code=BAD_ARGUMENT)
        with self._lock:
            self._next = max(self._next, wanted + 1)
        return wanted


_ids = _Ids()


@dataclass
class Breakpoint:
    file: str
    line: int
    condition: str | None = None
    hits: str | None = None
    log: str | None = None
    id: int = field(default_factory=lambda: next(_ids))
    hit_count: int = 0
    condition_code: CodeType | None = field(default=None, repr=False)
    hits_rule: tuple[str, int] | None = field(default=None, repr=False)
    log_parts: list[Part] | None = field(default=None, repr=False)
    temporary: bool = False  # `until`: removed at the next stop, whatever stopped
    function: str | None = None  # set by `break --function NAME`: the name it came from
    this_thread: bool = False  # stop only the thread that hit it, not every thread

    def to_json(self) -> R.BreakpointInfo:
        info: R.BreakpointInfo = {
            "id": self.id,
            "file": self.file,
            "line": self.line,
            "condition": self.condition,
            "hits": self.hits,
            "log": self.log,
            "hit_count": self.hit_count,
        }
        if self.temporary:
            info["temporary"] = True
        if self.function:
            info["function"] = self.function
        if self.this_thread:
            info["this_thread"] = True
        return info

    def hit_matches(self) -> bool:
        """Counts a hit (the condition already passed) and says whether this one stops."""
        self.hit_count += 1
        if self.hits_rule is None:
            return True
        op, n = self.hits_rule
        if op == ">=":
            return self.hit_count >= n
        if op == "%":
            return self.hit_count % n == 0
        return self.hit_count == n


def make_breakpoint(
    file: str,
    line: int | None,
    condition: str | None = None,
    hits: str | int | None = None,
    log: str | None = None,
    cwd: str | None = None,
) -> Breakpoint:
    """Validate and build a breakpoint; raises :class:`BreakpointError` with a way forward."""
    if not file:
        raise BreakpointError("a breakpoint needs a file (FILE:LINE)", code=BAD_ARGUMENT)
    path = canonical(file, cwd)
    if not os.path.lexists(path):
        from .locate import find_importable

        path = find_importable(file, cwd, path)
    if line is None or line == "" or line == 0:
        raise BreakpointError(
            f"a breakpoint in {file} needs a line number (FILE:LINE)", code=BAD_ARGUMENT
        )
    try:
        line = int(line)
    except (TypeError, ValueError):
        raise BreakpointError(f"line must be a number, not {line!r}", code=BAD_ARGUMENT) from None
    if line < 1:
        raise BreakpointError(f"line numbers start at 1, not {line}", code=BAD_ARGUMENT)
    lines = executable_lines(path)
    if line not in lines:
        near = nearest_lines(lines, line)
        hint = (
            f"; nearest executable lines: {', '.join(map(str, near))}"
            if near
            else "; the file has no code"
        )
        raise BreakpointError(
            f"{path}:{line} holds no code (blank, comment or part of a multi-line statement){hint}",
            code=NO_CODE_AT_LINE,
            file=path,
            line=line,
            nearest_lines=near,
        )
    condition = condition or None
    return Breakpoint(
        file=path,
        line=line,
        condition=condition,
        hits=str(hits) if hits not in (None, "") else None,
        log=log or None,
        condition_code=compile_expression(condition, "condition") if condition else None,
        hits_rule=parse_hits(hits),
        log_parts=compile_log_template(log) if log else None,
    )


@dataclass
class CheckpointFilter:
    """``mldbg break --checkpoint NAME [--if EXPR]``: which ``debug_checkpoint`` calls pause.

    NAME may be a glob (``layer.*``); EXPR runs in the caller's frame, with ``hit_count``.
    """

    name: str
    condition: str | None = None
    id: int = field(default_factory=lambda: next(_ids))
    hit_count: int = 0
    condition_code: CodeType | None = field(default=None, repr=False)

    def to_json(self) -> R.BreakpointInfo:
        return {
            "id": self.id,
            "checkpoint": self.name,
            "condition": self.condition,
            "hit_count": self.hit_count,
        }

    def matches(self, name: str, frame: FrameType, hit: int) -> bool:
        """Raises what the condition raises: the caller reports it."""
        if not fnmatch.fnmatchcase(name, self.name):
            return False
        if self.condition_code is not None:
            scope = dict(frame.f_locals)
            scope.setdefault("hit_count", hit)
            if not eval(self.condition_code, frame.f_globals, scope):
                return False
        self.hit_count += 1
        return True


def make_checkpoint_filter(name: str, condition: str | None = None) -> CheckpointFilter:
    if not name:
        raise BreakpointError(
            "a checkpoint filter needs the checkpoint's name (a glob such as 'layer.*' works)",
            code=BAD_ARGUMENT,
        )
    condition = condition or None
    return CheckpointFilter(
        name=name,
        condition=condition,
        condition_code=compile_expression(condition, "condition") if condition else None,
    )


# -- the kinds that are not a line: a function not imported yet, the tripwire ----------------


class LineSpec(TypedDict, total=False):
    """What a function breakpoint hands on to the line breakpoint it becomes."""

    condition: str | None
    hits: str | None
    log: str | None


@dataclass
class PendingFunction:
    """A function breakpoint whose module is not there yet; set when it is."""

    name: str
    id: int
    spec: LineSpec  # what the breakpoint will carry
    hit_count: int = 0
    this_thread: bool = False  # stop only the thread that hits it, once set

    def to_json(self) -> R.BreakpointInfo:
        info: R.BreakpointInfo = {
            "id": self.id,
            "function": self.name,
            "pending": True,
            "condition": self.spec.get("condition"),
            "hits": self.spec.get("hits"),
            "log": self.spec.get("log"),
            "hit_count": 0,
        }
        if self.this_thread:
            info["this_thread"] = True
        return info


@dataclass
class Tripwire:
    """One ``break --nonfinite`` setting, listed by ``breaks`` like any breakpoint."""

    nonfinite: bool = True
    max_abs: float | None = None
    subnormal: bool = False
    id: int = 0
    hit_count: int = 0

    def to_json(self) -> R.BreakpointInfo:
        return {
            "id": self.id,
            "nonfinite": self.nonfinite,
            "max_abs": self.max_abs,
            "subnormal": self.subnormal,
            "hit_count": self.hit_count,
        }

    def describe(self) -> str:
        parts = ["NaN/Inf"] if self.nonfinite else []
        if self.max_abs is not None:
            parts.append(f"|x| > {self.max_abs:g}")
        if self.subnormal:
            parts.append("subnormal values")
        return " or ".join([*parts, "MLX indices out of range"])


class AnyBreakpoint(Protocol):
    """What every kind of breakpoint has (line, checkpoint filter, exception, pending
    function, tripwire): an id, a hit count and its listing, as ``breaks`` shows it."""

    id: int
    hit_count: int

    def to_json(self) -> R.BreakpointInfo: ...


_NO_LINES: frozenset[int] = frozenset()


class BreakpointTable:
    """Breakpoints by canonical file and line, plus per-code-object answers for the tracers.

    ``version`` changes on every edit so tracers can drop cached decisions cheaply.
    """

    def __init__(self) -> None:

        self.by_file: dict[str, dict[int, Breakpoint]] = {}
        self.checkpoints: dict[str, CheckpointFilter] = {}
        self.exceptions = ExceptionBreaks()
        # function breakpoints whose module is not there yet
        self.pending: dict[int, PendingFunction] = {}
        self.tripwires: dict[int, Tripwire] = {}  # break --nonfinite, one at most
        self.version = 0
        self.lock = threading.RLock()
        self._code_cache: dict[CodeType, frozenset[int]] = {}

    def add(self, bp: Breakpoint) -> Breakpoint:
        with self.lock:
            self.by_file.setdefault(bp.file, {})[bp.line] = bp
            self._changed()
            return bp

    def add_checkpoint(self, flt: CheckpointFilter) -> CheckpointFilter:
        with self.lock:
            self.checkpoints[flt.name] = flt
            return flt

    def remove_checkpoint(self, name: str) -> CheckpointFilter:
        with self.lock:
            if name not in self.checkpoints:
                known = ", ".join(self.checkpoints) or "none"
                raise BreakpointError(
                    f"no checkpoint filter {name!r}; set filters: {known}",
                    code=NO_SUCH_BREAKPOINT,
                )
            return self.checkpoints.pop(name)

    def remove(self, file: str, line: int, cwd: str | None = None) -> Breakpoint:
        path = canonical(file, cwd)
        with self.lock:
            lines = self.by_file.get(path, {})
            if line not in lines:
                known = ", ".join(f"{b.file}:{b.line}" for b in self.all()) or "none"
                raise BreakpointError(
                    f"no breakpoint at {path}:{line}; set breakpoints: {known[:1000]}",
                    code=NO_SUCH_BREAKPOINT,
                )
            bp = lines.pop(line)
            if not lines:
                del self.by_file[path]
            self._changed()
            return bp

    def clear(self) -> int:
        with self.lock:
            count = sum(len(lines) for lines in self.by_file.values()) + len(self.checkpoints)
            count += len(self.exceptions.items) + len(self.pending) + len(self.tripwires)
            self.tripwires.clear()
            self.by_file.clear()
            self.checkpoints.clear()
            self.exceptions.items.clear()
            self.pending.clear()
            self._changed()
            return count

    def add_exception(self, item: ExceptionBreak, keep_id: bool = False) -> ExceptionBreak:
        """An exception breakpoint: one per mode (``keep_id``: the id it was given)."""
        with self.lock:
            added = self.exceptions.add(item, _ids, keep_id)
            self._changed()
            return added

    def next_id(self) -> int:
        return next(_ids)

    def claim_id(self, wanted: int) -> int:
        """``wanted`` as a breakpoint's id (the daemon's copy of a breakpoint keeps the
        id it has in the script's own process)."""
        return _ids.claim(wanted)

    def everything(self) -> list[AnyBreakpoint]:
        """Every kind of breakpoint, each with ``id`` and ``to_json``."""
        with self.lock:
            return [
                *self.all(),
                *self.checkpoints.values(),
                *self.exceptions.items.values(),
                *self.pending.values(),
                *self.tripwires.values(),
            ]

    def find(self, bp_id: int) -> AnyBreakpoint:
        for item in self.everything():
            if item.id == bp_id:
                return item
        known = ", ".join(f"#{i.id}" for i in self.everything()[:50]) or "none"
        raise BreakpointError(
            f"no breakpoint #{bp_id}; set breakpoints: {known}", code=NO_SUCH_BREAKPOINT
        )

    def remove_id(self, bp_id: int) -> AnyBreakpoint:
        """Remove any kind of breakpoint by its id."""
        item = self.find(bp_id)
        with self.lock:
            if isinstance(item, Breakpoint):
                return self.remove(item.file, item.line)
            if isinstance(item, CheckpointFilter):
                return self.checkpoints.pop(item.name)
            if bp_id in self.exceptions.items:
                item = self.exceptions.items.pop(bp_id)
            elif bp_id in self.tripwires:
                item = self.tripwires.pop(bp_id)
            else:
                item = self.pending.pop(bp_id)
            self._changed()
            return item

    def remove_temporary(self) -> list[Breakpoint]:
        """``until``'s one-shot breakpoints, gone at the next stop whatever stopped."""
        with self.lock:
            gone = [bp for bp in self.all() if bp.temporary]
            for bp in gone:
                self.remove(bp.file, bp.line)
            return gone

    def all(self) -> list[Breakpoint]:
        with self.lock:
            return [bp for lines in self.by_file.values() for bp in lines.values()]

    def __bool__(self) -> bool:
        return bool(self.by_file)

    def _changed(self) -> None:
        self.version += 1
        self._code_cache.clear()
        self.exceptions.changed()

    def lines_in_code(self, code: CodeType, file: str) -> frozenset[int]:
        """Breakpoint lines that belong to this very code object (not to nested ones)."""
        file_bps = self.by_file.get(file)
        if not file_bps:
            # Not cached: code made in a loop (eval, namedtuple, torch.fx) would grow it forever.
            return _NO_LINES
        cached = self._code_cache.get(code)
        if cached is None:
            cached = self._code_cache[code] = frozenset(file_bps.keys() & _code_lines(code))
        return cached

    def running_frames(self) -> list[FrameType]:
        """Frames already executing code that holds a breakpoint (they see no new 'call')."""
        return [
            frame
            for frame in running_frames()
            if self.lines_in_code(frame.f_code, canonical_code_file(frame.f_code.co_filename))
        ]

    def at(self, file: str, line: int) -> Breakpoint | None:
        file_bps = self.by_file.get(file)
        return file_bps.get(line) if file_bps else None


def running_frames() -> list[FrameType]:
    """Every frame of every thread, innermost to outermost per thread."""
    frames = []
    for top in sys._current_frames().values():
        frame: FrameType | None = top
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
    return frames


def format_log(bp: Breakpoint, frame: FrameType) -> str:
    """Render a logpoint's message in ``frame``; a failing field shows its error inline."""
    from .. import summary
    from .logtemplate import render

    def tensor_line(value: object) -> str | None:
        return summary.one_line(value) if summary.is_tensor(value) else None

    return render(bp.log_parts or [], frame, tensor_line)
