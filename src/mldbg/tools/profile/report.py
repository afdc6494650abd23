"""``mldbg profile``: run a script, then say where to put breakpoints and what to read first.

The answer is a bounded JSON document (:class:`ProfileResult`) and a Markdown report
``PROFILE_REPORT_<script>_<time>.md`` in the run's directory of the run store.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ...store.runs import open_private, write_json_atomic
from .analyze import (
    CALL_METHODS,
    COMPONENTS,
    FileStats,
    Scope,
    VariantGroup,
    file_stats,
    hot_files,
    variant_groups,
)
from .collect import RawProfile, run_profiled

if TYPE_CHECKING:
    from rich.console import Console

MAX_FILES = 40
MAX_BREAKPOINTS = 12
TOP_FUNCTIONS = 5
REPORT_FILES = 200  # the Markdown report lists more than the JSON answer
PURPOSE = (
    "Where to put breakpoints and what to read first: the library files and functions "
    "this script really ran, most-called first, grouped by package and by the component "
    "their path suggests, and which of several look-alike implementations actually ran."
)


class FunctionEntry(TypedDict):
    name: str
    line: int
    calls: int


class FileEntry(TypedDict):
    path: str
    package: str
    component: str
    calls: int
    functions_run: int
    hot: bool
    top_functions: list[FunctionEntry]


class GroupEntry(TypedDict):
    name: str
    files: int
    calls: int
    top_files: list[str]


class VariantMember(TypedDict):
    name: str
    file: str
    line: int
    calls: int
    ran: bool


class VariantEntry(TypedDict):
    kind: str
    pattern: str
    ran: list[str]
    not_run: list[str]
    members: list[VariantMember]


class Breakpoint(TypedDict):
    location: str
    function: str
    calls: int


class ProfileResult(TypedDict):
    purpose: str
    report: str
    run_id: str
    run_dir: str
    script: str
    args: list[str]
    python: str
    python_version: str
    backend: str
    exit_code: int | None
    signal: int | None
    exception: str | None
    duration_s: float
    include: list[str]
    include_unmatched: list[str]
    totals: dict[str, int]
    files: list[FileEntry]
    files_total: int
    files_truncated: bool
    packages: list[GroupEntry]
    components: list[GroupEntry]
    variants: list[VariantEntry]
    variants_total: int
    breakpoints: list[Breakpoint]
    read_first: list[str]
    output_tail: str
    truncated: bool


def _file_entry(f: FileStats, hot: set[str]) -> FileEntry:
    ranked = sorted(
        ((name, line, n) for (name, line), n in f.functions.items() if name != "<module>"),
        key=lambda item: (-item[2], item[1]),
    )
    return {
        "path": f.path,
        "package": f.package,
        "component": f.component,
        "calls": f.calls,
        "functions_run": f.functions_run,
        "hot": f.path in hot,
        "top_functions": [
            {"name": name, "line": line, "calls": n} for name, line, n in ranked[:TOP_FUNCTIONS]
        ],
    }


def _groups(files: list[FileStats], key: str) -> list[GroupEntry]:
    grouped: dict[str, list[FileStats]] = {}
    for f in files:
        grouped.setdefault(getattr(f, key), []).append(f)
    entries: list[GroupEntry] = [
        {
            "name": name,
            "files": len(members),
            "calls": sum(m.calls for m in members),
            "top_files": [m.path for m in members if m.calls][:3],
        }
        for name, members in grouped.items()
    ]
    order = {name: i for i, name in enumerate(COMPONENTS)} if key == "component" else {}
    entries.sort(key=lambda e: (-e["calls"], order.get(e["name"], 99), e["name"]))
    return entries


def _variant(group: VariantGroup) -> VariantEntry:
    return {
        "kind": group.kind,
        "pattern": group.pattern,
        "ran": [m.name for m in group.members if m.calls],
        "not_run": [m.name for m in group.members if not m.calls],
        "members": [
            {"name": m.name, "file": m.file, "line": m.line, "calls": m.calls, "ran": m.calls > 0}
            for m in group.members
        ],
    }


# Components that hold the model's own computation: read these before the plumbing.
MODEL_COMPONENTS = ("transformer/DiT", "attention", "text encoder", "vae", "scheduler", "pipeline")
MAX_READ_FIRST = 8


def _read_first(files: list[FileStats], hot: set[str]) -> list[FileStats]:
    """Model code that ran (most calls first), then the hot plumbing files.

    Calls alone would put configuration ``__getattribute__`` and import helpers first;
    a person porting a model reads the modeling and attention files first.
    """
    model = [f for f in files if f.component in MODEL_COMPONENTS and f.package != "(script)"]
    rest = [f for f in files if f.path in hot and f not in model and f.package != "(script)"]
    return (model + rest)[:MAX_READ_FIRST]


def _plumbing(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return last.startswith("<") or (
        last.startswith("__") and last.endswith("__") and last != "__call__"
    )


def _forward(name: str) -> bool:
    """A model's own computation: ``Module.forward`` (torch), ``__call__`` (MLX), ``call``."""
    return "." in name and name.rsplit(".", 1)[-1] in CALL_METHODS


