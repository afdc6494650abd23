"""Which tracer backend this interpreter gets (``MLDBG_BACKEND=settrace`` forces the slow one).

Kept apart from :mod:`.debugger` so that the debugger, typed against
:class:`~.tracer.TracerBackend`, never imports a backend and no backend imports it back.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from .tracer import TracerBackend, TracerClient

if TYPE_CHECKING:  # every backend is a TracerBackend: checked here, since the type checker
    # runs for one Python and skips the branches below that are for another
    from .tracer_instrument import InstrumentBackend
    from .tracer_monitoring import MonitoringBackend
    from .tracer_settrace import SettraceBackend

    _BACKENDS: tuple[Callable[[TracerClient], TracerBackend], ...] = (
        MonitoringBackend,
        InstrumentBackend,
        SettraceBackend,
    )


def choose_backend(client: TracerClient) -> TracerBackend:
    forced = os.environ.get("MLDBG_BACKEND", "")
    if sys.version_info >= (3, 12) and forced != "settrace":
        from .tracer_monitoring import MonitoringBackend

        return MonitoringBackend(client)
    if sys.version_info < (3, 12) and forced != "settrace":
        try:
            from .tracer_instrument import InstrumentBackend

            return InstrumentBackend(client)
        except Exception:  # ctypes or the internals it needs are missing: trace globally
            pass
    from .tracer_settrace import SettraceBackend

    return SettraceBackend(client)
