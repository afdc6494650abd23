"""``mldbg``: the command line, its parser derived from the verb table.

Each verb of ``verbs.py`` becomes a sub-command whose options are the verb's arguments
(flags spelled by the table); running it is one call of the typed client plus a human
renderer (``render.py``), or the daemon's JSON unchanged with ``--json``.  Errors exit 1
with ``{"error", "code", ...}`` and a ``hint`` worded as a command to type (2 for usage
errors, in JSON too when ``--json`` was asked).  A few commands are not verbs: they run a
process (``serve``, ``mcp``), a script (``demo``) or stream a comparison in this process
(``compare``).

Imports are kept to what a verb needs: sending a request costs the standard library,
the verb table and ``rich`` for human output; nothing here imports FastAPI or numpy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from .. import __version__, verbs
from ..errors import NO_DAEMON, MldbgError, UsageError
from ..verbs import VERBS, Arg, Verb

EXIT_ERROR = 1
EXIT_USAGE = 2
# a judging verb (``Verb.verdict``), as ``mldbg compare``: 1 when its verdict is false,
# 2 when what it was given cannot be judged (one of the verb's own error codes)
EXIT_PROBLEMS = 1
EXIT_BAD_INPUT = 2
# errors in what was typed, not in what happened: exit 2 like argparse's own
USAGE_CODES = frozenset(
    {"usage", "bad_argument", "bad_session_name", "confirm", "confirmation_required"}
)
TOOL_COMMANDS = ("profile", "prune", "doctor", "kill-all", "tutorial")

_LOCATION = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?::(?P<cond>.*))?$")


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing, so ``--json`` can answer in JSON."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", usage=self.format_usage().strip())


def parse_location(spec: str, line: str | None = None) -> tuple[str, int | None, str | None]:
    """``FILE:LINE[:COND]`` or ``FILE`` + ``LINE``; relative files are resolved here, where
    they exist, else left for the debuggee to resolve against the session's cwd."""
    from ..client.api import source_path

    if line is not None:
        if not line.isdigit():
            raise UsageError(f"line must be a number, not {line!r}")
        file, number, cond = spec, _line_number(line), None
    else:
        match = _LOCATION.match(spec)
        if not match:
            raise UsageError(
                f"expected FILE:LINE (or FILE LINE), got {spec!r}", argument="location"
            )
        file, number, cond = match["file"], _line_number(match["line"]), match["cond"] or None
    return source_path(file), number, cond


def _line_number(digits: str) -> int:
    """A line number typed on the command line: at most 9 digits (no source file is longer;
    Python refuses to convert a 5,000-digit number at all)."""
    if len(digits) > 9:
        raise UsageError(
            f"line must be a line number, not a {len(digits)}-digit one", argument="line"
        )
    return int(digits)


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {pair!r}", argument="env")
        env[key] = value
    return env


# -- the parser, from the table ---------------------------------------------------------------

COMMON_HELP = {"session": "session name (default: default)", "json": "print JSON"}


def _literal(text: str) -> str:
    """Help text as argparse prints it: its own %-formatting must not see a literal ``%N``."""
    return text.replace("%", "%%")


def _add_arg(parser: argparse.ArgumentParser, arg: Arg) -> None:
    if not arg.cli or arg.name == "session":
        return
    kwargs: dict[str, Any] = {"help": _literal(arg.cli_help or arg.help)}
    if arg.positional:
        kwargs["nargs"] = None if arg.required else "?"
        kwargs["default"] = None if arg.required else arg.default
        if arg.choices:
            kwargs["choices"] = arg.choices
        if arg.type in (int, float):
            kwargs["type"] = arg.type
        parser.add_argument(arg.name, **kwargs)
        return
    names = [arg.cli_flag, *arg.aliases] + ([arg.short] if arg.short else [])
    if arg.nargs:  # `--raised` alone, or `--raised ValueError KeyError`
        kwargs.update(nargs=arg.nargs, default=None, metavar="TYPE")
    elif arg.type is bool:
        flipped = not bool(arg.default)
        kwargs["action"] = "store_const"
        kwargs["const"] = flipped
        kwargs["default"] = arg.default
    elif arg.type in (list[str],) or "list[" in str(arg.type) or "dict[" in str(arg.type):
        kwargs["action"] = "append"
        kwargs["default"] = []
        kwargs["metavar"] = {"env": "K=V", "breakpoints": "FILE:LINE[:COND]"}.get(arg.name)
    else:
        if arg.type in (int, float):
            kwargs["type"] = arg.type
        if arg.choices:
            kwargs["choices"] = arg.choices
        kwargs["default"] = None if arg.required else arg.default
    parser.add_argument(*names, dest=arg.name, **kwargs)