def _breakpoints(files: list[FileStats], per_file: int = 3) -> list[Breakpoint]:
    """Breakpoints that surely hit, in the files to read first: each file's ``forward``
    methods that ran (where a person porting a model stops first, though its helpers are
    called far more often) and its most-called functions.  The forward methods are kept
    first when the list is full."""
    forwards: list[tuple[int, Breakpoint]] = []
    helpers: list[tuple[int, Breakpoint]] = []
    for order, f in enumerate(files):
        ranked = sorted(
            ((n, line, name) for (name, line), n in f.functions.items() if not _plumbing(name)),
            key=lambda c: (-c[0], c[1]),
        )
        methods = [c for c in ranked if _forward(c[2])][:per_file]
        rest = [c for c in ranked if not _forward(c[2])][:per_file]
        for into, chosen in ((forwards, methods), (helpers, rest)):
            into += [
                (order, {"location": f"{f.path}:{line}", "function": name, "calls": n})
                for n, line, name in chosen
            ]
    kept = (forwards + helpers)[:MAX_BREAKPOINTS]
    # in the order of the files to read, each file's forward methods first
    kept.sort(key=lambda item: (item[0], not _forward(item[1]["function"])))
    return [bp for _order, bp in kept]


def build_result(raw: RawProfile, include: list[str] | None, cwd: str) -> ProfileResult:
    scope = Scope(raw, include, cwd)
    files = file_stats(raw, scope)
    ran = [f for f in files if f.calls]
    hot = hot_files(ran)
    first = _read_first(ran, hot)
    groups, groups_total = variant_groups(files)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    stem = Path(raw.script).stem
    report = raw.run.file(f"PROFILE_REPORT_{stem}_{stamp}.md")
    entries = [_file_entry(f, hot) for f in ran]
    result: ProfileResult = {
        "purpose": PURPOSE,
        "report": str(report),
        "run_id": raw.run.run_id,
        "run_dir": str(raw.run.path),
        "script": raw.script,
        "args": raw.args,
        "python": raw.python,
        "python_version": raw.python_version,
        "backend": raw.backend,
        "exit_code": raw.exit_code,
        "signal": raw.signal,
        "exception": raw.exception,
        "duration_s": round(raw.duration_s, 3),
        "include": list(include or []),
        "include_unmatched": scope.unmatched,
        "totals": {
            "files_run": len(ran),
            "files_imported": sum(1 for f in files if f.imported),
            "functions_run": sum(f.functions_run for f in ran),
            "calls": sum(f.calls for f in ran),
        },
        "files": entries[:MAX_FILES],
        "files_total": len(entries),
        "files_truncated": len(entries) > MAX_FILES,
        "packages": _groups(ran, "package")[:20],
        "components": _groups(ran, "component"),
        "variants": [_variant(g) for g in groups],
        "variants_total": groups_total,
        "breakpoints": _breakpoints(first),
        "read_first": [f.path for f in first],
        "output_tail": raw.output_tail,
        "truncated": len(entries) > MAX_FILES or groups_total > len(groups),
    }
    text = markdown(result, [_file_entry(f, hot) for f in ran[:REPORT_FILES]])
    # private, as every file of the run store: it names the files and arguments that ran
    with open(
        open_private(report, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w", encoding="utf-8"
    ) as handle:
        handle.write(text)
    write_json_atomic(raw.run.file("profile_result.json"), result)
    return result


def profile(
    script: str,
    args: list[str],
    *,
    include: list[str] | None = None,
    python: str | None = None,
    cwd: str | None = None,
) -> ProfileResult:
    """Run ``script`` (not under the debugger) and report which library code really ran."""
    cwd = os.path.abspath(cwd or os.getcwd())
    raw = run_profiled(script, args, python=python, cwd=cwd)
    return build_result(raw, include, cwd)


# -- Markdown -----------------------------------------------------------------------------------


def _md(text: object) -> str:
    return str(text).replace("|", "\\|")


def markdown(result: ProfileResult, files: list[FileEntry]) -> str:
    lines = [
        f"# Profile of {Path(result['script']).name}",
        "",
        f"**Purpose.** {PURPOSE}",
        "",
        f"* Script: `{result['script']}` {' '.join(result['args'])}",
        f"* Python: `{result['python']}` ({result['python_version']}, counted with "
        f"{result['backend']}); exit code {result['exit_code']}"
        + (f", signal {result['signal']}" if result["signal"] else ""),
        f"* Scope: {', '.join(result['include']) if result['include'] else 'everything outside the standard library'}"
        + (
            f" (matched nothing: {', '.join(result['include_unmatched'])})"
            if result["include_unmatched"]
            else ""
        ),
        f"* {result['totals']['files_run']} files ran ({result['totals']['files_imported']} imported), "
        f"{result['totals']['functions_run']} functions, {result['totals']['calls']} calls",
        "",
        "## Read first",
        "",
    ]
    lines += [f"1. `{path}`" for path in result["read_first"]] or ["(nothing in scope ran)"]
    lines += ["", "## Where to put breakpoints", ""]
    lines += [
        f"* `{bp['location']}` {_md(bp['function'])} ({bp['calls']} calls)"
        for bp in result["breakpoints"]
    ] or ["(no library function in scope ran)"]
    lines += ["", "## Which implementation ran", ""]
    if not result["variants"]:
        lines.append("(no look-alike implementations in scope)")
    for v in result["variants"]:
        lines.append(
            f"* `{v['pattern']}` ({v['kind']} look-alikes): ran **{', '.join(v['ran']) or 'none'}**"
            + (f"; not run: {', '.join(v['not_run'])}" if v["not_run"] else "")
        )
        for m in v["members"]:
            if m["ran"]:
                lines.append(f"  * `{m['file']}:{m['line']}` {_md(m['name'])} ({m['calls']} calls)")
    lines += [
        "",
        "## By component",
        "",
        "| component | files | calls | top files |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {_md(c['name'])} | {c['files']} | {c['calls']} | {'<br>'.join(f'`{p}`' for p in c['top_files'])} |"
        for c in result["components"]
    ]
    lines += ["", "## By package", "", "| package | files | calls |", "|---|---|---|"]
    lines += [f"| {_md(p['name'])} | {p['files']} | {p['calls']} |" for p in result["packages"]]
    lines += [
        "",
        "## Files, most calls first",
        "",
        "| # | calls | hot | component | file | most-called functions |",
        "|---|---|---|---|---|---|",
    ]
    for i, f in enumerate(files, start=1):
        functions = ", ".join(
            f"{_md(fn['name'])}:{fn['line']} ({fn['calls']})" for fn in f["top_functions"]
        )
        lines.append(
            f"| {i} | {f['calls']} | {'🔥' if f['hot'] else ''} | {_md(f['component'])} | `{f['path']}` | {functions} |"
        )
    if result["files_total"] > len(files):
        lines.append(f"\n({result['files_total'] - len(files)} more files left out)")
    return "\n".join(lines) + "\n"


# -- human output -------------------------------------------------------------------------------


def render_profile(result: ProfileResult, console: Console) -> None:
    from rich.markup import escape

    console.print(f"[bold]profile of {escape(result['script'])}[/] [dim]({result['backend']})[/]")
    if result["exit_code"] not in (0, None) or result["signal"]:
        console.print(
            f"[yellow]the script ended with exit code {result['exit_code']}"
            + (f", signal {result['signal']}" if result["signal"] else "")
            + " (the counts cover what ran until then)[/]"
        )
    totals = result["totals"]
    console.print(
        f"{totals['files_run']} files ran, {totals['functions_run']} functions, {totals['calls']} calls"
    )
    if result["include_unmatched"]:
        console.print(
            f"[yellow]--include matched nothing the script imported: {escape(', '.join(result['include_unmatched']))}[/]"
        )
    console.print("\n[bold]read first[/]")
    for path in result["read_first"]:
        console.print(f"  {escape(path)}")
    if result["breakpoints"]:
        console.print("\n[bold]breakpoints that will hit[/]")
        for bp in result["breakpoints"][:6]:
            console.print(f"  {escape(bp['location'])}  {escape(bp['function'])} ({bp['calls']})")
    if result["variants"]:
        console.print("\n[bold]which implementation ran[/]")
        for v in result["variants"][:8]:
            not_run = (
                f" [dim](not: {escape(', '.join(v['not_run'][:4]))})[/]" if v["not_run"] else ""
            )
            console.print(
                f"  {escape(v['pattern'])}: [green]{escape(', '.join(v['ran']))}[/]{not_run}"
            )
    console.print("\n[bold]components[/]")
    for c in result["components"]:
        console.print(f"  {c['name']:<16} {c['files']:>4} files {c['calls']:>10} calls")
    console.print(f"\nreport: {escape(result['report'])}")
