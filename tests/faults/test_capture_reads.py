"""Every read of a capture is bounded in work, not only in bytes (issue #30, item 1).

A capture's ``index.jsonl`` says how its calls nest (``seq``, ``parent``); every reader
walks those links (compare's culprit and bounds, narrow's fine-pass size, module-table's
self times).  A ``parent`` cycle made compare loop forever: over REST a daemon thread
spun for good.  Now the call tree is checked as it is read (each parent a call on an
earlier line, each ``seq`` and each module call once, each call returning once): a
capture that breaks it is ``corrupt_capture``, naming the file and the line, on every
reader and surface.  And every compare, weight audit, nonfinite and module-table runs
under a deadline (``MLDBG_DEADLINE``): past it the work stops with ``too_slow`` and the
thread is free again.

Real captures of a tiny torch MLP, damaged on disk; real daemons over HTTP; the deadline
interrupts a real spinning thread.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from daemons import Daemon

import mldbg
from conftest import Api
from mldbg.compare import CompareInputError
from mldbg.compare.read.sources import open_source
from mldbg.errors import TooSlow
from mldbg.store import current_run

torch = pytest.importorskip("torch")
from tiny_torch import MLP  # noqa: E402

Records = list[dict[str, Any]]


def _capture(name: str, port: bool = False, **options: Any) -> Path:
    """A capture of the MLP (its parameters saved too) in a run of its own; the ``port``'s
    fc2 differs, so a comparison names a culprit (and walks the call tree to do so)."""
    current_run.reset()
    torch.manual_seed(0)
    model = MLP()
    if port:
        with torch.no_grad():
            model.fc2.weight[0, 0] += 1.0
    with torch.no_grad(), mldbg.capture(model, name, **options) as cap:
        cap.save_weights()
        model(torch.randn(3, 8))
    assert cap.path is not None and not cap.errors
    return cap.path


@pytest.fixture
def captures(home: Path) -> tuple[Path, Path]:
    return _capture("ref"), _capture("port", port=True)


def _index(capture: Path) -> Records:
    return [json.loads(line) for line in (capture / "index.jsonl").read_text().splitlines()]


def _write_index(capture: Path, records: Records) -> None:
    (capture / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _calls(records: Records) -> dict[str, dict[str, Any]]:
    """The call lines by module path ("" is the model itself)."""
    return {r["module"]: r for r in records if r.get("event") == "call"}


def _cycle(records: Records) -> str:
    """The model and its first child each other's parent."""
    calls = _calls(records)
    calls[""]["parent"] = calls["fc1"]["seq"]
    return "no call on an earlier line"


def _self_parent(records: Records) -> str:
    calls = _calls(records)
    calls["fc1"]["parent"] = calls["fc1"]["seq"]
    return "no call on an earlier line"


def _dangling(records: Records) -> str:
    _calls(records)["fc2"]["parent"] = 999
    return "parent 999 is no call on an earlier line"


def _duplicate_seq(records: Records) -> str:
    calls = _calls(records)
    calls["fc2"]["seq"] = calls["fc1"]["seq"]
    return "is already the call on line"


def _duplicate_call(records: Records) -> str:
    calls = _calls(records)
    calls["act"]["module"] = "fc1"
    return "call 0 of module 'fc1' is already on line"


def _returns_twice(records: Records) -> str:
    seq = _calls(records)["fc1"]["seq"]
    line = next(r for r in records if r.get("event") == "return" and r["seq"] == seq)
    records.append(dict(line))
    return "already returned on line"


def _parent_returned(records: Records) -> str:
    """act's parent made fc1, which returned before act started (the capture fuzz: a
    reader summing subtrees deepest first met a child it had not counted, KeyError)."""
    calls = _calls(records)
    calls["act"]["parent"] = calls["fc1"]["seq"]
    calls["act"]["depth"] = calls["fc1"]["depth"] + 1
    return "returned on line"


def _depth(records: Records) -> str:
    _calls(records)["act"]["depth"] = 5  # its parent, the model, is at depth 0
    return "not its parent's depth + 1"


