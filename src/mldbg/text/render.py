"""Human output for each kind of answer; ``--json`` bypasses all of this."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import results as R
from ..memory import human_size as _size
from .console import Table, call_text, captured, err, escape, out, plain_line, print_table

if TYPE_CHECKING:
    from ..verbs import Surface

__all__ = ["Table", "err", "escape", "out", "plain_line"]  # used through render by other modules


def where(location: Mapping[str, object] | None) -> str:
    if not location:
        return "?"
    return f"{location.get('file')}:{location.get('line')} in {location.get('function')}()"


def code_block(location: Mapping[str, object] | None) -> None:
    """The lines around a stop (``Location.code``: [number, text] pairs), the current one marked."""
    code = location.get("code") if location else None
    if not code or not isinstance(code, list):
        return
    current = location.get("line") if location else None
    for line, text in code:
        marker = "[bold green]->[/]" if line == current else "  "
        style = "bold" if line == current else "dim"
        out.print(f"{marker} [{style}]{line:>5}  {escape(text)}[/]")


def state(data: R.State) -> None:
    for warning in data.get("warnings") or []:
        err.print(f"[yellow]warning:[/] {escape(str(warning))}")
    name = data.get("session")
    kind = data.get("state")
    if kind == "paused":
        reason = data.get("reason")
        head = f"[bold]{name}[/]: paused ({reason}) at {escape(where(data.get('location')))}"
        thread = data.get("thread") or {}
        if thread.get("name") and thread.get("name") != "MainThread":
            head += f" [dim]thread {escape(str(thread['name']))}[/]"
        out.print(head)
        condition_error = data.get("condition_error")
        if condition_error:
            out.print(f"[yellow]{escape(condition_error)}[/]")
        exception = data.get("exception")
        if exception:
            out.print(f"[red]{escape(exception['type'])}: {escape(exception['message'])}[/]")
        checkpoint = data.get("checkpoint")
        if checkpoint:
            out.print(
                f"checkpoint {escape(str(checkpoint.get('name')))} (hit {checkpoint.get('hit_count')})"
            )
        if data.get("note"):
            out.print(f"[yellow]{escape(str(data['note']))}[/]")
        code_block(data.get("location"))
        for item in data.get("watches") or []:
            value = item.get("value", item.get("error"))
            out.print(
                f"[cyan]watch[/] {escape(str(item.get('expression')))} = {escape(str(value))}"
            )
        memory = data.get("memory") or {}
        if "mlx" in memory or "torch" in memory:  # a framework is loaded
            from ..memory import one_line

            out.print(f"[dim]memory: {escape(one_line(memory))}[/]")
        if data.get("fix"):  # worded for the surface printing it
            calls = [call_text(f) for f in data["fix"][:3]]
            out.print(f"[dim]try: {escape('; or '.join(calls))}[/]")
    elif kind == "running":
        out.print(f"[bold]{name}[/]: running (pid {data.get('pid')})")
    elif kind in ("exited", "crashed"):
        how = (
            f"signal {data.get('signal')}"
            if data.get("signal")
            else f"exit code {data.get('exit_code')}"
        )
        if data.get("recovered"):  # listed by a restarted daemon (server/live_runs.py)
            how = f"its daemon went away; found {data['recovered'].get('found')}"
        colour = "red" if kind == "crashed" or data.get("exit_code") else "green"
        out.print(f"[bold]{name}[/]: [{colour}]{kind}[/] ({how})")
        exception = data.get("exception")
        if exception and exception.get("traceback"):
            out.print(f"[red]{escape(exception['traceback'].rstrip())}[/]")
        elif data.get("output_tail"):
            out.print("[dim]last output:[/]")
            out.print(escape(data["output_tail"].rstrip()))
    else:
        out.print(f"[bold]{name}[/]: {kind}")
    paused = data.get("paused_children") or []
    if paused:
        shown = ", ".join(paused[:5]) + (f" (+{len(paused) - 5} more)" if len(paused) > 5 else "")
        out.print(f"[yellow]paused child processes:[/] {escape(shown)} [dim](-s NAME)[/]")
    detached = data.get("detached_children")
    if detached:
        last = detached["last"][-1] if detached["last"] else None
        out.print(
            f"[red]{detached['total']} child process(es) run undebugged[/] "
            f"(could not reach the debugger; last: pid {last and last['pid']}: "
            f"{escape(str(last and last['reason']))})"
        )


def evaluation(data: R.Evaluation) -> None:
    if data.get("output"):
        out.print(escape(data["output"].rstrip("\n")), style="dim")
    against = data.get("against")
    if not against:
        plain_line(str(data.get("result")))
        return
    plain_line(f"{data.get('session') or 'this'}: {data.get('result')}")
    plain_line(f"{against.get('session')}: {against.get('result')}")
    diff = data.get("difference") or {}
    if diff.get("error"):
        out.print(f"[yellow]difference: {escape(str(diff['error']))}[/]")
    elif "b_minus_a" in diff or "max_abs" not in diff:
        shown = {k: diff[k] for k in ("equal", "b_minus_a", "rel") if k in diff}
        out.print(f"difference: {escape(str(shown))}")
    else:

        def g(value: object) -> str:
            return f"{value:.4g}" if isinstance(value, float) else str(value)

        text = (
            f"difference: max_abs={g(diff.get('max_abs'))} rel_rms={g(diff.get('rel_rms'))} "
            f"cosine={g(diff.get('cosine'))} mismatched={diff.get('mismatched')}"
        )
        worst = diff.get("worst")
        if worst:
            text += f"; worst at {worst['index']}: {g(worst['a'])} vs {g(worst['b'])}"
        out.print(escape(text))


def stack(data: R.Stack) -> None:
    selected = data.get("selected", 0)
    for frame in data.get("frames", []):
        mark = "[bold green]>[/]" if frame["index"] == selected else " "
        lib = " [dim](library)[/]" if frame.get("library") else ""
        out.print(f"{mark} #{frame['index']:<3} {escape(where(frame))}{lib}")
    if data.get("hidden_library_frames"):
        out.print(
            f"[dim]{data['hidden_library_frames']} library frame(s) hidden: --all shows them[/]"
        )
    if data.get("truncated"):
        out.print(
            f"[dim]{data.get('shown')} of {data.get('total')} frames: --limit N shows more[/]"
        )


def frame(data: R.FrameSelected) -> None:
    info = data.get("frame") or {}
    out.print(f"frame #{data.get('selected')}: {escape(where(info))}")
    if data.get("note"):
        out.print(f"[yellow]{escape(str(data['note']))}[/]")
    code_block(info)


def variables(data: R.Variables) -> None:
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    table.add_column("name")
    table.add_column("type", style="cyan")
    table.add_column("value")
    for var in data.get("variables", []):
        name = var["name"] if var.get("scope") == "local" else f"{var['name']} [dim](global)[/]"
        table.add_row(
            name if var.get("scope") != "local" else escape(name),
            escape(var["type"]),
            escape(var["summary"]),
        )
    print_table(table, keep=("name",), fold=("value",))
    if data.get("truncated"):
        call = data.get("next")
        offset = call["args"].get("offset", "") if call else ""
        out.print(
            f"[dim]{data.get('shown')} of {data.get('total')} variables shown: "
            f"--offset {offset} for more, --filter GLOB to narrow[/]"
        )


def breakpoints(data: R.Breakpoints) -> None:
    items = data.get("breakpoints", [])
    if not items:
        out.print("no breakpoints")
        return
    for bp in items:
        out.print(breakpoint_line(bp))


def breakpoint_line(bp: R.BreakpointInfo) -> str:
    if bp.get("checkpoint"):
        parts = [f"#{bp['id']} checkpoint {escape(bp['checkpoint'])}"]
    elif bp.get("exception"):
        types = ", ".join(bp.get("types") or []) or "every exception"
        parts = [f"#{bp['id']} exception {escape(bp['exception'])}: {escape(types)}"]
    elif "nonfinite" in bp:  # the tripwire
        rule = ["NaN/Inf"] if bp.get("nonfinite") else []
        if bp.get("max_abs") is not None:
            rule.append(f"|x| > {bp['max_abs']:g}")
        if bp.get("subnormal"):
            rule.append("subnormal")
        parts = [
            f"#{bp['id']} tripwire: module outputs with {' or '.join(rule)}; "
            "MLX indices out of range"
        ]
    elif bp.get("pending"):
        parts = [
            f"#{bp['id']} function {escape(str(bp.get('function')))} [yellow](pending: "
            "set when its module is imported)[/]"
        ]
    else:
        parts = [f"#{bp['id']} {escape(bp['file'])}:{bp['line']}"]
        if bp.get("function"):
            parts.append(f"(function {escape(bp['function'])})")
        if bp.get("temporary"):
            parts.append("(one-shot)")
    condition = bp.get("condition")
    if condition:
        parts.append(f"if {escape(condition)}")
    if bp.get("hits"):
        parts.append(f"hits {escape(str(bp['hits']))}")
    if bp.get("log"):
        parts.append(f"log {escape(repr(bp['log']))}")
    parts.append(f"[dim](hit {bp.get('hit_count', 0)}x)[/]")
    return " ".join(parts)


def sessions(data: R.Sessions) -> None:
    items = data.get("sessions", [])
    if not items:
        out.print("no sessions")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("session", "parent", "state", "pid", "where", "run"):
        table.add_column(column)
    for s in items:
        place = where(s.get("location")) if s.get("state") == "paused" else ""
        if s.get("state") in ("exited", "crashed"):
            place = (
                f"signal {s['signal']}"
                if s.get("signal")
                else "ended"  # a child process whose exit code only its parent saw
                if s.get("exit_code") is None
                else f"exit code {s.get('exit_code')}"
            )
            if s.get("recovered"):
                place = "daemon lost"
        if s.get("detached_children"):
            place += f" ({s['detached_children'].get('total')} children undebugged)"
        table.add_row(
            s["session"],
            s.get("parent") or "",
            s["state"],
            str(s.get("pid")),
            escape(place),
            s.get("run_id") or "",
        )
    # the names are what the user types next (-s NAME): never cut, whatever the width
    print_table(table, keep=("session", "parent", "run"))


def runs(data: R.Runs) -> None:
    items = data.get("runs", [])
    if not items:
        out.print(f"no runs under {escape(data.get('home', ''))}")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("run", "state", "ended", "checkpoints", "size", "script"):
        table.add_column(column)
    for run in items:
        how = (
            f"signal {run['signal']}"
            if run.get("signal")
            else ("" if run.get("exit_code") is None else f"exit {run['exit_code']}")
        )
        table.add_row(
            run["run_id"],
            str(run.get("state") or "?"),
            how,
            str(run.get("checkpoints", 0)),
            _size(run.get("size_bytes", 0)),
            escape(str(run.get("script") or "")),
        )
    print_table(table, keep=("run", "script"))


def checkpoints(data: R.Checkpoints) -> None:
    records = data.get("checkpoints", [])
    out.print(f"[dim]{escape(data.get('path', ''))}[/]")
    if not records:
        out.print("no checkpoint records")
    for record in records:
        loc = record.get("location") or {}
        out.print(
            f"[bold]{escape(str(record.get('checkpoint_name')))}[/] #{record.get('hit_count')} "
            f"[dim]{escape(str(loc.get('file')))}:{loc.get('line')} in {escape(str(loc.get('function')))}()[/]"
        )
        for name, value in (record.get("variables") or {}).items():
            out.print(f"    {escape(name)} = {escape(_value_line(value))}")
    if data.get("unreadable_lines"):
        out.print(
            f"[yellow]{data['unreadable_lines']} line(s) could not be read (cut short by a kill?)[/]"
        )


def checkpoint_pairs(data: R.CheckpointPairs) -> None:
    """compare-checkpoints: per name and hit, each variable's two sides and their gap."""
    a, b = data.get("a"), data.get("b")
    out.print(
        f"[bold]A[/] {escape(str(a and a['run_id']))}  [bold]B[/] {escape(str(b and b['run_id']))}"
    )
    if not data.get("pairs"):
        out.print("no checkpoint name and hit is in both runs")
    for pair in data.get("pairs", []):
        out.print(f"[bold]{escape(str(pair.get('checkpoint_name')))}[/] #{pair.get('hit_count')}")
        for var, item in (pair.get("variables") or {}).items():
            out.print(f"    {escape(var)}: {escape(_pair_line(item))}")
        for side in ("only_a", "only_b"):
            if pair.get(side):
                out.print(
                    f"    [dim]{side.replace('_', ' in ').upper()}: {escape(', '.join(pair[side]))}[/]"
                )
    counts = data.get("unpaired_counts") or {}
    for side in ("a", "b"):
        if counts.get(side):
            unpaired = data.get("unpaired_a") if side == "a" else data.get("unpaired_b")
            names = ", ".join(unpaired or [])
            out.print(f"[dim]only in {side.upper()} ({counts[side]}): {escape(names)}[/]")


