"""Human output of ``mldbg compare``: a table in execution order, the culprit marked.

Long runs of agreeing rows are folded (``--all`` shows them) so the answer fits a
screen even for a model of thousands of modules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .. import results as R
from ..compare.report.answer import Selection
from ..memory import human_size as _size
from .console import call_text, err, out, print_table
from .console import one_line as escape  # every text here is one line; names from captures too

if TYPE_CHECKING:
    from ..compare.records import Culprit, Missing, PipelineModel

# One entry of a comparison (compare.records.EntryResult) as the table reads it.
Entry: TypeAlias = "dict[str, Any]"

FOLD = 6  # agreeing rows in a row beyond which the middle ones are folded
UNPAIRED_SHOWN = 20  # unpaired names printed per side (all of them are in --json / --html)
PROPOSAL_LINES = 40  # lines of a proposed map printed


def number(value: float | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if value == 0:
        return "0"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e4:
        return f"{value:.4g}"
    return f"{value:.2e}"


def _shape(entry: Entry) -> str:
    a, b = entry.get("shape_a"), entry.get("shape_b")
    text = "×".join(str(n) for n in a or []) or "scalar"
    if a != b:
        other = "×".join(str(n) for n in b or []) or "scalar"
        text += f" vs {other}"
        if entry.get("layout"):
            text += f" ({entry['layout']})"
    return text


def _quant(entry: Entry) -> str:
    quant = entry.get("quantized")
    if not quant:
        return ""
    return f" [dim]({quant.get('bits')}-bit, group {quant.get('group_size')}: expected)[/]"


def _status(entry: Entry) -> str:
    if entry.get("error"):
        mark = "[bold red]◀ culprit[/] " if entry.get("culprit") else ""
        return f"{mark}[red]{escape(entry['error'])}[/]"
    if entry.get("ok") and not entry.get("culprit"):
        return "[green]ok[/]" + _quant(entry)
    label = "[bold red]◀ culprit[/]" if entry.get("culprit") else "[red]differs[/]"
    mismatched, numel = entry.get("mismatched"), entry.get("numel")
    if entry.get("test") == "scale" and not entry.get("nonfinite_mismatched"):
        return f"{label}{_quant(entry)}"
    if mismatched is None:
        return label
    nonfinite = entry.get("nonfinite_mismatched")
    extra = f" ({nonfinite} NaN/Inf)" if nonfinite else ""
    if nonfinite and _coverage(entry):  # the numbers in the row leave those elements out
        extra += f", statistics over {entry.get('finite_pairs')} of {numel}"
    return f"{label} [dim]{mismatched}/{numel}{extra}[/]"


def _coverage(entry: dict[str, object]) -> str:
    """How many elements the printed statistics cover, when NaN/inf left some out."""
    finite, numel = entry.get("finite_pairs"), entry.get("numel")
    if finite is None or numel is None or finite == numel:
        return ""
    return f"; statistics over the {finite} of {numel} elements finite in both"


def _rows(entries: list[Entry], show_all: bool) -> list[Entry | int]:
    """Entries to show, with an int standing for that many folded agreeing rows."""
    if show_all:
        return list(entries)
    rows: list[Entry | int] = []
    run: list[Entry] = []

    def flush() -> None:
        if len(run) > FOLD:
            rows.extend([run[0], run[1], len(run) - 4, run[-2], run[-1]])
        else:
            rows.extend(run)
        run.clear()

    for entry in entries:
        if entry.get("ok") and not entry.get("culprit"):
            run.append(entry)
        else:
            flush()
            rows.append(entry)
    flush()
    return rows


def show(
    result: dict[str, Any],
    *,
    show_all: bool = False,
    show_inputs: bool = False,
    selection: Selection | None = None,
) -> None:
    """The comparison as a table, its verdict under it.  ``result`` is a whole comparison
    (the CLI's) or one page of it (``compare.report.answer.bounded``: each entry carries
    its ``row`` in the whole, and a later page has no header or verdict, only its rows).
    ``selection`` keeps the rows it wants (a filter), unfolded."""
    page = result.get("page")
    if page is None:
        a, b = result["a"], result["b"]
        out.print(f"[bold]A[/] {escape(a['label'])}  [dim]{escape(a['path'])}[/]")
        out.print(f"[bold]B[/] {escape(b['label'])}  [dim]{escape(b['path'])}[/]")
        for warning in result.get("warnings", []):
            out.print(f"[yellow]warning:[/] {escape(warning)}")
    else:
        first = int(page.get("offset") or 0) + 1
        out.print(
            f"[dim]rows {first}-{first + len(result['entries']) - 1} of the "
            f"{page.get('matching')} asked for (the header and verdict are on the first page)[/]"
        )
    position = {id(e): e.get("row", i) for i, e in enumerate(result["entries"])}
    wanted: dict[str, object] | None
    matching: object
    if selection is not None and selection.filtered:
        entries = [e for e in result["entries"] if selection.wants(e)]
        wanted = {k: v for k, v in selection.args().items() if k not in ("passing", "inputs")}
        matching, show_all = len(entries), True
    else:
        entries = [e for e in result["entries"] if show_inputs or e.get("role") != "in"]
        wanted, matching = result.get("filter"), result.get("matching")
    if wanted:
        listed = ", ".join(f"{k}={v}" for k, v in wanted.items())
        out.print(f"[dim]filter: {escape(listed)}: {matching} entries match[/]")
    with_local = any(e.get("local") for e in result["entries"])
    # judged beside a better run: how close each entry came to its bound
    with_better = bool(result.get("better")) or any(e.get("better") for e in result["entries"])
    table, columns = _table(with_better, with_local)
    for row in _rows(entries, show_all):
        if isinstance(row, int):
            blank = [""] * (len(columns) - 2)
            table.add_row("", f"[dim]… {row} agreeing rows …[/]", *blank)
            continue
        table.add_row(*_cells(row, position[id(row)], with_better, with_local))
    print_table(table, keep=("#", "name"))
    if page is None:
        _print_pipeline(result)
        _verdict(result)
    if result.get("next"):
        out.print(f"[dim]more: {escape(call_text(result['next']))}[/]")


def _table(with_better: bool, with_local: bool) -> tuple[Table, list[tuple[str, str]]]:
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns = [
        ("#", "right"),
        ("name", "left"),
        ("shape", "left"),
        ("dtype", "left"),
        ("max abs", "right"),
        ("rel err", "right"),
        ("bound", "right"),
    ]
    if with_better:
        columns.append(("x bound", "right"))
    if with_local:
        columns.append(("local", "right"))
    columns += [("cosine", "right"), ("status", "left")]
    for column, justify in columns:
        # names are the point of the table: print_table never splits them
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    return table, columns


def _cells(row: Entry, index: int, with_better: bool, with_local: bool) -> list[str]:
    """One entry's row of the table, in its columns' order."""
    dtype = row.get("dtype_a") or ""
    if row.get("dtype_b") != row.get("dtype_a"):
        dtype += f"/{row.get('dtype_b')}"
    name = escape(row["name"])
    if row.get("role") == "in":
        name = f"[dim]{name}[/]"
    if row.get("culprit"):
        name = f"[bold red]{name}[/]"
    cells = [
        str(index),
        name,
        _shape(row),
        dtype,
        number(row.get("max_abs")),
        number(row.get("rel_rms")),
        number(row.get("expected")),
    ]
    if with_better:
        cells.append(number(row.get("headroom")))
    if with_local:
        local = row.get("local") or {}
        text = number(local.get("rel_rms")) if local else "-"
        if local and not local.get("ok"):
            text = f"[red]{text}[/]"
        cells.append(text)
    return [*cells, number(row.get("cosine")), _status(row)]


def _verdict(result: dict[str, Any]) -> None:
    counts = result["counts"]
    summary = f"{counts['passed']}/{counts['compared']} compared tensors agree"
    if counts["unpaired_a"] or counts["unpaired_b"]:
        summary += f"; unpaired: {counts['unpaired_a']} only in A, {counts['unpaired_b']} only in B"
    tolerance = (
        "scale-aware: relative error within the rounding a clean chain of ops accumulates"
        if result.get("rtol") is None and result.get("atol") is None
        else f"element-wise: rtol {result.get('rtol')}, atol {result.get('atol')}"
    )
    out.print(f"{summary} [dim](test: {tolerance})[/]")
    _print_estimates(result["entries"])
    aligned = result.get("calls_aligned")
    if aligned:  # two generation loops that split the sequence differently
        out.print(f"[dim]calls aligned: {escape(str(aligned.get('note')))}[/]")
    _print_unpaired(result)
    _print_proposal(result)
    for boundary in result.get("boundary_differences") or []:
        out.print(
            f"[yellow]boundary difference:[/] {escape(boundary['name'])} — "
            f"{escape(boundary['note'])} ({escape(boundary['compensated_by'])}); not the culprit"
        )
    for note in (result.get("notes") or [])[:NOTES_SHOWN]:
        out.print(
            f"[yellow]note:[/] {escape(note['name'])} — {escape(note['note'])} "
            f"(relative error {number(note.get('rel_rms'))}); not the culprit"
        )
    if len(result.get("notes") or []) > NOTES_SHOWN:
        out.print(f"[dim]… {len(result['notes']) - NOTES_SHOWN} more notes in --json[/]")
    _print_missing(result)
    if result.get("undecided"):
        out.print(f"[yellow]no verdict:[/] {escape(result['undecided'])}")
    culprit = result.get("first_divergence")
    if result["ok"]:
        out.print("[bold green]match[/]: every compared tensor agrees")
    elif result.get("decided_by") == "missing":
        out.print("[bold yellow]incomplete[/]: no verdict on what the captures lost")
    elif culprit:
        _print_culprit(result, culprit)
    else:
        out.print("[bold red]diverges[/]")
    _print_next_steps(result)


def _print_unpaired(result: dict[str, Any]) -> None:
    """The entries only one side has (the first ones), and how many of the parameter-free
    modules' the other side computes inline were counted apart."""
    apart = result.get("unpaired_parameter_free") or {}
    for side in ("a", "b"):
        names = result[f"unpaired_{side}"]
        listed = result.get(f"unpaired_{side}_count", len(names))
        if names:
            shown = ", ".join(escape(n) for n in names[:UNPAIRED_SHOWN])
            more = listed - min(len(names), UNPAIRED_SHOWN)
            tail = f" … and {more} more (--json or --html lists all)" if more > 0 else ""
            after = " (after the map)" if side == "b" else ""
            out.print(f"[dim]only in {side.upper()}{after}, {listed}: {shown}{tail}[/]")
        if apart.get(side):
            out.print(
                f"[dim]and {apart[side]} entries of parameter-free modules only in "
                f"{side.upper()} (an activation, a dropout, a helper the other side computes "
                "inline), off the culprit's path: not listed[/]"
            )