COMMANDS = ("compare", "serve", "mcp", "demo", "docs")


def build_parser(full: bool = True, only: str | None = None) -> Parser:
    """The whole parser; ``full=False`` leaves out ``compare``'s options (they import numpy).

    ``only``: just that command's sub-parser (what one invocation needs; building all of
    them, the tool commands' renderers included, is most of a command's start-up).  Its
    options, usage and errors are the ones the whole parser gives it.
    """
    common = Parser(add_help=False)
    common.add_argument("--session", "-s", default=argparse.SUPPRESS, help=COMMON_HELP["session"])
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help=COMMON_HELP["json"]
    )
    parser = Parser(
        prog="mldbg",
        description="Debugger for PyTorch and MLX model code.",
        parents=[common],
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"mldbg {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=Parser)
    sub.required = True

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=_literal(help),
            parents=[common],
            description=_literal(help),
            allow_abbrev=False,
        )

    for verb in VERBS:
        if not verb.cli or only not in (None, verb.name):
            continue
        p = command(verb.name, verb.help)
        if verb.name in ("break", "remove"):
            p.add_argument("location", nargs="?", help="FILE:LINE[:COND], or FILE then LINE")
            p.add_argument("line_number", nargs="?", metavar="LINE", help=argparse.SUPPRESS)
            for arg in verb.args:
                if arg.name not in ("file", "line"):
                    _add_arg(p, arg)
            continue
        if verb.name == "start":
            for arg in verb.args:
                if arg.name != "script":
                    _add_arg(p, arg)
            p.add_argument("script", nargs="?", help="the script, then its own arguments")
            continue
        for arg in verb.args:
            _add_arg(p, arg)
        if verb.name == "tensors":  # `tensors clear --name NAME` reads better than a positional
            p.add_argument("--name", dest="name_flag", help=argparse.SUPPRESS)

    if only in (None, "compare"):
        p = command("compare", verbs.get("compare").help)
        if full:
            from . import compare_cmd

            compare_cmd.add_arguments(p, _add_arg)
    if only in (None, "serve"):
        p = command("serve", "run the daemon in the foreground (clients start it on demand)")
        p.add_argument(
            "--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)"
        )
        p.add_argument(
            "--stop", action="store_true", help="stop the running daemon and its sessions"
        )
    if only in (None, "mcp"):
        command("mcp", "serve the debugger as MCP tools on stdin/stdout (for coding agents)")
    if only in (None, "demo"):
        p = command("demo", "a scripted session on the bundled tiny PyTorch model")
        p.add_argument("--keep", action="store_true", help="leave the demo session open")
    if only in (None, "docs"):
        command(
            "docs",
            "a one-time link that opens the REST API's docs (OpenAPI) in a browser",
        )
    if only is None or only in TOOL_COMMANDS:
        from . import tools_cmd

        tools_cmd.add_parsers(command, common)
    return parser


def command_of(argv: list[str]) -> str | None:
    """The command an argument list names, if it names a known one before any help flag.

    None (build the whole parser) for help, a typo, or no command: those answers list
    every command.
    """
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in ("-h", "--help"):
            return None
        if token in ("--session", "-s"):
            i += 2
            continue
        if token.startswith("-"):
            i += 1
            continue
        known = token in COMMANDS or token in TOOL_COMMANDS
        if not known:
            verb = verbs.BY_NAME.get(token)
            known = verb is not None and verb.cli and verb.name == token
        return token if known else None
    return None


def split_start(argv: list[str]) -> tuple[list[str], list[str]]:
    """``start``'s own options, and the script with its arguments, exactly as typed.

    mldbg's options come before the script (or before ``-m MODULE``); everything after
    belongs to the script, as ``python SCRIPT ARGS`` / ``python -m MODULE ARGS`` would
    give it, even an option that shares a name with one of mldbg's.  With a ``--`` after
    the script, what stands between the script and ``--`` is mldbg's, the rest the script's.
    """
    takes_value = {"--session", "-s"} | {
        flag
        for arg in verbs.get("start").args
        if arg.cli and arg.type is not bool
        for flag in (arg.cli_flag, arg.short)
        if flag
    }
    i = 1  # argv[0] is "start"
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return argv[:i], argv[i + 1 :]
        if token == "-m" or not token.startswith("-") or token == "-":
            end = i + 2 if token == "-m" else i + 1
            rest = argv[end:]
            if "--" in rest:  # the older form: mldbg's options, then -- and the script's
                cut = rest.index("--")
                return argv[:end] + rest[:cut], rest[cut + 1 :]
            return argv[:end], rest
        name = token.split("=", 1)[0]
        i += 2 if name in takes_value and "=" not in token else 1
    return argv, []