def _pair_line(item: R.VariableComparison) -> str:
    def g(value: object) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    if item.get("kind") == "value":
        same = "equal" if item.get("equal") else "differ"
        return f"{g(item.get('a'))} vs {g(item.get('b'))} ({same})"
    if item.get("kind") != "tensor":
        return str(item.get("note", ""))
    shape_a, shape_b = _dims(item.get("shape_a")), _dims(item.get("shape_b"))
    text = f"{item.get('dtype_a')}[{shape_a}] vs {item.get('dtype_b')}[{shape_b}]"
    if not item.get("shape_match"):
        text += " SHAPES DIFFER"
    if "stats_max_rel" in item:
        mean_a = (item.get("stats_a") or {}).get("mean")
        mean_b = (item.get("stats_b") or {}).get("mean")
        text += f" mean {g(mean_a)} vs {g(mean_b)}, stats rel {g(item['stats_max_rel'])}"
    if "preview_max_abs" in item:
        text += f", first values max |Δ| {g(item['preview_max_abs'])}"
    if item.get("note"):
        text += f" ({item['note']})"
    return text


def _dims(shape: object) -> str:
    """A recorded shape as ``2×3``; "" where the record has none."""
    return "×".join(map(str, shape)) if isinstance(shape, list | tuple) else ""


