"""A comparison an agent can walk: filters, rows numbered in the whole, a ``next`` whenever
anything was cut, the header once; and every call an answer hands out worded for the
surface that asked (a command line, a tool call, a route)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mldbg import verbs
from mldbg.cli.main import parse_command_line, verb_arguments
from mldbg.compare.report.answer import bounded, statuses
from mldbg.mcp.server import INSTRUCTIONS

torch = pytest.importorskip("torch")

import mldbg  # noqa: E402
from mldbg.client.api import Client  # noqa: E402
from test_mcp import Tools, run_mcp  # noqa: E402

BLOCKS = 130  # 130 blocks of 3 calls, an input and an output each: 780+ entries
BUGGY = 77


class Block(torch.nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.act = torch.nn.Tanh()
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x) * (1.5 if self.bug else 1.0))


class Deep(torch.nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(bug and i == BUGGY) for i in range(BLOCKS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two captures of a deep model (the port with one planted bug), in a store of their own."""
    from mldbg.store import current_run

    home = tmp_path_factory.mktemp("navigation") / ".mldbg"
    before = os.environ.get("MLDBG_HOME")
    os.environ["MLDBG_HOME"] = str(home)
    try:
        for name, bug in (("ref", False), ("port", True)):
            current_run.reset()
            torch.manual_seed(0)
            model = Deep(bug)
            with torch.no_grad(), mldbg.capture(model, name, sensitivity=False):
                model(torch.randn(3, 4))
    finally:
        current_run.reset()
        if before is None:
            os.environ.pop("MLDBG_HOME")
        else:
            os.environ["MLDBG_HOME"] = before
    return home


@pytest.fixture(scope="module")
def whole(store: Path) -> dict[str, Any]:
    result = mldbg.compare("ref", "port", home=store).result
    assert len(result["entries"]) > 500
    assert result["first_divergence"]["module"].startswith(f"blocks.{BUGGY}")
    return result


def test_a_module_filter_shows_all_its_entries_with_their_rows_in_the_whole(
    whole: dict[str, Any],
) -> None:
    page = bounded(whole, module=f"blocks.{BUGGY - 10}.*")  # a block before the bug: agrees
    entries = page["entries"]
    expected = [
        (row, e["name"])
        for row, e in enumerate(whole["entries"])
        if str(e.get("module") or "").startswith(f"blocks.{BUGGY - 10}.")
    ]
    assert [(e["row"], e["name"]) for e in entries] == expected  # in execution order
    assert {e["role"] for e in entries} == {"in", "out"} and all(e["ok"] for e in entries)
    assert page["matching"] == len(expected) and page["filter"] == {"module": "blocks.67.*"}
    assert "next" not in page  # everything it matched is shown
    # a call and a kind narrow it further; a status finds the culprit alone
    outs = bounded(whole, module=f"blocks.{BUGGY}.*", call=0, kind="out")["entries"]
    assert {e["role"] for e in outs} == {"out"} and len(outs) == 2
    culprit = bounded(whole, status="culprit")["entries"]
    assert culprit and all(e["culprit"] for e in culprit)
    assert all(s in verbs.COMPARE_STATUSES for e in whole["entries"] for s in statuses(e))


def test_pages_number_rows_in_the_whole_say_their_place_and_hand_out_next(
    whole: dict[str, Any],
) -> None:
    first = bounded(whole, passing=True, inputs=True, limit=100)
    assert first["first_divergence"] and first["a"] and "page" not in first
    assert first["next"] == {
        "verb": "compare",
        "args": {
            "a": "ref",
            "b": "port",
            "passing": True,
            "inputs": True,
            "offset": 100,
            "limit": 100,
        },
    }
    second = bounded(whole, passing=True, inputs=True, offset=100, limit=100)
    for key in ("a", "b", "first_divergence", "boundary_differences", "warnings", "notes"):
        assert key not in second  # the header and verdict once
    assert second["page"] == {"offset": 100, "limit": 100, "matching": len(whole["entries"])}
    rows = [e["row"] for e in first["entries"] + second["entries"]]
    assert len(set(rows)) == 200 and all(0 <= r < len(whole["entries"]) for r in rows)
    named = {e["row"]: e["name"] for e in second["entries"]}
    assert all(whole["entries"][row]["name"] == name for row, name in named.items())
    last = bounded(whole, passing=True, inputs=True, offset=len(whole["entries"]) - 5)
    assert last["shown"] == 5 and "next" not in last


