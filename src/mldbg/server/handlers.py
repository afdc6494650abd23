"""One handler per verb of ``verbs.py``: what the daemon does when the verb is called.

Every surface reaches these through the REST routes derived from the verb table, so a
verb behaves the same from the CLI, MCP, curl or the typed client.  A handler takes the
manager, the session name (``None`` for global verbs) and the validated arguments, and
returns the verb's result (a ``results.py`` shape).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from .. import results as R
from ..agent import protocol as P
from ..errors import BAD_ARGUMENT, CONFIRM, NO_SUCH_TENSOR, MldbgError
from ..store.runs import clean_runs, mldbg_home
from ..verbs import BY_NAME, VERBS, fix
from . import store_queries
from .manager import SessionManager
from .sessions import Session, StartRequest

Handler = Callable[[SessionManager, "str | None", dict[str, Any]], Any]
HANDLERS: dict[str, Handler] = {}
MAX_WAIT = 30.0  # one request never waits longer; clients loop for longer waits


def handles(name: str) -> Callable[[Handler], Handler]:
    if name not in BY_NAME:
        raise KeyError(f"no verb {name!r} in verbs.py")

    def register(fn: Handler) -> Handler:
        HANDLERS[name] = fn
        return fn

    return register


def _bounded(wait: float | None) -> float:
    return max(0.0, min(float(wait or 0.0), MAX_WAIT))


def _session(manager: SessionManager, name: str | None) -> Session:
    assert name is not None
    return manager.get(name)


# -- sessions ---------------------------------------------------------------------------------


@handles("start")
def start(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.State:
    assert name is not None
    if not a.get("script") and not a.get("module"):
        raise MldbgError(
            "give a script (a path) or a module to run", code=BAD_ARGUMENT, argument="script"
        )
    cwd = a.get("cwd") or os.getcwd()
    for package in a.get("require_editable") or []:
        from ..interpreters import require_editable

        require_editable(a.get("python"), package, cwd=cwd)
    env_overrides = dict(a.get("env") or {})
    capture = _capture_settings(a)
    if capture is not None:
        env_overrides[capture[0]] = capture[1]
    request = StartRequest(
        script=a.get("script"),
        module=a.get("module"),
        args=list(a.get("args") or []),
        python=a.get("python"),
        cwd=a.get("cwd"),
        env=a.get("base_env"),
        env_overrides=env_overrides,
        breakpoints=[dict(bp) for bp in a.get("breakpoints") or []],
        stop_on_entry=a.get("stop_on_entry", True),
        replace=bool(a.get("replace")),
        follow=not a.get("no_follow"),
    )
    session = manager.start(name, request)
    # `wait` waits for the first stop, whichever it is: the entry stop, or with
    # stop_on_entry false the first breakpoint (or the end); asked for nothing, only the
    # entry stop is waited for, so `start --run` returns at once
    asked = a.get("wait")
    wait = _bounded(30.0 if asked is None and request.stop_on_entry else asked)
    state = session.wait(wait)
    if state.get("state") == "running" and wait > 0:
        state["note"] = (
            f"no stop in the {wait:g} s start waited (start waits at most {MAX_WAIT:g} s): "
            "call wait to wait for the first breakpoint or the end"
        )
    from ..store.size import warning

    with contextlib.suppress(OSError):
        env = {**(a.get("base_env") or os.environ), **(a.get("env") or {})}
        full = warning(session.home, env)  # the client's limits, not the daemon's
        if full:
            state["warnings"] = [full]
    return state


def _capture_settings(a: dict[str, Any]) -> tuple[str, str] | None:
    """``start --capture``: the environment variable that tells the agent what to capture."""
    options = {
        "models": a.get("capture_models") or None,
        "mode": a.get("capture_mode"),
        "depth": a.get("capture_depth"),
        "budget": a.get("capture_budget"),
        "within": a.get("capture_within"),
        "calls": a.get("capture_calls"),
        "ops": a.get("capture_ops") or None,
        "weights": True if a.get("capture_weights") else None,
        "replay": a.get("capture_replay"),
    }
    given = [k for k, v in options.items() if v is not None and not (k == "mode" and v == "full")]
    if not a.get("capture"):
        if given:
            raise MldbgError(
                f"capture_{given[0]} needs a capture name (capture=NAME)",
                code=BAD_ARGUMENT,
                argument="capture",
            )
        return None
    from ..zero_edit import ENV, Spec

    try:
        spec = Spec.parse(
            {"name": a["capture"], **{k: v for k, v in options.items() if v is not None}}
        )
    except ValueError as exc:
        raise MldbgError(str(exc), code=BAD_ARGUMENT, argument="capture") from None
    return ENV, spec.to_env()


@handles("status")
def status(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.State:
    return _session(manager, name).snapshot()


@handles("forget")
def forget(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.Forgotten:
    assert name is not None
    manager.remove(name)
    return {"removed": name}


@handles("wait")
def wait(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.State:
    return _session(manager, name).wait(_bounded(a.get("wait")))


@handles("continue")
def continue_(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.State:
    wait = 0.0 if a.get("no_wait") else _bounded(a.get("wait"))
    return _session(manager, name).resume(P.CONTINUE, None, wait)


@handles("step")
def step(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.State:
    args = {"kind": a.get("kind") or "over", "into_libraries": bool(a.get("into_libraries"))}
    return _session(manager, name).resume(P.STEP, args, _bounded(a.get("wait")))


@handles("pause")
def pause(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.State:
    return _session(manager, name).pause(_bounded(a.get("wait", 5.0)))


@handles("location")
def location(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.State:
    s = _session(manager, name)
    return {**s.snapshot(), **P.LOCATION.call(s)}


@handles("up")
def up(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.FrameSelected:
    return P.FRAME.call(_session(manager, name), {"move": a.get("count") or 1})


@handles("down")
def down(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.FrameSelected:
    return P.FRAME.call(_session(manager, name), {"move": -(a.get("count") or 1)})


@handles("eval")
def eval_(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.Evaluation:
    timeout = float(a.get("timeout") or 30.0)
    if a.get("against"):  # the same expression in a second paused session, side by side
        from ..side_by_side import evaluate_both

        if a["against"] == name:
            raise MldbgError(
                "against names the session itself: give the other paused session",
                code=BAD_ARGUMENT,
                argument="against",
            )
        other = manager.get(a["against"])
        return evaluate_both(_session(manager, name), other, a["expression"], timeout)
    return _session(manager, name).evaluate(a["expression"], timeout)


@handles("output")
def output(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.Output:
    return _session(manager, name).output(a.get("tail"), a.get("offset"), a.get("limit") or 16384)


@handles("terminate")
def terminate(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.State:
    return _session(manager, name).terminate()


# -- breakpoints ------------------------------------------------------------------------------


@handles("break")
def break_(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.BreakpointInfo:
    s = _session(manager, name)
    keys = ("file", "line", "condition", "hits", "log", "checkpoint", "function")
    spec = cast("P.BreakArgs", {k: a.get(k) for k in keys})
    for key in ("raised", "uncaught"):  # [] means every exception: keep it, drop only None
        if a.get(key) is not None:
            spec[key] = list(a[key])  # type: ignore[literal-required]
    if a.get("this_thread"):
        spec["this_thread"] = True
    for key in ("nonfinite", "max_abs", "subnormal"):  # the tripwire (agent/tripwire.py)
        if a.get(key):
            spec[key] = a[key]  # type: ignore[literal-required]
    result = P.BREAK.call(s, spec)
    s.log.event("breakpoint_set", **result)
    _remember(s)
    if result.get("file"):
        warning = imported_copy_warning(s, result["file"])
        if warning:
            result["warning"] = warning
    return result


def imported_copy_warning(s: Session, file: str) -> str | None:
    """The classic "my breakpoint never hits": FILE is not the copy the script imports."""
    from ..interpreters import imported_copy

    try:
        found = imported_copy(s.hello.get("executable"), file, cwd=s.request.cwd)
    except Exception:  # a warning must never fail the breakpoint itself
        return None
    return found.get("warning")


@handles("remove")
def remove(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.BreakpointInfo:
    s = _session(manager, name)
    spec = cast("P.RemoveArgs", {k: a.get(k) for k in ("file", "line", "checkpoint", "id")})
    result = P.REMOVE.call(s, spec)
    s.log.event("breakpoint_removed", **result)
    _remember(s)
    return result


@handles("clear")
def clear(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.Removed:
    s = _session(manager, name)
    result = P.CLEAR.call(s)
    _remember(s)
    return result


def _remember(s: Session) -> None:
    from . import pdb_verbs

    pdb_verbs.remember(s)


# -- pdb / debugpy verbs: until, restart, watch, threads (issue 12) -----------------------------


@handles("until")
def until(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.State:
    from . import pdb_verbs

    return pdb_verbs.until(_session(manager, name), a, _bounded(a.get("wait")))


@handles("restart")
def restart(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.State:
    from . import pdb_verbs

    assert name is not None
    return pdb_verbs.restart(manager, name, _bounded(a.get("wait", 30.0)))


@handles("watch")
def watch(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.Watches:
    from . import pdb_verbs

    s = _session(manager, name)
    result = P.WATCH.call(s, {"expression": a["expression"]})
    _remember(s)
    return pdb_verbs.with_values(s, result)


@handles("unwatch")
def unwatch(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.Watches:
    from . import pdb_verbs

    s = _session(manager, name)
    result = P.UNWATCH.call(s, pdb_verbs.unwatch_args(a))
    _remember(s)
    return pdb_verbs.with_values(s, result)


@handles("thread")
def thread(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.State:
    s = _session(manager, name)
    s.require_paused()
    return {**s.snapshot(), **P.THREAD.call(s, {"number": a["number"]})}


# -- the daemon and the run store -------------------------------------------------------------


@handles("sessions")
def sessions(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.Sessions:
    pruned = manager.prune() if a.get("prune") else []
    # live sessions first, then the newest: what a budget must never cut
    items = sorted(reversed(manager.all()), key=lambda s: s.ended)
    limit = 100
    result: R.Sessions = {
        "sessions": [s.snapshot() for s in items[:limit]],
        "total": len(items),
        "shown": min(len(items), limit),
        "truncated": len(items) > limit,
    }
    if a.get("prune"):
        result["pruned"] = pruned
    if len(items) > limit:
        result["next"] = fix("sessions", prune=True)
    return result


def store_home(manager: SessionManager, a: dict[str, Any], session: str | None = None) -> Path:
    """Which run store a call means: ``home`` if given, else the session's, else the
    client's own (``$MLDBG_HOME`` or ``./.mldbg`` where the client runs)."""
    base = a.get("client_cwd") or None
    if a.get("home"):
        return Path(base or os.getcwd(), os.path.expanduser(a["home"])).resolve()
    session = session or a.get("session")
    if session:
        found = manager.get(session)
        if found.home is not None:
            return found.home
    env = {"MLDBG_HOME": a["client_home"]} if a.get("client_home") else {}
    return mldbg_home(base, env)


