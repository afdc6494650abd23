"""A stopped thread serving the daemon's commands until it is told to resume.

Everything a paused session answers (stack, variables, evaluation) runs here, on the
paused thread itself: MLX streams and CUDA contexts belong to a thread, so evaluating
``x.sum()`` anywhere else could see the wrong device state.
"""

from __future__ import annotations

import linecache
import queue
import threading
import traceback
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from .evaluation import EvalError, FrameNamespace
from .paths import canonical_code_file, is_mldbg_file

CODE_CONTEXT = 5
MAX_VARIABLES = 500

# Commands that only make sense on a paused thread; the reader thread routes them here.
PAUSED_COMMANDS = frozenset(
    {"continue", "step", "stack", "select_frame", "variables", "eval", "location"}
)


class CommandError(Exception):
    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.extra = extra


@dataclass
class Resume:
    """How the paused thread goes on: ``continue``, or a step of some kind."""

    kind: str = "continue"
    into_libraries: bool = False


def source_context(file: str, line: int, radius: int = CODE_CONTEXT) -> list[list[Any]]:
    lines = []
    for n in range(max(1, line - radius), line + radius + 1):
        text = linecache.getline(file, n)
        if not text and n > line:
            break
        lines.append([n, text.rstrip("\n")])
    return lines


def describe_frame(
    frame: FrameType, line: int, index: int | None = None, code: bool = False
) -> dict[str, Any]:
    info: dict[str, Any] = {
        "file": canonical_code_file(frame.f_code.co_filename),
        "line": line,
        "function": frame.f_code.co_name,
    }
    if index is not None:
        info = {"index": index, **info}
    if code:
        info["code"] = source_context(frame.f_code.co_filename, line)
    return info


def frames_from_stack(frame: FrameType | None) -> list[tuple[FrameType, int]]:
    """Innermost first, ending above the agent's frames (and runpy's) that started the script."""
    frames = []
    while frame is not None:
        if is_mldbg_file(canonical_code_file(frame.f_code.co_filename)):
            break
        frames.append((frame, frame.f_lineno))
        frame = frame.f_back
    return frames


def frames_from_traceback(tb: TracebackType | None) -> list[tuple[FrameType, int]]:
    frames = []
    while tb is not None:
        if not is_mldbg_file(canonical_code_file(tb.tb_frame.f_code.co_filename)):
            frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    frames.reverse()
    return frames


def strip_agent_frames(tb: TracebackType | None) -> TracebackType | None:
    """Drop the agent's frames at the bottom of a traceback: the user never called them."""
    while tb is not None and is_mldbg_file(canonical_code_file(tb.tb_frame.f_code.co_filename)):
        tb = tb.tb_next
    return tb


def exception_info(exc: BaseException) -> dict[str, Any]:
    tb = strip_agent_frames(exc.__traceback__)
    return {
        "type": type(exc).__qualname__,
        "message": _safe_str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, tb)),
    }


def _safe_str(value: object) -> str:
    try:
        return str(value)
    except Exception as exc:
        return f"<str failed: {type(exc).__name__}>"