DAMAGE: dict[str, Callable[[Records], str]] = {
    "cycle": _cycle,
    "self_parent": _self_parent,
    "dangling": _dangling,
    "duplicate_seq": _duplicate_seq,
    "duplicate_call": _duplicate_call,
    "returns_twice": _returns_twice,
    "parent_returned": _parent_returned,
    "depth": _depth,
}


def _damaged(capture: Path, to: Path, damage: Callable[[Records], str]) -> tuple[Path, str]:
    shutil.copytree(capture, to)
    records = _index(to)
    said = damage(records)
    _write_index(to, records)
    return to, said


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_broken_call_tree_is_a_corrupt_capture_naming_its_line(
    captures: tuple[Path, Path], home: Path, tmp_path: Path, kind: str
) -> None:
    """Read before: a cycle or a dangling parent was taken as it was, and the readers'
    walks up the tree never ended (or ended on the wrong call)."""
    _ref, port = captures
    bad, said = _damaged(port, tmp_path / kind, DAMAGE[kind])
    with pytest.raises(CompareInputError) as caught:
        open_source(str(bad), home)
    error = caught.value
    assert error.code == "corrupt_capture", error.to_json()
    assert str(bad / "index.jsonl") in error.message and " line " in error.message
    reason = error.message.split("a corrupt record (", 1)[1].split("): {", 1)[0]
    assert said in reason, error.message
    assert isinstance(error.extra.get("line"), int) and error.extra["line"] >= 1
    assert len(error.message) < 1000


def _answered(request: Callable[[], Any], seconds: float = 60.0) -> Any:
    """``request``'s answer, or a failure once ``seconds`` pass (a hang fails the test,
    it does not stall the suite)."""
    box: list[Any] = []

    def ask() -> None:
        try:
            box.append(request())
        except BaseException as exc:  # an unexpected status: raised below, in the test
            box.append(exc)

    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(seconds)
    assert box, f"no answer within {seconds} s"
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def test_every_reader_answers_a_cycle_over_rest_and_the_daemon_lives_on(
    captures: tuple[Path, Path], home: Path, tmp_path: Path
) -> None:
    """compare (its culprit rules, bounds and narrow walk the tree), nonfinite,
    module-table and the weight audit of a capture whose index holds a parent cycle:
    each answers ``corrupt_capture`` at once, and the daemon still answers after.
    Before, compare's walk up the reference's tree never ended (a daemon thread spun for
    good); the other readers answered as if the tree were sound."""
    ref, port = captures
    coarse_ref = _capture("cref", mode="summary")
    coarse_port = _capture("cport", port=True, mode="summary")
    bad, _ = _damaged(port, tmp_path / "cycle", _cycle)
    bad_ref, _ = _damaged(ref, tmp_path / "ref-cycle", _cycle)
    coarse_bad, _ = _damaged(coarse_ref, tmp_path / "coarse-cycle", _cycle)
    daemon = Daemon(tmp_path / "config")
    try:
        api, where = daemon.api, {"home": str(home)}

        def refused(method: str, path: str, **body: Any) -> dict[str, Any]:
            def send() -> Any:
                if method == "GET":
                    return api.get(path, params={**body, **where}, expect=400)
                return api.post(path, {**body, **where}, expect=400)

            answer: dict[str, Any] = _answered(send)
            assert answer["code"] == "corrupt_capture", answer
            assert "index.jsonl" in answer["error"] and " line " in answer["error"], answer
            return answer

        # the reference's tree is the one compare walks (its depths, bounds and culprit)
        refused("POST", "/v1/compare", a=str(bad_ref), b=str(port))  # spun for good before
        refused("POST", "/v1/compare", a=str(ref), b=str(bad))
        refused("POST", "/v1/compare", a=str(coarse_bad), b=str(coarse_port))  # and narrow's
        refused("GET", "/v1/nonfinite", source=str(bad))
        refused("GET", "/v1/module-table", a=str(bad))
        refused("GET", "/v1/module-table", a=str(ref), b=str(bad))
        refused("POST", "/v1/weights", reference=str(ref), port=str(bad))
        assert api.get("/v1/health")["ok"] is True
        found = api.post("/v1/compare", {"a": str(ref), "b": str(port), **where})
        assert found["first_divergence"]["module"] == "fc2", found
    finally:
        daemon.stop()


