"""The daemon <-> agent protocol: every command declared once, served once, typed both ways.

The static half checks the tables against each other (a command without a server, a
server without a declaration, a handler whose parameters drift from its arguments, a verb
that passes on arguments its command does not take); the live half starts a real
debuggee on an in-process listener and sends every declared command, checking each
answer against the result type the declaration promises.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import typing
from pathlib import Path
from typing import Any

import pytest
import typing_extensions

from conftest import wait_until
from mldbg import results, verbs
from mldbg.agent import protocol as P
from mldbg.agent.commands import CommandServer
from mldbg.agent.paused import PausedThread
from mldbg.server import handlers
from mldbg.server.agent_link import AgentLink, AgentListener
from mldbg.server.launcher import LaunchSpec, spawn

pytestmark = pytest.mark.timeout(120)


def declared_types() -> dict[str, tuple[Any, Any]]:
    """Command name -> (argument type, result type), as the annotations in protocol.py say."""
    hints = typing.get_type_hints(P, globalns={**vars(P), "R": results})
    out = {}
    for variable, hint in hints.items():
        if typing.get_origin(hint) is P.AgentCommand:
            command = getattr(P, variable)
            args, result = typing.get_args(hint)
            assert args is command.args, f"{variable}: the annotation names other arguments"
            out[command.name] = (args, result)
    assert set(out) == set(P.COMMANDS), "every command is annotated with its types"
    return out


def served(cls: type) -> dict[str, Any]:
    """The dispatch table the agent builds for an object of ``cls`` (its bound methods)."""
    return P.handlers_of(object.__new__(cls))


def test_every_command_is_served_once_where_its_declaration_says() -> None:
    reader, paused = served(CommandServer), served(PausedThread)
    assert not set(reader) & set(paused)
    resuming = {c.name for c in P.COMMANDS.values() if c.resumes}  # answered by the loop itself
    assert set(reader) | set(paused) | resuming == set(P.COMMANDS)
    for name in reader:
        assert not P.COMMANDS[name].paused, f"{name} is served at any time: not a paused command"
    for name in set(paused) | resuming:
        assert P.COMMANDS[name].paused, f"{name} needs a paused thread: declare paused=True"


def test_each_handler_takes_exactly_its_declared_arguments() -> None:
    for name, fn in {**served(CommandServer), **served(PausedThread)}.items():
        declared = set(P.COMMANDS[name].args.__annotations__)
        params = list(inspect.signature(fn).parameters.values())
        if any(p.kind is p.VAR_KEYWORD for p in params):
            continue  # takes the whole spec (break); the declaration is checked on arrival
        assert {p.name for p in params} == declared, name
        for p in params:
            required = p.default is inspect.Parameter.empty
            assert required == (p.name in P.COMMANDS[name].args.__required_keys__), (name, p)


def test_the_declaration_refuses_unknown_and_missing_arguments() -> None:
    assert P.WATCH.check({"expression": "x"}) is None
    assert "needs the argument 'expression'" in (P.WATCH.check({}) or "")
    assert "no argument 'expresion'" in (P.WATCH.check({"expresion": "x"}) or "")
    assert P.BREAKS.check({}) is None and P.BREAKS.check({"x": 1}) is not None


def test_every_event_is_heard_once_by_the_session_as_its_declared_type() -> None:
    """The daemon's end of each event: one method of a session marked for it, taking the
    event's fields as its declared TypedDict (mypy then holds the agent's sends to it)."""
    from mldbg.server.children import ChildSession
    from mldbg.server.sessions import Session

    for cls in (Session, ChildSession):
        heard = served(cls)
        assert set(heard) == set(P.EVENTS), cls
        for name, fn in heard.items():
            (parameter,) = inspect.signature(fn).parameters
            assert annotation(fn, parameter) is P.EVENTS[name].fields, (cls, name)
    assert not set(P.EVENTS) & set(P.COMMANDS)


def test_the_declaration_refuses_unknown_and_missing_fields_of_an_event() -> None:
    assert P.RESUMED.check({"event": "resumed"}) is None
    assert "no field 'x'" in (P.RESUMED.check({"event": "resumed", "x": 1}) or "")
    log = {"event": "log", "message": "m", "file": "f.py", "line": 3, "breakpoint": 1}
    assert P.LOG.check(log) is None
    del log["message"]
    assert "needs the field 'message'" in (P.LOG.check(log) or "")
    assert P.STOPPED.check({"event": "stopped", "reason": "entry", "trace": {}}) is None
    assert P.STOPPED.check({"event": "stopped", "bogus": 1}) is not None


def test_a_verb_that_passes_its_arguments_on_has_no_handler_of_its_own() -> None:
    passing = [v for v in verbs.VERBS if v.agent is not None]
    assert passing, "no verb is declared as a pass-through"
    for verb in passing:
        assert verb.agent is P.COMMANDS[verb.agent.name]
        assert {a.name for a in verb.args} <= set(verb.agent.args.__annotations__), verb.name
        assert handlers.HANDLERS[verb.name].__name__ == "forward", verb.name


SCRIPT = """\
import threading
def work(n):
    total = n * 2
    return total
