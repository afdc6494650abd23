"""The 3.10/3.11 ``instrument`` backend: what compiling breakpoints into code risks.

Each test runs a real script under the real daemon with a 3.10 or 3.11 interpreter.
Where the question is "does it behave exactly like tracing?", the same scenario runs
twice, once with the instrument backend and once with the plain settrace backend
(``MLDBG_BACKEND=settrace``), and the sequences of stops are compared.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import BACKEND_PYTHONS, Session, line_of
from mldbg.agent.instrument import instrument_file

PYTHONS = [
    pytest.param(
        BACKEND_PYTHONS[name],
        id=name,
        marks=(
            (
                []
                if BACKEND_PYTHONS[name]
                else [pytest.mark.skip(reason=f"no interpreter for {name}")]
            )
            + ([] if BACKEND_PYTHONS[name] == sys.executable else [pytest.mark.slow])
        ),
    )
    for name in ("settrace", "settrace-3.10")
]
pytestmark = pytest.mark.parametrize("python", PYTHONS)


def _env(session: Session, backend: str | None, **extra: str) -> dict[str, str]:
    env = {**os.environ, "MLDBG_HOME": str(session.cwd / ".mldbg"), **extra}
    env.pop("MLDBG_BACKEND", None)
    if backend:
        env["MLDBG_BACKEND"] = backend
    return env


def _stops(
    session: Session,
    python: str,
    script: Path,
    lines: list[Any],
    backend: str | None,
    probe: str,
    actions: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[list[tuple[Any, ...]], str]:
    """Run ``script`` to the end with breakpoints on ``lines``; one entry per stop.

    ``lines`` holds line numbers or dicts of extra breakpoint fields; ``actions`` says
    what to do at each stop in turn ("continue", or a step kind), "continue" after that.
    """
    specs = [
        {"file": str(script), "line": item}
        if isinstance(item, int)
        else {"file": str(script), **item}
        for item in lines
    ]
    state = session.start(
        script,
        python=python,
        env=_env(session, backend, **(env or {})),
        breakpoints=specs,
        stop_on_entry=False,
    )
    version = tuple(int(part) for part in state["python_version"].split(".")[:2])
    default = "monitoring" if version >= (3, 12) else "instrument"
    assert state["backend"] == (backend or default)
    state = session.wait(20) if state["state"] == "running" else state
    seen: list[tuple[Any, ...]] = []
    todo = list(actions or [])
    while state["state"] == "paused":
        location = state["location"]
        seen.append((state["reason"], location["function"], location["line"], session.value(probe)))
        assert len(seen) < 200, seen
        action = todo.pop(0) if todo else "continue"
        state = session.cont() if action == "continue" else session.step(action)
        if state["state"] == "running":
            state = session.wait(20)
    output = session.output()
    assert state["state"] == "exited" and state["exit_code"] == 0, (state, output)
    session.terminate()
    return seen, output


def _same_as_settrace(
    session: Session, python: str, script: Path, lines: list[Any], probe: str, **kw: Any
) -> list[tuple[Any, ...]]:
    instrumented, out = _stops(session, python, script, lines, None, probe, **kw)
    other = Session(session.api, session.name + "-settrace", session.cwd)
    traced, traced_out = _stops(other, python, script, lines, "settrace", probe, **kw)
    assert instrumented == traced, "\n".join(
        f"{a} | {b}"
        for a, b in __import__("itertools").zip_longest(
            [s[:3] for s in instrumented], [s[:3] for s in traced]
        )
    )
    assert out == traced_out
    return instrumented


SHAPES = """
import contextlib


def deco(fn):
    return fn


@deco  # decorator line
def decorated(x):
    return x + 1


def shapes(n):
    total = 0
    for i in range(n):  # for header
        total += i  # loop body
    j = 0
    while j < n:  # while header
        j += 1
    with contextlib.nullcontext():  # with line
        total += 1
    value = (total +
             n)  # continuation line
    squares = [k * k for k in range(n)]  # comprehension line
    if n > 100:
        total = -1
    elif n > 1: total += 1  # elif line
    try:
        raise KeyError(n)
    except KeyError:  # except line
        total += 2
    f = lambda a: a * 2  # lambda line
    total += f(1) + decorated(1)
    return total + value + sum(squares)


class Holder:  # class line
    attr = 1


