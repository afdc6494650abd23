"""The run store: one directory per run under ``MLDBG_HOME/runs``.

Standard library only: the daemon writes here for debug sessions, and a plain
``python script.py`` that calls ``debug_checkpoint`` writes here too.  Every write is
either append-and-flush (``*.jsonl``) or write-then-rename (``*.json``), so a kill at
any moment leaves every earlier record readable.  Nothing here ever deletes a run.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from ..errors import AMBIGUOUS_RUN, NO_RUNS, UNKNOWN_RUN
from . import reading

if TYPE_CHECKING:  # the agent imports this module: standard library only at run time
    # named imports: ``from .. import results`` here makes mypy misread mldbg/__init__'s
    # ``replay`` as defined twice
    from ..results import Cleaned as _Cleaned
    from ..results import RunMeta, RunRecord

RUN_JSON = "run.json"
OUTPUT_LOG = "output.log"
EVENTS = "events.jsonl"
CHECKPOINTS = "checkpoints.jsonl"
# The run store is private, like the token: eval results and output can hold secrets.
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and any missing parents 0700, whatever the umask.

    Only directories made here are given a mode: an existing one is never re-moded (it
    may be shared on purpose, and re-moding a shared directory as root breaks others).
    """
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIR)
        except FileExistsError:
            continue  # made by someone else meanwhile: theirs, not ours to re-mode
        os.chmod(directory, PRIVATE_DIR)


def open_private(path: Path, flags: int) -> int:
    """``os.open`` for a run file: created 0600 whatever the umask; returns the descriptor."""
    fd = os.open(path, flags | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        if os.fstat(fd).st_mode & 0o777 != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)
    except OSError:
        os.close(fd)
        raise
    return fd


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


def write_json_atomic(path: Path, data: object, reserve: int = 0) -> None:
    """Write JSON beside the target and rename it into place: readers never see half a file.

    ``reserve`` bytes of trailing spaces (valid JSON whitespace) keep room in the file for
    a later :func:`rewrite_in_place` when the disk is full.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with open(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, default=str)
            fh.write("\n")
            if reserve:
                fh.write(" " * reserve + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: leave no half-written temp file behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# run.json keeps this much room: the final update (state, exit, a bounded exception and
# output tail) fits in it even when the disk is full, so a run is finalised regardless.
META_RESERVE = 24_576


def rewrite_in_place(path: Path, data: object) -> bool:
    """Overwrite ``path`` within its current size (no new blocks needed on a full disk).

    The last resort when the atomic write fails for want of space: not atomic (a crash in
    the middle leaves a torn file), so it is used only then.  False if ``data`` is larger.
    """
    encoded = (json.dumps(data, indent=2, default=str) + "\n").encode("utf-8", "backslashreplace")
    try:
        with open(path, "r+b") as fh:
            size = os.fstat(fh.fileno()).st_size
            if len(encoded) > size:
                return False
            fh.write(encoded + b" " * (size - len(encoded)))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        return False
    return True


class JsonlWriter:
    """Appends one JSON object per line, each written through at once (crash-safe log).

    Unbuffered, straight to the descriptor: a write that fails (a full disk) raises at
    once and leaves nothing queued to fail again at close.  A line cut short by the disk
    filling is ended before the next one, so only that line is lost, never its successor.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = self._open()
        self._torn = False  # the last write was cut short: start the next on a new line

    def append(self, record: Mapping[str, object]) -> None:
        line = json.dumps(record, default=str, allow_nan=False, ensure_ascii=False)
        # A lone surrogate (undecodable bytes in a file name, say) is written as its JSON
        # escape, ``\udcff``: the line stays valid JSON and reads back the same string.
        data = (line + "\n").encode("utf-8", "backslashreplace")
        with self._lock:
            if self._fd is None:
                self._fd = self._open()
            if self._torn:
                data = b"\n" + data
            view = memoryview(data)
            while view:
                try:
                    written = os.write(self._fd, view)
                except OSError:
                    self._torn = len(view) < len(data)
                    raise
                view = view[written:]
            self._torn = False

    def _open(self) -> int:
        return open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None


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

    def read_meta(self) -> RunMeta:
        """run.json as the processes of the run wrote it ({} when absent or unreadable)."""
        try:
            data = reading.read_json(self.file(RUN_JSON))
        except (OSError, ValueError):
            return {}
        return cast("RunMeta", data) if isinstance(data, dict) else {}

    def update_meta(self, **fields: object) -> RunMeta:
        """Merge fields (those of ``results.RunMeta``) into run.json (write-then-rename, so
        it is always whole; on a full disk, rewritten in place within the room kept for
        that)."""
        with self._meta_lock:
            meta = cast("RunMeta", {**self.read_meta(), **fields})
            path = self.file(RUN_JSON)
            try:
                write_json_atomic(path, meta, reserve=META_RESERVE)
            except OSError as exc:
                if exc.errno not in FULL_DISK:
                    raise
                try:  # the room itself may be what does not fit (a small file-size limit)
                    write_json_atomic(path, meta)
                except OSError as again:
                    if again.errno not in FULL_DISK or not rewrite_in_place(path, meta):
                        raise
            return meta


