"""A stopped thread serving the daemon's commands until it is told to resume.

Everything a paused session answers (stack, variables, evaluation) runs here, on the
paused thread itself: MLX streams and CUDA contexts belong to a thread, so evaluating
``x.sum()`` anywhere else could see the wrong device state.
"""

from __future__ import annotations

import contextlib
import fnmatch
import linecache
import queue
import sys
import threading
import traceback
from dataclasses import dataclass
from types import CodeType, FrameType, TracebackType
from typing import TYPE_CHECKING, Any, TextIO, cast

from .. import budget
from ..errors import INTERNAL, NO_SUCH_FRAME, NOT_PAUSED, CommandError
from . import protocol as P
from .compiling import compile_text
from .evaluation import EvalError, FrameNamespace
from .interrupt import EvalInterrupt, Interruptible
from .paths import canonical_code_file, is_library_file, is_mldbg_file
from .protocol import ExceptionInfo, StopDetails, TraceRecord

if TYPE_CHECKING:
    from .. import results as R
    from .wire import Respond

CODE_CONTEXT = 5
MAX_VARIABLES = 500
TRACE_VARIABLES = 20  # variables recorded with each stop in the trace
TRACE_FRAMES = 10
TRACE_VALUE = 200


@dataclass
class Resume:
    """How the paused thread goes on: ``continue``, or a step of some kind."""

    kind: str = "continue"
    into_libraries: bool = False
    released: bool = False  # another thread was resumed: this one goes on with it


def source_context(file: str, line: int, radius: int = CODE_CONTEXT) -> list[list[int | str]]:
    """``[[number, text], ...]`` around ``line``: the code a stop shows."""
    lines: list[list[int | str]] = []
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


