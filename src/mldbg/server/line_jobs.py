"""``mldbg line`` in the daemon: compare, run both scripts again recording the culprit's
scope, align the two runs' lines.

A step takes minutes (two runs of real scripts), longer than one request may wait, so
it is a *job*: the first call starts it in a thread of the daemon and waits up to 30 s;
while it runs, each answer is ``state: running`` with the ``next`` call that waits for
it again (the CLI and the MCP server make those calls themselves, reporting progress).
The finished answer stays with the job for paging (``offset``/``limit``), until the
daemon ends.

Each script runs as a session of its own (``line-<job>-a``, ``-b``), exactly as its
captured run was started (``run.json``: script, arguments, working directory,
interpreter, the variables ``start`` added; the client's environment under them, as
``start`` takes it), into the same run store, with ``$MLDBG_LINES`` saying what to
record instead of ``$MLDBG_CAPTURE``.  The reference runs first: the port's run reads
its records' shapes, to sketch its own values in the reference's layouts.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import budget
from ..errors import (
    INTERNAL,
    NO_SUCH_JOB,
    SCOPE_NOT_REACHED,
    SCRIPT_FAILED,
    MldbgError,
)
from .session_process import StartRequest

if TYPE_CHECKING:
    from .. import results as R
    from ..compare.line.plan import Plan
    from ..compare.line.read import LineRun
    from ..compare.line.verdict import LineVerdict
    from .manager import SessionManager
    from .sessions import Session

RUN_TIMEOUT = 3600.0  # one script's re-run, at most
POLL = 30.0
LINES_ENV = "MLDBG_LINES"
CAPTURE_ENV = "MLDBG_CAPTURE"
MAX_JOBS = 64  # finished jobs kept per daemon (the oldest go first)


@dataclass
class LineRequest:
    a: str
    b: str
    home: Path
    map: str | None
    budget: int | None
    base_env: dict[str, str] | None


@dataclass
class LineJob:
    """One step: its phase while it runs, then its parts or its error."""

    id: str
    request: LineRequest
    phase: str = "comparing"
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    plan: Plan | None = None
    verdict: LineVerdict | None = None
    runs: tuple[LineRun, LineRun] | None = None
    error: MldbgError | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started


class LineJobs:
    """The daemon's line steps, by id."""

    def __init__(self) -> None:
        self._jobs: dict[str, LineJob] = {}
        self._lock = threading.Lock()

    def start(self, manager: SessionManager, request: LineRequest) -> LineJob:
        job = LineJob(secrets.token_hex(4), request)
        with self._lock:
            finished = [j for j in self._jobs.values() if j.done.is_set()]
            for old in finished[: max(0, len(self._jobs) - MAX_JOBS + 1)]:
                self._jobs.pop(old.id, None)
            self._jobs[job.id] = job
        threading.Thread(
            target=_run, args=(manager, job), name=f"mldbg-line-{job.id}", daemon=True
        ).start()
        return job

    def get(self, job_id: str) -> LineJob:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise MldbgError(
                f"no line step {job_id!r} in this daemon (it ended, or was never started): "
                "call line without job to start one",
                code=NO_SUCH_JOB,
                argument="job",
            )
        return job


_JOBS: weakref.WeakKeyDictionary[SessionManager, LineJobs] = weakref.WeakKeyDictionary()


def jobs_of(manager: SessionManager) -> LineJobs:
    """The line steps of this daemon's manager (made with the first)."""
    found = _JOBS.get(manager)
    if found is None:
        found = _JOBS[manager] = LineJobs()
    return found


def _run(manager: SessionManager, job: LineJob) -> None:
    try:
        _steps(manager, job)
    except MldbgError as exc:
        job.error = exc
    except Exception as exc:  # a bug of ours: said with a code, never a hung job
        text = f"internal error in the line step: {type(exc).__name__}: {exc}"
        job.error = MldbgError(budget.capped(text, budget.MESSAGE), code=INTERNAL)
    finally:
        job.phase = "done"
        job.finished = time.monotonic()
        job.done.set()


