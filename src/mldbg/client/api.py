"""The one typed client of the daemon, used by the CLI, the MCP server, the demo and tests.

``Client.call(verb, session=..., **args)`` checks the arguments against the verb table
(names, session name, paths made absolute here, where the client is), builds the REST
request the table derives, and returns the verb's result (``results.py``) or raises
``DaemonError`` carrying the daemon's ``{"error", "code", ...}``.

Fast by construction: a bare-socket HTTP/1.1 exchange (``http1.py``: ``http.client``
alone would cost a CLI command ~40 ms of imports), one persistent connection per thread with ``TCP_NODELAY`` (no Nagle/delayed-ACK stall), no
health probe per call: a dead connection is reopened once, and only a daemon that is
really gone is reported (``daemon_unreachable``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .. import results as R
from .. import verbs
from ..errors import (
    BAD_ARGUMENT,
    DAEMON_BUSY,
    DAEMON_SKEW,
    DAEMON_START_FAILED,
    DAEMON_STUCK,
    DAEMON_UNREACHABLE,
    NO_DAEMON,
    DaemonError,
    MldbgError,
)
from ..names import check_session_name
from ..server.config import (
    STOP_BACKSTOP,
    STOP_DEADLINE,
    ServerInfo,
    config_dir,
    daemon_lock_held,
    lock_file,
    package_dir,
    read_lock_info,
    read_server_info,
)
from .http1 import Connection

START_TIMEOUT = 30.0
# Waits happen server-side in slices; the socket timeout leaves room for the longest one.
HTTP_TIMEOUT = 90.0
# A long wait is a loop of short server-side waits, so a client can say it is still waiting.
WAIT_SLICE = 5.0
# Errors that a daemon started by another mldbg (an older verb table) answers.
SKEW_CODES = ("no_such_route", "bad_argument")


class Client:
    """A connection to the daemon described by ``info`` (``url`` and ``token``)."""

    def __init__(self, info: ServerInfo) -> None:
        self.info = info
        parsed = urllib.parse.urlsplit(info["url"])
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 80
        self.headers = {
            "Authorization": f"Bearer {info['token']}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        self._local = threading.local()

    # -- transport ------------------------------------------------------------------------------

    def _connection(self) -> Connection:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = Connection(self.host, self.port, HTTP_TIMEOUT)  # TCP_NODELAY set
            self._local.conn = conn
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = None

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        params: Mapping[str, object] | None = None,
    ) -> Any:
        """One HTTP exchange; a stale kept-alive connection is reopened once."""
        query = {k: _query_value(v) for k, v in (params or {}).items() if v is not None}
        target = path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode("utf-8")
        for attempt in (1, 2):
            try:
                conn = self._connection()
                status, raw = conn.request(method, target, data, self.headers)
                break
            except OSError as exc:
                self._drop_connection()
                if attempt == 2:
                    raise MldbgError(
                        f"lost the daemon at {self.info['url']} ({exc}); run the command again "
                        "to restart it",
                        code=DAEMON_UNREACHABLE,
                    ) from None
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {"error": raw[:500].decode("utf-8", "replace") or f"HTTP {status}"}
        if status >= 400:
            if not isinstance(payload, dict):
                payload = {"error": str(payload)[:500]}
            payload.setdefault("code", "http_error")
            if payload["code"] in SKEW_CODES:
                self._explain_skew(payload)
            raise DaemonError(payload, status)
        return payload

    def _explain_skew(self, payload: dict[str, object]) -> None:
        """A route or argument the daemon does not know, from a daemon whose verb table is
        not this client's: say that, not only what it refused."""
        theirs = self.info.get("verbs")
        if theirs == verbs.fingerprint():
            return
        started = self.info.get("version") or "an unknown version"
        payload["daemon_skew"] = True
        payload["error"] = (
            f"{payload.get('error', '')} -- the daemon (pid {self.info.get('pid', '?')}, mldbg "
            f"{started}) was started by a different mldbg than this client's; stop it with "
            "`mldbg serve --stop` (its sessions end) and run the command again"
        )

    def close(self) -> None:
        self._drop_connection()

    # -- verbs ----------------------------------------------------------------------------------

    def call(self, verb_name: str, session: str | None = None, /, **args: object) -> Any:
        """Call a verb of the table; ``session`` for session verbs (default ``default``).
        Its answer is the verb's result type (``verb.result``).

        Positional-only, so a run-store verb's own ``session`` argument (whose store to
        read) travels in ``args`` and never collides with it.
        """
        verb = verbs.get(verb_name)
        known = {a.name for a in verb.args}
        unknown = sorted(set(args) - known)
        if unknown:
            raise MldbgError(
                f"{verb_name} takes no argument {unknown[0]!r}; it takes: "
                f"{', '.join(sorted(known)) or 'nothing'}",
                code=BAD_ARGUMENT,
                argument=unknown[0],
            )
        values = {k: v for k, v in args.items() if v is not None}
        for arg in verb.args:
            value = values.get(arg.name)
            if arg.kind == "path" and isinstance(value, str):
                values[arg.name] = _absolute(value)
            elif arg.kind == "source" and isinstance(value, str):
                values[arg.name] = source_path(value)
        if verb.scope == "session":
            name = check_session_name("default" if session is None else session)
            path = verb.path.replace("{name}", urllib.parse.quote(name, safe=""))
        else:
            path = verb.path
            if values.get("session") is not None:
                check_session_name(values["session"])
        if verb.store:
            values.setdefault("client_cwd", os.getcwd())
            if os.environ.get("MLDBG_HOME"):
                values.setdefault("client_home", os.environ["MLDBG_HOME"])
        if verb.name == "start":
            values.setdefault("cwd", os.getcwd())
        if verb.name in ("start", "line"):  # a script starts in the client's environment
            values.setdefault("base_env", dict(os.environ))
        if verb.method == "GET":
            return self.request("GET", path, params=values)
        return self.request(verb.method, path, body=values)

    def resume(
        self,
        verb_name: str,
        session: str | None,
        max_wait: float,
        still_running: Callable[[float], None] | None = None,
        /,
        **args: object,
    ) -> R.State:
        """A waiting verb (continue, step, wait) for up to ``max_wait`` s, as short calls.

        Each HTTP call waits at most ``WAIT_SLICE`` s server-side, so ``still_running
        (elapsed)`` hears about a long wait in between and the connection never idles long.
        """
        started = time.monotonic()
        data: R.State = self.call(
            verb_name, session, **args, wait=min(WAIT_SLICE, max(max_wait, 0.0))
        )
        while data.get("state") == "running":
            elapsed = time.monotonic() - started
            remaining = max_wait - elapsed
            if remaining <= 0:
                break
            if still_running is not None:
                still_running(elapsed)
            data = self.call("wait", session, wait=min(WAIT_SLICE, remaining))
        return data

    def follow(
        self,
        verb_name: str,
        max_wait: float,
        still_running: Callable[[float], None] | None = None,
        /,
        **args: object,
    ) -> R.LineStep:
        """A waiting run-store verb (``line``) for up to ``max_wait`` s: while it answers
        ``state: running``, its ``next`` call (the job it started) is made again, each
        waiting at most ``WAIT_SLICE`` s server-side."""
        started = time.monotonic()
        data: R.LineStep = self.call(verb_name, None, **args, wait=min(WAIT_SLICE, max_wait))
        while data.get("state") == "running" and "next" in data:
            elapsed = time.monotonic() - started
            remaining = max_wait - elapsed
            if remaining <= 0:
                break
            if still_running is not None:
                still_running(elapsed)
            again = data["next"]
            kept = {k: v for k, v in args.items() if k not in again["args"] and k != "wait"}
            data = self.call(
                again["verb"], None, **kept, **again["args"], wait=min(WAIT_SLICE, remaining)
            )
        return data


