"""The daemon's side of the verbs pdb and debugpy users reach for: until, restart, unwatch.

``until`` is a one-shot breakpoint plus ``continue`` (the agent removes it at the next
stop, whatever stopped); ``restart`` starts the same request again with the breakpoints
and watches the session has now (the daemon's list of them, ``breakpoint_list``, which
outlives the process), each under its id.
"""

from __future__ import annotations

import dataclasses
import re

from .. import results as R
from ..agent import protocol as P
from ..errors import BAD_ARGUMENT, NO_SUCH_BREAKPOINT, MldbgError
from ..verbs import fix
from .manager import SessionManager
from .sessions import Session

_LOCATION = re.compile(r"^(?P<file>.+?):(?P<line>\d+)$")
_ID = re.compile(r"^#?(?P<id>\d+)$")


def until_location(
    s: Session, target: str | None, file: str | None, line: int | None, bp_id: int | None
) -> P.BreakArgs:
    """Where ``until`` runs to, as a breakpoint spec (file, line): ``target`` (FILE:LINE,
    LINE in the current file, or #ID), else ``file``/``line``, else breakpoint ``bp_id``'s."""
    target = (target or "").strip()
    if target:
        match = _LOCATION.match(target)
        if match:
            file, line = match["file"], int(match["line"])
        elif target.startswith("#") and _ID.match(target):
            bp_id = int(target[1:])
        elif target.isdigit():
            line = int(target)
        else:
            raise MldbgError(
                f"until takes FILE:LINE, LINE (in the current file) or #ID, not {target!r}",
                code=BAD_ARGUMENT,
                argument="target",
            )
    if bp_id is not None:
        for bp in P.BREAKS.call(s).get("breakpoints", []):
            if bp.get("id") == int(bp_id):
                if not bp.get("file") or not bp.get("line"):
                    raise MldbgError(
                        f"breakpoint #{bp_id} has no line to run to (it is a "
                        f"{'pending function' if bp.get('pending') else 'checkpoint or exception'}"
                        " breakpoint)",
                        code=BAD_ARGUMENT,
                        argument="id",
                    )
                return {"file": bp["file"], "line": bp["line"]}
        raise MldbgError(
            f"no breakpoint #{bp_id}",
            code=NO_SUCH_BREAKPOINT,
            fix=[fix("breaks", session=s.name)],
        )
    if line is None:
        raise MldbgError(
            "until needs a target: FILE:LINE, LINE or #ID", code=BAD_ARGUMENT, argument="target"
        )
    if not file:
        location = s.snapshot().get("location") or {}
        file = location.get("file")
        if not file:
            raise MldbgError(
                "no current file to run to a line in: give FILE:LINE",
                code=BAD_ARGUMENT,
                argument="target",
            )
    return {"file": file, "line": int(line)}


def until(
    s: Session,
    target: str | None,
    file: str | None,
    line: int | None,
    bp_id: int | None,
    wait: float,
) -> R.State:
    s.require_paused()
    spec = until_location(s, target, file, line, bp_id)
    bp = P.BREAK.call(s, {**spec, "temporary": True})
    s.log.event("until", **spec)
    state = s.resume(P.CONTINUE, None, wait)
    state["until"] = bp
    return state


def restart(manager: SessionManager, name: str, wait: float) -> R.State:
    old = manager.get(name)
    again = old.breakpoints.configure_args()  # the daemon's list: live or ended, the same
    request = dataclasses.replace(
        old.request,
        breakpoints=again.get("breakpoints", []),
        watches=again.get("watches", []),
        replace=True,
    )
    old_run = old.run.run_id if old.run is not None else None
    session = manager.start(name, request)
    state = session.wait(wait if request.stop_on_entry else 0.0)
    if old_run:
        state["restarted_from"] = old_run
    return state


def with_values(s: Session, result: R.Watches) -> R.Watches:
    """A watch set (or removed) while paused: the values now, also in the session's state."""
    if s.state != "paused":
        return result
    try:
        items = [dict(w) for w in result.get("watches", [])]
        values = P.WATCH_VALUES.call(s, {"items": items}, 30.0)
    except MldbgError:
        return result
    watches = values.get("watches", [])
    with s.cond:
        if s.state == "paused" and s.stop:
            if watches:
                s.stop["watches"] = watches
            else:
                s.stop.pop("watches", None)
    by_id = {w.get("id"): w for w in watches}
    if result.get("watch"):
        result["watch"] = {**result["watch"], **by_id.get(result["watch"].get("id"), {})}
    result["watches"] = watches
    return result


def unwatch_args(target: str | None, watch_id: int | None) -> P.UnwatchArgs:
    """``unwatch``'s target (#ID, ID or the expression) or ``watch_id``, as the agent takes it."""
    target = (target or "").strip()
    if watch_id is not None:
        return {"id": int(watch_id)}
    if not target:
        return {}
    match = _ID.match(target)
    if match:
        return {"id": int(match["id"])}
    return {"expression": target}
