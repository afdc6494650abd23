"""``mldbg tutorial [torch|mlx]``: a walk through mldbg on a bundled tiny model, run for real.

Each step says what to type, runs it (the real ``mldbg`` command, as a subprocess, in a
scratch directory with its own run store), checks that it did what it should and
explains what the output means.  ``--non-interactive`` runs every step in order; the
interactive mode waits for Enter, or for the user to type the command themselves.

Every command the tutorial runs is in :data:`COMMANDS` below, so a renamed verb or flag
is one edit here.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from .. import examples
from ..errors import TutorialError
from ..examples import prune_library

# -- every command the tutorial runs ------------------------------------------------------------
# ``mldbg ...`` commands get ``--json`` added right after the verb when the tutorial checks
# them; ``python ...`` runs this interpreter.  {placeholders} are filled per track.
COMMANDS: dict[str, list[str]] = {
    "start": [
        "mldbg",
        "start",
        "--session",
        "{session}",
        "--python",
        "{python}",
        "--replace",
        "{script}",
    ],
    "break_script": ["mldbg", "break", "--session", "{session}", "{script}:{script_line}"],
    "continue": ["mldbg", "continue", "--session", "{session}"],
    "eval_tokens": ["mldbg", "eval", "--session", "{session}", "tokens.shape"],
    "clear": ["mldbg", "clear", "--session", "{session}"],
    "break_condition": [
        "mldbg",
        "break",
        "--session",
        "{session}",
        "{script}:{script_line}",
        "--if",
        "step == 2",
    ],
    "filter_checkpoints": [
        "mldbg",
        "break",
        "--session",
        "{session}",
        "--checkpoint",
        "generate.*",
        "--if",
        "step == 2",
    ],
    "eval_step": ["mldbg", "eval", "--session", "{session}", "step"],
    "step_over": ["mldbg", "step", "over", "--session", "{session}"],
    "break_library": ["mldbg", "break", "--session", "{session}", "{library_file}:{library_line}"],
    "eval_library": ["mldbg", "eval", "--session", "{session}", "{library_arg}.shape"],
    "checkpoints": ["mldbg", "checkpoints", "--name", "generate.logits"],
    "load_other": ["python", "-c", "{load_snippet}"],
    # the scripts as they are: start --capture records them, nothing edited
    "capture_reference": [
        "mldbg",
        "start",
        "--session",
        "tutorial-capture-ref",
        "--python",
        "{python}",
        "--replace",
        "--capture",
        "tutorial-ref",
        "--run",
        "-m",
        examples.PARITY_REFERENCE,
    ],
    "capture_port": [
        "mldbg",
        "start",
        "--session",
        "tutorial-capture-port",
        "--python",
        "{python}",
        "--replace",
        "--capture",
        "tutorial-port",
        "--run",
        "-m",
        examples.PARITY_PORT,
    ],
    "wait_capture_reference": [
        "mldbg",
        "wait",
        "--session",
        "tutorial-capture-ref",
        "--max-wait",
        "300",
    ],
    "wait_capture_port": [
        "mldbg",
        "wait",
        "--session",
        "tutorial-capture-port",
        "--max-wait",
        "300",
    ],
    "compare": ["mldbg", "compare", "tutorial-ref", "tutorial-port"],
    "profile": ["mldbg", "profile", "--include", "{framework_package}", "{script}"],
    # prune: a library's git checkout reduced to the files a script ran
    "prune_setup": ["mldbg", "prune", "setup", prune_library.REPO],
    "prune_run": [
        "mldbg",
        "prune",
        "run",
        "--repo",
        prune_library.REPO,
        "--python",
        "{python}",
        prune_library.SCRIPT,
    ],
    "prune_restore": [
        "mldbg",
        "prune",
        "restore",
        "--repo",
        prune_library.REPO,
        prune_library.RESTORED,
    ],
    "prune_status": ["mldbg", "prune", "status", "--repo", prune_library.REPO],
    "terminate": ["mldbg", "terminate", "--session", "{session}"],
    # the MLX track's porting steps: the non-finite tripwire, then reference and port side by side
    "start_nan": [
        "mldbg",
        "start",
        "--session",
        "tutorial-nan",
        "--python",
        "{python}",
        "--replace",
        "nonfinite.py",
    ],
    "break_nonfinite": ["mldbg", "break", "--session", "tutorial-nan", "--nonfinite"],
    "continue_nan": ["mldbg", "continue", "--session", "tutorial-nan"],
    "eval_tripped": [
        "mldbg",
        "eval",
        "--session",
        "tutorial-nan",
        "import mldbg; mldbg.tripped().path",
    ],
    "terminate_nan": ["mldbg", "terminate", "--session", "tutorial-nan"],
    "start_reference": [
        "mldbg",
        "start",
        "--session",
        "tutorial-ref",
        "--python",
        "{python}",
        "--replace",
        "--run",
        "--break",
        "side_reference.py:{side_reference_line}",
        "side_reference.py",
    ],
    "wait_reference": ["mldbg", "wait", "--session", "tutorial-ref"],
    "start_port": [
        "mldbg",
        "start",
        "--session",
        "tutorial-port",
        "--python",
        "{python}",
        "--replace",
        "--run",
        "--break",
        "side_port.py:{side_port_line}",
        "side_port.py",
    ],
    "wait_port": ["mldbg", "wait", "--session", "tutorial-port"],
    "eval_against": [
        "mldbg",
        "eval",
        "--session",
        "tutorial-port",
        "weights",
        "--against",
        "tutorial-ref",
    ],
    "terminate_reference": ["mldbg", "terminate", "--session", "tutorial-ref"],
    "terminate_port": ["mldbg", "terminate", "--session", "tutorial-port"],
}
EXTRA_SESSIONS = ("terminate_nan", "terminate_reference", "terminate_port")

TRACKS = ("torch", "mlx")


class StepResult(TypedDict):
    name: str
    title: str
    ok: bool
    skipped: str | None
    commands: list[str]
    detail: str


class TutorialResult(TypedDict):
    track: str
    ok: bool
    workdir: str
    steps: list[StepResult]
    failed: str | None


@dataclass
class Ran:
    command: str
    returncode: int
    data: Any
    text: str


@dataclass
class Step:
    name: str
    title: str
    explain: str
    commands: list[tuple[str, int]]  # (key in COMMANDS, expected exit code)
    check: Callable[[list[Ran]], tuple[bool, str]]
    meaning: str
    needs: tuple[str, ...] = ()  # modules the step imports
    programs: tuple[str, ...] = ()  # and programs it runs (on the PATH)


@dataclass
class Track:
    framework: str
    session: str
    python: str
    workdir: Path
    values: dict[str, str] = field(default_factory=dict)


# -- the track's files --------------------------------------------------------------------------


def _first_body_line(path: Path, class_name: str, method: str) -> tuple[int, str]:
    """The first statement of ``class_name.method`` (after its docstring), and its first argument."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    body = item.body
                    if (
                        body
                        and isinstance(body[0], ast.Expr)
                        and isinstance(body[0].value, ast.Constant)
                        and len(body) > 1
                    ):
                        body = body[1:]
                    return body[0].lineno, item.args.args[1].arg
    raise TutorialError(f"{path} has no {class_name}.{method}")


