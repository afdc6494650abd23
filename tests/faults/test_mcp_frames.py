"""Raw JSON-RPC frames written to a real ``mldbg mcp``: every request gets an answer.

No SDK client can send most of these (it cannot encode a lone surrogate, it never sends
malformed JSON), so they are written as bytes to the server's stdin.  Each bad frame is
answered with a JSON-RPC error (``id`` null where the frame's id is unknown), within
the documented bounds (``mcp/frames.py``: ``MAX_FRAME``, ``MAX_DEPTH``), and the next
request is served as if nothing had happened.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mldbg.mcp.frames import MAX_DEPTH, MAX_FRAME


class RawMcp:
    """``python -m mldbg mcp`` driven by raw lines on its stdin."""

    def __init__(self, config_dir: Path) -> None:
        env = {**os.environ, "MLDBG_CONFIG_DIR": str(config_dir)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mldbg", "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.pending = b""
        hello = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        }
        assert self.request({"id": 1, "method": "initialize", "params": hello})["id"] == 1
        self.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode())

    def send(self, frame: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(frame + b"\n")
        self.process.stdin.flush()

    def receive(self, timeout: float = 60) -> dict[str, Any]:
        """The next line the server writes (a hang guard, not a timing claim)."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            if not ready:
                pytest.fail(f"no answer within {timeout:.0f} s")
            chunk = os.read(fd, 1 << 20)
            assert chunk, "the MCP server closed its stdout"
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(json.dumps({"jsonrpc": "2.0", **message}).encode())
        return self.receive()

    def still_serves(self, request_id: int) -> None:
        answer = self.request({"id": request_id, "method": "ping"})
        assert answer == {"jsonrpc": "2.0", "id": request_id, "result": {}}, answer

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def raw(config_dir: Path, daemon: dict[str, Any]) -> Iterator[RawMcp]:
    server = RawMcp(config_dir)
    yield server
    server.close()


def _call(frame_id: object, arguments: str) -> bytes:
    """A tools/call frame with ``arguments`` written as given (raw JSON text)."""
    head = '{"jsonrpc": "2.0", "id": ' + json.dumps(frame_id) + ', "method": "tools/call", '
    return (head + '"params": {"name": "sessions", "arguments": ' + arguments + "}}").encode()


BAD_FRAMES = {
    # name: (frame, the id the error answers with, JSON-RPC code)
    "malformed JSON": (b'{"jsonrpc": "2.0", "id": 2, "method": ', None, -32700),
    "a lone surrogate": (_call(3, '{"session": "\\udcff"}'), 3, -32600),
    "a lone surrogate in a key": (_call("s", '{"\\ud800": 1}'), "s", -32600),
    "a raw NUL": (_call(4, '{"session": "a\x00b"}'), None, -32700),
    "100,000-deep nesting": (_call(5, "[" * 100_000 + "]" * 100_000), None, -32600),
    "nesting past the bound": (
        _call(6, '{"x": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}"),
        6,
        -32600,
    ),
    "not UTF-8": (b'{"jsonrpc": "2.0", "id": 7, "method": "ping", "x": "\xff\xfe"}', None, -32700),
    "an array": (b'[{"jsonrpc": "2.0", "id": 8, "method": "ping"}]', None, -32600),
    "a string": (b'"ping"', None, -32600),
    "no method": (b'{"jsonrpc": "2.0", "id": 9}', 9, -32600),
    "the wrong version": (b'{"jsonrpc": "1.0", "id": 10, "method": "ping"}', 10, -32600),
    "a boolean id": (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', None, -32600),
}


@pytest.mark.parametrize("name", list(BAD_FRAMES))
def test_a_bad_frame_gets_a_json_rpc_error_and_the_next_request_an_answer(
    raw: RawMcp, name: str
) -> None:
    frame, frame_id, code = BAD_FRAMES[name]
    raw.send(frame)
    answer = raw.receive()
    assert answer["jsonrpc"] == "2.0" and answer["id"] == frame_id, answer
    assert answer["error"]["code"] == code and answer["error"]["message"], answer
    assert len(json.dumps(answer)) < 1_000  # an error says what was wrong, briefly
    raw.still_serves(100)


def test_a_frame_past_the_size_bound_is_refused_without_being_held(raw: RawMcp) -> None:
    filler = b"a" * (MAX_FRAME + 1024)
    raw.send(b'{"jsonrpc": "2.0", "id": 11, "method": "ping", "params": {"x": "' + filler + b'"}}')
    answer = raw.receive()
    assert answer["id"] is None and answer["error"]["code"] == -32600, answer
    assert str(MAX_FRAME) in answer["error"]["message"]
    raw.still_serves(101)
    # one inside the bound is served
    inside = b"a" * (MAX_FRAME // 2)
    raw.send(b'{"jsonrpc": "2.0", "id": 12, "method": "ping", "params": {"x": "' + inside + b'"}}')
    assert raw.receive() == {"jsonrpc": "2.0", "id": 12, "result": {}}


def test_bad_frames_in_a_burst_each_get_their_answer_and_tools_still_work(raw: RawMcp) -> None:
    for frame, _, _ in BAD_FRAMES.values():
        raw.send(frame)
    answers = [raw.receive() for _ in BAD_FRAMES]
    assert [a["id"] for a in answers] == [i for _, i, _ in BAD_FRAMES.values()]
    assert all("error" in a for a in answers), answers
    # nesting inside the bound reaches the tool, and is answered by it
    raw.send(_call(13, '{"x": ' + "[" * (MAX_DEPTH - 8) + "]" * (MAX_DEPTH - 8) + "}"))
    served = raw.receive()
    assert served["id"] == 13 and "result" in served, served
    listed = raw.request({"id": 14, "method": "tools/call", "params": {"name": "sessions"}})
    assert listed["id"] == 14 and "sessions" in listed["result"]["structuredContent"], listed
