"""One kept-alive HTTP/1.1 connection to the local daemon, on a plain socket.

Why not ``http.client``: importing it costs about 40 ms of CPU (it loads the ``email``
package to parse headers, and ``ssl``), more than the rest of a ``mldbg eval`` command
together, and every CLI call pays it.  The peer is always mldbg's own daemon on
127.0.0.1 (uvicorn), answering JSON framed by ``Content-Length`` (or chunked), so an
exchange needs only: send the request, read the status line and headers, read the body.
Anything else (a malformed reply, a closed connection) raises :class:`HttpProtocolError`, an
``OSError``, and the caller reconnects exactly as it does for a dropped socket.
"""

from __future__ import annotations

import socket

from ..errors import HttpProtocolError

_MAX_LINE = 65536
_MAX_HEADERS = 100


class Connection:
    """A TCP connection with ``TCP_NODELAY`` (no Nagle stall on kept-alive requests)."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port = host, port
        self.sock = socket.create_connection((host, port), timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")
        self.closed = False

    def request(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """Send one request and read its whole reply: (status, body)."""
        if self.closed:
            raise HttpProtocolError("the daemon closed this connection")
        payload = body or b""
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines.append(f"Content-Length: {len(payload)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.sock.sendall(head + payload)
        return self._reply(method)

    def _reply(self, method: str) -> tuple[int, bytes]:
        status_line = self._line()
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HttpProtocolError(f"not an HTTP reply: {status_line[:100]!r}")
        status = int(parts[1])
        fields: dict[str, str] = {}
        for _ in range(_MAX_HEADERS):
            line = self._line()
            if line in (b"\r\n", b"\n"):
                break
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise HttpProtocolError(f"bad header line: {line[:100]!r}")
            fields[name.strip().lower()] = value.strip()
        else:
            raise HttpProtocolError("too many header lines")
        if fields.get("connection", "").lower() == "close":
            self.closed = True
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return status, b""
        if "chunked" in fields.get("transfer-encoding", "").lower():
            return status, self._chunked()
        length = fields.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise HttpProtocolError(f"bad Content-Length: {length!r}")
            return status, self._exactly(int(length))
        self.closed = True  # the body runs to the end of the connection
        return status, self.file.read()

    def _line(self) -> bytes:
        line = self.file.readline(_MAX_LINE + 1)
        if not line:
            self.closed = True
            raise HttpProtocolError("the daemon closed the connection")
        if len(line) > _MAX_LINE:
            raise HttpProtocolError("header line too long")
        return line

    def _exactly(self, size: int) -> bytes:
        data = self.file.read(size)
        if len(data) != size:
            self.closed = True
            raise HttpProtocolError(f"reply cut short ({len(data)} of {size} bytes)")
        return data

    def _chunked(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            size_text = self._line().split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpProtocolError(f"bad chunk size: {size_text[:20]!r}") from None
            if size == 0:
                while self._line() not in (b"\r\n", b"\n"):  # trailers
                    pass
                return b"".join(chunks)
            chunks.append(self._exactly(size))
            self._line()  # the CRLF after the chunk

    def close(self) -> None:
        self.closed = True
        try:
            self.file.close()
        finally:
            self.sock.close()
