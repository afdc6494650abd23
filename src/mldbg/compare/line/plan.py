"""From a comparison's verdict to what each script's re-run records (``mldbg line``).

A module verdict names a module call (``transformer_blocks.0.attn#0``): each run records
that call of that module in the same model of its run (the capture ``NAME.3`` is the
run's third model).  A glue verdict names the model call whose input first differs
(``<root>#1``, after ``<root>#0``): each run records its own lines around the calls,
in the functions holding the call sites compare names, up to that call, and that call's
inputs.  Both captures must come from runs the store describes (``run.json``: the
script, its arguments, working directory, interpreter and the variables ``start``
added), since the step runs them again as they were started.

The bound a line's value may differ by and still agree is what compare allowed the
culprit's call: the largest bound of its entries (rounding over the depth, the measured
conditioning floors, quantization), and at least twice the error its inputs already
carried (a clean call passes at most twice its inputs' relative error on: compare's
growth rule).  Its intermediate values sit between its inputs and its outputs.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

from ...capture.store import CAPTURE_JSON, module_label
from ...errors import BAD_COMPARE_INPUT
from ...store import reading
from ...store.runs import RUN_JSON, RunDir, started_as
from ..read.sources import CompareInputError
from ..records import Culprit, EntryResult, Glue
from ..report.narrow import path_in_b

DEFAULT_BUDGET = 64 << 20  # bytes of line records per script, when the captures set none
FLOOR = 1e-6  # the smallest bound: float32 rounding over a short computation
ZERO_EDIT_ENV = "MLDBG_CAPTURE"


@dataclass
class Side:
    """One script's captured run, and where its re-run records."""

    capture: Path
    run: Path
    script: str | None
    module: str | None
    args: list[str]
    cwd: str
    python: str | None
    env: dict[str, str]
    model: int
    module_path: str
    sites: list[str] = field(default_factory=list)
    models: list[str] | None = None

    def command(self) -> str:
        target = ["-m", self.module] if self.module else [str(self.script)]
        return shlex.join([*target, *self.args])


@dataclass
class Plan:
    kind: str  # module | glue
    culprit: str
    call: int
    bound: float
    budget: int
    inputs: tuple[str | None, str | None]  # glue: the differing input, in each run's names
    a: Side
    b: Side

    def spec(self, side: str, targets: str | None = None) -> dict[str, object]:
        """``$MLDBG_LINES`` for one side's re-run (``line_scope.LineSpec``)."""
        chosen = self.a if side == "a" else self.b
        return {
            "side": side,
            "kind": self.kind,
            "model": chosen.model,
            "module": chosen.module_path,
            "call": self.call,
            "sites": chosen.sites,
            "models": chosen.models,
            "budget": self.budget,
            "targets": targets,
        }


def plan(document: dict[str, object], budget: int | None = None) -> Plan:
    """The line step for a comparison's document (``compare_sources``); bad input when
    its verdict is not a module or glue one, or a capture is not a run's."""
    found = document.get("first_divergence")
    if not isinstance(found, dict) or found.get("module") is None:
        raise CompareInputError(
            "the comparison names no module and no glue code (it agrees, or could not "
            "decide): there is no line to look for",
            code=BAD_COMPARE_INPUT,
        )
    culprit = cast("Culprit", found)
    entries = document.get("entries")
    results = cast("list[EntryResult]", entries if isinstance(entries, list) else [])
    glue = culprit.get("glue")
    kind = "glue" if glue else "module"
    a = _side(document.get("a"), "a")
    b = _side(document.get("b"), "b")
    a.module_path = str(culprit["module"])
    b.module_path = path_in_b(culprit, results)
    inputs: tuple[str | None, str | None] = (None, None)
    if glue:
        a.sites, b.sites = _sites(glue, "site_a"), _sites(glue, "site_b")
        named = glue["input"].get("name")
        paired = next((r.get("name_b") for r in results if r.get("name") == named), named)
        inputs = (_input_key(named), _input_key(paired))
    limits = [n for n in (_limit(a.capture), _limit(b.capture)) if n is not None]
    return Plan(
        kind=kind,
        culprit=str(culprit.get("name")),
        call=int(culprit.get("call") or 0),
        bound=bound_of(culprit, results),
        budget=budget or (min(limits) if limits else DEFAULT_BUDGET),
        inputs=inputs,
        a=a,
        b=b,
    )