for _ in range(2):
    shapes(3)
print("done")
"""


def test_every_kind_of_line_stops_as_under_settrace(session: Session, write, python: str) -> None:
    script = write("shapes.py", SHAPES)
    markers = [
        "decorator line",
        "for header",
        "loop body",
        "while header",
        "with line",
        "continuation line",
        "comprehension line",
        "elif line",
        "except line",
        "class line",
    ]
    lines = [line_of(script, m) for m in markers]
    # Every one of these is served by a hook (none falls back to tracing), so this compares
    # hooks with tracing; lambdas and generator expressions are traced (test below).
    assert instrument_file(str(script), frozenset(lines)).uncovered == []
    stops = _same_as_settrace(session, python, script, lines, "sorted(locals())")
    stopped = {line for _, _, line, _ in stops}
    assert stopped == set(lines)


def test_conditions_hit_counts_and_logpoints_as_under_settrace(
    session: Session, write, python: str
) -> None:
    script = write("cond.py", SHAPES)
    lines = [
        {"line": line_of(script, "for header"), "condition": "total > 2"},
        {"line": line_of(script, "loop body"), "hits": "%2"},
        {"line": line_of(script, "while header"), "hits": ">=3"},
        {"line": line_of(script, "continuation line"), "log": "value parts {total} {n}"},
    ]
    stops = _same_as_settrace(
        session, python, script, lines, "(total, locals().get('i'), locals().get('j'))"
    )
    assert stops and all(reason == "breakpoint" for reason, *_ in stops)


def test_steps_from_a_hooked_line_as_under_settrace(session: Session, write, python: str) -> None:
    script = write("steps.py", SHAPES)
    lines = [line_of(script, "loop body")]
    actions = ["over", "over", "into", "over", "out", "over", "over", "over", "into", "into", "out"]
    stops = _same_as_settrace(session, python, script, lines, "1", actions=actions)
    assert len(stops) > len(actions)


GENERATORS = """
import asyncio


def numbers(n):
    for i in range(n):
        yield i * 2  # in generator


async def fetch(x):
    await asyncio.sleep(0)
    return x + 1  # in coroutine


async def main():
    return [await fetch(i) for i in range(3)]


early = numbers(4)
first = next(early)  # generator created before the breakpoint
rest = list(early)
late = list(numbers(3))
got = asyncio.run(main())
print("results", first, rest, late, got)
"""


def test_generators_and_coroutines_as_under_settrace(session: Session, write, python: str) -> None:
    script = write("gens.py", GENERATORS)
    lines = [line_of(script, "in generator"), line_of(script, "in coroutine")]
    stops = _same_as_settrace(session, python, script, lines, "sorted(locals())")
    assert [line for _, _, line, _ in stops].count(lines[0]) == 4 + 3
    assert [line for _, _, line, _ in stops].count(lines[1]) == 3


def test_generator_suspended_before_the_breakpoint_still_stops(
    session: Session, write, python: str
) -> None:
    script = write("gens.py", GENERATORS)
    session.start(script, python=python, env=_env(session, None))
    # Paused at entry: step to the line after `first = next(early)`, so `early` is suspended.
    session.brk(script, line_of(script, "generator created before"))
    state = session.cont()
    assert state["location"]["line"] == line_of(script, "generator created before")
    session.step("over")
    session.brk(script, line_of(script, "in generator"))
    hits = []
    state = session.cont()
    while state["state"] == "paused":
        hits.append(session.value("i"))
        state = session.cont()
    assert hits == ["1", "2", "3", "0", "1", "2"]
    assert "results 0 [2, 4, 6] [0, 2, 4] [1, 2, 3]" in session.output()


TRACEBACKS = '''
import inspect
import traceback


def helper(values):
    """A docstring that stays."""
    total = 0  # breakpoint here
    for v in values:
        total += v[0]  # raises on an int
    return total


try:
    helper([(1,), 2])
except TypeError:
    print(traceback.format_exc())
print(inspect.getsource(helper))
print(helper.__doc__, helper.__code__.co_firstlineno, helper.__code__.co_name,
      helper.__code__.co_filename == __file__, inspect.signature(helper))
'''


def test_tracebacks_and_inspect_unchanged(session: Session, write, python: str) -> None:
    script = write("tb.py", TRACEBACKS)
    plain = subprocess.run([python, str(script)], capture_output=True, text=True, cwd=script.parent)
    assert plain.returncode == 0, plain.stderr
    session.start(
        script,
        python=python,
        env=_env(session, None),
        stop_on_entry=False,
        breakpoints=[{"file": str(script), "line": line_of(script, "breakpoint here")}],
    )
    state = session.wait(20)
    assert state["reason"] == "breakpoint"
    # The breakpoint is served by a hook compiled into this very function...
    assert session.value("'__mldbg_bp__' in helper.__code__.co_names") == "True"
    # ...and nothing traces this thread while it stops there.
    assert session.value("__import__('sys').gettrace()") == "None"
    state = session.cont()
    assert state["state"] == "exited"
    assert session.output() == plain.stdout


USER_TRACER = """
import sys
import time