def first_nonfinite(data: R.FirstNonfinite) -> None:
    first = data.get("first")
    source = data.get("source")
    label = source["label"] if source else ""
    if not first:
        out.print(f"every captured value of {escape(str(label))} is finite")
        return
    where = (
        f"{first.get('module')}#{first.get('call')} ({first.get('class')})"
        if "module" in first
        else "entry"
    )
    out.print(
        f"[bold red]{escape(where)}[/] returned non-finite values first ({escape(str(label))})"
    )
    for entry in first.get("entries", []):
        shape = "×".join(map(str, entry.get("shape") or []))
        out.print(
            f"    {escape(entry['name'])} {entry.get('dtype')}[{shape}] nan={entry.get('nan')} inf={entry.get('inf')}"
        )
    if first.get("inputs_checked") is False:
        out.print("[dim]captured without inputs: the first non-finite output is named[/]")
    if data.get("victims"):
        out.print(f"[dim]{data['victims']} later call(s) received them and passed them on[/]")


def module_rows(data: R.ModuleTable) -> None:
    """module-table: one line per call, both sides' times and dtypes."""
    two = data.get("b") is not None
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns = ["module", "class", "A ms", "A self", "A dtypes"]
    if two:
        columns += ["B ms", "B self", "B dtypes", "B/A"]
    for column in columns:
        table.add_column(column)

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.3g}"

    def dtypes(side: dict[str, Any]) -> str:
        return f"{','.join(side['in_dtypes']) or '-'}→{','.join(side['out_dtypes']) or '-'}"

    for row in data.get("rows", []):
        side_a = row["a"]
        name = "  " * int(row.get("depth") or 0) + f"{row['module']}#{row['call']}"
        cells = [escape(name), escape(str(row.get("class"))), ms(side_a["seconds"])]
        cells += [ms(side_a["self_seconds"]), dtypes(side_a)]
        if two:
            side_b = row.get("b")
            if side_b is None:
                cells += ["-", "-", "[dim]not in B[/]", "-"]
            else:
                mark = "[bold red]" if row.get("dtype_differs") else ""
                shown = dtypes(side_b)
                ratio = row.get("time_ratio")
                cells += [ms(side_b["seconds"]), ms(side_b["self_seconds"])]
                cells += [f"{mark}{shown}[/]" if mark else shown]
                cells += ["-" if ratio is None else f"{ratio:.2g}×"]
        table.add_row(*cells)
    print_table(table, keep=("module",))
    summary = data.get("summary") or {}
    first = summary.get("first_dtype_difference")
    if first:
        out.print(
            f"[bold]{summary.get('dtype_differences')} call(s) work in other dtypes[/]; first: "
            f"{escape(first['module'])}#{first['call']}"
        )
    if data.get("truncated"):
        out.print(f"[dim]{data.get('shown')} of {data.get('total')} calls: --offset/--limit[/]")


