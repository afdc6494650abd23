"""``mldbg line`` for a person: the first wrong line of the port, the reference's nearest
lines with their values side by side, the last agreeing line, then the port's lines
around it (each with its counterpart or none)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .. import results as R
from .console import call_text, out
from .console import one_line as escape


def _where(value: Mapping[str, object]) -> str:
    return f"{short(str(value.get('file')))}:{value.get('line')}"


def short(path: str) -> str:
    """A file as a person reads it: relative to here when it is below, an installed
    package's from its package (``diffusers/models/embeddings.py``)."""
    here = os.getcwd() + os.sep
    if path.startswith(here):
        return path[len(here) :]
    for marker in (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _shape(value: Mapping[str, object]) -> str:
    shape = value.get("shape")
    dims = "×".join(str(n) for n in shape) if isinstance(shape, list) else "?"
    return f"{value.get('name')} {dims} {value.get('dtype') or ''}".rstrip()


def _head(values: object) -> str:
    if not isinstance(values, list):
        return "-"
    return "[" + ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in values) + "]"


def _rel(value: object) -> str:
    return f"rel {value:.3g}" if isinstance(value, float) else "rel -"


def show(data: R.LineStep) -> None:
    if data.get("state") == "running":
        out.print(
            f"line: still running ({data.get('phase')}, {data.get('elapsed', 0):.0f} s); "
            f"next: {escape(call_text(data['next']))}"
            if "next" in data
            else f"line: still running ({data.get('phase')})"
        )
        return
    scope = data.get("scope") or {}
    out.print(
        f"[bold]line[/] after {escape(str(data.get('culprit')))} ({scope.get('kind')} scope"
        f", bound {data.get('bound') or 0:.3g})"
    )
    first = data.get("first_wrong")
    if first is None:
        out.print(f"[green]{escape(str(data.get('reason')))}[/]")
    else:
        _first(first)
        last = data.get("last_agreeing")
        if last is not None:
            nearest = last.get("nearest") or []
            match = (
                f" (= {escape(_where(nearest[0]['a']))}  {escape(str(nearest[0]['a'].get('text')))}, "
                f"{_rel(nearest[0].get('rel_rms'))})"
                if nearest
                else ""
            )
            out.print(
                f"  last agreeing: {escape(_where(last['b']))}  "
                f"{escape(str(last['b'].get('text')))}{match}"
            )
        for value in data.get("skipped") or []:
            out.print(
                f"  [yellow]the reference computes in between[/] {escape(_where(value))}  "
                f"{escape(str(value.get('text')))}  [dim](nothing in the port has its value)[/]"
            )
        fused = data.get("fused")
        if fused:
            out.print(f"  [yellow]fused:[/] {escape(str(fused.get('note')))}")
            for value in fused.get("inside") or []:
                out.print(f"    inside: {escape(_where(value))}  {escape(str(value.get('text')))}")
    for note in data.get("notes") or []:
        out.print(f"  [dim]note: {escape(note)}[/]")
    _listing(data)


def _first(first: R.LinePair) -> None:
    b = first["b"]
    out.print(
        f"  [bold red]first wrong line[/] {escape(_where(b))}  {escape(str(b.get('text')))}"
        f"  [dim]({escape(_shape(b))}, in {escape(str(b.get('function')))})[/]"
    )
    nearest = first.get("nearest") or []
    if not nearest:
        out.print("    no value of its size in the reference")
        return
    for near in nearest:
        a = near["a"]
        out.print(
            f"    nearest: {escape(_where(a))}  {escape(str(a.get('text')))}  "
            f"{_rel(near.get('rel_rms'))}  [dim]({escape(_shape(a))}; port {escape(str(near.get('reading')))})[/]"
        )
    near = nearest[0]
    out.print(f"      port {_head(near.get('head_b'))}  rms {_number(b.get('rms'))}")
    out.print(f"      ref  {_head(near['a'].get('head'))}  rms {_number(near['a'].get('rms'))}")
    runs_a, runs_b = near["a"].get("runs", 1), b.get("runs", 1)
    if runs_a != runs_b:
        out.print(f"    [yellow]it ran {runs_b} time(s) in the port, {runs_a} in the reference[/]")


def _number(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "-"


def _listing(data: R.LineStep) -> None:
    lines = data.get("lines") or []
    if not lines:
        return
    out.print(f"  [dim]the port's values ({data.get('shown')} of {data.get('total')}):[/]")
    for pair in lines:
        b = pair["b"]
        mark = {True: "[green]=[/]", False: "[red]≠[/]", None: "[dim]?[/]"}[pair.get("ok")]
        nearest = pair.get("nearest") or []
        near = (
            f"{escape(_where(nearest[0]['a']))} {_rel(nearest[0].get('rel_rms'))}"
            if nearest
            else "nothing of its size"
        )
        out.print(f"   {mark} {escape(_where(b))}  {escape(_shape(b))}  [dim]~ {near}[/]")
    if data.get("truncated") and "next" in data:
        out.print(f"  [dim]more: {escape(call_text(data['next']))}[/]")
