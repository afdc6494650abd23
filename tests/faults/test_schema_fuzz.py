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
