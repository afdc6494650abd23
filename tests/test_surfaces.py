"""The verb table is the only place a verb is declared: every surface must derive from it.

A verb added to ``verbs.py`` must appear as a REST route (in the OpenAPI schema, with
its error responses), an MCP tool (same name, input and output schemas), a CLI
sub-command (its flags) and a daemon handler; and hostile names or oversized answers
must be refused or bounded on every surface.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import Client as McpClient
from mcp.client.stdio import StdioServerParameters

from conftest import Api, line_of
from mldbg import capture_options, verbs
from mldbg.cli import main as cli_main
from mldbg.client.api import Client
from mldbg.server import handlers
from mldbg.text import render


def test_every_verb_has_a_handler_and_prints_for_a_person() -> None:
    assert handlers.missing_handlers() == []
    assert set(render.RENDERERS) <= {v.name for v in verbs.VERBS}  # no renderer of no verb
    # a verb without a renderer of its own prints its answer as JSON, nothing lost
    text = render.to_text("a-verb-without-a-renderer", {"answer": [1, 2], "note": "[b]x[/b]"})
    assert json.loads(text) == {"answer": [1, 2], "note": "[b]x[/b]"}


def test_every_handler_takes_its_verbs_arguments_as_typed_keywords() -> None:
    """A handler's keyword parameters are its verb's arguments, no more and no fewer, typed
    as the verb table declares them (``T | None`` where the declared default is None, the
    value a missing argument arrives as); a run-store verb's context comes as one
    ``where``.  mypy then checks each handler's use of its arguments against the table."""
    import inspect
    import typing

    from mldbg.server.app import verb_args

    for verb in verbs.VERBS:
        if verb.agent is not None:  # passed on as the agent command declares them
            continue
        handler = handlers.HANDLERS[verb.name]
        hints = typing.get_type_hints(handler)
        parameters = list(inspect.signature(handler).parameters.values())
        assert [p.name for p in parameters[:2]] == ["manager", "session"], verb.name
        positional = [
            p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)
        ]
        assert positional[2:] == (["where"] if verb.store else []), verb.name
        keywords = {p.name: p for p in parameters if p.kind is p.KEYWORD_ONLY}
        declared = {a.name: a for a in verb_args(verb) if a.name not in handlers.WHERE}
        if any(p.kind is p.VAR_KEYWORD for p in parameters):
            # start's capture options come as one mapping, checked by their declaration
            # (capture_options.Spec: tests/test_capture_options.py)
            assert verb.name == "start", verb.name
            options = {capture_options.argument_of(f) for f in capture_options.OPTIONS}
            assert options <= set(declared) and not options & set(keywords)
            declared = {k: a for k, a in declared.items() if k not in options}
        assert set(keywords) == set(declared), verb.name
        for name, arg in declared.items():
            wanted = arg.type if arg.required or arg.default is not None else arg.type | None
            assert hints[name] == wanted, (verb.name, name, hints[name], wanted)
            if not arg.required:
                assert keywords[name].default == arg.default, (verb.name, name)


def test_every_verb_is_a_rest_route_with_its_errors(api: Api) -> None:
    spec = api.get("/openapi.json")
    for verb in verbs.VERBS:
        path = verb.path
        assert path in spec["paths"], verb.name
        operation = spec["paths"][path][verb.method.lower()]
        assert operation["operationId"] == f"verb_{verb.name}"
        assert {"200", "400", "404", "409"} <= set(operation["responses"]), verb.name
        declared = {a.name for a in verb.args}
        if verb.method == "GET":
            names = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
        else:
            ref = operation["requestBody"]["content"]["application/json"]["schema"]
            ref = ref.get("anyOf", [ref])[0]
            schema = spec["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]
            names = set(schema["properties"])
        assert declared <= names, (verb.name, declared - names)


def test_every_verb_is_a_cli_command_with_its_flags() -> None:
    parser = cli_main.build_parser()
    sub = next(a for a in parser._actions if a.dest == "verb")
    for verb in verbs.VERBS:
        if not verb.cli:
            continue
        command = sub.choices[verb.name]  # type: ignore[index]
        options = {s for action in command._actions for s in action.option_strings}
        for arg in verb.args:
            if arg.cli and not arg.positional and arg.name not in ("file", "line", "session"):
                assert arg.cli_flag in options, (verb.name, arg.cli_flag)


def test_every_verb_is_an_mcp_tool_with_schemas(config_dir: Path, daemon: dict[str, Any]) -> None:
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mldbg", "mcp"],
        env={**__import__("os").environ, "MLDBG_CONFIG_DIR": str(config_dir)},
    )
    found: dict[str, Any] = {}
    instructions: list[str] = []

    async def main() -> None:
        async with McpClient(server, read_timeout_seconds=60) as client:
            instructions.append(client.instructions or "")
            for tool in (await client.list_tools()).tools:
                found[tool.name] = tool

    anyio.run(main)
    for verb in verbs.VERBS:
        if not verb.mcp:
            continue
        tool = found[verb.name]
        props = set(tool.input_schema["properties"])
        assert {a.name for a in verb.args if a.mcp} <= props, verb.name
        assert ("session" in props) == (verb.scope == "session" or verb.store), verb.name
        # structured content: an object (its shape: the README, OpenAPI; checked by the server)
        assert tool.output_schema == {"type": "object"}, verb.name
        # a verb's own codes in its description, the ones every tool shares in the instructions
        said = (tool.description or "") + instructions[0]
        assert all(code in said for code in verb.all_errors), verb.name