def _print_pipeline(result: dict[str, object]) -> None:
    """Each model of a pipeline's comparison, one line each, in the order called."""
    pipeline = cast("dict[str, object] | None", result.get("pipeline"))
    if not pipeline:
        return
    out.print(f"[bold]pipeline[/] [dim]{escape(str(pipeline.get('note')))}[/]")
    for model in cast("list[PipelineModel]", pipeline["models"]):
        classes = " / ".join(
            str(c).rsplit(".", 1)[-1] for c in (model["class_a"], model["class_b"])
        )
        head = f"  model {model['position']} {escape(str(model['a']))} / {escape(str(model['b']))} ({escape(classes)}): "
        culprit, counts = model["first_divergence"], model["counts"] or {}
        if model["decided_by"] == "index-only":
            line = "[dim]not compared: captured index-only (a fine pass inside another model)[/]"
        elif model["ok"]:
            line = f"[green]match[/], {counts.get('passed')}/{counts.get('compared')} agree"
        elif culprit is not None:
            line = f"[red]diverges[/]: {escape(culprit['name'])} — {escape(culprit['reason'])}"
        else:
            line = f"[yellow]no verdict[/]: {escape(str(model['error']))}"
        out.print(head + line)


def _print_proposal(result: dict[str, object]) -> None:
    """A proposed map: few entries paired (from the module trees), or modules the two
    trees place differently paired directly (from the values)."""
    import json

    proposal = result.get("proposed_map")
    if not proposal:
        return
    counts = cast("dict[str, int]", result["counts"])
    few = counts["compared"] < 0.5 * (counts["compared"] + counts["unpaired_a"])
    why = (
        "few entries pair: a map proposed from the two module trees"
        if few
        else "modules the two trees place differently (a step moved across their "
        "boundary) pair directly through this map"
    )
    out.print(f"[yellow]{why} (--propose-map FILE writes it; pass it back with --map FILE):[/]")
    lines = json.dumps(proposal, indent=2).splitlines()
    for line in lines[:PROPOSAL_LINES]:
        out.print(escape(line), highlight=False)
    if len(lines) > PROPOSAL_LINES:
        out.print(f"[dim]… {len(lines) - PROPOSAL_LINES} more lines in --json[/]")


