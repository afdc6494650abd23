"""``mldbg mcp``'s stdio transport: every frame gets an answer, within bounds.

The SDK's own stdio transport reads a line of any size, and a line it cannot validate
(malformed JSON, a raw NUL, a lone-surrogate escape such as ``"\\udcff"``, 100,000-deep
nesting) goes unanswered: the client waits forever.  Here each line (one JSON-RPC frame)
is checked before the server sees it, and a frame it cannot take is answered at once
with a JSON-RPC error: its ``id`` when the frame has one, else ``null``, as JSON-RPC 2.0
says.  The bounds are documented in docs/mcp.md:

* ``MAX_FRAME`` bytes per frame: a longer one is refused (``-32600``) and skipped without
  being held in memory;
* ``MAX_DEPTH`` levels of nesting (``-32600``): no argument of any tool nests deeper;
* UTF-8 text and JSON (``-32700``, a parse error), no lone surrogate in any string
  (``-32600``: not Unicode text, and nothing downstream could encode it);
* a JSON-RPC message (``-32600``).

What the SDK's transport also does is kept: while serving, fd 0 reads the null device and
fd 1 writes to stderr, so nothing the server or a child prints can corrupt the wire.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import BinaryIO, TypeGuard

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.mcpserver import MCPServer
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from .. import budget

MAX_FRAME = 16 << 20  # bytes of one frame (an evaluation's 100,000 characters fit many times)
MAX_DEPTH = 64  # levels of nesting in one frame (a tool's arguments nest a few)
MAX_ID = 1_000  # characters of a string id an error answer echoes (longer: id null)
_CHUNK = 1 << 16  # how much of an over-long frame is read at a time, to skip it


def check_frame(raw: bytes) -> types.JSONRPCMessage:
    """The message a frame holds, or the JSON-RPC error that answers it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _error(None, types.PARSE_ERROR, f"not UTF-8 text: {exc.reason} at byte {exc.start}")
    try:
        data = json.loads(text)
    except RecursionError:
        return _error(None, types.INVALID_REQUEST, _too_deep())
    except ValueError as exc:  # malformed, a raw control character (NUL) in a string
        return _error(None, types.PARSE_ERROR, f"not JSON: {exc}")
    if not isinstance(data, dict):  # MCP has no batches: one message, an object
        kind = "an array" if isinstance(data, list) else type(data).__name__
        return _error(None, types.INVALID_REQUEST, f"not a JSON-RPC message: {kind}, not an object")
    frame_id = _id_of(data)
    problem = _shape_problem(data)
    if problem is None and "method" in data and "id" in data and not _valid_id(data["id"]):
        # not a notification either: the SDK would take it for one and never answer
        problem = "a request's id is a string or an integer"
    if problem is not None:
        return _error(frame_id, types.INVALID_REQUEST, problem)
    try:
        return types.jsonrpc_message_adapter.validate_python(data, by_name=False)
    except ValidationError as exc:
        said = "invalid"
        for first in exc.errors()[:1]:
            said = f"{'.'.join(str(p) for p in first['loc']) or 'the frame'}: {first['msg']}"
        return _error(frame_id, types.INVALID_REQUEST, f"not a JSON-RPC 2.0 message: {said}")


def _id_of(data: dict[str, object]) -> int | str | None:
    """The frame's id, where it has one an answer can echo: an integer (not a boolean),
    or a string of Unicode text at most ``MAX_ID`` characters long (an error answer stays
    small)."""
    found = data.get("id")
    if not _valid_id(found):
        return None
    if isinstance(found, str) and (len(found) > MAX_ID or _lone_surrogate(found) is not None):
        return None
    return found


def _valid_id(value: object) -> TypeGuard[str | int]:
    return isinstance(value, str | int) and not isinstance(value, bool)


def _lone_surrogate(text: str) -> int | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return ord(text[exc.start])
    return None


def _shape_problem(data: object) -> str | None:
    """What no frame may hold, found without recursion: nesting past ``MAX_DEPTH`` or a
    lone surrogate (JSON can escape one; it is not Unicode text)."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict | list):
            if level > MAX_DEPTH:
                return _too_deep()
            items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
            for key, item in items:
                if isinstance(key, str):
                    stack.append((key, level + 1))
                stack.append((item, level + 1))
        elif isinstance(value, str) and (code := _lone_surrogate(value)) is not None:
            return f"a string holds a lone surrogate (\\u{code:04x}): not Unicode text"
    return None


def _too_deep() -> str:
    return f"nested deeper than {MAX_DEPTH} levels"


def _error(frame_id: int | str | None, code: int, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(
        jsonrpc="2.0",
        id=frame_id,
        error=types.ErrorData(code=code, message=budget.capped(message, 500)),
    )


OVER_LONG = b""  # what _frames yields for a frame over MAX_FRAME (blank lines are skipped)


def _frames(stream: BinaryIO) -> Iterator[bytes]:
    """The frames of ``stream``, one per line; ``OVER_LONG`` for one longer than
    ``MAX_FRAME``, read through to its end in chunks, never held whole."""
    while True:
        line = stream.readline(MAX_FRAME + 1)
        if not line:
            return
        if len(line) > MAX_FRAME and not line.endswith(b"\n"):
            while True:
                rest = stream.readline(_CHUNK)
                if not rest or rest.endswith(b"\n"):
                    break
            yield OVER_LONG
        elif line.strip():
            yield line


def answer_to(frame: bytes) -> types.JSONRPCMessage:
    """What the server gets for ``frame``: its message, or the error that answers it."""
    if frame is OVER_LONG or not frame:
        return _error(None, types.INVALID_REQUEST, f"a frame over {MAX_FRAME} bytes")
    return check_frame(frame)


@contextlib.contextmanager
def _claimed_stdio() -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """The wire, on private copies of fds 0 and 1, which point at the null device and at
    stderr while serving (put back afterwards).  The copies are never closed: a thread
    may still block reading one after the server is done (as the SDK's transport does)."""
    wire_in, wire_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    try:
        yield os.fdopen(wire_in, "rb", closefd=False), os.fdopen(wire_out, "wb", closefd=False)
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        with contextlib.suppress(OSError):
            os.dup2(wire_in, 0)
            os.dup2(wire_out, 1)


def _write(writer: BinaryIO, data: bytes) -> None:
    writer.write(data)
    writer.flush()


async def serve(mcp: MCPServer) -> None:
    """Serve ``mcp`` over stdio, every frame checked (``check_frame``) and answered."""
    server = mcp._lowlevel_server  # what the SDK's own stdio transport runs
    with _claimed_stdio() as (reader, writer):
        read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)

        async def read_frames() -> None:
            frames = _frames(reader)
            async with read_send, write_send.clone() as answer:
                while (frame := await anyio.to_thread.run_sync(next, frames, None)) is not None:
                    checked = answer_to(frame)
                    if isinstance(checked, types.JSONRPCError):
                        await answer.send(SessionMessage(checked))
                    else:
                        await read_send.send(SessionMessage(checked))

        async def write_frames() -> None:
            async with write_receive:
                async for message in write_receive:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    # a lone surrogate left in a text: an escape, never a crash of the writer
                    data = text.encode("utf-8", "backslashreplace") + b"\n"
                    await anyio.to_thread.run_sync(_write, writer, data)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read_frames)
            tasks.start_soon(write_frames)
            async with write_send:
                await server.run(read_receive, write_send, server.create_initialization_options())