def test_hostile_session_names_never_reach_a_route(api: Api, daemon: dict[str, Any], cli) -> None:
    client = Client(daemon)
    for name in ("x/../../shutdown#", "", "a b", "../etc", "x?y=1", ".hidden", "a" * 65, "x\ny"):
        try:
            client.call("pause", name)
        except Exception as exc:  # noqa: BLE001 - the code is what matters
            assert getattr(exc, "code", None) == "bad_session_name", (name, exc)
        else:
            raise AssertionError(f"{name!r} was accepted")
    # the raw HTTP route refuses it too, and the daemon is still there
    response = api.http.post("/v1/sessions/x%2F..%2F..%2Fshutdown%23/pause", json={})
    assert response.status_code in (400, 404) and "code" in response.json()
    response = api.http.get("/v1/sessions/bad%20name")
    assert response.status_code == 400 and response.json()["code"] == "bad_session_name"
    assert api.get("/v1/health")["ok"]
    proc = cli("status", "--session", "x/../../shutdown#", json_out=True, expect=2)
    assert proc["code"] == "bad_session_name"
    assert api.get("/v1/health")["ok"]


def test_answers_stay_within_their_budgets(session, write, daemon: dict[str, Any]) -> None:
    script = write(
        "budget.py",
        """
        import sys
        for i in range(100_000):
            print(f"line {i} " + "x" * 40)
        print("y" * 2_000_000)  # one 2 MB line
        def deep(n):
            if n == 0:
                return n  # bottom
            return deep(n - 1)
        big = {f"v{i}": i for i in range(600)}
        locals().update(big)
        deep(900)
        """,
    )
    session.start(script, breakpoints=[{"file": str(script), "line": line_of(script, "bottom")}])
    state = session.cont(wait=60)
    assert state["state"] == "paused", state
    client = Client(daemon)
    name = session.name

    out = client.call("output", name)
    assert len(json.dumps(out)) < 40_000 and out["truncated"] and out["size"] > 6_000_000
    assert out["next"]["verb"] == "output"
    page = client.call("output", name, offset=0, limit=1000)
    assert page["output"].startswith("line 0 ") and len(page["output"]) == 1000
    assert page["next"]["args"]["offset"] == 1000

    stack = client.call("stack", name)
    assert len(stack["frames"]) == 30 and stack["truncated"] and stack["total"] > 900
    assert len(json.dumps(stack)) < 20_000

    client.call("frame", name, index=stack["total"] - 1)  # the module, with 600 globals
    listed = client.call("vars", name)
    assert listed["shown"] == 50 and listed["total"] > 600 and listed["truncated"]
    assert listed["next"] == {"verb": "vars", "args": {"offset": 50, "limit": 50}}
    only = client.call("vars", name, filter="v59*")
    assert {v["name"] for v in only["variables"]} == {"v59"} | {f"v59{i}" for i in range(10)}

    state = client.call("status", name)
    assert len(json.dumps(state)) < 20_000
    huge = client.call  # an eval raising a huge message answers within its budget
    try:
        huge("eval", name, expression="raise ValueError('z' * 50_000_000)")
    except Exception as exc:  # noqa: BLE001
        assert exc.code == "eval_error" and len(str(exc)) < 10_000  # type: ignore[attr-defined]
    result = client.call("eval", name, expression="'q' * 10_000_000")
    assert len(result["result"]) < 10_000 and result["result_truncated"]


def test_a_daemon_with_another_verb_table_is_named_in_the_error(daemon: dict[str, Any]) -> None:
    """A daemon left running from before an upgrade answers new verbs with
    ``no_such_route``: the client, seeing its table's fingerprint differ from the one in
    server.json, says so and how to recover; with the same table it adds nothing."""
    from mldbg.client.api import Client, DaemonError

    assert daemon["verbs"] == verbs.fingerprint()  # the daemon publishes its table's digest
    same = Client(daemon)
    try:
        same.request("POST", "/v1/sessions/default/no-such-verb", {})
    except DaemonError as exc:
        assert exc.code == "no_such_route" and not exc.extra.get("daemon_skew")
    else:
        raise AssertionError("an unknown route was answered")
    skewed = Client({**daemon, "verbs": "0" * 16, "version": "0.0.1"})
    try:
        skewed.request("POST", "/v1/sessions/default/no-such-verb", {})
    except DaemonError as exc:
        assert exc.code == "no_such_route" and exc.extra.get("daemon_skew") is True
        assert "mldbg serve --stop" in exc.message and "0.0.1" in exc.message
    else:
        raise AssertionError("an unknown route was answered")