def runs_root(home: Path) -> Path:
    return home / "runs"


def ignore_in_git(home: Path) -> None:
    """Give the store a ``.gitignore`` holding ``*`` (itself included): a ``./.mldbg``
    inside a repository is runs, captures and tensors, and one ``git add -A`` would commit
    them.  Written once, never overwritten (a user's own rules win); a failure to write it
    never fails the run."""
    path = home / ".gitignore"
    if path.exists():
        return
    with contextlib.suppress(OSError):
        fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)  # as every store file
        with os.fdopen(fd, "w") as fh:
            fh.write("# written by mldbg: this directory is its run store, never source\n*\n")


def reserve_run_dir(home: Path) -> RunDir:
    """A run directory under a temporary name, for output captured before the pid is known.

    The daemon must open ``output.log`` before it spawns the script, but the run id
    contains the script's pid; :func:`finalize_run_dir` renames it once the pid exists.
    """
    root = runs_root(home)
    make_private_dirs(root)
    ignore_in_git(home)
    path = root / f".starting-{os.getpid()}-{secrets.token_hex(4)}"
    os.mkdir(path, PRIVATE_DIR)
    os.chmod(path, PRIVATE_DIR)
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


# -- reading the store ----------------------------------------------------------------------


def run_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def is_dir(path: Path) -> bool:
    """Is ``path`` a directory?  A path that cannot name one (a part longer than the
    system allows, a loop of links) is not: on 3.10/3.11 ``Path.is_dir`` raised for it, and
    a run-store verb given a 4,096-character ``home`` answered an error, not "no runs"."""
    return os.path.isdir(path)