@handles("trace")
def trace(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.Trace:
    run = a.get("run")
    home = store_home(manager, a, None if run else name)
    if run is None and name is not None:
        s = manager.get(name)
        if s.run is not None:
            run = str(s.run.path)
    return store_queries.trace(home, run, a.get("last") or 10)


@handles("runs")
def runs(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.Runs:
    return store_queries.runs(store_home(manager, a), a.get("offset") or 0, a.get("limit") or 20)


@handles("checkpoints")
def checkpoints(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.Checkpoints:
    home = store_home(manager, a)
    run = a.get("run")
    if run is None and a.get("session"):
        s = manager.get(a["session"])
        run = str(s.run.path) if s.run is not None else None
    return store_queries.checkpoints(
        home, run, a.get("name"), a.get("hit"), a.get("offset") or 0, a.get("limit") or 20
    )


@handles("compare-checkpoints")
def compare_checkpoints(
    manager: SessionManager, name: str | None, a: dict[str, Any]
) -> R.CheckpointPairs:
    from ..store.checkpoint_diff import compare_runs

    home = store_home(manager, a)
    base = a.get("client_cwd") or os.getcwd()

    def where(spec: str | None) -> str | None:  # a relative run directory is the client's
        if spec and spec.startswith((".", "~")) or spec and "/" in spec:
            return str(Path(base, os.path.expanduser(spec)))
        return spec

    run = a.get("a")
    if run is None and a.get("session"):
        s = manager.get(a["session"])
        run = str(s.run.path) if s.run is not None else None
    return compare_runs(
        home,
        where(run),
        where(a["b"]) or "",
        a.get("name"),
        a.get("hit"),
        a.get("offset") or 0,
        a.get("limit") or 20,
    )


@handles("nonfinite")
def nonfinite(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.FirstNonfinite:
    from ..compare.nonfinite import first_nonfinite

    source = a["source"]
    base = a.get("client_cwd") or os.getcwd()
    candidate = Path(base, os.path.expanduser(source))
    if candidate.exists():  # a path is the client's, as compare reads it
        source = str(candidate)
    # the parity package answers plain dicts: their shape is results.FirstNonfinite
    return cast("R.FirstNonfinite", first_nonfinite(source, home=store_home(manager, a)))


@handles("module-table")
def module_table(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.ModuleTable:
    from ..compare.table import module_table as table

    base = a.get("client_cwd") or os.getcwd()

    def local(spec: str | None) -> str | None:  # a path is the client's, as compare reads it
        if spec and Path(base, os.path.expanduser(spec)).exists():
            return str(Path(base, os.path.expanduser(spec)))
        return spec

    found = table(
        local(a["a"]) or a["a"],
        local(a.get("b")),
        home=store_home(manager, a),
        sort=a.get("sort") or "order",
        offset=a.get("offset") or 0,
        limit=a.get("limit") or 50,
    )
    return cast("R.ModuleTable", found)


@handles("captures")
def captures(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.Captures:
    return store_queries.captures(store_home(manager, a), a.get("run"), a.get("limit") or 50)


@handles("compare")
def compare(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.CompareSummary:
    from ..compare.answer import compare_answer

    home = store_home(manager, a)
    return cast("R.CompareSummary", compare_answer(home, a, a.get("client_cwd")))


@handles("weights")
def weights(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.WeightAudit:
    from ..compare.weights import audit_weights

    home = store_home(manager, a)
    base = a.get("client_cwd") or os.getcwd()

    def local(spec: str) -> str:  # a path where the client is, else a capture name
        path = os.path.join(base, os.path.expanduser(spec))
        return path if os.path.exists(path) else spec

    result = audit_weights(
        local(a["reference"]), local(a["port"]), map=a.get("map"), fresh=a.get("fresh"), home=home
    )
    result.pop("parameters", None)  # every parameter: the Python API's; the answer is bounded
    limit = a.get("limit", 50)
    problems = result["problems"]
    result["problems"] = problems[:limit]
    result["total"] = len(problems)
    result["truncated"] = len(problems) > limit
    return cast("R.WeightAudit", result)


@handles("tensors")
def tensors(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.TensorStore:
    from ..store import tensors as store

    home = tensor_home(manager, a)
    action = a.get("action") or "list"
    try:
        if action == "list":
            items = store.list_tensors(home)
            limit = a.get("limit") or 100
            shown, paged = store_queries.page(items, 0, limit, "tensors", {"limit": len(items)})
            return {
                "path": str(store.store_dir(home)),
                "tensors": shown,
                "size_bytes": store.store_size(home),
                **paged,
            }
        if action == "info":
            if not a.get("name"):
                raise MldbgError("tensors info needs a name", code=BAD_ARGUMENT, argument="name")
            return cast("R.TensorStore", store.tensor_info(a["name"], home))
        if not a.get("name") and not a.get("yes"):
            count = len(store.list_tensors(home))
            raise MldbgError(
                f"this deletes all {count} tensor(s) in {store.store_dir(home)}; "
                "confirm with yes, or name the one tensor to clear",
                code=CONFIRM,
                fix=[fix("tensors", action="clear", yes=True)],
            )
        return {"removed": store.clear_tensors(a.get("name"), home)}
    except (FileNotFoundError, ValueError) as exc:
        raise MldbgError(str(exc)[:2000], code=NO_SUCH_TENSOR) from None


def tensor_home(manager: SessionManager, a: dict[str, Any]) -> Path:
    """Whose tensor store a call means: ``home`` if given; else, as ``debug_save`` in that
    process would find it, the session's or the client's ``MLDBG_HOME``, else the user's
    store shared by every repository (``tensors.tensor_home``)."""
    from ..store import tensors as store

    if a.get("home"):
        return store_home(manager, a)
    if a.get("session"):
        s = manager.get(a["session"])
        env = {**(s.request.env or os.environ), **s.request.env_overrides}
        return store.tensor_home(s.request.cwd, env)
    env = {"MLDBG_HOME": a["client_home"]} if a.get("client_home") else {}
    return store.tensor_home(a.get("client_cwd"), env)


@handles("clean")
def clean(manager: SessionManager, name: str | None, a: dict[str, Any]) -> R.Cleaned:
    home = store_home(manager, a)
    return clean_runs(home, a.get("keep", 10), bool(a.get("dry_run")))


def _forward(command: P.AgentCommand[Any, Any]) -> Handler:
    """The handler of a verb that passes its arguments on to one agent command."""
    names = tuple(command.args.__annotations__)

    def forward(manager: SessionManager, name: str | None, a: dict[str, Any]) -> Any:
        s = _session(manager, name)
        args = {k: a[k] for k in names if a.get(k) is not None}
        return s.ask(command, args)

    return forward


for _verb in VERBS:
    if _verb.agent is not None:
        if _verb.name in HANDLERS:
            raise RuntimeError(f"verb {_verb.name!r} passes its arguments on: it has no handler")
        HANDLERS[_verb.name] = _forward(_verb.agent)


def missing_handlers() -> list[str]:
    """Verbs declared without a handler: a test keeps this empty."""
    return [name for name in BY_NAME if name not in HANDLERS]
