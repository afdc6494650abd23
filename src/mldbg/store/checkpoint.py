"""``debug_checkpoint``: named, self-contained records of tensors at points in the code.

Standard library only (it runs inside the user's script, debugged or not).  Every hit
appends one line to the current run's ``checkpoints.jsonl``; under the debugger a hit
with ``skip=False`` also pauses there.  ``MLDBG_CHECKPOINTS=off`` (read at import) makes
the call a no-op, so checkpoints can stay in code that ships.
"""

from __future__ import annotations

import json
import linecache
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from types import FrameType
from typing import TYPE_CHECKING, Any

from .. import summary
from ..own_work import own_work
from . import current_run
from .runs import CHECKPOINTS, JsonlWriter

if TYPE_CHECKING:  # the record's shape, for the type checker (the script never imports it)
    from .. import results as R

CONTEXT_LINES = 3
REPR_CHARS = 200
_OFF = os.environ.get("MLDBG_CHECKPOINTS", "").strip().lower() in ("off", "0", "false", "no")

# Set by the debugger's agent: the session's run, and the function that may pause.
PauseHook = Callable[[FrameType, dict[str, Any]], None]


class _Recorder:
    """Per process: the checkpoint writer, the hit counts per name and the pause hook."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writer: JsonlWriter | None = None
        self.hits: dict[str, int] = {}
        self.pause_hook: PauseHook | None = None

    def attach(self, run_dir: str, pause_hook: PauseHook | None) -> None:
        """Called by the agent: records go to the debug session's run, and hits may pause."""
        current_run.attach(run_dir)
        with self.lock:
            self.writer = None
            self.pause_hook = pause_hook

    def next_hit(self, name: str) -> int:
        with self.lock:
            count = self.hits.get(name, 0) + 1
            self.hits[name] = count
            return count

    def append(self, record: R.CheckpointRecord) -> str:
        with self.lock:
            if self.writer is None:
                self.writer = JsonlWriter(current_run.current_run().file(CHECKPOINTS))
            writer = self.writer
        writer.append(record)
        return str(writer.path)


_recorder = _Recorder()


def attach_debugger(run_dir: str, pause_hook: PauseHook | None) -> None:
    _recorder.attach(run_dir, pause_hook)


def _json_value(value: object, force: bool = False) -> object:
    """Tensors become summaries; JSON-able plain values are kept as they are."""
    if summary.is_tensor(value):
        return _tensor_summary(value, force)
    if isinstance(value, bool | int | str | type(None)):
        return value
    if isinstance(value, float):
        return (
            value if value == value and value not in (float("inf"), float("-inf")) else str(value)
        )
    if isinstance(value, list | tuple | dict):
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            return summary.summarize(value)
        if len(text) <= 10_000:
            return json.loads(text)
    return summary.summarize(value)


# The module a tensor type lives in -> the prefix its dtypes are printed with by that framework.
_DTYPE_PREFIX = {"torch": "torch.", "mlx": "mlx.core.", "numpy": "numpy."}


def _tensor_summary(value: object, force: bool = False) -> dict[str, object]:
    """The summary, plus ``dtype_qualified`` (``torch.float32``, ``mlx.core.bfloat16``).

    The short ``dtype`` alone cannot say which framework's dtype it is, and scripts that
    rebuild a tensor from a record need exactly that.
    """
    record: dict[str, object] = dict(summary.summarize(value, force))  # dtype_qualified added
    framework = str(record.get("type", "")).split(".", 1)[0]
    dtype = record.get("dtype")
    if dtype is not None:
        record["dtype_qualified"] = _DTYPE_PREFIX.get(framework, f"{framework}.") + str(dtype)
    return record