x = 1
worker = threading.Thread(target=lambda: None)
worker.start(); worker.join()
y = work(x)
print("done", y)
"""
# one call of every command, in an order a paused script can serve them all
CALLS: list[tuple[P.AgentCommand[Any, Any], dict[str, Any]]] = [
    (P.BREAK, {"file": "{script}", "line": 3}),
    (P.BREAKS, {}),
    (P.WATCH, {"expression": "x"}),
    (P.UNWATCH, {"expression": "x"}),
    (P.THREADS, {}),
    (P.THREAD, {"number": 1}),
    (P.STACK, {"limit": 5, "all": False}),
    (P.FRAME, {"index": 0}),
    (P.VARS, {"filter": "x*"}),
    (P.EVAL, {"expression": "40 + 2"}),
    (P.LOCATION, {}),
    (P.WATCH_VALUES, {"items": [{"id": 1, "expression": "2 * 21"}]}),
    (P.PAUSE, {}),
    (P.STEP, {"kind": "over"}),
    (P.REMOVE, {"id": 1}),
    (P.CLEAR, {}),
    (P.BREAK, {"file": "{script}", "line": 9, "log": "y={y}"}),  # a log event at the end
    (P.CONTINUE, {}),
]


def conforms(value: Any, shape: Any) -> str | None:
    """Why ``value`` is not a ``shape`` (a TypedDict: no key it does not declare), or None."""
    if typing.get_origin(shape) is dict:
        return None if isinstance(value, dict) else f"not an object: {value!r}"
    if not isinstance(value, dict):
        return f"not an object: {value!r}"
    unknown = set(value) - set(typing.get_type_hints(shape))
    return f"keys {sorted(unknown)} are not in {shape.__name__}" if unknown else None


def test_every_command_round_trips_its_declared_types(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """... and every event the agent sends on the way is one it declares, as declared."""
    types = declared_types()
    called = {command.name for command, _ in CALLS} | {"configure", "run"}
    assert called == set(P.COMMANDS), "a new command needs a call here"
    script = tmp_path / "work.py"
    script.write_text(SCRIPT)
    links: list[AgentLink] = []
    arrived = threading.Event()
    listener = AgentListener(lambda link: (links.append(link), arrived.set()), "protocol")
    events: list[dict[str, Any]] = []
    output = open(tmp_path / "out.log", "wb")  # noqa: SIM115 - the child holds its own copy
    spec = LaunchSpec(sys.executable, str(tmp_path), dict(os.environ), str(script))
    process = spawn(spec, listener.address, listener.token, output)
    output.close()
    try:
        assert arrived.wait(60), (tmp_path / "out.log").read_text()
        link = links[0]
        link.start(events.append, lambda: None)

        def check(command: P.AgentCommand[Any, Any], args: dict[str, Any]) -> Any:
            answer = command.call(link, args)
            problem = conforms(answer, types[command.name][1])
            assert problem is None, f"{command.name}: {problem}"
            return answer

        def stops() -> int:
            return sum(e.get("event") == P.STOPPED.name for e in events)

        check(P.CONFIGURE, {"breakpoints": [], "watches": []})
        check(P.RUN, {"stop_on_entry": True, "run_dir": str(tmp_path), "follow": False})
        wait_until(lambda: stops() == 1, what="the entry stop")
        for command, args in CALLS:
            args = {k: str(script) if v == "{script}" else v for k, v in args.items()}
            before = stops()
            check(command, args)
            if command is P.STEP:
                wait_until(lambda before=before: stops() > before, what="the step's stop")
        wait_until(lambda: any(e.get("event") == P.FINISHED.name for e in events), what="the end")
        assert process.wait(30) == 0
        assert {e["event"] for e in events} == set(P.EVENTS)
        dropped = [r.getMessage() for r in caplog.records if "dropped the event" in r.getMessage()]
        assert not dropped  # the link checks each event against its declaration
    finally:
        listener.close()
        if process.poll() is None:
            process.kill()


def test_serving_commands_leaves_the_protocols_digest_alone() -> None:
    """The digest a client compares with the daemon's (``verbs.fingerprint``) covers the
    protocol's declarations, not the dispatch cache a process fills as it serves."""
    before = verbs.fingerprint()
    P.handlers_of(object.__new__(CommandServer))
    P.handlers_of(object.__new__(PausedThread))
    assert verbs.fingerprint() == before


def annotation(fn: Any, what: str) -> Any:
    """``fn``'s annotation for ``what`` (a parameter name or "return"), resolved (with the
    names the agent imports for the type checker only: it runs on 3.10, without Unpack)."""
    module = sys.modules[fn.__module__]
    hints = typing.get_type_hints(
        fn, globalns={**vars(module), "R": results, "Unpack": typing_extensions.Unpack}
    )
    return hints[what]


def test_types_bind_from_the_verb_table_to_the_wire() -> None:
    """Each verb's result type is the one its handler returns, the one its renderer takes,
    and (for a verb that reaches the debuggee) the one the agent's handler returns: mypy
    then holds every one of them to the same TypedDict."""
    from mldbg.text import render

    types = declared_types()
    for verb in verbs.VERBS:
        handler = handlers.HANDLERS[verb.name]
        if verb.agent is not None:
            assert types[verb.agent.name][1] is verb.result, verb.name
        else:
            assert annotation(handler, "return") is verb.result, verb.name
        renderer = render.RENDERERS.get(verb.name)
        if renderer is not None:
            first = next(iter(inspect.signature(renderer).parameters))
            assert annotation(renderer, first) is verb.result, verb.name
    for name, fn in {**served(CommandServer), **served(PausedThread)}.items():
        declared = types[name][1]
        if typing.get_origin(declared) is None:  # a results TypedDict, not a plain dict
            assert annotation(fn, "return") is declared, name
