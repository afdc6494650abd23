"""Framework-neutral bookkeeping of a capture: call order, nesting, call counts, files.

The torch hooks and the MLX wrappers only say "module PATH starts with these
arguments" and "module PATH ended with this output (or raised)"; this class gives each
call its sequence number, call index and parent, writes its tensors and index lines.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..runs import PRIVATE_FILE
from .flatten import Flat, flatten, flatten_call
from .store import INDEX, CaptureDir, entry_name, module_label

# (tensors by key, final path, temp path) -> {key: {"shape", "dtype"}} of what was written,
# {key: reason} of what could not be; the framework writes the file.
SaveFn = Callable[[dict[str, Any], Path], tuple[dict[str, dict[str, Any]], dict[str, str]]]
# Makes a call's outputs real before its end is timed: MLX evaluates them (its work is lazy),
# torch waits for CUDA/MPS kernels (they run asynchronously).
SettleFn = Callable[[Any], None]


MAX_ERRORS = 1000  # messages kept in ``errors``; ``error_count`` counts them all


class Recorder:
    """Never raises into the model: a failed write (a full disk, an odd value) is an error
    message in ``errors`` and, where the index line can still be written, on that line."""

    def __init__(
        self, directory: CaptureDir, save: SaveFn, inputs: bool, settle: SettleFn | None = None
    ) -> None:
        self.directory = directory
        self.save = save
        self.inputs = inputs
        self.settle = settle
        self._lock = threading.Lock()
        self._local = threading.local()
        self._seq = 0
        self._ends = 0
        self._calls: dict[str, int] = {}
        self.tensors = 0
        self.bytes = 0
        self.errors: list[str] = []
        self.error_count = 0

    def _stack(self) -> list[tuple[int, int, str]]:
        """This thread's open calls as (seq, call index, module path), outermost first."""
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def error(self, message: str) -> None:
        with self._lock:
            self.error_count += 1
            if len(self.errors) < MAX_ERRORS:
                self.errors.append(message)

    def enter(
        self,
        path: str,
        class_name: str,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
    ) -> int:
        """Record the start of a call (and its inputs); returns its sequence number.

        ``extra`` adds fields to the call's index line (``quant`` for a quantized module)."""
        with self._lock:
            seq = self._seq
            self._seq += 1
            call = self._calls.get(path, 0)
            self._calls[path] = call + 1
        stack = self._stack()
        record: dict[str, Any] = {
            "event": "call",
            "seq": seq,
            "module": path,
            "call": call,
            "class": class_name,
            "parent": stack[-1][0] if stack else None,
            "depth": len(stack),
            **(extra or {}),
        }
        stack.append((seq, call, path))
        spent = time.perf_counter()
        if self.inputs:
            record.update(self._write(seq, "in", path, call, lambda: flatten_call(args, kwargs)))
        self._append(record, path, call, "in")
        self._charge(spent)
        self._starts()[seq] = (time.perf_counter(), self._overhead())
        return seq

    # -- timing: a call's own seconds, the capture's writes taken out ---------------------------

    def _starts(self) -> dict[int, tuple[float, float]]:
        starts = getattr(self._local, "starts", None)
        if starts is None:
            starts = self._local.starts = {}
        return starts

    def _overhead(self) -> float:
        return float(getattr(self._local, "overhead", 0.0))

    def _charge(self, since: float) -> None:
        """Time spent recording (writing a child's tensors) is not the model's time."""
        self._local.overhead = self._overhead() + (time.perf_counter() - since)

    def _seconds(self, seq: int, output: Any) -> float | None:
        start = self._starts().pop(seq, None)
        if start is None:
            return None
        if self.settle is not None and output is not None:
            with contextlib.suppress(Exception):  # timing must never break the model
                self.settle(output)
        began, overhead = start
        return max(0.0, time.perf_counter() - began - (self._overhead() - overhead))

    def open_seq(self, path: str) -> int | None:
        """The innermost open call of module ``path`` on this thread (hooks get no token)."""
        for seq, _call, open_path in reversed(self._stack()):
            if open_path == path:
                return seq
        return None

    def exit(self, seq: int, path: str, output: Any, error: BaseException | None) -> None:
        """Record the end of call ``seq``: its outputs, or the exception it raised."""
        stack = self._stack()
        call = 0
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == seq:
                call = stack[i][1]
                del stack[i:]
                break
        with self._lock:
            end = self._ends
            self._ends += 1
        record: dict[str, Any] = {"event": "return", "seq": seq, "end": end}
        seconds = self._seconds(seq, None if error is not None else output)
        if seconds is not None:
            record["seconds"] = seconds  # inclusive of its children, exclusive of the capture
        spent = time.perf_counter()
        if error is not None:
            record["error"] = _describe(error)
        else:
            record.update(self._write(seq, "out", path, call, lambda: flatten(output, "out")))
        self._append(record, path, call, "out")
        self._charge(spent)

    def _append(self, record: dict[str, Any], path: str, call: int, role: str) -> None:
        try:
            self.directory.index.append(record)
        except Exception as exc:  # a full disk must not break the model
            self.error(f"{module_label(path)}#{call}.{role}: {INDEX}: {_describe(exc)}")

    def _write(
        self, seq: int, role: str, path: str, call: int, collect: Callable[[], Flat]
    ) -> dict[str, Any]:
        """Write the call's tensors to one file; the index fields that describe them."""
        result: dict[str, Any] = {}
        written: dict[str, dict[str, Any]] = {}
        tmp: Path | None = None
        try:
            flat = collect()
            skipped = dict(flat.skipped)
            if flat.renamed:
                result["renamed"] = {entry_name(path, call, k): w for k, w in flat.renamed.items()}
            if flat.pairs:
                final, tmp = self.directory.tensor_path(seq, role)
                written, not_saved = self.save(dict(flat.pairs), tmp)
                skipped.update(not_saved)
                if written:
                    os.chmod(tmp, PRIVATE_FILE)  # private whatever the umask, like the run
                    os.replace(tmp, final)
                    size = final.stat().st_size
                    with self._lock:
                        self.tensors += len(written)
                        self.bytes += size
                    result["file"] = final.name
            if written or flat.pairs:
                result["tensors"] = {
                    entry_name(path, call, key): {"key": key, **info}
                    for key, info in written.items()
                }
            if skipped:
                result["skipped"] = {entry_name(path, call, k): why for k, why in skipped.items()}
        except Exception as exc:  # a full disk or an odd value must not break the model
            message = _describe(exc)
            self.error(f"{module_label(path)}#{call}.{role}: {message}")
            result = {"write_error": message}
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
        return result

    @property
    def records(self) -> int:
        return self._seq


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose __str__ fails
        return type(exc).__name__
