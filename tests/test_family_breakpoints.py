"""Every kind of breakpoint reaches every kind of process of a run (issue 34).

The daemon keeps one list of a session's breakpoints and watches, as its agent answered
them, and copies it with one conversion into every process of the run: a Python child
started with ``subprocess`` (configured when it connects), a ``multiprocessing`` fork
(inherits the table; later edits are passed on), a ``torchrun`` rank, and the same
script started again by ``restart``.  One script, ``family.py``, starts each kind of
child; the test sets a breakpoint of every kind (line, function, raised, uncaught,
tripwire, watch) and checks that the process lists each one with the root's id, and
stops at each.  Real processes (PyTorch CPU for the tripwire and torchrun); slow.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import line_of, wait_until
from mldbg.client.api import Client
from mldbg.errors import DaemonError

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

KINDS = """
import os
import time

import torch


class Nan(torch.nn.Module):
    def forward(self, x):
        return x * float("nan")


def scaled(x):
    return x * 2  # FUNCTION


def run():
    print("READY", os.getpid(), flush=True)
    while not os.path.exists("go"):
        time.sleep(0.05)
    total = scaled(20)
    total += 1  # LINE
    try:
        raise KeyError("caught")  # RAISED
    except KeyError:
        pass
    Nan()(torch.ones(2))  # TRIP
    return total
"""

FAMILY = """
import multiprocessing
import subprocess
import sys

import kinds

if __name__ == "__main__":
    how = sys.argv[1]
    if how == "subprocess":
        code = subprocess.run([sys.executable, "family.py", "alone"]).returncode
        print("PARENT SAW", code, flush=True)
    elif how == "fork":
        child = multiprocessing.get_context("fork").Process(target=kinds.run)
        child.start()
        child.join()
        print("PARENT SAW", child.exitcode, flush=True)
    else:  # alone: the subprocess child, a torchrun rank, or the script itself (restart)
        kinds.run()
        raise ValueError("uncaught")  # UNCAUGHT
"""


@pytest.fixture
def name(client: Client, request: pytest.FixtureRequest) -> Iterator[str]:
    session = f"fam-{request.node.callspec.id}-{os.getpid()}"
    yield session
    for listed in client.call("sessions")["sessions"]:
        if listed["session"] == session or listed["session"].startswith(session + "."):
            client.call("terminate", listed["session"])
    client.call("forget", session)


def set_every_kind(client: Client, session: str, kinds: Path) -> list[dict[str, Any]]:
    """A breakpoint of each kind and a watch on ``session``: the root's listing after."""
    client.call("break", session, file=str(kinds), line=line_of(kinds, "# LINE"))
    client.call("break", session, function="kinds.scaled", condition="x == 20")
    client.call("break", session, raised=["KeyError"])
    client.call("break", session, uncaught=["ValueError"])
    client.call("break", session, nonfinite=True)
    with pytest.raises(DaemonError) as refused:  # refused by the agent: never listed
        client.call("break", session, file=str(kinds), line=line_of(kinds, "# LINE"), hits="x")
    assert refused.value.code == "bad_hits"
    client.call("watch", session, expression="os.getpid()")
    listing: list[dict[str, Any]] = client.call("breaks", session)["breakpoints"]
    assert len(listing) == 5, listing
    return listing


def same_breakpoints(listing: list[dict[str, Any]]) -> list[tuple[object, ...]]:
    """What makes each breakpoint the one it is, by id (not its hit count, nor whether a
    function breakpoint's module is imported yet in that process)."""
    keys = ("file", "line", "function", "condition", "hits", "log", "exception", "types")
    keys += ("checkpoint", "nonfinite", "max_abs", "subnormal", "this_thread")
    shown = []
    for bp in listing:
        kept = {k: bp.get(k) for k in keys if bp.get(k) is not None}
        if "function" in kept:
            kept.pop("file", None)
            kept.pop("line", None)
        shown.append((bp["id"], sorted(kept.items())))
    return sorted(shown, key=lambda item: str(item[0]))


