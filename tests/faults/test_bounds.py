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
from mldbg.server.app import MAX_ANSWER, bound_answer
from mldbg.text import render


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


def _too_long(arg: verbs.Arg) -> Any:
    """A value of ``arg``'s type with one text a character over its limit."""
    text = "x" * (arg.max_length + 1)
    shape = str(arg.type)
    if shape.startswith("list[dict") or "BreakpointSpec" in shape:
        return [{"file": text, "line": 1}]
    if shape.startswith("list"):
        return [text]
    if shape.startswith("dict[str, str]"):
        return {"K": text}
    if shape.startswith("dict"):  # a mapping whose keys are the texts (compare's shards)
        return {text: 0}
    return text


def _text_args() -> list[tuple[verbs.Verb, verbs.Arg]]:
    from mldbg.server.app import verb_args

    found = []
    for verb in verbs.VERBS:
        for arg in verb_args(verb):
            if arg.choices or arg.type in (int, float, bool):
                continue
            found.append((verb, arg))
    return found


def test_every_text_argument_has_a_limit_refused_with_a_code(api: Api) -> None:
    """Each text an agent can send (expressions, conditions, log templates, watches,
    paths, names, env, argv) is refused over its documented limit with ``too_long``,
    before any session or store is touched, and the error never echoes the text."""
    checked = []
    for verb, arg in _text_args():
        path = verb.path.replace("{name}", "limits")
        value = _too_long(arg)
        body: dict[str, Any] = {arg.name: value}
        for other in verb.args:  # the required ones, valid
            if other.required and other.name != arg.name:
                body[other.name] = 0 if other.type is int else "ok"
        if verb.method == "GET":
            response = api.http.get(path, params=body)
        else:
            response = api.http.request(verb.method, path, json=body)
        label = f"{verb.name}.{arg.name}"
        assert response.status_code == 400, f"{label}: {response.status_code} {response.text[:300]}"
        error = response.json()
        assert error["code"] == "too_long", f"{label}: {error}"
        assert len(response.content) < 2_000, label  # the text is not repeated
        checked.append(label)
    assert {"eval.expression", "watch.expression", "break.condition", "break.log"} <= set(checked)
    assert {"start.env", "start.args", "start.cwd", "start.breakpoints"} <= set(checked)
    assert verbs.get("watch").arg("expression").max_length <= verbs.ECHOED_LIMIT


def test_what_is_echoed_at_every_stop_is_short(session, write) -> None:
    """A 1 MB watch or condition was accepted and echoed into every state (events.jsonl
    grew 2 MB per stop); now each is refused at its limit and the session is untouched."""
    script = write("limits.py", "x = 1\ny = 2  # here\n")
    session.start(script)
    huge = "x + " * 250_000 + "x"
    base = session.base
    assert session.api.post(f"{base}/watch", {"expression": huge}, expect=400)["code"] == "too_long"
    refused = session.api.post(
        f"{base}/break", {"file": str(script), "line": 2, "condition": huge}, expect=400
    )
    assert refused["code"] == "too_long" and refused["argument"] == "condition"
    hits = session.api.post(
        f"{base}/break", {"file": str(script), "line": 2, "hits": "9" * 5000}, expect=400
    )
    assert hits["code"] == "too_long"
    listing = session.api.get(f"{base}/breaks")
    assert listing["breakpoints"] == [] and not listing.get("watches")
    at_limit = "x" * (verbs.ECHOED_LIMIT - 10) + " or True"
    assert session.api.post(f"{base}/watch", {"expression": at_limit[-verbs.ECHOED_LIMIT :]})


def test_session_names_are_matched_whole(api: Api) -> None:
    """``$`` also matches before a final newline: "name\\n" was a valid session name."""
    from mldbg.errors import MldbgError
    from mldbg.names import check_session_name, is_session_name

    for bad in ("name\n", "name\r\n", "a\nb"):
        assert not is_session_name(bad)
        try:
            check_session_name(bad)
        except MldbgError as error:
            assert error.code == "bad_session_name"
        else:
            raise AssertionError(f"{bad!r} was accepted")
    response = api.http.get("/v1/sessions/name%0A")
    assert response.status_code == 400 and response.json()["code"] == "bad_session_name"
    spec = api.get("/openapi.json")
    parameters = spec["paths"]["/v1/sessions/{name}/eval"]["post"]["parameters"]
    assert parameters[0]["schema"]["pattern"].startswith("^[A-Za-z0-9_]")


