"""Never "match" on missing data (issue 33, item 5).

A capture that lost entries it recorded cannot agree on what it lacks.  Each way of
losing them, made for real: a port run killed inside the model (its ``capture.json``
still says ``capturing``), a full disk (``RLIMIT_FSIZE``: the wide layer's tensor file
cannot be written, as on a full disk), the byte budget.  Each compared as "match", exit 0,
before; now the verdict says what is missing, the last point that agrees, and exits 2 —
unless a difference was found among what was compared, which is still named (exit 1).
And a coarse pass's ``narrow`` hint into a leaf module led to "no verdict: module names
probably differ"; it leads to a verdict now.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import mldbg  # noqa: E402
from mldbg.store import current_run  # noqa: E402
from mldbg.text import compare as compare_render  # noqa: E402
from mldbg.text.console import captured  # noqa: E402

SCRIPT = textwrap.dedent(
    """
    import os, resource, signal, sys
    import torch
    import mldbg

    class Wide(torch.nn.Linear):
        def forward(self, x):
            if sys.argv[1] == "killed":
                os._exit(9)  # the run dies inside the model, its capture still open
            return super().forward(x)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), Wide(8, 4096)
    ).eval()
    x = torch.randn(4, 8)
    if sys.argv[1] == "full-disk":
        # Every file this process writes is cut at 32 KiB, as on a disk that fills up: the
        # wide layer's 64 KiB of output cannot be written, the index and the rest can.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (32768, 32768))
    with torch.no_grad(), mldbg.capture(model, sys.argv[2], background=False):
        model(x)
    """
)


def run(directory: Path, how: str, name: str) -> None:
    script = directory / "model.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "MLDBG_HOME": str(directory / ".mldbg")}
    proc = subprocess.run(
        [sys.executable, str(script), how, name],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == (9 if how == "killed" else 0), proc.stderr[-2000:]


def cli(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLDBG_HOME": str(directory / ".mldbg"), "COLUMNS": "300"}
    return subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("how", ["killed", "full-disk"])
def test_a_port_capture_that_lost_its_output_is_never_a_match(tmp_path: Path, how: str) -> None:
    run(tmp_path, "clean", "ref")
    run(tmp_path, how, "port")
    state = json.loads(
        next((tmp_path / ".mldbg").glob("runs/*/captures/port/capture.json")).read_text()
    )
    assert state["state"] == ("capturing" if how == "killed" else "incomplete")
    result = json.loads(cli(tmp_path, "ref", "port", "--json").stdout)
    assert not result["ok"] and result["first_divergence"] is None
    assert result["decided_by"] == "missing"
    missing = result["missing"]
    unchecked = {item["name"]: item["why"] for item in missing["entries"]}
    assert "<root>#0.out" in unchecked and "3#0.out" in unchecked, unchecked
    if how == "killed":
        assert "never returned" in unchecked["3#0.out"]
        assert missing["b"]["state"] == "capturing"
    else:
        assert "could not write its outputs" in unchecked["3#0.out"]
        assert "File too large" in unchecked["3#0.out"]
    assert missing["last_agreeing"] == "2#0.out"  # the last layer that ran and agrees
    assert "nothing that was compared differs" in result["undecided"]
    human = cli(tmp_path, "ref", "port")
    assert human.returncode == 2, human.stdout[-2000:]
    assert "incomplete" in human.stdout and "unchecked 3#0.out" in human.stdout


def stack(bug: int | None = None) -> torch.nn.Sequential:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(6))).eval()
    if bug is not None:
        with torch.no_grad():
            model[bug].weight[0] *= 1.5
    return model


def capture_stack(name: str, bug: int | None, **options: Any) -> None:
    model = stack(bug)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), mldbg.capture(model, name, **options):
        model(x)
    current_run.reset()


@pytest.mark.usefixtures("home")
@pytest.mark.parametrize("bug", [4, 1], ids=["bug-in-what-was-lost", "bug-before-it"])
def test_what_the_byte_budget_dropped_is_not_agreement(bug: int) -> None:
    """The port's capture ran out of its byte budget after three layers: a bug in a later
    layer was never seen, and compare said "match".  Now it says which entries it could
    not check; a bug among what it could check is still named."""
    capture_stack("ref", None)
    capture_stack("port", bug, budget=3 * 2 * 32 * 64 * 4 + 32 * 64 * 4, sensitivity=False)
    comparison = mldbg.compare("ref", "port")
    result = comparison.result
    missing = result["missing"]
    assert missing["b"]["not_written"] > 0
    assert any("over the byte budget" in item["why"] for item in missing["entries"])
    if bug == 4:
        assert result["decided_by"] == "missing" and comparison.exit_code == 2
        assert "4#0.out" in {item["name"] for item in missing["entries"]}
        with captured(width=300) as buffer:
            compare_render.show(result)
        assert "incomplete" in buffer.getvalue() and "match" not in buffer.getvalue()
    else:
        culprit = result["first_divergence"]
        assert culprit is not None and culprit["module"] == "1" and comparison.exit_code == 1


@pytest.mark.usefixtures("home")
def test_narrowing_into_a_leaf_leads_to_a_verdict() -> None:
    """The coarse pass names a leaf (``2``); its hint, a full capture within ``2``, left
    one call with tensors beside the model's other calls on the index, and the pairing
    rule read that as "module names probably differ"."""
    for name, bug in (("ref", None), ("port", 2)):
        capture_stack(name, bug, mode="summary", depth=1)
    narrow = mldbg.compare("ref", "port").result["narrow"]
    assert narrow["within_a"] == "2"
    for name, bug in (("ref-fine", None), ("port-fine", 2)):
        capture_stack(name, bug, within=narrow["within_a"])
    fine = mldbg.compare("ref-fine", "port-fine").result
    assert fine["undecided"] is None
    assert fine["first_divergence"] is not None and fine["first_divergence"]["module"] == "2"