def test_one_module_in_one_call_on_every_surface(
    store: Path, config_dir: Path, daemon: dict[str, Any]
) -> None:
    module = f"blocks.{BUGGY}.*"
    # the command line: the same page as every surface, within its budget
    env = {**os.environ, "MLDBG_HOME": str(store), "COLUMNS": "200"}
    cli = subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", "ref", "port", "--module", module, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 1, cli.stderr
    by_cli = json.loads(cli.stdout)
    text = subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", "ref", "port", "--module", module],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert f"filter: module={module}" in text
    # REST, through the typed client
    by_rest = Client(daemon).call(  # type: ignore[arg-type]
        "compare", None, a="ref", b="port", module=module, home=str(store)
    )
    # MCP, through the real SDK client
    by_mcp: list[dict[str, Any]] = []

    async def scenario(tool: Tools, client: Any) -> None:
        by_mcp.append(await tool("compare", a="ref", b="port", module=module, home=str(store)))

    run_mcp(config_dir, store.parent, scenario)
    for page in (by_cli, by_rest, by_mcp[0]):
        rows = [(e["row"], e["name"]) for e in page["entries"]]
        assert len(rows) == 4 and all(name.startswith(f"blocks.{BUGGY}.") for _, name in rows)
    assert by_cli["entries"] == by_rest["entries"] == by_mcp[0]["entries"]


def test_mcp_text_cut_says_where_the_rows_it_could_not_show_start(
    store: Path, config_dir: Path, daemon: dict[str, Any]
) -> None:
    texts: list[str] = []
    pages: list[dict[str, Any]] = []

    async def scenario(tool: Tools, client: Any) -> None:
        args = {"a": "ref", "b": "port", "passing": True, "inputs": True, "limit": 400}
        result = await client.call_tool("compare", {**args, "home": str(store)})
        texts.append(result.content[0].text)
        pages.append(result.structured_content)

    run_mcp(config_dir, store.parent, scenario)
    (text,), (page,) = texts, pages
    assert "[text cut at " in text and "the structured content is whole" in text
    call = text[text.index("rows from ") :]
    assert 'compare(a="ref", b="port", passing=true, inputs=true, limit=400' in call
    offset = int(re.search(r"offset=(\d+)", call)[1])  # type: ignore[index]
    assert 0 < offset < 400
    shown = text[: text.index("[text cut at ")]
    names = [e["name"] for e in page["entries"]]
    assert names[offset - 1] in shown and names[offset] not in shown  # where the text stopped


# -- one wording of a call per surface ------------------------------------------------------

NAMES = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=30
)


@settings(
    max_examples=150,
    deadline=None,  # a busy machine must not fail it
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    script=NAMES,
    script_args=st.lists(NAMES, max_size=4),
    within=NAMES,
    capture=st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,20}", fullmatch=True),
    env=st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True), NAMES, max_size=3),
)
def test_a_start_call_worded_for_the_command_line_parses_back_to_itself(
    script: str, script_args: list[str], within: str, capture: str, env: dict[str, str]
) -> None:
    """Quoted for a shell and ordered as start parses it (options, script, its arguments):
    whatever a capture's module path or a script's arguments hold ("x; rm -rf ~", "--"),
    and the variables the run was started with, as ``--env K=V`` once each."""
    if script.startswith("-"):
        script = "./" + script
    call = {
        "verb": "start",
        "args": {
            "script": script,
            "args": script_args,
            "capture": capture,
            "capture_within": within,
            "stop_on_entry": False,
            "env": env,
        },
    }
    argv = shlex.split(verbs.word(call, "cli"))  # type: ignore[arg-type]
    assert argv[:2] == ["mldbg", "start"]
    parsed = parse_command_line(argv[1:])
    values = verb_arguments(verbs.get("start"), parsed)
    assert values["script"] == script and parsed.args == script_args
    assert values["capture"] == capture and values["capture_within"] == within
    assert values["stop_on_entry"] is False
    assert (values.get("env") or {}) == env