def work(n):
    return n + 1  # never hit


def traced_call(x):
    return x * 2


print("trace at start", sys.gettrace())
time.sleep(0.5)
calls = []


def tracer(frame, event, arg):
    if event == "call":
        calls.append(frame.f_code.co_name)
    return None


sys.settrace(tracer)
traced_call(1)
sys.settrace(None)
print("user tracer saw", calls)
print("trace after", sys.gettrace(), "hooked", "__mldbg_bp__" in work.__code__.co_names)
"""


def test_untraced_while_nothing_is_armed_and_user_tracers_work(
    session: Session, write, python: str
) -> None:
    script = write("user.py", USER_TRACER)
    session.start(
        script,
        python=python,
        env=_env(session, None),
        breakpoints=[{"file": str(script), "line": line_of(script, "never hit")}],
    )
    state = session.cont()
    assert state["state"] in ("running", "exited")
    state = session.wait(20)
    out = session.output()
    assert "trace at start None" in out
    assert "user tracer saw ['traced_call']" in out
    assert "trace after None hooked True" in out
    assert state["exit_code"] == 0


REMOVAL = """
import sys
import time


def hot(x):
    return x + 1  # the breakpoint


def later(x):
    return x - 1  # defined after the entry stop


for i in range(3):
    hot(i)
while not getattr(sys.modules[__name__], "go_on", False):
    time.sleep(0.01)
print("after removal", "__mldbg_bp__" in hot.__code__.co_names, sys.gettrace())
print("later", later(5))
"""


def test_removing_a_breakpoint_restores_the_original_code(
    session: Session, write, python: str
) -> None:
    script = write("removal.py", REMOVAL)
    session.start(script, python=python, env=_env(session, None))
    session.brk(script, line_of(script, "the breakpoint"))
    # Set while paused at entry: `later` is not defined yet; the running module frame
    # must create it from instrumented code.
    session.brk(script, line_of(script, "defined after the entry stop"))
    state = session.cont()
    assert state["location"]["line"] == line_of(script, "the breakpoint")
    session.call("remove", file=str(script), line=line_of(script, "the breakpoint"))
    session.eval("import sys; sys.modules[__name__].go_on = True")
    state = session.cont()
    assert state["location"]["line"] == line_of(script, "defined after the entry stop")
    assert session.value("x") == "5"
    assert session.run_to_end()["exit_code"] == 0
    assert "after removal False None" in session.output()
    assert "later 4" in session.output()


THREADS = """
import threading
import time

stop = threading.Event()
started = threading.Event()


def step(n):
    return n + 1  # in step


def early_worker():
    n = 0
    started.set()
    while not stop.is_set():
        n = step(n)  # early loop
        time.sleep(0.001)


def spinner():
    x = 0
    while not stop.is_set():
        x += 1  # busy spin