def test_the_cli_compare_of_a_cycle_exits_2(
    captures: tuple[Path, Path], home: Path, tmp_path: Path
) -> None:
    ref, port = captures
    bad, _ = _damaged(port, tmp_path / "cycle", _cycle)
    done = subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", "--json", str(ref), str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert json.loads(done.stdout)["code"] == "corrupt_capture"


# -- the deadline ----------------------------------------------------------------------------


def test_the_deadline_stops_a_thread_spinning_in_python() -> None:
    """A pure-Python loop that never ends (what a parent cycle was) is interrupted in its
    own thread once the deadline passes, even when the loop swallows what it is sent
    (``except Exception``, as some readers do): ``TooSlow``, and the thread is free."""
    from mldbg import deadline

    outcome: list[BaseException | None] = []

    def forever() -> None:
        while True:
            with contextlib.suppress(Exception):  # a reader that swallows everything
                sum(range(1000))

    def spin() -> None:
        try:
            deadline.call_bounded("spinning", 0.2, forever)
        except BaseException as exc:  # what the thread let out
            outcome.append(exc)
        else:
            outcome.append(None)

    worker = threading.Thread(target=spin, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the thread still spins"
    assert len(outcome) == 1 and isinstance(outcome[0], TooSlow), outcome
    assert outcome[0].code == "too_slow" and "MLDBG_DEADLINE" in outcome[0].message


def test_work_within_the_deadline_is_left_alone() -> None:
    from mldbg import deadline

    assert deadline.call_bounded("quick", 30.0, lambda: sum(range(1000))) == 499500
    with pytest.raises(ValueError, match="its own"):  # the work's own failure, as it was
        deadline.call_bounded("failing", 30.0, lambda: int("its own"))
    time.sleep(0.1)  # no interrupt lands after the block: the thread goes on as it was
    assert sum(range(10)) == 45


@pytest.mark.parametrize("value", ["abc", "-3", "nan"])
def test_a_deadline_that_is_not_a_number_of_seconds_is_said(value: str) -> None:
    from mldbg import deadline
    from mldbg.errors import MldbgError

    with pytest.raises(MldbgError, match="MLDBG_DEADLINE") as caught:
        deadline.seconds_allowed({"MLDBG_DEADLINE": value})
    assert caught.value.code == "bad_argument"
    assert deadline.seconds_allowed({}) == deadline.DEFAULT_SECONDS
    assert deadline.seconds_allowed({"MLDBG_DEADLINE": "0"}) is None
    assert deadline.seconds_allowed({"MLDBG_DEADLINE": "2.5"}) == 2.5


def _padded(capture: Path, to: Path, calls: int) -> Path:
    """``capture`` with ``calls`` more top-level calls (no tensors) in its index: sound,
    and long to read (reading it takes far longer than the deadline the test sets)."""
    shutil.copytree(capture, to)
    first = 1 + max(r["seq"] for r in _index(to))
    with open(to / "index.jsonl", "a") as fh:
        for n in range(calls):
            seq = first + n
            call = {"event": "call", "seq": seq, "module": f"pad.{n}", "call": 0, "parent": None}
            fh.write(json.dumps(call) + "\n" + json.dumps({"event": "return", "seq": seq}) + "\n")
    return to


def test_past_the_deadline_every_analysis_verb_answers_too_slow(
    captures: tuple[Path, Path], home: Path, tmp_path: Path
) -> None:
    """A daemon whose deadline (50 ms) is far shorter than reading the captures takes:
    compare, the weight audit, nonfinite and module-table each answer ``too_slow`` (not a
    thread held until the work ends), and the daemon answers the next request."""
    ref, port = captures
    long_ref = _padded(ref, tmp_path / "long-ref", 20_000)
    long_port = _padded(port, tmp_path / "long-port", 20_000)
    daemon = Daemon(tmp_path / "config", env={"MLDBG_DEADLINE": "0.05"})
    try:
        api, where = daemon.api, {"home": str(home)}
        requests: list[tuple[str, str, dict[str, str]]] = [
            ("POST", "/v1/compare", {"a": str(long_ref), "b": str(long_port)}),
            ("POST", "/v1/weights", {"reference": str(long_ref), "port": str(long_port)}),
            ("GET", "/v1/nonfinite", {"source": str(long_port)}),
            ("GET", "/v1/module-table", {"a": str(long_ref)}),
        ]

        def send(method: str, path: str, body: dict[str, str]) -> Any:
            if method == "GET":
                return api.get(path, params={**body, **where}, expect=400)
            return api.post(path, {**body, **where}, expect=400)

        for method, path, body in requests:
            answer = _answered(functools.partial(send, method, path, body))
            assert answer["code"] == "too_slow", answer
            assert "MLDBG_DEADLINE" in answer["error"] and answer["seconds"] == 0.05, answer
        assert api.get("/v1/health")["ok"] is True
        assert api.get("/v1/captures", params=where)["captures"]
    finally:
        daemon.stop()


# -- maps: a regex rule's work is bounded too ------------------------------------------------

BACKTRACKS = [["(x|x)+#1", "z"]]  # on a name of 40 x's: about 2**40 steps, in C


MAP_PROBE = """
import json, sys
from mldbg.compare import CompareInputError
from mldbg.compare.pair.mapping import parse_map
try:
    parse_map({"regex": json.loads(sys.argv[1])}).to_a("x" * 40 + "#0.out")
except CompareInputError as exc:
    print(json.dumps(exc.to_json()))
"""


def test_a_map_regex_that_backtracks_for_ages_is_a_bad_map() -> None:
    """A map's regex rules run on every name of B.  One that backtracks exponentially
    held a thread inside ``re``'s C loop, with the GIL: no deadline could stop it, and the
    daemon answered nothing at all.  Each rule now gets a bounded time per name.  (In a
    process of its own: before, it held the GIL of whatever process ran it.)"""
    from mldbg.compare.pair.mapping import parse_map

    done = subprocess.run(
        [sys.executable, "-c", MAP_PROBE, json.dumps(BACKTRACKS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    error = json.loads(done.stdout)
    assert error["code"] == "bad_map" and "(x|x)+#1" in error["error"], error
    assert parse_map({"regex": [["^x(\\d+)", "y\\1"]]}).to_a("x12.w") == "y12.w"


def test_a_backtracking_map_over_rest_is_answered_and_the_daemon_lives_on(
    home: Path, tmp_path: Path
) -> None:
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module("x" * 40, torch.nn.Linear(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return getattr(self, "x" * 40)(x)

    torch.manual_seed(0)
    net = Net()
    for name in ("ref", "port"):
        current_run.reset()
        with torch.no_grad(), mldbg.capture(net, name):
            net(torch.ones(2, 4))
    daemon = Daemon(tmp_path / "config")
    try:
        body = {"a": "ref", "b": "port", "map": {"regex": BACKTRACKS}, "home": str(home)}
        answer = _answered(lambda: daemon.api.post("/v1/compare", body, expect=400))
        assert answer["code"] == "bad_map" and "(x|x)+#1" in answer["error"], answer
        assert daemon.api.get("/v1/health")["ok"] is True
    finally:
        daemon.stop()


# -- answers are JSON ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["full", "summary"])
def test_a_zero_reference_against_a_nonzero_port_is_answered_in_json(
    api: Api, home: Path, mode: str
) -> None:
    """An infinite relative error (a reference output of zeros, a port's that is not,
    as the capture fuzz found) reached the culprit as a float ``inf``: ``--json`` raised
    and the daemon answered ``internal``.  It is written ``"inf"``, as the element-wise
    numbers already were."""
    paths = {}
    for name, scale in (("ref", 0.0), ("port", 1.0)):
        current_run.reset()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        with torch.no_grad():
            model[1].weight.mul_(scale)
            model[1].bias.mul_(scale)
            with mldbg.capture(model, name, mode=mode) as cap:
                model(torch.randn(2, 4))
        paths[name] = str(cap.path)
    answer = api.post("/v1/compare", {"a": paths["ref"], "b": paths["port"], "home": str(home)})
    assert answer["first_divergence"]["module"] == "1", answer
    assert answer["first_divergence"]["rel_rms"] == "inf", answer["first_divergence"]
    done = subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", "--json", paths["ref"], paths["port"]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert json.loads(done.stdout)["first_divergence"]["rel_rms"] == "inf"
