"""mldbg's own work on a thread, which no op-level capture records as the model's.

``capture(ops=...)`` records every framework operation run on the thread while a wanted
module's call is under way.  mldbg itself runs operations there too: a checkpoint's
summary and copy, ``debug_save``'s export, the evaluations and listings of a script paused
at a breakpoint inside that module, the non-finite tripwire's checks, the capture's own
measurements.  Each is marked with :func:`own_work`; ``capture/ops.py`` records nothing
while it is.  Standard library only (the agent marks its work too).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_local = threading.local()


@contextlib.contextmanager
def own_work() -> Iterator[None]:
    """Mark what runs inside as mldbg's, on this thread (nests)."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def doing_own_work() -> bool:
    """Is this thread inside :func:`own_work`?"""
    return bool(getattr(_local, "depth", 0))