def _print_culprit(result: dict[str, object], culprit: Culprit) -> None:
    """The first divergence, its numbers, what they cover, where it is."""
    out.print(
        f"[bold red]first divergence: {escape(culprit['name'])}[/] — {escape(culprit['reason'])}"
        f" (relative error {number(culprit.get('rel_rms'))}, max abs {number(culprit.get('max_abs'))}"
        + (
            f", {culprit['nonfinite_mismatched']} NaN/Inf mismatches)"
            if culprit.get("nonfinite_mismatched")
            else ")"
        )
    )
    entries = cast("list[dict[str, object]]", result["entries"])
    named = [e for e in entries if e["name"] in (culprit.get("entries") or [])]
    covered = next((e for e in named if _coverage(e)), None)
    if covered is not None:  # NaN/inf: the numbers above leave those elements out
        text = _coverage(covered).removeprefix("; ")
        out.print(f"  [dim]{escape(str(covered['name']))}: {escape(text)}[/]")
    _print_whereabouts(culprit)


NOTES_SHOWN = 5
MISSING_SHOWN = 5  # unchecked entries printed (the JSON lists the first 20, counts all)


def _print_missing(result: dict[str, object]) -> None:
    """What a capture lost that the other side has: never agreement."""
    missing = cast("Missing | None", result.get("missing"))
    if not missing:
        return
    for side in (missing["a"], missing["b"]):
        if side is not None:
            out.print(
                f"[yellow]lost data:[/] {escape(side['label'])} (state "
                f"{escape(side['state'] or '?')}; {side['not_written']} tensor(s) not written, "
                f"{side['calls_not_written']} call(s) whose tensors could not be written, "
                f"{len(side['unfinished'])} call(s) unfinished, {side['index_lines_lost']} "
                "index line(s) lost)"
            )
    for item in missing["entries"][:MISSING_SHOWN]:
        out.print(f"  [yellow]unchecked[/] {escape(item['name'])}: {escape(item['why'])}")
    more = missing["unchecked"] - min(MISSING_SHOWN, len(missing["entries"]))
    if more > 0:
        out.print(f"  [dim]… {more} more unchecked (--json lists the first 20)[/]")


