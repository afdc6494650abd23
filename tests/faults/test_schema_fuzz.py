"""Schemathesis over the daemon's own OpenAPI schema, against a live paused session.

Every documented route gets generated requests, valid and invalid, aimed at a real
paused debuggee: none may answer 5xx or drop the connection, every answer is bounded,
and afterwards the session is still paused and answering.  Kept short (a few examples
per route, derandomized) so it runs in every ``make test``.

Routes that end things (shutdown, terminate, forget), start processes (start, restart),
resume the script (continue, step, until) or touch the run store's files (clean, tensors,
compare) are left out: their faults have their own tests, and here they would only end the
session the others need.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from daemons import start_body

from conftest import Api, line_of

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

EXCLUDED = {
    ("POST", "/v1/shutdown"),
    ("POST", "/v1/sessions/{name}/start"),
    ("POST", "/v1/sessions/{name}/continue"),
    ("POST", "/v1/sessions/{name}/step"),
    ("POST", "/v1/sessions/{name}/pause"),
    ("POST", "/v1/sessions/{name}/until"),
    ("POST", "/v1/sessions/{name}/restart"),
    ("POST", "/v1/sessions/{name}/terminate"),
    ("DELETE", "/v1/sessions/{name}"),
    ("POST", "/v1/clean"),
    ("POST", "/v1/tensors"),
    ("POST", "/v1/compare"),
    ("POST", "/debug/start"),
    ("POST", "/debug/terminate"),
    ("POST", "/debug/continue_async"),
    ("POST", "/debug/step/{kind}"),
}
EXAMPLES = 10  # per route and mode: ~30 routes x 2 modes, well under a minute
LIMIT = (1 << 20) + 4096  # the daemon's answer cap, and a little for the envelope

SCRIPT = """
import sys
values = [1, 2, 3]
secret = {"k": "v" * 10}
marker = 0  # stop here
print("end")
"""


def test_fuzzing_the_schema_never_gets_a_5xx(
    api: Api, daemon: dict[str, Any], write, tmp_path
) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    script = write("fuzzed.py", SCRIPT)
    body = start_body(
        script,
        tmp_path,
        stop_on_entry=False,
        breakpoints=[{"file": str(script), "line": line_of(script, "stop here")}],
    )
    api.post("/v1/sessions/fuzzed/start", body)
    assert api.post("/v1/sessions/fuzzed/wait", {"wait": 30})["state"] == "paused"
    headers = {"Authorization": f"Bearer {daemon['token']}"}
    schema = schemathesis.openapi.from_dict(api.get("/openapi.json"))
    tried: list[str] = []
    failures: list[str] = []
    try:
        for result in schema.get_all_operations():
            operation = result.ok()
            if (operation.method.upper(), operation.path) in EXCLUDED:
                continue
            names = {"name": "fuzzed"} if "{name}" in operation.path else None
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                strategy = operation.as_strategy(mode, path_parameters=names)

                @settings(
                    max_examples=EXAMPLES,
                    deadline=None,
                    database=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=strategy)
                def exercise(case: Any) -> None:
                    response = case.call(base_url=daemon["url"], headers=headers, timeout=60)
                    label = f"{case.method} {case.formatted_path}: {response.status_code}"
                    if response.status_code >= 500:
                        failures.append(f"{label} {response.text[:300]}")
                    if len(response.content) > LIMIT:
                        failures.append(f"{label}: {len(response.content)} bytes")

                try:
                    exercise()
                except Unsatisfiable:  # nothing to make invalid (a route without inputs)
                    assert mode == GenerationMode.NEGATIVE
                    continue
                tried.append(f"{operation.method.upper()} {operation.path} {mode.value}")
        assert not failures, "\n".join(failures[:20])
        assert len(tried) >= 40, tried  # the schema was really walked
        # the session the fuzzing aimed at is unharmed
        state = api.get("/v1/sessions/fuzzed")
        assert state["state"] == "paused", state
        assert api.post("/v1/sessions/fuzzed/eval", {"expression": "sum(values)"})["result"] == "6"
        assert api.get("/v1/health")["ok"] is True
    finally:
        api.post("/v1/sessions/fuzzed/terminate")


# What the door answers when it refuses a request's *shape* (an argument's type, length
# or pattern: ``bad_argument`` with the ``problems`` of each, ``too_long``...): for a
# request the schema says is valid, that is the schema and the daemon disagreeing.  Codes
# that say what the request names does not exist or is in the wrong state (unknown_run,
# no_such_frame, not_paused...) answer about the world, not the shape; so does a rule
# across arguments the schema does not state ("a breakpoint needs a file", a
# ``bad_argument`` without ``problems``).
SHAPE_CODES = {"too_long", "bad_session_name", "bad_path"}


def _refused_shape(answer: dict[str, Any]) -> bool:
    code = answer.get("code")
    return code in SHAPE_CODES or (code == "bad_argument" and "problems" in answer)


def _declared(schema: dict[str, Any]) -> dict[str, set[str]]:
    methods = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
    return {
        path: {m.upper() for m in operations if m in methods}
        for path, operations in schema["paths"].items()
    }


def test_the_schema_and_the_daemon_agree(api: Api, daemon: dict[str, Any], write, tmp_path) -> None:
    """schemathesis' checks, and what they found disagreeing: a `null` body the schema
    allowed, `4497.0` for an integer, a 4,096-character path, refused as bad input; an
    undeclared method answered 405 without `Allow`.  Valid requests (generated and
    those) are never refused for their shape; invalid ones always are; every answer is
    as documented."""
    import httpx
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.checks import (
        content_type_conformance,
        negative_data_rejection,
        not_a_server_error,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        negative_data_rejection,
    ]
    script = write("agreed.py", SCRIPT)
    body = start_body(
        script,
        tmp_path,
        stop_on_entry=False,
        breakpoints=[{"file": str(script), "line": line_of(script, "stop here")}],
    )
    api.post("/v1/sessions/agree/start", body)
    assert api.post("/v1/sessions/agree/wait", {"wait": 30})["state"] == "paused"
    headers = {"Authorization": f"Bearer {daemon['token']}"}
    document = api.get("/openapi.json")
    schema = schemathesis.openapi.from_dict(document)
    failures: list[str] = []
    tried = 0
    try:
        for result in schema.get_all_operations():
            operation = result.ok()
            if (operation.method.upper(), operation.path) in EXCLUDED:
                continue
            names = {"name": "agree"} if "{name}" in operation.path else None
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                strategy = operation.as_strategy(mode, path_parameters=names)

                @settings(
                    max_examples=15,
                    deadline=None,
                    database=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=strategy)
                def exercise(case: Any) -> None:
                    label = f"{case.method} {case.formatted_path} ({mode.value})"  # noqa: B023
                    response = case.call(base_url=daemon["url"], headers=headers, timeout=60)
                    try:
                        case.validate_response(response, checks=checks)
                    except BaseException as exc:  # the checks' failures (a group), collected
                        if isinstance(exc, KeyboardInterrupt):
                            raise
                        failures.append(f"{label}: {str(exc)[:400]}")
                    positive = mode == GenerationMode.POSITIVE  # noqa: B023 - run at once
                    if positive and response.status_code == 400 and _refused_shape(response.json()):
                        failures.append(f"{label}: schema-valid, refused: {response.text[:300]}")

                try:
                    exercise()
                except Unsatisfiable:
                    continue
                tried += 1
        json_type = {"Content-Type": "application/json"}
        http = httpx.Client(base_url=daemon["url"], headers=headers | json_type, timeout=60)
        # undeclared methods: 405, and Allow says what the path takes
        for path, methods in _declared(document).items():
            concrete = path.replace("{name}", "agree").replace("{kind}", "over")
            for method in ("TRACE", "PATCH"):
                if method in methods:
                    continue
                response = http.request(method, concrete)
                allow = {m.strip() for m in response.headers.get("allow", "").split(",")}
                if response.status_code != 405 or not methods <= allow:
                    failures.append(f"{method} {path}: {response.status_code}, Allow {allow}")
        # what the probe sent: each accepted as the schema allows it
        assert http.post("/v1/sessions/agree/clear", content=b"null").status_code == 200
        frame = http.post("/v1/sessions/agree/frame", json={"index": 0.0})
        assert frame.status_code == 200 and frame.json()["selected"] == 0, frame.text
        assert http.post("/v1/sessions/agree/frame", json={"index": 0.5}).status_code == 400
        assert http.post("/v1/sessions/agree/frame", json={"index": True}).status_code == 400
        output = http.get("/v1/sessions/agree/output", params={"offset": "0.0"})
        assert output.status_code == 200, output.text
        listed = http.get("/v1/runs", params={"home": "0" * 4096})
        assert listed.status_code == 200 and listed.json()["runs"] == [], listed.text
        # a body the schema requires is not null there, and the route agrees
        eval_body = document["paths"]["/v1/sessions/{name}/eval"]["post"]["requestBody"]
        assert eval_body["required"] is True and "null" not in json.dumps(eval_body)
        assert http.post("/v1/sessions/agree/eval", content=b"null").status_code == 400
        # a session name the pattern refuses is refused, and one it allows is a name
        pattern = next(
            p["schema"]["pattern"]
            for p in document["paths"]["/v1/sessions/{name}/eval"]["post"]["parameters"]
            if p["name"] == "name"
        )
        assert re.fullmatch(pattern, "a..b") is None and re.fullmatch(pattern, "a.b.c")
        assert http.get("/v1/sessions/a..b").status_code == 400
        assert http.get("/v1/sessions/a.b.c").json()["code"] == "unknown_session"
        assert not failures, "\n".join(failures[:15])
        assert tried >= 40, tried
        assert api.get("/v1/sessions/agree")["state"] == "paused"
    finally:
        api.post("/v1/sessions/agree/terminate")
