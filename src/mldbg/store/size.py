"""The storage guard: how much the whole mldbg home holds, and when that is too much.

Runs, captures and saved tensors all live under ``MLDBG_HOME``; a guard that counted only
``tensors/`` let captures fill a disk unnoticed.  So the warning size (default 1 GB) and
the refusal size (default 10 GB) apply to the whole home, and every message names the
commands that free space.  Standard library only: ``debug_save`` runs inside the user's
script.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from ..errors import BAD_ARGUMENT, MldbgError, StoreFull
from .runs import mldbg_home

WARN_GB = 1.0
MAX_GB = 10.0
# The store-wide names first; the tensor-store names of the first release still work.
WARN_VARIABLES = ("MLDBG_STORE_WARN_GB", "MLDBG_TENSORS_WARN_GB")
MAX_VARIABLES = ("MLDBG_STORE_MAX_GB", "MLDBG_TENSORS_MAX_GB")


class StoreUsage(TypedDict):
    home: str
    total_bytes: int
    runs_bytes: int
    tensors_bytes: int
    other_bytes: int
    warn_bytes: int
    limit_bytes: int
    over_warning: bool
    over_limit: bool


def _tree_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed while we walked: it no longer counts
                continue
    return total


def _limit(
    variables: tuple[str, ...], default_gb: float, env: Mapping[str, str] | None = None
) -> int:
    for variable in variables:
        raw = (os.environ if env is None else env).get(variable)
        if not raw:
            continue
        try:
            value = float(raw)
        except ValueError:
            raise MldbgError(
                f"{variable}={raw!r} is not a number of gigabytes", code=BAD_ARGUMENT
            ) from None
        if value < 0 or value != value:
            raise MldbgError(f"{variable}={raw!r} must be 0 or more", code=BAD_ARGUMENT)
        return int(value * 1e9)
    return int(default_gb * 1e9)


def warn_bytes(env: Mapping[str, str] | None = None) -> int:
    return _limit(WARN_VARIABLES, WARN_GB, env)


def limit_bytes(env: Mapping[str, str] | None = None) -> int:
    return _limit(MAX_VARIABLES, MAX_GB, env)


def usage(home: Path | None = None, env: Mapping[str, str] | None = None) -> StoreUsage:
    """Bytes under the home, split into runs (captures included), tensors and the rest.

    ``env``: whose limits apply (the daemon checks a start against its client's
    environment, not its own); default this process's.
    """
    home = home or mldbg_home()
    total = _tree_size(home) if home.is_dir() else 0
    runs = _tree_size(home / "runs") if (home / "runs").is_dir() else 0
    tensors = _tree_size(home / "tensors") if (home / "tensors").is_dir() else 0
    warn, limit = warn_bytes(env), limit_bytes(env)
    return {
        "home": str(home),
        "total_bytes": total,
        "runs_bytes": runs,
        "tensors_bytes": tensors,
        "other_bytes": max(0, total - runs - tensors),
        "warn_bytes": warn,
        "limit_bytes": limit,
        "over_warning": total > warn,
        "over_limit": total > limit,
    }


def free_space_hint(home: Path) -> str:
    """The commands that free space, run from the directory that holds the home."""
    return (
        f"free space with `mldbg clean --keep 5` (old runs and their captures) and "
        f"`mldbg tensors clear --yes` (saved tensors), run from {home.parent} "
        f"(or with MLDBG_HOME={home})"
    )


def _gb(n: int | float) -> str:
    return f"{n / 1e9:.2f} GB"


def warning(home: Path | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """A one-line warning when the home is past the warning size, else None.

    ``mldbg start`` prints it at start-up, so the store never fills a disk silently.
    """
    home = home or mldbg_home()
    info = usage(home, env)
    if not info["over_warning"]:
        return None
    return (
        f"the mldbg store {home} holds {_gb(info['total_bytes'])} "
        f"(runs {_gb(info['runs_bytes'])}, tensors {_gb(info['tensors_bytes'])}); "
        f"saves are refused past {_gb(info['limit_bytes'])}; {free_space_hint(home)}"
    )


def check(incoming: int, home: Path | None = None) -> str | None:
    """Refuse (:class:`StoreFull`) when ``incoming`` more bytes would pass the limit.

    Returns the warning text when the home would be past the warning size, else None.
    """
    home = home or mldbg_home()
    info = usage(home)
    after = info["total_bytes"] + incoming
    if after > info["limit_bytes"]:
        raise StoreFull(
            f"the mldbg store {home} holds {_gb(info['total_bytes'])}; saving "
            f"{_gb(incoming)} more would pass its limit of {_gb(info['limit_bytes'])} "
            f"(MLDBG_STORE_MAX_GB); {free_space_hint(home)}",
            size_bytes=info["total_bytes"],
            limit_bytes=info["limit_bytes"],
        )
    if after > info["warn_bytes"]:
        return f"the mldbg store {home} holds {_gb(after)}; {free_space_hint(home)}"
    return None


def check_start(home: Path, env: Mapping[str, str] | None = None) -> None:
    """Refuse to start a run in a home already past its limit (:class:`StoreFull`).

    Saves were refused there but a start was not, and every start writes a run directory
    (and a capture inside it can write gigabytes): the guard must hold at the door too.
    """
    info = usage(home, env)
    if info["over_limit"]:
        raise StoreFull(
            f"the mldbg store {home} holds {_gb(info['total_bytes'])}, past its limit of "
            f"{_gb(info['limit_bytes'])} (MLDBG_STORE_MAX_GB): not starting a run there; "
            f"{free_space_hint(home)}",
            size_bytes=info["total_bytes"],
            limit_bytes=info["limit_bytes"],
        )
