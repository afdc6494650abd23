"""Device work the capture does not wait for: copies into pinned host memory, event timing.

On a CUDA GPU a synchronous ``tensor.cpu()`` at every call stops the host until the GPU
has computed the tensor and copied it, so the host can no longer queue the forward's
next kernels while the GPU works: a capture that copied each call's tensors that way,
and synchronized the device to time each call, ran the model one kernel at a time.

Here a call's tensor is copied on the stream that computes it, into page-locked host
memory, with ``non_blocking=True``, and an event is recorded after the copy on that
stream: the host goes on at once, and the writer thread waits for the event before it
reads the copy.  Copying on the tensor's own stream is what keeps the copy right: the
model's later kernels on that stream (an in-place update of the same tensor, or the
allocator handing its memory to a new tensor) run after the copy, in stream order.
(A side stream would overlap the copy with compute, and race those very writes.)

A call's time on the GPU is measured the same way, with timing events recorded at its
start and end on the current stream and read by the writer thread, minus the GPU time
of the capture's own work inside it (its children's copies, re-runs), which is bracketed
by events too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class PendingCopy:
    """A device tensor's copy into pinned host memory, queued on the tensor's stream.

    ``nbytes`` sizes it for the writer's bounded queue on the model's thread; ``wait()``,
    on the writer thread, blocks until the copy is done and gives the host tensor."""

    __slots__ = ("_done", "host")

    def __init__(self, host: torch.Tensor, done: Any) -> None:
        self.host = host
        self._done = done

    @staticmethod
    def start(tensor: torch.Tensor) -> PendingCopy | None:
        """Start copying a CUDA ``tensor`` to the host without waiting for it; None where
        it cannot be done so (not a CUDA tensor, no pinned memory to be had): the caller
        then copies synchronously, as before."""
        import torch

        if type(tensor) is not torch.Tensor:  # a subclass (DTensor…): its own copy rules
            return None
        if tensor.device.type != "cuda" or tensor.layout != torch.strided or tensor.is_quantized:
            return None
        try:
            host = torch.empty(tuple(tensor.shape), dtype=tensor.dtype, pin_memory=True)
        except RuntimeError:  # no page-locked memory left
            return None
        stream = torch.cuda.current_stream(tensor.device)
        with torch.cuda.device(tensor.device):
            # conj/neg bits resolved on the device: the host buffer holds plain values
            host.copy_(tensor.resolve_conj().resolve_neg(), non_blocking=True)
            done = torch.cuda.Event(blocking=True)  # the writer sleeps on it, not spins
            done.record(stream)
        return PendingCopy(host, done)

    @property
    def nbytes(self) -> int:
        return int(self.host.nbytes)

    def wait(self) -> torch.Tensor:
        self._done.synchronize()
        return self.host


def ready(value: object) -> object:
    """``value`` itself, or, for a :class:`PendingCopy`, its host tensor once copied."""
    return value.wait() if isinstance(value, PendingCopy) else value


# A point on a GPU stream's timeline: (device index, timing event).
Mark = tuple[int, Any]


class DeviceClock:
    """Times calls on the GPU with events, so timing never waits for the device.

    ``mark(value)`` records a timing event on the current stream of the device holding
    ``value``'s first CUDA tensor (of the current device for None); ``work()`` brackets
    the capture's own device work with two marks; ``seconds(start, end, inside)`` (on
    the writer thread: it waits for ``end``) is the GPU time from ``start`` to ``end``
    less that of the brackets ``inside``, or None when the marks lie on different
    devices or cannot be read."""

    def __init__(self, first_tensor: Callable[[object], torch.Tensor | None]) -> None:
        self._first_tensor = first_tensor

    @staticmethod
    def active() -> bool:
        """Whether the process uses CUDA at all (no marks, no cost, otherwise)."""
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())

    def mark(self, value: object = None) -> Mark | None:
        import torch

        try:
            if value is None:
                device = torch.cuda.current_device()
            else:
                tensor = self._first_tensor(value)
                if tensor is None or tensor.device.type != "cuda":
                    return None
                index = tensor.device.index
                device = torch.cuda.current_device() if index is None else index
            event = torch.cuda.Event(enable_timing=True, blocking=True)
            event.record(torch.cuda.current_stream(device))
        except Exception:  # timing must never break the model
            return None
        return device, event

    @contextlib.contextmanager
    def work(self, into: list[tuple[Mark, Mark]]) -> Iterator[None]:
        """Bracket the capture's own device work (appended to ``into`` when both ends
        could be marked), so the calls around it do not count it as theirs."""
        before = self.mark()
        try:
            yield
        finally:
            after = self.mark()
            if before is not None and after is not None:
                into.append((before, after))

    @staticmethod
    def seconds(start: Mark, end: Mark, inside: list[tuple[Mark, Mark]]) -> float | None:
        try:
            if start[0] != end[0]:
                return None  # the call moved its work to another GPU: no common clock
            end[1].synchronize()
            total = start[1].elapsed_time(end[1])
            for before, after in inside:
                if before[0] == start[0] and after[0] == start[0]:
                    after[1].synchronize()
                    total -= before[1].elapsed_time(after[1])
        except Exception:
            return None
        return max(0.0, total / 1000.0)
