"""Private daemons for the fault suite: each test that kills one gets its own.

Real processes only: ``python -m mldbg serve`` with its own config directory, driven over
real HTTP, killed with real signals.  Nothing here waits a fixed time where it can poll.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import Api, wait_until

__all__ = ["wait_until"]  # re-exported for the fault tests


def alive(pid: int) -> bool:
    """Is ``pid`` a live process (a zombie counts as gone)?"""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


class Daemon:
    """One ``mldbg serve`` process with its own config directory."""

    def __init__(
        self, config: Path, umask: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.config = config
        self.env = {**os.environ, **(env or {}), "MLDBG_CONFIG_DIR": str(config)}
        # beside the config directory, not in it: the daemon itself creates that
        config.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = config.parent / f"{config.name}-daemon-{time.monotonic_ns()}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed below
        preexec = (lambda: os.umask(umask)) if umask is not None else None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mldbg", "serve"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec,  # noqa: PLW1509 - only the umask, before exec
        )
        log.close()
        self.info: dict[str, Any] = wait_until(self._published, 60, "the daemon's server.json")
        self.api = Api(self.info)

    def _published(self) -> dict[str, Any] | None:
        assert self.process.poll() is None, self.log()
        try:
            info = json.loads((self.config / "server.json").read_text())
        except (OSError, ValueError):
            return None
        return info if info.get("pid") == self.process.pid else None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> int:
        self.process.send_signal(sig)
        return self.process.wait(60)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.api.http.close()


def start_body(script: Path, cwd: Path, **extra: Any) -> dict[str, Any]:
    """A start request as the client sends it: the environment, its cwd, its run store."""
    body: dict[str, Any] = {
        "script": str(script),
        "cwd": str(cwd),
        "python": sys.executable,
        "base_env": {**os.environ, "MLDBG_HOME": str(cwd / ".mldbg")},
    }
    body.update(extra)
    return body


def run_json(run_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "run.json").read_text())


def events(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def slow_python(tmp: Path, seconds: float) -> Path:
    """An interpreter that takes ``seconds`` to start: holds a session in ``starting``."""
    wrapper = tmp / "slow-python"
    wrapper.write_text(f'#!/bin/sh\nsleep {seconds}\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def kill_quietly(pid: int | None) -> None:
    if pid:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def serving(config: Path) -> list[int] | None:
    """Pids of the ``mldbg serve`` processes using config directory ``config``; None where
    there is no ``/proc`` to look in (macOS): callers then rely on their other checks."""
    if not Path("/proc/self/environ").exists():
        return None
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = f"MLDBG_CONFIG_DIR={config}".encode() in environ
        if ours and b"mldbg" in argv and b"serve" in argv:
            found.append(int(entry.name))
    return sorted(found)
