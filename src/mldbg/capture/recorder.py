"""Framework-neutral bookkeeping of a capture: call order, nesting, call counts, files.

The torch hooks and the MLX wrappers only say "module PATH starts with these
arguments" and "module PATH ended with this output (or raised)"; this class gives each
call its sequence number, call index and parent, writes its tensors and index lines.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .flatten import flatten, flatten_call
from .store import CaptureDir, entry_name

# (tensors by key, final path, temp path) -> {key: {"shape", "dtype"}} of what was written,
# {key: reason} of what could not be; the framework writes the file.
SaveFn = Callable[[dict[str, Any], Path], tuple[dict[str, dict[str, Any]], dict[str, str]]]


class Recorder:
    def __init__(self, directory: CaptureDir, save: SaveFn, inputs: bool) -> None:
        self.directory = directory
        self.save = save
        self.inputs = inputs
        self._lock = threading.Lock()
        self._local = threading.local()
        self._seq = 0
        self._ends = 0
        self._calls: dict[str, int] = {}
        self.tensors = 0
        self.bytes = 0
        self.errors: list[str] = []

    def _stack(self) -> list[tuple[int, int, str]]:
        """This thread's open calls as (seq, call index, module path), outermost first."""
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def enter(
        self, path: str, class_name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> int:
        """Record the start of a call (and its inputs); returns its sequence number."""
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
        }
        stack.append((seq, call, path))
        if self.inputs:
            record.update(self._write(seq, "in", path, call, flatten_call(args, kwargs)))
        self.directory.index.append(record)
        return seq

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
        if error is not None:
            record["error"] = f"{type(error).__name__}: {error}"
        else:
            record.update(self._write(seq, "out", path, call, flatten(output, "out")))
        self.directory.index.append(record)

    def _write(
        self, seq: int, role: str, path: str, call: int, pairs: list[tuple[str, Any]]
    ) -> dict[str, Any]:
        if not pairs:
            return {}
        final, tmp = self.directory.tensor_path(seq, role)
        try:
            written, skipped = self.save(dict(pairs), tmp)
            if written:
                os.replace(tmp, final)
        except Exception as exc:  # a full disk or an odd tensor must not break the model
            message = f"{type(exc).__name__}: {exc}"
            self.errors.append(f"{path}#{call}.{role}: {message}")
            return {"write_error": message}
        finally:
            if tmp.exists():
                tmp.unlink()
        size = final.stat().st_size if written else 0
        with self._lock:
            self.tensors += len(written)
            self.bytes += size
        result: dict[str, Any] = {
            "tensors": {
                entry_name(path, call, key): {"key": key, **info} for key, info in written.items()
            },
        }
        if written:
            result["file"] = final.name
        if skipped:
            result["skipped"] = {entry_name(path, call, k): why for k, why in skipped.items()}
        return result

    @property
    def records(self) -> int:
        return self._seq
