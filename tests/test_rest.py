"""The daemon's HTTP surface: the token and Host gates, versioned routes, classic routes."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import Api, line_of

ROUTES = [
    ("GET", "/v1/health"),
    ("GET", "/v1/sessions"),
    ("POST", "/v1/sessions/x/eval"),
    ("POST", "/debug/evaluate"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_needs_the_token(daemon: dict[str, Any], method: str, path: str) -> None:
    url = daemon["url"] + path
    assert httpx.request(method, url, json={"expression": "1"}).status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    response = httpx.request(method, url, headers=wrong, json={"expression": "1"})
    assert response.status_code == 401
    assert "token" in response.json()["error"]


@pytest.mark.parametrize("host", ["evil.example.com", "127.0.0.1.nip.io", "10.0.0.1:8000"])
def test_foreign_host_headers_are_refused(daemon: dict[str, Any], host: str) -> None:
    headers = {"Authorization": f"Bearer {daemon['token']}", "Host": host}
    response = httpx.get(daemon["url"] + "/v1/health", headers=headers)
    assert response.status_code == 403
    assert "loopback" in response.json()["error"]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost:1234", "[::1]:80"])
def test_loopback_host_headers_pass(daemon: dict[str, Any], host: str) -> None:
    headers = {"Authorization": f"Bearer {daemon['token']}", "Host": host}
    assert httpx.get(daemon["url"] + "/v1/health", headers=headers).status_code == 200


def test_daemon_listens_on_loopback_only_and_hides_its_token(
    daemon: dict[str, Any], config_dir: Path
) -> None:
    assert daemon["url"].startswith("http://127.0.0.1:")
    mode = stat.S_IMODE(os.stat(config_dir / "server.json").st_mode)
    assert mode == 0o600


def test_openapi_docs_with_the_token(api: Api) -> None:
    spec = api.get("/openapi.json")
    for path in (
        "/v1/sessions/{name}/eval",
        "/v1/sessions/{name}/step",
        "/debug/start",
        "/debug/status",
    ):
        assert path in spec["paths"]
    response = api.http.get("/docs")
    assert response.status_code == 200 and "swagger" in response.text.lower()


def test_bad_request_bodies_get_clear_errors(api: Api) -> None:
    response = api.http.post("/v1/sessions/x/eval", json={"nope": 1})
    assert response.status_code == 400
    error = response.json()
    assert error["code"] == "bad_argument" and "nope: no such argument" in error["error"]
    assert "expression: required" in error["error"] and "http" not in error["error"]
    error = api.post("/v1/sessions/bad name!/start", {"script": "x.py"}, expect=400)
    assert "bad session name" in error["error"]


def test_classic_routes_drive_the_default_session(api: Api, write, tmp_path: Path) -> None:
    script = write(
        "classic.py",
        """
        def add(a, b):
            total = a + b  # here
            return total

        print(add(2, 3))
    """,
    )
    # Classic /debug/* routes act on the session named "default".
    started = api.post(
        "/debug/start", {"script_path": str(script), "cwd": str(tmp_path), "python": sys.executable}
    )
    assert started["success"] is True and started["data"]["reason"] == "entry"
    assert set(started) == {"success", "message", "data", "error"}
    try:
        bp = api.post(
            "/debug/breakpoint",
            {"file_path": str(script), "line": line_of(script, "here"), "condition": "a == 2"},
        )
        assert bp["success"] and bp["data"]["line"] == line_of(script, "here")
        assert len(api.get("/debug/breakpoints")["data"]["breakpoints"]) == 1
        assert api.post("/debug/continue_async")["success"]
        state = api.post("/v1/sessions/default/wait", {"wait": 20})
        assert state["reason"] == "breakpoint"
        assert api.get("/debug/status")["data"]["state"] == "paused"
        assert api.get("/debug/location")["data"]["location"]["line"] == line_of(script, "here")
        assert api.post("/debug/evaluate", {"expression": "a * 10"})["data"]["result"] == "20"
        names = {v["name"] for v in api.get("/debug/variables")["data"]["variables"]}
        assert names == {"a", "b"}
        stepped = api.post("/debug/step/over")
        assert stepped["data"]["location"]["line"] == line_of(script, "here") + 1
        bad = api.post("/debug/step/sideways", expect=404)
        assert bad["success"] is False and "unknown step kind" in bad["message"]
        failed = api.post("/debug/evaluate", {"expression": "undefined"}, expect=400)
        assert failed["success"] is False and "NameError" in failed["message"]
        assert api.post(
            "/debug/breakpoint/remove", {"file_path": str(script), "line": line_of(script, "here")}
        )["success"]
        assert api.post("/debug/breakpoints/clear")["data"]["removed"] == 0
        assert api.post("/debug/terminate")["data"]["state"] == "exited"
    finally:
        api.http.post("/v1/sessions/default/terminate")


def test_several_sessions_side_by_side(api: Api, write, tmp_path: Path) -> None:
    script = write("side.py", "value = __import__('sys').argv[1]\nprint(value)\n")
    try:
        for name in ("reference", "port"):
            api.post(
                f"/v1/sessions/{name}/start",
                {
                    "script": str(script),
                    "args": [name],
                    "cwd": str(tmp_path),
                    "python": sys.executable,
                },
            )
        listed = {s["session"]: s for s in api.get("/v1/sessions")["sessions"]}
        assert listed["reference"]["state"] == listed["port"]["state"] == "paused"
        for name in ("reference", "port"):
            api.post(f"/v1/sessions/{name}/step", {"kind": "over"})
            assert api.post(f"/v1/sessions/{name}/eval", {"expression": "value"})["result"] == repr(
                name
            )
        busy = api.post(
            "/v1/sessions/port/start",
            {"script": str(script), "args": ["x"], "cwd": str(tmp_path)},
            expect=409,
        )
        assert "still paused" in busy["error"] and "--replace" not in busy["error"]
        assert {"verb": "start", "args": {"session": "port", "replace": True}} in busy["fix"]
        assert 'POST /v1/sessions/port/start {"replace": true}' in busy["hint"]  # REST's words
    finally:
        for name in ("reference", "port"):
            api.http.delete(f"/v1/sessions/{name}")
    error = api.get("/v1/sessions/reference", expect=404)
    assert "no session named 'reference'" in error["error"]


def test_classic_start_never_resolves_against_the_daemons_directory(
    api: Api, write, tmp_path: Path
) -> None:
    script = write("here.py", "x = 1\n")
    refused = api.post("/debug/start", {"script_path": "here.py"}, expect=400)
    assert refused["error"] == "bad_argument" and "relative" in refused["message"]
    # an absolute path runs in its own directory
    started = api.post("/debug/start", {"script_path": str(script), "python": sys.executable})
    assert started["success"] and started["data"]["state"] == "paused"
    assert started["data"]["location"]["file"] == str(script.resolve())
    api.post("/debug/terminate")
    # a failed start keeps the previous session's record
    failed = api.post("/debug/start", {"script_path": str(tmp_path / "missing.py")}, expect=400)
    assert failed["success"] is False
    kept = api.get("/v1/sessions/default")
    assert kept["run_id"] == started["data"]["run_id"] and kept["state"] == "exited"


def _chromium() -> str | None:
    import shutil

    return next(
        (
            found
            for found in map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))
            if found
        ),
        None,
    )


@pytest.mark.browser
def test_docs_open_in_a_browser_through_a_one_time_link(cli, daemon, tmp_path: Path) -> None:
    """A browser cannot send the bearer header: ``mldbg docs`` prints a link whose nonce
    buys, once, a cookie that opens the docs pages and nothing else."""
    import subprocess

    chromium = _chromium()
    if chromium is None:
        pytest.skip("no headless Chromium on PATH: run scripts/ensure_chromium.sh")
    link = cli("docs", json_out=True)
    assert link["url"].startswith(daemon["url"] + "/docs/login?nonce=")
    assert 0 < link["expires_in_s"] <= 120
    shown = subprocess.run(
        [
            chromium,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            link["url"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "swagger-ui" in shown.stdout and "unauthorized" not in shown.stdout, shown.stdout
    # used: the same link opens nothing again
    again = httpx.get(link["url"], follow_redirects=False)
    assert again.status_code == 401 and "mldbg docs" in again.json()["error"]

    text = cli("docs").stdout.strip()
    assert text.startswith(daemon["url"] + "/docs/login?nonce=")  # the link alone on stdout
    login = httpx.get(text, follow_redirects=False)
    assert login.status_code == 303 and login.headers["location"] == "/docs"
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Domain" not in cookie
    jar = {"mldbg_docs": login.cookies["mldbg_docs"]}
    assert httpx.get(daemon["url"] + "/openapi.json", cookies=jar).status_code == 200
    assert httpx.get(daemon["url"] + "/docs", cookies=jar).status_code == 200
    # every other route still needs the token, cookie or not
    for method, path in ROUTES:
        if path not in ("/docs", "/openapi.json"):
            response = httpx.request(method, daemon["url"] + path, cookies=jar, json={})
            assert response.status_code == 401, (method, path)
    assert httpx.post(daemon["url"] + "/v1/docs-link", cookies=jar).status_code == 401
    wrong = {"mldbg_docs": "x" * 43}
    assert httpx.get(daemon["url"] + "/openapi.json", cookies=wrong).status_code == 401
