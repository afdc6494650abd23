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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..own_work import own_work
from ..store.runs import PRIVATE_FILE
from .budget import Policy
from .device_async import DeviceClock, Mark
from .flatten import Flat, flatten, flatten_call
from .records import (
    CallExtra,
    CallLine,
    ReturnLine,
    Sensitivity,
    TensorFields,
    TensorInfo,
)
from .sensitivity import MAX_HEIGHT, MAX_HELD_BYTES, HeldCall, Perturbations, benign
from .sites import call_site
from .store import INDEX, CaptureDir, entry_name, module_label
from .writer import BackgroundWriter

if TYPE_CHECKING:
    import numpy as np

# (tensors by key, final path, temp path) -> {key: {"shape", "dtype"}} of what was written,
# {key: reason} of what could not be; the framework writes the file.
# (The tensors are the framework's own: torch tensors, MLX arrays, numpy arrays.)
SaveFn = Callable[[dict[str, Any], Path], tuple[dict[str, TensorInfo], dict[str, str]]]
# Makes a call's outputs real before its end is timed: MLX evaluates them (its work is lazy),
# torch waits for CUDA/MPS kernels (they run asynchronously).
SettleFn = Callable[[object], None]


MAX_ERRORS = 1000  # messages kept in ``errors``; ``error_count`` counts them all
SKIPPED = -1  # a "sequence number" for a call that is not recorded at all

# value -> (sketch, stats, shape, safetensors dtype name): a summary capture's reduction
SummarizeFn = Callable[[object], tuple["np.ndarray", dict[str, Any], list[int], str]]
# value -> a private copy the writer thread can write later (the model may change its own)
SnapshotFn = Callable[[object], object]


