"""Every command line a script or a person may type answers ``--help`` and ``--version``.

The parser is walked, not listed: a command, a tool's sub-command or a positional's
choice added later is checked without a change here.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

import pytest

import mldbg
from mldbg.cli.main import build_parser, main


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _choices(parser: argparse.ArgumentParser) -> list[str]:
    """The words a positional of this parser takes (`tensors clear`, `step into`)."""
    words: list[str] = []
    for action in parser._actions:
        positional = not action.option_strings and action.dest != "verb"
        if positional and action.choices and not isinstance(action, argparse._SubParsersAction):
            words += [str(choice) for choice in action.choices]
    return words


def command_lines(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every command (and sub-command, and positional choice) the parser knows."""
    for name, sub in _subparsers(parser).items():
        line = (*prefix, name)
        yield line
        for word in _choices(sub):
            yield (*line, word)
        yield from command_lines(sub, line)


COMMAND_LINES = sorted(set(command_lines(build_parser())))


def test_the_walk_finds_the_tools_sub_commands() -> None:
    assert ("prune", "run") in COMMAND_LINES and ("prune", "restore") in COMMAND_LINES
    assert ("tensors", "clear") in COMMAND_LINES and ("step", "into") in COMMAND_LINES
    assert len(COMMAND_LINES) > 50


@pytest.mark.parametrize("line", COMMAND_LINES, ids=" ".join)
def test_every_command_answers_help(line: tuple[str, ...], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        main([*line, "--help"])
    printed = capsys.readouterr()
    assert done.value.code == 0, printed.out + printed.err
    # the help of that command (a choice's is its command's), never an error
    usage = " ".join(w for w in line if w in _subparser_names(line))
    assert printed.out.startswith(f"usage: mldbg {usage}"), printed.out[:300] + printed.err
    assert "error" not in printed.err


def _subparser_names(line: tuple[str, ...]) -> set[str]:
    names: set[str] = set()
    parser = build_parser()
    for word in line:
        subs = _subparsers(parser)
        if word not in subs:
            break
        names.add(word)
        parser = subs[word]
    return names


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mldbg", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"mldbg {mldbg.__version__}"
