"""The classic ``/debug/...`` routes, for people and tools used to that workflow.

They act on the ``default`` session and wrap every answer in the envelope
``{"success", "message", "data", "error"}``.  Each route calls the same Session methods
as the versioned API; nothing here has behaviour of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from .. import budget, verbs
from .. import results as R
from ..agent import protocol as P
from ..errors import BAD_ARGUMENT, BAD_STEP, MldbgError
from .manager import SessionManager
from .sessions import Session, StartRequest

DEFAULT = "default"
STEP_WAIT = 10.0


# The same limits as the verbs' (``verbs.py``): texts refused over them with ``too_long``.
_Text = Annotated[str, Field(max_length=verbs.TEXT_LIMIT)]


class ClassicStart(BaseModel):
    script_path: _Text
    args: Annotated[
        list[Annotated[str, Field(max_length=verbs.ENV_LIMIT)]],
        Field(max_length=verbs.ITEMS_LIMIT),
    ] = []
    cwd: _Text | None = None
    python: _Text | None = None
    stop_on_entry: bool = True


class ClassicBreakpoint(BaseModel):
    file_path: _Text
    line: int
    condition: Annotated[str, Field(max_length=verbs.ECHOED_LIMIT)] | None = None


class ClassicEval(BaseModel):
    expression: Annotated[str, Field(max_length=verbs.CODE_LIMIT)]


def _envelope(message: str, action: Callable[[], object]) -> JSONResponse:
    try:
        data = action()
    except MldbgError as exc:
        content = {
            "success": False,
            "message": budget.capped(str(exc.message), budget.MESSAGE),
            "data": exc.extra or None,
            "error": exc.code,
        }
        return JSONResponse(status_code=exc.status, content=budget.shrink(content, budget.ERROR))
    return JSONResponse(content={"success": True, "message": message, "data": data, "error": None})


def classic_router(manager: SessionManager) -> APIRouter:
    router = APIRouter(prefix="/debug", tags=["classic"])

    def default() -> Session:
        return manager.get(DEFAULT)

    @router.post("/start")
    def start(body: ClassicStart) -> JSONResponse:
        def run() -> R.State:
            script = os.path.expanduser(body.script_path)
            cwd = body.cwd
            if cwd is None:
                # Never the daemon's own directory: a relative path needs the caller's cwd.
                if not os.path.isabs(script):
                    raise MldbgError(
                        f"script_path {body.script_path!r} is relative: give an absolute path, "
                        "or `cwd` (the directory it is relative to, also the script's cwd)",
                        code=BAD_ARGUMENT,
                        argument="cwd",
                    )
                cwd = os.path.dirname(script)
            request = StartRequest(
                script=script,
                args=body.args,
                cwd=cwd,
                python=body.python,
                stop_on_entry=body.stop_on_entry,
                replace=True,
            )
            return manager.start(DEFAULT, request).wait(30.0 if body.stop_on_entry else 0.0)

        return _envelope("started", run)

    @router.post("/breakpoint")
    def breakpoint(body: ClassicBreakpoint) -> JSONResponse:
        spec: P.BreakArgs = {"file": body.file_path, "line": body.line, "condition": body.condition}
        return _envelope("breakpoint set", lambda: default().set_breakpoint(spec))

    @router.post("/breakpoint/remove")
    def remove(body: ClassicBreakpoint) -> JSONResponse:
        spec: P.RemoveArgs = {"file": body.file_path, "line": body.line}
        return _envelope("breakpoint removed", lambda: default().remove_breakpoint(spec))

    @router.get("/breakpoints")
    def breakpoints() -> JSONResponse:
        return _envelope("breakpoints", lambda: P.BREAKS.call(default()))

    @router.post("/breakpoints/clear")
    def clear() -> JSONResponse:
        return _envelope("breakpoints cleared", lambda: default().clear_breakpoints())

    @router.post("/continue_async")
    def continue_async() -> JSONResponse:
        return _envelope("continued", lambda: default().resume(P.CONTINUE, None, 0.0))

    @router.post("/step/{kind}")
    def step(kind: str) -> JSONResponse:
        def run() -> R.State:
            if kind not in ("over", "into", "out"):
                raise MldbgError(
                    f"unknown step kind {kind!r}: use over, into or out",
                    code=BAD_STEP,
                    status=404,
                )
            return default().resume(P.STEP, {"kind": kind}, STEP_WAIT)

        return _envelope(f"stepped {kind}", run)

    @router.post("/evaluate")
    def evaluate(body: ClassicEval) -> JSONResponse:
        return _envelope("evaluated", lambda: default().evaluate(body.expression))

    @router.get("/location")
    def location() -> JSONResponse:
        return _envelope("location", lambda: P.LOCATION.call(default()))

    @router.get("/status")
    def status() -> JSONResponse:
        return _envelope("status", lambda: default().snapshot())

    @router.get("/variables")
    def variables() -> JSONResponse:
        return _envelope("variables", lambda: P.VARS.call(default(), {"all": False}))

    @router.post("/terminate")
    def terminate() -> JSONResponse:
        return _envelope("terminated", lambda: default().terminate())

    return router
