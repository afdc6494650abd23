"""The run store: one directory per run under ``MLDBG_HOME/runs``.

Standard library only: the daemon writes here for debug sessions, and a plain
``python script.py`` that calls ``debug_checkpoint`` writes here too.  Every write is
either append-and-flush (``*.jsonl``) or write-then-rename (``*.json``), so a kill at
any moment leaves every earlier record readable.  Nothing here ever deletes a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RUN_JSON = "run.json"
OUTPUT_LOG = "output.log"
EVENTS = "events.jsonl"
CHECKPOINTS = "checkpoints.jsonl"


def mldbg_home(
    cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Path:
    """Where runs and tensors live: ``$MLDBG_HOME`` or ``<cwd>/.mldbg``.

    Both come from the client that started the work, not from the daemon, so that a
    run lands beside the code it belongs to.
    """
    env = os.environ if env is None else env
    base = Path(cwd) if cwd is not None else Path.cwd()
    configured = env.get("MLDBG_HOME")
    if configured:
        return (base / Path(configured).expanduser()).resolve()
    return (base / ".mldbg").resolve()


def make_run_id(stem: str, pid: int, when: float | None = None) -> str:
    """``<script-stem>-<YYYYmmdd-HHMMSS>-<pid>``; the stem is made filesystem-safe."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("._") or "run"
    stamp = time.strftime(
        "%Y%m%d-%H%M%S", time.localtime(when if when is not None else time.time())
    )
    return f"{safe}-{stamp}-{pid}"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON beside the target and rename it into place: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, default=str)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class JsonlWriter:
    """Appends one JSON object per line and flushes each at once (crash-safe log)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the run

    def append(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, default=str, allow_nan=False, ensure_ascii=False)
        with self._lock:
            if self._fh.closed:
                self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            self._fh.write(line + "\n")
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            self._fh.close()


class RunDir:
    """One run's directory and its writers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._meta_lock = threading.Lock()

    @property
    def run_id(self) -> str:
        return self.path.name

    def file(self, name: str) -> Path:
        return self.path / name

    def read_meta(self) -> dict[str, Any]:
        try:
            with open(self.file(RUN_JSON), encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def update_meta(self, **fields: Any) -> dict[str, Any]:
        """Merge fields into run.json (write-then-rename, so it is always whole)."""
        with self._meta_lock:
            meta = self.read_meta()
            meta.update(fields)
            write_json_atomic(self.file(RUN_JSON), meta)
            return meta


def runs_root(home: Path) -> Path:
    return home / "runs"


def reserve_run_dir(home: Path) -> RunDir:
    """A run directory under a temporary name, for output captured before the pid is known.

    The daemon must open ``output.log`` before it spawns the script, but the run id
    contains the script's pid; :func:`finalize_run_dir` renames it once the pid exists.
    """
    root = runs_root(home)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f".starting-{os.getpid()}-{secrets.token_hex(4)}"
    path.mkdir()
    return RunDir(path)


def finalize_run_dir(run: RunDir, stem: str, pid: int) -> RunDir:
    """Give a reserved run its real id and point ``latest`` at it.

    Open files inside keep working across the rename (POSIX semantics).
    """
    root = run.path.parent
    run_id = make_run_id(stem, pid)
    target = root / run_id
    suffix = 1
    while target.exists():
        suffix += 1
        target = root / f"{run_id}.{suffix}"
    os.replace(run.path, target)
    final = RunDir(target)
    point_latest(root.parent, final)
    return final


def create_run_dir(home: Path, stem: str, pid: int) -> RunDir:
    """Create a run directory directly (the in-process path, where the pid is known)."""
    return finalize_run_dir(reserve_run_dir(home), stem, pid)


def point_latest(home: Path, run: RunDir) -> None:
    """Atomically repoint ``home/latest`` at ``run`` (a relative symlink)."""
    link = home / "latest"
    tmp = home / f".latest.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        os.symlink(os.path.relpath(run.path, home), tmp)
        os.replace(tmp, link)
    except OSError:
        # Filesystems without symlinks still get a usable run store; only the shortcut is missing.
        with contextlib.suppress(OSError):
            tmp.unlink()