def _library_target(framework: str) -> tuple[Path, int, str]:
    """A line inside the framework's own Linear layer: a breakpoint in installed library code."""
    if framework == "torch":
        spec = importlib.util.find_spec("torch")
        relative, method = "nn/modules/linear.py", "forward"
    else:
        spec = importlib.util.find_spec("mlx")
        relative, method = "nn/layers/linear.py", "__call__"
    # mlx is a namespace package: any directory named mlx on sys.path is one of its parts.
    candidates = (
        [Path(p) / relative for p in (spec.submodule_search_locations or [])] if spec else []
    )
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        raise TutorialError(f"{framework} is not installed (no {relative} in it)")
    line, arg = _first_body_line(path, "Linear", method)
    return path, line, arg


def _marker_line(path: Path, marker: str) -> int:
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if marker in text:
            return number
    raise TutorialError(f"{path} lost its '{marker}' line")


def prepare(framework: str, workdir: Path) -> Track:
    """Copy the track's script into ``workdir`` and fill the placeholders of :data:`COMMANDS`."""
    if framework not in TRACKS:
        raise TutorialError(f"track {framework!r}: use torch or mlx")
    if importlib.util.find_spec("mlx" if framework == "mlx" else "torch") is None:
        raise TutorialError(f"the {framework} track needs {framework} installed")
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "tutorial.py"
    shutil.copyfile(examples.HERE / f"tutorial_{framework}.py", script)
    if framework == "mlx":  # the MLX track's porting steps
        shutil.copyfile(examples.HERE / "tutorial_nonfinite.py", workdir / "nonfinite.py")
        shutil.copyfile(examples.HERE / "side_by_side_reference.py", workdir / "side_reference.py")
        shutil.copyfile(examples.HERE / "side_by_side_port.py", workdir / "side_port.py")
    library_file, library_line, library_arg = _library_target(framework)
    other = "mlx" if framework == "torch" else "torch"
    if importlib.util.find_spec(other) is None:
        other = "numpy"
    snippet = (
        "from mldbg import debug_load; "
        f"x = debug_load('tutorial.logits', to='{other}'); "
        "print(type(x).__module__, x.dtype, tuple(x.shape))"
    )
    track = Track(framework, f"tutorial-{framework}", sys.executable, workdir)
    track.values = {
        "session": track.session,
        "python": sys.executable,
        "script": script.name,
        "script_line": str(_marker_line(script, "# tutorial: step")),
        "library_file": str(library_file),
        "library_line": str(library_line),
        "library_arg": library_arg,
        "load_snippet": snippet,
        "other_framework": other,
        "framework_package": "torch" if framework == "torch" else "mlx",
    }
    if framework == "mlx":
        for side in ("reference", "port"):
            marker = _marker_line(workdir / f"side_{side}.py", "# tutorial:")
            track.values[f"side_{side}_line"] = str(marker)
    if shutil.which("git"):
        _library_checkout(workdir)
    return track


