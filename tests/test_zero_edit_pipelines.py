"""Zero-edit capture of pipelines: several models, several calls each, as scripts call them.

Each script here is run unmodified in a real subprocess with ``$MLDBG_CAPTURE`` set, the
way the agent runs it under ``start --capture`` (``zero_edit.install_from_environment()``
before the script, ``finish()`` after): the captures it leaves are then read back.
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

RUNNER = textwrap.dedent(
    """
    import runpy, sys
    from mldbg import zero_edit
    tracker = zero_edit.install_from_environment()
    sys.argv = sys.argv[1:]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        tracker.finish()
    """
)


def run_script(
    directory: Path, script: str, *args: str, **settings: Any
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (its source) in ``directory`` with ``settings`` as ``$MLDBG_CAPTURE``."""
    path = directory / "script.py"
    path.write_text(textwrap.dedent(script))
    env = {
        **os.environ,
        "MLDBG_CAPTURE": json.dumps(settings),
        "MLDBG_HOME": str(directory / ".mldbg"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(path), *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def index_of(directory: Path, name: str) -> list[dict[str, Any]]:
    (index,) = (directory / ".mldbg" / "runs").glob(f"*/captures/{name}/index.jsonl")
    return [json.loads(line) for line in index.read_text().splitlines()]


def top_level_calls(lines: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [
        (line["module"], line["call"])
        for line in lines
        if line["event"] == "call" and line["parent"] is None
    ]


MLX_LOOP = """
    import mlx.core as mx
    import mlx.nn as nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 8)

        def __call__(self, x):
            return self.b(nn.gelu(self.a(x)))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [Block(), Block()]

        def __call__(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    mx.random.seed(0)
    model = Model()
    x = mx.random.normal((2, 8))
    for step in range(3):
        x = model(x)
        mx.eval(x)
"""


def test_an_mlx_model_called_in_a_loop_is_recorded_once_per_call(tmp_path: Path) -> None:
    """Every call after the first entered the recording class, which called the zero-edit
    wrapper, which went through the recording class again: ``<root>#1`` held a nested
    ``<root>#2`` with the whole tree, and the port's step k no longer met the reference's."""
    pytest.importorskip("mlx.core")
    run_script(tmp_path, MLX_LOOP, name="loop")
    lines = index_of(tmp_path, "loop")
    assert top_level_calls(lines) == [("", 0), ("", 1), ("", 2)]
    calls = [(line["module"], line["call"]) for line in lines if line["event"] == "call"]
    assert calls.count(("", 1)) == 1 and ("", 3) not in calls
    blocks = [line for line in lines if line["event"] == "call" and line["module"] == "blocks.0"]
    assert [line["call"] for line in blocks] == [0, 1, 2]
