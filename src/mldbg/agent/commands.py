"""The agent's reader thread: every command from the daemon, routed or answered.

Commands that need a stopped thread (stack, vars, eval, continue, ...) are queued to it
(``paused.py``); the others (breakpoints, pause, start-up) are answered here, at any
time, since they only edit the debugger's tables.  Errors go back with a stable code the
daemon hands on to its clients.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, cast

from ..errors import BAD_ARGUMENT, INTERNAL, NOT_PAUSED
from . import protocol as P
from .breakpoints import (
    Breakpoint,
    BreakpointError,
    CheckpointFilter,
    LineSpec,
    PendingFunction,
    Tripwire,
    make_breakpoint,
    make_checkpoint_filter,
)
from .debugger import Debugger
from .exception_breaks import ExceptionBreak, parse_types
from .functions import check_name, resolve
from .paused import CommandError
from .wire import reply

if TYPE_CHECKING:
    from typing import Unpack

    from .. import results as R

# What ``break`` makes, by the arguments it is given.
Made = Breakpoint | CheckpointFilter | ExceptionBreak | PendingFunction | Tripwire


class CommandServer:
    """The reader thread's end of the link: checks each command against its declaration
    (``protocol.COMMANDS``), queues the paused ones, serves the rest (``@serves``)."""

    def __init__(self, debugger: Debugger) -> None:
        self.debugger = debugger
        self.wire = debugger.wire
        self.handlers = P.handlers_of(self)  # the reader thread's commands, by name

    def serve(self, on_run: threading.Event, config: P.RunArgs) -> None:
        """Read commands until the daemon goes; ``on_run`` is set when the script may start."""
        debugger = self.debugger
        debugger.mark_busy()
        while True:
            message = self.wire.receive()
            if message is None:
                debugger.detach()
                on_run.set()
                return
            cmd = str(message.get("cmd", ""))
            command = P.COMMANDS.get(cmd)
            args = message.get("args") or {}
            problem = (
                f"unknown command {cmd!r}"
                if command is None
                else None
                if isinstance(args, dict)
                else f"{cmd}: the arguments must be an object"
            )
            if command is not None and problem is None:
                problem = command.check(args)
            if command is None or problem is not None:
                reply(self.wire, message, False, problem, None, BAD_ARGUMENT)
                continue
            if command.paused:
                paused = debugger.target()
                if paused is None:
                    reply(
                        self.wire,
                        message,
                        False,
                        "the script is not paused; pause it or wait for a stop",
                        None,
                        NOT_PAUSED,
                    )
                else:
                    paused.queue.put(message)
                continue
            try:
                result = self.handlers[cmd](**args)
            except (BreakpointError, CommandError) as exc:
                reply(self.wire, message, False, str(exc), exc.extra, exc.code)
            except TypeError as exc:  # an argument of the wrong type
                reply(self.wire, message, False, f"{cmd}: {exc}", None, BAD_ARGUMENT)
            except Exception as exc:
                text = f"internal error in {cmd}: {type(exc).__name__}: {exc}"
                reply(self.wire, message, False, text[:2000], None, INTERNAL)
            else:
                reply(self.wire, message, True, result)
                if command is P.RUN:  # checked against RunArgs above
                    config.update(cast("P.RunArgs", args))
                    on_run.set()

    # -- commands -----------------------------------------------------------------------------

    @P.serves(P.CONFIGURE)
    def cmd_configure(
        self,
        breakpoints: list[P.BreakArgs] | None = None,
        watches: list[str] | None = None,
        main_file: str | None = None,
    ) -> R.Breakpoints:
        """Validate and set the start-up breakpoints all at once; any error refuses them all."""
        if main_file:
            self.debugger.main_file = main_file
        specs = breakpoints or []
        made = [self._build(spec) for spec in specs]
        for expression in watches or []:
            self.debugger.watches.add(expression)
        for spec, item in zip(specs, made, strict=True):
            self._add(item, spec.get("id"))
        self.debugger.backend.breakpoints_changed()
        self.debugger.watch_imports()
        self.debugger.arm_tripwire()
        return {
            "breakpoints": [item.to_json() for item in made],
            "watches": self.debugger.watches.listing(),
        }

    @P.serves(P.RUN)
    def cmd_run(self, **_: Unpack[P.RunArgs]) -> dict[str, bool]:
        return {"running": True}

    @P.serves(P.BREAK)
    def cmd_break(self, **spec: Unpack[P.BreakArgs]) -> R.BreakpointInfo:
        temporary = bool(spec.pop("temporary", False))
        wanted = spec.pop("id", None)  # the id it has in the script's process (a copy)
        item = self._build(spec)
        if temporary and isinstance(item, Breakpoint):
            existing = self.debugger.breakpoints.at(item.file, item.line)
            if existing is not None:  # `until` a breakpoint's line: that one stops there
                return {**existing.to_json(), "existing": True}
            item.temporary = True
        item = self._add(item, wanted)
        self.debugger.backend.breakpoints_changed()
        self.debugger.watch_imports()
        self.debugger.arm_tripwire()
        return item.to_json()

    @P.serves(P.REMOVE)
    def cmd_remove(
        self,
        file: str | None = None,
        line: int | None = None,
        checkpoint: str | None = None,
        id: int | None = None,
    ) -> R.BreakpointInfo:
        table = self.debugger.breakpoints
        if id is not None:
            removed = table.remove_id(int(id))
            self.debugger.backend.breakpoints_changed()
            self.debugger.watch_imports()
            self.debugger.arm_tripwire()
            return removed.to_json()
        if checkpoint:
            return table.remove_checkpoint(checkpoint).to_json()
        if not file or line is None:
            raise BreakpointError(
                "say which breakpoint to remove: its id, a file and line, or a checkpoint name",
                code=BAD_ARGUMENT,
            )
        bp = table.remove(file, int(line), self.debugger.cwd)
        self.debugger.backend.breakpoints_changed()
        return bp.to_json()

    @P.serves(P.CLEAR)
    def cmd_clear(self) -> R.Removed:
        removed = self.debugger.breakpoints.clear()
        self.debugger.backend.breakpoints_changed()
        self.debugger.arm_tripwire()
        return {"removed": removed}

    @P.serves(P.BREAKS)
    def cmd_breaks(self) -> R.Breakpoints:
        table = self.debugger.breakpoints
        items = [item.to_json() for item in table.everything()]
        return {"breakpoints": items, "watches": self.debugger.watches.listing()}

    @P.serves(P.PAUSE)
    def cmd_pause(self) -> dict[str, bool]:
        return self.debugger.request_pause()

    @P.serves(P.WATCH)
    def cmd_watch(self, expression: str) -> R.Watches:
        item = self.debugger.watches.add(expression)
        return {"watch": item.to_json(), "watches": self.debugger.watches.listing()}

    @P.serves(P.UNWATCH)
    def cmd_unwatch(self, id: int | None = None, expression: str | None = None) -> R.Watches:
        gone = self.debugger.watches.remove(id, expression)
        return {
            "removed": [w.to_json() for w in gone],
            "watches": self.debugger.watches.listing(),
        }

    @P.serves(P.THREADS)
    def cmd_threads(self) -> R.Threads:
        return self.debugger.threads()

    @P.serves(P.THREAD)
    def cmd_thread(self, number: int) -> R.State:
        return self.debugger.select_thread(number)

    def _build(self, spec: P.BreakArgs) -> Made:
        checkpoint = spec.get("checkpoint")
        if checkpoint:
            if spec.get("file") or spec.get("line") or spec.get("hits") or spec.get("log"):
                raise BreakpointError(
                    "a checkpoint filter takes only a name and a condition, "
                    "not a file, line, hit count or log message",
                    code=BAD_ARGUMENT,
                )
            return make_checkpoint_filter(checkpoint, spec.get("condition"))
        if spec.get("nonfinite") or spec.get("max_abs") is not None or spec.get("subnormal"):
            return self._tripwire(spec)
        exception = spec.get("exception")
        if (
            exception is not None
            or spec.get("raised") is not None
            or spec.get("uncaught") is not None  # [] (no types): every uncaught exception
        ):
            return self._exception(spec)
        if spec.get("function"):
            return self._function(spec)
        bp = make_breakpoint(
            spec.get("file") or "",
            spec.get("line"),
            condition=spec.get("condition"),
            hits=spec.get("hits"),
            log=spec.get("log"),
            cwd=self.debugger.cwd,
        )
        bp.this_thread = bool(spec.get("this_thread"))
        return bp

    def _exception(self, spec: P.BreakArgs) -> ExceptionBreak:
        """``raised`` / ``uncaught``: a list of type names ([] = every exception);
        ``exception`` + ``types``: the form ``breaks`` lists (restart uses it)."""
        if spec.get("file") or spec.get("line") or spec.get("function"):
            raise BreakpointError(
                "an exception breakpoint takes type names, not a file, line or function",
                code=BAD_ARGUMENT,
            )
        mode = spec.get("exception") or ("raised" if spec.get("raised") is not None else "uncaught")
        if mode not in ("raised", "uncaught"):
            raise BreakpointError(
                f"exception breakpoints are 'raised' or 'uncaught', not {mode!r}",
                code=BAD_ARGUMENT,
            )
        types = spec.get("types")
        if types is None:
            types = spec.get("raised") if mode == "raised" else spec.get("uncaught")
        return ExceptionBreak(mode, parse_types(types))

    def _tripwire(self, spec: P.BreakArgs) -> Tripwire:
        """``break --nonfinite [--max-abs X] [--subnormal]``: module outputs, not a line."""
        if spec.get("file") or spec.get("line") or spec.get("function") or spec.get("condition"):
            raise BreakpointError(
                "the non-finite tripwire watches every module call's outputs: it takes "
                "--max-abs and --subnormal, not a file, line, function or condition",
                code=BAD_ARGUMENT,
            )
        max_abs = spec.get("max_abs")
        if max_abs is not None and not (float(max_abs) >= 0 and float(max_abs) != float("inf")):
            raise BreakpointError(
                f"max_abs must be a finite number >= 0, not {max_abs!r}", code=BAD_ARGUMENT
            )
        return Tripwire(
            nonfinite=spec.get("nonfinite", True) is not False,
            max_abs=None if max_abs is None else float(max_abs),
            subnormal=bool(spec.get("subnormal")),
        )

    def _function(self, spec: P.BreakArgs) -> Breakpoint | PendingFunction:
        name = str(spec["function"]).strip()
        check_name(name)
        if spec.get("file") or spec.get("line"):
            raise BreakpointError(
                "a function breakpoint takes a dotted name, not a file and line",
                code=BAD_ARGUMENT,
            )
        rest: LineSpec = {
            "condition": spec.get("condition"),
            "hits": spec.get("hits"),
            "log": spec.get("log"),
        }
        found = resolve(name, self.debugger.cwd, self.debugger.main_file)
        table = self.debugger.breakpoints
        if found is None:
            make_breakpoint_check(rest)  # a bad condition is refused now, not at import
            return PendingFunction(
                name, table.next_id(), rest, this_thread=bool(spec.get("this_thread"))
            )
        bp = make_breakpoint(found[0], found[1], cwd=self.debugger.cwd, **rest)
        bp.function = name
        bp.this_thread = bool(spec.get("this_thread"))
        return bp

    def _add(self, item: Made, wanted: int | None = None) -> Made:
        """Set ``item``, under the id ``wanted`` if given (the daemon copies a breakpoint
        into another process of the run with the id it has in the script's own)."""
        table = self.debugger.breakpoints
        if wanted is not None:
            item.id = table.claim_id(wanted)
        if isinstance(item, CheckpointFilter):
            return table.add_checkpoint(item)
        if isinstance(item, ExceptionBreak):
            return table.add_exception(item, keep_id=wanted is not None)
        if isinstance(item, PendingFunction):
            with table.lock:
                table.pending[item.id] = item
            return item
        if isinstance(item, Tripwire):  # one at most: a new one replaces the old one
            with table.lock:
                item.id = item.id or table.next_id()
                table.tripwires.clear()
                table.tripwires[item.id] = item
            return item
        return table.add(item)


def make_breakpoint_check(rest: LineSpec) -> None:
    """Compile a pending breakpoint's condition, hit count and log now: errors come at once."""
    from .breakpoints import compile_expression, compile_log_template, parse_hits

    condition, log = rest.get("condition"), rest.get("log")
    if condition:
        compile_expression(condition, "condition")
    if log:
        compile_log_template(log)
    parse_hits(rest.get("hits"))
