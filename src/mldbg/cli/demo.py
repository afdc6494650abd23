"""``mldbg demo``: a scripted session on the bundled tiny transformer, ending with parity.

It drives the real daemon through the same calls the CLI makes, and prints each step as
the command a person (or agent) would type, so the demo doubles as a tutorial.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, TypedDict

from ..client.api import Client, connect
from ..store.runs import mldbg_home
from ..text import render

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
        self.transcript: list[dict[str, object]] = []  # each command and its answer

    def step(self, command: str, verb: str, session: str | None = None, **args: object) -> Any:
        """Run one verb through the typed client, shown as the command a person would type
        (on ``session``, else the demo's own)."""
        data = self.client.call(verb, session or self.session, **args)
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
    if not as_json:
        render.out.print(f"\n[bold {'green' if ok else 'red'}]Found: {verdict}.[/]")
        render.out.print(
            f"Everything is recorded in {state.get('run_dir')} (events.jsonl, output.log, run.json)."
        )
    if not keep:
        demo.client.call("forget", session)
    parity = parity_ending(demo)
    if as_json:
        print(
            json.dumps(
                {
                    "ok": ok and parity["ok"] is not False,
                    "verdict": verdict,
                    "run_dir": state.get("run_dir"),
                    "parity": parity,
                    "transcript": demo.transcript,
                },
                indent=2,
                default=str,
            )
        )
    return 0 if ok and parity["ok"] is not False else 1


class ParityEnding(TypedDict):
    ok: bool | None  # None: skipped (no MLX here)
    culprit: str | None
    expected: str
    mistake: str
    reason: str | None
    skipped: str | None
    line: str | None  # the port's first wrong line, as the line step named it (file:line text)


def parity_ending(demo: Demo) -> ParityEnding:
    """The main job on the bundled pair: a PyTorch reference and its MLX port, two scripts
    that know nothing of mldbg, each run once under ``start --capture``; compare names
    the module of the planted mistake, the line step its line.

    The scripts run in a scratch directory (the reference writes the weights the port
    loads); the captures land in the demo's own run store."""
    from .. import examples

    ending: ParityEnding = {
        "ok": None,
        "culprit": None,
        "expected": examples.PARITY_PLANTED_MISTAKE,
        "mistake": examples.PARITY_MISTAKE,
        "reason": None,
        "skipped": None,
        "line": None,
    }
    missing = [m for m in ("torch", "mlx", "safetensors") if importlib.util.find_spec(m) is None]
    if missing:
        ending["skipped"] = (
            f"the parity ending needs torch and MLX; not installed: {', '.join(missing)}"
        )
        demo.say(f"(skipping parity: {ending['skipped']})")
        return ending
    demo.say(
        "\nParity: a PyTorch reference and an MLX port of the same model, with one planted "
        "mistake, two scripts that know nothing of mldbg. Capture both as they are, then let "
        "mldbg name the module and the line where the port goes wrong."
    )
    home = mldbg_home()
    with tempfile.TemporaryDirectory(prefix="mldbg-demo-") as scratch:
        for module, name in (
            (examples.PARITY_REFERENCE, "demo-ref"),
            (examples.PARITY_PORT, "demo-port"),
        ):
            failed = _captured(demo, module, name, scratch, home)
            if failed is not None:
                ending["ok"] = False
                ending["reason"] = failed
                render.err.print(f"[red]{failed}[/]")
                return ending
        result = demo.step(
            "mldbg compare demo-ref demo-port",
            "compare",
            a="demo-ref",
            b="demo-port",
            home=str(home),
        )
        first = result.get("first_divergence") or {}
        ending["culprit"] = first.get("module")
        ending["reason"] = first.get("reason")
        ending["ok"] = ending["culprit"] == ending["expected"]
        if not demo.as_json:
            from ..text import compare as compare_render

            compare_render.show(dict(result))
        if ending["ok"]:
            ending["line"] = _first_wrong_line(demo, str(home))
    if not demo.as_json:
        if ending["ok"]:
            render.out.print(
                f"[bold green]Found: the port first diverges at {ending['culprit']}[/] "
                f"({ending['reason']}), at the line {ending['line']}: the planted mistake, "
                f"{examples.PARITY_MISTAKE}."
            )
        else:
            render.out.print(
                f"[bold red]expected the divergence at {ending['expected']}, "
                f"compare named {ending['culprit']}[/]"
            )
    return ending


def _captured(demo: Demo, module: str, name: str, cwd: str, home: Path) -> str | None:
    """Run ``module`` once under ``start --capture NAME`` (a session of its own, in
    ``cwd``, its run and capture in the store ``home``) and wait for its end; what went
    wrong, or None."""
    demo.step(
        f"mldbg start --session {name} --capture {name} --run -m {module}",
        "start",
        name,
        module=module,
        cwd=cwd,
        env={"MLDBG_HOME": str(home)},
        python=sys.executable,
        capture=name,
        stop_on_entry=False,
        replace=True,
    )
    state = demo.client.resume("wait", name, 600.0)
    demo.transcript.append({"command": f"mldbg wait --session {name}", "result": state})
    if not demo.as_json:
        render.out.print(f"\n[bold cyan]$ mldbg wait --session {name}[/]")
        render.state(state)
    demo.client.call("forget", name)
    if state.get("state") != "exited" or state.get("exit_code") != 0:
        return f"{module} did not run to its end: {state.get('state')} {state.get('exit_code')}"
    return None


def _first_wrong_line(demo: Demo, home: str) -> str | None:
    """The line step on the two captures: the port's first line whose value the
    reference never computed, as ``file:line text``."""
    found = demo.client.follow("line", 900.0, None, a="demo-ref", b="demo-port", home=home)
    demo.transcript.append({"command": "mldbg line demo-ref demo-port", "result": found})
    if not demo.as_json:
        render.out.print("\n[bold cyan]$ mldbg line demo-ref demo-port[/]")
        from ..text import render as text_render

        text_render.show("line", found)
    wrong = found.get("first_wrong")
    port = wrong.get("b") if wrong else None
    if not port or not port.get("file"):
        return None
    return f"{Path(str(port['file'])).name}:{port.get('line')} {port.get('text')}"