def test_null_means_the_default_and_types_are_not_swapped(api: Api, tmp_path) -> None:
    """``{"keep": null}`` was a 500; ``"wait": false`` was taken as a wait of 0 s and
    ``"stop_on_entry": 1`` as true.  Null is the declared default; a boolean is never a
    number nor a number a boolean."""
    home = str(tmp_path / ".mldbg")
    cleaned = api.post("/v1/clean", {"keep": None, "dry_run": True, "home": home})
    assert cleaned["removed"] == []
    for path, body in [
        ("/v1/sessions/types/wait", {"wait": False}),
        ("/v1/sessions/types/start", {"script": "x.py", "stop_on_entry": 1}),
        ("/v1/sessions/types/frame", {"index": True}),
        ("/v1/clean", {"keep": True, "dry_run": True, "home": home}),
    ]:
        error = api.post(path, body, expect=400)
        assert error["code"] == "bad_argument", (path, error)
    assert api.post("/v1/clean", {"keep": 3, "dry_run": True, "home": home})["removed"] == []


def test_the_eval_output_marker_counts_every_byte_left_out(session, write) -> None:
    """What an evaluation prints is kept as a bounded tail while it runs; the marker said
    only what the last cut removed (about 8 KB of 100 KB), not the total."""
    script = write("printing.py", "x = 1\n")
    session.start(script)
    answer = session.eval("for _ in range(1000): print('y' * 99)")  # 100,000 bytes
    marker = answer["output"].split("]", 1)[0]
    left_out = int(marker.split("[", 1)[1].split()[0])
    kept = len(answer["output"].split("]…", 1)[1].encode())
    assert answer["output_truncated"] and left_out + kept == 100_000, (left_out, kept)
    session.terminate()


def test_the_openapi_document_lists_every_answer(api: Api) -> None:
    """It documented FastAPI's 422, which is never sent, and not the 400/401/403 that are."""
    spec = api.get("/openapi.json")
    assert "422" not in json.dumps(spec) and "HTTPValidationError" not in json.dumps(spec)
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            answers = set(operation["responses"])
            assert {"200", "401", "403", "500"} <= answers, (method, path, answers)
            if operation.get("parameters") or operation.get("requestBody"):
                assert "400" in answers, (method, path)


def test_hits_with_thousands_of_digits_is_refused_not_an_internal_error(cli, write) -> None:
    write("hits.py", "x = 1\ny = 2\n")
    cli("start", "-s", "hits", "hits.py")
    error = cli("break", "-s", "hits", "hits.py:2", "--hits", "9" * 5000, expect=1, json_out=True)
    assert error["code"] == "too_long" and error["argument"] == "hits"
    cli("terminate", "-s", "hits")


def test_the_classic_routes_have_the_same_limits(api: Api) -> None:
    for path, body in [
        ("/debug/evaluate", {"expression": "x" * (verbs.CODE_LIMIT + 1)}),
        ("/debug/breakpoint", {"file_path": "f.py", "line": 1, "condition": "x" * 2_001}),
        ("/debug/start", {"script_path": "p" * 5_000}),
    ]:
        error = api.post(path, body, expect=400)
        assert error["code"] == "too_long", (path, error)


def _marked(text: str, marks: int = 1) -> tuple[int, int]:
    """(bytes the text's cut markers say were left out, bytes of text kept)."""
    import re

    found = re.findall(r"…\[(\d+) bytes cut\]…", text)
    assert len(found) == marks, text[-200:]
    kept = re.sub(r"…\[\d+ bytes cut\]…", "", text)
    return sum(int(n) for n in found), len(kept.encode())


def test_a_text_cut_twice_says_everything_that_was_cut() -> None:
    """The agent caps a message, the daemon caps it again: the second marker said what the
    second cut removed ("[26 bytes cut]" of a 100 MB message), not the whole."""
    text = "ValueError: " + "z" * 1_000_000
    once, cut = budget.cap(text, budget.MESSAGE)
    assert cut and len(once.encode()) <= budget.MESSAGE
    assert budget.cap(once, budget.MESSAGE) == (once, False)  # what fits is never cut again
    for keep in ("head", "tail"):
        first, _ = budget.cap(text, 8_000, keep)
        again, _ = budget.cap(first, 1_000, keep)
        left, kept = _marked(again)
        assert len(again.encode()) <= 1_000 and left + kept == len(text.encode()), keep


def test_cut_markers_say_what_was_cut_from_an_evaluation(session, write) -> None:
    script = write("values.py", "x = 1\n")
    session.start(script)
    answer = session.eval('"x" * 100_000_000')
    assert answer["result_truncated"] is True
    assert answer["result"].endswith("… (100000000 chars)"), answer["result"][-60:]
    assert len(answer["result"].encode()) <= budget.VALUE
    error = session.eval('raise ValueError("z" * 100_000_000)', expect=400)
    left, kept = _marked(error["error"])
    assert left + kept == len("ValueError: ") + 100_000_000
    # its line of the message cut, and the whole cut to its tail: the markers say both
    left, kept = _marked(error["traceback"], marks=2)
    assert left > 100_000_000 - kept  # the traceback holds the whole message, and more
    session.terminate()
