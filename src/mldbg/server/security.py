"""The daemon's two gates: a bearer token on every route, and loopback Host headers only.

Evaluation is code execution, so nothing reaches a route without the token.  The Host
check stops DNS-rebinding pages in a browser from talking to the daemon by name.

A browser cannot send the bearer header, so the OpenAPI docs have a door of their own:
``mldbg docs`` asks (with the token) for a one-time link; opening it trades its nonce for
a short-lived cookie that admits the docs pages and nothing else (``DocsAccess``).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
DOCS_LOGIN = "/docs/login"
# what a docs cookie opens, read-only: the pages and the schema they render
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
DOCS_COOKIE = "mldbg_docs"
LINK_SECONDS = 60.0  # a link is opened at once, or asked for again
COOKIE_SECONDS = 15 * 60.0
MAX_OUTSTANDING = 32  # links and cookies each: older ones are forgotten first


class DocsAccess:
    """One-time links to the docs, each traded once for a cookie that opens only them.

    The nonce and the cookie are random (256 bits), kept in this process only, expire on
    their own and are compared in constant time; the cookie is host-only, HttpOnly and
    SameSite=Strict, so only a page of the daemon's own origin sends it back.
    """

    def __init__(self) -> None:
        self._links: dict[str, float] = {}
        self._cookies: dict[str, float] = {}
        self._lock = threading.Lock()

    def link(self) -> str:
        """A nonce for one login, valid ``LINK_SECONDS``."""
        return self._add(self._links, LINK_SECONDS)

    def redeem(self, nonce: str) -> str | None:
        """The cookie for a link's nonce, once; None for a used, expired or unknown one."""
        with self._lock:
            expires = self._links.pop(nonce, None) if nonce else None
        if expires is None or expires < time.monotonic():
            return None
        return self._add(self._cookies, COOKIE_SECONDS)

    def admits(self, cookie: str) -> bool:
        with self._lock:
            now = time.monotonic()
            return any(
                secrets.compare_digest(cookie, value) and expires >= now
                for value, expires in self._cookies.items()
            )

    def _add(self, table: dict[str, float], seconds: float) -> str:
        value = secrets.token_urlsafe(32)
        with self._lock:
            now = time.monotonic()
            for old in [k for k, expires in table.items() if expires < now]:
                del table[old]
            while len(table) >= MAX_OUTSTANDING:
                del table[next(iter(table))]
            table[value] = now + seconds
        return value


def host_is_loopback(host_header: str) -> bool:
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[: host.find("]") + 1] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host in LOOPBACK_HOSTS


class SecurityMiddleware:
    """Pure ASGI, so it guards every route, the OpenAPI docs included."""

    def __init__(self, app: ASGIApp, token: str, docs: DocsAccess | None = None) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.docs = docs or DocsAccess()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        if not host_is_loopback(host):
            await _reply(send, 403, f"refused: Host {host!r} is not a loopback name", "bad_host")
            return
        path, method = scope.get("path", ""), scope.get("method", "")
        if path == DOCS_LOGIN and method == "GET":
            await self._login(scope, send)
            return
        if path in DOCS_PATHS and method == "GET" and self._docs_cookie(headers):
            await self.app(scope, receive, send)
            return
        given = headers.get(b"authorization", b"")
        if not secrets.compare_digest(given, self.expected):
            await _reply(
                send,
                401,
                "missing or wrong token: send 'Authorization: Bearer <token>' with the token "
                "from ~/.mldbg/server.json",
                "unauthorized",
            )
            return
        await self.app(scope, receive, send)

    async def _login(self, scope: Scope, send: Send) -> None:
        """A docs link: its nonce, once, for the cookie, then on to the docs."""
        query = parse_qs(bytes(scope.get("query_string") or b"").decode("latin-1"))
        cookie = self.docs.redeem((query.get("nonce") or [""])[0])
        if cookie is None:
            await _reply(
                send,
                401,
                "this docs link was used already or has expired: run `mldbg docs` for a new one",
                "unauthorized",
            )
            return
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", b"/docs"),
                    (
                        b"set-cookie",
                        f"{DOCS_COOKIE}={cookie}; Path=/; Max-Age={int(COOKIE_SECONDS)}; "
                        "HttpOnly; SameSite=Strict".encode(),
                    ),
                    (b"cache-control", b"no-store"),
                    (b"content-length", b"0"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    def _docs_cookie(self, headers: dict[bytes, bytes]) -> bool:
        for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == DOCS_COOKIE and value and self.docs.admits(value):
                return True
        return False


async def _reply(send: Send, status: int, message: str, code: str) -> None:
    body = json.dumps({"error": message, "code": code}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
