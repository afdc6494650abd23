"""The agent's parts, in this process: no daemon, no debuggee subprocess.

Breakpoint table, log templates, exception and function breakpoints, library paths,
stepping decisions, evaluation (with its interrupt), watches and frame moves, each on
real frames and real files.  The end-to-end behaviour is in ``test_engine.py`` and
``test_verbs_pdb.py``; these are the fast checks beside them.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mldbg.agent import functions, locate
from mldbg.agent.backends import choose_backend
from mldbg.agent.breakpoints import BreakpointError, BreakpointTable, format_log, make_breakpoint
from mldbg.agent.commands import CommandServer
from mldbg.agent.debugger import Debugger
from mldbg.agent.evaluation import EvalError, FrameNamespace
from mldbg.agent.exception_breaks import ExceptionBreak, parse_types
from mldbg.agent.interrupt import EvalTimeout, Interruptible
from mldbg.agent.logtemplate import TemplateError, compile_template, render
from mldbg.agent.paused import PausedThread, frames_from_stack
from mldbg.agent.stepping import StepRequest, frame_depth
from mldbg.agent.watches import Watches
from mldbg.agent.wire import Wire


def _write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip("\n"))
    return path


# -- log templates ------------------------------------------------------------------------------


def test_log_templates_format_like_fstrings() -> None:
    xs = [1.0, 2.0, 4.0]
    name = "net"
    width = 6
    frame = sys._getframe()
    cases = {
        "mean={sum(xs) / len(xs):.3f}": f"mean={sum(xs) / len(xs):.3f}",
        "{name!r} {name!s} {name!a}": f"{name!r} {name!s} {name!a}",
        "{len(xs)=}": f"{len(xs)=}",
        "{name:>{width}}|": f"{name:>{width}}|",
        "{{braces}} {xs[0]:+.1f}": f"{{braces}} {xs[0]:+.1f}",
        "{ {'a': 1}['a'] }": f"{ {'a': 1}['a'] }",
        "plain text": "plain text",
    }
    for template, expected in cases.items():
        assert render(compile_template(template), frame) == expected, template
    assert "<error: NameError" in render(compile_template("{nope} ok"), frame)
    assert render(compile_template("x" * 20_000), frame).endswith("chars)")
    for bad in ("{x", "x}", "{}", "{x!z}", "{x:{y}"):
        with pytest.raises(TemplateError):
            compile_template(bad)


def test_logpoint_shows_a_tensor_summary_for_a_bare_field(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    script = _write(tmp_path / "t.py", "x = 1\n")
    bp = make_breakpoint(str(script), 1, log="{t} {t.shape}")
    t = torch.zeros(1000, 1000)  # noqa: F841 - read by the template through the frame
    text = format_log(bp, sys._getframe())
    assert "float32[1000, 1000]" in text and "torch.Size([1000, 1000])" in text
    assert len(text) < 1000
    with pytest.raises(BreakpointError) as info:
        make_breakpoint(str(script), 1, log="{oops")
    assert info.value.code == "bad_log"


# -- the breakpoint table -----------------------------------------------------------------------


def test_breakpoint_table_ids_temporaries_and_code_lines(tmp_path: Path) -> None:
    script = _write(
        tmp_path / "m.py",
        """
        def f(x):
            y = x + 1
            return y

        z = f(1)
        """,
    )
    table = BreakpointTable()
    inner = table.add(make_breakpoint(str(script), 2))
    one_shot = make_breakpoint(str(script), 5)
    one_shot.temporary = True
    table.add(one_shot)
    code = compile(script.read_text(), str(script.resolve()), "exec")
    f_code = next(c for c in code.co_consts if hasattr(c, "co_name") and c.co_name == "f")
    assert table.lines_in_code(f_code, str(script.resolve())) == frozenset({2})
    assert table.lines_in_code(code, str(script.resolve())) == frozenset({5})
    assert table.find(inner.id) is inner
    assert [bp.line for bp in table.remove_temporary()] == [5]
    assert table.at(str(script.resolve()), 5) is None
    assert table.remove_id(inner.id) is inner and not table
    with pytest.raises(BreakpointError) as info:
        table.find(inner.id)
    assert info.value.code == "no_such_breakpoint"
    with pytest.raises(BreakpointError) as info:
        make_breakpoint(str(script), 4)
    assert info.value.code == "no_code_at_line" and info.value.extra["nearest_lines"] == [3, 5]


# -- library paths -----------------------------------------------------------------------------


def test_breakpoint_files_are_found_on_the_import_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "site"
    target = _write(lib / "pkg" / "nn" / "linear_mod_xyz.py", "def f():\n    return 1\n")
    _write(lib / "a" / "twin_xyz.py", "x = 1\n")
    _write(lib / "b" / "twin_xyz.py", "x = 1\n")
    monkeypatch.syspath_prepend(str(lib))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    for spelling in ("pkg/nn/linear_mod_xyz.py", "nn/linear_mod_xyz.py", "linear_mod_xyz.py"):
        bp = make_breakpoint(spelling, 2, cwd=str(cwd))
        assert bp.file == str(target.resolve()), spelling
    with pytest.raises(BreakpointError) as info:
        make_breakpoint("twin_xyz.py", 1, cwd=str(cwd))
    assert info.value.code == "ambiguous_file" and len(info.value.extra["candidates"]) == 2
    with pytest.raises(BreakpointError) as info:
        make_breakpoint("nowhere_at_all_xyz.py", 1, cwd=str(cwd))
    assert info.value.code == "file_not_found"
    with pytest.raises(BreakpointError):
        locate.find_importable("/abs/missing.py", str(cwd), "/abs/missing.py")


# -- function breakpoints ---------------------------------------------------------------------


def test_function_names_resolve_without_importing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = _write(
        tmp_path / "unitpkg_xyz" / "models.py",
        '''
        import functools

        def deco(fn):
            @functools.wraps(fn)
            def wrapper(*a):
                return fn(*a)
            return wrapper

        class Net:
            class Inner:
                def run(self):
                    return 1  # inner body

            @deco
            def forward(self, x):
                """Doc."""
                return x  # forward body

        if True:
            def late():
                pass  # late body
        ''',
    )
    _write(tmp_path / "unitpkg_xyz" / "__init__.py", "")
    monkeypatch.syspath_prepend(str(tmp_path))
    lines = models.read_text().splitlines()

    def line_of(marker: str) -> int:
        return next(i for i, text in enumerate(lines, 1) if marker in text)

    cwd = str(tmp_path)
    assert functions.resolve("unitpkg_xyz.models.Net.forward", cwd, None) == (
        str(models.resolve()),
        line_of("forward body"),
    )
    assert functions.resolve("unitpkg_xyz.models.Net.Inner.run", cwd, None)[1] == line_of(
        "inner body"
    )
    assert functions.resolve("unitpkg_xyz.models.late", cwd, None)[1] == line_of("late body")
    assert "unitpkg_xyz.models" not in sys.modules  # found without importing anything
    assert functions.resolve("__main__.Net.forward", cwd, str(models))[1] == line_of("forward body")
    assert functions.resolve("__main__.f", cwd, None) is None  # the script is not known yet
    assert functions.resolve("not_there_xyz.mod.f", cwd, None) is None  # pending
    # not loaded and not defined in its source: a re-export, perhaps: pending
    assert functions.resolve("unitpkg_xyz.models.nothing", cwd, None) is None
    for name, code in (
        ("unitpkg_xyz.models.Net", "no_such_function"),
        ("json.decoder.nothing_xyz", "no_such_function"),  # loaded: it can be asked
        ("x y", "bad_argument"),
        ("single", "bad_argument"),
    ):
        with pytest.raises(BreakpointError) as info:
            functions.resolve(name, cwd, None)
        assert info.value.code == code, name


def test_function_names_of_loaded_modules_use_their_namespace() -> None:
    found = functions.resolve("json.JSONDecoder.decode", None, None)
    assert found is not None and found[0].endswith(os.path.join("json", "decoder.py"))
    assert found[1] > json.JSONDecoder.decode.__code__.co_firstlineno


# -- exception breakpoints ------------------------------------------------------------------------


def test_exception_filters_match_by_type_name_and_stop_once() -> None:
    any_raised = ExceptionBreak("raised")
    assert any_raised.matches(ValueError()) and not any_raised.matches(StopIteration())
    assert not any_raised.matches(KeyboardInterrupt())
    typed = ExceptionBreak("raised", parse_types("ValueError, json.JSONDecodeError"))
    assert typed.matches(json.JSONDecodeError("x", "d", 0)) and typed.matches(ValueError())
    assert not typed.matches(KeyError())
    assert parse_types(["*"]) == ()
    with pytest.raises(BreakpointError):
        parse_types(["not a type"])
    table = BreakpointTable()
    table.add_exception(ExceptionBreak("uncaught", ("KeyError",)))
    breaks = table.exceptions
    assert not breaks.raising
    raised = table.add_exception(ExceptionBreak("raised"))
    assert breaks.raising
    table.remove_id(raised.id)
    assert not breaks.raising
    assert breaks.uncaught_allows(KeyError()) and not breaks.uncaught_allows(ValueError())
    error = ValueError()
    assert breaks.first_time(error) and not breaks.first_time(error)


_AGENTS: list[_Agent] = []


@pytest.fixture(autouse=True)
def _uninstall_agents() -> Any:
    """A Debugger installs its tracer backend in this (pytest's) process: take it out after
    each test, so no trace or import hook outlives the test (or runs at interpreter exit)."""
    yield
    while _AGENTS:
        _AGENTS.pop().debugger.backend.uninstall()
    sys.settrace(None)
    threading.settrace(None)  # type: ignore[arg-type]


class _Agent:
    """A Debugger on one end of a real socket pair; the test reads its events at the other."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.debugger = Debugger(Wire(theirs), os.getcwd(), choose_backend)
        _AGENTS.append(self)
        self.debugger.mark_busy()  # the test's own thread is never held by a stop
        self.reader = ours.makefile("rb")

    def event(self) -> dict[str, Any]:
        while True:
            message = json.loads(self.reader.readline())
            if "event" in message:
                return message

    def resume(self) -> None:
        deadline = time.monotonic() + 10
        while self.debugger.paused is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.debugger.paused is not None
        self.debugger.paused.queue.put({"id": 1, "cmd": "continue", "args": {}})


def test_raised_exceptions_stop_in_user_code_only() -> None:
    agent = _Agent()
    debugger = agent.debugger
    debugger.breakpoints.add_exception(ExceptionBreak("raised", ("ValueError",)))
    assert debugger.breakpoints.exceptions.raising

    def user_code() -> None:
        try:
            json.loads("{bad")  # raised inside the standard library
        except ValueError as exc:
            library_frame = exc.__traceback__
            while library_frame is not None and library_frame.tb_next is not None:
                library_frame = library_frame.tb_next
            assert library_frame is not None
            debugger.on_exception(library_frame.tb_frame, exc, True)  # a library frame: no
            debugger.on_exception(sys._getframe(), exc, False)  # reached the user's code: stop
            debugger.on_exception(sys._getframe(), exc, False)  # the same exception: once

    worker = threading.Thread(target=user_code)
    worker.start()
    stopped = agent.event()
    assert stopped["event"] == "stopped" and stopped["reason"] == "exception"
    assert stopped["location"]["function"] == "user_code"
    assert stopped["raised_in"]["file"].endswith(os.path.join("json", "decoder.py"))
    agent.resume()
    assert agent.event()["event"] == "resumed"
    worker.join(10)
    assert not worker.is_alive()


def test_break_uncaught_without_types_sets_the_uncaught_breakpoint() -> None:
    """``break --uncaught`` with no types reaches the agent as ``uncaught: []`` (the verb
    takes type names): an exception breakpoint, not a line breakpoint missing its file."""
    server = CommandServer(_Agent().debugger)
    every = server.cmd_break(uncaught=[])
    assert every["exception"] == "uncaught" and every["types"] == []
    typed = server.cmd_break(uncaught=["KeyError"])
    assert typed["id"] == every["id"] and typed["types"] == ["KeyError"]  # one per mode


def test_a_pending_function_breakpoint_keeps_this_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set before its module exists, it still stops only its own thread once set."""
    agent = _Agent()
    debugger, server = agent.debugger, CommandServer(agent.debugger)
    debugger.cwd = str(tmp_path)
    pending = server.cmd_break(function="latepkg_xyz.mod.f", this_thread=True)
    assert pending["pending"] and pending["this_thread"]
    _write(tmp_path / "latepkg_xyz" / "mod.py", "def f():\n    return 1  # body\n")
    _write(tmp_path / "latepkg_xyz" / "__init__.py", "")
    monkeypatch.syspath_prepend(str(tmp_path))
    (made,) = debugger.retry_pending()
    assert made.function == "latepkg_xyz.mod.f" and made.this_thread
    assert made.to_json()["this_thread"]


# -- stepping, frames, evaluation, watches ---------------------------------------------------------


def test_step_requests_decide_on_real_frames() -> None:
    here = sys._getframe()
    me = threading.get_ident()

    def callee() -> Any:
        return sys._getframe()

    inner = callee()  # a finished frame still has its f_back
    over = StepRequest.from_frame("over", me, here, False)
    assert over.should_stop(here, __file__, me)
    assert not over.should_stop(inner, __file__, me)  # deeper: step over skips it
    assert not over.should_stop(here, __file__, me + 1)  # another thread
    into = StepRequest.from_frame("into", me, here, False)
    assert into.should_stop(inner, __file__, me)
    assert not into.should_stop(inner, json.__file__, me)  # just-my-code
    assert into.wants_code(inner.f_code, __file__) and not into.wants_code(
        inner.f_code, json.__file__
    )
    out = StepRequest.from_frame("out", me, inner, False)
    assert out.should_stop(here, __file__, me) and frame_depth(inner) == frame_depth(here) + 1


def test_evaluation_persists_assignments_and_is_interruptible() -> None:
    value = 1
    namespace = FrameNamespace(sys._getframe(), live=True)
    assert namespace.run("value * 10") == 10
    namespace.run("value = 5\nnew_name = 7")
    assert namespace.run("value + new_name") == 12
    with pytest.raises(EvalError) as info:
        namespace.run("1 / 0")
    assert info.value.code == "eval_error" and info.value.details["type"] == "ZeroDivisionError"
    guard = Interruptible()
    with pytest.raises(EvalError) as info, guard.running(0.2):
        namespace.run("while True: pass")
    assert info.value.code == "eval_timeout"
    with guard.running(0.2):  # the guard is reusable and nothing stray lands later
        assert namespace.run("2 + 2") == 4
    time.sleep(0.4)
    assert value in (1, 5)
    with pytest.raises(EvalTimeout), guard.running(0.1):
        while True:
            pass


def test_paused_thread_frames_watches_and_up_clamp() -> None:
    def inner() -> PausedThread:
        local_value = 42  # noqa: F841 - read by the watch
        return PausedThread(frames_from_stack(sys._getframe()), "breakpoint")

    paused = inner()
    watches = Watches()
    watches.add("local_value + 1")
    watches.add("missing_name")
    with pytest.raises(BreakpointError):
        watches.add("1 +")
    values = watches.evaluate(paused)
    assert values[0]["value"] == "43" and "NameError" in values[1]["error"]
    paused.watch_values = values
    assert paused.state()["watches"] == values
    assert [w.expression for w in watches.remove(expression="missing_name")] == ["missing_name"]
    total = len(paused.frames)
    moved = paused.cmd_frame(move=10_000)
    assert moved["selected"] == total - 1 and moved["clamped"] and "outermost" in moved["note"]
    assert paused.cmd_frame(move=-10_000)["selected"] == 0
    from mldbg.agent.paused import CommandError

    with pytest.raises(CommandError):
        paused.cmd_frame(index=total)
    timed = paused.cmd_eval("local_value", timeout=5)
    assert timed["result"] == "42"
    with pytest.raises(EvalError) as info:
        paused.cmd_eval("while True: pass", timeout=0.2)
    assert info.value.code == "eval_timeout"