def _value_line(value: object) -> str:
    if isinstance(value, dict) and "shape" in value:
        shape = ", ".join(map(str, value.get("shape", [])))
        stats = value.get("stats") or {}
        parts = [f"{value.get('dtype')}[{shape}] {value.get('device')}"]
        parts += [
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in stats.items()
            if v not in (None, 0) or k in ("min", "max")
        ]
        return " ".join(parts)
    if isinstance(value, dict) and "repr" in value:
        return str(value["repr"])
    text = json.dumps(value)
    return text if len(text) < 200 else text[:199] + "…"


def tensors(data: R.TensorStore) -> None:
    items = data.get("tensors", [])
    out.print(f"[dim]{escape(data.get('path', ''))} ({_size(data.get('size_bytes', 0))})[/]")
    if not items:
        out.print("no stored tensors")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("name", "dtype", "shape", "size", "framework", "saved"):
        table.add_column(column)
    for item in items:
        meta = item.get("metadata") or {}
        table.add_row(
            escape(item["name"]),
            str(item.get("dtype", item.get("error", "?"))),
            str(item.get("shape")),
            _size(item.get("size_bytes", 0)),
            str(meta.get("framework", "")),
            str(meta.get("saved_at", "")),
        )
    print_table(table, keep=("name",))


def tensor_info(item: R.TensorRecord) -> None:
    out.print(
        f"[bold]{escape(item['name'])}[/]  {item.get('dtype')} {item.get('shape')}  {_size(item.get('size_bytes', 0))}"
    )
    out.print(f"[dim]{escape(item['path'])}[/]")
    for key, value in sorted((item.get("metadata") or {}).items()):
        out.print(f"  {escape(key)}: {escape(str(value))}")


