"""One handler per verb of ``verbs.py``: what the daemon does when the verb is called.

Every surface reaches these through the REST routes derived from the verb table, so a
verb behaves the same from the CLI, MCP, curl or the typed client.  A handler takes the
manager, the session name (``None`` for global verbs), for a run-store verb the store its
client means (:class:`Where`), and the verb's arguments as keyword parameters typed as the
verb table declares them (``tests/test_surfaces.py`` holds each signature to its verb), and
returns the verb's result (a ``results.py`` shape).  Arguments arrive validated, and one
not given arrives as its declared default (``app.py``), so a parameter is ``T | None``
only where that default is None.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from .. import deadline
from .. import results as R
from ..agent import protocol as P
from ..errors import BAD_ARGUMENT, CONFIRM, NO_SUCH_TENSOR, TOO_LONG, MldbgError
from ..store.runs import clean_runs, mldbg_home
from ..verbs import BY_NAME, ENV_LIMIT, VERBS, Verb, fix
from . import store_queries
from .manager import SessionManager
from .sessions import Session, StartRequest

# (manager, session name, [where,] **the verb's arguments) -> the verb's result
Handler = Callable[..., Any]
HANDLERS: dict[str, Handler] = {}
MAX_WAIT = 30.0  # one request never waits longer; clients loop for longer waits
WHERE = ("home", "session", "client_cwd", "client_home")  # a run-store verb's context


@dataclass(frozen=True)
class Where:
    """Which run store a run-store verb's call means, and where its client is: ``home``
    (``--home``), ``session`` (that session's store), the client's working directory and
    ``$MLDBG_HOME`` (paths it gives are its own, relative to where it runs)."""

    home: str | None = None
    session: str | None = None
    client_cwd: str | None = None
    client_home: str | None = None

    def local(self, spec: str) -> str:
        """``spec`` as a path where the client is, if that exists; else as given (a run
        id, a capture name)."""
        path = os.path.join(self.client_cwd or os.getcwd(), os.path.expanduser(spec))
        return path if os.path.exists(path) else spec


def call(verb: Verb, manager: SessionManager, name: str | None, values: Mapping[str, Any]) -> Any:
    """Run ``verb``'s handler with the validated ``values``: a run-store verb's context
    becomes its ``where``, every other argument a keyword."""
    handler = HANDLERS[verb.name]
    if verb.agent is not None or not verb.store:
        return handler(manager, name, **values)
    where = Where(**{k: values[k] for k in WHERE if k in values})
    return handler(manager, name, where, **{k: v for k, v in values.items() if k not in WHERE})


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
def start(
    manager: SessionManager,
    session: str | None,
    *,
    script: str | None = None,
    module: str | None = None,
    args: list[str] | None = None,
    python: str | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    base_env: dict[str, str] | None = None,
    breakpoints: list[R.BreakpointSpec] | None = None,
    stop_on_entry: bool = True,
    replace: bool = False,
    no_follow: bool = False,
    require_editable: list[str] | None = None,
    wait: float | None = None,
    capture: str | None = None,
    **capture_options: object,  # capture_<option> of capture_options.Spec (checked there)
) -> R.State:
    assert session is not None
    if not script and not module:
        raise MldbgError(
            "give a script (a path) or a module to run", code=BAD_ARGUMENT, argument="script"
        )
    for package in require_editable or []:
        from ..interpreters import require_editable as require

        require(python, package, cwd=cwd or os.getcwd())
    env_overrides = dict(env or {})
    settings = _capture_settings(capture, capture_options)
    if settings is not None:
        env_overrides[settings[0]] = settings[1]
    request = StartRequest(
        script=script,
        module=module,
        args=list(args or []),
        python=python,
        cwd=cwd,
        env=base_env,
        env_overrides=env_overrides,
        breakpoints=[cast("P.BreakArgs", dict(bp)) for bp in breakpoints or []],
        stop_on_entry=stop_on_entry,
        replace=replace,
        follow=not no_follow,
    )
    started = manager.start(session, request)
    # `wait` waits for the first stop, whichever it is: the entry stop, or with
    # stop_on_entry false the first breakpoint (or the end); asked for nothing, only the
    # entry stop is waited for, so `start --run` returns at once
    waited = _bounded(30.0 if wait is None and request.stop_on_entry else wait)
    state = started.wait(waited)
    if state.get("state") == "running" and waited > 0:
        state["note"] = (
            f"no stop in the {waited:g} s start waited (start waits at most {MAX_WAIT:g} s): "
            "call wait to wait for the first breakpoint or the end"
        )
    from ..store.size import warning

    with contextlib.suppress(OSError):
        full = warning(started.home, {**(base_env or os.environ), **(env or {})})
        if full:  # the client's limits, not the daemon's
            state["warnings"] = [full]
    return state


def _capture_settings(
    capture: str | None, arguments: Mapping[str, object]
) -> tuple[str, str] | None:
    """``start --capture``: the environment variable that tells the agent what to capture,
    from the ``capture_*`` arguments each option of ``capture_options.Spec`` declares."""
    from ..capture_options import ENV, OPTIONS, Spec, argument_of, settings_from_arguments

    unknown = sorted(set(arguments) - set(map(argument_of, OPTIONS)))
    if unknown:  # app.py passes only the verb's arguments: a handler called otherwise
        raise MldbgError(f"start takes no argument {unknown[0]!r}", code=BAD_ARGUMENT)
    given = settings_from_arguments(arguments)
    if not capture:
        if given:
            argument = argument_of(next(iter(given)))
            raise MldbgError(
                f"{argument} needs a capture name (capture=NAME)",
                code=BAD_ARGUMENT,
                argument="capture",
            )
        return None
    try:
        spec = Spec.parse({"name": capture, **given})
    except (ValueError, TypeError) as exc:
        raise MldbgError(str(exc), code=BAD_ARGUMENT, argument="capture") from None
    value = spec.to_env()
    size = len(f"{ENV}={value}".encode())
    if size > ENV_LIMIT:  # execve would refuse it: "Argument list too long"
        raise MldbgError(
            f"the capture settings take {size} bytes as ${ENV}, more than an "
            f"environment variable holds ({ENV_LIMIT}): fewer or shorter capture_ops / "
            "capture_models patterns",
            code=TOO_LONG,
            argument="capture",
            limit=ENV_LIMIT,
        )
    return ENV, value


@handles("status")
def status(manager: SessionManager, session: str | None) -> R.State:
    return _session(manager, session).snapshot()


@handles("forget")
def forget(manager: SessionManager, session: str | None) -> R.Forgotten:
    assert session is not None
    manager.remove(session)
    return {"removed": session}


@handles("wait")
def wait(manager: SessionManager, session: str | None, *, wait: float = 60.0) -> R.State:
    return _session(manager, session).wait(_bounded(wait))


@handles("continue")
def continue_(
    manager: SessionManager, session: str | None, *, wait: float = 60.0, no_wait: bool = False
) -> R.State:
    return _session(manager, session).resume(P.CONTINUE, None, 0.0 if no_wait else _bounded(wait))


@handles("step")
def step(
    manager: SessionManager,
    session: str | None,
    *,
    kind: str = "over",
    into_libraries: bool = False,
    wait: float = 60.0,
) -> R.State:
    args = {"kind": kind or "over", "into_libraries": into_libraries}
    return _session(manager, session).resume(P.STEP, args, _bounded(wait))


@handles("pause")
def pause(manager: SessionManager, session: str | None, *, wait: float = 5.0) -> R.State:
    return _session(manager, session).pause(_bounded(wait))


@handles("location")
def location(manager: SessionManager, session: str | None) -> R.State:
    s = _session(manager, session)
    return {**s.snapshot(), **P.LOCATION.call(s)}


@handles("up")
def up(manager: SessionManager, session: str | None, *, count: int = 1) -> R.FrameSelected:
    return P.FRAME.call(_session(manager, session), {"move": count or 1})


@handles("down")
def down(manager: SessionManager, session: str | None, *, count: int = 1) -> R.FrameSelected:
    return P.FRAME.call(_session(manager, session), {"move": -(count or 1)})


@handles("eval")
def eval_(
    manager: SessionManager,
    session: str | None,
    *,
    expression: str,
    timeout: float = 30.0,
    against: str | None = None,
) -> R.Evaluation:
    timeout = float(timeout or 30.0)
    if against:  # the same expression in a second paused session, side by side
        from ..side_by_side import evaluate_both

        if against == session:
            raise MldbgError(
                "against names the session itself: give the other paused session",
                code=BAD_ARGUMENT,
                argument="against",
            )
        other = manager.get(against)
        return evaluate_both(_session(manager, session), other, expression, timeout)
    return _session(manager, session).evaluate(expression, timeout)


@handles("output")
def output(
    manager: SessionManager,
    session: str | None,
    *,
    tail: int | None = None,
    offset: int | None = None,
    limit: int = 16384,
) -> R.Output:
    return _session(manager, session).output(tail, offset, limit or 16384)


@handles("terminate")
def terminate(manager: SessionManager, session: str | None) -> R.State:
    """Ending an ended session is what was asked, already done (as ``wait`` on one):
    answered with its state and ``already_ended``, never an error."""
    target = _session(manager, session)
    already = target.ended
    state = target.terminate()
    state["already_ended"] = already
    return state


# -- breakpoints ------------------------------------------------------------------------------


@handles("break")
def break_(
    manager: SessionManager,
    session: str | None,
    *,
    file: str | None = None,
    line: int | None = None,
    condition: str | None = None,
    hits: str | None = None,
    log: str | None = None,
    checkpoint: str | None = None,
    function: str | None = None,
    raised: list[str] | None = None,
    uncaught: list[str] | None = None,
    this_thread: bool = False,
    nonfinite: bool = False,
    max_abs: float | None = None,
    subnormal: bool = False,
) -> R.BreakpointInfo:
    s = _session(manager, session)
    spec: P.BreakArgs = {
        "file": file,
        "line": line,
        "condition": condition,
        "hits": hits,
        "log": log,
        "checkpoint": checkpoint,
        "function": function,
    }
    # [] means every exception: keep it, drop only None
    if raised is not None:
        spec["raised"] = list(raised)
    if uncaught is not None:
        spec["uncaught"] = list(uncaught)
    if this_thread:
        spec["this_thread"] = True
    if nonfinite:  # the tripwire (agent/tripwire.py)
        spec["nonfinite"] = True
    if max_abs:
        spec["max_abs"] = max_abs
    if subnormal:
        spec["subnormal"] = True
    result = s.set_breakpoint(spec)
    s.log.event("breakpoint_set", **result)
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
def remove(
    manager: SessionManager,
    session: str | None,
    *,
    file: str | None = None,
    line: int | None = None,
    checkpoint: str | None = None,
    id: int | None = None,
) -> R.BreakpointInfo:
    s = _session(manager, session)
    spec: P.RemoveArgs = {"file": file, "line": line, "checkpoint": checkpoint, "id": id}
    result = s.remove_breakpoint(spec)
    s.log.event("breakpoint_removed", **result)
    return result


@handles("clear")
def clear(manager: SessionManager, session: str | None) -> R.Removed:
    return _session(manager, session).clear_breakpoints()


# -- pdb / debugpy verbs: until, restart, watch, threads (issue 12) -----------------------------


@handles("until")
def until(
    manager: SessionManager,
    session: str | None,
    *,
    target: str | None = None,
    file: str | None = None,
    line: int | None = None,
    id: int | None = None,
    wait: float = 60.0,
) -> R.State:
    from . import pdb_verbs

    return pdb_verbs.until(_session(manager, session), target, file, line, id, _bounded(wait))


@handles("restart")
def restart(manager: SessionManager, session: str | None, *, wait: float = 30.0) -> R.State:
    from . import pdb_verbs

    assert session is not None
    return pdb_verbs.restart(manager, session, _bounded(wait))


@handles("watch")
def watch(manager: SessionManager, session: str | None, *, expression: str) -> R.Watches:
    from . import pdb_verbs

    s = _session(manager, session)
    return pdb_verbs.with_values(s, s.watch(expression))


@handles("unwatch")
def unwatch(
    manager: SessionManager,
    session: str | None,
    *,
    target: str | None = None,
    id: int | None = None,
) -> R.Watches:
    from . import pdb_verbs

    s = _session(manager, session)
    return pdb_verbs.with_values(s, s.unwatch(pdb_verbs.unwatch_args(target, id)))


@handles("thread")
def thread(manager: SessionManager, session: str | None, *, number: int) -> R.State:
    s = _session(manager, session)
    s.require_paused()
    return {**s.snapshot(), **P.THREAD.call(s, {"number": number})}


# -- the daemon and the run store -------------------------------------------------------------


@handles("sessions")
def sessions(manager: SessionManager, session: str | None, *, prune: bool = False) -> R.Sessions:
    pruned = manager.prune() if prune else []
    # live sessions first, then the newest: what a budget must never cut
    items = sorted(reversed(manager.all()), key=lambda s: s.ended)
    limit = 100
    result: R.Sessions = {
        "sessions": [s.snapshot() for s in items[:limit]],
        "total": len(items),
        "shown": min(len(items), limit),
        "truncated": len(items) > limit,
    }
    if prune:
        result["pruned"] = pruned
    if len(items) > limit:
        result["next"] = fix("sessions", prune=True)
    return result


def store_home(manager: SessionManager, where: Where, session: str | None = None) -> Path:
    """Which run store a call means: ``home`` if given, else the session's, else the
    client's own (``$MLDBG_HOME`` or ``./.mldbg`` where the client runs)."""
    base = where.client_cwd or None
    if where.home:
        return Path(base or os.getcwd(), os.path.expanduser(where.home)).resolve()
    session = session or where.session
    if session:
        found = manager.get(session)
        if found.home is not None:
            return found.home
    env = {"MLDBG_HOME": where.client_home} if where.client_home else {}
    return mldbg_home(base, env)


def _session_run(manager: SessionManager, session: str | None) -> str | None:
    """The run directory of ``session``, if it names one that has a run."""
    if not session:
        return None
    found = manager.get(session)
    return str(found.run.path) if found.run is not None else None


@handles("trace")
def trace(
    manager: SessionManager,
    session: str | None,
    where: Where,
    *,
    last: int = 10,
    run: str | None = None,
) -> R.Trace:
    home = store_home(manager, where, None if run else session)
    if run is None:
        run = _session_run(manager, session)
    return store_queries.trace(home, run, last or 10)


@handles("runs")
def runs(
    manager: SessionManager, session: str | None, where: Where, *, limit: int = 20, offset: int = 0
) -> R.Runs:
    return store_queries.runs(store_home(manager, where), offset or 0, limit or 20)


@handles("checkpoints")
def checkpoints(
    manager: SessionManager,
    session: str | None,
    where: Where,
    *,
    run: str | None = None,
    name: str | None = None,
    hit: int | None = None,
    offset: int = 0,
    limit: int = 20,
) -> R.Checkpoints:
    home = store_home(manager, where)
    if run is None:
        run = _session_run(manager, where.session)
    return store_queries.checkpoints(home, run, name, hit, offset or 0, limit or 20)


@handles("compare-checkpoints")
def compare_checkpoints(
    manager: SessionManager,
    session: str | None,
    where: Where,
    *,
    b: str,
    a: str | None = None,
    name: str | None = None,
    hit: int | None = None,
    offset: int = 0,
    limit: int = 20,
) -> R.CheckpointPairs:
    from ..store.checkpoint_diff import compare_runs

    home = store_home(manager, where)
    base = where.client_cwd or os.getcwd()

    def run_path(spec: str | None) -> str | None:  # a relative run directory is the client's
        if spec and spec.startswith((".", "~")) or spec and "/" in spec:
            return str(Path(base, os.path.expanduser(spec)))
        return spec

    if a is None:
        a = _session_run(manager, where.session)
    return compare_runs(home, run_path(a), run_path(b) or "", name, hit, offset or 0, limit or 20)


@handles("nonfinite")
def nonfinite(
    manager: SessionManager, session: str | None, where: Where, *, source: str
) -> R.FirstNonfinite:
    from ..compare.culprit.nonfinite import first_nonfinite

    # the parity package answers plain dicts: their shape is results.FirstNonfinite
    found = deadline.call_bounded(
        "nonfinite",
        deadline.seconds_allowed(),
        lambda: first_nonfinite(where.local(source), home=store_home(manager, where)),
    )
    return cast("R.FirstNonfinite", found)


@handles("module-table")
def module_table(
    manager: SessionManager,
    session: str | None,
    where: Where,
    *,
    a: str,
    b: str | None = None,
    sort: str = "order",
    offset: int = 0,
    limit: int = 50,
) -> R.ModuleTable:
    from ..compare.report.table import module_table as table

    found = deadline.call_bounded(
        "module-table",
        deadline.seconds_allowed(),
        lambda: table(
            where.local(a),
            where.local(b) if b else None,
            home=store_home(manager, where),
            sort=sort or "order",
            offset=offset or 0,
            limit=limit or 50,
        ),
    )
    return cast("R.ModuleTable", found)


@handles("captures")
def captures(
    manager: SessionManager,
    session: str | None,
    where: Where,
    *,
    run: str | None = None,
    limit: int = 50,
) -> R.Captures:
    return store_queries.captures(store_home(manager, where), run, limit or 50)


@handles("compare")
def compare(
    manager: SessionManager,
    session: str | None,
    where: Where,
    *,
    a: str,
    b: str,
    rtol: float | None = None,
    atol: float | None = None,
    map: dict[str, Any] | str | None = None,
    layout: str | None = None,
    replay: str | None = None,
    better: str | None = None,
    shards: dict[str, int | str] | None = None,
    html: str | None = None,
    passing: bool = False,
    inputs: bool = False,
    module: str | None = None,
    call: int | None = None,
    status: str | None = None,
    kind: str | None = None,
    limit: int = 20,
    offset: int = 0,
) -> R.CompareSummary:
    from ..compare import compare_answer

    answer = deadline.call_bounded(
        "compare",
        deadline.seconds_allowed(),
        lambda: compare_answer(
            store_home(manager, where),
            a=where.local(a),
            b=where.local(b),
            rtol=rtol,
            atol=atol,
            map=map if isinstance(map, dict) or map is None else where.local(map),
            layout=layout,
            replay=replay,
            better=better,
            shards=shards,
            html=where.local(html) if html else None,
            passing=passing,
            inputs=inputs,
            module=module,
            call=call,
            status=status,
            kind=kind,
            offset=offset,
            limit=limit,
        ),
    )
    return cast("R.CompareSummary", answer)


@handles("line")
def line(
    manager: SessionManager,
    session: str | None,
    where: Where,
    *,
    a: str,
    b: str,
    map: str | None = None,
    budget: str | None = None,
    job: str | None = None,
    wait: float = 600.0,
    offset: int | None = None,
    limit: int = 20,
    base_env: dict[str, str] | None = None,
) -> R.LineStep:
    """Start the line step (or find the one ``job`` names) and wait for it a while."""
    from ..capture.budget import parse_size
    from .line_jobs import LineRequest, answer_of, jobs_of

    jobs = jobs_of(manager)
    if job is not None:
        found = jobs.get(job)
    else:
        try:
            size = parse_size(budget) if budget else None
        except ValueError as exc:
            raise MldbgError(str(exc), code=BAD_ARGUMENT, argument="budget") from None
        request = LineRequest(
            a=where.local(a),
            b=where.local(b),
            home=store_home(manager, where),
            map=where.local(map) if map else None,
            budget=size,
            base_env=base_env,
        )
        found = jobs.start(manager, request)
    found.done.wait(_bounded(wait))
    return answer_of(found, offset, limit)


@handles("weights")
def weights(
    manager: SessionManager,
    session: str | None,
    where: Where,
    *,
    reference: str,
    port: str,
    map: str | None = None,
    fresh: str | None = None,
    quantization: str | None = None,
    shards: dict[str, int | str] | None = None,
    limit: int = 50,
) -> R.WeightAudit:
    from ..weights.audit import audit_weights

    home = store_home(manager, where)
    result = deadline.call_bounded(
        "the weight audit",
        deadline.seconds_allowed(),
        lambda: audit_weights(
            where.local(reference),
            where.local(port),
            map=map,
            fresh=fresh,
            home=home,
            quantization=quantization,
            shards=shards,
        ),
    )
    result.pop("parameters", None)  # every parameter: the Python API's; the answer is bounded
    problems = result["problems"]
    result["problems"] = problems[:limit]
    result["total"] = len(problems)
    result["truncated"] = len(problems) > limit
    return cast("R.WeightAudit", result)


@handles("tensors")
def tensors(
    manager: SessionManager,
    session: str | None,
    where: Where,
    *,
    action: str = "list",
    name: str | None = None,
    yes: bool = False,
    limit: int = 100,
) -> R.TensorStore:
    from ..store import tensors as store

    home = tensor_home(manager, where)
    action = action or "list"
    try:
        if action == "list":
            items = store.list_tensors(home)
            shown, paged = store_queries.page(
                items, 0, limit or 100, "tensors", {"limit": len(items)}
            )
            return {
                "path": str(store.store_dir(home)),
                "tensors": shown,
                "size_bytes": store.store_size(home),
                **paged,
            }
        if action == "info":
            if not name:
                raise MldbgError("tensors info needs a name", code=BAD_ARGUMENT, argument="name")
            return cast("R.TensorStore", store.tensor_info(name, home))
        if not name and not yes:
            count = len(store.list_tensors(home))
            raise MldbgError(
                f"this deletes all {count} tensor(s) in {store.store_dir(home)}; "
                "confirm with yes, or name the one tensor to clear",
                code=CONFIRM,
                fix=[fix("tensors", action="clear", yes=True)],
            )
        return {"removed": store.clear_tensors(name, home)}
    except (FileNotFoundError, ValueError) as exc:
        raise MldbgError(str(exc)[:2000], code=NO_SUCH_TENSOR) from None


def tensor_home(manager: SessionManager, where: Where) -> Path:
    """Whose tensor store a call means: ``home`` if given; else, as ``debug_save`` in that
    process would find it, the session's or the client's ``MLDBG_HOME``, else the user's
    store shared by every repository (``tensors.tensor_home``)."""
    from ..store import tensors as store

    if where.home:
        return store_home(manager, where)
    if where.session:
        s = manager.get(where.session)
        env = {**(s.request.env or os.environ), **s.request.env_overrides}
        return store.tensor_home(s.request.cwd, env)
    env = {"MLDBG_HOME": where.client_home} if where.client_home else {}
    return store.tensor_home(where.client_cwd, env)


@handles("clean")
def clean(
    manager: SessionManager,
    session: str | None,
    where: Where,
    *,
    keep: int = 10,
    dry_run: bool = False,
) -> R.Cleaned:
    return clean_runs(store_home(manager, where), keep, dry_run)


def _forward(command: P.AgentCommand[Any, Any]) -> Handler:
    """The handler of a verb that passes its arguments on to one agent command."""
    names = tuple(command.args.__annotations__)

    def forward(manager: SessionManager, session: str | None, **a: object) -> Any:
        args = {k: a[k] for k in names if a.get(k) is not None}
        return _session(manager, session).ask(command, args)

    return forward


for _verb in VERBS:
    if _verb.agent is not None:
        if _verb.name in HANDLERS:
            raise RuntimeError(f"verb {_verb.name!r} passes its arguments on: it has no handler")
        HANDLERS[_verb.name] = _forward(_verb.agent)


def missing_handlers() -> list[str]:
    """Verbs declared without a handler: a test keeps this empty."""
    return [name for name in BY_NAME if name not in HANDLERS]