OP_CALLS_SHOWN = 4  # module calls whose operations are summed up (all are in --json)
OPS_BEFORE = 2  # agreeing operations shown before the first diverging one


def _print_estimates(entries: list[Entry]) -> None:
    """How many entries a summary capture let compare only estimate, and how."""
    estimated = [e["estimated"] for e in entries if e.get("estimated")]
    if not estimated:
        return
    bounded = sum(1 for e in estimated if e.get("lower_bound"))
    line = f"{len(estimated)} estimated from summaries"
    if bounded:
        line += (
            f", {bounded} of them from statistics alone (the layouts differ, or ranks' "
            "slices or a generation loop's calls were joined): a lower bound "
            "of the error, blind to a difference that keeps the norm and mean; capture such "
            "a module in full (within=) to measure it"
        )
    out.print(f"[dim]{line}[/]")


def _print_next_steps(result: dict[str, Any]) -> None:
    """What to look at next: the line (``line``), the culprit's parameters (``weights_hint``), a full capture
    inside it after a coarse pass (``narrow``), the operation inside it that diverges
    (``ops``).  Each is one line or a few; the JSON has them whole."""
    line = result.get("line")
    if line:
        out.print(
            f"  [yellow]next:[/] {escape(call_text(line))}  [dim](the first wrong line of the "
            "port, in both scripts: runs each once more)[/]"
        )
    audit = result.get("weights_hint")
    if audit:
        out.print(f"  [yellow]weights:[/] {escape(str(audit.get('hint')))}")
        _print_calls(audit.get("calls"))
    narrow = result.get("narrow")
    if narrow:
        out.print(f"  [yellow]next:[/] {escape(str(narrow.get('hint')))}")
        _print_calls(narrow.get("calls"))
    others = result.get("other_models")
    if others:
        out.print(f"  [yellow]models:[/] {escape(str(others.get('hint')))}")
    items = list(result.get("ops") or [])
    items.sort(key=lambda item: item.get("first_divergence") is None)  # diverging first
    for item in items[:OP_CALLS_SHOWN]:
        _print_ops(item)
    if len(items) > OP_CALLS_SHOWN:
        out.print(
            f"  [dim]… operations of {len(items) - OP_CALLS_SHOWN} more module calls in --json[/]"
        )


