"""A call to make next (``results.Call``) as each surface words it: a command line for
the CLI (``mldbg line ref port``), a tool call for MCP (``line(a='ref', b='port')``).

An answer holds the call itself (``next``, ``fix``, compare's ``line``); the words are
the surface's, chosen when the answer is printed: the CLI prints as the CLI, the MCP
server renders its text content as MCP (``console.captured(surface="mcp")``).
"""

from __future__ import annotations

from .. import results as R
from .. import verbs
from .console import surface


def cli_command(call: R.Call) -> str:
    """``mldbg VERB ARGS`` as one would type it."""
    verb = verbs.BY_NAME.get(str(call.get("verb")))
    args = dict(call.get("args") or {})
    words = ["mldbg", str(call.get("verb"))]
    session = args.pop("session", None)
    if verb is None:
        return " ".join(words)
    for name, value in args.items():
        try:
            arg = verb.arg(name)
        except KeyError:
            continue
        if arg.positional:
            words.append(str(value))
        elif arg.type is bool:
            if bool(value) != bool(arg.default):
                words.append(arg.cli_flag)
        else:
            words += [arg.cli_flag, str(value)]
    if verb.name == "start" and "script" not in args:
        words.append("SCRIPT")
    if session and session != "default":
        words += ["--session", str(session)]
    return " ".join(words)


def tool_call(call: R.Call) -> str:
    """``VERB(name=value, ...)`` as an agent makes the tool call."""
    args = ", ".join(f"{k}={v!r}" for k, v in (call.get("args") or {}).items())
    return f"{call.get('verb')}({args})"


def worded(call: R.Call) -> str:
    """The call in the words of the surface printing it now."""
    return tool_call(call) if surface() == "mcp" else cli_command(call)
