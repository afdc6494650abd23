"""The REST API, derived from the verb table: one route per verb, nothing written by hand.

For each verb of ``verbs.py`` this builds the argument model (query parameters for GET,
a JSON body otherwise), the route at the verb's path (plus its legacy paths, kept for
old clients and hidden from the schema), and the OpenAPI entry with the result shape and
every error response.  The handler is ``handlers.HANDLERS[verb.name]`` (``handlers.call``).

Errors come back as ``{"error", "code", ...}`` with a 4xx/5xx status; a malformed
request is ``bad_argument`` naming the argument, never pydantic's raw text.  Every route
needs the bearer token (``security.py``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import AsyncIterator, Mapping
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

import anyio.to_thread
from fastapi import Body, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope
from typing_extensions import TypedDict

from .. import __version__, budget, verbs
from .. import results as R
from ..errors import BAD_ARGUMENT, BAD_PATH, BAD_SESSION_NAME, INTERNAL, TOO_LONG, MldbgError
from ..names import (
    SESSION_NAME_MAX,
    SESSION_NAME_PATTERN,
    SESSION_NAME_RULE,
    check_session_name,
)
from ..verbs import VERBS, Arg, Verb
from .classic import classic_router
from .handlers import call
from .manager import SessionManager
from .security import COOKIE_SECONDS, DOCS_LOGIN, LINK_SECONDS, DocsAccess, SecurityMiddleware

# Arguments every run-store verb takes from its client: where the client is, so that
# "./.mldbg" and relative paths mean what they mean there, not in the daemon.
CONTEXT_ARGS = (
    Arg("client_cwd", str, "the client's working directory", cli=False, mcp=False),
    Arg("client_home", str, "the client's $MLDBG_HOME", cli=False, mcp=False),
)
MAX_ANSWER = 1 << 20  # the last line of defence: no answer is larger than 1 MB
# Routes run in worker threads, and `wait`/`continue` hold theirs for up to 30 s.  anyio's
# default of 40 let 40 waiting clients starve every other route (health took 27 s and the
# CLI started a second daemon).  Idle threads cost little; a starved daemon strands sessions.
WORKER_THREADS = 512


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    anyio.to_thread.current_default_thread_limiter().total_tokens = WORKER_THREADS
    yield


class ErrorBody(TypedDict, total=False):
    error: str
    code: str
    argument: str | None  # None: a request with nothing to name
    fix: list[R.Call]  # the calls that fix it
    hint: str
    problems: list[str]  # a malformed request: what was wrong with each argument


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "bad input (`code` says which)"},
    401: {"model": ErrorBody, "description": "missing or wrong token"},
    403: {"model": ErrorBody, "description": "a Host that is not a loopback name (`bad_host`)"},
    404: {"model": ErrorBody, "description": "unknown session (`unknown_session`)"},
    409: {
        "model": ErrorBody,
        "description": "wrong state (`not_paused`, `session_busy`, `session_ended`)",
    },
    500: {"model": ErrorBody, "description": "a bug in mldbg (`internal`)"},
    504: {"model": ErrorBody, "description": "the script did not answer (`agent_timeout`)"},
}


class SafeJSONResponse(JSONResponse):
    """JSON that can always be sent, and read back as UTF-8 by any client: text holding
    lone surrogates (undecodable bytes in a file name, ``os.fsdecode(b"\\xff")``) shows
    them as visible escapes (``\\xff``, ``budget.encodable``), so no surface downstream (the
    CLI's terminal, the MCP server's stdout) meets a string it cannot write."""

    def render(self, content: object) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(budget.encodable(content))


def verb_args(verb: Verb) -> tuple[Arg, ...]:
    """The arguments a verb's route takes: its declared ones, plus the client's context."""
    return verb.args + (CONTEXT_ARGS if verb.store else ())


def _field(arg: Arg, strict: bool = False) -> tuple[object, object]:
    """An argument as a pydantic field.  ``strict`` (JSON bodies): a boolean is never
    taken for a number or a number for a boolean (``"wait": false`` was a wait of 0 s);
    query strings stay lax, they are all text."""
    extra: dict[str, Any] = {"description": arg.help}
    if strict and arg.type in (bool, int, float):
        extra["strict"] = True
    if arg.minimum is not None:
        extra["ge"] = arg.minimum
    if arg.maximum is not None:
        extra["le"] = arg.maximum
    if arg.type is str:
        extra["max_length"] = arg.max_length
    if arg.kind == "session":
        extra["pattern"] = SESSION_NAME_PATTERN
    annotation = arg.type
    if arg.choices:
        from typing import Literal

        annotation = Literal[arg.choices]  # type: ignore[valid-type]
    annotation = annotation if arg.required else annotation | None
    if arg.type is int and not arg.choices:
        # 4497.0 is an integer to JSON Schema, and so to the OpenAPI document: taken as 4497
        # (outside the optional: inside it, pydantic left ``ge`` unsaid in the schema)
        annotation = Annotated[annotation, BeforeValidator(integral)]
    return annotation, Field(... if arg.required else arg.default, **extra)


def args_model(verb: Verb) -> type[BaseModel]:
    """The pydantic model of a verb's arguments; unknown fields are refused."""
    fields = {arg.name: _field(arg, strict=True) for arg in verb_args(verb)}
    return create_model(  # type: ignore[call-overload,no-any-return]
        f"{verb.name.capitalize()}Args",
        __config__=ConfigDict(extra="forbid"),
        **fields,
    )


