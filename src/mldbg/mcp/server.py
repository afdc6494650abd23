"""``mldbg mcp``: the verb table as MCP tools, over stdio, for coding agents.

A client of the daemon like the CLI: each tool is one verb of ``verbs.py``, with the
verb's name, its arguments as the tool's input schema, its result TypedDict as the
tool's output schema, and the typed client making the call over one persistent
connection.  A result is sent once: the JSON as structured content, and as text the
compact human form the CLI prints (bounded).  Failures are tool errors whose text is the
daemon's ``{"error", "code", ...}`` JSON with a ``hint`` worded as a tool call.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal, cast

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent
from pydantic import Field, ValidationError

from .. import __version__, budget, verbs
from .. import results as R
from ..client.api import Client, connect
from ..errors import BAD_ARGUMENT, DAEMON_UNREACHABLE, INTERNAL, OS_ERROR, MldbgError
from ..verbs import VERBS, Arg, Verb

INSTRUCTIONS = """\
mldbg debugs PyTorch/MLX scripts and proves a port matches its reference.
Parity, no edits: start(script="ref.py", capture="ref", stop_on_entry=false), wait(), then the
same for the port (capture="port") record every model call; compare(a="ref", b="port") names the first
module, step or glue code where the port diverges; then line(a="ref", b="port") names the
port's first wrong line. Its answer hands out the next calls (a finer capture, the weight
audit). Filter a long compare by module/call/status/kind.
Debugging: start(script=...) pauses before line 1; break(file, line) (condition/hits/log
optional), continue; at a stop: vars, eval (any Python in the frame; against="ref" diffs
with another session), stack, step. break(nonfinite=true): stop at the first NaN/Inf.
Sessions (`session`, default "default") run side by side; store tools read the session's
store, else `home`, else ./.mldbg.
Answers are bounded: `truncated`/`next` say what is left and the call that gets it;
offset/limit page listings; `wait`: seconds to wait for a stop or the end; texts are
at most 4096 chars (else maxLength).
Errors: JSON with `code` and `hint` (the call that fixes it). Every tool: bad_argument,
too_long, bad_session_name, daemon_unreachable; session tools: unknown_session, session_ended,
not_paused, agent_timeout. The breakpoint errors: file_not_found, not_a_source_file,
no_code_at_line (nearest_lines), bad_condition, bad_hits, bad_log, ambiguous_file,
no_such_function. The source errors: unknown_source, corrupt_file, corrupt_capture, unreadable,
too_slow.
Guides: docs/ in the mldbg repository."""

TEXT_BUDGET = 6_000  # the text form of a result; the JSON is in structured content


def _annotation(arg: Arg) -> object:
    """The argument's type as pydantic reads it: its choices or type, its bounds and help."""
    base = Literal[arg.choices] if arg.choices else arg.type  # type: ignore[valid-type]
    constraints: dict[str, Any] = {"description": arg.help}
    if arg.type is str:  # documented here, refused by the daemon with its code (too_long)
        constraints["json_schema_extra"] = {"maxLength": arg.max_length}
    if arg.type in (bool, int, float):  # false is not a number, 1 is not true
        constraints["strict"] = True
    if arg.minimum is not None:
        constraints["ge"] = arg.minimum
    if arg.maximum is not None:
        constraints["le"] = arg.maximum
    if arg.required:
        return Annotated[base, Field(**constraints)]
    return Annotated[base | None, Field(**constraints)]


def _signature(verb: Verb) -> inspect.Signature:
    params = [
        inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context),
    ]
    for arg in verb.args:
        if not arg.mcp:
            continue
        default = inspect.Parameter.empty if arg.required else arg.default
        params.append(
            inspect.Parameter(
                arg.name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=_annotation(arg),
                default=default,
            )
        )
    if verb.scope == "session":
        params.append(
            inspect.Parameter(
                "session",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=str,  # said once, in INSTRUCTIONS
                default="default",
            )
        )
    return inspect.Signature(params, return_annotation=Annotated[CallToolResult, verb.result])


def tool_hint(fixes: object) -> str | None:
    """The tool calls that fix an error (its ``fix``, a list of ``results.Call``), as an
    agent would make them."""
    if not fixes or not isinstance(fixes, list):
        return None
    return "call " + "; or ".join(verbs.word(fix, "mcp") for fix in fixes[:3])