# -- running a verb ----------------------------------------------------------------------------


def verb_arguments(verb: Verb, a: argparse.Namespace) -> dict[str, Any]:
    """The client call's arguments from the parsed command line."""
    values: dict[str, Any] = {}
    for arg in verb.args:
        if not arg.cli or arg.name == "session":
            continue
        if hasattr(a, arg.name):
            values[arg.name] = getattr(a, arg.name)
    if verb.name in ("break", "remove"):
        if verb.name == "remove" and a.location and re.fullmatch(r"#?\d+", a.location):
            values["id"] = int(a.location.lstrip("#"))  # `remove 3`: a breakpoint's id
        elif a.location:
            file, line, cond = parse_location(a.location, a.line_number)
            values.update(file=file, line=line)
            if cond and verb.name == "break" and not values.get("condition"):
                values["condition"] = cond
        elif not (
            values.get("checkpoint")
            or values.get("function")
            or values.get("id")
            or values.get("raised") is not None
            or values.get("uncaught") is not None
            or values.get("nonfinite")
            or values.get("max_abs") is not None
            or values.get("subnormal")
        ):
            raise UsageError(
                "give FILE:LINE (or FILE LINE), --function NAME, --raised [TYPE...], "
                "--nonfinite, "
                "--uncaught or --checkpoint NAME"
            )
    if verb.name == "weights" and values.get("shards") is not None:
        from .compare_cmd import parse_shards  # `--shards GLOB=DIM`, as compare takes them

        values["shards"] = parse_shards(values["shards"])
    if verb.name == "until" and values.get("target") and _LOCATION.match(values["target"]):
        file, line, _ = parse_location(values.pop("target"))
        values.update(file=file, line=line)
    if verb.name == "start":
        if a.module:
            if a.script:
                a.args.insert(0, a.script)
            values["script"] = None
        elif not a.script:
            raise UsageError("give a script to run: mldbg start SCRIPT [ARGS...] (or -m MODULE)")
        else:
            values["script"] = a.script
        values["args"] = list(a.args)
        values["env"] = parse_env(values.get("env") or [])
        breakpoints = []
        for spec in values.get("breakpoints") or []:
            file, line, cond = parse_location(spec)
            breakpoints.append({"file": file, "line": line, "condition": cond})
        values["breakpoints"] = breakpoints
        if values.get("cwd"):
            values["cwd"] = os.path.abspath(values["cwd"])
    if verb.name == "tensors" and getattr(a, "name_flag", None):
        values["name"] = a.name_flag
    if verb.name == "eval" and values.get("expression") == "-":
        values["expression"] = sys.stdin.read()
    return {k: v for k, v in values.items() if v is not None}


def _interrupt_eval(session: str) -> None:
    """Ctrl-C on ``mldbg eval``: interrupt the evaluation inside the script (a pause does)."""
    from ..client.api import connect

    try:
        state = connect(autostart=False).call("pause", session, wait=0)
    except Exception:  # the daemon may be gone: nothing more to do
        return
    if state.get("interrupted"):
        print("interrupted the evaluation; the session is still paused", file=sys.stderr)


def _still_running(elapsed: float) -> None:
    from ..text import render

    render.err.print(f"[dim]still running ({elapsed:.0f} s)…[/]")


def _progress(as_json: bool) -> Callable[[float], None] | None:
    """``still running`` lines only where a person watches a terminal.  A reader of pipes
    (an agent, a log) gets stdout and stderr apart, often one after the other: progress on
    stderr then reads as coming after the final state, which is printed last."""
    if as_json or not sys.stderr.isatty():
        return None
    return _still_running


def run_verb(verb: Verb, a: argparse.Namespace, as_json: bool = False) -> Any:
    from ..client.api import connect

    values = verb_arguments(verb, a)
    client = connect()
    if verb.scope == "session":
        session = getattr(a, "session", "default")
        if verb.waits:
            wait = values.pop("wait", 60.0)
            if values.pop("no_wait", False):
                wait = 0.0
            return client.resume(verb.name, session, wait, _progress(as_json), **values)
        return client.call(verb.name, session, **values)
    if verb.store and getattr(a, "session", None):
        values["session"] = a.session
    if verb.waits:  # a long run-store verb (line): the job it starts is followed here
        wait = values.pop("wait", verb.arg("wait").default)
        return client.follow(verb.name, wait, _still_running, **values)
    return client.call(verb.name, None, **values)


def hint(fixes: object) -> str | None:
    """The commands that fix an error (its ``fix``, a list of ``results.Call``), as one
    would type them."""
    if not fixes or not isinstance(fixes, list):
        return None
    return "; or ".join(verbs.word(f, "cli") for f in fixes[:3])