def _steps(manager: SessionManager, job: LineJob) -> None:
    from ..compare import compare
    from ..compare.line.plan import plan
    from ..compare.line.read import RECORDS, read_lines
    from ..compare.line.verdict import decide

    request = job.request
    comparison = compare(request.a, request.b, map=request.map, home=request.home)
    job.plan = steps = plan(comparison.result, request.budget)
    job.phase = "reference"
    lines_a = _record(manager, job, steps, "a", None)
    job.phase = "port"
    lines_b = _record(manager, job, steps, "b", str(lines_a / RECORDS))
    job.phase = "aligning"
    reference, port = read_lines(lines_a), read_lines(lines_b)
    job.runs = (reference, port)
    job.verdict = decide(reference, port, steps.bound, steps.kind, steps.inputs)


def _record(
    manager: SessionManager, job: LineJob, steps: Plan, label: str, targets: str | None
) -> Path:
    """Run one side's script again with its scope to record; its ``lines`` directory."""
    side = steps.a if label == "a" else steps.b
    who = "reference" if label == "a" else "port"
    added = {k: v for k, v in side.env.items() if k not in (LINES_ENV, CAPTURE_ENV)}
    added[LINES_ENV] = json.dumps(steps.spec(label, targets))
    added["MLDBG_HOME"] = str(side.run.parent.parent)  # the store the captured run is in
    request = StartRequest(
        script=side.script,
        module=side.module,
        args=list(side.args),
        python=side.python,
        cwd=side.cwd,
        env=job.request.base_env,
        env_overrides=added,
        stop_on_entry=False,
        follow=False,
    )
    name = f"line-{job.id}-{label}"
    session = manager.start(name, request)
    try:
        state = _until_ended(session, who, side.command())
    finally:
        manager.remove(name)
    code = state.get("exit_code")
    if code != 0:
        tail = str(state.get("output_tail") or "")[-2000:]
        raise MldbgError(
            f"the {who} script ({side.command()}) ended with exit code {code} when run again "
            f"to record its lines; the end of its output:\n{tail}",
            code=SCRIPT_FAILED,
            side=label,
        )
    assert session.run is not None
    lines = session.run.path / "lines"
    scope = _scope(lines)
    if not scope.get("reached"):
        what = (
            f"the call {side.module_path}#{steps.call}"
            if steps.kind == "module"
            else f"the model call {side.module_path}#{steps.call}"
        )
        said = scope.get("problems")
        problems = "; ".join(str(p) for p in said) if isinstance(said, list) else ""
        raise MldbgError(
            f"the {who}'s run ({side.command()}) never reached {what} of its model "
            f"#{side.model} ({scope.get('models_seen', 0)} model(s) called)"
            + (f": {problems}" if problems else "")
            + ": the script no longer runs as it did when it was captured (arguments, "
            "environment), or its models are called in another order",
            code=SCOPE_NOT_REACHED,
            side=label,
        )
    return lines


def _until_ended(session: Session, who: str, command: str) -> R.State:
    """Wait for the re-run's end; a stop (an uncaught exception's post-mortem) ends it."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        state = session.wait(POLL)
        if state.get("state") == "paused":
            session.terminate()
            detail = state.get("exception") or state.get("reason")
            raise MldbgError(
                f"the {who} script ({command}) stopped when run again ({detail}): "
                "run it alone to see why",
                code=SCRIPT_FAILED,
            )
        if state.get("state") not in ("starting", "running"):
            return state
        if time.monotonic() > deadline:
            session.terminate()
            raise MldbgError(
                f"the {who} script ({command}) ran longer than {RUN_TIMEOUT:.0f} s again",
                code=SCRIPT_FAILED,
            )


def _scope(lines: Path) -> dict[str, object]:
    from ..store import reading

    try:
        data = reading.read_json(lines / "scope.json")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def answer_of(job: LineJob, offset: int | None, limit: int) -> R.LineStep:
    """The job's answer now: running (with the call that waits again), or its result."""
    from ..compare.line.answer import answer
    from ..verbs import fix

    request = job.request
    if not job.done.is_set():
        return {
            "state": "running",
            "phase": job.phase,
            "job": job.id,
            "a": request.a,
            "b": request.b,
            "elapsed": round(job.elapsed, 1),
            "next": fix("line", a=request.a, b=request.b, job=job.id),
        }
    if job.error is not None:
        raise job.error
    assert job.plan is not None and job.verdict is not None and job.runs is not None
    result, more = answer(job.plan, job.verdict, job.runs, offset=offset, limit=limit)
    result.update({"a": request.a, "b": request.b, "job": job.id, "elapsed": round(job.elapsed, 1)})
    if more is not None:
        result["next"] = fix("line", a=request.a, b=request.b, job=job.id, offset=more, limit=limit)
    return result
