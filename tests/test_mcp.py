"""``mldbg mcp`` through the real MCP SDK client over stdio, against the test daemon."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from conftest import line_of

SCRIPT = """
import torch

def scale(t, factor):
    out = t * factor  # in scale
    return out

x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
y = scale(x, 2.0)  # call scale
print("total", y.sum().item())
"""

PARITY = """
import copy
import torch
from torch import nn
import mldbg

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.lin(x))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block(), Block()])
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)

torch.manual_seed(0)
ref = Net()
port = copy.deepcopy(ref)
port.blocks[1].act = nn.ReLU()  # the deliberate bug
x = torch.randn(4, 8)
with torch.no_grad():
    with mldbg.capture(ref, "ref"):
        ref(x)
    with mldbg.capture(port, "port"):
        port(x)
print("captured")
"""

SLOW = """
import time
for _ in range(70):
    time.sleep(0.1)
print("slept")
"""


class Tools:
    """Calls tools and unwraps their results: the JSON document, or the error's JSON."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def __call__(self, name: str, **arguments: Any) -> dict[str, Any]:
        result = await self.client.call_tool(name, arguments)
        text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
        assert not result.is_error, f"{name}{arguments}: {text}"
        data = result.structured_content
        assert isinstance(data, dict), text
        return data

    async def error(self, name: str, **arguments: Any) -> dict[str, Any]:
        result = await self.client.call_tool(name, arguments)
        assert result.is_error, f"{name} should have failed: {result.structured_content}"
        text = result.content[0].text  # type: ignore[union-attr]
        payload = json.loads(text[text.index("{") :])
        assert isinstance(payload, dict) and payload["error"] and payload["code"], text
        return payload


def run_mcp(
    config_dir: Path, cwd: Path, scenario: Callable[[Tools, Client], Awaitable[None]]
) -> None:
    env = {
        **os.environ,
        "MLDBG_CONFIG_DIR": str(config_dir),
        "MLDBG_HOME": str(cwd / ".mldbg"),
    }
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "mldbg", "mcp"], env=env, cwd=str(cwd)
    )

    async def main() -> None:
        async with Client(server, read_timeout_seconds=120) as client:
            await scenario(Tools(client), client)

    try:
        anyio.run(main)
    except Exception as error:  # the SDK's task groups wrap a failing assertion in groups
        leaf: BaseException = error
        while isinstance(getattr(leaf, "exceptions", None), tuple) and leaf.exceptions:  # type: ignore[attr-defined]
            leaf = leaf.exceptions[0]  # type: ignore[attr-defined]
        if leaf is error:
            raise
        raise leaf from None


@pytest.fixture
def mcp(config_dir: Path, daemon: dict[str, Any], tmp_path: Path):  # type: ignore[no-untyped-def]
    return lambda scenario: run_mcp(config_dir, tmp_path, scenario)