class PausedThread:
    """One stop: the frames, the selected one, and the queue of commands to serve."""

    def __init__(
        self,
        frames: list[tuple[FrameType, int]],
        reason: str,
        post_mortem: bool = False,
        details: dict[str, Any] | None = None,
    ) -> None:
        self.frames = frames
        self.reason = reason
        self.post_mortem = post_mortem
        self.details = details or {}
        self.selected = 0
        self.thread = threading.current_thread()
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self._namespaces: dict[int, FrameNamespace] = {}

    # -- state ------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        frame, line = self.frames[self.selected] if self.frames else (None, 0)
        return {
            "reason": self.reason,
            "location": describe_frame(frame, line, code=True) if frame is not None else None,
            "frame_index": self.selected,
            "thread": {"id": self.thread.ident, "name": self.thread.name},
            **self.details,
        }

    # -- the loop ---------------------------------------------------------------------------

    def serve(self, respond: Any) -> Resume:
        """Answer commands until one resumes the thread; ``respond(msg, ok, result)`` replies."""
        while True:
            message = self.queue.get()
            if message.get("cmd") == "__detach__":
                return Resume()
            cmd = message.get("cmd", "")
            args = message.get("args") or {}
            try:
                if cmd == "continue":
                    respond(message, True, {"resumed": True})
                    return Resume()
                if cmd == "step":
                    kind = args.get("kind", "over")
                    if kind not in ("over", "into", "out"):
                        raise CommandError(f"unknown step kind {kind!r}: use over, into or out")
                    respond(message, True, {"resumed": True})
                    return Resume(kind, bool(args.get("into_libraries")))
                result = getattr(self, f"cmd_{cmd}")(**args)
            except CommandError as exc:
                respond(message, False, str(exc), exc.extra)
            except EvalError as exc:
                respond(message, False, str(exc), exc.details)
            except Exception as exc:  # a bug of ours must not leave the script hanging
                respond(message, False, f"internal error in {cmd}: {type(exc).__name__}: {exc}")
            else:
                respond(message, True, result)

    def drain(self, respond: Any) -> None:
        """Refuse commands that arrived after the resume."""
        while True:
            try:
                message = self.queue.get_nowait()
            except queue.Empty:
                return
            if message.get("cmd") != "__detach__":
                respond(message, False, "the script is running again; pause it first")

    # -- commands ---------------------------------------------------------------------------

    def cmd_location(self) -> dict[str, Any]:
        return self.state()

    def cmd_stack(self) -> dict[str, Any]:
        return {
            "frames": [describe_frame(f, line, i) for i, (f, line) in enumerate(self.frames)],
            "selected": self.selected,
        }

    def cmd_select_frame(self, index: int | None = None, move: int = 0) -> dict[str, Any]:
        target = self.selected + int(move) if index is None else int(index)
        if not 0 <= target < len(self.frames):
            where = "the outermost" if target >= len(self.frames) else "the innermost"
            raise CommandError(
                f"no frame {target}: frames are 0 (innermost) to {len(self.frames) - 1}; "
                f"frame {self.selected} is selected"
                + (f" ({where} reached)" if index is None else ""),
                frames=len(self.frames),
            )
        self.selected = target
        frame, line = self.frames[target]
        return {"selected": target, "frame": describe_frame(frame, line, target, code=True)}

    def cmd_variables(self, all: bool = False) -> dict[str, Any]:
        from .. import summary

        frame, line = self.frames[self.selected]
        namespace = self._namespace()
        scopes: list[tuple[str, dict[str, Any]]] = [("local", dict(namespace.locals))]
        if all and namespace.locals is not frame.f_globals:
            scopes.append(("global", dict(frame.f_globals)))
        variables: list[dict[str, Any]] = []
        truncated = False
        for scope, values in scopes:
            for name, value in values.items():
                if scope == "global" and name.startswith("__") and name.endswith("__"):
                    continue
                if len(variables) >= MAX_VARIABLES:
                    truncated = True
                    break
                variables.append(
                    {
                        "name": name,
                        "scope": scope,
                        "type": summary.type_name(value),
                        "summary": summary.one_line(value),
                    }
                )
        return {
            "frame": describe_frame(frame, line, self.selected),
            "variables": variables,
            "truncated": truncated,
        }

    def cmd_eval(self, expression: str) -> dict[str, Any]:
        from .. import summary

        value = self._namespace().run(expression)
        tensor = summary.is_tensor(value)
        return {
            "expression": expression,
            "result": summary.one_line(value, 1000) if tensor else summary.safe_repr(value),
            "type": summary.type_name(value),
            "summary": summary.summarize(value),
        }

    def _namespace(self) -> FrameNamespace:
        frame, _ = self.frames[self.selected]
        namespace = self._namespaces.get(self.selected)
        if namespace is None:
            namespace = FrameNamespace(frame, live=not self.post_mortem)
            self._namespaces[self.selected] = namespace
        return namespace