@contextlib.contextmanager
def _as_tool_error() -> Iterator[None]:
    try:
        yield
    except MldbgError as exc:
        payload = exc.to_json()
        text = tool_hint(payload.get("fix"))
        if text:
            payload["hint"] = text
        raise ToolError(budget.capped(json.dumps(payload, default=str), 8_000)) from None
    except OSError as exc:
        message = f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")
        raise ToolError(
            json.dumps({"error": budget.encodable(message), "code": OS_ERROR})
        ) from None
    except Exception as exc:  # anything else still reaches the agent with a code
        text = f"internal error in mldbg mcp: {type(exc).__name__}: {exc} (please report it)"
        raise ToolError(
            json.dumps({"error": budget.capped(text, budget.MESSAGE), "code": INTERNAL})
        ) from None


def result_text(verb: Verb, data: object, args: dict[str, object] | None = None) -> str:
    """The compact human form of a result: what the CLI prints, bounded, its calls worded
    as tool calls.  When the text had to be cut, it says so and, for a page of entries,
    which call gets the rows it could not show."""
    from ..text import render

    if verb.name == "output" and isinstance(data, dict):
        text = str(data.get("output", ""))
        if data.get("truncated"):
            text += f"\n[{data.get('size')} bytes in all; next: {json.dumps(data.get('next'))}]"
        return budget.capped(text, TEXT_BUDGET, "tail")
    try:
        text = render.to_text(verb.name, data, surface="mcp")
    except Exception:
        text = json.dumps(data, separators=(",", ":"), default=str)
    if isinstance(data, dict) and data.get("truncated") and data.get("next"):
        next_call = verbs.word(cast("R.Call", data["next"]), "mcp")
        text += f"\n[truncated; next: {next_call}]"
    if len(text) <= TEXT_BUDGET:
        return text
    return _cut_text(verb, text, data, args or {})


def _cut_text(verb: Verb, text: str, data: object, args: dict[str, object]) -> str:
    """``text`` cut to the budget, saying what was cut: for a page of entries, the first
    entry the kept text no longer shows and the call that starts there."""
    marker = "\n[text cut at {kept} of {total} characters; the structured content is whole{more}]"
    room = TEXT_BUDGET - len(marker) - 200
    kept = budget.capped(text, room)
    more = ""
    entries = data.get("entries") if isinstance(data, dict) else None
    if isinstance(entries, list) and entries:
        visible = 0
        for entry in entries:
            name = entry.get("name") if isinstance(entry, dict) else None
            if not isinstance(name, str) or name not in kept:
                break
            visible += 1
        if visible < len(entries):
            start = args.get("offset")
            offset = (start if isinstance(start, int) else 0) + visible
            call: R.Call = {"verb": verb.name, "args": {**args, "offset": offset}}
            more = f"; rows from {offset} on: {verbs.word(call, 'mcp')}"
    return kept + marker.format(kept=len(kept), total=len(text), more=more)


class Tools:
    """The tools, each calling the daemon through one client kept for the server's life."""

    def __init__(self) -> None:
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = connect()
        return self._client

    def call(self, verb: Verb, session: str | None, args: dict[str, object]) -> object:
        """The verb's result (``verb.result``), from the daemon."""
        try:
            return self.client.call(verb.name, session, **args)
        except MldbgError as exc:
            if exc.code != DAEMON_UNREACHABLE:
                raise
            self._client = None  # the daemon went away: find or start it again, once
            return self.client.call(verb.name, session, **args)

    def make(self, verb: Verb) -> Any:
        async def tool(**kwargs: Any) -> CallToolResult:
            ctx: Context = kwargs.pop("ctx")
            session = kwargs.pop("session", None) if verb.scope == "session" else None
            args = {k: v for k, v in kwargs.items() if v is not None}
            data: object
            with _as_tool_error():
                if verb.waits:
                    data = await self._resume(ctx, verb, session, args)
                else:
                    data = await anyio.to_thread.run_sync(
                        functools.partial(self.call, verb, session, args)
                    )
            # the daemon's answers are already encodable; what this process adds (a path
            # from an OSError, say) may not be, and one lone surrogate kills the stdio writer
            data = budget.encodable(data)
            return CallToolResult(
                content=[TextContent(type="text", text=result_text(verb, data, args))],
                structured_content=data,
            )

        signature = _signature(verb)
        tool.__signature__ = signature  # type: ignore[attr-defined]
        # the SDK finds the Context parameter through get_type_hints, i.e. __annotations__
        tool.__annotations__ = {
            **{p.name: p.annotation for p in signature.parameters.values()},
            "return": signature.return_annotation,
        }
        tool.__name__ = verb.name
        tool.__doc__ = verb.help
        return tool

    async def _resume(
        self, ctx: Context, verb: Verb, session: str | None, args: dict[str, Any]
    ) -> R.State | R.LineStep:
        """A waiting verb in a worker thread, with a progress notification between slices."""
        max_wait = float(args.pop("wait", verb.arg("wait").default))

        def still_running(elapsed: float) -> None:
            anyio.from_thread.run(
                functools.partial(
                    ctx.report_progress, elapsed, max_wait, f"still running ({elapsed:.0f} s)"
                )
            )

        def blocking() -> R.State | R.LineStep:
            if verb.scope == "global":  # a run-store verb's job (line), followed
                return self.client.follow(verb.name, max_wait, still_running, **args)
            return self.client.resume(verb.name, session, max_wait, still_running, **args)

        return await anyio.to_thread.run_sync(blocking)


