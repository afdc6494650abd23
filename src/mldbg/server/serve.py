"""``mldbg serve``: run the daemon on 127.0.0.1 until interrupted or stopped.

Before it serves, the daemon takes the config directory's lock (one daemon per directory
for its lifetime, see ``config.py``) and recovers what a previous daemon left behind
(``live_runs.py``).  SIGTERM ends it as cleanly as SIGINT: every session is ended and its
run.json finalised before the process exits.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import time
from types import FrameType

import uvicorn

from .. import __version__, verbs
from ..errors import DAEMON_RUNNING, MldbgError
from . import live_runs
from .app import create_app
from .config import (
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
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    app.state.stop = lambda: setattr(server, "should_exit", True)

    def on_term(signum: int, frame: FrameType | None) -> None:
        # uvicorn re-raises the signal once it has stopped serving; with the default
        # handler that killed the process before the cleanup below.  Now it only asks
        # the server to stop (again), and the cleanup always runs.
        server.should_exit = True

    signal.signal(signal.SIGTERM, on_term)
    try:
        server.run(sockets=[sock])
    finally:
        manager.shutdown()
        remove_server_info(os.getpid())
        remove_agent_path()
        lock.close()
