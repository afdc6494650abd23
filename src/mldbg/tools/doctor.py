"""``mldbg doctor``: which copy of each ML library the script's Python imports, and why,
with the daemon's and the run store's state.

The reading itself (the target interpreter, its packages, editable installs, git state)
is :mod:`mldbg.interpreters`; ``imported_copy`` and ``require_editable`` are importable
from here too, where the README has always named them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypedDict

from ..interpreters import (
    ImportedCopy,
    PackageReport,
    imported_copy,
    package_report,
    probe,
    require_editable,
    resolve_python,
)
from ..store.runs import mldbg_home

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_PACKAGES = ("torch", "mlx", "transformers", "diffusers", "mlx-lm")
MAX_PACKAGES = 50


class PythonReport(TypedDict):
    executable: str
    version: str
    prefix: str
    virtualenv: str | None
    site_packages: list[str]


class DaemonReport(TypedDict):
    running: bool
    pid: int | None
    url: str | None
    config_dir: str


class StoreReport(TypedDict):
    home: str
    exists: bool
    runs: int
    total_bytes: int
    tensors_bytes: int
    tensor_store: str  # where debug_save / debug_load meet (per user unless MLDBG_HOME)
    tensor_store_bytes: int
    warning: str | None


class DoctorResult(TypedDict):
    python: PythonReport
    packages: list[PackageReport]
    daemon: DaemonReport
    store: StoreReport
    warnings: list[str]
    truncated: bool


def _daemon() -> DaemonReport:
    from ..server.config import config_dir, read_server_info

    info = read_server_info()
    pid = info.get("pid") if info else None
    running = False
    if isinstance(pid, int):
        try:
            os.kill(pid, 0)
            running = True
        except OSError:
            running = False
    return {
        "running": running,
        "pid": pid if running else None,
        "url": info.get("url") if info and running else None,
        "config_dir": str(config_dir()),
    }


def _store(cwd: str | None) -> StoreReport:
    from ..store import size as store_size
    from ..store import tensors
    from ..store.runs import list_runs

    home = mldbg_home(cwd)
    usage = store_size.usage(home)
    tensor_home = tensors.tensor_home(cwd)
    return {
        "home": str(home),
        "exists": home.is_dir(),
        "runs": len(list_runs(home)),
        "total_bytes": usage["total_bytes"],
        "tensors_bytes": usage["tensors_bytes"],
        "tensor_store": str(tensors.store_dir(tensor_home)),
        "tensor_store_bytes": tensors.store_size(tensor_home),
        "warning": store_size.warning(home),
    }


def doctor(
    packages: list[str] | None = None, *, python: str | None = None, cwd: str | None = None
) -> DoctorResult:
    """The interpreter, each library's copy (editable? which checkout? which branch?), mldbg."""
    cwd = os.path.abspath(cwd or os.getcwd())
    interpreter = resolve_python(python, cwd)
    names = list(dict.fromkeys([*DEFAULT_PACKAGES, *(packages or [])]))
    truncated = len(names) > MAX_PACKAGES
    names = names[:MAX_PACKAGES]
    data = probe(interpreter, names, cwd=cwd)
    reports = [package_report(data["packages"][name]) for name in names]
    for name in packages or []:
        report = next(r for r in reports if r["name"] == name)
        if not report["found"]:
            report["warnings"].append(f"{name} is not importable by {data['python']}")
    # the interpreter's own virtualenv (its prefix), never the caller's $VIRTUAL_ENV
    venv = data["prefix"] if data["prefix"] != data["base_prefix"] else None
    store = _store(cwd)
    warnings = [w for r in reports for w in r["warnings"]]
    if store["warning"]:
        warnings.append(store["warning"])
    return {
        "python": {
            "executable": data["python"],
            "version": data["version"],
            "prefix": data["prefix"],
            "virtualenv": venv,
            "site_packages": data.get("site_packages", [])[:10],
        },
        "packages": reports,
        "daemon": _daemon(),
        "store": store,
        "warnings": warnings,
        "truncated": truncated,
    }


# -- human output -------------------------------------------------------------------------------


def render_doctor(result: DoctorResult, console: Console) -> None:
    from rich.markup import escape

    py = result["python"]
    console.print(
        f"[bold]python[/] {escape(py['executable'])} ({py['version']})"
        + (f", virtualenv {escape(py['virtualenv'])}" if py["virtualenv"] else ", no virtualenv")
    )
    for p in result["packages"]:
        if not p["found"]:
            console.print(f"  [dim]{p['name']:<14} not installed[/]")
            continue
        kind = (
            "[yellow]shadowed[/]"  # the editable checkout is not what this Python imports
            if p["shadowed"]
            else "[green]editable[/]"
            if p["editable"]
            else "installed"
        )
        line = f"  [bold]{p['name']:<14}[/] {p['version'] or '?':<12} {kind} {escape(str(p['imported_from']))}"
        git = p["git"]
        if git:
            state = "[yellow]uncommitted changes[/]" if git["dirty"] else "clean"
            line += f"\n  {'':<14} git {escape(git['root'])} on {escape(str(git['branch']))} @ {git['commit']}, {state}"
        console.print(line)
    d = result["daemon"]
    console.print(
        "[bold]daemon[/] "
        + (
            f"running (pid {d['pid']}, {d['url']})"
            if d["running"]
            else "not running (starts on demand)"
        )
    )
    s = result["store"]
    console.print(
        f"[bold]store[/] {escape(s['home'])}: {s['runs']} run(s), {s['total_bytes'] / 1e6:.1f} MB"
    )
    console.print(
        f"[bold]tensor store[/] {escape(s['tensor_store'])}: "
        f"{s['tensor_store_bytes'] / 1e6:.1f} MB (debug_save / debug_load)"
    )
    for warning in result["warnings"]:
        console.print(f"[yellow]! {escape(warning)}[/]")


__all__ = [
    "DoctorResult",
    "ImportedCopy",
    "doctor",
    "imported_copy",
    "render_doctor",
    "require_editable",
]
