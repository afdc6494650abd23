"""``python -m mldbg.tools.profile.runner OUT.json SCRIPT [ARGS...]``: count which functions run.

Runs inside the profiled script's own interpreter, so it is standard library only.  It
records how often each code object starts (a function call, a module body, a class
body), not lines: ``sys.monitoring`` PY_START on Python 3.12+, ``sys.setprofile`` call
events on 3.10/3.11.  At exit it writes one JSON file: the counts, every module imported
(name and file), and how the script ended.  The script sees ``sys.argv``, ``sys.path[0]``
and ``__main__`` exactly as under ``python SCRIPT ARGS``.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any

_counts: dict[CodeType, int] = {}
_import_counts: dict[CodeType, int] = {}
# > 0 while an import runs: calls then count as import-time work, not as what the script ran.
_importing = [0]
_SHIM_VARIABLE = "MLDBG_PROFILE_SHIM"
_ORIGINAL_PYTHONPATH = "MLDBG_PROFILE_PYTHONPATH"
_UNSET = "__MLDBG_UNSET__"


def _start_monitoring() -> str:
    monitoring = sys.monitoring  # type: ignore[attr-defined]
    tool = None
    for candidate in (monitoring.PROFILER_ID, 4, 3, 5):
        if monitoring.get_tool(candidate) is None:
            tool = candidate
            break
    if tool is None:
        raise RuntimeError("no free sys.monitoring tool id")
    monitoring.use_tool_id(tool, "mldbg-profile")
    counts, import_counts, importing = _counts, _import_counts, _importing

    def on_start(code: CodeType, offset: int) -> None:
        table = import_counts if importing[0] else counts
        table[code] = table.get(code, 0) + 1

    monitoring.register_callback(tool, monitoring.events.PY_START, on_start)
    monitoring.set_events(tool, monitoring.events.PY_START)
    return "monitoring"


def _start_setprofile() -> str:
    counts, import_counts, importing = _counts, _import_counts, _importing

    def on_event(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            code = frame.f_code
            table = import_counts if importing[0] else counts
            table[code] = table.get(code, 0) + 1

    threading.setprofile(on_event)
    sys.setprofile(on_event)
    return "setprofile"


def _track_imports() -> None:
    """Mark the time spent inside ``import`` statements and ``importlib.import_module``.

    Library start-up (transformers builds its lazy import tables with ~100k calls) would
    otherwise drown the model code that the profile is for.  Counted per process, not
    per thread: a thread importing while another computes is rare and only shifts counts
    between the two columns.
    """
    import builtins
    import importlib

    importing = _importing
    original_import = builtins.__import__
    original_import_module = importlib.import_module

    def tracked_import(*args: Any, **kwargs: Any) -> Any:
        importing[0] += 1
        try:
            return original_import(*args, **kwargs)
        finally:
            importing[0] -= 1

    def tracked_import_module(*args: Any, **kwargs: Any) -> Any:
        importing[0] += 1
        try:
            return original_import_module(*args, **kwargs)
        finally:
            importing[0] -= 1

    builtins.__import__ = tracked_import
    importlib.import_module = tracked_import_module


def _stop() -> None:
    if sys.version_info >= (3, 12):
        monitoring = sys.monitoring  # type: ignore[attr-defined]
        for tool in range(6):
            if monitoring.get_tool(tool) == "mldbg-profile":
                monitoring.set_events(tool, 0)
                monitoring.free_tool_id(tool)
    else:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


_CO_NEWLOCALS = 0x0002


def _qualnames_310() -> dict[int, str]:
    """Python 3.10 has no ``co_qualname``: rebuild it from each module's nested code.

    A class body is code without CO_NEWLOCALS; its functions are ``Class.method``, a
    function's nested ones ``f.<locals>.g``, as ``__qualname__`` spells them.
    """
    names: dict[int, str] = {}

    def walk(code: CodeType, prefix: str) -> None:
        for const in code.co_consts:
            if not isinstance(const, CodeType):
                continue
            qualname = prefix + const.co_name
            names[id(const)] = qualname
            is_class = not const.co_flags & _CO_NEWLOCALS
            walk(const, qualname + ("." if is_class else ".<locals>."))

    for table in (_counts, _import_counts):
        for code in list(table):
            if code.co_name == "<module>":
                walk(code, "")
    return names


def _qualname(code: CodeType, fallback: dict[int, str]) -> str:
    return getattr(code, "co_qualname", None) or fallback.get(id(code), code.co_name)


def _dump(out: str, info: dict[str, object]) -> None:
    _stop()
    fallback = _qualnames_310() if sys.version_info < (3, 11) else {}
    functions: dict[tuple[str, str, int], list[int]] = {}
    for column, table in enumerate((_counts, _import_counts)):
        for code, count in list(table.items()):
            key = (code.co_filename, _qualname(code, fallback), code.co_firstlineno)
            functions.setdefault(key, [0, 0])[column] += count
    modules = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) if module is not None else None
        if isinstance(file, str):
            modules[name] = file
    data = {
        **info,
        "ended_at": time.time(),
        "functions": [[f, q, line, *n] for (f, q, line), n in functions.items()],
        "modules": modules,
        "sys_path": list(sys.path),
        "stdlib": _stdlib_dirs(),
    }
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, out)


def _stdlib_dirs() -> list[str]:
    import sysconfig

    paths = sysconfig.get_paths()
    return sorted({paths[k] for k in ("stdlib", "platstdlib") if k in paths})


def _restore_environment() -> None:
    """The script and its children see the user's PYTHONPATH, not the runner's shim."""
    shim = os.environ.pop(_SHIM_VARIABLE, None)
    original = os.environ.pop(_ORIGINAL_PYTHONPATH, None)
    if original is not None:
        if original == _UNSET:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = original
    if shim:
        real = os.path.realpath(shim)
        sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != real]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(
            "usage: python -m mldbg.tools.profile.runner OUT.json SCRIPT [ARGS...]", file=sys.stderr
        )
        return 2
    out, script, args = argv[0], argv[1], argv[2:]
    _restore_environment()
    script_path = os.path.abspath(script)
    sys.argv[:] = [script, *args]
    if not getattr(sys.flags, "safe_path", False):
        directory = os.path.dirname(os.path.realpath(script_path))
        if sys.path:
            sys.path[0] = directory
        else:
            sys.path.insert(0, directory)
    info: dict[str, object] = {
        "script": script_path,
        "argv": args,
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "pid": os.getpid(),
        "started_at": time.time(),
        "exit_code": None,
        "exception": None,
    }
    written = False

    def finish() -> None:
        nonlocal written
        if not written:
            written = True
            _dump(out, info)

    atexit.register(finish)  # also covers sys.exit() from a thread and interpreter shutdown
    _track_imports()
    info["backend"] = _start_monitoring() if sys.version_info >= (3, 12) else _start_setprofile()
    code = 0
    try:
        runpy.run_path(script_path, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:
        import traceback

        code = 1
        info["exception"] = f"{type(exc).__name__}: {exc}"[:2000]
        traceback.print_exc()
    info["exit_code"] = code
    finish()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
