"""Where the user's code made a call: the first frame outside the frameworks and mldbg.

Compare names glue code (a scheduler step, a loop, preprocessing between two calls of
a model) by the lines that made the two calls, so the capture records, for each
top-level call, the ``file:line`` of the script line that called the model.
"""

from __future__ import annotations

import os
import sys
from typing import Any

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


def call_site(limit: int = 64, models: frozenset[int] = frozenset()) -> str | None:
    """``file:line`` of the innermost frame that is not mldbg's, torch's or MLX's own, nor
    a method of one of ``models`` (their ids): a VAE driven through ``vae.decode(z)``
    calls its ``decoder`` from its own method, and the line that matters for the code
    between two models is the pipeline's that called ``decode``."""
    skipped = _skipped()
    frame = sys._getframe(1)
    for _ in range(limit):
        if frame is None:
            return None
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(skipped) and not _method_of(frame, models):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _method_of(frame: Any, models: frozenset[int]) -> bool:
    code = frame.f_code
    if not models or not code.co_argcount or code.co_varnames[0] != "self":
        return False
    return id(frame.f_locals.get("self")) in models