class Recorder:
    """Never raises into the model: a failed write (a full disk, an odd value) is an error
    message in ``errors`` and, where the index line can still be written, on that line."""

    def __init__(
        self,
        directory: CaptureDir,
        save: SaveFn,
        inputs: bool,
        policy: Policy | None = None,
        summarize: SummarizeFn | None = None,
        writer: BackgroundWriter | None = None,
        snapshot: SnapshotFn | None = None,
        settle: SettleFn | None = None,
        clock: DeviceClock | None = None,
    ) -> None:
        self.directory = directory
        self.save = save
        self.inputs = inputs
        self.settle = settle
        # Times calls on a GPU with events instead of waiting for it (capture/device_async.py).
        self.clock = clock
        self.policy = policy or Policy()
        self.summarize = summarize
        # A BackgroundWriter (capture/writer.py): files and index lines written off the
        # model's thread, from ``snapshot`` copies of its tensors taken on it.
        self.writer = writer
        self.snapshot = snapshot
        self._lock = threading.Lock()
        self._local = threading.local()
        self._seq = 0
        self._ends = 0
        self._calls: dict[str, int] = {}
        self._with_children: set[int] = set()  # calls during which another call started
        self._below: set[int] = set()  # open calls below the depth limit (no tensors)
        self._outside: set[int] = set()  # open calls outside ``within`` (no tensors)
        # Per open call with children: how many calls deep its subtree is so far.
        self._height: dict[int, int] = {}
        # Open calls with a child below the depth limit: not re-run (a coarse pass).
        self._partial: set[int] = set()
        # Per open call at most MAX_HEIGHT deep: its leaf children as they ran, for its
        # rounding re-run (capture/sensitivity.py, "Children that read what they read").
        self._held: dict[int, list[HeldCall]] = {}
        self._held_bytes: dict[int, int] = {}
        # The sensitivity re-runs' drawn signs and row samples, kept for this capture.
        self.perturbations = Perturbations()
        # Per kind of call (class, with children or not): whether every call of it
        # measured so far was benign (see ``sensitivity_of``); how many calls were not
        # re-run for that; leaf calls ended so far (the depth a bound would have there).
        self._benign: dict[tuple[str, bool], bool] = {}
        self.not_remeasured = 0
        self._leaves_ended = 0
        self.tensors = 0
        self.bytes = 0
        self.errors: list[str] = []
        self.error_count = 0

    # Run once, when this thread's outermost open call has ended (Capture.close_when_idle).
    on_idle: Callable[[], None] | None = None

    def busy_here(self) -> bool:
        """Whether a recorded call is under way on this thread."""
        return bool(self._stack())

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
        args: tuple[object, ...],
        kwargs: Mapping[str, object],
        extra: CallExtra | None = None,
    ) -> int:
        """Record the start of a call (and its inputs); returns its sequence number.

        ``extra`` adds fields to the call's index line (``quant`` for a quantized module).
        A call below the policy's depth limit is still on the index (``below_depth``), so
        compare sees the whole call tree (its rounding bounds count every leaf call), but
        none of its tensors are written."""
        self._local.busy = getattr(self._local, "busy", 0) + 1
        try:
            return self._enter(path, class_name, args, kwargs, extra)
        finally:
            self._local.busy -= 1

    @property
    def calls_ended(self) -> int:
        """How many calls have ended (the next return line's ``end``)."""
        with self._lock:
            return self._ends

    def busy(self) -> bool:
        """Whether this thread is inside the recorder (its own tensor copies are no ops)."""
        return bool(getattr(self._local, "busy", 0))

    def _enter(
        self,
        path: str,
        class_name: str,
        args: tuple[object, ...],
        kwargs: Mapping[str, object],
        extra: CallExtra | None,
    ) -> int:
        stack = self._stack()
        if stack:
            # Its parent is no leaf (even when this call is below the depth limit).
            self._with_children.add(stack[-1][0])
        outside = self.inside is not None and not self.inside(path)
        # Depth counts from the captured model, or, with ``within``, from that module.
        with self._lock:
            level = sum(1 for open_seq, _c, _p in stack if open_seq not in self._outside)
        below = not outside and not self.policy.records(level)
        with self._lock:
            seq = self._seq
            self._seq += 1
            call = self._calls.get(path, 0)
            self._calls[path] = call + 1
        site = None
        if not stack:  # a top-level call: the line of the code that called the model
            # A submodule called from the model's own method (vae.decode -> decoder):
            # the line that called that method, past the model's frames.
            owners = self.models if path not in self.model_paths else frozenset()
            site = call_site(models=owners)
        record: CallLine = {
            "event": "call",
            "seq": seq,
            "module": path,
            "call": call,
            "class": class_name,
            "parent": stack[-1][0] if stack else None,
            "depth": len(stack),
        }
        if site:
            record["site"] = site
        if extra and "quant" in extra:
            record["quant"] = extra["quant"]
        if below:
            record["below_depth"] = True
            with self._lock:
                self._below.add(seq)
            if stack:
                self._partial.add(stack[-1][0])
        elif outside:
            record["outside_within"] = True
            with self._lock:
                self._outside.add(seq)
        stack.append((seq, call, path))
        written = self.inputs and not (below or outside)
        collect = (lambda: flatten_call(args, kwargs)) if written else None
        with self._capture_work():
            self._emit(record, seq, "in", path, call, collect)
        mark = None
        if self.clock is not None:
            mark = self.clock.mark((args, kwargs)) or self.clock.mark()
        self._starts()[seq] = (time.perf_counter(), self._overhead(), mark, len(self._brackets()))
        return seq

    # -- timing: a call's own seconds, the capture's writes taken out ---------------------------

    def _starts(self) -> dict[int, tuple[float, float, Mark | None, int]]:
        """Open calls' starts: (clock, capture time so far, GPU mark, brackets so far)."""
        starts = getattr(self._local, "starts", None)
        if starts is None:
            starts = self._local.starts = {}
        return starts

    def _overhead(self) -> float:
        return float(getattr(self._local, "overhead", 0.0))

    def _brackets(self) -> list[tuple[Mark, Mark]]:
        """This thread's capture work on the GPU, bracketed by events, since its
        outermost open call started."""
        brackets = getattr(self._local, "brackets", None)
        if brackets is None:
            brackets = self._local.brackets = []
        return brackets

    def _charge(self, since: float) -> None:
        """Time spent recording (writing a child's tensors) is not the model's time."""
        self._local.overhead = self._overhead() + (time.perf_counter() - since)

    @contextlib.contextmanager
    def _capture_work(self) -> Iterator[None]:
        """The capture's own work (copies, writes, re-runs): kept out of the time of the
        calls around it, on the host's clock and, on a GPU, on the device's."""
        since = time.perf_counter()
        try:
            if self.clock is None:
                yield
            else:
                with self.clock.work(self._brackets()):
                    yield
        finally:
            self._charge(since)

    def _seconds(self, seq: int, output: object) -> float | Callable[[], float | None] | None:
        """Call ``seq``'s own time: measured now on the host's clock, or, for a call on a
        GPU, a function that reads it from the device's events later (on the writer
        thread), so the host never waits for the device to time a call."""
        start = self._starts().pop(seq, None)
        if start is None:
            return None
        began, overhead, mark, first = start
        if mark is not None and self.clock is not None and output is not None:
            end = self.clock.mark(output)
            if end is not None:
                clock, inside = self.clock, self._brackets()[first:]
                return lambda: clock.seconds(mark, end, inside)
        if self.settle is not None and output is not None:
            with contextlib.suppress(Exception):  # timing must never break the model
                self.settle(output)
        return max(0.0, time.perf_counter() - began - (self._overhead() - overhead))

    def open_seq(self, path: str) -> int | None:
        """The innermost open call of module ``path`` on this thread (hooks get no token)."""
        for seq, _call, open_path in reversed(self._stack()):
            if open_path == path:
                return seq
        return None

    # Whether calls are re-run for their sensitivity (``capture(sensitivity=...)``), and
    # whether every call is (``"all"``) or a kind of call proven benign is not re-run.
    sensitivity = True
    every_call = False
    # The captured model(s): their ids and module paths ("" for one model, each name of
    # a pipeline's): a top-level call of a submodule is sited outside their methods.
    models: frozenset[int] = frozenset()
    model_paths: frozenset[str] = frozenset({""})
    # ``capture(within=...)``: whether a module path's tensors are recorded (None: all).
    # A call outside is on the index (``outside_within``) and measured, without tensors.
    inside: Callable[[str], bool] | None = None

    def wants_sensitivity(self, seq: int) -> bool:
        """Call ``seq`` (still open, and recorded with its tensors) is to be measured: the
        capture measures sensitivities, its subtree is at most ``MAX_HEIGHT`` calls deep
        (a leaf, an attention over its projections: capture/sensitivity.py), and its
        children are recorded too (a depth-limited pass that locates a block re-runs
        nothing: its floors would bound entries it does not have)."""
        return (
            self.sensitivity
            and seq != SKIPPED
            and seq not in self._below
            and seq not in self._partial
            and self._height.get(seq, 0) <= MAX_HEIGHT
        )

    def held_by(self, seq: int) -> list[HeldCall]:
        """Open call ``seq``'s leaf children as they ran (for its rounding re-run)."""
        return self._held.get(seq, [])

    def sensitivity_of(
        self,
        seq: int,
        measure: Callable[[bool], Sensitivity | None],
        output: object = None,
        kind: str | None = None,
    ) -> Sensitivity | None:
        """The return line's ``sensitivity`` fields for call ``seq``: ``measure(with
        children)`` (re-runs of the call, its children included) when the capture
        measures it, else None.  The re-run is the capture's work, not the model's: its
        time is kept out of the call's ``seconds``, and ``output`` is settled first (an
        MLX call's lazy work is the call's, not the measurement's, which would force it).

        ``kind`` (the module's class): once calls of that kind, with or without children,
        have been measured and every one was benign (:func:`sensitivity.benign`: its
        floor below the rounding bound at its depth, no amplification compare would
        apply), later calls of that kind are not re-run (``not_remeasured`` counts them;
        ``capture(sensitivity="all")`` re-runs every call).  The first call of each kind
        is always measured, and one that is not benign keeps its kind measured."""
        if not self.wants_sensitivity(seq):
            return None
        if output is not None and self.settle is not None:
            with contextlib.suppress(Exception):  # timing must never break the model
                self.settle(output)
        key = (kind or "", seq in self._with_children)
        if kind is not None and not self.every_call and self._benign.get(key):
            self.not_remeasured += 1
            return None
        with self._capture_work(), own_work():
            found = measure(key[1])  # {"sensitivity", "step", "amplification"}, or None
        if kind is not None:
            quiet = found is not None and benign(found, self._leaves_ended)
            self._benign[key] = self._benign.get(key, True) and quiet
        return found

    def exit(
        self,
        seq: int,
        path: str,
        output: object,
        error: BaseException | None,
        extra: Sensitivity | None = None,
        held: HeldCall | None = None,
    ) -> None:
        """Record the end of call ``seq``: its outputs, or the exception it raised.

        ``extra`` adds fields to the return line (``sensitivity``, ``step``, ``amplification``);
        ``held``, the call as it ran, is kept for its parent's re-run when it is a leaf."""
        self._local.busy = getattr(self._local, "busy", 0) + 1
        try:
            self._exit(seq, path, output, error, extra, held)
        finally:
            self._local.busy -= 1
        if self.on_idle is not None and not self._stack():
            then, self.on_idle = self.on_idle, None
            with own_work():  # closing the capture: its writes are not the model's
                then()

    def _exit(
        self,
        seq: int,
        path: str,
        output: object,
        error: BaseException | None,
        extra: Sensitivity | None,
        held: HeldCall | None,
    ) -> None:
        self._with_children.discard(seq)
        self._held.pop(seq, None)
        self._held_bytes.pop(seq, None)
        self._partial.discard(seq)
        height = self._height.pop(seq, 0)
        stack = self._stack()
        call = 0
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == seq:
                call = stack[i][1]
                del stack[i:]
                break
        if height == 0:
            self._leaves_ended += 1
        if stack:  # its parent's subtree is at least one call deeper
            parent = stack[-1][0]
            self._height[parent] = max(self._height.get(parent, 0), height + 1)
            if self._height[parent] > MAX_HEIGHT:
                self._held.pop(parent, None)  # it will not be re-run with its children
            elif held is not None and height == 0 and self.sensitivity:
                size = self._held_bytes.get(parent, 0) + held.nbytes
                if size <= MAX_HELD_BYTES:
                    self._held.setdefault(parent, []).append(held)
                    self._held_bytes[parent] = size
        if seq == SKIPPED:
            return
        with self._lock:
            end = self._ends
            self._ends += 1
            below = seq in self._below or seq in self._outside
            self._below.discard(seq)
            self._outside.discard(seq)
        record: ReturnLine = {"event": "return", "seq": seq, "end": end, **(extra or {})}
        # inclusive of its children, exclusive of the capture
        seconds = self._seconds(seq, None if error is not None else output)
        if not stack:
            self._local.brackets = []  # the outermost call ended: no one reads them
        timed: Callable[[], None] | None = None
        if callable(seconds):
            read = seconds

            def timed() -> None:
                if (value := read()) is not None:
                    record["seconds"] = value

            if self.writer is None:
                timed()  # an inline capture waits for the device anyway, to copy
                timed = None
        elif seconds is not None:
            record["seconds"] = seconds
        with self._capture_work():
            if error is not None:
                record["error"] = _describe(error)
                self._emit(record, seq, "out", path, call, None, timed)
            elif below:
                self._emit(record, seq, "out", path, call, None, timed)
            else:
                self._emit(record, seq, "out", path, call, lambda: flatten(output, "out"), timed)

    def _emit(
        self,
        record: CallLine | ReturnLine,
        seq: int,
        role: str,
        path: str,
        call: int,
        collect: Callable[[], Flat] | None,
        timed: Callable[[], None] | None = None,
    ) -> None:
        """Write the call's tensors and append its index line: now, or through the writer
        (tensors named and copied now, as they are at this point of the forward; ``timed``,
        run there first, puts the call's GPU time on the line)."""
        if self.writer is None:
            if collect is not None:
                record.update(self._write(seq, role, path, call, collect))
            self._append(record, path, call, role)
            return
        size = 0
        flat: Flat | None = None
        if collect is not None:
            try:
                flat = collect()
                flat.pairs = [(key, self._copy(value)) for key, value in flat.pairs]
                size = sum(_nbytes(value) for _key, value in flat.pairs)
            except Exception as exc:  # an odd value: the same message the direct path gives
                message = _describe(exc)
                self.error(f"{module_label(path)}#{call}.{role}: {message}")
                record["write_error"] = message
                flat = None
        taken = flat

        def job() -> None:
            if timed is not None:
                timed()
            if taken is not None:
                record.update(self._write(seq, role, path, call, lambda: taken))
            self._append(record, path, call, role)

        self.writer.submit(job, size)

    def _copy(self, value: object) -> object:
        """A private copy for the writer; the value itself where no copy can be made (the
        write then skips it with the reason, as without the writer)."""
        if self.snapshot is None:
            return value
        try:
            return self.snapshot(value)
        except Exception:
            return value

    def _append(self, record: CallLine | ReturnLine, path: str, call: int, role: str) -> None:
        try:
            self.directory.index.append(record)
        except Exception as exc:  # a full disk must not break the model
            self.error(f"{module_label(path)}#{call}.{role}: {INDEX}: {_describe(exc)}")

    def _write(
        self, seq: int, role: str, path: str, call: int, collect: Callable[[], Flat]
    ) -> TensorFields:
        """Write the call's tensors to one file; the index fields that describe them."""
        result: TensorFields = {}
        written: dict[str, TensorInfo] = {}
        tmp: Path | None = None
        try:
            flat = collect()
            skipped = dict(flat.skipped)
            if flat.renamed:
                result["renamed"] = {entry_name(path, call, k): w for k, w in flat.renamed.items()}
            pairs = dict(flat.pairs)
            reserved = 0
            if pairs:
                full_size = sum(_nbytes(v) for v in pairs.values())
                self.policy.seen(full_size)
                reserved = 8 * 1024 * len(pairs) if self.policy.summary else full_size
                where = f"{module_label(path)}#{call}.{role}"
                if not self.policy.admit(reserved, where, len(pairs)):
                    why = f"over the byte budget ({self.policy.budget} bytes)"
                    skipped.update(dict.fromkeys(pairs, why))
                    pairs, reserved = {}, 0
            if pairs:
                final, tmp = self.directory.tensor_path(seq, role)
                if self.policy.summary and self.summarize is not None:
                    written, not_saved = self._save_summaries(pairs, tmp)
                else:
                    written, not_saved = self.save(pairs, tmp)
                skipped.update(not_saved)
                if written:
                    os.chmod(tmp, PRIVATE_FILE)  # private whatever the umask, like the run
                    os.replace(tmp, final)
                    size = final.stat().st_size
                    self.policy.settle(reserved, size)
                    with self._lock:
                        self.tensors += len(written)
                        self.bytes += size
                    result["file"] = final.name
                else:
                    self.policy.settle(reserved, 0)
            if written or pairs:
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

    def _save_summaries(
        self, pairs: dict[str, object], tmp: Path
    ) -> tuple[dict[str, TensorInfo], dict[str, str]]:
        """Each tensor's sketch to ``tmp``; its statistics, shape and dtype to the index."""
        from .safetensors_writer import write_arrays

        assert self.summarize is not None
        sketches: dict[str, np.ndarray] = {}
        infos: dict[str, TensorInfo] = {}
        skipped: dict[str, str] = {}
        for key, value in pairs.items():
            try:
                sketch, stats, shape, dtype = self.summarize(value)
            except Exception as exc:  # an odd dtype: skipped alone, the rest written
                skipped[key] = _describe(exc)
                continue
            sketches[key] = sketch
            infos[key] = {
                "shape": shape,
                "dtype": dtype,
                "sketch": int(sketch.size),
                "stats": stats,
            }
        if sketches:
            write_arrays(tmp, sketches)
        return infos, skipped

    @property
    def records(self) -> int:
        return self._seq


def _nbytes(value: object) -> int:
    """Bytes a tensor takes in full (torch, MLX and numpy all answer ``nbytes``)."""
    try:
        return int(getattr(value, "nbytes", 0))
    except Exception:
        return 0


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose __str__ fails
        return type(exc).__name__