def test_a_debug_session_through_mcp(mcp, write) -> None:
    script = write("prog.py", SCRIPT)
    inside = line_of(script, "in scale")

    async def scenario(tool: Tools, client: Client) -> None:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert {
            "start",
            "break",
            "continue",
            "step",
            "eval",
            "vars",
            "stack",
            "compare",
            "trace",
        } <= set(listed)
        assert all(t.description for t in listed.values())
        # one JSON per result: structured content (an object; the server checks its shape)
        assert listed["eval"].output_schema == {"type": "object"}

        state = await tool(
            "start",
            script="prog.py",
            breakpoints=[{"file": "prog.py", "line": inside}],
            session="mcp1",
        )
        assert state["state"] == "paused" and state["reason"] == "entry"

        state = await tool("continue", session="mcp1")
        assert state["state"] == "paused" and state["location"]["line"] == inside
        assert state["location"]["file"] == str(script)

        names = {v["name"]: v for v in (await tool("vars", session="mcp1"))["variables"]}
        assert "float32[2, 3]" in names["t"]["summary"] and names["t"]["type"] == "torch.Tensor"
        assert names["factor"]["summary"] == "2.0"

        value = await tool("eval", expression="(t * factor).sum().item()", session="mcp1")
        assert value["result"] == "30.0"
        frames = (await tool("stack", session="mcp1"))["frames"]
        assert [f["function"] for f in frames[:2]] == ["scale", "<module>"]
        chosen = await tool("frame", index=1, session="mcp1")
        assert chosen["frame"]["function"] == "<module>"
        assert (await tool("eval", expression="x.shape[0]", session="mcp1"))["result"] == "2"

        stepped = await tool("step", kind="over", session="mcp1")
        assert stepped["state"] == "paused" and stepped["location"]["line"] == inside + 1

        # Bad input comes back as a tool error carrying the daemon's JSON.
        bad_line = await tool.error("break", file="prog.py", line=1000, session="mcp1")
        assert bad_line["code"] == "no_code_at_line" and "nearest" in bad_line["error"]
        unknown = await tool.error("status", session="no-such-session")
        assert unknown["code"] == "unknown_session" and "mcp1" in unknown["sessions"]
        assert unknown["hint"].startswith("call sessions(")  # worded as a tool call, no CLI flags
        failed_eval = await tool.error("eval", expression="undefined_name", session="mcp1")
        assert "NameError" in failed_eval["error"] and failed_eval["code"] == "eval_error"
        missing = await tool.error("start", script="missing.py", session="mcp2")
        assert "missing.py" in missing["error"]
        nothing = await tool.error("start", session="mcp2")
        assert nothing["code"] == "bad_argument"
        # no stop at entry: `wait` waits for the first breakpoint, not merely the start
        first = await tool(
            "start",
            script="prog.py",
            breakpoints=[{"file": "prog.py", "line": inside}],
            stop_on_entry=False,
            wait=30,
            session="mcp3",
        )
        assert first["state"] == "paused" and first["reason"] == "breakpoint", first
        assert first["location"]["line"] == inside
        await tool("terminate", session="mcp3")
        hostile = await tool.error("pause", session="x/../../shutdown#")
        assert hostile["code"] == "bad_session_name"
        assert (await tool("status", session="mcp1"))["state"] == "paused"  # daemon still up
        invalid = await client.call_tool("step", {"kind": "sideways", "session": "mcp1"})
        assert invalid.is_error

        done = await tool("continue", session="mcp1")
        assert done["state"] == "exited" and done["exit_code"] == 0
        assert "total 30.0" in (await tool("output", session="mcp1"))["output"]
        sessions = {s["session"] for s in (await tool("sessions"))["sessions"]}
        assert "mcp1" in sessions
        assert any(r["script"].endswith("prog.py") for r in (await tool("runs"))["runs"])
        steps = (await tool("trace", session="mcp1"))["steps"]
        assert [s["reason"] for s in steps][:2] == ["entry", "breakpoint"]
        assert any(v["name"] == "t" for v in steps[1]["variables"])

    mcp(scenario)


def test_parity_through_mcp(mcp, write, tmp_path: Path) -> None:
    write("parity.py", PARITY)

    async def scenario(tool: Tools, client: Client) -> None:
        state = await tool("start", script="parity.py", stop_on_entry=False, session="mcp-parity")
        if state["state"] != "exited":
            state = await tool("wait", wait=120, session="mcp-parity")
        assert state["state"] == "exited" and state["exit_code"] == 0, state

        captures = {c["name"] for c in (await tool("captures"))["captures"]}
        assert {"ref", "port"} <= captures

        report = tmp_path / "report.html"
        result = await tool("compare", a="ref", b="port", html=str(report))
        assert result["ok"] is False
        assert result["first_divergence"]["module"] == "blocks.1.act"
        assert report.read_text().startswith("<!DOCTYPE html>")

        # bounded: failures only by default, the culprit first; passing entries on request
        assert all(not e["ok"] or e.get("culprit") for e in result["entries"])
        assert result["entries"][0]["culprit"] and result["left_out"]["passing"] > 0
        few = await tool("compare", a="ref", b="port", passing=True, limit=3)
        assert len(few["entries"]) == 3 and few["truncated"] and few["next"]["args"]["offset"] == 3
        assert few["entries"][0].get("culprit") and few["total"] > 3
        # the text form too, on every call (not only the process's first compare)
        for arguments in ({"passing": True}, {}):
            shown = await client.call_tool("compare", {"a": "ref", "b": "port", **arguments})
            assert "blocks.1.act" in shown.content[0].text, shown.content  # type: ignore[union-attr]

        clean = await tool("compare", a="ref", b="ref")
        assert clean["ok"] is True and clean["first_divergence"] is None

        renamed = await tool(
            "compare", a="ref", b="port", map={"ignore": ["blocks.1.act#*", "blocks.1#*"]}
        )
        assert renamed["first_divergence"]["module"] != "blocks.1.act"

        unknown = await tool.error("compare", a="ref", b="no-such-capture")
        assert unknown["code"] == "unknown_source" and "port" in unknown["error"] + json.dumps(
            unknown
        )
        (tmp_path / "corrupt.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{bad")
        corrupt = await tool.error("compare", a="ref", b=str(tmp_path / "corrupt.safetensors"))
        assert "corrupt.safetensors" in corrupt["error"]
        negative = await client.call_tool("compare", {"a": "ref", "b": "port", "rtol": -1})
        assert negative.is_error

    mcp(scenario)


