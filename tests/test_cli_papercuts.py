"""What scripts and people read from the CLI: progress, ended sessions, help texts."""

from __future__ import annotations

import argparse
import os
import pty
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

# a script that runs past one wait slice (5 s): the client reports progress in between
SLOW = "import time\nprint('working', flush=True)\ntime.sleep(7)\nprint('finished')\n"


def test_wait_prints_no_progress_where_no_terminal_shows_it(cli, write) -> None:
    """An agent reads stdout and stderr apart (often stdout first): a progress line on
    stderr then reads as coming after the final state.  Without a terminal there is none."""
    write("slow.py", SLOW)
    cli("start", "--session", "noprogress", "--run", "slow.py")
    try:
        done = cli("wait", "--session", "noprogress", "--max-wait", "60")
        assert "exited" in done.stdout and "finished" in done.stdout
        assert "still running" not in done.stdout + done.stderr, done.stderr
    finally:
        cli("terminate", "--session", "noprogress", expect=None)


def test_wait_shows_progress_on_a_terminal_before_the_final_state(
    config_dir: Path, daemon: dict[str, Any], tmp_path: Path, write
) -> None:
    write("slow.py", SLOW)
    env = {**os.environ, "MLDBG_CONFIG_DIR": str(config_dir), "MLDBG_HOME": str(tmp_path / "s")}
    base = [sys.executable, "-m", "mldbg"]
    started = subprocess.run(
        [*base, "start", "--session", "tty", "--run", "slow.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    try:
        screen = _on_a_terminal([*base, "wait", "--session", "tty"], tmp_path, env)
        assert "still running (5 s)" in screen, screen
        assert screen.index("still running") < screen.index("exited"), screen
        assert "still running" not in screen[screen.index("exited") :]
    finally:
        subprocess.run([*base, "terminate", "--session", "tty"], env=env, capture_output=True)


def _on_a_terminal(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    """What ``argv`` shows on a real pseudo-terminal (stdout and stderr both on it)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=follower, stderr=follower)
    os.close(follower)
    shown = b""
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 90)
            if not ready:
                break
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the other end closed: the command exited
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
        process.wait(30)
    return shown.decode(errors="replace")


def test_terminate_says_when_the_session_had_already_ended(cli, write) -> None:
    """What was asked already holds (as ``wait`` on an ended session, ``serve --stop``
    without a daemon): not an error, exit 0, but said, in words and in ``already_ended``."""
    write("quick.py", "print('bye')\n")
    cli("start", "--session", "ended", "--run", "quick.py")
    cli("wait", "--session", "ended")
    answer = cli("terminate", "--session", "ended", json_out=True)
    assert answer["already_ended"] is True and answer["state"] == "exited"
    assert answer["terminated"] is False  # it ended by itself, and stays so recorded
    text = cli("terminate", "--session", "ended").stdout
    assert "had already ended" in text and "exit code 0" in text

    write("slow.py", SLOW)
    cli("start", "--session", "live", "--run", "slow.py")
    answer = cli("terminate", "--session", "live", json_out=True)
    assert answer["already_ended"] is False and answer["terminated"] is True


def _flag_help(verb: str, flag: str) -> str:
    from mldbg.cli.main import build_parser

    sub = next(
        a for a in build_parser(only=verb)._actions if isinstance(a, argparse._SubParsersAction)
    )
    for action in sub.choices[verb]._actions:
        if flag in action.option_strings:
            return str(action.help)
    raise AssertionError(f"{verb} has no {flag}")


def test_a_flag_that_flips_a_default_is_described_as_the_flag_acts() -> None:
    """``--run`` sets stop_on_entry false: its help said "pause before the first line"
    (the argument's meaning, the opposite of the flag's).  Every such flag of the table
    is described as the flag acts."""
    from mldbg.verbs import VERBS

    flipped = [
        (verb, arg)
        for verb in VERBS
        for arg in verb.args
        if verb.cli and arg.cli and arg.type is bool and arg.default is True
    ]
    assert flipped, "the table has no flag that flips a true default any more"
    for verb, arg in flipped:
        assert arg.cli_help, f"{verb.name} {arg.cli_flag}: say what the flag does (cli_help)"
        assert _flag_help(verb.name, arg.cli_flag) == arg.cli_help.replace("%", "%%")
    run = _flag_help("start", "--run")
    assert "without pausing" in run and "pause before" not in run


def test_start_options_say_what_they_do(cli, write, tmp_path: Path) -> None:
    """Each help text checked against what the option does."""
    write("where.py", "import os, sys\nprint(os.getcwd(), os.environ.get('K'), sys.executable)\n")
    (tmp_path / "sub").mkdir()
    assert "repeatable" in _flag_help("start", "--env")
    assert "repeatable" in _flag_help("start", "--require-editable")
    python = _flag_help("start", "--python")
    assert "virtualenv's, else mldbg's" in python
    ran = cli(
        "start",
        "-s",
        "opts",
        "--run",
        "--cwd",
        "sub",
        "--env",
        "K=v",
        "../where.py",
        json_out=True,
    )
    assert ran["state"] in ("running", "exited")  # --run: no pause before the first line
    done = cli("wait", "-s", "opts", json_out=True)
    assert done["output_tail"].split()[:2] == [str(tmp_path / "sub"), "v"]