def _endpoint(manager: SessionManager, verb: Verb, model: type[BaseModel]) -> Any:
    defaults = {arg.name: arg.default for arg in verb_args(verb) if not arg.required}

    def run(session: str | None, values: dict[str, Any]) -> Any:
        # an argument sent as null means "not given": its declared default, never None
        # where the handler counts on a value (`{"keep": null}` was a 500)
        values = {k: defaults.get(k) if v is None else v for k, v in values.items()}
        if session is not None:
            check_session_name(session)
        if verb.store and values.get("session"):
            check_session_name(values["session"])
        refuse_nul_bytes(values)
        refuse_oversized(verb, values)
        try:
            return bound_answer(call(verb, manager, session, values))
        except OSError as exc:
            if not verb.store:
                raise
            # a run-store verb fails on the path it was given (too long, not readable,
            # not a directory): the caller's input, said as such, not a 500
            raise MldbgError(
                f"{verb.name}: cannot read {exc.filename!r}: {exc.strerror or exc}",
                code=BAD_PATH,
                path=str(exc.filename),
            ) from None

    params: list[inspect.Parameter] = []
    if verb.scope == "session":
        params.append(
            inspect.Parameter(
                "name",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=str,
                default=Path(
                    ...,
                    description="session name",
                    pattern=SESSION_NAME_PATTERN,
                    max_length=SESSION_NAME_MAX,
                ),
            )
        )
    if verb.method == "GET":
        for arg in verb_args(verb):
            annotation, field = _field(arg)
            default = ... if arg.required else arg.default
            params.append(
                inspect.Parameter(
                    arg.name,
                    inspect.Parameter.KEYWORD_ONLY,
                    annotation=annotation,
                    # the bounds too: without them a GET took any integer (a 500 deep in
                    # a seek or read, found by schemathesis)
                    default=Query(
                        default,
                        description=arg.help,
                        ge=arg.minimum,
                        le=arg.maximum,
                        max_length=arg.max_length if arg.type is str else None,
                        pattern=SESSION_NAME_PATTERN if arg.kind == "session" else None,
                    ),
                )
            )

        def endpoint(**kwargs: Any) -> Any:
            # the path's {name} is a session verb's; a global verb's own `name` argument
            # (checkpoints --name GLOB) stays an argument
            session = kwargs.pop("name", None) if verb.scope == "session" else None
            return run(session, kwargs)

    else:
        # A body is required (an object) where an argument is; elsewhere it may be left
        # out or null, meaning every default: the schema says which, and the route agrees
        # (a `null` body the schema allowed was refused).
        required = any(a.required for a in verb.args)
        params.append(
            inspect.Parameter(
                "body",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=model if required else model | None,
                default=Body(...) if required else Body(None),
            )
        )

        def endpoint(**kwargs: Any) -> Any:
            session = kwargs.pop("name", None)
            body = kwargs.get("body")
            try:
                values = body.model_dump() if body is not None else model().model_dump()
            except ValidationError as exc:  # a `null` body where arguments are required
                raise RequestValidationError(exc.errors()) from None
            return run(session, values)

    endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    endpoint.__name__ = f"verb_{verb.name}"
    endpoint.__doc__ = verb.description or verb.help
    return endpoint


