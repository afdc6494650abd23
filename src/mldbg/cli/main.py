"""``mldbg``: every verb is one REST call (or a short loop of them) plus rendering.

Human output by default; ``--json`` prints the daemon's JSON unchanged.  Errors exit 1
with ``{"error": ..., "code": ...}`` (2 for usage errors), saying what to do next.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from .. import store_queries
from ..errors import MldbgError
from ..runs import clean_runs, mldbg_home
from . import compare_cmd, render
from .client import Daemon, connect

EXIT_ERROR = 1
EXIT_USAGE = 2

_LOCATION = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?::(?P<cond>.*))?$")


class UsageError(MldbgError):
    code = "usage"


def parse_location(spec: str, line: str | None = None) -> tuple[str, int, str | None]:
    """``FILE:LINE[:COND]`` or ``FILE`` + ``LINE``; relative files resolve against this cwd."""
    if line is not None:
        if not line.isdigit():
            raise UsageError(f"line must be a number, not {line!r}")
        file, number, cond = spec, int(line), None
    else:
        match = _LOCATION.match(spec)
        if not match:
            raise UsageError(f"expected FILE:LINE (or FILE LINE), got {spec!r}")
        file, number, cond = match["file"], int(match["line"]), match["cond"] or None
    return os.path.abspath(os.path.expanduser(file)), number, cond


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


# -- verbs --------------------------------------------------------------------------------------


def cmd_start(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    if a.module:
        script, module, args = None, a.module, ([a.target] if a.target else []) + a.args
    else:
        if not a.target:
            raise UsageError("give a script to run: mldbg start SCRIPT [ARGS...] (or -m MODULE)")
        script, module, args = a.target, None, a.args
    breakpoints = []
    for spec in a.breaks:
        file, line, cond = parse_location(spec)
        breakpoints.append({"file": file, "line": line, "condition": cond})
    body = {
        "script": script,
        "module": module,
        "args": args,
        "python": a.python,
        "cwd": os.path.abspath(a.cwd) if a.cwd else os.getcwd(),
        "env": dict(os.environ),
        "env_overrides": parse_env(a.env),
        "breakpoints": breakpoints,
        "stop_on_entry": not a.run,
        "replace": a.replace,
        "wait": 30.0,
    }
    data = d.session(a.session, "start", json=body)
    return data, render.state


def cmd_break(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    if a.checkpoint:
        if a.location or a.hits or a.log:
            raise UsageError("--checkpoint NAME takes no FILE:LINE, --hits or --log (only --if)")
        body: dict[str, Any] = {"checkpoint": a.checkpoint, "condition": a.condition}
    else:
        if not a.location:
            raise UsageError("give FILE:LINE (or FILE LINE), or --checkpoint NAME")
        file, line, cond = parse_location(a.location, a.line)
        body = {
            "file": file,
            "line": line,
            "condition": a.condition or cond,
            "hits": a.hits,
            "log": a.log,
        }
    data = d.session(a.session, "breakpoints", json=body)
    return data, lambda bp: render.out.print("breakpoint " + render.breakpoint_line(bp))


def cmd_breaks(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    return d.session(a.session, "breakpoints", method="GET"), render.breakpoints


def cmd_remove(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    if a.checkpoint:
        body: dict[str, Any] = {"checkpoint": a.checkpoint}
    elif a.location:
        file, line, _ = parse_location(a.location, a.line)
        body = {"file": file, "line": line}
    else:
        raise UsageError("give FILE:LINE (or FILE LINE), or --checkpoint NAME")
    data = d.session(a.session, "breakpoints/remove", json=body)
    return data, lambda bp: render.out.print(f"removed {render.breakpoint_line(bp)}")


def cmd_clear(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    data = d.session(a.session, "breakpoints/clear")
    return data, lambda r: render.out.print(f"removed {r['removed']} breakpoint(s)")


def _still_running(elapsed: float) -> None:
    render.err.print(f"[dim]still running ({elapsed:.0f} s)…[/]")


def cmd_continue(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    if a.no_wait:
        return d.session(a.session, "continue", json={"wait": 0.0}), render.state
    return d.resume(a.session, "continue", {}, a.max_wait, _still_running), render.state


def cmd_step(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    body = {"kind": a.kind, "into_libraries": a.into_libraries}
    return d.resume(a.session, "step", body, a.max_wait, _still_running), render.state


def cmd_pause(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    def show(data: dict[str, Any]) -> None:
        render.state(data)
        if data.get("state") == "running":
            render.out.print(
                "pause requested: the script stops at its next line of Python "
                "(it is probably inside a long call into C, e.g. a big tensor op or a sleep); "
                "`mldbg continue` or `mldbg status` to see when it does"
            )

    return d.session(a.session, "pause", json={"wait": 5.0}), show


def cmd_status(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    return d.session(a.session, "", method="GET"), render.state


def cmd_location(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    return d.session(a.session, "location", method="GET"), render.state


def cmd_stack(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    return d.session(a.session, "stack", method="GET"), render.stack


def cmd_frame(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    return d.session(a.session, "frame", json={"index": a.index}), render.frame


def cmd_up(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    return d.session(a.session, "frame", json={"move": a.count}), render.frame


def cmd_down(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    return d.session(a.session, "frame", json={"move": -a.count}), render.frame


def cmd_vars(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    return d.session(a.session, "variables", method="GET", params={"all": a.all}), render.variables


def cmd_eval(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    expression = sys.stdin.read() if a.expression == "-" else a.expression
    return d.session(a.session, "eval", json={"expression": expression}), render.evaluation


def cmd_output(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    params = {"tail": a.tail} if a.tail is not None else None
    data = d.session(a.session, "output", method="GET", params=params)
    return data, render.output


def cmd_terminate(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    return d.session(a.session, "terminate"), render.state


def cmd_sessions(d: Daemon, a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    return d.call("GET", "/v1/sessions"), render.sessions


# -- verbs that read the run store directly (no daemon needed) ---------------------------------


def cmd_runs(a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    return store_queries.runs(), render.runs


def cmd_checkpoints(a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    return store_queries.checkpoints(a.run, a.name, a.hit), render.checkpoints


def cmd_tensors(a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    from .. import tensors

    if a.action == "list":
        items = tensors.list_tensors()
        data: dict[str, Any] = {
            "path": str(tensors.store_dir()),
            "tensors": items,
            "size_bytes": tensors.store_size(),
        }
        return data, render.tensors
    if a.action == "info":
        if not a.name:
            raise UsageError("mldbg tensors info NAME")
        return _tensor_call(lambda: tensors.tensor_info(a.name)), render.tensor_info
    if a.name_opt is None and not a.yes:
        count = len(tensors.list_tensors())
        raise UsageError(
            f"this deletes all {count} tensor(s) in {tensors.store_dir()}; add --yes to do it, or --name NAME for one"
        )
    removed = _tensor_call(lambda: tensors.clear_tensors(a.name_opt))
    return {"removed": removed}, lambda r: render.out.print(
        f"removed {len(r['removed'])} tensor(s)"
    )


def _tensor_call(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except (FileNotFoundError, ValueError) as exc:
        raise MldbgError(str(exc), code="tensor_error") from None


def cmd_clean(a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    result = clean_runs(mldbg_home(), a.keep, a.dry_run)
    return result, render.cleaned


# -- tools (issue 14): profile, prune, doctor, kill-all, tutorial ------------------------------
# Library functions with typed results live in their own modules; these blocks only map
# arguments and pick the renderer.  (To move to the verb table.)


def cmd_profile(a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    from ..profile.report import profile, render_profile

    data = profile(a.script, a.args, include=a.include or None, python=a.python)
    return data, lambda r: render_profile(r, render.out)


def cmd_prune(a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    from ..profile import prune

    # Options may also follow the action (`prune run --repo R SCRIPT`); the script's own
    # arguments start at the first word that is not one of these.
    again = argparse.ArgumentParser(prog=f"mldbg prune {a.action}", add_help=False)
    again.add_argument("--repo", default=a.repo)
    again.add_argument("--dry-run", action="store_true", default=a.dry_run)
    again.add_argument("--python", default=a.python)
    again.add_argument("--json", action="store_true")
    again.add_argument("rest", nargs=argparse.REMAINDER)
    try:
        a = argparse.Namespace(**{**vars(a), **vars(again.parse_args(a.rest))})
    except SystemExit:
        raise UsageError(f"bad options for mldbg prune {a.action}") from None
    if a.action == "setup":
        if len(a.rest) != 1:
            raise UsageError("mldbg prune setup REPO")
        data: Any = prune.setup(a.rest[0])
    elif a.action == "run":
        if not a.rest:
            raise UsageError("mldbg prune run [--repo REPO] [--dry-run] SCRIPT [ARGS...]")
        data = prune.run(a.rest[0], a.rest[1:], repo=a.repo, dry_run=a.dry_run, python=a.python)
    elif a.action == "restore":
        if not a.rest:
            raise UsageError("mldbg prune restore [--repo REPO] FILE...")
        data = prune.restore(a.rest, repo=a.repo)
    else:
        data = prune.status(a.repo or (a.rest[0] if a.rest else None))
    return data, lambda r: prune.render_prune(r, render.out)


def cmd_doctor(a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    from .. import doctor

    data = doctor.doctor(a.packages, python=a.python)
    return data, lambda r: doctor.render_doctor(r, render.out)


def cmd_kill_all(a: argparse.Namespace) -> tuple[Any, Callable[[Any], None]]:
    from .. import killall

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
        if exc.code == "confirmation_required":
            raise UsageError(exc.message, code=exc.code, **exc.extra) from None
        raise
    return data, lambda r: killall.render_kill_all(r, render.out)


# -- end of tools ------------------------------------------------------------------------------


LOCAL_VERBS: dict[str, Callable[[argparse.Namespace], tuple[Any, Callable[[Any], None]]]] = {
    "captures": compare_cmd.cmd_captures,
    "runs": cmd_runs,
    "checkpoints": cmd_checkpoints,
    "tensors": cmd_tensors,
    "clean": cmd_clean,
    # tools (issue 14)
    "profile": cmd_profile,
    "prune": cmd_prune,
    "doctor": cmd_doctor,
    "kill-all": cmd_kill_all,
}

VERBS: dict[str, Callable[[Daemon, argparse.Namespace], tuple[Any, Callable[[Any], None]]]] = {
    name[4:]: fn
    for name, fn in globals().items()
    if name.startswith("cmd_") and name[4:].replace("_", "-") not in LOCAL_VERBS
}


# -- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--session", "-s", default=argparse.SUPPRESS, help="session name (default: default)"
    )
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")

    parser = argparse.ArgumentParser(
        prog="mldbg",
        description="Debugger for PyTorch and MLX model code.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common], description=help)

    p = verb("start", "start a script under the debugger (stops before its first line)")
    p.add_argument("-m", dest="module", help="run a module, as python -m does")
    p.add_argument(
        "--python", help="interpreter to run it with (default: the active venv's python)"
    )
    p.add_argument("--cwd", help="working directory for the script (default: here)")
    p.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="set an environment variable"
    )
    p.add_argument(
        "--break",
        dest="breaks",
        action="append",
        default=[],
        metavar="FILE:LINE[:COND]",
        help="breakpoint set before anything runs",
    )
    p.add_argument("--run", action="store_true", help="don't stop at the first line")
    p.add_argument(
        "--replace", action="store_true", help="terminate a live session of the same name first"
    )
    p.add_argument("target", nargs="?", default=None, help="script path, then its arguments")

    p = verb("break", "set a breakpoint (FILE:LINE or FILE LINE), or a checkpoint filter")
    p.add_argument("location", nargs="?")
    p.add_argument("line", nargs="?")
    p.add_argument(
        "--checkpoint",
        metavar="NAME",
        help="pause only at debug_checkpoint calls named NAME (a glob)",
    )
    p.add_argument("--if", dest="condition", help="stop only when this expression is true")
    p.add_argument("--hits", help="N: stop on the Nth hit; >=N: from the Nth on; %%N: every Nth")
    p.add_argument(
        "--log", help='print this instead of stopping; {expr} is filled in, e.g. "x={x.shape}"'
    )

    verb("breaks", "list breakpoints")
    p = verb("remove", "remove a breakpoint or a checkpoint filter")
    p.add_argument("location", nargs="?")
    p.add_argument("line", nargs="?")
    p.add_argument("--checkpoint", metavar="NAME", help="remove this checkpoint filter")
    verb("clear", "remove all breakpoints")

    p = verb("continue", "resume and wait for the next stop or the end")
    p.add_argument("--max-wait", type=float, default=60.0, help="seconds to wait (default 60)")
    p.add_argument("--no-wait", action="store_true", help="return at once")

    p = verb("step", "step over, into or out")
    p.add_argument("kind", choices=["over", "into", "out"])
    p.add_argument("--into-libraries", action="store_true", help="also stop in library code")
    p.add_argument("--max-wait", type=float, default=60.0)

    verb("pause", "stop the running script at its next line of Python")
    verb("status", "the session's state")
    verb("location", "where the session is paused, with code")
    verb("stack", "the paused thread's frames (0 = innermost)")
    p = verb("frame", "select frame N for vars and eval")
    p.add_argument("index", type=int)
    p = verb("up", "select the caller's frame")
    p.add_argument("count", type=int, nargs="?", default=1)
    p = verb("down", "select the callee's frame")
    p.add_argument("count", type=int, nargs="?", default=1)
    p = verb("vars", "variables of the selected frame, tensors summarized")
    p.add_argument("--all", action="store_true", help="include globals")
    p = verb("eval", "evaluate code in the selected frame ('-' reads stdin)")
    p.add_argument("expression")
    p = verb("output", "the script's captured stdout and stderr")
    p.add_argument("--tail", type=int, help="only the last N lines")
    verb("terminate", "end the script")
    verb("sessions", "list sessions")
    verb("runs", "list the runs in the run store ($MLDBG_HOME or ./.mldbg)")
    p = verb("checkpoints", "list checkpoint records of a run")
    p.add_argument("--run", help="run id (or unique prefix), 'latest' (default) or a run directory")
    p.add_argument("--name", help="only checkpoints with this name (a glob)")
    p.add_argument("--hit", type=int, help="only the Nth hit of each name")
    p = verb(
        "tensors", "the debug_save tensor store: list | info NAME | clear [--name NAME] [--yes]"
    )
    p.add_argument("action", choices=["list", "info", "clear"])
    p.add_argument("name", nargs="?", help="tensor name (for info)")
    p.add_argument("--name", dest="name_opt", help="clear only this tensor")
    p.add_argument("--yes", action="store_true", help="really delete every stored tensor")
    p = verb("captures", "list module captures (mldbg.capture) in the run store")
    p.add_argument("--run", help="only this run's captures")
    p = verb(
        "compare",
        "compare two captures/runs/tensor directories; exit 0 agree, 1 diverge, 2 bad input",
    )
    compare_cmd.add_arguments(p)
    p = verb("clean", "remove old runs from the run store")
    p.add_argument("--keep", type=int, default=10, help="newest runs to keep (default 10)")
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    p = verb("serve", "run the daemon in the foreground (clients start it on demand)")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    p.add_argument("--stop", action="store_true", help="stop the running daemon and its sessions")
    verb("mcp", "serve the debugger as MCP tools on stdin/stdout (for coding agents)")
    p = verb("demo", "a scripted session on the bundled tiny PyTorch model")
    p.add_argument("--keep", action="store_true", help="leave the demo session open")
    # -- tools (issue 14): profile, prune, doctor, kill-all, tutorial -------------------------
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
    p = verb(
        "prune",
        "a <branch>-pruned branch of a library checkout holding only the files a script ran: "
        "setup REPO | run SCRIPT [ARGS...] | restore FILE... | status [REPO]",
    )
    p.add_argument("action", choices=["setup", "run", "restore", "status"])
    p.add_argument("--repo", help="the library's git checkout (default: the one here)")
    p.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    p.add_argument("--python", help="interpreter to run the script with")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="REPO, SCRIPT [ARGS...] or FILE...")
    p = verb(
        "doctor", "which copy of each ML library is imported, editable or not, and mldbg's state"
    )
    p.add_argument("packages", nargs="*", help="more packages to check")
    p.add_argument("--python", help="interpreter to check (default: the active venv's)")
    p = verb("kill-all", "end this user's stray Python processes that loaded torch or MLX")
    p.add_argument("--dry-run", action="store_true", help="only list them")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--torch-only", action="store_true", help="only processes with torch")
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
    # -- end of tools -------------------------------------------------------------------------
    return parser


def _emit_error(exc: MldbgError, as_json: bool) -> None:
    payload = exc.to_json()
    if as_json:
        print(json.dumps(payload, indent=2, default=str))
    else:
        render.error(payload)


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Options of ``start`` may come before or after the script; the script gets the rest.

    Everything after ``--`` goes to the script untouched, for scripts whose own options
    share a name with one of mldbg's.
    """
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extras = parser.parse_known_args(argv[:cut])
    if args.verb != "start" and (extras or cut < len(argv)):
        parser.error(f"unrecognized arguments: {' '.join(extras + argv[cut:])}")
    if args.verb == "start":
        args.args = extras + argv[cut + 1 :]
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, list(sys.argv[1:] if argv is None else argv))
    as_json = bool(getattr(args, "json", False))
    args.session = getattr(args, "session", "default")
    try:
        if args.verb == "serve":
            if args.stop:
                data = connect(autostart=False).call("POST", "/v1/shutdown")
                if not as_json:
                    render.out.print(f"stopped the mldbg daemon (pid {data['pid']})")
                else:
                    print(json.dumps(data))
                return 0
            from ..server.serve import serve

            serve(args.port)
            return 0
        if args.verb == "mcp":
            from ..server.mcp_server import run_stdio

            run_stdio()
            return 0
        if args.verb == "demo":
            from .demo import run_demo

            return run_demo(
                session=args.session if args.session != "default" else "demo",
                keep=args.keep,
                as_json=as_json,
            )
        if args.verb == "compare":
            return compare_cmd.run_compare(args, as_json)
        if args.verb == "tutorial":  # tools (issue 14): streams its steps, exit 1 on a failed one
            from ..tutorial import run_tutorial_cli

            return run_tutorial_cli(args, as_json)
        if args.verb in LOCAL_VERBS:
            data, show = LOCAL_VERBS[args.verb](args)
        else:
            data, show = VERBS[args.verb](connect(), args)
    except UsageError as exc:
        _emit_error(exc, as_json)
        return EXIT_USAGE
    except MldbgError as exc:
        _emit_error(exc, as_json)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    if as_json:
        print(json.dumps(data, indent=2, default=str))
    else:
        show(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