def list_runs(home: Path) -> list[RunDir]:
    """Runs, oldest first (by start time in the id's order of creation on disk)."""
    root = runs_root(home)
    if not is_dir(root):
        return []
    runs = [RunDir(p) for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return sorted(
        runs,
        key=lambda r: (
            r.file(RUN_JSON).stat().st_mtime if r.file(RUN_JSON).exists() else 0,
            r.run_id,
        ),
    )


# The variables through which ``start`` hands the debuggee mldbg's own settings (a
# capture's, the line step's).  A run started again with other settings drops them: the
# new start puts its own there.
SETTINGS_ENV = ("MLDBG_CAPTURE", "MLDBG_LINES")


def started_as(run: Path) -> dict[str, object] | None:
    """How a run's script was started, as ``start`` takes it to run it again: ``script``
    or ``module``, its ``args``, ``cwd``, ``python`` and the variables ``start`` added
    (``env``), from its ``run.json``; None when the run does not say which script it ran
    (a capture made by a script run without mldbg's ``start``).  The one reading of that
    fact: the line step's re-runs and compare's hints both start from it."""
    try:
        meta = reading.read_json(run / RUN_JSON)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    script, module, argv = meta.get("script"), meta.get("module"), meta.get("argv")
    if not (isinstance(script, str) or isinstance(module, str)) or not isinstance(argv, list):
        return None
    found: dict[str, object] = {"module": module} if isinstance(module, str) else {"script": script}
    # argv is what python was given: the script then its arguments, or -m MODULE then its
    found["args"] = [str(a) for a in argv[2 if isinstance(module, str) else 1 :] if a is not None]
    for key in ("cwd", "python"):
        if isinstance(meta.get(key), str):
            found[key] = meta[key]
    env = meta.get("env")
    found["env"] = {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
    return found


def describe_run(run: RunDir) -> RunRecord:
    meta = run.read_meta()
    return {
        "run_id": run.run_id,
        "path": str(run.path),
        "state": meta.get("state"),
        "script": meta.get("script") or meta.get("module"),
        "started_at": meta.get("started_at"),
        "ended_at": meta.get("ended_at"),
        "exit_code": meta.get("exit_code"),
        "signal": meta.get("signal"),
        "size_bytes": run_size(run.path),
        "checkpoints": count_lines(run.file(CHECKPOINTS)),
    }


def count_lines(path: Path) -> int:
    try:
        with reading.open_regular(path) as fh:  # a FIFO or /dev/zero would never end
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except OSError:
        return 0


def resolve_run(home: Path, spec: str | None) -> RunDir:
    """A run from ``latest`` (the default), a run id (or a unique prefix of one), or a directory."""
    from difflib import get_close_matches

    from ..errors import MldbgError

    if spec in (None, "", "latest"):
        link = home / "latest"
        if os.path.exists(link):  # (not Path.exists: it raises for too long a name)
            return RunDir(link.resolve())
        runs = list_runs(home)
        if not runs:
            raise MldbgError(
                f"no runs under {home}; run a script with mldbg or debug_checkpoint first",
                code=NO_RUNS,
            )
        return runs[-1]
    assert spec is not None
    as_path = Path(spec).expanduser()
    if is_dir(as_path):
        return RunDir(as_path.resolve())
    root = runs_root(home)
    exact = root / spec
    if is_dir(exact):
        return RunDir(exact)
    ids = [r.run_id for r in list_runs(home)]
    matches = [i for i in ids if i.startswith(spec)]
    if len(matches) == 1:
        return RunDir(root / matches[0])
    if len(matches) > 1:
        raise MldbgError(
            f"run {spec!r} is ambiguous: {', '.join(matches[:10])}",
            code=AMBIGUOUS_RUN,
            runs=matches,
        )
    close = get_close_matches(spec, ids, n=5, cutoff=0.3)
    hint = (
        f"; did you mean: {', '.join(close)}"
        if close
        else ("; `mldbg runs` lists them" if ids else "")
    )
    raise MldbgError(f"no run {spec!r} under {root}{hint}", code=UNKNOWN_RUN, runs=close)


# One line of a JSON-lines file (events, checkpoints, a capture's index): a JSON object,
# its fields unchecked until its reader checks them.
JsonRecord: TypeAlias = "dict[str, Any]"


def iter_jsonl(path: Path) -> Iterator[JsonRecord | None]:
    """Each record of a JSON-lines file, one line at a time (a run's 100k checkpoint
    records never sit in memory at once), or None for a line that cannot be read (a kill
    can cut the last one short; a line past ``reading.MAX_LINE_BYTES`` or nested too deep
    to parse); nothing for a file that is not there.  A FIFO or device in its place is
    ``reading.NotARegularFile`` (an ``OSError``), never a read that blocks or never ends."""
    for _number, record in numbered_jsonl(path):
        yield record


def numbered_jsonl(path: Path) -> Iterator[tuple[int, JsonRecord | None]]:
    """``iter_jsonl``, each record with its line number (from 1), for errors that name it."""
    for number, line in reading.numbered_lines(path):
        if line is None:
            yield number, None
            continue
        try:
            record = reading.loads(line.decode("utf-8", errors="replace"))
        except ValueError:
            yield number, None
            continue
        yield number, record if isinstance(record, dict) else None


LIVE_STATES = ("starting", "running", "paused")


def _alive(pid: object) -> bool:
    if not isinstance(pid, int | str):  # run.json as written holds an int
        return False
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def clean_runs(home: Path, keep: int, dry_run: bool = False) -> _Cleaned:
    """Remove all but the newest ``keep`` runs; a run whose process still lives is kept."""
    import shutil

    if keep < 0:
        raise ValueError("--keep must be 0 or more")
    runs = list_runs(home)
    old = runs[: max(0, len(runs) - keep)]
    removed, kept_live, freed = [], [], 0
    for run in old:
        meta = run.read_meta()
        if meta.get("state") in LIVE_STATES and _alive(meta.get("pid")):
            kept_live.append(run.run_id)
            continue
        freed += run_size(run.path)
        removed.append(run.run_id)
        if not dry_run:
            shutil.rmtree(run.path, ignore_errors=True)
    latest = home / "latest"
    if not dry_run and latest.is_symlink() and not latest.exists():
        remaining = list_runs(home)
        if remaining:
            point_latest(home, remaining[-1])
        else:
            latest.unlink()
    return {"removed": removed, "kept_live": kept_live, "freed_bytes": freed, "dry_run": dry_run}