# -- the tool list an agent reads: every verb, in as few tokens as say it ----------------------
#
# The list is in every agent's context on every turn.  Derived as pydantic writes them, the
# schemas took 107 KB (a state verb repeated a 5 KB output schema); compacted they keep what
# an agent needs to call a tool and read its answer, and the server still validates every
# result against the verb's full result type.


def compact_output_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """An object, as MCP asks of structured content, and no more: the structured content
    names its own fields, docs/reference.md and the OpenAPI document give every shape, and the
    server validates each result against the verb's full result type before it is sent.
    (Derived by pydantic, a state verb's schema alone was 5 KB, repeated by eleven tools.)"""
    return None if schema is None else {"type": "object"}


def _compact_property(schema: dict[str, Any]) -> dict[str, Any]:
    prop = {k: v for k, v in schema.items() if k != "title"}
    if prop.get("maxLength") == verbs.TEXT_LIMIT:  # the usual limit is said once, in INSTRUCTIONS
        del prop["maxLength"]
    options = prop.pop("anyOf", None)
    if options is not None:  # X or null: null means "not given", say X
        kept = [o for o in options if o.get("type") != "null"]
        if len(kept) == 1:
            prop.update({k: v for k, v in kept[0].items() if k != "title"})
        else:
            prop["anyOf"] = kept
    if prop.get("default", 0) is None or prop.get("default", 0) is False:  # a flag: off
        del prop["default"]
    if prop.get("type") in ("integer", "number"):  # the server still refuses what is out
        if prop.get("minimum") == 0:  # of range, with bad_argument naming the argument
            del prop["minimum"]  # a count or a wait
        prop.pop("maximum", None)
    if prop.get("maxLength") == verbs.TEXT_LIMIT:
        del prop["maxLength"]
    if "items" in prop and isinstance(prop["items"], dict):
        prop["items"] = {k: v for k, v in prop["items"].items() if k != "title"}
    return prop


def compact_input_schema(verb: Verb, schema: dict[str, Any]) -> dict[str, Any]:
    """The arguments without pydantic's titles and ``X or null`` unions, described in
    MCP's terms."""
    properties = {n: _compact_property(p) for n, p in schema.get("properties", {}).items()}
    for name, prop in properties.items():
        if "description" in prop:
            prop["description"] = mcp_terms(verb, prop["description"])
        if name == "session" or (verb.store and name == "home"):  # said once, in INSTRUCTIONS
            properties[name] = {"type": "string"}
        elif prop.get("description") in (verbs.LIMIT_HELP, verbs.OFFSET.help, verbs.WAIT_HELP):
            del prop["description"]  # paging and waiting are said once, in INSTRUCTIONS
    compact: dict[str, Any] = {"type": "object", "properties": properties}
    if schema.get("required"):
        compact["required"] = schema["required"]
    if "$defs" in schema:  # nested argument types (a breakpoint spec), without titles
        compact["$defs"] = {
            name: {
                "type": "object",
                "properties": {n: _compact_property(p) for n, p in d.get("properties", {}).items()},
            }
            for name, d in schema["$defs"].items()
        }
    return compact


