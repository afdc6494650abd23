"""The REST API: a thin layer over the SessionManager, one route per CLI verb.

Errors come back as ``{"error", "code", ...}`` with a 4xx/5xx status; every route needs
the bearer token (see security.py).
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import Body, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from .. import __version__
from ..errors import MldbgError
from .classic import classic_router
from .security import SecurityMiddleware
from .sessions import Session, SessionManager, StartRequest

MAX_WAIT = 30.0


class BreakpointSpec(BaseModel):
    file: str | None = Field(
        None, description="path; relative paths resolve against the session's cwd"
    )
    line: int | None = None
    checkpoint: str | None = Field(
        None,
        description="instead of file/line: pause only at debug_checkpoint calls of this name (glob)",
    )
    condition: str | None = Field(None, description="stop only when this expression is true")
    hits: str | None = Field(
        None, description="N: the Nth hit; >=N: from the Nth on; %N: every Nth"
    )
    log: str | None = Field(
        None, description="logpoint: print this, with {expr} filled in; don't stop"
    )


class StartBody(BaseModel):
    script: str | None = None
    module: str | None = None
    args: list[str] = []
    python: str | None = None
    cwd: str | None = None
    env: dict[str, str] | None = Field(
        None, description="the whole environment (default: the daemon's)"
    )
    env_overrides: dict[str, str] = {}
    breakpoints: list[BreakpointSpec] = []
    stop_on_entry: bool = True
    replace: bool = False
    wait: float = Field(30.0, description="seconds to wait for the first stop")


class WaitBody(BaseModel):
    wait: float = 0.0


class StepBody(BaseModel):
    kind: str = "over"
    into_libraries: bool = False
    wait: float = 10.0


class FrameBody(BaseModel):
    index: int | None = None
    move: int = 0


class EvalBody(BaseModel):
    expression: str


class LocationBody(BaseModel):
    file: str | None = None
    line: int | None = None
    checkpoint: str | None = None


def _bounded(wait: float) -> float:
    return max(0.0, min(float(wait), MAX_WAIT))


def create_app(manager: SessionManager, token: str) -> FastAPI:
    app = FastAPI(
        title="mldbg",
        version=__version__,
        description="Debugger daemon for PyTorch and MLX scripts. Every route needs "
        "`Authorization: Bearer <token>` (token in ~/.mldbg/server.json).",
    )
    app.state.manager = manager

    @app.exception_handler(MldbgError)
    async def _mldbg_error(request: Request, exc: MldbgError) -> JSONResponse:
        return JSONResponse(status_code=exc.status, content=exc.to_json())

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        message = (
            f"internal error in the mldbg daemon: {type(exc).__name__}: {exc} (please report it)"
        )
        return JSONResponse(status_code=500, content={"error": message, "code": "internal"})

    def session(name: str) -> Session:
        return manager.get(name)

    @app.get("/v1/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "version": __version__, "pid": os.getpid()}

    @app.post("/v1/shutdown")
    def shutdown() -> dict[str, Any]:
        """Terminate every session and stop the daemon."""
        manager.shutdown()
        stop = getattr(app.state, "stop", None)
        if stop is not None:
            stop()
        return {"stopping": True, "pid": os.getpid()}

    @app.get("/v1/sessions")
    def list_sessions() -> dict[str, Any]:
        return {"sessions": [s.snapshot() for s in manager.all()]}

    @app.post("/v1/sessions/{name}/start")
    def start(name: str, body: StartBody) -> dict[str, Any]:
        request = StartRequest(
            script=body.script,
            module=body.module,
            args=body.args,
            python=body.python,
            cwd=body.cwd,
            env=body.env,
            env_overrides=body.env_overrides,
            breakpoints=[bp.model_dump() for bp in body.breakpoints],
            stop_on_entry=body.stop_on_entry,
            replace=body.replace,
        )
        started = manager.start(name, request)
        return started.wait(_bounded(body.wait) if body.stop_on_entry else 0.0)

    @app.get("/v1/sessions/{name}")
    def status(name: str) -> dict[str, Any]:
        return session(name).snapshot()

    @app.delete("/v1/sessions/{name}")
    def forget(name: str) -> dict[str, Any]:
        manager.remove(name)
        return {"removed": name}

    @app.post("/v1/sessions/{name}/wait")
    def wait(name: str, body: WaitBody) -> dict[str, Any]:
        return session(name).wait(_bounded(body.wait))

    @app.post("/v1/sessions/{name}/continue")
    def continue_(name: str, body: WaitBody = Body(default_factory=WaitBody)) -> dict[str, Any]:
        return session(name).resume("continue", None, _bounded(body.wait))

    @app.post("/v1/sessions/{name}/step")
    def step(name: str, body: StepBody) -> dict[str, Any]:
        if body.kind not in ("over", "into", "out"):
            raise MldbgError(
                f"unknown step kind {body.kind!r}: use over, into or out", code="bad_step"
            )
        args = {"kind": body.kind, "into_libraries": body.into_libraries}
        return session(name).resume("step", args, _bounded(body.wait))

    @app.post("/v1/sessions/{name}/pause")
    def pause(
        name: str, body: WaitBody = Body(default_factory=lambda: WaitBody(wait=5.0))
    ) -> dict[str, Any]:
        return session(name).pause(_bounded(body.wait))

    @app.get("/v1/sessions/{name}/location")
    def location(name: str) -> dict[str, Any]:
        s = session(name)
        result: dict[str, Any] = s.paused_command("location")
        return {**s.snapshot(), **result}

    @app.get("/v1/sessions/{name}/stack")
    def stack(name: str) -> dict[str, Any]:
        result: dict[str, Any] = session(name).paused_command("stack")
        return result

    @app.post("/v1/sessions/{name}/frame")
    def frame(name: str, body: FrameBody) -> dict[str, Any]:
        result: dict[str, Any] = session(name).paused_command(
            "select_frame", {"index": body.index, "move": body.move}
        )
        return result

    @app.get("/v1/sessions/{name}/variables")
    def variables(
        name: str, all: bool = Query(False, description="include globals")
    ) -> dict[str, Any]:
        result: dict[str, Any] = session(name).paused_command("variables", {"all": all})
        return result

    @app.post("/v1/sessions/{name}/eval")
    def evaluate(name: str, body: EvalBody) -> dict[str, Any]:
        return session(name).evaluate(body.expression)

    @app.get("/v1/sessions/{name}/breakpoints")
    def breakpoints(name: str) -> dict[str, Any]:
        result: dict[str, Any] = session(name).command("list_breakpoints")
        return result

    @app.post("/v1/sessions/{name}/breakpoints")
    def add_breakpoint(name: str, body: BreakpointSpec) -> dict[str, Any]:
        s = session(name)
        result: dict[str, Any] = s.command("set_breakpoint", body.model_dump())
        s.log_event("breakpoint_set", **result)
        return result

    @app.post("/v1/sessions/{name}/breakpoints/remove")
    def remove_breakpoint(name: str, body: LocationBody) -> dict[str, Any]:
        s = session(name)
        result: dict[str, Any] = s.command("remove_breakpoint", body.model_dump())
        s.log_event("breakpoint_removed", **result)
        return result

    @app.post("/v1/sessions/{name}/breakpoints/clear")
    def clear_breakpoints(name: str) -> dict[str, Any]:
        result: dict[str, Any] = session(name).command("clear_breakpoints")
        return result

    @app.get("/v1/sessions/{name}/output")
    def output(name: str, tail: int | None = Query(None, ge=0)) -> dict[str, Any]:
        return session(name).output(tail)

    @app.post("/v1/sessions/{name}/terminate")
    def terminate(name: str) -> dict[str, Any]:
        return session(name).terminate()

    app.include_router(classic_router(manager))
    app.add_middleware(SecurityMiddleware, token=token)
    return app