def cleaned(data: R.Cleaned) -> None:
    verb = "would remove" if data.get("dry_run") else "removed"
    out.print(f"{verb} {len(data['removed'])} run(s), {_size(data.get('freed_bytes', 0))}")
    for run_id in data["removed"]:
        out.print(f"  {run_id}")
    for run_id in data.get("kept_live", []):
        out.print(f"  kept {run_id} (still running)")


def output(data: R.Output) -> None:
    """The script's own bytes, unstyled: rich would reflow and interpret them."""
    sys.stdout.write(data["output"])
    sys.stdout.flush()
    if data.get("truncated"):
        err.print(
            f"[dim]({len(data['output'].encode('utf-8', 'replace'))} of {data.get('size')} bytes "
            f"shown; all of it is in {escape(str(data.get('path')))}; --offset N --limit N pages)[/]"
        )


def error(payload: Mapping[str, object]) -> None:
    err.print(f"[bold red]error:[/] {escape(str(payload.get('error')))}")
    if payload.get("hint"):
        err.print(f"[dim]hint:[/] {escape(str(payload['hint']))}")
    tail = payload.get("output_tail")
    if tail and isinstance(tail, str):
        err.print("[dim]last output of the script:[/]")
        err.print(escape(tail.rstrip()))


def trace(data: R.Trace) -> None:
    steps = data.get("steps", [])
    if not steps:
        out.print(f"no stops recorded in {escape(str(data.get('path')))}")
    for step in steps:
        out.print(
            f"[bold]{escape(str(step.get('reason')))}[/] at {escape(where(step.get('location')))}"
        )
        for var in step.get("variables", [])[:8]:
            out.print(f"    {escape(str(var.get('name')))} = {escape(str(var.get('summary')))}")
    if data.get("truncated"):
        out.print(f"[dim]{data.get('shown')} of {data.get('total')} stops: --last N shows more[/]")


def breakpoint_set(bp: R.BreakpointInfo) -> None:
    out.print("breakpoint " + breakpoint_line(bp))
    if bp.get("warning"):
        err.print(f"[yellow]warning:[/] {escape(str(bp['warning']))}")


def breakpoint_removed(bp: R.BreakpointInfo) -> None:
    out.print(f"removed {breakpoint_line(bp)}")


def removed_count(data: R.Removed) -> None:
    out.print(f"removed {data['removed']} breakpoint(s)")


def forgotten(data: R.Forgotten) -> None:
    out.print(f"forgot session {escape(str(data.get('removed')))}")


def sessions_listing(data: R.Sessions) -> None:
    if data.get("pruned"):
        out.print(f"removed {len(data['pruned'])} ended session(s)")
    sessions(data)


def tensor_store(data: R.TensorStore) -> None:
    if "name" in data and "tensors" not in data:
        tensor_info(data)
    elif "removed" in data:
        out.print(f"removed {len(data['removed'])} tensor(s)")
    else:
        tensors(data)


