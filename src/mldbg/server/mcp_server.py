"""``mldbg mcp``: the debugger as MCP tools, for coding agents, over stdio.

A thin client of the REST API, like the CLI: each tool is one daemon call (started on
demand, token from ``server.json``), or, for the run store and parity, the same library
call the CLI makes.  Results are the CLI's ``--json`` documents; failures come back as
tool errors whose text is the ``{"error", "code", ...}`` JSON, so an agent can act on the
code (``unknown_session`` lists the live sessions, a bad line names the nearest ones).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from .. import __version__, store_queries
from ..cli.client import Daemon, connect
from ..errors import MldbgError

INSTRUCTIONS = """\
mldbg debugs PyTorch and MLX scripts in their own process.
start_session(script=...) runs a script and pauses before its first line; set_breakpoint
(file + line, relative to the session's cwd; a condition, hit count or log message
optional), then continue_run: it returns where the script stopped, with code around the
line. At a stop: variables (tensors summarized: shape, dtype, device, stats), evaluate
(any Python in the selected frame), stack, select_frame, step. output returns the
script's stdout/stderr. Several sessions run at once under different `session` names.
Parity between a reference and a port: capture module outputs in both runs with
mldbg.capture(model, "ref") / mldbg.capture(model, "port"), then compare(a="ref",
b="port") names the first module whose inputs agree and outputs differ.
Errors are JSON with a `code`; read their text, it says what to do next."""

Session = Annotated[str, Field(description="session name; several can run at once")]
MaxWait = Annotated[
    float, Field(description="seconds to wait for the next stop or the end", ge=0, le=3600)
]


class BreakpointAt(BaseModel):
    file: str = Field(description="path, absolute or relative to the session's cwd")
    line: int
    condition: str | None = Field(None, description="stop only when this is true")


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """mldbg's own errors become tool errors carrying their JSON (code and hints)."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            with _as_tool_error():
                return await fn(*args, **kwargs)

        return call_async

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _as_tool_error():
            return fn(*args, **kwargs)

    return call


@contextlib.contextmanager
def _as_tool_error() -> Iterator[None]:
    try:
        yield
    except MldbgError as exc:
        raise ToolError(json.dumps(exc.to_json(), default=str)) from None
    except OSError as exc:
        message = f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")
        raise ToolError(json.dumps({"error": message, "code": "os_error"})) from None


def _daemon() -> Daemon:
    return connect()


