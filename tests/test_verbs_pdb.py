"""The verbs pdb and debugpy users reach for first (issue 12), end to end.

Real daemon, real debuggees, on the 3.10/3.11 default backend (instrument) and on
3.12's ``sys.monitoring``: exception breakpoints, function breakpoints by dotted name,
``until``, ``restart``, ``watch``, breakpoint ids, ``up`` past the outermost frame,
library paths, a pause that lands in library code, f-string logpoints, an interruptible
eval, every thread stopping, and the CLI's ``start -m`` / ``wait``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Session, backend_params, line_of, wait_until
from mldbg.errors import MldbgError
from test_engine import LOOP

BACKENDS = [p for p in backend_params() if p.id in ("settrace", "monitoring")]
pytestmark = pytest.mark.parametrize("python", BACKENDS)


def _post(session: Session, verb: str, body: dict[str, Any], expect: int = 200) -> Any:
    return session.call(verb, expect, **body)


def _break(session: Session, expect: int = 200, **body: Any) -> Any:
    return _post(session, "break", body, expect)


# -- exception breakpoints --------------------------------------------------------------------

RAISING = """
import json

def risky(n):
    if n == 2:
        raise ValueError(f"bad {n}")  # raise here
    return n

out = []
for i in range(4):
    try:
        out.append(risky(i))
    except ValueError:
        out.append(-1)
try:
    json.loads("{bad")  # the library raises
except json.JSONDecodeError:
    out.append("json")
try:
    {}["missing"]  # a KeyError: not asked for
except KeyError:
    pass
print("done", out)
"""


def test_break_on_raised_exceptions_even_when_caught(session: Session, write, python: str) -> None:
    script = write("raising.py", RAISING)
    session.start(script, python=python)
    bp = _break(session, raised=["ValueError"])
    assert bp["exception"] == "raised" and bp["types"] == ["ValueError"]
    state = session.cont()
    assert state["reason"] == "exception" and state["raised"], state
    assert state["location"]["line"] == line_of(script, "raise here")
    assert state["exception"]["type"] == "ValueError"
    assert session.value("n") == "2"  # a live frame: eval works
    # json raises inside the standard library: the stop is the user's line that called it
    state = session.cont()
    assert state["reason"] == "exception", state
    assert state["location"]["line"] == line_of(script, "the library raises")
    assert state["exception"]["type"] == "JSONDecodeError"
    assert state["raised_in"]["file"].endswith(os.path.join("json", "decoder.py"))
    assert "library" in state["note"]
    state = session.cont()
    assert state["state"] == "exited", state  # KeyError was not asked for
    assert "done [0, 1, -1, 3, 'json']" in session.output()


def test_break_on_any_raised_exception_then_remove_it_by_id(
    session: Session, write, python: str
) -> None:
    script = write("raising.py", RAISING)
    session.start(script, python=python)
    bp = _break(session, raised=[])  # no types: every exception
    assert bp["types"] == []
    state = session.cont()
    assert state["exception"]["type"] == "ValueError"
    listed = session.call("breaks")["breakpoints"]
    assert [b["id"] for b in listed] == [bp["id"]]
    removed = _post(session, "remove", {"id": bp["id"]})
    assert removed["id"] == bp["id"]
    error = _post(session, "remove", {"id": 99999}, expect=400)
    assert error["code"] == "no_such_breakpoint"
    assert session.cont()["state"] == "exited"


def test_uncaught_with_types_filters_post_mortem_stops(
    session: Session, write, python: str
) -> None:
    script = write("boom.py", "x = 1\nraise KeyError('boom')  # boom\n")
    session.start(script, python=python)
    _break(session, uncaught=["ValueError"])
    state = session.cont()
    assert state["state"] == "exited" and state["exit_code"] == 1, state  # KeyError: no stop


def test_uncaught_without_types_stops_on_every_type_again(
    session: Session, write, python: str
) -> None:
    """``break --uncaught`` with no types (``uncaught: []``) replaces a filter by every type."""
    script = write("boom.py", "x = 1\nraise KeyError('boom')  # boom\n")
    session.start(script, python=python)
    _break(session, uncaught=["ValueError"])
    every = _break(session, uncaught=[])
    assert every["exception"] == "uncaught" and every["types"] == [], every
    state = session.cont()
    assert state["state"] == "paused" and state["reason"] == "exception", state


def test_raised_on_the_plain_settrace_backend(session: Session, write, python: str) -> None:
    """MLDBG_BACKEND=settrace (the fallback where the instrument backend cannot run)."""
    if "3.12" in python or "3.13" in python:
        pytest.skip("sys.monitoring is the only backend from 3.12 on")
    script = write("raising.py", RAISING)
    env = {**os.environ, "MLDBG_BACKEND": "settrace", "MLDBG_HOME": str(session.cwd / ".mldbg")}
    first = session.start(script, python=python, env=env)
    assert first["backend"] == "settrace"
    _break(session, raised=["ValueError"])
    state = session.cont()
    assert state["location"]["line"] == line_of(script, "raise here"), state
    state = session.cont()
    assert state["location"]["line"] == line_of(script, "the library raises"), state
    assert session.cont()["state"] == "exited"


# -- function breakpoints ---------------------------------------------------------------------

FUNCTIONS = """
import sys
from pathlib import Path

