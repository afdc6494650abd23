"""``mldbg tutorial`` run for real, both tracks, and the demo's parity ending."""

from __future__ import annotations

from pathlib import Path

import pytest

from mldbg.tools import tutorial

STEPS = [
    "start",
    "breakpoint",
    "eval",
    "step",
    "checkpoint",
    "condition",
    "library",
    "finish",
    "checkpoints",
    "debug_load",
    "parity",
    "profile",
    "prune",
]


@pytest.mark.parametrize("track", ["torch", "mlx"])
def test_every_step_runs_and_checks_out(cli, tmp_path: Path, track: str) -> None:
    pytest.importorskip("torch" if track == "torch" else "mlx.core")
    workdir = tmp_path / "tut"
    result = cli("tutorial", track, "--non-interactive", "--dir", str(workdir), json_out=True)
    assert result["ok"] is True and result["failed"] is None, result
    porting = ["tripwire", "side_by_side"] if track == "mlx" else []
    assert [s["name"] for s in result["steps"]] == STEPS + porting
    assert all(s["ok"] and s["commands"] for s in result["steps"] if not s["skipped"])
    by_name = {s["name"]: s for s in result["steps"]}
    assert "step = 2" in by_name["condition"]["detail"]
    assert "linear.py" in by_name["library"]["detail"]
    assert "steps [0, 1, 2]" in by_name["checkpoints"]["detail"]
    assert (
        "removed minilib/flash_attention.py, minilib/models/gpt.py" in (by_name["prune"]["detail"])
    )
    assert "restored minilib/models/gpt.py" in by_name["prune"]["detail"]
    if not by_name["parity"]["skipped"]:
        assert "layers.0.attn" in by_name["parity"]["detail"]
    assert (workdir / "tutorial.py").exists() and (workdir / ".mldbg" / "runs").is_dir()
    if track == "mlx":
        assert "layers.0.norm" in by_name["tripwire"]["detail"]
        if not by_name["side_by_side"]["skipped"]:
            assert "worst at [1, 2, 2]" in by_name["side_by_side"]["detail"]


def test_interactive_mode_waits_and_lets_the_user_type(
    daemon, config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv("MLDBG_CONFIG_DIR", str(config_dir))
    prepared = tutorial.prepare("torch", tmp_path / "probe")
    start = " ".join(tutorial.command_line(prepared, "start"))
    answers = iter(["mldbg something-else", start, "q"])
    prompts: list[str] = []
    said: list[str] = []

    def read(prompt: str) -> str:
        prompts.append(prompt)
        return next(answers)

    result = tutorial.tutorial(
        "torch", interactive=True, workdir=str(tmp_path / "tut"), say=said.append, read=read
    )
    assert len(prompts) == 3  # the wrong command was asked again, then q quit at step 2
    assert result["steps"][0]["ok"] and result["failed"] == "breakpoint (quit)"
    assert any("paused before line" in line for line in said)


def test_unknown_track_is_bad_input(cli) -> None:
    proc = cli("tutorial", "jax", expect=2)
    assert "invalid choice" in proc.stderr


def test_demo_ends_by_naming_the_planted_mistake(cli) -> None:
    pytest.importorskip("mlx.core")
    result = cli("demo", json_out=True)
    assert result["ok"] is True
    assert result["parity"]["ok"] is True and result["parity"]["culprit"] == "layers.0.attn"
    # the main job on two scripts that know nothing of mldbg: captured as they are, then
    # the module and the line of the planted mistake
    assert result["parity"]["line"].startswith("parity_port.py:")
    assert "/ self.head_dim" in result["parity"]["line"]
    commands = [step["command"] for step in result["transcript"]]
    assert (
        "mldbg start --session demo-ref --capture demo-ref --run -m mldbg.examples.parity_reference"
        in commands
    )
    assert commands[-2:] == ["mldbg compare demo-ref demo-port", "mldbg line demo-ref demo-port"]
