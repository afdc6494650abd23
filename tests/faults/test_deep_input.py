"""Deep or huge code from the user is answered with its own code, never ``internal``.

Python's parser and compiler give up on deeply nested code with ``RecursionError`` or
``MemoryError`` ("too complex to parse") rather than ``SyntaxError``, and each version
gives up at a different depth; mldbg's own passes over a condition's tree (compiling it
into the function, rewriting it for the 3.10/3.11 hook) recurse too.  Every length up to
the documented limits (``verbs.CODE_LIMIT`` for an evaluation, ``verbs.ECHOED_LIMIT``
for a condition, a log template, a watch) gets an answer: a result, or ``eval_error`` /
``bad_condition`` / ``bad_log`` naming what was wrong.  A breakpoint is listed only if
it really stops.  Run on every tracer backend (3.10/3.11 ``instrument``, 3.12+
``sys.monitoring``, and ``settrace``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from conftest import Session, backend_params, line_of
from mldbg import verbs

LOOP = """
total = 0
for i in range(5):
    total += i  # loop body
print("done", total)
"""

_ORDINARY = backend_params()
# settrace: the fallback of 3.10/3.11 (the suite's own Python, when it is one of those)
_SETTRACE = [
    pytest.param(p.values[0], "settrace", id=f"{p.id}-settrace", marks=p.marks)
    for p in _ORDINARY
    if p.id == "settrace"
]
BACKENDS = [pytest.param(p.values[0], None, id=p.id, marks=p.marks) for p in _ORDINARY] + _SETTRACE

pytestmark = pytest.mark.parametrize(("python", "backend"), BACKENDS)

# up to the documented limit, each a shape that defeats some parser or compiler
EVALUATIONS = {
    "a long sum": "1+" * 5000 + "1",
    "deep unary minus": "-" * 90_000 + "1",
    "unary minus up to the limit": "-" * (verbs.CODE_LIMIT - 1) + "1",
    "deep not": "not " * (verbs.CODE_LIMIT // 4 - 1) + "1",
    "a long attribute chain": "i" + ".real" * (verbs.CODE_LIMIT // 5 - 1),
    "deep lists": "[" * 5000 + "]" * 5000,
    "deep lambdas": "lambda: " * 5000 + "1",
    "a deep value": "deep = []\nfor _ in range(100_000):\n    deep = [deep]\ndeep",
}
# at most ECHOED_LIMIT characters, true once i >= 1 (or never: refused is fine too)
CONDITIONS = {
    "a long sum": "i+" * 998 + "i>3",
    "deep unary minus": "-" * 1996 + "i>0",
    "deep not": "not " * 498 + "i>0",
    "deep parentheses": "(" * 998 + "i>0" + ")" * 998,
    "a long comparison chain": "0<=" * 665 + "i>0",
    "a long attribute chain": "i" + ".real" * 397 + ">0",
}


def _start(session: Session, write: Any, python: str, backend: str | None) -> Any:
    script = write("loop.py", LOOP)
    env = {**os.environ, "MLDBG_HOME": str(session.cwd / ".mldbg")}
    env.pop("MLDBG_BACKEND", None)
    if backend:
        env["MLDBG_BACKEND"] = backend
    state = session.start(script, python=python, env=env)
    assert state["state"] == "paused", state
    return script


def test_deep_and_huge_evaluations_are_eval_errors_or_results(
    session: Session, write: Any, python: str, backend: str | None
) -> None:
    _start(session, write, python, backend)
    problems = []
    for label, expression in EVALUATIONS.items():
        assert len(expression) <= verbs.CODE_LIMIT, label
        response = session.api.http.post(f"{session.base}/eval", json={"expression": expression})
        answer = response.json()
        if response.status_code == 200:
            assert "result" in answer, (label, answer)
        elif answer.get("code") != "eval_error" or response.status_code >= 500:
            problems.append(f"{label}: {response.status_code} {str(answer)[:300]}")
        else:  # says what went wrong, briefly
            assert len(response.content) < 16_384 and answer["error"], (label, answer)
    assert not problems, "\n".join(problems)
    assert session.value("1 + 1") == "2"  # the session is unharmed
    assert session.state()["state"] == "paused"


@pytest.mark.parametrize("label", sorted(CONDITIONS))
def test_deep_conditions_stop_or_are_refused_and_never_listed(
    session: Session, write: Any, python: str, backend: str | None, label: str
) -> None:
    condition = CONDITIONS[label]
    assert len(condition) <= verbs.ECHOED_LIMIT
    script = _start(session, write, python, backend)
    body = {"file": str(script), "line": line_of(script, "loop body"), "condition": condition}
    response = session.api.http.post(f"{session.base}/break", json=body)
    answer = response.json()
    listed = session.api.get(f"{session.base}/breaks")["breakpoints"]
    if response.status_code != 200:
        assert answer.get("code") == "bad_condition", answer  # its own code, not internal
        assert listed == [], listed  # refused: never listed
        return
    assert [b["id"] for b in listed] == [answer["id"]], listed
    state = session.cont()
    assert state["state"] == "paused" and state["reason"] == "breakpoint", state
    assert session.value("i") == "1"  # where the condition first holds


def test_deep_log_templates_and_watches_have_their_own_codes(
    session: Session, write: Any, python: str, backend: str | None
) -> None:
    script = _start(session, write, python, backend)
    line = line_of(script, "loop body")
    deep = "i+" * 998 + "i"  # 1,999 characters, nested 999 deep
    log = session.api.http.post(
        f"{session.base}/break", json={"file": str(script), "line": line, "log": "{" + deep + "}"}
    )
    assert log.status_code < 500, log.json()
    if log.status_code != 200:
        assert log.json()["code"] == "bad_log", log.json()
    watch = session.api.http.post(f"{session.base}/watch", json={"expression": deep})
    assert watch.status_code < 500, watch.json()
    if watch.status_code != 200:
        assert watch.json()["code"] == "bad_expression", watch.json()
    listed = session.api.get(f"{session.base}/breaks")
    assert len(listed["breakpoints"]) == (log.status_code == 200), listed
    if log.status_code == 200:  # a logpoint that was set logs the value, and never stops
        state = session.cont()
        assert state["state"] == "exited", state
        assert session.output().count(str(999 * 4)) == 1
