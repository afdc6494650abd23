"""Commands of the porting toolbox (issue 14): profile, prune, doctor, kill-all, tutorial.

They run in this process (they start, inspect or signal processes of their own), not in
the daemon, so they are commands of the CLI beside ``serve``/``mcp``/``demo`` rather than
verbs of the table.  The work lives in library functions with typed results
(``profile/``, ``doctor.py``, ``killall.py``, ``tutorial.py``); this maps arguments onto
them and picks the renderer.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import BAD_ARGUMENT, CONFIRMATION_REQUIRED, MldbgError, TutorialError, UsageError
from ..text import render

NAMES = ("profile", "prune", "doctor", "kill-all", "tutorial")


@dataclass(frozen=True)
class Report:
    """What a toolbox command found: its typed result as JSON (``--json``), and how a
    person sees it (the result's own renderer)."""

    data: object
    show: Callable[[], None]


def cmd_profile(a: argparse.Namespace) -> Report:
    from ..tools.profile.report import profile, render_profile

    data = profile(a.script, a.args, include=a.include or None, python=a.python)
    return Report(data, lambda: render_profile(data, render.out))


def cmd_prune(a: argparse.Namespace) -> Report:
    from ..tools.profile import prune

    if a.action == "setup":
        data: prune.PruneResult = prune.setup(a.repo_dir)
    elif a.action == "run":
        data = prune.run(a.script, a.args, repo=a.repo, dry_run=a.dry_run, python=a.python)
    elif a.action == "restore":
        data = prune.restore(a.files, repo=a.repo)
    else:
        data = prune.status(a.repo or a.repo_dir)
    return Report(data, lambda: prune.render_prune(data, render.out))


def cmd_doctor(a: argparse.Namespace) -> Report:
    from ..tools import doctor

    data = doctor.doctor(a.packages, python=a.python)
    return Report(data, lambda: doctor.render_doctor(data, render.out))


def cmd_kill_all(a: argparse.Namespace) -> Report:
    from ..tools import killall

    framework = "torch" if a.torch_only else "mlx" if a.mlx_only else None

    def ask(found: list[killall.MlProcess]) -> bool:
        killall.render_processes(found, render.err)
        signal_name = "SIGTERM (then SIGKILL)" if a.force else "SIGTERM"
        render.err.print(f"send {signal_name} to these {len(found)} process(es)? [y/N] ", end="")
        return input().strip().lower() in ("y", "yes")

    interactive = sys.stdin.isatty() and not getattr(a, "json", False)
    try:
        data = killall.kill_all(
            dry_run=a.dry_run,
            framework=framework,
            force=a.force,
            yes=a.yes,
            match=a.match,
            grace_s=a.grace,
            confirm=ask if interactive else None,
        )
    except MldbgError as exc:
        if exc.code == CONFIRMATION_REQUIRED:
            raise UsageError(exc.message, code=exc.code, **exc.extra) from None
        raise
    return Report(data, lambda: killall.render_kill_all(data, render.out))


COMMANDS: dict[str, Callable[[argparse.Namespace], Report]] = {
    "profile": cmd_profile,
    "prune": cmd_prune,
    "doctor": cmd_doctor,
    "kill-all": cmd_kill_all,
}


def add_parsers(
    verb: Callable[[str, str], argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """The toolbox's commands; ``common`` holds the options every command takes (--json)."""
    p = verb("profile", "run a script (not under the debugger) and report which library code ran")
    p.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PKG_OR_DIR",
        help="only these packages or directories (repeatable; default: all but the stdlib)",
    )
    p.add_argument("--python", help="interpreter to run it with (default: the active venv's)")
    p.add_argument("script", help="the script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    _add_prune(
        verb(
            "prune",
            "a <branch>-pruned branch of a library checkout holding only the files a script "
            "ran: setup REPO | run SCRIPT [ARGS...] | restore FILE... | status [REPO]",
        ),
        common,
    )
    p = verb(
        "doctor", "which copy of each ML library is imported, editable or not, and mldbg's state"
    )
    p.add_argument("packages", nargs="*", help="more packages to check")
    p.add_argument("--python", help="interpreter to check (default: the active venv's)")
    p = verb("kill-all", "end this user's stray Python processes that loaded torch or MLX")
    p.add_argument("--dry-run", action="store_true", help="only list them")
    only = p.add_mutually_exclusive_group()
    only.add_argument(
        "--torch-only",
        "--pytorch-only",
        dest="torch_only",
        action="store_true",
        help="only processes with torch",
    )
    only.add_argument("--mlx-only", action="store_true", help="only processes with MLX")
    p.add_argument("--force", action="store_true", help="SIGKILL what SIGTERM did not end")
    p.add_argument("--yes", action="store_true", help="don't ask")
    p.add_argument("--match", help="only processes whose command line contains this text")
    p.add_argument(
        "--grace", type=float, default=5.0, help="seconds to wait after SIGTERM (default 5)"
    )
    p = verb("tutorial", "an interactive walk through mldbg on a bundled tiny model")
    p.add_argument("track", nargs="?", choices=["torch", "mlx"], default="torch")
    p.add_argument("--non-interactive", action="store_true", help="run every step without waiting")
    p.add_argument("--dir", help="where to put the tutorial's files (default: a new temp dir)")


def _prune_options(p: argparse.ArgumentParser, names: tuple[str, ...], default: object) -> None:
    """prune's options, on ``prune`` itself (before the action) and on each action that
    takes them."""
    if "repo" in names:
        p.add_argument(
            "--repo",
            default=default,
            help="the library's git checkout (default: the one here)",
        )
    if "dry_run" in names:
        p.add_argument(
            "--dry-run",
            action="store_true",
            default=False if default is None else default,
            help="only list what would be removed",
        )
    if "python" in names:
        p.add_argument("--python", default=default, help="interpreter to run the script with")


def _add_prune(p: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """``prune ACTION``: each action a sub-command with its own options and ``--help``.

    The options may come before the action too (``prune --repo R run S``): there they set
    the defaults, and an action's own copy (default suppressed) only overrides them when
    typed after it.
    """
    _prune_options(p, ("repo", "dry_run", "python"), None)
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    actions.required = True

    def action(name: str, help: str, *options: str) -> argparse.ArgumentParser:
        q = actions.add_parser(
            name, help=help, description=help, parents=[common], allow_abbrev=False
        )
        _prune_options(q, options, argparse.SUPPRESS)
        return q

    q = action("setup", "make <branch>-pruned at the checkout's current commit")
    q.add_argument("repo_dir", metavar="REPO", help="the library's git checkout")
    q = action(
        "run",
        "profile the script, then commit on the pruned branch the removal of what never ran",
        "repo",
        "dry_run",
        "python",
    )
    q.add_argument("script", help="the script to run")
    q.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    q = action(
        "restore",
        "bring files back onto the pruned branch; later runs keep them",
        "repo",
    )
    q.add_argument("files", nargs="+", metavar="FILE", help="relative to the checkout, or absolute")
    q = action(
        "status",
        "the branches, what the pruned branch lacks, uncommitted work",
        "repo",
    )
    q.add_argument("repo_dir", nargs="?", metavar="REPO", help="the checkout (or --repo)")


def run_tutorial_cli(args: argparse.Namespace, as_json: bool) -> int:
    """``mldbg tutorial``: prints as it goes, exit 1 when a step fails."""
    from ..text import render
    from ..tools.tutorial import tutorial

    interactive = not args.non_interactive and sys.stdin.isatty() and not as_json
    try:
        result = tutorial(
            args.track,
            interactive=interactive,
            workdir=args.dir,
            say=None if as_json else (lambda text: render.out.print(text, markup=False)),
        )
    except TutorialError as exc:
        payload = {"error": str(exc), "code": BAD_ARGUMENT}
        if as_json:
            print(json.dumps(payload))
        else:
            render.error(payload)
        return 2
    if as_json:
        print(json.dumps(result, indent=2))
    elif not result["ok"]:
        render.err.print(f"[red]the tutorial stopped at step {result['failed']}[/]")
    return 0 if result["ok"] else 1


def run(args: argparse.Namespace, as_json: bool) -> int:
    """Run one toolbox command; errors propagate to the CLI's handler."""
    if args.verb == "tutorial":  # streams its steps, exit 1 on a failed one
        return run_tutorial_cli(args, as_json)
    report = COMMANDS[args.verb](args)
    if as_json:
        print(json.dumps(report.data, indent=2, default=str))
    else:
        report.show()
    return 0
