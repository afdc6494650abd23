"""The daemon's end of the debuggee connections: who may connect, and what they may send.

Each session listens on its own loopback port for its whole life: the script connects
back first, then every child process it starts (forked workers, spawned pools, python
subprocesses, torchrun ranks) opens its own connection.  Anyone on the machine can
reach a loopback port, so a connection is trusted only after its first fixed-size bytes
carry the session's secret (``protocol.PREAMBLE``); until then nothing else is read.
Every read is bounded in size (the hello, each later message) and in time (the
handshake, the rest of a message once it began); a stranger, a flood or a silent
connection is dropped and logged, and handshakes run on their own short-lived threads
(at most ``MAX_HANDSHAKES`` at once *per local user*: a stranger flooding the port fills
only its own slots, never those of the script's children), so none of them delays the
start.  A child asks to be told it was admitted (``protocol.WELCOME``) and tries again
when it was not.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import secrets
import socket
import threading
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar, cast

from ..agent import protocol as P
from ..agent.wire import LineReader, LinkError
from ..errors import AgentError, AgentTimeout, SessionEnded

EventHandler = Callable[[dict[str, Any]], None]
A = TypeVar("A", bound=Mapping[str, object])  # a command's arguments (``protocol.AgentCommand``)
R_ = TypeVar("R_")  # its result
# HTTP statuses of the agent's error codes that are not plain bad input (400)
_STATUS = {"not_paused": 409, "internal": 500}
HANDSHAKE_TIMEOUT = 5.0  # the secret and the hello must both arrive within this
MAX_HANDSHAKES = 64  # connections still proving themselves; more are closed at once
MESSAGE_DEADLINE = 120.0  # once a message began, the rest must follow within this

log = logging.getLogger("mldbg.agent_link")


class AgentListener:
    """The session's loopback port: authenticates each connection, hands on the good ones.

    ``on_connection(link)`` runs on the handshake thread for every connection that
    proved the secret and sent a well-formed hello; it starts the link's reader when it
    has decided what the connection is (the script, or one of its children).
    """

    def __init__(self, on_connection: Callable[[AgentLink], None], label: str = "") -> None:
        self._on_connection = on_connection
        self.label = label
        self.token = secrets.token_hex(P.TOKEN_BYTES)
        self._expected = P.PREAMBLE + self.token.encode("ascii") + b"\n"
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        host, port = self._listener.getsockname()
        self.address = f"{host}:{port}"
        # handshake slots per local user: a stranger's flood fills only its own
        self._slots: dict[int | None, threading.BoundedSemaphore] = {}
        self._slots_lock = threading.Lock()
        self.closed = False
        self.rejected = 0  # connections dropped: strangers, floods, silence (tests read it)
        self.proving = 0  # connections in their handshake now (tests read it)
        self.accept_thread = threading.Thread(
            target=self._accept_loop, name=f"mldbg-listen-{label}", daemon=True
        )
        self.accept_thread.start()

    def _accept_loop(self) -> None:
        while not self.closed:
            try:
                sock, peer = self._listener.accept()
            except OSError:
                if self.closed:
                    return
                continue
            slots = self._slots_of(peer_uid(sock))
            if not slots.acquire(blocking=False):
                self.rejected += 1
                log.warning("%s: too many connections proving themselves; dropped %s", self, peer)
                _drop(sock)
                continue
            self.proving += 1
            threading.Thread(
                target=self._handshake,
                args=(sock, peer, slots),
                name="mldbg-handshake",
                daemon=True,
            ).start()

    def _slots_of(self, uid: int | None) -> threading.BoundedSemaphore:
        """The handshake slots of one local user (``None``: the owner is unknown)."""
        with self._slots_lock:
            slots = self._slots.get(uid)
            if slots is None:
                slots = self._slots[uid] = threading.BoundedSemaphore(MAX_HANDSHAKES)
            return slots

    def _handshake(
        self, sock: socket.socket, peer: object, slots: threading.BoundedSemaphore
    ) -> None:
        try:
            reader = LineReader(sock, P.MAX_LINE, idle=None, partial=MESSAGE_DEADLINE)
            try:
                # a blocking recv inside read_exact is bounded by select's deadline
                first = reader.read_exact(P.PREAMBLE_SIZE, HANDSHAKE_TIMEOUT)
                if not secrets.compare_digest(first, self._expected):
                    raise LinkError("it did not present the session's secret")
                raw = reader.read_line(limit=P.MAX_HELLO, idle=HANDSHAKE_TIMEOUT)
                if raw is None:
                    raise LinkError("it closed before its hello")
                hello = json.loads(raw)
                if not isinstance(hello, dict):
                    raise LinkError("its hello is not a JSON object")
            except (LinkError, EOFError, OSError, ValueError) as exc:
                self.rejected += 1
                reason = str(exc) or type(exc).__name__
                log.warning("%s: dropped a connection from %s: %s", self, peer, reason)
                _drop(sock)
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if hello.get("welcome"):  # a child waits for this before it goes on (or tries again)
                try:
                    sock.sendall(json.dumps({"event": P.WELCOME}).encode() + b"\n")
                except OSError:
                    _drop(sock)
                    return
            link = AgentLink(sock, reader, cast("P.Hello", hello))  # as the agent sent it
            if self.closed:
                link.close()
                return
            try:
                self._on_connection(link)
            except Exception:  # a bug in one child's registration must not stop the others
                traceback.print_exc()
                link.close()
        finally:
            self.proving -= 1
            slots.release()

    def proving_for(self, uid: int | None) -> int:
        """How many of one local user's connections are in their handshake now."""
        with self._slots_lock:
            slots = self._slots.get(uid)
        return 0 if slots is None else MAX_HANDSHAKES - slots._value  # type: ignore[attr-defined]

    def close(self) -> None:
        """Stop listening now: the port is freed and the accept thread ends (a plain
        ``close()`` leaves a thread blocked in ``accept`` and the port listening)."""
        self.closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()

    def __str__(self) -> str:
        return f"agent port {self.address} ({self.label})"


