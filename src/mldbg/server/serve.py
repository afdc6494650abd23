"""``mldbg serve``: run the daemon on 127.0.0.1 until interrupted."""

from __future__ import annotations

import os
import secrets
import socket
import time

import uvicorn

from .. import __version__
from .app import create_app
from .config import remove_server_info, write_server_info
from .launcher import remove_agent_path
from .sessions import SessionManager


def serve(port: int = 0) -> None:
    """Bind first (port 0 picks a free one), then publish the URL, then serve."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without, a kept-alive client waits ~40 ms per answer
    # (Nagle on our side meets the client's delayed ACK).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    host, bound_port = sock.getsockname()
    token = secrets.token_urlsafe(32)
    manager = SessionManager()
    app = create_app(manager, token)
    url = f"http://{host}:{bound_port}"
    write_server_info(
        {
            "url": url,
            "host": host,
            "port": bound_port,
            "pid": os.getpid(),
            "token": token,
            "version": __version__,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
    )
    print(f"mldbg daemon {__version__} listening on {url} (pid {os.getpid()})", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    app.state.stop = lambda: setattr(server, "should_exit", True)
    try:
        server.run(sockets=[sock])
    finally:
        manager.shutdown()
        remove_server_info(os.getpid())
        remove_agent_path()
