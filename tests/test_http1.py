"""The CLI's bare-socket HTTP/1.1 client against a real HTTP/1.1 server (http.server).

The daemon (uvicorn) answers with Content-Length; the other framings a server may use
(chunked, to the end of the connection, no body) and a server that hangs up must be read
right too, or raise the OSError the client reconnects on.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from mldbg.client.http1 import Connection
from mldbg.errors import HttpProtocolError


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/length":
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/chunked":
            self.send_response(201)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (body[:3], body[3:]):
                self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\nTrailer: x\r\n\r\n")
        elif self.path == "/until-close":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"all of it")
            self.close_connection = True
        elif self.path == "/no-content":
            self.send_response(204)
            self.end_headers()
        else:  # hang up without answering
            self.close_connection = True


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1", httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_framings_on_one_kept_alive_connection(server: tuple[str, int]) -> None:
    conn = Connection(*server, timeout=10)
    headers = {"Content-Type": "application/json"}
    assert conn.request("POST", "/length", b'{"a": 1}', headers) == (200, b'{"a": 1}')
    assert conn.request("POST", "/chunked", b"abcdefgh", headers) == (201, b"abcdefgh")
    assert conn.request("POST", "/no-content", b"", headers) == (204, b"")
    assert conn.request("POST", "/length", b"", headers) == (200, b"")
    assert not conn.closed
    assert conn.request("POST", "/until-close", b"x", headers) == (200, b"all of it")
    assert conn.closed  # the next request must open a new connection
    with pytest.raises(HttpProtocolError):
        conn.request("POST", "/length", b"x", headers)
    conn.close()


def test_a_server_that_hangs_up_raises_an_oserror(server: tuple[str, int]) -> None:
    conn = Connection(*server, timeout=10)
    with pytest.raises(OSError):
        conn.request("POST", "/hang-up", b"x", {})
    assert conn.closed
    conn.close()