def integral(value: object) -> object:
    """An integral number given as a float (``4497.0``) or as text in a query string
    (``"4497.0"``, ``"1e3"``) as the int it is; anything else as given, for the int
    validation to judge (a boolean is still no number, ``4497.5`` still no integer)."""
    if isinstance(value, bool) or not isinstance(value, float | str):
        return value
    try:
        number = Decimal(value.strip() if isinstance(value, str) else value)
    except (InvalidOperation, ValueError):
        return value
    if number.is_finite() and number == number.to_integral_value():
        return int(number)
    return value


def _nul_at(value: object, where: str) -> str | None:
    if isinstance(value, str):
        return where if "\0" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{where}[{key!r}]"
            if (isinstance(key, str) and "\0" in key) or _nul_at(item, inner):
                return _nul_at(item, inner) or inner
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _nul_at(item, f"{where}[{index}]")
            if found:
                return found
    return None


def refuse_nul_bytes(values: Mapping[str, object]) -> None:
    """No argument of any verb may hold a NUL byte: no path, argv entry, environment
    variable or Python source can carry one, and deep in the OS it surfaces as a
    ``ValueError`` (a 500).  Refused here, for every verb, naming where it was."""
    for name, value in values.items():
        where = _nul_at(value, name)
        if where is not None:
            raise MldbgError(
                f"{where}: contains a NUL byte (\\0), which no path, argument, environment "
                "variable or source text can hold",
                code=BAD_ARGUMENT,
                argument=where,
            )


def _oversized(value: object, arg: Arg, where: str) -> tuple[str, str, int] | None:
    """The first place in ``value`` over ``arg``'s limits: (where, what, limit)."""
    if isinstance(value, str):
        return (where, "characters", arg.max_length) if len(value) > arg.max_length else None
    if isinstance(value, dict | list | tuple):
        if len(value) > arg.max_items:
            return where, "entries", arg.max_items
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            inner = f"{where}[{key!r}]" if isinstance(value, dict) else f"{where}[{key}]"
            found = _oversized(key, arg, inner) if isinstance(key, str) else None
            found = found or _oversized(item, arg, inner)
            if found:
                return found
    return None


def refuse_oversized(verb: Verb, values: Mapping[str, object]) -> None:
    """Every text an agent sends is bounded at the door (``Arg.max_length`` and
    ``max_items``, documented in the verb table), so nothing unbounded is stored, echoed
    into every state and event, or listed.  The error names the place and the limit, and
    never repeats the text."""
    for arg in verb_args(verb):
        found = _oversized(values.get(arg.name), arg, arg.name)
        if found is not None:
            where, unit, limit = found
            raise MldbgError(
                f"{budget.capped(where, 200)}: longer than its limit of {limit} {unit}",
                code=TOO_LONG,
                argument=arg.name,
                limit=limit,
            )


def bound_answer(data: object) -> object:
    """Verbs keep their own budgets; this catches what one forgot, before it leaves."""
    return budget.shrink(data, MAX_ANSWER) if isinstance(data, dict) else data