def _library_checkout(workdir: Path) -> None:
    """The prune step's library: a git checkout with one commit, and the script using it.

    The checkout gets an identity of its own, so prune can commit there whether or not
    the user has set one."""
    repo = workdir / prune_library.REPO
    if (repo / ".git").exists():
        return
    for name, text in prune_library.FILES.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    (workdir / prune_library.SCRIPT).write_text(prune_library.SCRIPT_TEXT, encoding="utf-8")
    for argv in (
        ["init", "-q", "-b", "main"],
        ["config", "user.name", "mldbg tutorial"],
        ["config", "user.email", "tutorial@mldbg.invalid"],
        ["add", "-A"],
        ["commit", "-q", "-m", "minilib 0.1.0"],
    ):
        done = subprocess.run(
            ["git", "-C", str(repo), *argv], capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            raise TutorialError(f"git {' '.join(argv)} in {repo}: {done.stderr.strip()}")


def command_line(track: Track, key: str) -> list[str]:
    return [part.format(**track.values) for part in COMMANDS[key]]


def _display(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def run_command(track: Track, key: str) -> Ran:
    argv = command_line(track, key)
    env = {**os.environ, "MLDBG_HOME": str(track.workdir / ".mldbg")}
    if argv[0] == "mldbg":
        real = [sys.executable, "-m", "mldbg", argv[1], "--json", *argv[2:]]
    else:
        real = [sys.executable, *argv[1:]]
    proc = subprocess.run(
        real, cwd=track.workdir, env=env, capture_output=True, text=True, timeout=300
    )
    data: Any = None
    if argv[0] == "mldbg":
        try:
            data = json.loads(proc.stdout)
        except ValueError:
            data = None
    return Ran(_display(argv), proc.returncode, data, (proc.stdout + proc.stderr).strip())


# -- the steps ----------------------------------------------------------------------------------


def _steps(track: Track) -> list[Step]:
    v = track.values
    line = int(v["script_line"])
    framework_name = "PyTorch" if track.framework == "torch" else "MLX"

    def state_is(ran: Ran, **expected: object) -> bool:
        return isinstance(ran.data, dict) and all(ran.data.get(k) == e for k, e in expected.items())

    def at_line(ran: Ran) -> int | None:
        location = (ran.data or {}).get("location") or {}
        return location.get("line")

    def check_start(r: list[Ran]) -> tuple[bool, str]:
        ok = state_is(r[0], state="paused", reason="entry")
        return (
            ok,
            f"paused before line {at_line(r[0])} of {v['script']}, pid {r[0].data.get('pid') if ok else '?'}",
        )

    def check_break(r: list[Ran]) -> tuple[bool, str]:
        bp = r[0].data or {}
        stopped = state_is(r[1], state="paused", reason="breakpoint") and at_line(r[1]) == line
        return bool(
            bp.get("line") == line and stopped
        ), f"breakpoint {bp.get('id')} at line {bp.get('line')}; stopped at line {at_line(r[1])}"

    def check_eval(r: list[Ran]) -> tuple[bool, str]:
        result = str((r[0].data or {}).get("result"))
        return "5" in result, f"tokens.shape = {result}"

    def check_condition(r: list[Ran]) -> tuple[bool, str]:
        step = (r[4].data or {}).get("result")
        stopped = state_is(r[3], state="paused", reason="breakpoint") and at_line(r[3]) == line
        return step == "2" and stopped, f"stopped at line {at_line(r[3])} with step = {step}"

    def check_step(r: list[Ran]) -> tuple[bool, str]:
        ok = state_is(r[0], state="paused", reason="step") and at_line(r[0]) == line + 1
        return ok, f"now at line {at_line(r[0])} (logits is computed)"

    def check_checkpoint(r: list[Ran]) -> tuple[bool, str]:
        checkpoint = (r[0].data or {}).get("checkpoint") or {}
        ok = (
            state_is(r[0], state="paused", reason="checkpoint")
            and checkpoint.get("name") == "generate.logits"
        )
        return (
            ok,
            f"paused at checkpoint {checkpoint.get('name')} (hit {checkpoint.get('hit_count')})",
        )

    def check_library(r: list[Ran]) -> tuple[bool, str]:
        location = (r[1].data or {}).get("location") or {}
        inside = os.path.realpath(str(location.get("file"))) == os.path.realpath(v["library_file"])
        shape = (r[2].data or {}).get("result")
        return (
            inside and bool(shape),
            f"stopped in {location.get('file')}:{location.get('line')}; {v['library_arg']}.shape = {shape}",
        )

    def check_finish(r: list[Ran]) -> tuple[bool, str]:
        ok = state_is(r[1], reason="checkpoint") and state_is(r[2], state="exited", exit_code=0)
        return ok, f"the script ended with exit code {(r[2].data or {}).get('exit_code')}"

    def check_checkpoints(r: list[Ran]) -> tuple[bool, str]:
        records = (r[0].data or {}).get("checkpoints") or []
        steps = [rec["variables"]["step"]["value"] for rec in records]
        shapes = [rec["variables"]["logits"]["shape"] for rec in records]
        return steps == [0, 1, 2], f"{len(records)} records, steps {steps}, logits shapes {shapes}"

    def check_load(r: list[Ran]) -> tuple[bool, str]:
        words = r[0].text.split()
        ok = (
            r[0].returncode == 0
            and r[0].text.endswith("(1, 8, 96)")
            and words[0].startswith(v["other_framework"])
        )
        return ok, r[0].text.splitlines()[-1] if r[0].text else "(no output)"

    def check_compare(r: list[Ran]) -> tuple[bool, str]:
        first = (r[4].data or {}).get("first_divergence") or {}
        ok = first.get("module") == examples.PARITY_PLANTED_MISTAKE
        return ok, f"first divergence: {first.get('module')} ({first.get('reason')})"

    def check_tripwire(r: list[Ran]) -> tuple[bool, str]:
        trip = (r[2].data or {}).get("tripwire") or {}
        path = (r[3].data or {}).get("result")
        found = (trip.get("found") or [{}])[0]
        ok = (
            state_is(r[2], state="paused", reason="tripwire")
            and trip.get("module") == examples.NONFINITE_ORIGIN
            and path == repr(examples.NONFINITE_ORIGIN)
        )
        return ok, (
            f"stopped where NaN first appears: {trip.get('module')} ({trip.get('class')}), "
            f"{found.get('nan')} NaN in {found.get('name')}, at line {at_line(r[2])}"
        )

    def check_side_by_side(r: list[Ran]) -> tuple[bool, str]:
        data = r[4].data or {}
        diff = data.get("difference") or {}
        ok = (
            state_is(r[1], state="paused", reason="breakpoint")
            and state_is(r[3], state="paused", reason="breakpoint")
            and (data.get("against") or {}).get("session") == "tutorial-ref"
            and diff.get("shape_a") == diff.get("shape_b") == [2, 3, 3]
            and (diff.get("max_abs") or 0) > 0
        )
        worst = diff.get("worst") or {}
        return ok, (
            f"port vs reference: max |Δ| {diff.get('max_abs')}, rel_rms {diff.get('rel_rms')}, "
            f"worst at {worst.get('index')}"
        )

    def check_profile(r: list[Ran]) -> tuple[bool, str]:
        data = r[0].data or {}
        files = [f["path"] for f in data.get("files", [])]
        linear = next(
            (f for f in files if os.path.realpath(f) == os.path.realpath(v["library_file"])), None
        )
        report = data.get("report")
        ok = bool(linear) and bool(report) and os.path.exists(str(report))
        return ok, f"{len(files)} {v['framework_package']} files ran; report {report}"

    def check_prune(r: list[Ran]) -> tuple[bool, str]:
        made, ran, back, state = (x.data or {} for x in r)
        gone = sorted(prune_library.NEVER_RAN)
        left = sorted(set(gone) - {prune_library.RESTORED})
        ok = (
            made.get("pruned_branch") == "main-pruned"
            and sorted(ran.get("removed") or []) == gone
            and back.get("restored") == [prune_library.RESTORED]
            and state.get("removed") == left
            and state.get("kept") == [prune_library.RESTORED]
        )
        return ok, (
            f"{made.get('pruned_branch')}: removed {', '.join(ran.get('removed') or [])}; "
            f"restored {', '.join(back.get('restored') or [])} (kept by later runs)"
        )

    porting = [
        Step(
            "tripwire",
            "Where does the NaN come from?",
            "nonfinite.py is a port whose RMSNorm lost its eps; a padding row of zeros makes it "
            "divide 0 by 0. `break --nonfinite` checks every module call's outputs and stops "
            "where NaN first appears, in the frame that made that call.",
            [
                ("start_nan", 0),
                ("break_nonfinite", 0),
                ("continue_nan", 0),
                ("eval_tripped", 0),
                ("terminate_nan", 0),
            ],
            check_tripwire,
            "reason `tripwire`: the module path is named, and `mldbg.tripped()` holds its "
            "inputs and output. Every module downstream received the NaN and did not stop.",
        ),
        Step(
            "side_by_side",
            "The reference and the port, paused together",
            "A PyTorch reference and its MLX port stop at the same point; one `eval --against` "
            "evaluates `weights` in both and says how the port's differ.",
            [
                ("start_reference", 0),
                ("wait_reference", 0),
                ("start_port", 0),
                ("wait_port", 0),
                ("eval_against", 0),
                ("terminate_reference", 0),
                ("terminate_port", 0),
            ],
            check_side_by_side,
            "both values and their difference (max_abs, rel_rms, cosine, the worst element): "
            "the port forgot the 1/sqrt(d) scale.",
            needs=("torch", "mlx"),
        ),
    ]
    return [
        Step(
            "start",
            "Start the script under the debugger",
            f"`mldbg start` runs {v['script']} in its own {framework_name} process and stops "
            "before its first line, so you can set breakpoints first.",
            [("start", 0)],
            check_start,
            "state `paused`, reason `entry`: the script is loaded and waiting. Agents pass "
            "--json to every verb and read these fields.",
        ),
        Step(
            "breakpoint",
            "A breakpoint in the script",
            f"Stop where the model runs: line {line} of {v['script']} (`logits = model(tokens)`).",
            [("break_script", 0), ("continue", 0)],
            check_break,
            "continue runs until a breakpoint hits (or the script ends) and prints where it stopped.",
        ),
        Step(
            "eval",
            "Evaluate in the paused frame",
            "`mldbg eval` runs any expression in the selected frame; tensors are summarized.",
            [("eval_tokens", 0)],
            check_eval,
            "the prompt is 5 tokens long; the summary has shape, dtype, device and statistics.",
        ),
        Step(
            "step",
            "Step over a line",
            "`mldbg step over` runs the current line (the whole forward pass) and stops at the next.",
            [("step_over", 0)],
            check_step,
            "library frames are skipped unless you ask (`--into-libraries`): just-my-code.",
        ),
        Step(
            "checkpoint",
            "Checkpoints pause under the debugger",
            "The script calls `debug_checkpoint('generate.logits', ...)`; under mldbg that pauses "
            "(outside the debugger the same call only records).",
            [("continue", 0)],
            check_checkpoint,
            "state reason `checkpoint`, with the checkpoint's name and hit count.",
        ),
        Step(
            "condition",
            "Conditions, on breakpoints and on checkpoints",
            "Stop only on the third generation step: the breakpoint gets `--if`, and a checkpoint "
            "filter lets only that step's checkpoint pause.",
            [
                ("clear", 0),
                ("filter_checkpoints", 0),
                ("break_condition", 0),
                ("continue", 0),
                ("eval_step", 0),
            ],
            check_condition,
            "conditions are evaluated in the script's frame at each hit; steps 0 and 1 ran on.",
        ),
        Step(
            "library",
            "A breakpoint inside the library",
            f"Breakpoints work in installed libraries too: {framework_name}'s own Linear layer.",
            [("break_library", 0), ("continue", 0), ("eval_library", 0)],
            check_library,
            "this is the framework's code as installed; `mldbg doctor` says which copy is imported.",
        ),
        Step(
            "finish",
            "Run to the end",
            "`clear` removes breakpoints and checkpoint filters, so the step-2 checkpoint pauses "
            "once more; the second continue runs the script to its end.",
            [("clear", 0), ("continue", 0), ("continue", 0)],
            check_finish,
            "every stop, step and evaluation is in the run's events.jsonl (`mldbg runs`).",
        ),
        Step(
            "checkpoints",
            "Read the checkpoint records",
            "Each checkpoint hit wrote one self-contained JSON record.",
            [("checkpoints", 0)],
            check_checkpoints,
            "plain values are {type, value}; tensors are summaries (shape, dtype, stats).",
        ),
        Step(
            "debug_load",
            "debug_save / debug_load across frameworks",
            f"The script stored its final logits with debug_save; load them as {v['other_framework']}.",
            [("load_other", 0)],
            check_load,
            "the bytes are exact (bf16 too): hand a tensor from one framework to the other.",
        ),
        Step(
            "parity",
            "Capture and compare a reference and its port",
            "A PyTorch reference and an MLX port of the same model, with one planted mistake, "
            "two unmodified scripts: capture both with start --capture, then compare.",
            [
                ("capture_reference", 0),
                ("wait_capture_reference", 0),
                ("capture_port", 0),
                ("wait_capture_port", 0),
                ("compare", 1),
            ],
            check_compare,
            f"exit code 1: they diverge; the culprit is the first module whose inputs agree but "
            f"outputs differ; here the planted mistake ({examples.PARITY_MISTAKE}).",
            needs=("torch", "mlx", "safetensors"),
        ),
        Step(
            "profile",
            "Profile: which library code really ran",
            f"`mldbg profile` runs the script (not under the debugger) and ranks the "
            f"{v['framework_package']} files it ran.",
            [("profile", 0)],
            check_profile,
            "the report says what to read first and where breakpoints will hit.",
        ),
        Step(
            "prune",
            "Prune: a library reduced to what ran",
            f"{prune_library.REPO} is a library's git checkout (as one installed with "
            f"`pip install -e`); {prune_library.SCRIPT} uses one of its two models. `prune "
            "setup` makes a main-pruned branch, `prune run` profiles the script and commits "
            "there the removal of every file that never ran.",
            [("prune_setup", 0), ("prune_run", 0), ("prune_restore", 0), ("prune_status", 0)],
            check_prune,
            "check out main-pruned to read only the code the model runs; your branch and work "
            "tree are untouched. A file restored by hand stays through later runs.",
            programs=("git",),
        ),
        *(porting if track.framework == "mlx" else []),
    ]


# -- running ------------------------------------------------------------------------------------


def _ask(command: str, read: Callable[[str], str]) -> bool:
    """Wait for Enter, or for the user to type the command; False to quit."""
    while True:
        typed = read("  press Enter to run it, type it yourself, or q to quit: ").strip()
        if typed in ("q", "quit", "exit"):
            return False
        if not typed or shlex.split(typed) == shlex.split(command):
            return True
        print(f"  that is not `{command}`; try again (or just press Enter)")


def tutorial(
    track: str = "torch",
    *,
    interactive: bool = False,
    workdir: str | None = None,
    say: Callable[[str], None] | None = None,
    read: Callable[[str], str] = input,
) -> TutorialResult:
    """Run the tutorial's steps in order; stops at the first step whose check fails."""
    directory = Path(workdir or tempfile.mkdtemp(prefix=f"mldbg-tutorial-{track}-")).resolve()
    prepared = prepare(track, directory)
    emit = say or (lambda text: None)
    result: TutorialResult = {
        "track": track,
        "ok": True,
        "workdir": str(directory),
        "steps": [],
        "failed": None,
    }
    emit(f"mldbg tutorial ({track}) in {directory}\n")
    steps = _steps(prepared)
    try:
        for number, step in enumerate(steps, start=1):
            entry: StepResult = {
                "name": step.name,
                "title": step.title,
                "ok": False,
                "skipped": None,
                "commands": [],
                "detail": "",
            }
            result["steps"].append(entry)
            emit(f"\n[{number}/{len(steps)}] {step.title}\n  {step.explain}")
            missing = [m for m in step.needs if importlib.util.find_spec(m) is None]
            missing += [p for p in step.programs if shutil.which(p) is None]
            if missing:
                entry["ok"], entry["skipped"] = True, f"needs {', '.join(missing)}"
                emit(f"  (skipped: needs {', '.join(missing)})")
                continue
            runs = []
            for key, expected in step.commands:
                shown = _display(command_line(prepared, key))
                emit(f"  $ {shown}")
                if interactive and not _ask(shown, read):
                    result["ok"], result["failed"] = False, f"{step.name} (quit)"
                    return result
                ran = run_command(prepared, key)
                entry["commands"].append(ran.command)
                runs.append(ran)
                if ran.returncode != expected:
                    entry["detail"] = f"`{ran.command}` exited {ran.returncode}: {ran.text[-800:]}"
                    break
            else:
                try:
                    entry["ok"], entry["detail"] = step.check(runs)
                except (KeyError, TypeError, IndexError, AttributeError) as exc:
                    entry["ok"], entry["detail"] = False, f"unexpected output ({exc!r})"
            mark = "ok" if entry["ok"] else "FAILED"
            emit(f"  -> {mark}: {entry['detail']}")
            if not entry["ok"]:
                result["ok"], result["failed"] = False, step.name
                return result
            emit(f"  {step.meaning}")
        emit("\nDone: every step ran for real. The files are in " + str(directory))
        return result
    finally:
        run_command(prepared, "terminate")  # never leave the tutorial's script paused
        if track == "mlx":
            for key in EXTRA_SESSIONS:
                run_command(prepared, key)
