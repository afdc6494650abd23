"""Shared fixtures: one real daemon per test run, real debuggee processes, real HTTP.

The daemon runs as a subprocess on loopback with its own config directory, so tests
never touch ``~/.mldbg``.  Each test gets its own session name and its own scripts.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mldbg.client.api import Client
from mldbg.errors import MldbgError

ROOT = Path(__file__).resolve().parent.parent
_names = itertools.count(1)

# Every comparison the suite makes, here, in the daemon and in the scripts it runs, is held
# to its own entries: a verdict whose reason they contradict raises (compare/culprit/check.py).
os.environ.setdefault("MLDBG_CHECK_VERDICTS", "1")


def find_python(version: str) -> str | None:
    """A working interpreter of this minor version: installed by pyenv, or on the PATH.

    pyenv's shims are on the PATH but refuse to run versions that are not selected, so
    each candidate is tried before it is used.
    """
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv")]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        roots.insert(
            0,
            subprocess.run(
                ["pyenv", "root"], capture_output=True, text=True, timeout=10
            ).stdout.strip(),
        )
    candidates = []
    for root in dict.fromkeys(r for r in roots if r):
        pattern = os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")
        candidates += sorted(glob.glob(pattern), reverse=True)
    found = shutil.which(f"python{version}")
    if found:
        candidates.append(found)
    for candidate in candidates:
        probe = subprocess.run([candidate, "-c", "pass"], capture_output=True)
        if probe.returncode == 0:
            return candidate
    return None


# The engine runs against both tracer backends: settrace (3.10/3.11) and sys.monitoring (3.12+).
# Also 3.13 (frame.f_locals is a write-through proxy, PEP 667) and 3.10, the oldest supported.
BACKEND_PYTHONS = {
    "settrace": sys.executable if sys.version_info < (3, 12) else find_python("3.11"),
    "monitoring": sys.executable if sys.version_info >= (3, 12) else find_python("3.12"),
    "monitoring-3.13": find_python("3.13"),
    "settrace-3.10": find_python("3.10"),
}


def backend_params() -> list[Any]:
    """One parameter per tracer backend; those run by another Python than the suite's are
    marked ``slow`` (``make test-fast`` runs the suite's own backend only)."""
    params = []
    for name, python in BACKEND_PYTHONS.items():
        marks: list[Any] = (
            [] if python else [pytest.mark.skip(reason=f"no interpreter for the {name} backend")]
        )
        if python != sys.executable:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(python, id=name, marks=marks))
    return params