def test_long_waits_report_progress_and_can_be_paused(mcp, write) -> None:
    write("slow.py", SLOW)

    async def scenario(tool: Tools, client: Client) -> None:
        await tool("start", script="slow.py", session="mcp-slow")
        notes: list[tuple[float, float | None, str | None]] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            notes.append((value, total, message))

        result = await client.call_tool(
            "continue", {"session": "mcp-slow", "wait": 60}, progress_callback=progress
        )
        state = result.structured_content
        assert state is not None and state["state"] == "exited", result.content
        assert notes and notes[0][1] == 60 and "still running" in str(notes[0][2])

        await tool("start", script="slow.py", session="mcp-slow", replace=True)
        running = await tool("continue", wait=0.5, session="mcp-slow")
        assert running["state"] == "running"
        paused = await tool("pause", session="mcp-slow")
        assert paused["state"] == "paused" and paused["location"]["file"].endswith("slow.py")
        ended = await tool("terminate", session="mcp-slow")
        assert ended["state"] == "exited"

    mcp(scenario)


UNDECODABLE = """
import os
name = os.fsdecode(b"caf\\xe9.txt")  # any non-UTF-8 file name on Linux
marker = 0  # stop here
"""


def test_undecodable_text_never_kills_the_server(mcp, write) -> None:
    """A lone surrogate (``os.fsdecode`` of bytes that are not UTF-8) reached the SDK's
    stdout writer raw and the server process died; every later call got "Connection
    closed".  It comes back with the undecodable byte escaped, and the server lives on."""
    script = write("undecodable.py", UNDECODABLE)
    stop = line_of(script, "stop here")

    async def scenario(tool: Tools, client: Client) -> None:
        await tool(
            "start",
            script="undecodable.py",
            stop_on_entry=False,
            breakpoints=[{"file": "undecodable.py", "line": stop}],
            session="mcp-bytes",
        )
        state = await tool("wait", session="mcp-bytes")
        assert state["state"] == "paused", state
        value = await tool("eval", expression="name", session="mcp-bytes")
        assert value["summary"]["value"] == "caf\\xe9.txt", value  # the byte, escaped
        assert value["result"] == "'caf\\udce9.txt'"  # Python's own repr escapes it too
        listed = {v["name"]: v for v in (await tool("vars", session="mcp-bytes"))["variables"]}
        assert "caf\\udce9.txt" in listed["name"]["summary"]
        # an error carrying the bytes, and a surrogate sent as an argument
        failed = await tool.error("eval", expression="open(name)", session="mcp-bytes")
        assert "FileNotFoundError" in failed["error"] and "caf" in failed["error"]
        raw = await tool("eval", expression="print(name) or name[3]", session="mcp-bytes")
        assert raw["summary"]["value"] == "\\xe9" and "caf\\xe9.txt" in raw["output"], raw
        assert (await tool("status", session="mcp-bytes"))["state"] == "paused"
        await tool("terminate", session="mcp-bytes")

    mcp(scenario)


