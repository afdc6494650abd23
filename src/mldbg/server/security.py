"""The daemon's two gates: a bearer token on every route, and loopback Host headers only.

Evaluation is code execution, so nothing reaches a route without the token.  The Host
check stops DNS-rebinding pages in a browser from talking to the daemon by name.
"""

from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def host_is_loopback(host_header: str) -> bool:
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[: host.find("]") + 1] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host in LOOPBACK_HOSTS


class SecurityMiddleware:
    """Pure ASGI, so it guards every route, the OpenAPI docs included."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        if not host_is_loopback(host):
            await _reply(send, 403, f"refused: Host {host!r} is not a loopback name", "bad_host")
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
