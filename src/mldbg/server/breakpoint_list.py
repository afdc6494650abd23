"""A session's breakpoints and watches as the daemon keeps them: one list, one conversion.

Every process of a run holds the root's breakpoints: a child the script starts is
configured with them when it connects, an edit made while children run is passed on to
each, and ``restart`` starts the script again with them.  The daemon keeps them once, in
a :class:`BreakpointList` per session, filled from what the root's agent *answered* to
each edit (so a breakpoint the agent refused is never kept, and an edit costs the one
round trip it makes), and turns a listed breakpoint back into the arguments that set it
with one function, :func:`break_args`, for every copy it makes.

A copy keeps the breakpoint's id (the agent takes the id it is given), so ``remove`` by
id on the root reaches the same breakpoint in every child, and an id still means the
same breakpoint after a restart.  Watches are copied by expression (each expression is
one watch).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from .. import results as R
from ..agent import protocol as P


def break_args(info: R.BreakpointInfo) -> P.BreakArgs | None:
    """The arguments of ``break`` that set the breakpoint ``info`` lists (as ``breaks``
    and every breakpoint edit answer it), with its id; None for ``until``'s one-shot
    breakpoint, which belongs to the one stop it was set for."""
    if info.get("temporary") or info.get("existing"):
        return None
    args: P.BreakArgs
    if "checkpoint" in info:
        args = {"checkpoint": info["checkpoint"], "condition": info.get("condition")}
    elif "exception" in info:
        args = {"exception": info["exception"], "types": list(info.get("types") or [])}
    elif "nonfinite" in info:
        args = {
            "nonfinite": info["nonfinite"],
            "max_abs": info.get("max_abs"),
            "subnormal": bool(info.get("subnormal")),
        }
    else:  # a function is listed with the file and line it resolved to, if it did
        args = (
            {"function": info["function"]}
            if "function" in info
            else {"file": info["file"], "line": info["line"]}
        )
        args["condition"] = info.get("condition")
        args["hits"] = info.get("hits")
        args["log"] = info.get("log")
        args["this_thread"] = bool(info.get("this_thread"))
    args["id"] = info["id"]
    return args


def _slot(info: R.BreakpointInfo) -> tuple[object, ...]:
    """Which breakpoint a new one replaces, as the agent's table decides: one per file
    and line, per checkpoint name, per exception mode, one tripwire; a function that is
    not imported yet is only itself."""
    if "checkpoint" in info:
        return ("checkpoint", info["checkpoint"])
    if "exception" in info:
        return ("exception", info["exception"])
    if "nonfinite" in info:
        return ("tripwire",)
    if info.get("file") and info.get("line"):
        return ("line", info["file"], info["line"])
    return ("id", info["id"])


class BreakpointList:
    """The breakpoints and watches the root's agent holds now, as it answered them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._breakpoints: dict[tuple[object, ...], R.BreakpointInfo] = {}  # in order set
        self._watches: list[str] = []

    def configured(self, answer: R.Breakpoints) -> None:
        """What the agent set at the start (``configure``'s answer)."""
        with self._lock:
            self._breakpoints = {}
            self._watches = []
        for info in answer.get("breakpoints", []):
            self.set(info)
        self.watches_are(answer.get("watches", []))

    def set(self, info: R.BreakpointInfo) -> P.BreakArgs | None:
        """The agent set ``info``: kept, replacing the one it replaced there; the
        arguments that set it in another process (None: a one-shot ``until``)."""
        args = break_args(info)
        if args is not None:
            with self._lock:
                self._breakpoints.pop(_slot(info), None)  # set again: now the newest
                self._breakpoints[_slot(info)] = info
        return args

    def removed(self, info: R.BreakpointInfo) -> None:
        with self._lock:
            for slot, kept in list(self._breakpoints.items()):
                if kept.get("id") == info.get("id"):
                    del self._breakpoints[slot]

    def cleared(self) -> None:
        with self._lock:
            self._breakpoints = {}

    def watches_are(self, watches: Iterable[R.Watch]) -> None:
        """The agent's watches now (every watch edit answers all of them)."""
        with self._lock:
            self._watches = [w["expression"] for w in watches if w.get("expression")]

    def configure_args(self) -> P.ConfigureArgs:
        """What another process of the run is configured with: every breakpoint (with its
        id) and every watch."""
        with self._lock:
            infos, watches = list(self._breakpoints.values()), list(self._watches)
        specs = [args for args in map(break_args, infos) if args is not None]
        return {"breakpoints": specs, "watches": watches}