def emit_error(exc: MldbgError, as_json: bool) -> None:
    payload = exc.to_json()
    text = hint(payload.get("fix"))
    if text:
        payload["hint"] = text
    if as_json:
        print(json.dumps(payload, indent=2, default=str))
    else:
        from ..text import render

        render.error(payload)


def run_command(args: argparse.Namespace, as_json: bool) -> int:
    """The commands that are not verbs of the table."""
    from ..text import render

    if args.verb == "serve":
        if args.stop:
            from ..client.api import stop_daemon

            try:
                data = stop_daemon()
            except MldbgError as exc:
                if exc.code != NO_DAEMON:
                    raise
                # what was asked already holds: nothing to stop is not an error
                if as_json:
                    print(json.dumps({"stopped": False, "running": False}))
                else:
                    render.out.print("no mldbg daemon is running; nothing to stop")
                return 0
            if as_json:
                print(json.dumps(data))
            elif data["forced"]:
                render.out.print(
                    f"stopped the mldbg daemon (pid {data['pid']}) with {data['forced']}: it "
                    "did not end itself in time; its sessions end themselves"
                )
            else:
                render.out.print(f"stopped the mldbg daemon (pid {data['pid']})")
            return 0
        from ..server.serve import serve

        serve(args.port)
        return 0
    if args.verb == "mcp":
        from ..mcp.server import run_stdio

        run_stdio()
        return 0
    if args.verb == "docs":
        from ..client.api import connect

        link = connect().request("POST", "/v1/docs-link", body={})
        if as_json:
            print(json.dumps(link))
        else:  # the link is the answer: printed alone on its line, to copy or click
            render.err.print(
                f"open within {link['expires_in_s']:.0f} s, once (it leaves a "
                f"{link['cookie_s'] / 60:.0f}-minute cookie for the docs pages only):"
            )
            print(link["url"])
        return 0
    if args.verb == "demo":
        from .demo import run_demo

        session = getattr(args, "session", "demo")
        return run_demo(session=session, keep=args.keep, as_json=as_json)
    from . import compare_cmd

    return compare_cmd.run_compare(args, as_json)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    try:
        return _main(argv, as_json)
    except BrokenPipeError:  # `mldbg output | head`: the reader left, which is fine
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def parse_command_line(argv: list[str]) -> argparse.Namespace:
    """What was typed, parsed (``UsageError`` if it cannot be): no daemon is asked."""
    parser = build_parser(
        full="compare" in argv or "-h" in argv or "--help" in argv, only=command_of(argv)
    )
    script_args: list[str] = []
    if argv and argv[0] == "start":
        argv, script_args = split_start(argv)
    elif argv and "start" in argv[:4] and argv.index("start") > 0:
        at = argv.index("start")
        head, script_args = split_start(argv[at:])
        argv = argv[:at] + head
    args = parser.parse_args(argv)
    if args.verb == "start":
        args.args = script_args
    return args


def _main(argv: list[str], as_json: bool) -> int:
    try:
        args = parse_command_line(argv)
        as_json = bool(getattr(args, "json", False)) or as_json
        if args.verb in COMMANDS:
            return run_command(args, as_json)
        if args.verb in TOOL_COMMANDS:
            from . import tools_cmd

            return tools_cmd.run(args, as_json)
        verb = verbs.get(args.verb)
        data = run_verb(verb, args, as_json)
    except UsageError as exc:
        emit_error(exc, as_json)
        return EXIT_USAGE
    except MldbgError as exc:
        emit_error(exc, as_json)
        return error_exit(exc, getattr(locals().get("args"), "verb", None))
    except KeyboardInterrupt:
        if getattr(locals().get("args"), "verb", None) == "eval":
            _interrupt_eval(getattr(locals()["args"], "session", "default"))
        return 130
    if as_json:
        print(json.dumps(data, indent=2, default=str))
    else:
        from ..text import render

        render.show(verb.name, data)
    return verdict_exit(verb, data)


def error_exit(exc: MldbgError, verb_name: str | None) -> int:
    """A judging verb's own errors are bad input (2, as compare's); else usage 2, others 1."""
    verb = verbs.BY_NAME.get(verb_name or "")
    if verb is not None and verb.verdict and exc.code in verb.errors:
        return EXIT_BAD_INPUT
    return EXIT_USAGE if exc.code in USAGE_CODES else EXIT_ERROR


def verdict_exit(verb: Verb, data: object) -> int:
    """0, or 1 when a judging verb's answer says something is wrong (``Verb.verdict``)."""
    if verb.verdict and isinstance(data, dict) and data.get(verb.verdict) is False:
        return EXIT_PROBLEMS
    return 0


if __name__ == "__main__":
    sys.exit(main())