def exception_info(exc: BaseException) -> ExceptionInfo:
    """An exception for the daemon, bounded: its message and traceback may be megabytes."""
    tb = strip_agent_frames(exc.__traceback__)
    message, message_cut = budget.cap(_safe_str(exc), budget.MESSAGE)
    lines = traceback.format_exception(type(exc), exc, tb)
    text, traceback_cut = budget.cap(
        "".join(budget.capped(line, budget.TRACEBACK) for line in lines), budget.TRACEBACK, "tail"
    )
    info: ExceptionInfo = {"type": type(exc).__qualname__, "message": message, "traceback": text}
    if message_cut or traceback_cut:
        info["truncated"] = True
    return info


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
        details: StopDetails | None = None,
    ) -> None:
        self.frames = frames
        self.reason = reason
        self.post_mortem = post_mortem
        self.details: StopDetails = details or {}
        self.selected = 0
        self.thread = threading.current_thread()
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self._namespaces: dict[int, FrameNamespace] = {}
        self.guard = Interruptible()
        self.watch_values: list[R.Watch] = []
        self.resumed = False  # told to go on: a pause from now on is for the next stop
        self.handlers = P.handlers_of(self)  # the paused commands, by name

    # -- state ------------------------------------------------------------------------------

    def state(self) -> P.Stop:
        from .. import memory

        frame, line = self.frames[self.selected] if self.frames else (None, 0)
        stop: P.Stop = {
            "reason": self.reason,
            "location": (
                cast("R.Location", describe_frame(frame, line, code=True)) if frame else None
            ),
            "frame_index": self.selected,
            "thread": {"id": self.thread.ident, "name": self.thread.name},
            **self.details,  # the stop's own: breakpoint, exception, checkpoint, tripwire...
            "memory": memory.snapshot(),  # MLX / torch allocators and the process, at this stop
        }
        if self.watch_values:
            stop["watches"] = self.watch_values
        return stop

    @P.serves(P.WATCH_VALUES)
    def cmd_watch_values(self, items: list[dict[str, Any]]) -> R.Watches:
        """The watch expressions' values in the selected frame now (a watch set while paused)."""
        values: list[R.Watch] = []
        for item in items[:64]:
            expression = str(item.get("expression", ""))
            try:
                code = compile_text(expression, "<watch>", "eval")
            except (SyntaxError, ValueError) as exc:
                values.append({**cast("R.Watch", item), "error": f"{type(exc).__name__}: {exc}"})
                continue
            values.append(self.watch_value(int(item.get("id", 0)), expression, code))
        self.watch_values = values
        return {"watches": values}

    def interrupt(self) -> bool:
        """Interrupt the evaluation this thread is running, if any (``pause`` while paused)."""
        return self.guard.interrupt()

    def watch_value(self, watch_id: int, expression: str, code: CodeType) -> R.Watch:
        """One watch expression in the selected frame, as one bounded line, never raising."""
        from .. import summary
        from .watches import VALUE_CHARS, WATCH_TIMEOUT

        item: R.Watch = {"id": watch_id, "expression": expression}
        try:
            frame, _ = self.frames[self.selected]
            namespace = self._namespace()
            with self.guard.running(WATCH_TIMEOUT):
                value = eval(code, frame.f_globals, namespace.locals)
            item["value"] = summary.one_line(value, VALUE_CHARS)
        except EvalInterrupt as exc:
            item["error"] = f"{type(exc).__name__}: {exc.reason}"
        except Exception as exc:
            item["error"] = budget.capped(f"{type(exc).__name__}: {_safe_str(exc)}", VALUE_CHARS)
        return item

    # -- the loop ---------------------------------------------------------------------------

    def serve(self, respond: Respond) -> Resume:
        """Answer commands until one resumes the thread; ``respond(msg, ok, result)`` replies."""
        while True:
            message = self.queue.get()
            cmd = str(message.get("cmd", ""))
            if cmd == P.DETACH:
                return Resume()
            if cmd == P.RELEASE:
                return Resume(released=True)
            args = message.get("args") or {}
            try:
                if cmd == P.CONTINUE.name:
                    self.resumed = True
                    respond(message, True, {"resumed": True})
                    return Resume()
                if cmd == P.STEP.name:
                    kind = args.get("kind", "over")
                    if kind not in P.STEP_KINDS:
                        raise CommandError(f"unknown step kind {kind!r}: use over, into or out")
                    self.resumed = True
                    respond(message, True, {"resumed": True})
                    return Resume(kind, bool(args.get("into_libraries")))
                result = self.handlers[cmd](**args)
            except CommandError as exc:
                respond(message, False, str(exc), exc.extra, exc.code)
            except EvalError as exc:
                respond(message, False, str(exc), exc.details, exc.code)
            except Exception as exc:  # a bug of ours must not leave the script hanging
                respond(
                    message,
                    False,
                    budget.capped(f"internal error in {cmd}: {type(exc).__name__}: {exc}", 2000),
                    None,
                    INTERNAL,
                )
            else:
                respond(message, True, result)

    def drain(self, respond: Respond) -> None:
        """Refuse commands that arrived after the resume."""
        while True:
            try:
                message = self.queue.get_nowait()
            except queue.Empty:
                return
            if message.get("cmd") not in (P.DETACH, P.RELEASE):
                respond(
                    message,
                    False,
                    "the script is running again; pause it first",
                    None,
                    NOT_PAUSED,
                )

    # -- commands ---------------------------------------------------------------------------

    @P.serves(P.LOCATION)
    def cmd_location(self) -> R.State:
        # a stop's keys are State's, whose nested objects results.py types only as dicts
        return cast("R.State", self.state())

    @P.serves(P.STACK)
    def cmd_stack(self, limit: int = 30, all: bool = False) -> R.Stack:
        """Frames innermost first; library frames hidden unless ``all`` (indices stay true)."""
        frames: list[R.Frame] = []
        hidden = 0
        for i, (f, line) in enumerate(self.frames):
            info = describe_frame(f, line, i)
            info["library"] = is_library_file(info["file"])
            if info["library"] and not all and i != self.selected:
                hidden += 1
                continue
            frames.append(cast("R.Frame", info))
        total = len(frames)
        shown = frames[:limit]
        result: R.Stack = {
            "frames": shown,
            "selected": self.selected,
            "hidden_library_frames": hidden,
            "total": total,
        }
        if total > len(shown):
            result["truncated"] = True
            result["shown"] = len(shown)
            result["next"] = {"verb": "stack", "args": {"limit": min(total, 1000), "all": all}}
        return result

    @P.serves(P.FRAME)
    def cmd_frame(self, index: int | None = None, move: int = 0) -> R.FrameSelected:
        target = self.selected + int(move) if index is None else int(index)
        note = None
        if index is None and move and self.frames and not 0 <= target < len(self.frames):
            # `up 50` from frame 2 of 5: go as far as there is, and say so
            clamped = max(0, min(target, len(self.frames) - 1))
            edge = "outermost" if target > clamped else "innermost"
            note = (
                f"stopped at the {edge} frame ({clamped}) of {len(self.frames)}"
                if clamped != self.selected
                else f"already at the {edge} frame ({clamped}) of {len(self.frames)}"
            )
            target = clamped
        if not 0 <= target < len(self.frames):
            where = "the outermost" if target >= len(self.frames) else "the innermost"
            raise CommandError(
                f"no frame {target}: frames are 0 (innermost) to {len(self.frames) - 1}; "
                f"frame {self.selected} is selected"
                + (f" ({where} reached)" if index is None else ""),
                NO_SUCH_FRAME,
                frames=len(self.frames),
            )
        self.selected = target
        frame, line = self.frames[target]
        result: R.FrameSelected = {
            "selected": target,
            "frame": describe_frame(frame, line, target, code=True),
        }
        if note:
            result["note"] = note
            result["clamped"] = True
        return result

    @P.serves(P.VARS)
    def cmd_vars(
        self, all: bool = False, filter: str | None = None, offset: int = 0, limit: int = 50
    ) -> R.Variables:
        from .. import summary

        frame, line = self.frames[self.selected]
        namespace = self._namespace()
        scopes: list[tuple[str, dict[str, object]]] = [("local", dict(namespace.locals))]
        if all and namespace.locals is not frame.f_globals:
            scopes.append(("global", dict(frame.f_globals)))
        matching: list[tuple[str, str, object]] = []
        for scope, values in scopes:
            for name, value in values.items():
                if scope == "global" and name.startswith("__") and name.endswith("__"):
                    continue
                if filter and not fnmatch.fnmatchcase(name, filter):
                    continue
                matching.append((name, scope, value))
        page = matching[offset : offset + limit]
        variables: list[R.Variable] = [
            {
                "name": name,
                "scope": scope,
                "type": summary.type_name(value),
                "summary": summary.one_line(value),
            }
            for name, scope, value in page
        ]
        result: R.Variables = {
            "frame": describe_frame(frame, line, self.selected),
            "variables": variables,
            "total": len(matching),
            "shown": len(variables),
            "truncated": offset + len(page) < len(matching),
        }
        if result["truncated"]:
            args = {"offset": offset + len(page), "limit": limit, "all": all, "filter": filter}
            result["next"] = {"verb": "vars", "args": {k: v for k, v in args.items() if v}}
        return result

    @P.serves(P.EVAL)
    def cmd_eval(
        self, expression: str, timeout: float | None = 30.0, export: str | None = None
    ) -> R.Evaluation:
        """``export``: also write the value (a tensor) to this .npy path, for ``eval
        --against`` to take the difference of two sessions' values (``export.py``)."""
        from .. import summary

        printed = _Tee(sys.stdout)
        try:
            with self.guard.running(timeout), contextlib.redirect_stdout(printed):
                value = self._namespace().run(expression)
        except EvalInterrupt as exc:  # delivered just outside the user's code
            raise EvalError(
                f"the evaluation {exc.reason} and was interrupted; the session is still paused",
                {"type": type(exc).__name__},
                exc.code,
            ) from None
        described = summary.summarize(value, force=True)  # asked for: a lazy array runs now
        repr_cut = False
        if summary.is_tensor(value):  # its one line comes from the same stats: computed once
            text = summary.one_line_from_summary(described, 1000)
        else:  # within the budget already: its "… (N chars)" says what was left out
            text, repr_cut = summary.repr_within(value, budget.VALUE)
        text, result_cut = budget.cap(text, budget.VALUE)
        result_cut = result_cut or repr_cut
        output, output_cut = budget.cap(
            printed.getvalue(), budget.EVAL_OUTPUT, "tail", dropped=printed.dropped
        )
        result: R.Evaluation = {
            "expression": budget.capped(expression, budget.VALUE),
            "result": text,
            "type": summary.type_name(value),
            "summary": described,
            "output": output,
        }
        if result_cut:
            result["result_truncated"] = True
        if output_cut:
            result["output_truncated"] = True
        if export:
            from .export import export_value

            result["export"] = export_value(value, export)
        return result

    def trace_record(self) -> TraceRecord:
        """A bounded picture of this stop for the run's trace: the stack and the variables."""
        from .. import summary

        stack = [
            describe_frame(f, line, i)
            for i, (f, line) in enumerate(self.frames)
            if i == self.selected or not is_library_file(canonical_code_file(f.f_code.co_filename))
        ][:TRACE_FRAMES]
        variables: list[dict[str, str]] = []
        try:
            frame, _ = self.frames[self.selected]
            names = [
                (n, v)
                for n, v in frame.f_locals.items()
                if not (n.startswith("__") and n.endswith("__"))
            ]
            for name, value in names[:TRACE_VARIABLES]:
                variables.append({"name": name, "summary": summary.one_line(value, TRACE_VALUE)})
        except Exception as exc:  # a hostile __repr__ never breaks a stop
            variables.append({"name": "?", "summary": f"<unavailable: {type(exc).__name__}>"})
        return {"stack": stack, "variables": variables}

    def _namespace(self) -> FrameNamespace:
        frame, _ = self.frames[self.selected]
        namespace = self._namespaces.get(self.selected)
        if namespace is None:
            namespace = FrameNamespace(frame, live=not self.post_mortem)
            self._namespaces[self.selected] = namespace
        return namespace


class _Tee:
    """What an evaluation prints: kept (its tail) for the answer, and still written to the
    script's own output, where the run's output.log has all of it."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self._parts: list[str] = []
        self._size = 0
        self.dropped = 0  # bytes of the head no longer kept (the answer's marker counts them)

    def write(self, text: str) -> int:
        with contextlib.suppress(Exception):
            if self._stream is not None:
                self._stream.write(text)
        self._parts.append(text)
        self._size += len(text)
        if self._size > 4 * budget.EVAL_OUTPUT:  # keep a bounded tail, never all of it
            whole = "".join(self._parts)
            kept = whole[-2 * budget.EVAL_OUTPUT :]
            self.dropped += len(whole[: -len(kept)].encode("utf-8", "surrogatepass"))
            self._parts, self._size = [kept], len(kept)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            if self._stream is not None:
                self._stream.flush()

    def getvalue(self) -> str:
        return "".join(self._parts)
