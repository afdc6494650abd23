"""Breakpoint conditions compiled into the code (3.10/3.11 ``instrument``, 3.12+ ``monitoring``).

A conditional breakpoint on a hot line is served by ``if CONDITION: __mldbg_bp__(...)``
compiled into the function, instead of a call into the debugger at every pass.  Each
scenario runs under the default backend and under plain ``settrace`` tracing
(``MLDBG_BACKEND=settrace``), and the sequences of stops (reason, function, line, the
frame's locals) must be the same: hits, logpoints, raising conditions, closures,
generators, comprehensions, methods, and steps across those lines.
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import Session, backend_params, line_of
from mldbg.agent.instrument import instrument_file
from test_tracer_instrument import _env, _stops

NOT_COMPILED = {"MLDBG_COMPILE_CONDITIONS": "0"}


def _same_as_reference(
    session: Session, python: str, script: Path, lines: list[Any], probe: str, **kw: Any
) -> list[tuple[Any, ...]]:
    """Stops with conditions compiled in == stops with the same backend evaluating them.

    The reference is the backend itself with compilation off: on 3.12+ ``settrace``
    differs from ``sys.monitoring`` by design (it reports a comprehension's line once
    per element, monitoring once per statement), so it cannot be the oracle there.
    The 3.10/3.11 reference is also compared with plain ``settrace``.
    """
    compiled, out = _stops(session, python, script, lines, None, probe, **kw)
    other = Session(session.api, session.name + "-ref", session.cwd)
    reference, ref_out = _stops(other, python, script, lines, None, probe, env=NOT_COMPILED, **kw)
    assert compiled == reference, "\n".join(
        f"{a} | {b}"
        for a, b in itertools.zip_longest([s[:3] for s in compiled], [s[:3] for s in reference])
    )
    assert out == ref_out
    if _version(python) < (3, 12):
        traced = Session(session.api, session.name + "-settrace", session.cwd)
        assert _stops(traced, python, script, lines, "settrace", probe, **kw) == (compiled, out)
    return compiled


def _version(python: str) -> tuple[int, int]:
    text = subprocess.run(
        [python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.split()
    return int(text[0]), int(text[1])


pytestmark = pytest.mark.parametrize("python", backend_params())


CONDITIONS = """
def outer(k):
    limit = 3

    def inner(x):
        y = x * 2  # closure line
        return y + limit  # enclosing name line
    return inner


def gen(n):
    for i in range(n):
        v = i * 3  # generator line
        yield v


def hot(n):
    total = 0
    for i in range(n):
        total += i  # hot line
        squares = [j * j for j in range(i % 3)]  # comprehension line
    return total + len(squares)


def risky(n):
    out = 0
    for i in range(n):
        out += i  # raising line
    return out


class K:
    def m(self, a):
        return a + 1  # method line


f = outer(1)
for q in range(5):
    f(q)  # module line