def wait_until(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail saying what.

    The one way tests wait for a process to get somewhere: no fixed sleeps, and a timeout
    that only ends a test stuck for good (machines vary; nothing here measures time).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


class Api:
    """A real HTTP client for the test daemon, raising on unexpected statuses: for the
    tests whose subject is the REST layer itself (routes, schemas, statuses, bytes).
    Every other test calls verbs through ``client``, the typed client the CLI and the MCP
    server use (``mldbg.client.api``)."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.http = httpx.Client(
            base_url=info["url"], headers={"Authorization": f"Bearer {info['token']}"}, timeout=90
        )
        self.client = Client(info)  # type: ignore[arg-type]

    def request(self, method: str, path: str, expect: int = 200, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        assert response.status_code == expect, (
            f"{method} {path}: {response.status_code} {response.text}"
        )
        return response.json()

    def get(self, path: str, expect: int = 200, **kwargs: Any) -> Any:
        return self.request("GET", path, expect, **kwargs)

    def post(self, path: str, body: Any = None, expect: int = 200) -> Any:
        return self.request("POST", path, expect, json=body if body is not None else {})


def call(
    client: Client, verb: str, session: str | None = None, expect: int = 200, **args: Any
) -> Any:
    """``verb`` through the typed client; its answer, or (``expect`` an error status) the
    error's ``{"error", "code", ...}``, failing the test on any other outcome."""
    try:
        answer = client.call(verb, session, **args)
    except MldbgError as exc:
        assert exc.status == expect, f"{verb} {session or ''}: {exc.status} {exc.to_json()}"
        return exc.to_json()
    assert expect == 200, f"{verb} {session or ''}: 200, not {expect}: {answer}"
    return answer


class Session:
    """One named debug session, its verbs called through the typed client, with small
    helpers for the common calls."""

    def __init__(self, api: Api, name: str, cwd: Path) -> None:
        self.api = api
        self.client = api.client
        self.name = name
        self.cwd = cwd
        self.base = f"/v1/sessions/{name}"  # for the tests of the REST layer itself

    def call(self, verb: str, expect: int = 200, **args: Any) -> Any:
        """This session's ``verb`` (``expect``: an error status, its error answered)."""
        return call(self.client, verb, self.name, expect, **args)

    def start(
        self,
        script: str | Path,
        *args: str,
        python: str | None = None,
        expect: int = 200,
        **body: Any,
    ) -> Any:
        payload = {
            "script": str(script),
            "args": list(args),
            "cwd": str(self.cwd),
            "python": python,
            **body,
        }
        payload.setdefault("env", {**os.environ, "MLDBG_HOME": str(self.cwd / ".mldbg")})
        return self.call("start", expect, **payload)

    def state(self) -> Any:
        return self.call("status")

    def cont(self, wait: float = 20.0, expect: int = 200) -> Any:
        return self.call("continue", expect, wait=wait)

    def step(self, kind: str, wait: float = 20.0, **extra: Any) -> Any:
        return self.call("step", kind=kind, wait=wait, **extra)

    def wait(self, wait: float = 20.0) -> Any:
        return self.call("wait", wait=wait)

    def eval(self, expression: str, expect: int = 200) -> Any:
        return self.call("eval", expect, expression=expression)

    def value(self, expression: str) -> Any:
        return self.eval(expression)["result"]

    def brk(
        self, file: str | Path | None, line: int | None, expect: int = 200, **extra: Any
    ) -> Any:
        where = {"file": None if file is None else str(file), "line": line}
        return self.call("break", expect, **where, **extra)

    def stack(self) -> Any:
        return self.call("stack")

    def output(self) -> str:
        return self.call("output")["output"]  # type: ignore[no-any-return]

    def wait_for_output(self, text: str, timeout: float = 60.0) -> str:
        """Poll the script's output until ``text`` appears (no fixed sleeps: machines vary)."""

        def shown() -> str | None:
            output: str = self.call("output")["output"]
            return output if text in output else None

        return wait_until(shown, timeout, f"{text!r} in the output")  # type: ignore[no-any-return]

    def terminate(self) -> Any:
        return self.call("terminate")

    def end(self) -> None:
        """Terminate it if it lives (a test's cleanup: never fails)."""
        with contextlib.suppress(MldbgError):
            self.client.call("terminate", self.name)

    def run_to_end(self, wait: float = 30.0) -> Any:
        state = self.cont(wait)
        deadline = time.monotonic() + 60
        while state["state"] in ("paused", "running") and time.monotonic() < deadline:
            state = self.cont(wait) if state["state"] == "paused" else self.wait(wait)
        return state


@pytest.fixture(scope="session")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("config")


@pytest.fixture(scope="session", autouse=True)
def private_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every ``mldbg`` a test runs without the test daemon's settings uses a private
    config directory, never the user's ``~/.mldbg``: its daemon may be another
    checkout's (a CLI call would fail with ``daemon_skew``), and a daemon a CLI call
    starts there on demand is stopped when the session ends instead of left running."""
    private = tmp_path_factory.mktemp("cli-config")
    before = os.environ.get("MLDBG_CONFIG_DIR")
    os.environ["MLDBG_CONFIG_DIR"] = str(private)
    yield
    if before is None:
        os.environ.pop("MLDBG_CONFIG_DIR", None)
    else:
        os.environ["MLDBG_CONFIG_DIR"] = before
    if (private / "server.json").exists():
        subprocess.run(
            [sys.executable, "-m", "mldbg", "serve", "--stop"],
            env={**os.environ, "MLDBG_CONFIG_DIR": str(private)},
            capture_output=True,
            timeout=60,
        )


@pytest.fixture(scope="session")
def daemon(config_dir: Path) -> Iterator[dict[str, Any]]:
    env = {**os.environ, "MLDBG_CONFIG_DIR": str(config_dir)}
    log = open(config_dir / "daemon.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "mldbg", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    server_json = config_dir / "server.json"
    deadline = time.monotonic() + 30
    info = None
    while time.monotonic() < deadline:
        if server_json.exists():
            info = json.loads(server_json.read_text())
            if info.get("pid") == process.pid:
                break
        assert process.poll() is None, (config_dir / "daemon.log").read_text()
        time.sleep(0.05)
    assert info is not None, "daemon did not start"
    yield info
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()


@pytest.fixture(scope="session")
def api(daemon: dict[str, Any]) -> Api:
    return Api(daemon)


@pytest.fixture(scope="session")
def client(api: Api) -> Client:
    """The typed client (``mldbg.client.api``) of the test daemon."""
    return api.client


@pytest.fixture
def session(api: Api, tmp_path: Path) -> Iterator[Session]:
    s = Session(api, f"t{next(_names)}", tmp_path)
    yield s
    s.end()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private run store for captures and compares made in this process: ``MLDBG_HOME``
    under the test's ``tmp_path``, and the process's current run (process-wide) forgotten
    before and after, so each test's captures land in a run of its own."""
    from mldbg.store import current_run

    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / "store"))
    current_run.reset()
    yield tmp_path / "store"
    current_run.reset()


@pytest.fixture
def write(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Write a dedented script into the test's directory and return its path."""

    def _write(name: str, source: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).lstrip("\n"))
        return path

    return _write


def line_of(path: Path, marker: str) -> int:
    """The 1-based line holding ``marker``, so tests never hard-code line numbers."""
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if marker in text:
            return number
    raise AssertionError(f"{marker!r} not in {path}")


@pytest.fixture
def cli(config_dir: Path, daemon: dict[str, Any], tmp_path: Path):  # type: ignore[no-untyped-def]
    """Run the real ``mldbg`` command against the test daemon, in the test's directory."""

    def _cli(
        *args: str, expect: int | None = 0, stdin: str | None = None, json_out: bool = False
    ) -> Any:
        # --json right after the verb: after a script name it would belong to the script.
        argv = [
            sys.executable,
            "-m",
            "mldbg",
            *args[:1],
            *(["--json"] if json_out else []),
            *args[1:],
        ]
        env = {
            **os.environ,
            "MLDBG_CONFIG_DIR": str(config_dir),
            "MLDBG_HOME": str(tmp_path / ".mldbg"),
        }
        proc = subprocess.run(
            argv, cwd=tmp_path, env=env, input=stdin, capture_output=True, text=True, timeout=120
        )
        if expect is not None:
            assert proc.returncode == expect, (
                f"{args}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        if json_out:
            return json.loads(proc.stdout)
        return proc

    return _cli
