"""JSON lines over a socket: the agent's half of the agent <-> daemon protocol.

Messages from the daemon are commands ``{"id", "cmd", "args"}``; the agent answers each
with ``{"id", "ok", "result"}`` or ``{"id", "ok": false, "error", "extra"}`` and sends
events ``{"event": ..., ...}`` unprompted (``protocol.EVENTS``: stopped, resumed, log, finished).

A connection opens with the session's secret (``protocol.PREAMBLE``), then the hello.
Both ends read through :class:`LineReader`, which never holds more than one bounded
message, so neither end's memory depends on what the other sends.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from ..errors import LinkError
from . import protocol as P


class LineReader:
    """Newline-terminated messages from a socket, each at most ``limit`` bytes.

    ``idle`` bounds the wait for a message to begin (None: forever, a debuggee may run
    quietly for hours) and ``partial`` the wait for the rest of a message once it began,
    so a peer that sends half a line and stalls is dropped.  Waits use ``select``, not
    the socket's timeout, which would also cut the other thread's ``sendall``.
    """

    def __init__(
        self, sock: socket.socket, limit: int, idle: float | None = None, partial: float = 120.0
    ) -> None:
        self._sock = sock
        self.limit = limit
        self.idle = idle
        self.partial = partial
        self._buffer = bytearray()
        self._scanned = 0

    def read_exact(self, size: int, timeout: float) -> bytes:
        """Exactly ``size`` bytes within ``timeout`` seconds in all (the preamble): a
        peer dripping one byte at a time is cut at the same deadline as a silent one."""
        deadline = time.monotonic() + timeout
        while len(self._buffer) < size:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise LinkError("too slow")
                self._fill(size - len(self._buffer), left)
            except LinkError:
                raise LinkError(f"fewer than {size} bytes arrived within {timeout:g} s") from None
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        self._scanned = 0
        return data

    def read_line(self, limit: int | None = None, idle: float | None = -1.0) -> bytes | None:
        """The next line without its newline; None at a clean end of the connection."""
        limit = self.limit if limit is None else limit
        wait_first = self.idle if idle == -1.0 else idle
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                if end > limit:
                    raise LinkError(f"a message of more than {limit} bytes")
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)
            if len(self._buffer) > limit:
                raise LinkError(f"a message of more than {limit} bytes")
            timeout = self.partial if self._buffer else wait_first
            try:
                self._fill(min(1 << 20, limit + 1 - len(self._buffer)), timeout)
            except EOFError:
                if self._buffer:
                    raise LinkError("the connection ended inside a message") from None
                return None

    def _fill(self, size: int, timeout: float | None) -> None:
        if timeout is not None:
            ready, _, _ = select.select([self._sock], [], [], max(0.0, timeout))
            if not ready:
                raise LinkError(f"nothing arrived within {timeout:.0f} s")
        data = self._sock.recv(max(1, size))
        if not data:
            raise EOFError
        self._buffer += data


def preamble(token: str) -> bytes:
    return P.PREAMBLE + token.encode("ascii", errors="replace") + b"\n"


class Wire:
    """A thread-safe line-oriented JSON connection."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = LineReader(sock, P.MAX_LINE)
        self._send_lock = threading.Lock()
        self.closed = False

    @classmethod
    def connect(cls, address: str, token: str, timeout: float = 30.0) -> Wire:
        """Connect to the daemon and prove we are its debuggee (the hello comes next)."""
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wire = cls(sock)
        with contextlib.suppress(OSError):
            sock.sendall(preamble(token))
        return wire

    def await_welcome(self, timeout: float) -> bool:
        """Did the daemon admit this connection (its WELCOME line within ``timeout``)?"""
        try:
            line = self._reader.read_line(limit=1024, idle=timeout)
            return line is not None and json.loads(line).get("event") == P.WELCOME
        except (OSError, ValueError, LinkError, AttributeError):
            return False

    def send(self, message: Mapping[str, object]) -> None:
        data = (json.dumps(message, default=str) + "\n").encode("utf-8")
        with self._send_lock:
            if self.closed:
                return
            try:
                self._sock.sendall(data)
            except OSError:
                self.closed = True

    def receive(self) -> dict[str, Any] | None:
        """The next message, or None once the daemon has gone (or broke the protocol)."""
        try:
            line = self._reader.read_line()
        except (OSError, ValueError, LinkError):
            line = None
        if line is None:
            self.closed = True
            return None
        try:
            message = json.loads(line)
        except ValueError:
            return {}
        return message if isinstance(message, dict) else {}

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def abandon(self) -> None:
        """In a forked child: forget the parent's socket without touching the connection.

        Closing our copy of the descriptor is harmless (the parent holds its own) and
        lets the daemon see the parent's end even while this child lives; a shutdown
        would cut the parent's link too, so it is never done here.
        """
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.close()


class Respond(Protocol):
    """:func:`reply` with its wire bound: how a paused thread answers the daemon."""

    def __call__(
        self,
        message: Mapping[str, object],
        ok: bool,
        result: object,
        extra: Mapping[str, object] | None = None,
        code: str | None = None,
        /,
    ) -> None: ...


def reply(
    wire: Wire,
    message: Mapping[str, object],
    ok: bool,
    result: object,
    extra: Mapping[str, object] | None = None,
    code: str | None = None,
) -> None:
    """Answer one command: ``result`` on success, else ``result`` is the error message."""
    answer: dict[str, object] = {"id": message.get("id"), "ok": ok}
    if ok:
        answer["result"] = result
    else:
        answer["error"] = result
        answer["code"] = code or "agent_error"
        answer["extra"] = extra or {}
    wire.send(answer)