print(list(gen(5)), hot(30), risky(5), K().m(2))
"""

CONDITIONAL_BREAKPOINTS = [
    ("closure line", {"condition": "x > 2 and limit == 3"}),
    # `k` is bound by the enclosing function only: eval in the frame does not see it
    # (NameError, reported), and compiling it in would add a free variable: hook path.
    ("enclosing name line", {"condition": "k == 1"}),
    ("generator line", {"condition": "i % 2 == 0", "hits": ">=2"}),
    ("hot line", {"condition": "i > 26"}),
    ("comprehension line", {"condition": "i == 7", "log": "i={i} total={total}"}),
    ("raising line", {"condition": "1 / (i - 2) > 0"}),
    ("method line", {"condition": "a == 2"}),
    ("module line", {"condition": "q == 3"}),  # the module body: LOAD_NAME, as eval does
]


def test_compiled_in_conditions_stop_as_when_evaluated(
    session: Session, write, python: str
) -> None:
    """Conditions compiled into the code: the same stops, hits, logs and frames as tracing."""
    script = write("conditions.py", CONDITIONS)
    specs = [{"line": line_of(script, m), **extra} for m, extra in CONDITIONAL_BREAKPOINTS]
    lines = frozenset(spec["line"] for spec in specs)
    conditions = {spec["line"]: spec["condition"] for spec in specs}
    instr = instrument_file(str(script), lines, conditions)
    assert instr.uncovered == []
    assert instr.inlined == lines - {line_of(script, "enclosing name line")}
    stops = _same_as_reference(session, python, script, specs, "sorted(locals())")
    by_line = [(reason, line) for reason, _, line, _ in stops]
    assert by_line.count(("breakpoint", line_of(script, "closure line"))) == 2
    assert by_line.count(("breakpoint", line_of(script, "enclosing name line"))) == 5
    assert by_line.count(("breakpoint", line_of(script, "generator line"))) == 2
    assert by_line.count(("breakpoint", line_of(script, "hot line"))) == 3
    assert by_line.count(("breakpoint", line_of(script, "raising line"))) == 3  # 2 raises
    assert by_line.count(("breakpoint", line_of(script, "method line"))) == 1
    assert by_line.count(("breakpoint", line_of(script, "module line"))) == 1
    assert line_of(script, "comprehension line") not in {line for _, line in by_line}


def test_compiled_in_condition_that_raises_stops_with_the_error(
    session: Session, write, python: str
) -> None:
    script = write("conditions.py", CONDITIONS)
    line = line_of(script, "raising line")
    session.start(
        script,
        python=python,
        env=_env(session, None),
        stop_on_entry=False,
        breakpoints=[{"file": str(script), "line": line, "condition": "1 / (i - 2) > 0"}],
    )
    state = session.wait(20)
    assert state["location"]["line"] == line and session.value("i") == "2"
    assert "ZeroDivisionError" in state["condition_error"], state
    assert session.value("'__mldbg_bp__' in risky.__code__.co_names") == "True"
    assert session.value("__import__('sys').gettrace()") == "None"  # no tracing: compiled in
    state = session.cont()
    assert state["location"]["line"] == line and session.value("i") == "3"
    assert not state.get("condition_error")
    session.call("clear")
    assert session.run_to_end()["exit_code"] == 0
    assert "[0, 3, 6, 9, 12] 437 10 3" in session.output()


def test_steps_across_compiled_in_conditions_as_when_evaluated(
    session: Session, write, python: str
) -> None:
    """A traced frame reaching a compiled-in condition: one stop per line, never two."""
    script = write("conditions.py", CONDITIONS)
    specs = [
        {"line": line_of(script, "hot line"), "condition": "i % 2 == 1"},
        {"line": line_of(script, "raising line"), "condition": "1 / (i - 2) > 0"},
    ]
    actions = ["over"] * 6 + ["continue", "over", "over", "over", "over", "out"]
    stops = _same_as_reference(session, python, script, specs, "locals().get('i')", actions=actions)
    assert len(stops) > len(actions)


TRACEBACK_CONDITION = """
import traceback


def helper(values):
    total = 0
    for v in values:
        total += v[0]  # raises on an int
    return total


try:
    helper([(1,), 2])
except TypeError:
    print(traceback.format_exc())