from pkg.models import Net

def parse(text):
    value = int(text)  # parse body
    return value

net = Net()
print(net.forward(parse("3")))
Path("late_mod.py").write_text("def late(x):\\n    y = x + 1  # late body\\n    return y\\n")
sys.path.insert(0, ".")
import late_mod
print(late_mod.late(1))
"""

MODELS = '''
import functools


def deco(fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        return fn(*a, **k)

    return wrapper


class Net:
    class Inner:
        def run(self):
            return 1

    @deco
    def forward(self, x):
        """Doc line."""
        out = x * 2  # forward body
        return out + self.Inner().run()
'''


def test_function_breakpoints_by_dotted_name(session: Session, write, python: str) -> None:
    script = write("fmain.py", FUNCTIONS)
    models = write("pkg/models.py", MODELS)
    write("pkg/__init__.py", "")
    session.start(
        script,
        python=python,
        breakpoints=[{"function": "__main__.parse"}, {"function": "pkg.models.Net.forward"}],
    )
    inner = _break(session, function="pkg.models.Net.Inner.run")
    assert (
        inner["file"] == str(models.resolve()) and inner["function"] == "pkg.models.Net.Inner.run"
    )
    late = _break(session, function="late_mod.late")  # its file does not exist yet
    assert late["pending"] is True
    state = session.cont()
    assert state["reason"] == "breakpoint", state
    assert state["location"]["line"] == line_of(script, "parse body")
    state = session.cont()
    assert state["location"]["line"] == line_of(models, "forward body")  # after the docstring
    state = session.cont()
    assert state["location"]["function"] == "run"
    state = session.cont()
    assert state["reason"] == "breakpoint", state
    assert state["location"]["function"] == "late" and session.value("x") == "1"
    listed = session.call("breaks")["breakpoints"]
    assert not any(b.get("pending") for b in listed)
    assert session.cont()["state"] == "exited"


def test_pending_function_breakpoint_is_set_when_its_module_loads(
    session: Session, write, python: str
) -> None:
    write("relib/__init__.py", "from .impl import Thing as Alias\n")
    impl = write(
        "relib/impl.py",
        """
        class Thing:
            @staticmethod
            def go(x):
                return x * 3  # go body
        """,
    )
    script = write("use.py", "import relib\nprint(relib.Alias.go(2))  # at once, no import\n")
    session.start(script, python=python, breakpoints=[{"function": "relib.Alias.go"}])
    (listed,) = session.call("breaks")["breakpoints"]
    assert listed["pending"] is True  # relib/__init__.py does not define Alias itself
    state = session.cont()
    assert state["reason"] == "breakpoint", state
    assert state["location"] == {**state["location"], "file": str(impl.resolve())}
    assert state["location"]["line"] == line_of(impl, "go body")
    assert session.cont()["state"] == "exited" and "6" in session.output()


def test_function_breakpoint_errors(session: Session, write, python: str) -> None:
    script = write("fmain.py", FUNCTIONS)
    write("pkg/models.py", MODELS)
    write("pkg/__init__.py", "")
    session.start(script, python=python)
    # not imported yet, and its source does not define it (a re-export?): pending, said so
    assert _break(session, function="pkg.models.Nope")["pending"] is True
    for name, code in (
        ("json.nope_xyz", "no_such_function"),  # a loaded module: it can be asked
        ("pkg.models.Net", "no_such_function"),  # a class: name a method
        ("not a name", "bad_argument"),
        ("parse", "bad_argument"),  # no module
    ):
        error = _break(session, function=name, expect=400)
        assert error["code"] == code, (name, error)


# -- until, ids, up, watch, restart -----------------------------------------------------------


def test_until_line_id_and_file(session: Session, write, python: str) -> None:
    script = write("loop.py", LOOP)
    session.start(script, python=python)
    state = _post(session, "until", {"target": str(line_of(script, "call site")), "wait": 20})
    assert state["location"]["line"] == line_of(script, "call site"), state
    assert state["until"]["temporary"] is True
    # the one-shot breakpoint is gone: continue runs to the end
    assert session.call("breaks")["breakpoints"] == []
    bp = session.brk(script, line_of(script, "in double"))
    state = _post(session, "until", {"target": f"#{bp['id']}", "wait": 20})
    assert state["location"]["line"] == line_of(script, "in double")
    assert state["until"]["existing"] is True
    session.call("remove", id=bp["id"])
    state = _post(session, "until", {"target": f"{script}:{line_of(script, 'after loop')}"})
    assert state["location"]["line"] == line_of(script, "after loop")
    assert session.value("total") == "20"
    error = _post(session, "until", {"target": "nonsense"}, expect=400)
    assert error["code"] == "bad_argument"


def test_up_stops_at_the_outermost_frame(session: Session, write, python: str) -> None:
    script = write("loop.py", LOOP)
    session.start(script, python=python, breakpoints=[{"file": str(script), "line": 2}])
    session.cont()
    moved = _post(session, "up", {"count": 50})
    assert moved["selected"] == 1 and moved["clamped"] and "outermost" in moved["note"]
    assert moved["frame"]["function"] == "<module>"
    again = _post(session, "up", {"count": 1})
    assert again["selected"] == 1 and "already" in again["note"]
    assert _post(session, "down", {"count": 9})["selected"] == 0


def test_watch_shown_at_every_stop_and_kept_by_restart(
    session: Session, write, python: str
) -> None:
    script = write("loop.py", LOOP)
    first = session.start(script, python=python)
    session.brk(script, line_of(script, "call site"))
    watched = _post(session, "watch", {"expression": "total * 10"})
    assert watched["watch"]["expression"] == "total * 10"
    _post(session, "watch", {"expression": "undefined_name"})
    state = session.cont()
    values = {w["expression"]: w for w in state["watches"]}
    assert values["total * 10"]["value"] == "0"
    assert "NameError" in values["undefined_name"]["error"]
    state = session.cont()
    assert {w["expression"]: w.get("value") for w in state["watches"]}["total * 10"] == "0"
    state = session.cont()
    assert {w["expression"]: w.get("value") for w in state["watches"]}["total * 10"] == "20"
    status = session.state()  # status carries them too
    assert len(status["watches"]) == 2
    assert _post(session, "unwatch", {"target": "undefined_name"})["watches"] == [
        {"id": watched["watch"]["id"], "expression": "total * 10", "value": "20"}
    ]
    now = _post(session, "watch", {"expression": "i"})  # set while paused: its value at once
    assert now["watch"]["value"] == "2" and session.state()["watches"][-1]["value"] == "2"
    _post(session, "unwatch", {"target": "i"})

    restarted = _post(session, "restart", {})
    assert restarted["state"] == "paused" and restarted["reason"] == "entry", restarted
    assert restarted["run_id"] != first["run_id"]
    assert restarted["restarted_from"] == first["run_id"]
    state = session.cont()
    assert state["location"]["line"] == line_of(script, "call site")
    assert [w["expression"] for w in state["watches"]] == ["total * 10"]
    session.run_to_end()
    again = _post(session, "restart", {})  # an ended session restarts too
    assert again["state"] == "paused"
    assert session.cont()["location"]["line"] == line_of(script, "call site")


# -- library paths ----------------------------------------------------------------------------


def test_breakpoint_files_found_among_what_the_script_imports(
    session: Session, write, python: str
) -> None:
    lib = write("libs/deep/pkg/uniquely_named_mod.py", "def f(x):\n    return x + 1  # lib body\n")
    write("libs/deep/pkg/__init__.py", "")
    write("libs/deep/a/dup.py", "x = 1\n")
    write("libs/deep/b/dup.py", "x = 1\n")
    script = write(
        "main.py", "import json\nfrom pkg.uniquely_named_mod import f\nprint(f(json.loads('1')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(script.parent / "libs" / "deep")}
    session.start(script, python=python, env={**env, "MLDBG_HOME": str(session.cwd / ".mldbg")})
    found = _break(session, file="uniquely_named_mod.py", line=2)
    assert found["file"] == str(lib.resolve())
    decoder = _break(session, file="json/decoder.py", line=_first_code_line("json/decoder.py"))
    assert decoder["file"].endswith(os.path.join("json", "decoder.py"))
    error = _break(session, file="dup.py", line=1, expect=400)
    assert error["code"] == "ambiguous_file" and len(error["candidates"]) == 2
    error = _break(session, file="no_such_file_anywhere.py", line=1, expect=400)
    assert error["code"] == "file_not_found"
    session.call("remove", id=decoder["id"])
    state = session.cont()
    assert state["location"]["file"] == str(lib.resolve()), state


def _first_code_line(relative: str) -> int:
    """A line of the standard library file that holds code (so the test never hard-codes one)."""
    import json as json_module
    import sys

    path = Path(json_module.__file__).parent.parent / relative
    code = compile(path.read_text(), str(path), "exec")
    lines = sorted({line for _, _, line in code.co_lines() if line})
    assert lines, sys.version
    return lines[1]


# -- pause lands in the user's code ------------------------------------------------------------


def test_pause_stops_in_user_code_not_in_a_library(session: Session, write, python: str) -> None:
    script = write(
        "busy.py",
        """
        import json
        data = {"k": list(range(300))}
        n = 0
        while True:
            text = json.dumps(data, indent=1)  # mostly library time
            n += 1  # user line
            if n == 3:
                print("started", flush=True)
        """,
    )
    session.start(script, python=python, stop_on_entry=False)
    session.wait_for_output("started")
    for _ in range(3):
        state = _post(session, "pause", {"wait": 20})
        assert state["state"] == "paused", state
        assert state["location"]["file"] == str(script.resolve()), state
        session.cont(wait=0)


def test_pause_deep_in_a_library_says_where_and_offers_step_out(
    session: Session, write, python: str
) -> None:
    # a "library": any file under a site-packages directory; this one never returns
    write(
        "libs/site-packages/spinlib.py", "def spin():\n    n = 0\n    while True:\n        n += 1\n"
    )
    script = write(
        "lib_bound.py",
        """
        import spinlib
        print("started", flush=True)
        spinlib.spin()  # the user's last line
        """,
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(script.parent / "libs" / "site-packages"),
        "MLDBG_HOME": str(session.cwd / ".mldbg"),
    }
    session.start(script, python=python, stop_on_entry=False, env=env)
    session.wait_for_output("started")
    state = _post(session, "pause", {"wait": 25})
    assert state["state"] == "paused", state
    assert state["location"]["file"].endswith("spinlib.py"), state
    assert "library" in state["note"], state
    assert f"<module>() at line {line_of(script, 'last line')}" in state["note"]
    assert {"verb": "step", "args": {"kind": "out"}} in state["fix"]
    assert session.value("n") != "0"  # the library's frame, live


# -- f-string logpoints -----------------------------------------------------------------------


def test_logpoints_are_fstrings(session: Session, write, python: str) -> None:
    script = write(
        "log.py",
        """
        xs = [1.0, 2.0, 4.0]
        name = "net"
        d = {"a": {"b": 7}}
        width = 8
        print("end")  # here
        """,
    )
    session.start(script, python=python)
    line = line_of(script, "here")
    template = (
        "mean={sum(xs) / len(xs):.3f} {name!r} {len(xs)=} {d['a']['b']:>{width}} "
        "{{literal}} {missing}"
    )
    session.brk(script, line, log=template)
    for bad in ("{x", "x}", "{!r}", "{x!z}"):
        error = session.brk(script, line, expect=400, log=bad)
        assert error["code"] == "bad_log", (bad, error)
    assert session.cont()["state"] == "exited"
    out = session.output()
    assert "mean=2.333 'net' len(xs)=3        7 {literal} <error: NameError" in out, out


# -- interruptible eval -----------------------------------------------------------------------


def test_a_runaway_eval_is_interrupted_and_the_session_stays_paused(
    session: Session, write, python: str
) -> None:
    script = write("loop.py", LOOP)
    session.start(script, python=python, breakpoints=[{"file": str(script), "line": 2}])
    where = session.cont()["location"]
    error = _post(session, "eval", {"expression": "while True: pass", "timeout": 1}, expect=400)
    assert error["code"] == "eval_timeout", error
    assert session.value("x + 1") == "1"
    assert session.state()["location"] == where

    # a pause interrupts an evaluation that has no short timeout
    answer: dict[str, Any] = {}

    def runaway() -> None:
        try:
            session.client.call("eval", session.name, expression="n = 0\nwhile True: n += 1")
        except MldbgError as exc:
            answer.update(exc.to_json())

    worker = threading.Thread(target=runaway)
    worker.start()
    deadline = time.monotonic() + 30
    while worker.is_alive() and time.monotonic() < deadline:
        state = _post(session, "pause", {"wait": 0})
        if state.get("interrupted"):
            break
        time.sleep(0.1)
    worker.join(60)
    assert answer.get("code") == "eval_interrupted", (answer, session.output())
    assert int(session.value("n")) > 0  # what ran before the interrupt stays
    assert session.state()["state"] == "paused"
    assert session.run_to_end()["state"] == "exited"


def test_ctrl_c_on_cli_eval_interrupts_it_inside_the_script(
    cli, write, python: str, config_dir: Path, tmp_path: Path
) -> None:
    import signal
    import subprocess
    import sys

    write("loop.py", LOOP)
    name = f"cc{os.getpid()}{int(time.time() * 1000) % 100000}"
    cli("start", "--session", name, "--python", python, "--break", "loop.py:2", "loop.py")
    assert cli("continue", "--session", name, json_out=True)["reason"] == "breakpoint"
    env = {**os.environ, "MLDBG_CONFIG_DIR": str(config_dir)}
    proc = subprocess.Popen(
        # A timeout far past the wait below: on a loaded machine the eval must still be
        # running when Ctrl-C comes (it timed out at the 30 s default, exit 1, once).
        [
            sys.executable,
            "-m",
            "mldbg",
            "eval",
            "--session",
            name,
            "--timeout",
            "600",
            "while True: pass",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # `threads` shows where the paused thread is: inside the evaluated code once it runs
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = cli("threads", "--session", name, json_out=True)["threads"]
        where = listed[0]["where"] or {}
        if (where.get("innermost") or {}).get("file") == "<mldbg-eval>":
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "interrupted the evaluation" in err
    assert cli("eval", "--session", name, "x + 1", json_out=True)["result"] == "1"
    assert cli("status", "--session", name, json_out=True)["state"] == "paused"
    cli("terminate", "--session", name)


# -- every thread stops -----------------------------------------------------------------------

THREADED = """
import threading
import time