def peer_uid(sock: socket.socket) -> int | None:
    """The local user owning the other end of a loopback connection, from
    ``/proc/net/tcp``: the row whose local address is our remote one *and* whose remote
    address is our local one (a port number alone is not enough: the port may still be on
    a TIME_WAIT row of an earlier connection, which the kernel shows as root's); None where
    that cannot be read (not Linux)."""
    try:
        peer = sock.getpeername()[:2]
        ours = sock.getsockname()[:2]
    except OSError:
        return None
    try:
        wanted_local, wanted_remote = _proc_address(*peer), _proc_address(*ours)
        with open("/proc/net/tcp", "rb") as fh:
            next(fh, None)
            for row in fh:
                fields = row.split()
                if len(fields) > 7 and fields[1] == wanted_local and fields[2] == wanted_remote:
                    return int(fields[7])
    except (OSError, ValueError):
        return None
    return None


def _proc_address(host: str, port: int) -> bytes:
    """An IPv4 address as ``/proc/net/tcp`` writes it: ``0100007F:1F90``."""
    packed = socket.htonl(int.from_bytes(socket.inet_aton(host), "big"))
    return f"{packed:08X}:{port:04X}".encode()


def _drop(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class AgentLink:
    """One authenticated debuggee connection: requests with replies, and events."""

    def __init__(self, sock: socket.socket, reader: LineReader, hello: P.Hello) -> None:
        self._sock = sock
        self._reader = reader
        self.hello = hello
        self._on_event: EventHandler = lambda message: None
        self._on_close: Callable[[], None] = lambda: None
        self._send_lock = threading.Lock()
        self._pending: dict[int, Future[P.Reply]] = {}
        self._ids = itertools.count(1)
        self.closed = False
        self.error: str | None = None  # why the daemon cut the link, if it did
        self._drained = threading.Event()  # every message the debuggee sent was handled

    @property
    def pid(self) -> int | None:
        pid = self.hello.get("pid")
        return pid if isinstance(pid, int) else None

    def start(self, on_event: EventHandler, on_close: Callable[[], None]) -> None:
        """Begin reading: events go to ``on_event``; ``on_close`` runs once at the end."""
        self._on_event = on_event
        self._on_close = on_close
        threading.Thread(target=self._read_loop, name="mldbg-link", daemon=True).start()

    def _read_loop(self) -> None:
        try:
            while True:
                try:
                    line = self._reader.read_line()
                except LinkError as exc:
                    self.error = f"the debuggee (pid {self.pid}) broke the protocol: {exc}"
                    log.warning("%s; link closed", self.error)
                    break
                if line is None:
                    break
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(message, dict):
                    continue
                if "event" in message:
                    declared = P.EVENTS.get(str(message["event"]))
                    problem = "unknown" if declared is None else declared.check(message)
                    if problem is not None:  # an agent from another mldbg, or a bug: said
                        log.warning("%s: dropped the event %.200r: %s", self, message, problem)
                        continue
                    try:
                        self._on_event(message)
                    except Exception:  # a bug in handling one event must not cut the session off
                        traceback.print_exc()
                    continue
                request_id = message.get("id")
                future = (
                    self._pending.pop(request_id, None) if isinstance(request_id, int) else None
                )
                if future is not None:
                    future.set_result(cast("P.Reply", message))  # the agent's reply to it
        except OSError:
            pass
        finally:
            self.closed = True
            for future in list(self._pending.values()):
                if not future.done():
                    future.set_exception(SessionEnded("the script ended before it answered"))
            self._pending.clear()
            with contextlib.suppress(OSError):
                self._sock.close()
            self._on_close()
            self._drained.set()

    def drained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the debuggee's last messages to be handled
        (its connection reaches its end when its process does, unless a child it forked
        still holds the socket): what a process said before it exited is not lost."""
        return self._drained.wait(timeout)

    def send(
        self, command: P.AgentCommand[A, R_], args: Mapping[str, object] | None = None
    ) -> Future[P.Reply]:
        future: Future[P.Reply] = Future()
        if self.closed:
            future.set_exception(SessionEnded("the script is no longer running"))
            return future
        request_id = next(self._ids)
        self._pending[request_id] = future
        message = {"id": request_id, "cmd": command.name, "args": dict(args or {})}
        data = (json.dumps(message) + "\n").encode()
        try:
            with self._send_lock:
                self._sock.sendall(data)
        except OSError:
            self._pending.pop(request_id, None)
            future.set_exception(SessionEnded("the script is no longer running"))
        return future

    def ask(
        self,
        command: P.AgentCommand[A, R_],
        args: Mapping[str, object] | None = None,
        timeout: float | None = None,
    ) -> R_:
        """Send a command and return its result, or raise what the agent said (typed
        callers go through ``command.call(link, args)``)."""
        timeout = 30.0 if timeout is None else timeout
        future = self.send(command, args)
        try:
            reply = future.result(timeout)
        except FutureTimeout:
            raise AgentTimeout(
                f"the script did not answer {command.name!r} within {timeout:.0f} s "
                "(a long evaluation is still running on the paused thread)"
            ) from None
        if not reply.get("ok"):
            code = str(reply.get("code") or "agent_error")
            extra = {k: v for k, v in (reply.get("extra") or {}).items() if k not in ("code",)}
            raise AgentError(
                str(reply.get("error")), code=code, status=_STATUS.get(code, 400), **extra
            )
        return cast("R_", reply.get("result"))  # what the command declares it answers

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()
