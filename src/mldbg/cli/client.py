"""Talking to the daemon from a client: find it, start it when needed, call its routes."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx

from ..errors import MldbgError
from ..server.config import config_dir, read_server_info

START_TIMEOUT = 30.0
# Waits happen server-side in slices of at most 30 s; the HTTP timeout leaves room for that.
HTTP_TIMEOUT = httpx.Timeout(90.0, connect=5.0)
# A long wait is a loop of short server-side waits, so a client can say it is still waiting.
WAIT_SLICE = 5.0


class DaemonError(MldbgError):
    """The daemon answered with an error; ``payload`` is its JSON body."""

    def __init__(self, payload: dict[str, Any], status: int) -> None:
        extra = {k: v for k, v in payload.items() if k not in ("error", "code")}
        super().__init__(
            str(payload.get("error", "unknown error")),
            code=str(payload.get("code", "error")),
            status=status,
            **extra,
        )


class Daemon:
    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.http = httpx.Client(
            base_url=info["url"],
            headers={"Authorization": f"Bearer {info['token']}"},
            timeout=HTTP_TIMEOUT,
        )

    def call(
        self, method: str, path: str, json: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        try:
            response = self.http.request(method, path, json=json, params=params)
        except httpx.TransportError as exc:
            raise MldbgError(
                f"lost the daemon at {self.info['url']} ({exc}); run the command again to restart it",
                code="daemon_unreachable",
            ) from None
        try:
            payload = response.json()
        except ValueError:
            payload = {"error": response.text or f"HTTP {response.status_code}"}
        if response.status_code >= 400:
            if isinstance(payload, dict) and "detail" in payload and "error" not in payload:
                payload = {"error": f"bad request: {payload['detail']}", "code": "bad_request"}
            raise DaemonError(
                payload if isinstance(payload, dict) else {"error": str(payload)},
                response.status_code,
            )
        return payload

    def session(
        self,
        name: str,
        verb: str,
        method: str = "POST",
        json: Any = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        path = f"/v1/sessions/{name}" + (f"/{verb}" if verb else "")
        return self.call(method, path, json=json, params=params)

    def resume(
        self,
        name: str,
        verb: str,
        body: dict[str, Any],
        max_wait: float,
        still_running: Callable[[float], None] | None = None,
    ) -> dict[str, Any]:
        """``continue`` or ``step``, then wait up to ``max_wait`` s for the next stop or the end.

        The wait is a loop of ``WAIT_SLICE`` s server-side waits: each HTTP call stays short
        and ``still_running(elapsed)`` hears about it in between.
        """
        started = time.monotonic()
        data: dict[str, Any] = self.session(
            name, verb, json={**body, "wait": min(WAIT_SLICE, max(max_wait, 0.0))}
        )
        while data.get("state") == "running":
            elapsed = time.monotonic() - started
            remaining = max_wait - elapsed
            if remaining <= 0:
                break
            if still_running is not None:
                still_running(elapsed)
            data = self.session(name, "wait", json={"wait": min(WAIT_SLICE, remaining)})
        return data


def _healthy(info: dict[str, Any]) -> bool:
    try:
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError):
        return False
    try:
        response = httpx.get(
            f"{info['url']}/v1/health",
            headers={"Authorization": f"Bearer {info['token']}"},
            timeout=3.0,
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def connect(autostart: bool = True) -> Daemon:
    """The running daemon, starting one (once, under a lock) if there is none."""
    info = read_server_info()
    if info is not None and _healthy(info):
        return Daemon(info)
    if not autostart:
        raise MldbgError(
            "no mldbg daemon is running; start one with: mldbg serve", code="no_daemon"
        )
    directory = config_dir()
    with open(directory / "server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two clients at once start one daemon, not two
        info = read_server_info()
        if info is not None and _healthy(info):
            return Daemon(info)
        return Daemon(_start_daemon(directory))


def _start_daemon(directory: Any) -> dict[str, Any]:
    log_path = directory / "server.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "mldbg", "serve"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(directory),
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        info = read_server_info()
        if info is not None and info.get("pid") == process.pid and _healthy(info):
            return info
        if process.poll() is not None:
            break
        time.sleep(0.05)
    raise MldbgError(
        f"the mldbg daemon did not start (see {log_path})",
        code="daemon_start_failed",
        log=str(log_path),
    )
