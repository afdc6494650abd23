"""Run a script under the counting runner, in its own interpreter, and read what ran.

The runner is put on the script's path through a private directory holding only a link
to the ``mldbg`` package (as the debugger's agent is), so nothing is installed into the
script's environment and the daemon's site-packages never leak into it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import FILE_NOT_FOUND, PROFILE_FAILED, START_FAILED, MldbgError
from ...interpreters import resolve_python
from ...store.runs import (
    OUTPUT_LOG,
    RunDir,
    finalize_run_dir,
    mldbg_home,
    open_private,
    reserve_run_dir,
    write_json_atomic,
)

PACKAGE_DIR = Path(__file__).resolve().parents[2]  # the mldbg package
RAW_JSON = "profile.json"


@dataclass
class Function:
    file: str
    qualname: str
    line: int
    calls: int  # while the script ran, outside imports
    import_calls: int = 0  # while a module was being imported


@dataclass
class RawProfile:
    """What one profiled run saw, with every path made absolute and real."""

    script: str
    args: list[str]
    python: str
    python_version: str
    backend: str
    pid: int
    exit_code: int | None
    signal: int | None
    exception: str | None
    duration_s: float
    run: RunDir
    functions: list[Function] = field(default_factory=list)
    modules: dict[str, str] = field(default_factory=dict)  # module name -> real file path
    stdlib: list[str] = field(default_factory=list)
    sys_path: list[str] = field(default_factory=list)
    output_tail: str = ""


def _shim() -> str:
    directory = tempfile.mkdtemp(prefix="mldbg-profile-")
    try:
        os.symlink(PACKAGE_DIR, os.path.join(directory, "mldbg"), target_is_directory=True)
    except OSError:
        shutil.copytree(
            PACKAGE_DIR,
            os.path.join(directory, "mldbg"),
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    return directory


def _real(path: str) -> str:
    return os.path.realpath(path) if path and not path.startswith("<") else path


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return text if size <= limit else "…" + text


def run_profiled(
    script: str,
    args: list[str],
    *,
    python: str | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> RawProfile:
    """Run ``script`` to its end under the runner; the run gets a directory in the run store."""
    cwd = os.path.abspath(cwd or os.getcwd())
    if not os.path.isdir(cwd):
        raise MldbgError(f"working directory {cwd} does not exist", code=FILE_NOT_FOUND)
    script_path = os.path.join(cwd, os.path.expanduser(script))
    if not os.path.isfile(script_path):
        raise MldbgError(
            f"no such script: {script} (looked in {cwd})", code=FILE_NOT_FOUND, script=script
        )
    interpreter = resolve_python(python, cwd)
    base_env = dict(os.environ if env is None else env)
    home = mldbg_home(cwd, base_env)
    run = reserve_run_dir(home)
    shim = _shim()
    # Beside the shim, not in the run directory: that is renamed once the pid is known.
    raw_out = Path(shim) / f"{RAW_JSON}.{secrets.token_hex(4)}"
    child_env = dict(base_env)
    original = child_env.get("PYTHONPATH")
    child_env["PYTHONPATH"] = shim + (os.pathsep + original if original else "")
    child_env["MLDBG_PROFILE_SHIM"] = shim
    child_env["MLDBG_PROFILE_PYTHONPATH"] = original if original is not None else "__MLDBG_UNSET__"
    child_env.setdefault("MLDBG_HOME", str(home))
    argv = [interpreter, "-m", "mldbg.tools.profile.runner", str(raw_out), script_path, *args]
    try:
        # private like every run file (the script's output may hold secrets)
        log_fd = open_private(run.file(OUTPUT_LOG), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with open(log_fd, "wb") as log:
            try:
                process = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=child_env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            except OSError as exc:
                raise MldbgError(
                    f"cannot run {interpreter}: {exc.strerror}", code=START_FAILED
                ) from None
            run = finalize_run_dir(run, Path(script_path).stem, process.pid)
            run.update_meta(
                run_id=run.run_id,
                kind="profile",
                script=script_path,
                argv=args,
                cwd=cwd,
                python=interpreter,
                pid=process.pid,
                state="running",
            )
            try:
                returncode = process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                returncode = process.wait()
            except KeyboardInterrupt:
                process.terminate()
                process.wait()
                raise
        try:
            data: dict[str, Any] = json.loads(raw_out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if data:
            write_json_atomic(run.file(RAW_JSON), data)
    finally:
        shutil.rmtree(shim, ignore_errors=True)
    signal = -returncode if returncode < 0 else None
    exit_code = data.get("exit_code", returncode if returncode >= 0 else None)
    run.update_meta(
        state="crashed" if signal else "exited",
        exit_code=exit_code,
        signal=signal,
        python_version=data.get("python_version"),
        backend=data.get("backend"),
    )
    if not data:
        raise MldbgError(
            f"the profiled script ended ({'signal ' + str(signal) if signal else f'exit code {returncode}'}) "
            f"before the profiler could write its counts; its output is in {run.file(OUTPUT_LOG)}",
            code=PROFILE_FAILED,
            output_tail=_tail(run.file(OUTPUT_LOG)),
            run_dir=str(run.path),
        )
    functions = [
        Function(_real(f), q, int(line), int(n), int(i))
        for f, q, line, n, i in data.get("functions", [])
    ]
    return RawProfile(
        script=script_path,
        args=list(args),
        python=interpreter,
        python_version=str(data.get("python_version", "")),
        backend=str(data.get("backend", "")),
        pid=process.pid,
        exit_code=exit_code,
        signal=signal,
        exception=data.get("exception"),
        duration_s=float(data.get("ended_at", 0) - data.get("started_at", 0)),
        run=run,
        functions=functions,
        modules={name: _real(file) for name, file in (data.get("modules") or {}).items()},
        stdlib=[_real(p) for p in data.get("stdlib", [])],
        sys_path=[_real(p) for p in data.get("sys_path", []) if p],
        output_tail=_tail(run.file(OUTPUT_LOG)),
    )