"""


def test_compiled_in_condition_keeps_tracebacks(session: Session, write, python: str) -> None:
    script = write("tbc.py", TRACEBACK_CONDITION)
    plain = subprocess.run([python, str(script)], capture_output=True, text=True, cwd=script.parent)
    assert plain.returncode == 0 and "v[0]" in plain.stdout, plain.stderr
    line = line_of(script, "raises on an int")
    session.start(
        script,
        python=python,
        env=_env(session, None),
        stop_on_entry=False,
        breakpoints=[{"file": str(script), "line": line, "condition": "total < 0"}],
    )
    assert session.wait(20)["exit_code"] == 0
    assert session.output() == plain.stdout


def test_conditions_that_would_change_the_code_are_not_compiled_in(
    tmp_path: Path, python: str
) -> None:
    script = tmp_path / "shape.py"
    script.write_text(
        "def outer(k):\n"
        "    def inner(x):\n"
        "        return x\n"
        "    return inner\n"
        "class C(object):\n"
        "    def m(self):\n"
        "        return 1\n"
    )
    lines = frozenset({3, 7})
    for condition, inlined in [
        ("x > 0", {3}),
        ("k > 0", set()),  # a new free variable
        ("(y := x) > 0", set()),  # a new local
        ("[i for i in range(x)]", set()),  # nested code
        ("lambda: x", set()),
    ]:
        instr = instrument_file(str(script), frozenset({3}), {3: condition})
        assert instr.inlined == inlined, condition
        assert instr.uncovered == []
    instr = instrument_file(str(script), lines, {3: "x", 7: "super() is None"})
    assert instr.inlined == {3}  # super() needs __class__: hook path


def test_conditions_set_while_paused_compile_into_the_running_module_and_come_back_out(
    session: Session, write, python: str
) -> None:
    """Set at the entry stop: the module body (already running) defines its functions from
    compiled-in constants; removing the breakpoint restores the plain code."""
    script = write("conditions.py", CONDITIONS)
    line = line_of(script, "hot line")
    session.start(script, python=python, env=_env(session, None))
    session.brk(script, line, condition="i == 5")
    state = session.cont()
    assert state["location"]["line"] == line and session.value("i") == "5"
    assert session.value("'__mldbg_bp__' in hot.__code__.co_names") == "True"
    assert session.value("__import__('sys').gettrace()") == "None"
    session.call("remove", file=str(script), line=line)
    assert session.value("'__mldbg_bp__' in hot.__code__.co_names") == "False"
    assert session.run_to_end()["exit_code"] == 0
    assert "[0, 3, 6, 9, 12] 437 10 3" in session.output()


def test_condition_changed_while_its_loop_runs(session: Session, write, python: str) -> None:
    """The frame keeps running the code compiled for the old condition: the new one rules."""
    script = write("conditions.py", CONDITIONS)
    line = line_of(script, "hot line")
    session.start(script, python=python, env=_env(session, None))
    session.brk(script, line, condition="i >= 5")
    state = session.cont()
    assert state["location"]["line"] == line and session.value("i") == "5"
    session.brk(script, line, condition="i == 8")  # replaces it; `hot` is still running
    seen = []
    state = session.cont()
    while state["state"] == "paused":
        seen.append((state["location"]["line"], session.value("i")))
        state = session.cont()
    assert seen == [(line, "8")]
    assert "[0, 3, 6, 9, 12] 437 10 3" in session.output()


HELPER_COND = """
def compute(x):
    y = x * 2  # helper line
    return y
"""

IMPORTS_LATER = """
import helper_cond

total = sum(helper_cond.compute(n) for n in range(6))
print("total", total)
"""


def test_condition_in_a_module_imported_after_it_was_set(
    session: Session, write, python: str
) -> None:
    helper = write("helper_cond.py", HELPER_COND)
    script = write("imports_later.py", IMPORTS_LATER)
    session.start(script, python=python, env=_env(session, None))  # paused before the import
    session.brk(helper, line_of(helper, "helper line"), condition="x == 4")
    state = session.cont()
    assert state["location"]["line"] == line_of(helper, "helper line")
    assert session.value("x") == "4"
    compiled = "'__mldbg_bp__' in __import__('helper_cond').compute.__code__.co_names"
    assert session.value(compiled) == "True"
    assert session.run_to_end()["exit_code"] == 0
    assert "total 30" in session.output()


def test_condition_taken_away_while_its_loop_runs(session: Session, write, python: str) -> None:
    """Replaced by an unconditional breakpoint: every pass stops, exactly once."""
    script = write("conditions.py", CONDITIONS)
    line = line_of(script, "hot line")
    session.start(script, python=python, env=_env(session, None))
    session.brk(script, line, condition="i >= 5")
    state = session.cont()
    assert state["location"]["line"] == line and session.value("i") == "5"
    session.brk(script, line)  # replaces it, without a condition
    seen = []
    for _ in range(3):
        state = session.cont()
        seen.append((state["location"]["line"], session.value("i")))
    assert seen == [(line, "6"), (line, "7"), (line, "8")]
    session.call("clear")
    assert session.run_to_end()["exit_code"] == 0
    assert "[0, 3, 6, 9, 12] 437 10 3" in session.output()
