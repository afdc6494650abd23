"""Fuzzing as a test: nothing an agent sends takes the tool down.

Four surfaces, each driven by generated input against real parts (the slow tier of
``make test``, each bounded to a fixed number of derandomized examples):

* the MCP tools through the real SDK client against ``mldbg mcp`` and a paused session:
  unicode, control characters, huge and nested values, wrong types, unknown arguments,
  and evaluations whose results hold lone surrogates.  Every call is answered (a result,
  or a tool error carrying ``{"error", "code"}``), and the server and the session live on;
* raw JSON-RPC frames written to ``mldbg mcp``'s stdin, as no SDK client would send them:
  envelopes truncated, spliced with NULs, invalid UTF-8, lone-surrogate escapes, stray
  brackets, wrapped in deep nesting.  Each is answered as JSON-RPC says (a request by its
  id, anything unreadable by an error with id null), every line the server writes is a
  JSON-RPC message, and the next request is served;
* the CLI's argument parser (in-process, no daemon): any argument list parses or is a
  usage error, never a traceback;
* the REST API through schemathesis with its conformance checks on: no 5xx, every status
  and body as the OpenAPI document says (``test_schema_fuzz.py``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from daemons import start_body
from test_mcp_frames import RawMcp

from conftest import Api, line_of

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mldbg import verbs  # noqa: E402

pytestmark = pytest.mark.slow

SCRIPT = """
import sys
values = [1, 2, 3]
marker = 0  # stop here
print("end")
"""

# Tools that end, start or resume the script, or delete files, would only end the session
# the others are aimed at; their faults have tests of their own.
MCP_SKIPPED = {"start", "restart", "terminate", "forget", "continue", "step", "until", "clean"}
MCP_SKIPPED |= {"tensors", "compare", "wait"}

_text = st.text(
    alphabet=st.characters(exclude_categories=("Cs",)),  # the client cannot encode these
    max_size=40,
)
# made by the script, as os.fsdecode makes them of bytes that are not UTF-8
_lone_surrogate = st.integers(min_value=0xD800, max_value=0xDFFF).map(chr)
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False),
    _text,
    st.sampled_from(["", "\x00", "\x1b[31m", "\n", "..", "/etc/passwd", "x" * 5_000]),
)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=12,
)


def _arguments(tool: str) -> Any:
    verb = verbs.get(tool)
    names = [arg.name for arg in verb.args if arg.mcp] + ["session", "nonsense"]
    return st.dictionaries(st.sampled_from(names), _value, max_size=4)


def _mcp_calls() -> Any:
    tools = sorted(v.name for v in verbs.VERBS if v.mcp and v.name not in MCP_SKIPPED)
    return st.sampled_from(tools).flatmap(lambda tool: st.tuples(st.just(tool), _arguments(tool)))


def _run_mcp(config_dir: Path, cwd: Path, scenario: Any) -> None:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    env = {**os.environ, "MLDBG_CONFIG_DIR": str(config_dir), "MLDBG_HOME": str(cwd / ".mldbg")}
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "mldbg", "mcp"], env=env, cwd=str(cwd)
    )

    async def main() -> None:
        async with Client(server, read_timeout_seconds=120) as client:
            await scenario(client)

    anyio.run(main)


def _paused(api: Api, write: Any, tmp_path: Path, name: str) -> None:
    script = write("fuzzed.py", SCRIPT)
    body = start_body(
        script,
        tmp_path,
        stop_on_entry=False,
        breakpoints=[{"file": str(script), "line": line_of(script, "stop here")}],
    )
    api.post(f"/v1/sessions/{name}/start", body)
    assert api.post(f"/v1/sessions/{name}/wait", {"wait": 30})["state"] == "paused"


def test_fuzzing_the_mcp_tools_never_takes_the_server_down(
    api: Api, config_dir: Path, daemon: dict[str, Any], write: Any, tmp_path: Path
) -> None:
    _paused(api, write, tmp_path, "fuzzed")
    calls: list[tuple[str, dict[str, Any]]] = []

    @settings(max_examples=80, deadline=None, database=None, derandomize=True)
    @given(call=_mcp_calls())
    def collect(call: tuple[str, dict[str, Any]]) -> None:
        tool, arguments = call
        if verbs.get(tool).scope == "session":  # aimed at the paused session, mostly
            arguments.setdefault("session", "fuzzed")
        calls.append((tool, arguments))

    @settings(max_examples=30, deadline=None, database=None, derandomize=True)
    @given(text=st.lists(_lone_surrogate | st.characters(), max_size=30).map("".join))
    def surrogates(text: str) -> None:
        calls.append(("eval", {"expression": repr(text), "session": "fuzzed"}))

    collect()
    surrogates()
    problems: list[str] = []

    async def scenario(client: Any) -> None:
        for tool, arguments in calls:
            label = f"{tool}({json.dumps(arguments, default=str)[:200]})"
            result = await client.call_tool(tool, arguments)
            text = result.content[0].text if result.content else ""
            if result.is_error:
                if text.startswith("{"):  # the daemon's (or the tool's) error JSON
                    error = json.loads(text)
                    if not (error.get("code") and error.get("error")):
                        problems.append(f"{label}: an error without a code: {text[:200]}")
                    if error.get("code") == "internal":
                        problems.append(f"{label}: internal: {text[:300]}")
                # else: the SDK refused the arguments against the input schema, itself
            elif not isinstance(result.structured_content, dict):
                problems.append(f"{label}: no structured content")
            if len(text.encode()) > 64 * 1024:
                problems.append(f"{label}: {len(text)} characters of text")
        state = await client.call_tool("status", {"session": "fuzzed"})
        assert not state.is_error and state.structured_content["state"] == "paused", state

    try:
        _run_mcp(config_dir, tmp_path, scenario)
        assert not problems, "\n".join(problems[:20])
        assert len(calls) >= 100
    finally:
        api.post("/v1/sessions/fuzzed/terminate")


# -- raw MCP frames ----------------------------------------------------------------------

# quick to answer, so each frame's answer comes before long (tools/call goes to the daemon)
_METHODS = ["ping", "tools/list", "prompts/list", "resources/list", "nope", "notifications/x"]
_json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),  # lone surrogates included: json.dumps escapes them ("\udcff")
)
_json_value = st.recursive(
    _json_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
_ids = st.one_of(
    st.integers(min_value=1000, max_value=1 << 40),
    st.text(min_size=1, max_size=12).map(lambda t: "f-" + t),
    st.sampled_from([None, True, 1.5, [], {}]),
)
_params = st.dictionaries(st.text(max_size=8), _json_value, max_size=3)
_head = {
    "jsonrpc": st.sampled_from(["2.0", "2.0", "2.0", "1.0", 2]),
    "method": st.sampled_from(_METHODS) | st.text(max_size=10),
}
_envelope = st.one_of(
    st.fixed_dictionaries({**_head, "id": _ids}, optional={"params": _params}),
    st.fixed_dictionaries(_head, optional={"params": _params}),  # a notification
).map(lambda message: json.dumps(message).encode())
_splices = st.sampled_from(
    [b"\x00", b"\xff", b"\xc3", b'"', b"{", b"[", b"]", b"}", b",", b":", b"\\", b"\\udcff"]
)


def _mutated(frame: bytes, how: str, at: int, splice: bytes, depth: int) -> bytes:
    at = at % (len(frame) + 1)
    if how == "truncate":
        return frame[:at] or b"{"
    if how == "splice":
        return frame[:at] + splice + frame[at:]
    if how == "nest":
        return b"[" * depth + frame + b"]" * depth
    return frame


_frames = st.one_of(
    st.builds(
        _mutated,
        _envelope,
        st.sampled_from(["keep", "keep", "keep", "truncate", "splice", "splice", "nest"]),
        st.integers(min_value=0, max_value=1 << 16),
        _splices,
        st.integers(min_value=1, max_value=200_000),
    ),
    st.binary(min_size=1, max_size=64),
).filter(lambda frame: b"\n" not in frame and b"\r" not in frame and frame.strip())


def _answered_by_id(frame: bytes) -> object:
    """The id a request in ``frame`` is answered with (``...`` when none is owed one)."""
    try:
        message = json.loads(frame)
    except (ValueError, RecursionError):
        return None  # unreadable: an error with id null
    if not isinstance(message, dict):
        return None
    found = message.get("id")
    usable = isinstance(found, int | str) and not isinstance(found, bool)
    if "method" in message and "id" in message:  # a request: answered by its id if usable
        return found if usable and not _has_surrogate(found) else None
    return ...  # a notification or a response: nothing is owed


def _has_surrogate(value: object) -> bool:
    return isinstance(value, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in value)


def test_fuzzing_raw_mcp_frames_every_request_is_answered(
    config_dir: Path, daemon: dict[str, Any]
) -> None:
    frames: list[bytes] = []

    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(frame=_frames)
    def collect(frame: bytes) -> None:
        frames.append(frame)

    collect()
    raw = RawMcp(config_dir)
    problems: list[str] = []
    try:
        for number, frame in enumerate(frames):
            owed = _answered_by_id(frame)
            probe = f"probe-{number}"
            raw.send(frame)
            raw.send(json.dumps({"jsonrpc": "2.0", "id": probe, "method": "ping"}).encode())
            got: list[dict[str, Any]] = []
            while not any(a.get("id") == probe for a in got) or (
                owed is not ... and not any(a.get("id") == owed for a in got)
            ):
                answer = raw.receive()
                if answer.get("jsonrpc") != "2.0" or not ("result" in answer or "error" in answer):
                    problems.append(f"{frame[:120]!r}: not a JSON-RPC answer: {answer}")
                    break
                error = answer.get("error")
                if error is not None and not (
                    isinstance(error.get("code"), int) and error.get("message")
                ):
                    problems.append(f"{frame[:120]!r}: an error without code or message: {error}")
                got.append(answer)
        raw.still_serves(10**9)
    finally:
        raw.close()
    assert not problems, "\n".join(problems[:20])
    assert len(frames) >= 200


_flags = sorted(
    {arg.cli_flag for verb in verbs.VERBS for arg in verb.args if arg.cli}
    | {"-s", "--session", "--json", "-m", "--", "-", "-h"}
)
_token = st.one_of(
    st.sampled_from(_flags),
    st.text(alphabet=st.characters(exclude_characters="\x00"), max_size=20),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["x.py:3", "x.py:3:i > 2", "#2", "9" * 5000, "a=b", "=", ":", "%", "%N"]),
)
_argv = st.tuples(
    st.sampled_from(sorted(v.name for v in verbs.VERBS if v.cli) + ["sessions", "nope"]),
    st.lists(_token, max_size=8),
).map(lambda parts: [parts[0], *parts[1]])


def test_fuzzing_the_cli_parser_gives_usage_errors_not_tracebacks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mldbg.cli import main as cli_main
    from mldbg.errors import MldbgError

    crashes: list[str] = []

    @settings(
        max_examples=400,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(argv=_argv)
    def parse(argv: list[str]) -> None:
        try:
            args = cli_main.parse_command_line(list(argv))
            verb = verbs.BY_NAME.get(args.verb)
            if verb is not None and args.verb != "eval":  # eval '-' would read stdin
                cli_main.verb_arguments(verb, args)
        except MldbgError:
            pass  # a usage error, said as such
        except SystemExit as exc:  # --help printed and done
            if exc.code not in (0, None):
                crashes.append(f"{argv!r}: exit {exc.code}")
        except Exception as exc:
            crashes.append(f"{argv!r}: {type(exc).__name__}: {exc}")

    parse()
    capsys.readouterr()
    assert not crashes, "\n".join(crashes[:20])