def first_wrong_line(
    a: str,
    b: str,
    *,
    home: str | os.PathLike[str] | None = None,
    map: str | os.PathLike[str] | None = None,  # noqa: A002 - compare's name
    budget: str | None = None,
    wait: float = 600.0,
) -> R.LineStep:
    """``mldbg line`` from Python: after compare named a module or glue code between the
    captures ``a`` (the reference) and ``b`` (the port), the daemon (started if need be)
    runs both scripts once more and names the first line of the port whose value the
    reference never computed.  Waits up to ``wait`` s; ``state: running`` past it (call
    again with its ``next``'s ``job``).  Raises ``MldbgError`` with the verb's codes."""
    values: dict[str, object] = {"a": a, "b": b, "budget": budget}
    if home is not None:
        values["home"] = os.path.abspath(os.fspath(home))
    if map is not None:
        values["map"] = os.path.abspath(os.fspath(map))
    given = {k: v for k, v in values.items() if v is not None}
    return connect().follow("line", wait, None, **given)


def _query_value(value: object) -> object:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def source_path(file: str) -> str:
    """A breakpoint's file as the client means it: made absolute where it exists here;
    otherwise sent as typed, for the debuggee to resolve against the session's cwd."""
    candidate = os.path.abspath(os.path.expanduser(file))
    return candidate if os.path.exists(candidate) else file