def create_app(manager: SessionManager, token: str) -> FastAPI:
    app = FastAPI(
        title="mldbg",
        version=__version__,
        description="Debugger daemon for PyTorch and MLX scripts. Every route needs "
        "`Authorization: Bearer <token>` (token in ~/.mldbg/server.json). Routes are "
        "derived from mldbg's verb table: one per verb, named as the CLI names it.",
        redirect_slashes=False,
        lifespan=_lifespan,
        default_response_class=SafeJSONResponse,
    )
    app.state.manager = manager
    app.state.recovered = []

    @app.exception_handler(MldbgError)
    async def _mldbg_error(request: Request, exc: MldbgError) -> SafeJSONResponse:
        payload = exc.to_json()
        payload["error"] = budget.capped(str(payload.get("error")), budget.MESSAGE)
        fixes = payload.get("fix")
        if isinstance(fixes, list) and fixes and "hint" not in payload:
            # worded as routes: a client of its own (the CLI, MCP) words them its way
            payload["hint"] = "; or ".join(verbs.word(f, "rest") for f in fixes[:3])
        # the message has its budget; what an error carries beside it (the path it was
        # given, candidates, a traceback) is bounded too, as a whole
        return SafeJSONResponse(
            status_code=exc.status, content=budget.shrink(payload, budget.ERROR)
        )

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> SafeJSONResponse:
        return SafeJSONResponse(status_code=400, content=validation_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> SafeJSONResponse:
        code = {404: "no_such_route", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = f"{request.method} {request.url.path}: {exc.detail}"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method the path takes, not only one route's
            headers["Allow"] = ", ".join(_allowed(app, request.scope))
        return SafeJSONResponse(
            status_code=exc.status_code,
            content={"error": budget.capped(message, 500), "code": code},
            headers=headers,
        )

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> SafeJSONResponse:
        message = (
            f"internal error in the mldbg daemon: {type(exc).__name__}: {exc} (please report it)"
        )
        return SafeJSONResponse(
            status_code=500,
            content={"error": budget.capped(message, budget.MESSAGE), "code": INTERNAL},
        )

    @app.get("/v1/health", responses=ERROR_RESPONSES)
    async def health() -> dict[str, Any]:
        """Answered on the event loop itself, never queued behind busy worker threads.
        ``recovered``: what this daemon found left behind by a previous one that died."""
        recovered = list(getattr(app.state, "recovered", []))
        answer = {"ok": True, "version": __version__, "pid": os.getpid()}
        if recovered:
            answer["recovered"] = recovered[:50]
            answer["recovered_total"] = len(recovered)
        return budget.shrink(answer, MAX_ANSWER)

    docs = DocsAccess()

    @app.post("/v1/docs-link", responses=ERROR_RESPONSES)
    def docs_link(request: Request) -> R.DocsLink:
        """A one-time link that opens these docs in a browser (which cannot send the
        bearer header): opened within ``expires_in_s``, it leaves a short-lived cookie that
        admits the docs pages only; every other route still needs the token."""
        base = str(request.base_url).rstrip("/")
        return {
            "url": f"{base}{DOCS_LOGIN}?nonce={docs.link()}",
            "expires_in_s": LINK_SECONDS,
            "cookie_s": COOKIE_SECONDS,
        }

    @app.post("/v1/shutdown", responses=ERROR_RESPONSES)
    def shutdown() -> dict[str, Any]:
        """Terminate every session and stop the daemon: gone within ``STOP_DEADLINE`` s
        of this call, whatever its other threads are doing (``serve.Stop``)."""
        arm = getattr(app.state, "arm_stop", None)
        if arm is not None:
            arm()  # first: ending the sessions is bounded by the deadline too
        manager.shutdown()
        stop = getattr(app.state, "stop", None)
        if stop is not None:
            stop()
        return {"stopping": True, "pid": os.getpid()}

    for verb in VERBS:
        model = args_model(verb)
        endpoint = _endpoint(manager, verb, model)
        responses = {200: {"model": verb.result, "description": verb.help}, **ERROR_RESPONSES}
        summary = verb.help
        app.add_api_route(
            verb.path,
            endpoint,
            methods=[verb.method],
            summary=summary,
            description=(verb.description or verb.help)
            + f"\n\nError codes: {', '.join(verb.all_errors)}.",
            responses=responses,
            tags=["verbs"],
            operation_id=f"verb_{verb.name}",
        )
        for method, route in verb.legacy_routes:
            base = "/v1/sessions/{name}" if verb.scope == "session" else "/v1"
            app.add_api_route(
                f"{base}/{route}",
                endpoint,
                methods=[method],
                include_in_schema=False,
            )

    app.include_router(classic_router(manager))
    app.add_middleware(SecurityMiddleware, token=token, docs=docs)
    _document_every_answer(app)
    return app


def _allowed(app: FastAPI, scope: Scope) -> list[str]:
    """The methods the request's path takes, for a 405's ``Allow``: every route that would
    take the path with that method (one route per verb, so a path can hold two, status's
    GET and forget's DELETE; the classic routes sit in an included router)."""
    allowed = []
    for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
        probe = {**scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in app.router.routes):
            allowed.append(method)
    return allowed


def _document_every_answer(app: FastAPI) -> None:
    """The OpenAPI document lists what each route really answers: every route can answer
    401 and 403 (``security.py`` stands before all of them) and 500; a route that takes
    input answers 400 for bad input; none answers FastAPI's default 422 (a malformed
    request is mldbg's 400 ``bad_argument``, ``validation_error``)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        error = {
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        }
        envelope = {"content": {"application/json": {"schema": {"type": "object"}}}}
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                if path.startswith("/debug/"):  # the classic envelope, "success": false
                    for status in ("400", "404", "409", "504"):
                        responses.setdefault(
                            status, {"description": "failed (`error` says why)", **envelope}
                        )
                takes_input = operation.get("parameters") or operation.get("requestBody")
                for status, what in (
                    ("400", "bad input (`code` says which)" if takes_input else None),
                    ("401", "missing or wrong token (`unauthorized`)"),
                    ("403", "a Host that is not a loopback name (`bad_host`)"),
                    ("500", "a bug in mldbg (`internal`)"),
                ):
                    if what is not None and status not in responses:
                        responses[status] = {"description": what, **error}
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


# The arguments that are session names (``Arg.kind == "session"``), beside a session
# verb's path: the pattern of either refuses a name as ``bad_session_name``.
SESSION_ARGS = frozenset(a.name for v in VERBS for a in v.args if a.kind == "session")


def validation_error(errors: Any) -> ErrorBody:
    """pydantic's complaint as mldbg's error: which argument, what was wrong, no URLs."""
    problems = []
    argument = None
    code = BAD_ARGUMENT
    for error in list(errors)[:10]:
        loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path")]
        name = ".".join(loc) or "request body"
        argument = argument or name
        kind = error.get("type", "")
        where = tuple(error.get("loc", ()))
        named = where[:2] == ("path", "name") or (
            len(where) == 2 and where[1] in SESSION_ARGS and kind == "string_pattern_mismatch"
        )
        if named:
            # the route's own pattern refused it: said as every other edge says it
            code = BAD_SESSION_NAME
            shown = budget.capped(repr(error.get("input")), 80)
            text = f"bad session name {shown}: use {SESSION_NAME_RULE}"
        elif kind == "extra_forbidden":
            text = f"{name}: no such argument"
        elif kind == "missing":
            text = f"{name}: required"
        elif kind in ("string_too_long", "too_long"):
            code = "too_long" if argument == name else code
            text = f"{name}: {error.get('msg', 'too long')}"
        else:
            text = f"{name}: {error.get('msg', 'invalid')}"
        problems.append(budget.capped(text, 300))
    return {
        "error": "bad argument: " + "; ".join(problems),
        "code": code,
        "argument": argument,
        "problems": problems,
    }
