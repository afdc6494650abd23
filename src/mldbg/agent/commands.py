"""The agent's reader thread: every command from the daemon, routed or answered.

Commands that need a stopped thread (stack, vars, eval, continue, ...) are queued to it
(``paused.py``); the others (breakpoints, pause, start-up) are answered here, at any
time, since they only edit the debugger's tables.  Errors go back with a stable code the
daemon hands on to its clients.
"""

from __future__ import annotations

import threading
from typing import Any

from . import protocol as P
from .breakpoints import (
    Breakpoint,
    BreakpointError,
    CheckpointFilter,
    make_breakpoint,
    make_checkpoint_filter,
)
from .debugger import Debugger
from .wire import reply


class CommandServer:
    def __init__(self, debugger: Debugger) -> None:
        self.debugger = debugger
        self.wire = debugger.wire

    def serve(self, on_run: threading.Event, config: dict[str, Any]) -> None:
        """Read commands until the daemon goes; ``on_run`` is set when the script may start."""
        debugger = self.debugger
        debugger.mark_busy()
        while True:
            message = self.wire.receive()
            if message is None:
                debugger.detach()
                on_run.set()
                return
            cmd = message.get("cmd", "")
            if cmd in P.PAUSED_COMMANDS:
                paused = debugger.paused
                if paused is None:
                    reply(
                        self.wire,
                        message,
                        False,
                        "the script is not paused; pause it or wait for a stop",
                        None,
                        "not_paused",
                    )
                else:
                    paused.queue.put(message)
                continue
            handler = getattr(self, f"cmd_{cmd}", None)
            if handler is None:
                reply(self.wire, message, False, f"unknown command {cmd!r}", None, "bad_argument")
                continue
            try:
                result = handler(**(message.get("args") or {}))
            except BreakpointError as exc:
                reply(self.wire, message, False, str(exc), exc.extra, exc.code)
            except TypeError as exc:  # arguments the command does not take
                reply(self.wire, message, False, f"{cmd}: {exc}", None, "bad_argument")
            except Exception as exc:
                text = f"internal error in {cmd}: {type(exc).__name__}: {exc}"
                reply(self.wire, message, False, text[:2000], None, "internal")
            else:
                reply(self.wire, message, True, result)
                if cmd == P.RUN:
                    config.update(message.get("args") or {})
                    on_run.set()

    # -- commands -----------------------------------------------------------------------------

    def cmd_configure(self, breakpoints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Validate and set the start-up breakpoints all at once; any error refuses them all."""
        made = [self._build(spec) for spec in breakpoints or []]
        for item in made:
            self._add(item)
        self.debugger.backend.breakpoints_changed()
        return {"breakpoints": [item.to_json() for item in made]}

    def cmd_run(self, **_: Any) -> dict[str, Any]:
        return {"running": True}

    def cmd_break(self, **spec: Any) -> dict[str, Any]:
        item = self._add(self._build(spec))
        self.debugger.backend.breakpoints_changed()
        return item.to_json()

    def cmd_remove(
        self, file: str | None = None, line: int | None = None, checkpoint: str | None = None
    ) -> dict[str, Any]:
        table = self.debugger.breakpoints
        if checkpoint:
            return table.remove_checkpoint(checkpoint).to_json()
        if not file or line is None:
            raise BreakpointError(
                "say which breakpoint to remove: a file and line, or a checkpoint name",
                code="bad_argument",
            )
        bp = table.remove(file, int(line), self.debugger.cwd)
        self.debugger.backend.breakpoints_changed()
        return bp.to_json()

    def cmd_clear(self) -> dict[str, Any]:
        removed = self.debugger.breakpoints.clear()
        self.debugger.backend.breakpoints_changed()
        return {"removed": removed}

    def cmd_breaks(self) -> dict[str, Any]:
        table = self.debugger.breakpoints
        items = [bp.to_json() for bp in table.all()] + [
            f.to_json() for f in table.checkpoints.values()
        ]
        return {"breakpoints": items}

    def cmd_pause(self) -> dict[str, Any]:
        return self.debugger.request_pause()

    def _build(self, spec: dict[str, Any]) -> Breakpoint | CheckpointFilter:
        if spec.get("checkpoint"):
            if spec.get("file") or spec.get("line") or spec.get("hits") or spec.get("log"):
                raise BreakpointError(
                    "a checkpoint filter takes only a name and a condition, "
                    "not a file, line, hit count or log message",
                    code="bad_argument",
                )
            return make_checkpoint_filter(spec["checkpoint"], spec.get("condition"))
        return make_breakpoint(
            spec.get("file") or "",
            spec.get("line"),
            condition=spec.get("condition"),
            hits=spec.get("hits"),
            log=spec.get("log"),
            cwd=self.debugger.cwd,
        )

    def _add(self, item: Breakpoint | CheckpointFilter) -> Breakpoint | CheckpointFilter:
        table = self.debugger.breakpoints
        if isinstance(item, CheckpointFilter):
            return table.add_checkpoint(item)
        return table.add(item)