# -- finding (or starting) the daemon ---------------------------------------------------------


def _pid_alive(info: ServerInfo) -> bool:
    try:
        os.kill(int(info["pid"]), 0)
    except PermissionError:
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def _healthy(info: ServerInfo, timeout: float = 3.0) -> bool:
    if not _pid_alive(info):
        return False
    try:
        client = Client(info)
        conn = Connection(client.host, client.port, timeout)
        try:
            status, _ = conn.request("GET", "/v1/health", None, client.headers)
        finally:
            conn.close()
        return status == 200
    except (OSError, KeyError, ValueError):
        return False


def _find_daemon() -> ServerInfo | None:
    """The live daemon's description, or None if there is none.

    The daemon's lock (``config.daemon_lock_held``) says whether one lives, and the
    description its holder wrote there is the truth: server.json is only a copy, which
    may be missing, corrupt or stale (another daemon's, or naming a URL nobody listens
    on).  Without a readable lock description, server.json's is used.  A server.json whose
    pid is alive but that no lock backs is a daemon from before the lock existed: still
    used, never replaced.
    """
    info = read_server_info()
    if daemon_lock_held():
        return read_lock_info() or info
    if info is not None and _pid_alive(info) and not lock_file().exists():
        return info
    return None


def _wait_for_daemon(patience: float) -> ServerInfo | None:
    """A daemon holds the lock but cannot be found yet (it is starting): wait for it."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        info = _find_daemon()
        if info is not None:
            return info
        if not daemon_lock_held():
            return None
        time.sleep(0.05)
    raise MldbgError(
        f"an mldbg daemon holds {lock_file()} but has not said where it listens after "
        f"{patience:.0f} s; it is busy or stuck. Not starting a second one: try again, or "
        "stop it (mldbg serve --stop, or kill the process holding the lock)",
        code=DAEMON_BUSY,
        lock=str(lock_file()),
    )


def connect(autostart: bool = True, any_mldbg: bool = False) -> Client:
    """The running daemon, starting one (once, under a lock) if there is none.

    A daemon that lives (it holds its lock) is never replaced: a busy one is waited for,
    so its sessions are never stranded behind a second daemon.  One started by another
    mldbg (another verb table, or another installation: :func:`same_mldbg`) is replaced
    when idle, refused when it runs sessions, unless ``any_mldbg`` (``serve --stop`` must
    reach whichever daemon runs).
    """
    info = _find_daemon() or (_wait_for_daemon(START_TIMEOUT) if daemon_lock_held() else None)
    if info is not None and not any_mldbg and not same_mldbg(info):
        _retire(info)  # started by another mldbg: replaced if idle, else an error says so
        info = None
    if info is not None:
        return Client(info)
    if not autostart:
        raise MldbgError("no mldbg daemon is running; start one with: mldbg serve", code=NO_DAEMON)
    directory = config_dir()
    with open(directory / "server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two clients at once start one daemon, not two
        info = _find_daemon() or (_wait_for_daemon(START_TIMEOUT) if daemon_lock_held() else None)
        if info is not None:
            return Client(info)
        return Client(_start_daemon(directory))


def same_mldbg(info: ServerInfo) -> bool:
    """Was this daemon started by this very mldbg: the same verb table and protocol
    (``verbs.fingerprint``) loaded from the same package directory (``package_dir``)?"""
    return info.get("verbs") == verbs.fingerprint() and info.get("package") == package_dir()


def _retire(info: ServerInfo) -> None:
    """Stop a daemon started by another mldbg (see ``verbs.fingerprint``) if none of its
    sessions is live; with live sessions, refuse rather than strand them."""
    stale = Client(info)
    try:
        listed = stale.request("GET", "/v1/sessions")
    except MldbgError:
        listed = {}
    sessions = listed.get("sessions", []) if isinstance(listed, dict) else []
    live = [
        str(s.get("session") or s.get("name"))
        for s in sessions
        if isinstance(s, dict) and s.get("state") not in ("exited", "crashed")
    ]
    where = (
        f"the mldbg daemon (pid {info.get('pid', '?')}, mldbg {info.get('version', '?')}, "
        f"started {info.get('started_at', '?')}, from {info.get('package', 'an unknown place')}) "
        f"was started by a different mldbg than this one ({package_dir()})"
    )
    if live:
        raise MldbgError(
            f"{where} and still runs sessions {', '.join(live[:10])}: finish them with the "
            "mldbg that started them, or end them all with `mldbg serve --stop`",
            code=DAEMON_SKEW,
            sessions=live[:10],
        )
    with contextlib.suppress(MldbgError):
        stale.request("POST", "/v1/shutdown")
    stale.close()
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline and (_pid_alive(info) or daemon_lock_held()):
        time.sleep(0.05)
    print(f"mldbg: {where}; it had no live session and was replaced", file=sys.stderr)


# -- stopping the daemon -------------------------------------------------------------------

# How long `serve --stop` waits for the daemon to end itself before it ends the process by
# its pid: the daemon's own deadline, its C watchdog's, and a margin for a loaded machine.
STOP_PATIENCE = STOP_DEADLINE + STOP_BACKSTOP + 5.0
KILL_PATIENCE = 10.0  # after SIGKILL: only the kernel is left to act


def stop_daemon() -> R.DaemonStopped:
    """Stop the running daemon, and say "stopped" only once its process is gone.

    It is asked over HTTP (``POST /v1/shutdown``), or with SIGTERM when it does not
    answer, and ends itself within ``STOP_DEADLINE`` s whatever its threads do.  One that
    cannot (a thread holding the GIL in C code: nothing of the daemon's Python runs) is
    ended with SIGKILL past ``STOP_PATIENCE``, only while it still holds its lock (the pid
    is still that daemon's); its debuggees notice and end themselves (``live_runs.py``).
    ``NO_DAEMON`` when none runs; ``DAEMON_STUCK`` when the process outlives even that.
    """
    client = connect(autostart=False, any_mldbg=True)
    info = client.info
    pid = int(info["pid"])
    started = time.monotonic()
    try:
        asked = _healthy(info) and _ask_to_stop(client)
    finally:
        client.close()
    if not asked:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)  # the same clean stop, through its signal handler
    forced = None
    if not _wait_gone(pid, started + STOP_PATIENCE):
        if _holds_the_lock(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                forced = "SIGKILL"
        if not _wait_gone(pid, time.monotonic() + KILL_PATIENCE):
            raise MldbgError(
                f"the mldbg daemon (pid {pid}) is still running {time.monotonic() - started:.0f}"
                " s after it was asked to stop; end it with: kill -9 "
                f"{pid}",
                code=DAEMON_STUCK,
                pid=pid,
            )
    return {"stopped": True, "running": False, "pid": pid, "forced": forced}


def _ask_to_stop(client: Client) -> bool:
    """POST /v1/shutdown on a connection of its own, bounded in time: True once asked
    (an answer, or a connection the stopping daemon dropped mid-answer)."""
    conn = None
    try:
        conn = Connection(client.host, client.port, STOP_PATIENCE)
        status, _ = conn.request("POST", "/v1/shutdown", b"{}", client.headers)
    except TimeoutError:
        return False  # it never answered: the signal asks it again
    except OSError:
        return True  # it closed the connection: it is stopping
    finally:
        if conn is not None:
            conn.close()
    return status == 200


def _gone(pid: int) -> bool:
    """Has process ``pid`` ended?  A zombie (ended, not yet reaped by its parent) has."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[:1] == ["Z"]
    except FileNotFoundError:
        return True
    except OSError:  # no /proc (macOS)
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _wait_gone(pid: int, deadline: float) -> bool:
    while not _gone(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _holds_the_lock(pid: int) -> bool:
    """Is ``pid`` still the daemon of this config directory (never kill a reused pid)?"""
    held = read_lock_info() if daemon_lock_held() else None
    return held is not None and held.get("pid") == pid


def _start_daemon(directory: Path) -> ServerInfo:
    import subprocess  # only here: a command that finds the daemon running never pays for it

    log_path = directory / "server.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "mldbg", "serve"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(directory),
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        info = read_server_info()
        if info is not None and info.get("pid") == process.pid and _healthy(info):
            return info
        if process.poll() is not None:
            # it lost the race for the lock to a daemon started by hand: use that one
            other = _find_daemon() if daemon_lock_held() else None
            if other is not None:
                return other
            break
        time.sleep(0.05)
    raise MldbgError(
        f"the mldbg daemon did not start (see {log_path})",
        code=DAEMON_START_FAILED,
        log=str(log_path),
    )