# Help that speaks of the command line as a whole (positional spellings, exit codes), said
# the way a tool call says it; flags inside help are translated by ``mcp_terms``.
MCP_HELP = {
    "break": "set a breakpoint (file + line), a function, exception or checkpoint one",
    "remove": "remove a breakpoint (file + line, or id) or a checkpoint filter",
    "until": "run to a line (target FILE:LINE, LINE in the current file or #ID; or file + "
    "line, or id): a one-shot breakpoint, then continue",
    "compare": "compare two captures/runs/tensor directories (`ok`: true when they agree)",
    "tensors": "the debug_save tensor store: action list, info (name) or clear (name, or yes=true "
    "for all)",
}


def mcp_terms(verb: Verb, text: str) -> str:
    """The verb's help as an MCP tool says it: CLI flags become its arguments
    (``--all`` → ``all=true``), and what only a shell can do is left out."""
    text = text.replace(" ('-' reads stdin)", "").replace(" on the CLI", "")
    text = text.replace(" (FILE:LINE[:COND])", "").replace(" (also --name)", "")
    for arg in sorted(verb.args, key=lambda a: -len(a.cli_flag)):
        if not arg.mcp or not arg.cli_flag.startswith("--"):  # "-m" is also python's
            continue
        spelled = f"{arg.name}=true" if arg.type is bool and arg.default is False else arg.name
        text = re.sub(rf"(?<![\w-]){re.escape(arg.cli_flag)}(?![\w-])", spelled, text)
    return text


def tool_description(verb: Verb) -> str:
    description = MCP_HELP.get(verb.name, verb.help)
    description += f". {verb.description}" if verb.description else ""
    shared = COMMON_ERRORS + (SESSION_ERRORS if verb.scope == "session" else ())
    own = [code for code in verb.all_errors if code not in shared]
    for group, name in ((BREAKPOINT_ERRORS, "breakpoint"), (SOURCE_ERRORS, "source")):
        if set(group) <= set(own):  # listed once, in INSTRUCTIONS
            own = [code for code in own if code not in group] + [f"the {name} errors"]
    if own:
        description += f" Errors: {', '.join(own)}."
    return mcp_terms(verb, description)


COMMON_ERRORS = ("bad_argument", "too_long", "bad_session_name", "daemon_unreachable")
SESSION_ERRORS = ("unknown_session", "session_ended", "not_paused", "agent_timeout")
# what every tool that sets breakpoints (start, break, until, restart) may answer
BREAKPOINT_ERRORS = tuple(code for code in verbs.BREAK_ERRORS if code not in SESSION_ERRORS)
# What a tool reading captures or tensor files may answer for a bad one (INSTRUCTIONS).
SOURCE_ERRORS = ("unknown_source", "corrupt_file", "corrupt_capture", "unreadable", "too_slow")


class _Server(MCPServer):
    """The SDK's server, with its argument validation said as every mldbg error is."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            raise ToolError(json.dumps(argument_error(exc.__cause__))) from None


def argument_error(error: ValidationError) -> dict[str, Any]:
    """The SDK's refusal of a tool's arguments (a list where a mapping belongs, ``"2"`` for
    a number, a choice not offered) as ``{"error", "code": "bad_argument", "argument",
    "problems"}``, as REST answers the same arguments: it was pydantic's text with a URL
    and no code an agent could branch on."""
    problems: list[str] = []
    argument = None
    for item in error.errors(include_url=False)[:10]:
        name = ".".join(str(part) for part in item.get("loc", ())) or "arguments"
        argument = argument or name.split(".", 1)[0]
        problems.append(budget.capped(f"{name}: {item.get('msg', 'invalid')}", 300))
    return {
        "error": "bad argument: " + "; ".join(problems),
        "code": BAD_ARGUMENT,
        "argument": argument,
        "problems": problems,
    }


def build_server() -> MCPServer:
    """The MCP server with one tool per verb; ``run_stdio`` serves it."""
    server = _Server(
        name="mldbg", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )
    tools = Tools()
    for verb in VERBS:
        if not verb.mcp:
            continue
        server.add_tool(tools.make(verb), name=verb.name, description=tool_description(verb))
        tool = server._tool_manager.get_tool(verb.name)
        assert tool is not None
        tool.parameters = compact_input_schema(verb, tool.parameters)
        # read live by the SDK: published compact, results still validated by the full type
        tool.fn_metadata.output_schema = compact_output_schema(tool.fn_metadata.output_schema)
    return server


def tool_names() -> list[str]:
    return [verb.name for verb in verbs.VERBS if verb.mcp]


def run_stdio() -> None:
    """Serve over stdio through ``frames.serve``: every frame answered, within bounds."""
    from .frames import serve

    anyio.run(serve, build_server())