def _print_calls(calls: object) -> None:
    """The calls a hint hands out, one a line, worded for the surface printing them."""
    for call in calls if isinstance(calls, list) else []:
        out.print(f"    {escape(call_text(call))}", highlight=False)


def _print_ops(item: dict[str, Any]) -> None:
    """One module call's operations, B's aligned with A's by value (``compare.ops``)."""
    ops = item.get("ops") or []
    head = (
        f"  operations inside {escape(str(item.get('name')))} "
        f"({item.get('ops_b')} in B, {item.get('ops_a')} in A"
        + (f"; the first {len(ops)} listed in --json" if item.get("truncated") else "")
        + ")"
    )
    first = item.get("first_divergence")
    if first is None and item.get("note"):
        out.print(f"{head}: [green]{escape(str(item['note']))}[/]")
        return
    if first is None:
        unmatched = sum(1 for op in ops if op.get("ok") is None)
        tail = f"; {unmatched} with no same-sized operation in A" if unmatched else ""
        out.print(f"{head}: [green]each of B's has a counterpart in A within rounding[/]{tail}")
        return
    out.print(f"{head}: [bold red]first diverging operation {escape(str(first['op_b']))}[/]")
    at = next((i for i, op in enumerate(ops) if op.get("op_b") == first["op_b"]), len(ops))
    for op in [*ops[max(0, at - OPS_BEFORE) : at], first]:
        _print_op(op, op is first)


def _print_op(op: dict[str, Any], diverges: bool) -> None:
    closest = op.get("closest_a")
    if closest is None:
        counterpart = "no operation of A holds as many elements"
    else:
        counterpart = (
            f"closest in A {escape(str(closest))} ({escape(str(op.get('class_a')))}): "
            f"relative error {number(op.get('rel_rms'))}, bound {number(op.get('expected'))}"
        )
    mark = "[red]✗[/]" if diverges else "[green]✓[/]"
    out.print(
        f"    {mark} {escape(str(op.get('class_b')))} {escape(str(op.get('op_b')))}: {counterpart}"
    )


def _print_whereabouts(culprit: Culprit) -> None:
    """Glue code: the two calls' lines in each script and the first differing input;
    a culprit's inline children."""
    glue = culprit.get("glue")
    if glue:
        for label, call in (("after", glue.get("after")), ("before", glue.get("before"))):
            if call:
                out.print(
                    f"  {label} {escape(call['call'])}: A at {escape(str(call.get('site_a')))}, "
                    f"B at {escape(str(call.get('site_b')))}"
                )
        first = glue.get("input") or {}
        if first:
            out.print(
                f"  first differing input {escape(first['name'])}: "
                f"A {escape(str(first.get('head_a')))[:120]} | "
                f"B {escape(str(first.get('head_b')))[:120]}"
            )
    if culprit.get("hint"):
        out.print(f"  [yellow]{escape(culprit['hint'])}[/]")


@contextlib.contextmanager
def progress_bar(enabled: bool) -> Iterator[Callable[[int, int, str], None] | None]:
    """A progress bar on stderr for long comparisons; nothing when stderr is not a terminal."""
    if not enabled:
        yield None
        return
    bar = Progress(
        TextColumn("comparing"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeRemainingColumn(),
        TextColumn("[dim]{task.description}"),
        console=err,
        transient=True,
    )
    task = None

    def update(done: int, total: int, name: str) -> None:
        nonlocal task
        if task is None:
            task = bar.add_task(name, total=total)
        bar.update(task, completed=done, description=name[-60:])

    with bar:
        yield update


def captures(data: R.Captures) -> None:
    items = data.get("captures", [])
    if not items:
        out.print(f"no captures under {escape(data.get('home', ''))}")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("name", "run", "framework", "state", "calls", "tensors", "size", "model"):
        table.add_column(column)
    for item in items:
        table.add_row(
            escape(str(item.get("name"))),
            escape(str(item.get("run_id"))),
            str(item.get("framework") or "?"),
            str(item.get("state") or "?"),
            str(item.get("records") or 0),
            str(item.get("tensors") or 0),
            _size(item.get("bytes") or 0),
            escape(str(item.get("model_class") or "")),
        )
    print_table(table, keep=("name", "run"))