def child_of(client: Client, root: str, prefix: str) -> str:
    def paused() -> str | None:
        for listed in client.call("sessions")["sessions"]:
            if listed["session"].startswith(prefix) and listed["state"] == "paused":
                return str(listed["session"])
        return None

    return str(wait_until(paused, 150, f"a paused session {prefix}*"))


def stops_at_every_kind(client: Client, session: str, kinds: Path, uncaught: bool) -> None:
    """Continue ``session`` from its first stop through a stop of each kind, each showing
    the watch's value in that process."""
    pid = client.call("status", session)["pid"]
    expected = [
        ("breakpoint", line_of(kinds, "# FUNCTION")),
        ("breakpoint", line_of(kinds, "# LINE")),
        ("exception", line_of(kinds, "# RAISED")),
        ("tripwire", line_of(kinds, "# TRIP")),
    ]
    state = client.call("status", session)
    for number, (reason, line) in enumerate(expected):
        if number:
            state = client.resume("continue", session, 120.0)
        assert (state["reason"], state["location"]["line"]) == (reason, line), state
        assert state["watches"] == [{"id": state["watches"][0]["id"], "expression": "os.getpid()",
                                     "value": str(pid)}], state  # fmt: skip
    if uncaught:
        state = client.resume("continue", session, 120.0)
        assert state["reason"] == "exception" and "uncaught" in str(state["exception"]), state
    client.call("continue", session, no_wait=True)


@pytest.mark.parametrize("how", ["subprocess", "subprocess-late", "fork", "torchrun", "restart"])
def test_every_kind_reaches_every_kind_of_process(
    client: Client, name: str, tmp_path: Path, how: str
) -> None:
    kinds = tmp_path / "kinds.py"
    kinds.write_text(KINDS.lstrip())
    family = tmp_path / "family.py"
    family.write_text(FAMILY.lstrip())
    env = {"MLDBG_HOME": str(tmp_path / ".mldbg"), "OMP_NUM_THREADS": "1"}
    start: dict[str, Any] = {"cwd": str(tmp_path), "env": env}
    if how == "torchrun":
        start["module"] = "torch.distributed.run"
        start["args"] = ["--nproc_per_node=1", "--master_port=0", "--standalone", str(family)]
        start["args"] += ["alone"]
        env["MASTER_ADDR"] = "127.0.0.1"
    else:
        start["script"] = str(family)
        start["args"] = [{"restart": "alone"}.get(how, how.split("-")[0])]
    late = how == "subprocess-late"
    if not late:
        (tmp_path / "go").write_text("")
    client.call("start", name, **start, stop_on_entry=not late)
    if late:  # the child runs already: every edit is passed on to it
        wait_until(lambda: "READY" in client.call("output", name)["output"], 120, "the child")
    listing = same_breakpoints(set_every_kind(client, name, kinds))
    if late:  # a removal by id reaches it too
        extra = client.call("break", name, file=str(kinds), line=line_of(kinds, "# RAISED"))
        client.call("remove", name, id=extra["id"])

    if how == "restart":
        state = client.call("restart", name)
        assert state["reason"] == "entry", state
        process = name
    else:
        if not late:
            client.call("continue", name, no_wait=True)
        else:
            (tmp_path / "go").write_text("")
        prefix = f"{name}.rank" if how == "torchrun" else f"{name}.w"
        process = child_of(client, name, prefix)
    assert same_breakpoints(client.call("breaks", process)["breakpoints"]) == listing
    assert [w["expression"] for w in client.call("breaks", process)["watches"]] == ["os.getpid()"]
    if how == "restart":
        client.call("continue", process, no_wait=True)
        wait_until(lambda: client.call("status", process)["state"] == "paused", 120, "a stop")
    stops_at_every_kind(client, process, kinds, uncaught=how != "fork")