counter = 0
stop = False

def spin():
    global counter
    while not stop:
        counter += 1  # worker line
        time.sleep(0.001)

worker = threading.Thread(target=spin, name="spinner")
worker.start()
while counter < 50:
    time.sleep(0.01)
stop_at = counter  # main stop
while counter < stop_at + 20:  # the worker runs on after the stop (a step in it, say)
    time.sleep(0.001)
stop = True
worker.join()
print("joined")
"""


def _wait_threads_paused(session: Session, count: int) -> Any:
    def listed() -> Any:
        threads = session.call("threads")
        return threads if sum(t["paused"] for t in threads["threads"]) >= count else None

    return wait_until(listed, 30, f"{count} paused threads")


def test_all_threads_stop_and_thread_selects_one(session: Session, write, python: str) -> None:
    script = write("threads.py", THREADED)
    line = line_of(script, "main stop")
    session.start(script, python=python, breakpoints=[{"file": str(script), "line": line}])
    state = session.cont()
    assert state["reason"] == "breakpoint", state
    listed = _wait_threads_paused(session, 2)
    names = {t["name"]: t for t in listed["threads"]}
    assert set(names) == {"MainThread", "spinner"}, listed
    assert names["spinner"]["paused"] and names["MainThread"]["stopped_here"]
    first = session.value("counter")
    time.sleep(0.2)
    assert session.value("counter") == first  # the worker is held
    selected = _post(session, "thread", {"number": names["spinner"]["number"]})
    assert selected["location"]["function"] == "spin", selected
    assert session.stack()["frames"][0]["function"] == "spin"
    assert session.value("threading.current_thread().name") == "'spinner'"
    back = _post(session, "thread", {"number": names["MainThread"]["number"]})
    assert back["location"]["line"] == line
    error = _post(session, "thread", {"number": 424242}, expect=400)
    assert error["code"] == "no_such_thread"
    # step in the selected worker: it stops on its next line, and the main thread is held
    _post(session, "thread", {"number": names["spinner"]["number"]})
    stepped = session.step("over")
    assert stepped["reason"] == "step" and stepped["thread"]["name"] == "spinner", stepped
    assert stepped["location"]["function"] == "spin"
    assert session.run_to_end()["state"] == "exited"
    assert "joined" in session.output()


def test_this_thread_leaves_the_others_running(session: Session, write, python: str) -> None:
    script = write("threads.py", THREADED)
    line = line_of(script, "main stop")
    session.start(
        script,
        python=python,
        breakpoints=[{"file": str(script), "line": line, "this_thread": True}],
    )
    session.cont()
    first = int(session.value("counter"))
    deadline = time.monotonic() + 30
    while int(session.value("counter")) == first and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int(session.value("counter")) > first  # the worker kept running
    listed = session.call("threads")
    assert [t["paused"] for t in listed["threads"] if t["name"] == "spinner"] == [False]
    assert session.run_to_end()["state"] == "exited"


# -- the CLI: start -m with the script's own options, wait, library breakpoints with --cwd -------


def test_cli_module_args_wait_and_cwd_breakpoints(cli, write, python: str) -> None:
    write("pkg/__init__.py", "")
    write("pkg/mod.py", "import sys\nprint('ARGV', sys.argv[1:])  # module line\n")
    proj = write("proj/train.py", "step = 1\nstep += 1  # train line\nprint('trained', step)\n")
    name = f"cli{os.getpid()}{int(time.time() * 1000) % 100000}"
    started = cli(
        "start", "--session", name, "--python", python, "--run",
        "-m", "pkg.mod", "--lr", "3", "pos", "--c", "5", "--rep",
        json_out=True,
    )  # fmt: skip
    assert started["state"] in ("running", "exited"), started
    done = cli("wait", "--session", name, json_out=True)
    assert done["state"] == "exited", done
    output = cli("output", "--session", name, json_out=True)["output"]
    assert "ARGV ['--lr', '3', 'pos', '--c', '5', '--rep']" in output, output

    line = line_of(proj, "train line")
    cli(
        "start", "--session", name, "--replace", "--python", python, "--run",
        "--cwd", "proj", "--break", f"train.py:{line}", "train.py",
        json_out=True,
    )  # fmt: skip
    state = cli("wait", "--session", name, json_out=True)  # the stop already happened
    assert state["state"] == "paused" and state["location"]["line"] == line, state
    assert state["location"]["file"] == str(proj.resolve())
    until = cli("until", "--session", name, str(line + 1), json_out=True)
    assert until["location"]["line"] == line + 1, until
    cli("terminate", "--session", name)


def test_cli_break_variants(cli, write, python: str) -> None:
    script = write("raising.py", RAISING)
    name = f"clib{os.getpid()}{int(time.time() * 1000) % 100000}"
    cli("start", "--session", name, "--python", python, "raising.py", json_out=True)
    bp = cli("break", "--session", name, "--raised", json_out=True)
    assert bp["exception"] == "raised" and bp["types"] == []
    proc = cli("break", "--session", name, "--raised", "KeyError", "ValueError")
    assert "KeyError, ValueError" in proc.stdout
    fn = cli("break", "--session", name, "--function", "__main__.risky", json_out=True)
    assert fn["file"] == str(script.resolve())
    removed = cli("remove", "--session", name, str(fn["id"]), json_out=True)
    assert removed["id"] == fn["id"]
    listed = cli("breaks", "--session", name, json_out=True)["breakpoints"]
    assert [b["types"] for b in listed] == [["KeyError", "ValueError"]]
    cli("watch", "--session", name, "out")
    state = cli("continue", "--session", name, json_out=True)
    assert state["exception"]["type"] == "ValueError" and state["watches"][0]["value"] == "[0, 1]"
    human = cli("status", "--session", name).stdout
    assert "watch out = [0, 1]" in human
    cli("terminate", "--session", name)
    assert json.loads(json.dumps(listed))  # plain JSON all the way


# -- the same verbs as MCP tools ----------------------------------------------------------------


def test_the_new_verbs_through_mcp(
    config_dir: Path, daemon: dict[str, Any], tmp_path: Path, write, python: str
) -> None:
    from test_mcp import Tools, run_mcp

    script = write("loop.py", LOOP)
    call = line_of(script, "call site")
    name = f"mcpv{os.getpid()}{int(time.time() * 1000) % 100000}"

    async def scenario(tool: Tools, client: Any) -> None:
        listed = {t.name for t in (await client.list_tools()).tools}
        assert {"until", "restart", "watch", "unwatch", "threads", "thread"} <= listed
        state = await tool("start", script="loop.py", python=python, session=name)
        assert state["reason"] == "entry"
        fn = await tool("break", function="__main__.double", session=name)
        assert fn["line"] == line_of(script, "in double")
        await tool("remove", id=fn["id"], session=name)
        raised = await tool("break", raised=[], session=name)
        assert raised["exception"] == "raised"
        watch = await tool("watch", expression="total", session=name)
        assert "NameError" in watch["watch"]["error"]  # at entry, total is not defined yet
        state = await tool("until", target=str(call), session=name)
        assert state["location"]["line"] == call and state["watches"][0]["value"] == "0"
        threads = await tool("threads", session=name)
        assert threads["threads"][0]["stopped_here"]
        chosen = await tool("thread", number=1, session=name)
        assert chosen["location"]["line"] == call
        timed = await tool.error("eval", expression="while True: pass", timeout=0.5, session=name)
        assert timed["code"] == "eval_timeout"
        assert (await tool("up", count=5, session=name))["clamped"]
        assert (await tool("unwatch", session=name))["watches"] == []
        again = await tool("restart", session=name)
        assert again["reason"] == "entry" and again["restarted_from"] == state["run_id"]
        assert [b["exception"] for b in (await tool("breaks", session=name))["breakpoints"]] == [
            "raised"
        ]
        await tool("terminate", session=name)

    run_mcp(config_dir, tmp_path, scenario)
