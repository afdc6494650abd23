"""The daemon's end of one debuggee connection: requests with replies, and events.

Each session listens on its own loopback port; the debuggee connects back and proves
it is the process we started with a one-time token.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import secrets
import socket
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ..errors import AgentError, AgentTimeout, SessionEnded, StartFailed

EventHandler = Callable[[dict[str, Any]], None]
# HTTP statuses of the agent's error codes that are not plain bad input (400)
_STATUS = {"not_paused": 409, "internal": 500}


class AgentLink:
    def __init__(self, on_event: EventHandler, on_close: Callable[[], None]) -> None:
        self._on_event = on_event
        self._on_close = on_close
        self.token = secrets.token_hex(16)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(1)
        host, port = self._listener.getsockname()
        self.address = f"{host}:{port}"
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._pending: dict[int, Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self.closed = False

    def accept(self, process: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
        """Wait for the debuggee's hello; fail fast if it dies first."""
        deadline = time.monotonic() + timeout
        self._listener.settimeout(0.1)
        try:
            while True:
                if process.poll() is not None:
                    raise StartFailed(
                        f"the script's interpreter exited (code {process.returncode}) before the "
                        "debugger connected",
                        exit_code=process.returncode,
                    )
                if time.monotonic() > deadline:
                    raise StartFailed(f"the debuggee did not connect within {timeout:.0f} s")
                try:
                    sock, _ = self._listener.accept()
                except TimeoutError:
                    continue
                sock.settimeout(10)
                hello = self._read_hello(sock)
                if hello is None:
                    sock.close()
                    continue
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sock = sock
                break
        finally:
            self._listener.close()
        threading.Thread(target=self._read_loop, name="mldbg-link", daemon=True).start()
        return hello

    def _read_hello(self, sock: socket.socket) -> dict[str, Any] | None:
        try:
            line = sock.makefile("r", encoding="utf-8").readline()
            hello = json.loads(line)
        except (OSError, ValueError):
            return None
        if not isinstance(hello, dict) or not secrets.compare_digest(
            str(hello.get("token", "")), self.token
        ):
            return None  # someone else found the port: ignore them
        return hello

    def _read_loop(self) -> None:
        assert self._sock is not None
        reader = self._sock.makefile("r", encoding="utf-8")
        try:
            for line in reader:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if "event" in message:
                    try:
                        self._on_event(message)
                    except Exception:  # a bug in handling one event must not cut the session off
                        traceback.print_exc()
                    continue
                future = self._pending.pop(message.get("id"), None)
                if future is not None:
                    future.set_result(message)
        except OSError:
            pass
        finally:
            self.closed = True
            for future in list(self._pending.values()):
                if not future.done():
                    future.set_exception(SessionEnded("the script ended before it answered"))
            self._pending.clear()
            self._on_close()

    def send(self, cmd: str, args: dict[str, Any] | None = None) -> Future[dict[str, Any]]:
        future: Future[dict[str, Any]] = Future()
        if self.closed or self._sock is None:
            future.set_exception(SessionEnded("the script is no longer running"))
            return future
        request_id = next(self._ids)
        self._pending[request_id] = future
        data = (json.dumps({"id": request_id, "cmd": cmd, "args": args or {}}) + "\n").encode()
        try:
            with self._send_lock:
                self._sock.sendall(data)
        except OSError:
            self._pending.pop(request_id, None)
            future.set_exception(SessionEnded("the script is no longer running"))
        return future

    def request(self, cmd: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        """Send a command and return its result, or raise what the agent said."""
        future = self.send(cmd, args)
        try:
            reply = future.result(timeout)
        except FutureTimeout:
            raise AgentTimeout(
                f"the script did not answer {cmd!r} within {timeout:.0f} s "
                "(a long evaluation is still running on the paused thread)"
            ) from None
        if not reply.get("ok"):
            code = str(reply.get("code") or "agent_error")
            extra = {k: v for k, v in (reply.get("extra") or {}).items() if k not in ("code",)}
            raise AgentError(
                str(reply.get("error")), code=code, status=_STATUS.get(code, 400), **extra
            )
        return reply.get("result")

    def close(self) -> None:
        self.closed = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        with contextlib.suppress(OSError):
            self._listener.close()
