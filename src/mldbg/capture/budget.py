"""How much a capture writes: mode (full tensors or summaries), depth limit, byte budget.

Capturing every module of a large model in full writes tens of gigabytes per forward;
the standard parity workflow goes coarse to fine instead (model entry and exit, then
blocks, then inside the one block that differs).  A :class:`Policy` decides, per call,
whether it is recorded at all (``depth``: the call's nesting below the captured model,
which is the same for a torch model and its MLX port because containers such as
``nn.ModuleList`` are never called) and, per call's tensors, whether they still fit the
byte budget.  It also counts what a full capture would have written (``full_bytes``),
so a summary pass says what the fine pass will cost.

The budget is enforced before writing: a call whose tensors would take the capture
past it is recorded in the index with its tensors listed as skipped (``"over the byte
budget"``), and the capture's ``budget`` report in ``capture.json`` says how much was
skipped and where it started.  Index lines and summaries of small tensors are not
counted: only tensor files are.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field
from typing import Any

MODES = ("full", "summary")
# ASCII digits only (``\d`` would take "١٠MB"); the whole text (``fullmatch``).
_SIZE = re.compile(r"\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([kmgt]?i?b?)?\s*", re.IGNORECASE)
MAX_BUDGET = 2**63 - 1  # 8 EiB: the largest file size; a larger budget is a typo, not a limit
_SIZE_SHOWN = 40  # characters of a refused size quoted in its error


def parse_size(value: int | float | str | None) -> int | None:
    """Bytes from ``1000000``, ``"500MB"``, ``"1GB"``, ``"2GiB"`` (None stays None);
    ``ValueError`` for anything else: negative, not finite, past ``MAX_BUDGET``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"bad byte size {str(value)[:_SIZE_SHOWN]!r}: a number or a text")
    if isinstance(value, int | float):
        number, text = float(value), repr(value)
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"a byte budget is 0 or more bytes, not {value!r}")
        size = int(value)
    else:
        match = _SIZE.fullmatch(value)
        if not match:
            raise ValueError(
                f"bad byte size {value[:_SIZE_SHOWN]!r}: write e.g. 500MB, 1GB, 2GiB or a "
                "number of bytes"
            )
        number, unit, text = float(match[1]), (match[2] or "").lower(), value.strip()
        base = 1024 if "i" in unit else 1000
        power = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}[unit[:1] if unit[:1] in "kmgt" else ""]
        size = int(number * base**power)
    if size > MAX_BUDGET:
        raise ValueError(f"a byte budget of {text[:_SIZE_SHOWN]} is past the limit of 8 EiB")
    return size


def size_text(nbytes: int) -> str:
    """Bytes the way ``parse_size`` reads them back (decimal units): ``23.6GB``, ``410MB``."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g}{unit}"
    return f"{nbytes}B"


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown capture mode {mode!r}: use 'full' or 'summary'")
    return mode


@dataclass
class Policy:
    """What one capture records; thread-safe counters of what it wrote and skipped."""

    mode: str = "full"
    depth: int | None = None
    budget: int | None = None
    used: int = 0
    full_bytes: int = 0
    skipped_bytes: int = 0
    skipped_tensors: int = 0
    deep_calls: int = 0
    first_skipped: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if self.depth is not None and (
            not isinstance(self.depth, int) or isinstance(self.depth, bool) or self.depth < 0
        ):
            raise ValueError(
                "depth takes a whole number, 0 or more (0: the model alone), not "
                f"{str(self.depth)[:40]!r}"
            )
        self.budget = parse_size(self.budget)

    @property
    def summary(self) -> bool:
        return self.mode == "summary"

    def records(self, depth: int) -> bool:
        """Whether a call nested ``depth`` levels below the captured model is recorded."""
        if self.depth is None or depth <= self.depth:
            return True
        with self._lock:
            self.deep_calls += 1
        return False

    def seen(self, full_size: int) -> None:
        """A call's tensors, which a full capture would write as ``full_size`` bytes."""
        with self._lock:
            self.full_bytes += full_size

    def admit(self, size: int, where: str, tensors: int) -> bool:
        """Reserve ``size`` bytes for a tensor file; False (and counted) when over budget."""
        with self._lock:
            if self.budget is None or self.used + size <= self.budget:
                self.used += size
                return True
            self.skipped_bytes += size
            self.skipped_tensors += tensors
            if self.first_skipped is None:
                self.first_skipped = where
            return False

    def settle(self, reserved: int, actual: int) -> None:
        """Replace a reservation by the file's real size."""
        with self._lock:
            self.used += actual - reserved

    def report(self) -> dict[str, Any]:
        """``capture.json``'s ``budget`` field."""
        with self._lock:
            return {
                "mode": self.mode,
                "depth": self.depth,
                "limit": self.budget,
                "used": self.used,
                "full_bytes": self.full_bytes,
                "skipped_bytes": self.skipped_bytes,
                "skipped_tensors": self.skipped_tensors,
                "first_skipped": self.first_skipped,
                "calls_below_depth": self.deep_calls,
                "exhausted": self.skipped_tensors > 0,
            }
