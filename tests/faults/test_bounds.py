"""The last-resort answer cap keeps an answer's shape, and error bodies keep theirs small.

The daemon cuts any answer over 1 MB (``server/app.py``'s ``bound_answer``).  It used to
replace the largest value, a list such as ``sessions`` or ``breakpoints``, with a note of
its size: the CLI crashed rendering it and the MCP tools failed their output schemas.
These tests cut real answers and hand them to the real renderers and the real schemas.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter

from conftest import Api
from mldbg import budget, verbs
from mldbg.cli import render
from mldbg.server.app import MAX_ANSWER, bound_answer


def _crashed(index: int) -> dict[str, Any]:
    """A session ended by an exception, its traceback and output tail at their budgets."""
    return {
        "session": f"worker-{index}",
        "state": "crashed",
        "reason": "exception",
        "pid": 1000 + index,
        "exit_code": 1,
        "exception": {"type": "ValueError", "message": "m" * 2_000, "traceback": "t" * 8_000},
        "output_tail": "o" * 4_000,
        "location": {"file": "/x/train.py", "line": index + 1, "function": "main"},
    }


def _holds(verb_name: str, answer: dict[str, Any]) -> None:
    """The answer still fits its verb's result type and the CLI still renders it."""
    verb = verbs.get(verb_name)
    TypeAdapter(verb.result).validate_python(answer, strict=False)
    assert render.to_text(verb_name, answer)


def test_a_cut_listing_keeps_every_item_as_an_item() -> None:
    answer = {"sessions": [_crashed(i) for i in range(150)]}  # 2 MB, no hostile input
    assert len(json.dumps(answer)) > MAX_ANSWER
    cut = bound_answer(answer)
    assert len(json.dumps(cut)) <= MAX_ANSWER
    assert cut["truncated"] is True
    assert isinstance(cut["sessions"], list) and len(cut["sessions"]) == 150
    assert all(s["session"] == f"worker-{i}" for i, s in enumerate(cut["sessions"]))
    assert isinstance(cut["sessions"][0]["exception"], dict)
    _holds("sessions", cut)


def test_a_listing_too_long_for_its_items_keeps_the_first_and_says_how_many() -> None:
    answer = {"breakpoints": [{"id": i, "file": f"/x/{i}.py", "line": 1} for i in range(50_000)]}
    cut = bound_answer(answer)
    assert len(json.dumps(cut)) <= MAX_ANSWER
    kept = cut["breakpoints"]
    assert isinstance(kept, list) and 0 < len(kept) < 50_000
    assert kept[0] == answer["breakpoints"][0]
    assert cut["cut"][".breakpoints"] == {"shown": len(kept), "total": 50_000}
    _holds("breaks", cut)


def test_one_huge_string_is_cut_in_place() -> None:
    answer = {"watches": [{"id": 1, "expression": "x" * 3_000_000}], "breakpoints": []}
    cut = bound_answer(answer)
    assert len(json.dumps(cut)) <= MAX_ANSWER
    assert cut["watches"][0]["id"] == 1 and "bytes cut" in cut["watches"][0]["expression"]
    _holds("breaks", cut)


def test_error_bodies_stay_small_whatever_the_input(api: Api) -> None:
    """A 100 KB path made a 102 KB error: every field of an error is bounded, not only
    its message."""
    path = "/nonexistent/" + "p" * 100_000
    response = api.http.post("/v1/clean", json={"home": path, "dry_run": True})
    assert 400 <= response.status_code < 500, response.text[:300]
    assert len(response.content) <= budget.ERROR, len(response.content)
    assert response.json()["code"]