def _session(
    name: str,
    verb: str,
    method: str = "POST",
    json: Any = None,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One REST call on session ``name``; every session route answers a JSON object."""
    result: dict[str, Any] = _daemon().session(name, verb, method=method, json=json, params=params)
    return result


def build_server() -> MCPServer:
    """The MCP server with every tool registered; ``run_stdio`` serves it."""
    server = MCPServer(
        name="mldbg", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per daemon call otherwise

    def tool(fn: Callable[..., Any]) -> Callable[..., Any]:
        server.add_tool(_guarded(fn), name=fn.__name__, description=fn.__doc__)
        return fn

    async def resume(
        ctx: Context, session: str, verb: str, body: dict[str, Any], max_wait: float
    ) -> dict[str, Any]:
        """Run a waiting call in a worker thread, reporting progress while the script runs."""

        def still_running(elapsed: float) -> None:
            anyio.from_thread.run(
                functools.partial(
                    ctx.report_progress, elapsed, max_wait, f"still running ({elapsed:.0f} s)"
                )
            )

        def blocking() -> dict[str, Any]:
            return _daemon().resume(session, verb, body, max_wait, still_running)

        return await anyio.to_thread.run_sync(blocking)

    # -- sessions ------------------------------------------------------------------------------

    @tool
    def start_session(
        script: Annotated[str | None, Field(description="the script to run")] = None,
        args: Annotated[list[str] | None, Field(description="the script's arguments")] = None,
        module: Annotated[str | None, Field(description="run a module, as python -m")] = None,
        breakpoints: list[BreakpointAt] | None = None,
        cwd: Annotated[
            str | None, Field(description="working directory (default: the MCP server's)")
        ] = None,
        python: Annotated[
            str | None, Field(description="interpreter (default: the active venv's python)")
        ] = None,
        env: Annotated[
            dict[str, str] | None, Field(description="variables added to the environment")
        ] = None,
        stop_on_entry: Annotated[
            bool, Field(description="pause before the first line (else run to a breakpoint)")
        ] = True,
        replace: Annotated[
            bool, Field(description="terminate a live session of this name first")
        ] = False,
        session: Session = "default",
    ) -> dict[str, Any]:
        """Start a Python script under the debugger; by default it pauses before its first line.

        Returns the session's state: `paused` with `location` (file, line, code around it),
        or `exited` with `exit_code` and the last output if it ran to the end.
        """
        if not script and not module:
            raise MldbgError("give `script` (a path) or `module` to run", code="usage")
        body = {
            "script": script,
            "module": module,
            "args": list(args or []),
            "python": python,
            "cwd": os.path.abspath(os.path.expanduser(cwd)) if cwd else os.getcwd(),
            "env": dict(os.environ),
            "env_overrides": dict(env or {}),
            "breakpoints": [bp.model_dump() for bp in breakpoints or []],
            "stop_on_entry": stop_on_entry,
            "replace": replace,
            "wait": 30.0,
        }
        return _session(session, "start", json=body)

    @tool
    def set_breakpoint(
        file: Annotated[
            str | None, Field(description="path, absolute or relative to the session's cwd")
        ] = None,
        line: int | None = None,
        condition: Annotated[str | None, Field(description="stop only when this is true")] = None,
        hits: Annotated[
            str | None, Field(description="N: the Nth hit; >=N: from the Nth on; %N: every Nth")
        ] = None,
        log: Annotated[
            str | None,
            Field(description='logpoint: print this instead of stopping, e.g. "x={x.shape}"'),
        ] = None,
        checkpoint: Annotated[
            str | None,
            Field(
                description="instead of file/line: pause only at debug_checkpoint calls so named (glob)"
            ),
        ] = None,
        session: Session = "default",
    ) -> dict[str, Any]:
        """Set a line breakpoint (also inside installed libraries such as transformers).

        A line that cannot hold one (blank, a comment) is an error naming the nearest lines that can.
        """
        body = {
            "file": file,
            "line": line,
            "condition": condition,
            "hits": hits,
            "log": log,
            "checkpoint": checkpoint,
        }
        return _session(session, "breakpoints", json=body)

    @tool
    def list_breakpoints(session: Session = "default") -> dict[str, Any]:
        """The session's breakpoints with their hit counts."""
        return _session(session, "breakpoints", method="GET")

    @tool
    def remove_breakpoint(
        file: str | None = None,
        line: int | None = None,
        checkpoint: str | None = None,
        session: Session = "default",
    ) -> dict[str, Any]:
        """Remove the breakpoint at file:line, or a checkpoint filter."""
        body = {"file": file, "line": line, "checkpoint": checkpoint}
        return _session(session, "breakpoints/remove", json=body)

    @tool
    def clear_breakpoints(session: Session = "default") -> dict[str, Any]:
        """Remove every breakpoint of the session."""
        return _session(session, "breakpoints/clear")

    @tool
    async def continue_run(
        ctx: Context, max_wait: MaxWait = 60.0, session: Session = "default"
    ) -> dict[str, Any]:
        """Resume the paused script and wait for the next stop (breakpoint, checkpoint,
        uncaught exception) or the end. State `running` means it was still going after
        `max_wait` s: call wait_for_stop, or pause."""
        return await resume(ctx, session, "continue", {}, max_wait)

    @tool
    async def step(
        ctx: Context,
        kind: Literal["over", "into", "out"] = "over",
        into_libraries: Annotated[
            bool, Field(description="also stop in library code (torch, transformers)")
        ] = False,
        max_wait: MaxWait = 60.0,
        session: Session = "default",
    ) -> dict[str, Any]:
        """Step over, into or out of the current line; returns the new location."""
        body = {"kind": kind, "into_libraries": into_libraries}
        return await resume(ctx, session, "step", body, max_wait)

    @tool
    async def wait_for_stop(
        ctx: Context, max_wait: MaxWait = 60.0, session: Session = "default"
    ) -> dict[str, Any]:
        """Wait for a running script to stop or end, without resuming anything."""
        return await resume(ctx, session, "wait", {}, max_wait)

    @tool
    def pause(session: Session = "default") -> dict[str, Any]:
        """Stop the running script at its next line of Python (a long C call finishes first)."""
        return _session(session, "pause", json={"wait": 5.0})

    @tool
    def status(session: Session = "default") -> dict[str, Any]:
        """The session's state: running, paused (where, why) or exited (exit code, exception)."""
        return _session(session, "", method="GET")

    @tool
    def location(session: Session = "default") -> dict[str, Any]:
        """Where the paused script is, with the code around the line."""
        return _session(session, "location", method="GET")

    @tool
    def stack(session: Session = "default") -> dict[str, Any]:
        """The paused thread's frames, innermost (0) first."""
        return _session(session, "stack", method="GET")

    @tool
    def select_frame(
        index: Annotated[int | None, Field(description="frame number from stack")] = None,
        move: Annotated[int, Field(description="+N: N callers up, -N: down")] = 0,
        session: Session = "default",
    ) -> dict[str, Any]:
        """Choose the frame that variables and evaluate look at."""
        body = {"index": index, "move": move}
        return _session(session, "frame", json=body)

    @tool
    def variables(include_globals: bool = False, session: Session = "default") -> dict[str, Any]:
        """The selected frame's variables; tensors are summarized (shape, dtype, device, stats)."""
        return _session(session, "variables", method="GET", params={"all": include_globals})

    @tool
    def evaluate(expression: str, session: Session = "default") -> dict[str, Any]:
        """Evaluate an expression (or run statements) in the selected frame of the paused script.

        Tensors in the result are summarized; assignments change the script's variables.
        """
        return _session(session, "eval", json={"expression": expression})

    @tool
    def output(
        tail: Annotated[int | None, Field(description="only the last N lines", ge=0)] = None,
        session: Session = "default",
    ) -> dict[str, Any]:
        """The script's captured stdout and stderr."""
        params = {"tail": tail} if tail is not None else None
        return _session(session, "output", method="GET", params=params)

    @tool
    def terminate(session: Session = "default") -> dict[str, Any]:
        """End the script (its run record stays in the run store)."""
        return _session(session, "terminate")

    @tool
    def list_sessions() -> dict[str, Any]:
        """Every session the daemon knows, live or ended."""
        result: dict[str, Any] = _daemon().call("GET", "/v1/sessions")
        return result

    # -- the run store and parity (files only, no daemon) -------------------------------------

    @tool
    def list_runs() -> dict[str, Any]:
        """The runs in the run store (MLDBG_HOME, default ./.mldbg), newest first."""
        return store_queries.runs()

    @tool
    def list_checkpoints(
        run: Annotated[str | None, Field(description="run id or prefix (default: latest)")] = None,
        name: Annotated[str | None, Field(description="checkpoint name glob")] = None,
        hit: Annotated[int | None, Field(description="only the Nth hit of each name")] = None,
    ) -> dict[str, Any]:
        """The debug_checkpoint records of a run: names, hits, tensor summaries, locations."""
        return store_queries.checkpoints(run, name, hit)

    @tool
    def list_captures(
        run: Annotated[str | None, Field(description="only this run's captures")] = None,
    ) -> dict[str, Any]:
        """The module captures (mldbg.capture) in the run store, newest first."""
        return store_queries.captures(run)

    @tool
    def compare(
        a: Annotated[str, Field(description="reference: capture name, run id, directory or file")],
        b: Annotated[str, Field(description="port: the same kinds")],
        rtol: Annotated[
            float | None, Field(description="relative tolerance (default: per dtype)", ge=0)
        ] = None,
        atol: Annotated[
            float | None, Field(description="absolute tolerance (default: per dtype)", ge=0)
        ] = None,
        name_map: Annotated[
            dict[str, Any] | str | None,
            Field(
                description='renames of b\'s names: {"rename": {...}, "regex": [[pat, repl]], "ignore": [globs]} or a JSON file'
            ),
        ] = None,
        html: Annotated[
            str | None, Field(description="also write a self-contained HTML report here")
        ] = None,
        max_entries: Annotated[
            int, Field(description="entries returned, culprit and failures first", ge=0)
        ] = 200,
    ) -> dict[str, Any]:
        """Compare two captured runs module by module and name the first divergence:
        the module whose inputs agree and outputs differ. `ok` true means everything agrees.
        """
        from ..compare import compare as run_compare

        result = run_compare(a, b, rtol=rtol, atol=atol, map=name_map, html=html).result
        return _trimmed(result, max_entries)

    return server


def _trimmed(result: dict[str, Any], limit: int) -> dict[str, Any]:
    """At most ``limit`` entries, the ones that matter first; says how many were left out."""
    entries = result.get("entries", [])
    if len(entries) <= limit:
        return result
    ranked = sorted(
        range(len(entries)),
        key=lambda i: (not entries[i].get("culprit"), bool(entries[i].get("ok")), i),
    )
    keep = sorted(ranked[:limit])
    return {
        **result,
        "entries": [entries[i] for i in keep],
        "entries_left_out": len(entries) - limit,
    }


def run_stdio() -> None:
    build_server().run("stdio")