def bound_of(culprit: Culprit, results: list[EntryResult]) -> float:
    """What compare allowed the culprit's call (see the module's docstring)."""
    calls = {(culprit.get("module"), culprit.get("call"))}
    glue = culprit.get("glue")
    if glue and glue["after"] is not None:
        module, _, number = glue["after"]["call"].rpartition("#")
        if number.isdigit():
            calls.add((module, int(number)))
    found = []
    for result in results:
        expected = result.get("expected")
        if (result.get("module"), result.get("call")) in calls and expected is not None:
            found.append(float(expected))
    carried = culprit.get("input_rel_rms")
    if isinstance(carried, int | float) and carried == carried:
        found.append(2.0 * float(carried))
    return max([FLOOR, *found])


def _input_key(name: object) -> str | None:
    """``<root>#1.in.timestep`` -> ``in.timestep`` (how the re-run names that input)."""
    if not isinstance(name, str) or ".in." not in name:
        return None
    return "in." + name.split(".in.", 1)[1]


def _sites(glue: Glue, key: Literal["site_a", "site_b"]) -> list[str]:
    """The call sites of one script, the earlier call's first."""
    sites: list[str] = []
    for site in (glue["after"], glue["before"]):
        where = site[key] if site is not None else None
        if where is not None and where not in sites:
            sites.append(where)
    return sites


def _limit(capture: Path) -> int | None:
    meta = _json(capture / CAPTURE_JSON)
    limit = meta.get("budget_limit")
    return int(limit) if isinstance(limit, int | float) and limit > 0 else None


def _json(path: Path) -> dict[str, object]:
    try:
        data = reading.read_json(path)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _side(described: object, label: str) -> Side:
    """A compared source's capture and the run that made it, as ``run.json`` tells."""
    info = described if isinstance(described, dict) else {}
    if info.get("kind") != "capture":
        raise CompareInputError(
            f"{label} ({info.get('spec')}) is not a capture made by a run: the line step runs "
            "the scripts of both captures again, as their runs were started",
            code=BAD_COMPARE_INPUT,
        )
    capture = Path(str(info.get("path")))
    run = capture.parent.parent
    started = started_as(run)
    if started is None:
        raise CompareInputError(
            f"{label}: the run {run.name} does not say which script it ran ({run / RUN_JSON}); "
            "capture it with mldbg start --capture NAME (or under mldbg) to run it again",
            code=BAD_COMPARE_INPUT,
        )
    script, module = started.get("script"), started.get("module")
    args = cast("list[str]", started["args"])
    env = cast("dict[str, str]", started["env"])
    capture_meta = _json(capture / CAPTURE_JSON)
    models = _models(env, capture_meta)
    zero_edit = ZERO_EDIT_ENV in env or bool(capture_meta.get("upstream"))
    return Side(
        capture=capture,
        run=run,
        script=script if isinstance(script, str) else None,
        module=module if isinstance(module, str) else None,
        args=args,
        cwd=str(started.get("cwd") or run),
        python=str(started["python"]) if "python" in started else None,
        env=env,
        model=_model_number(capture_meta) if zero_edit else _same_class_before(capture),
        module_path=module_label(""),
        models=models,
    )


def _model_number(meta: dict[str, object]) -> int:
    """3 for a zero-edit run's third model (``NAME.3``, listing the captures before it)."""
    name = str(meta.get("name") or "")
    stem, dot, number = name.rpartition(".")
    if meta.get("upstream") and dot and stem and number.isdigit():
        return int(number)
    return 1


def _same_class_before(capture: Path) -> int:
    """A capture the script made itself (``mldbg.capture(model, NAME)``): its model is
    found again by its class, so it is the n-th model of that class the run captured (a
    reference and its copy, captured one after the other in one script: 1 and 2)."""
    meta = _json(capture / CAPTURE_JSON)
    mine, when = meta.get("model_class"), meta.get("created")
    if not isinstance(when, int | float):
        return 1
    earlier = 0
    for other in capture.parent.iterdir():
        if other == capture or not other.is_dir():
            continue
        theirs = _json(other / CAPTURE_JSON)
        created = theirs.get("created")
        if (
            theirs.get("model_class") == mine
            and isinstance(created, int | float)
            and created < when
        ):
            earlier += 1
    return earlier + 1


def _models(env: dict[str, str], meta: dict[str, object]) -> list[str] | None:
    """Which module calls were the run's models: the zero-edit capture's own patterns
    (``--capture-model``), else the captured model's class (a capture the script made)."""
    raw = env.get(ZERO_EDIT_ENV)
    if raw is not None:
        try:
            settings = json.loads(raw)
        except ValueError:
            settings = {}
        models = settings.get("models") if isinstance(settings, dict) else None
        return [str(m) for m in models] if isinstance(models, list) and models else None
    model_class = meta.get("model_class")
    return [str(model_class)] if isinstance(model_class, str) and model_class else None


def run_of(side: Side) -> RunDir:
    return RunDir(side.run)