early = threading.Thread(target=early_worker, name="early")
spin = threading.Thread(target=spinner, name="spinner")
early.start()
spin.start()
started.wait()
stop.wait(60)
stop.set()
early.join()
spin.join()
late = threading.Thread(target=step, args=(41,), name="late")
late.start()
late.join()
print("threads done")
"""


def test_threads_started_before_and_after_a_breakpoint_and_pause_in_a_thread(
    session: Session, write, python: str
) -> None:
    script = write("threads.py", THREADS)
    session.start(script, python=python, env=_env(session, None), stop_on_entry=False)
    # A pause must stop a thread spinning without a single call.
    state = session.call("pause", wait=10)
    assert state["reason"] == "pause"
    session.cont(wait=0)
    # A breakpoint in a function the early thread keeps calling (new calls: hooked code).
    session.brk(script, line_of(script, "in step"))
    state = session.wait(10)
    assert state["reason"] == "breakpoint" and state["thread"]["name"] == "early"
    session.call("clear")
    # A breakpoint in the loop the early thread is already running (old frame: traced).
    session.brk(script, line_of(script, "early loop"))
    state = session.cont()
    assert state["reason"] == "breakpoint" and state["thread"]["name"] == "early"
    assert state["location"]["line"] == line_of(script, "early loop")
    session.call("clear")
    # And in the spinner's loop: a thread that makes no call at all.
    session.brk(script, line_of(script, "busy spin"))
    state = session.cont()
    assert state["reason"] == "breakpoint" and state["thread"]["name"] == "spinner"
    session.call("clear")
    session.eval("stop.set()")
    session.brk(script, line_of(script, "in step"))
    state = session.cont()
    while state["state"] == "paused" and state["thread"]["name"] == "early":
        state = session.cont()
    assert state["state"] == "paused" and state["thread"]["name"] == "late"
    assert session.value("n") == "41"
    assert session.run_to_end()["exit_code"] == 0
    assert "threads done" in session.output()


COMPILED = """
import torch
from torch._dynamo.utils import counters


def elsewhere(x):
    return x + 1  # breakpoint elsewhere


def body(x):
    y = x * 2  # inside the compiled function
    return torch.relu(y) + 1


compiled = torch.compile(body, backend="eager")
first = compiled(torch.ones(3)).tolist()
second = compiled(torch.ones(3)).tolist()
print("results", first, second, "graphs", counters["stats"]["unique_graphs"],
      "breaks", sum(counters["graph_break"].values()))
"""


def _has_torch(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True)
    return probe.returncode == 0


def test_torch_compile_with_breakpoints_elsewhere_and_inside(
    session: Session, write, python: str
) -> None:
    if not _has_torch(python):
        pytest.skip("torch is not installed for this interpreter")
    script = write("compiled.py", COMPILED)
    plain = subprocess.run([python, str(script)], capture_output=True, text=True, cwd=script.parent)
    assert "graphs 1 breaks 0" in plain.stdout, plain.stdout + plain.stderr
    # A breakpoint in another function of the same file: dynamo compiles exactly as plain.
    session.start(
        script,
        python=python,
        env=_env(session, None),
        stop_on_entry=False,
        breakpoints=[{"file": str(script), "line": line_of(script, "breakpoint elsewhere")}],
    )
    assert session.wait(120)["exit_code"] == 0
    assert session.output().strip() == plain.stdout.strip()
    session.terminate()
    # Inside the compiled function (documented): dynamo breaks the graph at that line and
    # the debugger stops there, on every call, with the real values.
    inside = Session(session.api, session.name + "-inside", session.cwd)
    inside.start(
        script,
        python=python,
        env=_env(inside, None),
        stop_on_entry=False,
        breakpoints=[{"file": str(script), "line": line_of(script, "inside the compiled")}],
    )
    state = inside.wait(120)
    # Set while the script runs, once torch is loaded: the hook reaches dynamo wrapped in
    # torch.compiler.disable, so dynamo breaks the graph without a warning on stderr.
    stops = 0
    while state["state"] == "paused":
        assert state["location"]["line"] == line_of(script, "inside the compiled")
        assert inside.value("x.tolist()") == "[1.0, 1.0, 1.0]"
        stops += 1
        state = inside.cont(60)
    assert stops == 2
    assert "results [3.0, 3.0, 3.0] [3.0, 3.0, 3.0]" in inside.output()
    assert "sys._getframe" not in inside.output()
    inside.terminate()


FALLBACKS = """
\"\"\"Module doc.\"\"\"  # module docstring


class Documented:
    \"\"\"Class doc.\"\"\"  # class docstring


def pairs(n):
    return [
        (a, b)
        for a in range(n)
        for b in range(a)  # second line of a comprehension
    ]


def walk(n):
    for i in range(n):  # loop header in a generator
        yield i