def test_run_store_tools_take_a_session(mcp, write) -> None:
    """``runs``, ``checkpoints``, ``captures``, ``tensors``, ``clean`` and ``compare`` read
    the run store of the session named by ``session`` (they answered ``internal``)."""
    write("parity.py", PARITY)

    async def scenario(tool: Tools, client: Client) -> None:
        state = await tool("start", script="parity.py", stop_on_entry=False, session="mcp-store")
        if state["state"] != "exited":
            state = await tool("wait", wait=120, session="mcp-store")
        assert state["state"] == "exited", state
        runs = await tool("runs", session="mcp-store")
        assert runs["runs"] and runs["runs"][0]["script"].endswith("parity.py")
        assert "checkpoints" in await tool("checkpoints", session="mcp-store")
        captures = {c["name"] for c in (await tool("captures", session="mcp-store"))["captures"]}
        assert {"ref", "port"} <= captures
        assert "tensors" in await tool("tensors", session="mcp-store")
        assert (await tool("compare", a="ref", b="port", session="mcp-store"))["ok"] is False
        assert "removed" in await tool("clean", dry_run=True, session="mcp-store")
        missing = await tool.error("runs", session="no-such-session")
        assert missing["code"] in ("unknown_session", "no_such_session"), missing

    mcp(scenario)


def test_the_tool_list_is_agent_sized(config_dir: Path, daemon: dict[str, Any]) -> None:
    """The tool list is in every agent's context on every turn: it was 107 KB (each state
    verb repeated a 5 KB output schema; descriptions spoke CLI, ``--all``).  Measured as
    the real SDK client receives it: under 25 KB, every verb still a tool, every argument
    still there, and no CLI flag in any description."""
    import re

    from mldbg import verbs

    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mldbg", "mcp"],
        env={**os.environ, "MLDBG_CONFIG_DIR": str(config_dir)},
    )
    listed: list[Any] = []

    async def main() -> None:
        async with Client(server, read_timeout_seconds=60) as client:
            listed.append(await client.list_tools())

    anyio.run(main)
    wire = listed[0].model_dump_json(by_alias=True, exclude_none=True)
    assert len(wire.encode()) < 25_000, len(wire.encode())
    tools = {tool.name: tool for tool in listed[0].tools}
    assert set(tools) == {verb.name for verb in verbs.VERBS if verb.mcp}
    for verb in verbs.VERBS:
        if verb.mcp:
            arguments = set(tools[verb.name].input_schema["properties"])
            assert {a.name for a in verb.args if a.mcp} <= arguments, verb.name
    flags = re.findall(r"(?<![\w-])--[a-z][\w-]*", wire)
    assert not flags, flags


def test_lone_surrogates_in_arguments_leave_the_server_serving(
    config_dir: Path, daemon: dict[str, Any]
) -> None:
    """No SDK client can send a lone surrogate (it cannot encode one), but JSON can escape
    it: raw lines holding ``\\udcff`` in arguments are answered with a JSON-RPC error (not
    Unicode text: ``mcp/frames.py``), and the next call is served."""
    import subprocess

    env = {**os.environ, "MLDBG_CONFIG_DIR": str(config_dir)}
    server = subprocess.Popen(
        [sys.executable, "-m", "mldbg", "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert server.stdin is not None and server.stdout is not None

    def send(line: str) -> None:
        server.stdin.write(line.encode() + b"\n")  # type: ignore[union-attr]
        server.stdin.flush()  # type: ignore[union-attr]

    try:
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}}
        hello["clientInfo"] = {"name": "raw", "version": "0"}
        send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}))
        assert json.loads(server.stdout.readline())["id"] == 1
        send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        call = (
            '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"%s","arguments":%s}}'
        )
        send(call % (2, "status", '{"session":"x\\udcff"}'))
        send(call % (3, "eval", '{"expression":"\\udcff","session":"\\ud800"}'))
        send(call % (4, "sessions", "{}"))
        answer = json.loads(server.stdout.readline())
        while answer.get("id") in (2, 3):  # answered: with an error, never a crash
            assert answer["error"]["code"] == -32600, answer
            answer = json.loads(server.stdout.readline())
        assert answer["id"] == 4 and "sessions" in answer["result"]["structuredContent"]
    finally:
        server.kill()
        server.wait()