def test_calls_are_worded_as_each_surface_makes_them() -> None:
    call = {"verb": "compare", "args": {"a": "ref", "b": "port", "module": "blocks.3.*"}}
    assert verbs.word(call, "cli") == "mldbg compare ref port --module 'blocks.3.*'"  # type: ignore[arg-type]
    assert verbs.word(call, "mcp") == 'compare(a="ref", b="port", module="blocks.3.*")'  # type: ignore[arg-type]
    assert verbs.word(call, "rest") == (  # type: ignore[arg-type]
        'POST /v1/compare {"a": "ref", "b": "port", "module": "blocks.3.*"}'
    )
    paused = {"verb": "vars", "args": {"session": "port", "filter": "x*"}}
    assert verbs.word(paused, "rest") == "GET /v1/sessions/port/vars?filter=x%2A"  # type: ignore[arg-type]
    assert verbs.word(paused, "cli") == "mldbg vars --filter 'x*' --session port"  # type: ignore[arg-type]


def test_the_mcp_instructions_teach_the_zero_edit_job_in_a_screen() -> None:
    assert len(INSTRUCTIONS.encode()) <= 1600
    for taught in (
        'capture="ref"',
        "wait()",
        'compare(a="ref", b="port")',
        'line(a="ref"',
        "break(",
        "eval",
        "docs/",
    ):
        assert taught in INSTRUCTIONS
    assert "mldbg.capture(" not in INSTRUCTIONS  # the edit-the-script workflow is not the lead


# -- signal over noise: parameter-free modules one side computes inline -------------------


class Mlp(torch.nn.Module):
    """The reference: an activation module between two linears."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = (
            torch.nn.Linear(8, 16),
            torch.nn.GELU(),
            torch.nn.Linear(16, 8),
        )
        self.dropout = torch.nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.act(self.fc1(x))))


class InlineMlp(torch.nn.Module):
    """The port: the same linears, the activation inline, no dropout; ``scale`` a bug."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)) * self.scale)


class Outer(torch.nn.Module):
    def __init__(self, mlp: torch.nn.Module) -> None:
        super().__init__()
        self.norm, self.mlp, self.act = torch.nn.LayerNorm(8), mlp, torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm(x))


def _captured(home: Path, name: str, model: torch.nn.Module) -> None:
    from mldbg.store import current_run

    current_run.reset()
    with torch.no_grad(), mldbg.capture(model, name):
        model(torch.randn(2, 8, generator=torch.Generator().manual_seed(1)))


def test_parameter_free_modules_without_a_counterpart_are_counted_not_listed(home: Path) -> None:
    torch.manual_seed(0)
    ref = Outer(Mlp())
    clean = Outer(InlineMlp())
    clean.load_state_dict(ref.state_dict())
    buggy = Outer(InlineMlp(scale=1.5))
    buggy.load_state_dict(ref.state_dict())
    for name, model in (("ref", ref), ("clean", clean), ("bug", buggy)):
        _captured(home, name, model)

    result = mldbg.compare("ref", "clean", home=home).result
    assert result["ok"], result["first_divergence"]
    assert not any("act" in n or "dropout" in n for n in result["unpaired_a"])
    assert result["unpaired_parameter_free"]["a"] == 4  # act, dropout: an input, an output each
    assert result["counts"]["unpaired_a"] == 4  # still counted in the whole

    # The culprit is the MLP (its inline work is scaled): its parameter-free children are
    # on the culprit's path and stay listed, with the hint to look at the inline code.
    bug = mldbg.compare("ref", "bug", home=home).result
    assert bug["first_divergence"]["module"] == "mlp", bug["first_divergence"]
    assert any(n.startswith("mlp.act#0") for n in bug["unpaired_a"])
    assert any(n.startswith("mlp.dropout#0") for n in bug["unpaired_a"])
    meta = json.loads(next(home.glob("runs/*/captures/ref/capture.json")).read_text())
    assert set(meta["parameter_free"]) == {"mlp.act", "mlp.dropout", "act"}  # uncalled too
