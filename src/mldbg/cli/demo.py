"""``mldbg demo``: a scripted session on the bundled tiny transformer.

It drives the real daemon through the same calls the CLI makes, and prints each step as
the command a person (or agent) would type, so the demo doubles as a tutorial.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from . import render
from .client import Client, connect

MARKER = "# demo: breakpoint"
# The path, not an import: importing the example would load torch into the client.
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tiny_transformer.py"


def _breakpoint_line(path: Path) -> int:
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if MARKER in text:
            return number
    raise RuntimeError(f"{path} lost its '{MARKER}' line")


class Demo:
    def __init__(self, client: Client, session: str, as_json: bool) -> None:
        self.client = client
        self.session = session
        self.as_json = as_json
        self.transcript: list[dict[str, Any]] = []

    def step(self, command: str, verb: str, **args: Any) -> Any:
        """Run one verb through the typed client, shown as the command a person would type."""
        data = self.client.call(verb, self.session, **args)
        self.transcript.append({"command": command, "result": data})
        if not self.as_json:
            render.out.print(f"\n[bold cyan]$ {command}[/]")
        return data

    def say(self, text: str) -> None:
        if not self.as_json:
            render.out.print(f"[italic]{text}[/]")


def run_demo(session: str = "demo", keep: bool = False, as_json: bool = False) -> int:
    script = EXAMPLE
    line = _breakpoint_line(script)
    demo = Demo(connect(), session, as_json)
    flag = f" --session {session}" if session != "default" else ""
    short = f"{script.name}:{line}"

    demo.say("mldbg demo: debugging a tiny PyTorch transformer in its own process.")
    state = demo.step(
        f"mldbg start{flag} --run --break {short} {script.name}",
        "start",
        script=str(script),
        python=sys.executable,
        breakpoints=[{"file": str(script), "line": line}],
        stop_on_entry=False,
        replace=True,
    )
    state = demo.client.call("wait", session, wait=30.0)
    if not as_json:
        render.state(state)
    if state.get("state") != "paused":
        render.err.print("[red]the demo script did not reach its breakpoint[/]")
        return 1

    stack = demo.step(f"mldbg stack{flag}", "stack")
    if not as_json:
        render.stack(stack)

    findings = {}
    for expression, why in (
        ("scores", "attention scores: masked entries are -inf, so expect inf counts"),
        ("weights", "softmax of the scores: every value in [0, 1]"),
        ("weights.sum(-1)", "each row of attention weights should sum to 1"),
        ("weights[0, 0].triu(1).abs().max().item()", "causal mask: no weight on future tokens"),
    ):
        demo.say(why)
        result = demo.step(f"mldbg eval{flag} '{expression}'", "eval", expression=expression)
        findings[expression] = result
        if not as_json:
            render.evaluation(result)

    variables = demo.step(f"mldbg vars{flag}", "vars")
    if not as_json:
        render.variables(variables)
    state = demo.step(f"mldbg step over{flag}", "step", kind="over", wait=10.0)
    if not as_json:
        render.state(state)
    shape = demo.step(
        f"mldbg eval{flag} 'tuple(mixed.shape)'", "eval", expression="tuple(mixed.shape)"
    )
    if not as_json:
        render.evaluation(shape)

    demo.step(f"mldbg clear{flag}", "clear")
    state = demo.step(f"mldbg continue{flag}", "continue", wait=30.0)
    if not as_json:
        render.state(state)

    row_sums = findings["weights.sum(-1)"]["summary"].get("stats") or {}
    future = findings["weights[0, 0].triu(1).abs().max().item()"]["result"]
    ok = (
        state.get("state") == "exited"
        and state.get("exit_code") == 0
        and abs(float(row_sums.get("min", 0)) - 1) < 1e-5
        and abs(float(row_sums.get("max", 0)) - 1) < 1e-5
        and float(future) == 0.0
    )
    verdict = (
        "attention rows sum to 1 and no weight falls on future tokens"
        if ok
        else "something in the demo model looked wrong"
    )
    if as_json:
        print(
            json.dumps(
                {
                    "ok": ok,
                    "verdict": verdict,
                    "run_dir": state.get("run_dir"),
                    "transcript": demo.transcript,
                },
                indent=2,
                default=str,
            )
        )
    else:
        render.out.print(f"\n[bold {'green' if ok else 'red'}]Found: {verdict}.[/]")
        render.out.print(
            f"Everything is recorded in {state.get('run_dir')} (events.jsonl, output.log, run.json)."
        )
    if not keep:
        demo.client.call("forget", session)
    return 0 if ok else 1
