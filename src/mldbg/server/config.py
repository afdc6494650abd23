"""Where clients find the daemon: ``server.json`` in the config directory (mode 0600).

The directory is ``$MLDBG_CONFIG_DIR`` or ``~/.mldbg``; it holds the URL, pid and the
bearer token, so it is readable by its owner only.

One daemon per config directory, for its whole life: the daemon holds an exclusive
``flock`` on ``daemon.lock`` and writes its description there too.  The lock, not
server.json, is the truth: it dies with the process (SIGKILL included), so a client
that finds it held knows a daemon lives — even when server.json is missing or corrupt —
and never starts a second one beside it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import IO, TypedDict, cast

SERVER_JSON = "server.json"
DAEMON_LOCK = "daemon.lock"
# How long a daemon may take to stop once asked (SIGTERM, SIGINT, POST /v1/shutdown):
# requests in flight and its sessions get this long, then the process exits whatever its
# threads still do (``serve.py``).  ``mldbg serve --stop`` waits this long and a little
# more before it ends the process by its pid (``client/api.py``: ``stop_daemon``).
STOP_DEADLINE = 10.0
# The daemon's last resort past STOP_DEADLINE, a watchdog in C (faulthandler) that exits
# even while a thread holds the GIL in C code (a regex that backtracks for ages).
STOP_BACKSTOP = 5.0


class _DaemonAddress(TypedDict):
    url: str  # http://127.0.0.1:PORT
    token: str  # the bearer token every request carries
    pid: int


class ServerInfo(_DaemonAddress, total=False):
    """How clients find and trust the daemon: server.json, and the lock file's copy (a
    description without ``url``, ``token`` and ``pid`` is not used)."""

    host: str
    port: int
    version: str  # the mldbg that started it
    verbs: str  # verbs.fingerprint() of that mldbg
    package: str  # the directory its mldbg package was loaded from (package_dir())
    started_at: str


def package_dir() -> str:
    """Where this process's mldbg package lives.  A daemon serves only clients of the
    same installation: it launches the debuggee's agent from its own files, so a client
    of another checkout or virtualenv (or one whose files were moved or removed since the
    daemon started) would get that copy's behaviour, or an ImportError, not its own."""
    return str(Path(__file__).resolve().parent.parent)


def config_dir() -> Path:
    configured = os.environ.get("MLDBG_CONFIG_DIR")
    path = Path(configured).expanduser() if configured else Path.home() / ".mldbg"
    # Created private; an existing directory is never re-moded (it may be shared, on purpose).
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def server_file() -> Path:
    return config_dir() / SERVER_JSON


def write_server_info(info: ServerInfo) -> None:
    # Imported here: the run store module (secrets, threading...) is the daemon's; every CLI
    # command reads this config and should not pay for it.
    from ..store.runs import write_json_atomic

    path = server_file()
    old_umask = os.umask(0o077)  # the temp file is born 0600: the token is never world-readable
    try:
        write_json_atomic(path, info)
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)


def read_server_info() -> ServerInfo | None:
    try:
        with open(server_file(), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return _described(data)


def _described(data: object) -> ServerInfo | None:
    """``data`` if it describes a daemon (it has the url, token and pid), else None."""
    if isinstance(data, dict) and {"url", "token", "pid"} <= data.keys():
        return cast("ServerInfo", data)  # as the daemon wrote it
    return None


def remove_server_info(pid: int) -> None:
    """Remove server.json only if it still describes this daemon."""
    info = read_server_info()
    if info is not None and info.get("pid") == pid:
        with contextlib.suppress(OSError):
            server_file().unlink()


def lock_file() -> Path:
    return config_dir() / DAEMON_LOCK


def acquire_daemon_lock(info: ServerInfo, patience: float = 2.0) -> IO[str] | None:
    """Take the config directory's daemon lock for this process's lifetime, or None if
    another daemon holds it.  Clients probe it with brief shared locks, hence the retries.
    The returned file must stay open: closing it (or dying) releases the lock."""
    path = lock_file()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    handle = os.fdopen(fd, "r+", encoding="utf-8")
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                handle.close()
                raise
            if time.monotonic() > deadline:
                handle.close()
                return None
            time.sleep(0.05)
    os.fchmod(fd, 0o600)
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps(info))
    handle.flush()
    return handle


def daemon_lock_held() -> bool:
    """Does a daemon hold this config directory's lock (is one alive), right now?"""
    try:
        fd = os.open(lock_file(), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)  # also drops the probe's shared lock at once
    return False


def read_lock_info() -> ServerInfo | None:
    """The description the lock's holder wrote (the same as server.json's)."""
    try:
        data = json.loads(lock_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return _described(data)