def _variable(value: object, force: bool = False) -> dict[str, object]:
    """One entry of ``variables``: a tensor summary, or ``{"type", "value"}`` for anything else.

    Every entry is an object with ``type``, so recipes can select ``.variables.NAME.value``
    for plain values and ``.variables.NAME.stats`` for tensors without guessing.
    """
    if summary.is_tensor(value):
        return _tensor_summary(value, force)
    text = summary.safe_repr(value, REPR_CHARS)
    if _is_summary(value):
        # Not a JSON value: its summary's scalar value, else its bounded repr, stands in.
        described = summary.summarize(value)  # what _json_value would give
        return {
            "type": described["type"],
            "value": described.get("value", described["repr"]),
            "repr": text,
        }
    return {"type": summary.type_name(value), "value": _json_value(value), "repr": text}


def _is_summary(value: object) -> bool:
    """Did :func:`_json_value` summarize ``value`` instead of keeping it as JSON?"""
    if isinstance(value, bool | int | str | float | type(None)):
        return False
    if isinstance(value, list | tuple | dict):
        try:
            return len(json.dumps(value, allow_nan=False)) > 10_000
        except (TypeError, ValueError):
            return True
    return True


def _iso(now: float) -> str:
    """ISO 8601 with the local UTC offset and microseconds: sortable, and readable by jq."""
    return datetime.fromtimestamp(now).astimezone().isoformat(timespec="microseconds")


def _code_context(frame: FrameType, line: int) -> R.CodeContext:
    file = frame.f_code.co_filename
    start = max(1, line - CONTEXT_LINES)
    lines = {}
    for n in range(start, line + CONTEXT_LINES + 1):
        text = linecache.getline(file, n, frame.f_globals)
        if not text and n > line:
            break
        lines[str(n)] = text.rstrip("\n")
    numbers = [int(n) for n in lines] or [line]
    return {"start_line": min(numbers), "end_line": max(numbers), "lines": lines}


def debug_checkpoint(
    name: str,
    *,
    skip: bool = False,
    metadata: Mapping[str, object] | None = None,
    **variables: object,
) -> None:
    """Record ``variables`` (default: the caller's local tensors) under ``name``.

    Under mldbg the script pauses here (reason ``checkpoint``) unless ``skip=True`` or
    checkpoint filters (``mldbg break --checkpoint``) leave this one out; without the
    debugger it only records.

    Lazy MLX arrays: one passed by keyword is asked for, so it is evaluated and its
    statistics recorded (as ``mx.eval`` would); the caller's locals, taken when no keyword
    is given, are recorded as they are: a lazy one by shape and dtype, ``"evaluated":
    false``, never run early by a checkpoint the script did not point at it.
    """
    if _OFF:
        return
    with own_work():  # its summaries and copies are not the model's operations
        _record(sys._getframe(1), name, skip, metadata, variables)


def _record(
    frame: FrameType,
    name: str,
    skip: bool,
    metadata: Mapping[str, object] | None,
    variables: dict[str, object],
) -> None:
    """``debug_checkpoint`` called from ``frame``: record, and pause there if asked."""
    asked = bool(variables)
    if not variables:
        variables = {k: v for k, v in frame.f_locals.items() if summary.is_tensor(v)}
    hit = _recorder.next_hit(name)
    line = frame.f_lineno
    now = time.time()
    record: R.CheckpointRecord = {
        "checkpoint_name": name,
        "hit_count": hit,
        "timestamp": _iso(now),
        "timestamp_unix": now,
        "location": {
            "file": os.path.abspath(frame.f_code.co_filename),
            "line": line,
            "function": frame.f_code.co_name,
        },
        "code_context": _code_context(frame, line),
        "variables": {key: _variable(value, asked) for key, value in variables.items()},
        # The first release's shape: tensors summarized, plain values as bare JSON values.
        "values": {key: _json_value(value, asked) for key, value in variables.items()},
        "metadata": _json_value(dict(metadata)) if metadata else None,
    }
    _recorder.append(record)
    hook = _recorder.pause_hook
    if hook is not None and not skip:
        hook(frame, {"name": name, "hit_count": hit})
