"""Finding a breakpoint's file when it is not where the path says: among what the script imports.

``break torch/nn/modules/linear.py:134`` or ``break linear.py:134`` names a library file
by the part of its path a person remembers.  When the path does not exist under the
session's cwd, it is looked up the way the script would find it:

1. joined to each ``sys.path`` entry, in order (the copy ``import`` would load wins);
2. as the tail of a module already imported (``sys.modules``);
3. as the tail of a file under the ``sys.path`` entries (a bounded walk).

Several different files in steps 2-3 are ambiguous: the error lists them (bounded).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

from ..errors import AMBIGUOUS_FILE, FILE_NOT_FOUND, BreakpointError

MAX_CANDIDATES = 20
MAX_WALK = 300_000  # directory entries looked at in step 3, in all
_SKIP_DIRS = frozenset({"__pycache__", "node_modules", ".git", ".hg", ".tox", ".mldbg"})


def search_roots(cwd: str | None) -> list[str]:
    roots = []
    for entry in [cwd or os.getcwd(), *sys.path]:
        path = os.path.realpath(entry or cwd or os.getcwd())
        if os.path.isdir(path) and path not in roots:
            roots.append(path)
    return roots


def find_importable(file: str, cwd: str | None, resolved: str) -> str:
    """The one file ``file`` means, or a :class:`BreakpointError` (not found / ambiguous)."""
    typed = os.path.expanduser(file)
    if os.path.isabs(typed) or not typed.strip():
        raise BreakpointError(
            f"no such file: {file} (resolved to {resolved})", code=FILE_NOT_FOUND, file=resolved
        )
    tail = os.path.normpath(typed)
    if tail.startswith(".."):
        raise BreakpointError(
            f"no such file: {file} (resolved to {resolved})", code=FILE_NOT_FOUND, file=resolved
        )
    roots = search_roots(cwd)
    for root in roots:  # 1. the copy import would load
        candidate = os.path.join(root, tail)
        if os.path.isfile(candidate):
            return os.path.realpath(candidate)
    found = _loaded_with_tail(tail)  # 2.
    if not found:
        found = _walk_for_tail(tail, roots)  # 3.
    if len(found) == 1:
        return found[0]
    if not found:
        raise BreakpointError(
            f"no such file: {file} (not under {cwd or os.getcwd()}, nor under the script's "
            f"import path: {', '.join(roots[:6])}{' ...' if len(roots) > 6 else ''})",
            code=FILE_NOT_FOUND,
            file=resolved,
        )
    shown = found[:MAX_CANDIDATES]
    more = f" (+{len(found) - len(shown)} more)" if len(found) > len(shown) else ""
    raise BreakpointError(
        f"{file} matches {len(found)} files the script can import: "
        + ", ".join(shown)
        + more
        + "; give more of the path (e.g. torch/nn/modules/linear.py) or the full path",
        code=AMBIGUOUS_FILE,
        candidates=shown,
        total=len(found),
    )


def _ends_with(path: str, tail: str) -> bool:
    return path == tail or path.endswith(os.sep + tail)


def _loaded_with_tail(tail: str) -> list[str]:
    found: list[str] = []
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if isinstance(name, str) and _ends_with(name, tail):
            real = os.path.realpath(name)
            if real not in found and os.path.isfile(real):
                found.append(real)
    return sorted(found)


def _walk_for_tail(tail: str, roots: list[str]) -> list[str]:
    base = os.path.basename(tail)
    found: list[str] = []
    budget = [MAX_WALK]
    for root in roots:
        for path in _files_named(root, base, budget):
            if _ends_with(path, tail):
                real = os.path.realpath(path)
                if real not in found:
                    found.append(real)
        if budget[0] <= 0:
            break
    return sorted(found)


def _files_named(root: str, base: str, budget: list[int]) -> Iterator[str]:
    stack = [root]
    while stack and budget[0] > 0:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        budget[0] -= len(entries)
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in _SKIP_DIRS and not entry.name.startswith("."):
                        stack.append(entry.path)
                elif entry.name == base:
                    yield entry.path
            except OSError:
                continue
