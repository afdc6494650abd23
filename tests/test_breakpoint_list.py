"""The daemon's one list of a session's breakpoints (``server/breakpoint_list.py``).

A real debuggee on an in-process listener, driven through a real ``Session``: each edit
costs the one command it sends (the list follows the agent's answer; it cost three round
trips when two caches each asked the agent for the whole list again), a breakpoint the
agent refuses is never listed, and the list, turned back into arguments by the one
conversion, sets the same breakpoints in a fresh process.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from mldbg.agent import protocol as P
from mldbg.errors import MldbgError
from mldbg.server.agent_link import AgentLink, AgentListener
from mldbg.server.breakpoint_list import break_args
from mldbg.server.launcher import LaunchSpec, spawn
from mldbg.server.sessions import Session, StartRequest

pytestmark = pytest.mark.timeout(120)

SCRIPT = """\
def scaled(x):
    return x * 2

def checkpoint_here():
    pass

print(scaled(3))
"""


def agent(tmp_path: Path) -> Iterator[AgentLink]:
    script = tmp_path / "work.py"
    script.write_text(SCRIPT)
    links: list[AgentLink] = []
    arrived = threading.Event()
    listener = AgentListener(lambda link: (links.append(link), arrived.set()), "list")
    output = open(tmp_path / "out.log", "wb")  # noqa: SIM115 - the child holds its own copy
    spec = LaunchSpec(sys.executable, str(tmp_path), dict(os.environ), str(script))
    process = spawn(spec, listener.address, listener.token, output)
    output.close()
    try:
        assert arrived.wait(60), (tmp_path / "out.log").read_text()
        links[0].start(lambda event: None, lambda: None)
        yield links[0]
    finally:
        listener.close()
        process.kill()
        process.wait(30)


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    """A session whose link is a live agent that has not started its script."""
    here = tmp_path / "one"
    here.mkdir()
    for link in agent(here):
        s = Session("list", StartRequest(cwd=str(here)))
        s.link = link
        s.state = "running"
        yield s


def by_id(specs: Iterable[P.BreakArgs | None]) -> list[P.BreakArgs | None]:
    return sorted(specs, key=lambda spec: spec["id"] if spec else 0)


def round_trips(link: AgentLink, edit: Callable[[], object]) -> int:
    """How many commands ``edit`` sent over ``link`` (its request ids count them)."""
    before = next(link._ids)  # the one counter of round trips there is
    edit()
    return next(link._ids) - before - 1


def test_each_edit_is_one_round_trip_and_the_list_follows_the_answers(
    session: Session, tmp_path: Path
) -> None:
    link = session.link
    assert link is not None
    script = str(tmp_path / "one" / "work.py")
    edits: list[tuple[str, Callable[[], object]]] = [
        ("line", lambda: session.set_breakpoint({"file": script, "line": 2, "hits": ">=2"})),
        ("function", lambda: session.set_breakpoint({"function": "no_such_module.f"})),
        ("raised", lambda: session.set_breakpoint({"raised": ["KeyError"]})),
        ("uncaught", lambda: session.set_breakpoint({"uncaught": []})),
        ("tripwire", lambda: session.set_breakpoint({"nonfinite": True, "max_abs": 1e4})),
        ("checkpoint", lambda: session.set_breakpoint({"checkpoint": "layer.*"})),
        ("watch", lambda: session.watch("x * 2")),
    ]
    for kind, edit in edits:
        assert round_trips(link, edit) == 1, kind
    # refused by the agent: an error, and not listed
    with pytest.raises(MldbgError) as refused:
        session.set_breakpoint({"file": script, "line": 2, "condition": "x ==="})
    assert refused.value.code == "bad_condition"
    listing = P.BREAKS.call(link)
    again = session.breakpoints.configure_args()
    assert by_id(again["breakpoints"]) == by_id(map(break_args, listing["breakpoints"]))
    assert again["watches"] == ["x * 2"]
    assert len(again["breakpoints"]) == 6
    # a removal and a one-shot `until` breakpoint: neither is listed
    first = listing["breakpoints"][0]["id"]
    assert round_trips(link, lambda: session.remove_breakpoint({"id": first})) == 1
    P.BREAK.call(session, {"file": script, "line": 7, "temporary": True})
    assert len(session.breakpoints.configure_args()["breakpoints"]) == 5

    # the list sets the same breakpoints, under the same ids, in another process
    (tmp_path / "two").mkdir()
    for other in agent(tmp_path / "two"):
        P.CONFIGURE.call(other, session.breakpoints.configure_args())
        copied = P.BREAKS.call(other)
        kept = [i for i in P.BREAKS.call(link)["breakpoints"] if not i.get("temporary")]
        assert by_id(map(break_args, copied["breakpoints"])) == by_id(map(break_args, kept))
        assert [w["expression"] for w in copied["watches"]] == ["x * 2"]
