"""JSON lines over a socket: the agent's half of the agent <-> daemon protocol.

Messages from the daemon are commands ``{"id", "cmd", "args"}``; the agent answers each
with ``{"id", "ok", "result"}`` or ``{"id", "ok": false, "error", "extra"}`` and sends
events ``{"event": ..., ...}`` unprompted (stopped, resumed, log, finished).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from typing import Any


class Wire:
    """A thread-safe line-oriented JSON connection."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("r", encoding="utf-8", newline="\n")
        self._send_lock = threading.Lock()
        self.closed = False

    @classmethod
    def connect(cls, address: str, timeout: float = 30.0) -> Wire:
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock)

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, default=str) + "\n").encode("utf-8")
        with self._send_lock:
            if self.closed:
                return
            try:
                self._sock.sendall(data)
            except OSError:
                self.closed = True

    def receive(self) -> dict[str, Any] | None:
        """The next message, or None once the daemon has gone."""
        try:
            line = self._reader.readline()
        except (OSError, ValueError):
            line = ""
        if not line:
            self.closed = True
            return None
        message = json.loads(line)
        return message if isinstance(message, dict) else None

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def reply(
    wire: Wire,
    message: dict[str, Any],
    ok: bool,
    result: Any,
    extra: dict[str, Any] | None = None,
    code: str | None = None,
) -> None:
    """Answer one command: ``result`` on success, else ``result`` is the error message."""
    answer: dict[str, Any] = {"id": message.get("id"), "ok": ok}
    if ok:
        answer["result"] = result
    else:
        answer["error"] = result
        answer["code"] = code or "agent_error"
        answer["extra"] = extra or {}
    wire.send(answer)
