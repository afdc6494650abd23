"""File identity and "is this the user's code?" for breakpoints and just-my-code stepping."""

from __future__ import annotations

import os
import sys
import sysconfig
from functools import cache

_AGENT_DIR = os.path.dirname(os.path.realpath(__file__))
_PACKAGE_DIR = os.path.dirname(_AGENT_DIR)
_EXAMPLES_DIR = os.path.join(_PACKAGE_DIR, "examples")


def canonical(path: str, cwd: str | None = None) -> str:
    """One spelling per file: ``~`` expanded, made absolute against ``cwd``, symlinks resolved.

    Breakpoints and code objects are matched on this form, so ``./model.py``,
    ``~/proj/model.py`` and a symlinked venv path all name the same file.
    """
    path = os.path.expanduser(path)
    if not os.path.isabs(path):
        path = os.path.join(cwd or os.getcwd(), path)
    return os.path.realpath(path)


@cache
def canonical_code_file(co_filename: str) -> str:
    """Canonical form of a code object's file name; cached because it sits on the hot path."""
    if co_filename.startswith("<"):
        return co_filename
    return canonical(co_filename)


def _library_roots() -> tuple[str, ...]:
    roots: set[str] = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            value = sysconfig.get_path(key)
        except KeyError:
            continue
        if value:
            roots.add(os.path.realpath(value))
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        roots.add(os.path.realpath(os.path.join(prefix, "lib")))
    return tuple(sorted(roots))


_LIBRARY_ROOTS = _library_roots()


@cache
def is_library_file(canonical_path: str) -> bool:
    """True for the standard library, installed packages and mldbg itself (not its examples).

    Editable installs live outside site-packages and count as the user's code, which is
    what someone porting their own package expects from just-my-code stepping.
    """
    if canonical_path.startswith("<"):
        return True
    if canonical_path.startswith(_PACKAGE_DIR + os.sep) and not canonical_path.startswith(
        _EXAMPLES_DIR + os.sep
    ):
        return True
    parts = canonical_path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    return any(canonical_path.startswith(root + os.sep) for root in _LIBRARY_ROOTS)


def is_mldbg_file(canonical_path: str) -> bool:
    """The agent's own code never stops, not even on a breakpoint: it runs the debugger."""
    return canonical_path.startswith(_AGENT_DIR + os.sep)
