"""``mldbg serve``: run the daemon on 127.0.0.1 until interrupted or stopped.

Before it serves, the daemon takes the config directory's lock (one daemon per directory
for its lifetime, see ``config.py``) and recovers what a previous daemon left behind
(``live_runs.py``).  SIGTERM ends it as cleanly as SIGINT: every session is ended and its
run.json finalised before the process exits.

A stop always ends the process, whatever its threads are doing (``Stop``): requests in
flight get ``DRAIN`` s, and a thread still busy once the sessions are ended (a compare
spinning on hostile input) is left behind, named in the log with its stack, and the
process exits; past ``config.STOP_DEADLINE`` it exits from wherever it is.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

import uvicorn

from .. import __version__, verbs
from ..errors import DAEMON_RUNNING, MldbgError
from . import live_runs
from .app import create_app
from .config import (
    STOP_BACKSTOP,
    STOP_DEADLINE,
    ServerInfo,
    acquire_daemon_lock,
    config_dir,
    package_dir,
    read_lock_info,
    remove_server_info,
    write_server_info,
)
from .launcher import remove_agent_path
from .manager import SessionManager

# Requests in flight when a stop begins get this long to answer (uvicorn's graceful
# shutdown); one still running after it (its thread busy for good) is cancelled.
DRAIN = 2
# How long threads still busy after the cleanup get before the process leaves them behind.
LAST_JOIN = 0.5


class Stop:
    """Once a stop is asked, the process is gone within ``STOP_DEADLINE`` s.

    Python waits at exit for every non-daemon thread, and uvicorn for every request in
    flight, so one thread spinning on hostile input (a compare of a capture whose parent
    links form a cycle) used to keep the daemon alive after SIGTERM and ``serve --stop``.
    ``arm`` starts the deadline (a daemon thread, and faulthandler's C watchdog a little
    later for a thread that holds the GIL in C code); ``leave`` is the normal end, after
    the cleanup: threads still busy are named, their stacks logged, and left behind.
    """

    def __init__(self, cleanup: Callable[[], None]) -> None:
        self.cleanup = cleanup
        self.armed = False
        self.requested: Callable[[], None] = lambda: None  # tells the server to stop

    def arm(self) -> None:
        """Start the deadline (idempotent; safe in a signal handler: no lock is taken)."""
        if self.armed:
            return
        self.armed = True
        with _suppress_os_errors():  # no usable stderr: the Python deadline still holds
            faulthandler.dump_traceback_later(STOP_DEADLINE + STOP_BACKSTOP, exit=True)
        threading.Thread(target=self._deadline, name="mldbg-stop-deadline", daemon=True).start()

    def request(self) -> None:
        """Arm the deadline and tell the server to stop serving."""
        self.arm()
        self.requested()

    def _deadline(self) -> None:
        time.sleep(STOP_DEADLINE)
        self._exit(f"still stopping after {STOP_DEADLINE:.0f} s")

    def leave(self) -> None:
        """The cleanup is done: exit now unless only this thread is left to finish."""
        busy = _busy_threads()
        deadline = time.monotonic() + LAST_JOIN
        for thread in busy:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in busy):
            self._exit("stopped")

    def _exit(self, why: str) -> None:
        busy = _busy_threads()
        names = ", ".join(t.name for t in busy[:10]) or "none"
        print(f"mldbg daemon {why}; {len(busy)} thread(s) still busy ({names}), left behind:")
        sys.stdout.flush()
        with _suppress_os_errors():
            faulthandler.dump_traceback(file=sys.stdout, all_threads=True)
        with _suppress_os_errors():
            self.cleanup()
        os._exit(0)


def _busy_threads() -> list[threading.Thread]:
    """Threads that would hold the interpreter's exit open: alive, not daemonic, not us."""
    here = threading.current_thread()
    return [t for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not here]


def _suppress_os_errors() -> contextlib.AbstractContextManager[None]:
    return contextlib.suppress(OSError, ValueError, RuntimeError)


def serve(port: int = 0) -> None:
    """Lock, bind (port 0 picks a free one), recover, publish the URL, then serve."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without, a kept-alive client waits ~40 ms per answer
    # (Nagle on our side meets the client's delayed ACK).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    host, bound_port = sock.getsockname()
    token = secrets.token_urlsafe(32)
    url = f"http://{host}:{bound_port}"
    info: ServerInfo = {
        "url": url,
        "host": host,
        "port": bound_port,
        "pid": os.getpid(),
        "token": token,
        "version": __version__,
        "verbs": verbs.fingerprint(),
        "package": package_dir(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    lock = acquire_daemon_lock(info)
    if lock is None:
        sock.close()
        other = read_lock_info()
        held_pid = other["pid"] if other is not None else None
        held_url = other["url"] if other is not None else None
        raise MldbgError(
            f"another mldbg daemon is running for {config_dir()} (pid "
            f"{'?' if held_pid is None else held_pid}, "
            f"{'url unknown' if held_url is None else held_url}); "
            "stop it first with: mldbg serve --stop",
            code=DAEMON_RUNNING,
            pid=held_pid,
            url=held_url,
        )
    manager = SessionManager()
    recovered = live_runs.recover()
    for record in recovered:
        manager.add_recovered(record)
    app = create_app(manager, token)
    app.state.recovered = recovered
    write_server_info(info)
    print(f"mldbg daemon {__version__} listening on {url} (pid {os.getpid()})", flush=True)
    for record in recovered:
        print(
            f"recovered session {record.get('session')!r} (pid {record.get('pid')}): "
            f"{record.get('found')}, run {record.get('run_dir')}",
            flush=True,
        )

    def cleanup() -> None:
        remove_server_info(os.getpid())
        remove_agent_path()

    stop = Stop(cleanup)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=DRAIN,
    )
    server = _Server(config, stop)
    stop.requested = lambda: setattr(server, "should_exit", True)
    app.state.arm_stop = stop.arm
    app.state.stop = stop.request

    def on_term(signum: int, frame: FrameType | None) -> None:
        # uvicorn re-raises the signal once it has stopped serving; with the default
        # handler that killed the process before the cleanup below.  Now it only asks
        # the server to stop (again), and the cleanup always runs.
        stop.request()

    signal.signal(signal.SIGTERM, on_term)
    try:
        server.run(sockets=[sock])
    finally:
        stop.arm()  # however serving ended, the rest is bounded too
        manager.shutdown()
        cleanup()
        stop.leave()
        lock.close()


class _Server(uvicorn.Server):
    """uvicorn's server, whose own SIGINT/SIGTERM handler (installed while it serves,
    in place of ours) also starts the stop's deadline."""

    def __init__(self, config: uvicorn.Config, stop: Stop) -> None:
        super().__init__(config)
        self.stop = stop

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.stop.arm()
        super().handle_exit(sig, frame)