def captures(data: R.Captures) -> None:
    from . import compare as compare_render

    compare_render.captures(data)


def compare_summary(data: R.CompareSummary) -> None:
    from . import compare as compare_render

    compare_render.show(dict(data), show_all=True, show_inputs=True)


def watches(data: R.Watches) -> None:
    if data.get("watch"):
        item = data["watch"]
        now = item.get("value", item.get("error"))
        out.print(
            f"watch #{item['id']}: {escape(str(item['expression']))}"
            + (f" = {escape(str(now))}" if now is not None else "")
        )
    for item in data.get("removed") or []:
        out.print(f"unwatched #{item['id']}: {escape(str(item['expression']))}")
    if not data.get("watch"):
        listed = data.get("watches") or []
        out.print(f"{len(listed)} watch expression(s)" + (":" if listed else ""))
        for item in listed:
            now = item.get("value", item.get("error"))
            tail = f" = {escape(str(now))}" if now is not None else ""
            out.print(f"  #{item['id']} {escape(str(item['expression']))}{tail}")


def threads(data: R.Threads) -> None:
    for t in data.get("threads", []):
        mark = "*" if t.get("selected") else " "
        status = "paused" if t.get("paused") else "running"
        where_ = where(t.get("where")) if t.get("where") else "?"
        out.print(
            f"{mark} {t.get('number'):>2} {escape(str(t.get('name')))} "
            f"[dim](id {t.get('id')})[/] {status} at {escape(where_)}"
        )
    if data.get("truncated"):
        out.print(f"[dim]{data.get('shown')} of {data.get('total')} threads[/]")


def pause_state(data: R.State) -> None:
    state(data)
    if data.get("state") == "running":
        out.print(
            "pause requested: the script stops at its next line of Python "
            "(it is probably inside a long call into C, e.g. a big tensor op or a sleep); "
            "`mldbg wait` or `mldbg status` to see when it does"
        )


def terminated(data: R.State) -> None:
    if data.get("already_ended"):  # what was asked already held: say so, not an error
        out.print(
            f"[bold]{escape(str(data.get('session')))}[/] had already ended "
            f"({escape(str(data.get('state')))}); nothing to terminate"
        )
    state(data)


def weight_audit(data: R.WeightAudit) -> None:
    from ..weights.render import render_audit

    out.print(escape(render_audit(dict(data), limit=len(data.get("problems") or []))))
    if data.get("truncated"):
        out.print(f"({data.get('total')} problems in all: --limit N to see more)")


def line_step(data: R.LineStep) -> None:
    from .line import show as show_line

    show_line(data)


def plain(data: object) -> None:
    """A verb without a renderer of its own: its answer as indented JSON."""
    out.print(escape(json.dumps(data, indent=2, default=str)))


def show(verb: str, data: object) -> None:
    """Print a verb's answer for a person (its renderer, else :func:`plain`)."""
    RENDERERS.get(verb, plain)(data)


# verb name -> how its answer looks to a person (a verb missing here prints as JSON)
RENDERERS: dict[str, Callable[[Any], None]] = {
    "start": state,
    "break": breakpoint_set,
    "breaks": breakpoints,
    "remove": breakpoint_removed,
    "clear": removed_count,
    "continue": state,
    "step": state,
    "wait": state,
    "pause": pause_state,
    "status": state,
    "location": state,
    "stack": stack,
    "frame": frame,
    "up": frame,
    "down": frame,
    "vars": variables,
    "eval": evaluation,
    "output": output,
    "until": state,
    "restart": state,
    "watch": watches,
    "unwatch": watches,
    "threads": threads,
    "thread": state,
    "terminate": terminated,
    "forget": forgotten,
    "trace": trace,
    "sessions": sessions_listing,
    "runs": runs,
    "checkpoints": checkpoints,
    "captures": captures,
    "compare": compare_summary,
    "compare-checkpoints": checkpoint_pairs,
    "nonfinite": first_nonfinite,
    "module-table": module_rows,
    "tensors": tensor_store,
    "clean": cleaned,
    "weights": weight_audit,
    "line": line_step,
}


def to_text(verb: str, data: object, width: int = 120, surface: Surface = "mcp") -> str:
    """What ``mldbg VERB`` would print, as plain text (for MCP's text content), with the
    calls it hands out worded for ``surface``."""
    with captured(width, surface=surface) as buffer:
        show(verb, data)
    return buffer.getvalue().rstrip("\n")