print(pairs(3), list(walk(3)), __doc__, Documented.__doc__)
"""


def test_comprehension_lines_and_generator_loop_headers_as_under_settrace(
    session: Session, write, python: str
) -> None:
    """A comprehension's second line (its statement arms the frame), a generator's loop
    header and docstrings (no hook can serve them: the file is traced) stop exactly as
    under settrace, and the docstrings stay docstrings (the outputs are compared)."""
    script = write("fallback.py", FALLBACKS)
    markers = ["module docstring", "class docstring", "second line of a", "loop header"]
    lines = [line_of(script, m) for m in markers]
    stops = _same_as_settrace(session, python, script, lines, "sorted(locals())")
    assert {line for _, _, line, _ in stops} == set(lines)


HELPER = """
def compute(x):
    y = x + 1  # first statement
    return y * 2  # second statement
"""

EDITED = """
import time
import helper

for n in range(3):
    helper.compute(n)  # call
    time.sleep(0.01)
print("edited done")
"""


def test_file_edited_since_import_is_traced_like_settrace(
    session: Session, write, python: str
) -> None:
    """The source on disk no longer matches the running code: never hooked from the wrong text."""

    def run(backend: str | None, name: str) -> list[tuple[Any, ...]]:
        helper = write("helper.py", HELPER)
        script = write("edited.py", EDITED)
        s = Session(session.api, name, session.cwd)
        s.start(
            script,
            python=python,
            env=_env(s, backend),
            breakpoints=[{"file": str(script), "line": line_of(script, "call")}],
        )
        state = s.cont()
        assert state["reason"] == "breakpoint"
        # Shift the file by one line on disk: "first statement" is now on the line the
        # running code has its second statement on.
        helper.write_text("# edited\n" + helper.read_text())
        s.brk(helper, line_of(helper, "first statement"))
        s.call("remove", file=str(script), line=line_of(script, "call"))
        seen = []
        state = s.cont()
        while state["state"] == "paused":
            seen.append((state["location"]["function"], state["location"]["line"], s.value("x")))
            state = s.cont()
        assert state["exit_code"] == 0 and "edited done" in s.output()
        s.terminate()
        return seen

    instrumented = run(None, session.name)
    traced = run("settrace", session.name + "-settrace")
    assert instrumented == traced
    assert [x for _, _, x in instrumented] == ["0", "1", "2"]


HELPER_WALK = """
def walk(n):
    for i in range(n):  # helper loop header
        yield i
"""

TWO_FILES = """
import helper_walk


def local_walk(n):
    for i in range(n):  # local loop header
        yield i


for _ in range(3):
    list(helper_walk.walk(2))
    list(local_walk(2))
print("two files done")
"""


def test_traced_fallback_sees_breakpoints_added_later_in_other_files(
    session: Session, write, python: str
) -> None:
    """Generator loop headers are traced (no hook): one set later, elsewhere, stops too."""
    helper = write("helper_walk.py", HELPER_WALK)
    script = write("two_files.py", TWO_FILES)
    local = line_of(script, "local loop header")
    session.start(
        script,
        python=python,
        env=_env(session, None),
        stop_on_entry=False,
        breakpoints=[{"file": str(script), "line": local}],
    )
    state = session.wait(20)
    assert state["location"]["line"] == local  # helper_walk.walk already ran, traced
    session.brk(helper, line_of(helper, "helper loop header"))
    session.call("remove", file=str(script), line=local)
    state = session.cont()
    assert state["state"] == "paused"
    assert state["location"]["file"] == str(helper.resolve()), state["location"]
    assert state["location"]["line"] == line_of(helper, "helper loop header")
    assert state["location"]["function"] == "walk"
    assert session.run_to_end()["exit_code"] == 0


DEFERRED = """
def make():
    double = lambda a: a * 2  # lambda line
    gen = (b + 1 for b in range(2))  # genexpr line
    return double, gen


double, gen = make()
print(double(3), list(gen))
"""


def test_lambdas_and_generator_expressions_run_later_as_under_settrace(
    session: Session, write, python: str
) -> None:
    """Their code runs from another line, after the line that made them: still stops."""
    script = write("deferred.py", DEFERRED)
    lines = [line_of(script, "lambda line"), line_of(script, "genexpr line")]
    stops = _same_as_settrace(session, python, script, lines, "sorted(locals())")
    assert {function for _, function, _, _ in stops} >= {"<lambda>", "<genexpr>"}
