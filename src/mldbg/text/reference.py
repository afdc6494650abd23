"""The reference of every verb, generated from the verb table (``docs/reference.md``).

Each verb is declared once in ``verbs.py``: its name, arguments (type, default, limits,
choices, how the CLI spells them), result TypedDict and error codes.  This writes that
declaration as one Markdown page, the same facts every surface derives from, so the
reference cannot say what the code does not do.  ``python -m mldbg.text.reference``
prints it; ``tests/test_reference.py`` fails when the committed page is stale.
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Iterator

from .. import results as R
from .. import verbs
from ..verbs import REQUIRED, Arg, Verb

HEADER = """\
# mldbg verb reference

Generated from the verb table (`src/mldbg/verbs.py`) by `python -m mldbg.text.reference`;
`tests/test_reference.py` fails when this page is stale. Every verb is the same on every
surface: the CLI (`mldbg VERB`, `--json` for the answer below), REST (the route, a JSON
body or, for GET, the query string; bearer token from `~/.mldbg/server.json`), MCP (a tool
named like the verb, its arguments as below) and the typed Python client
(`mldbg.client.api.Client.call`).

Every answer is bounded: a list cut to its limit says `truncated`, how many there are in
all, and `next`, the call that gets the rest. Errors are `{"error", "code", ...}`, with
`fix` (the calls that fix it) and a `hint` worded for the surface that asked. Every verb
may answer `bad_argument`, `too_long`, `bad_session_name` or `daemon_unreachable`; a
session verb also `unknown_session`.

"""


def reference() -> str:
    """The whole page."""
    parts = [HEADER, _contents()]
    parts += [_verb(verb) for verb in verbs.VERBS]
    return "\n".join(parts).rstrip("\n") + "\n"


def _contents() -> str:
    lines = ["| verb | what it does |", "|---|---|"]
    lines += [f"| [`{v.name}`](#{_anchor(v.name)}) | {_cell(v.help)} |" for v in verbs.VERBS]
    return "\n".join(lines) + "\n"


def _anchor(name: str) -> str:
    return "verb-" + name.replace("_", "-")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _verb(verb: Verb) -> str:
    lines = [f'<a id="{_anchor(verb.name)}"></a>', f"## {verb.name}", "", verb.help + "."]
    if verb.description:
        lines += ["", verb.description]
    lines += ["", *_surfaces(verb), ""]
    args = [a for a in verb.args if a.cli or a.mcp]
    if args:
        lines += ["| argument | type | default | CLI | what it is |", "|---|---|---|---|---|"]
        lines += [_argument(verb, arg) for arg in args]
        lines.append("")
    lines += [f"**Answer** (`{verb.result.__name__}`):", "", *_fields(verb.result), ""]
    lines.append("**Errors:** " + ", ".join(f"`{code}`" for code in verb.all_errors))
    return "\n".join(lines) + "\n"


def _surfaces(verb: Verb) -> Iterator[str]:
    path = verb.path.replace("{name}", "{session}")
    yield f"* REST: `{verb.method} {path}`"
    if verb.mcp:
        yield f"* MCP: tool `{verb.name}`"
    if verb.cli:
        yield f"* CLI: `mldbg {verb.name}`" + (
            f" (also {', '.join(f'`{a}`' for a in verb.cli_aliases)})" if verb.cli_aliases else ""
        )
    elif verb.name == "compare":
        yield "* CLI: `mldbg compare` (streamed in the CLI's own process, with a progress bar)"
    if verb.waits:
        yield "* waits for the script to stop (a long wait is a loop of short ones, with progress)"


def _argument(verb: Verb, arg: Arg) -> str:
    default = "required" if arg.default is REQUIRED else _value(arg.default)
    limits = []
    if arg.choices:
        limits.append("one of " + ", ".join(f"`{c}`" for c in arg.choices))
    if arg.minimum is not None:
        limits.append(f"≥ {_number(arg.minimum)}")
    if arg.maximum is not None:
        limits.append(f"≤ {_number(arg.maximum)}")
    if arg.type is str and arg.max_length != verbs.TEXT_LIMIT:
        limits.append(f"at most {arg.max_length:,} characters")
    what = arg.help + (f" ({'; '.join(limits)})" if limits else "")
    if not arg.mcp:
        what += " (not in MCP)"
    return (
        f"| `{arg.name}` | {_cell(_type(arg.type))} | {default} | {_cli(verb, arg)} "
        f"| {_cell(what)} |"
    )


def _cli(verb: Verb, arg: Arg) -> str:
    if not arg.cli:
        return "—"
    if arg.positional:
        return f"`{arg.name.upper()}`"
    spelled = [arg.cli_flag, *([arg.short] if arg.short else []), *arg.aliases]
    text = ", ".join(f"`{s}`" for s in spelled)
    return f"{text}: {_cell(arg.cli_help)}" if arg.cli_help else text


def _value(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value}`"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _type(annotation: object) -> str:
    """A type as JSON says it: string, integer, number, boolean, list of …, object of …."""
    origin = typing.get_origin(annotation)
    if annotation is str:
        return "string"
    if annotation is bool:
        return "boolean"
    if annotation is int:
        return "integer"
    if annotation is float:
        return "number"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in typing.get_args(annotation) if a is not type(None))
    if origin is list:
        (item,) = typing.get_args(annotation)
        return f"list of {_type(item)}"
    if origin is dict:
        _, value = typing.get_args(annotation)
        return f"object of {_type(value)}"
    return getattr(annotation, "__name__", str(annotation))


def _fields(result: type) -> Iterator[str]:
    """A result TypedDict's fields, one a line, with their types as JSON says them."""
    hints = typing.get_type_hints(result, vars(R), include_extras=False)
    if not hints:
        yield "an object"
        return
    for name, annotation in hints.items():
        yield f"* `{name}`: {_type(annotation)}"


def main() -> int:
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
