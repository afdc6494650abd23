"""Where the user's code made a call: the first frame outside the frameworks and mldbg.

Compare names glue code (a scheduler step, a loop, preprocessing between two calls of
a model) by the lines that made the two calls, so the capture records, for each
top-level call, the ``file:line`` of the script line that called the model.
"""

from __future__ import annotations

import os
import sys

_SKIPPED: tuple[str, ...] | None = None


def _skipped() -> tuple[str, ...]:
    """Directories whose frames are machinery: mldbg, torch, mlx (as installed)."""
    global _SKIPPED
    if _SKIPPED is None:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # mldbg/
        found = [here + os.sep]
        for name in ("torch", "mlx"):
            module = sys.modules.get(name)
            for path in getattr(module, "__path__", None) or []:
                found.append(os.path.abspath(path) + os.sep)
        _SKIPPED = tuple(found)
    return _SKIPPED


def call_site(limit: int = 64) -> str | None:
    """``file:line`` of the innermost frame that is not mldbg's, torch's or MLX's own."""
    skipped = _skipped()
    frame = sys._getframe(1)
    for _ in range(limit):
        if frame is None:
            return None
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(skipped):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return None
