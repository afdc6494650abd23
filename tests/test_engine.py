"""The debug engine end to end, on both tracer backends: real daemon, real debuggees."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from conftest import Session, backend_params, call, line_of

pytestmark = pytest.mark.parametrize("python", backend_params())

LOOP = """
def double(x):
    y = x * 2  # in double
    return y

total = 0
for i in range(5):
    total += double(i)  # call site
print("total", total)  # after loop
"""


def test_entry_stop_runs_script_exactly_like_python(session: Session, write, python: str) -> None:
    script = write(
        "prog.py",
        """
        import os, sys
        seen = (sys.argv, __name__, __file__, sys.path[0], os.environ.get("PYTHONPATH"), os.getcwd())
        print(seen)
    """,
    )
    state = session.start(
        script, "--flag", "value", python=python, env={**os.environ, "PYTHONPATH": "/custom"}
    )
    assert state["state"] == "paused" and state["reason"] == "entry"
    assert state["location"]["line"] == 1 and state["location"]["file"] == str(script.resolve())
    assert state["backend"] == ("monitoring" if state["python_version"] >= "3.12" else "instrument")
    session.step("over")
    state = session.step("over")
    assert state["location"]["line"] == 3
    argv, name, file, path0, pythonpath, cwd = eval(session.value("seen"))
    assert argv == [str(script), "--flag", "value"]
    assert name == "__main__" and file == str(script)
    assert path0 == str(script.parent.resolve())
    assert pythonpath == "/custom"  # the agent's own entry is gone
    assert cwd == str(session.cwd)
    final = session.run_to_end()
    assert final["state"] == "exited" and final["exit_code"] == 0


def test_breakpoint_condition_hits_and_logpoint(session: Session, write, python: str) -> None:
    script = write("loop.py", LOOP)
    inner, call, after = (
        line_of(script, "in double"),
        line_of(script, "call site"),
        line_of(script, "after loop"),
    )
    session.start(
        script,
        python=python,
        stop_on_entry=False,
        breakpoints=[{"file": str(script), "line": inner, "condition": "x == 3"}],
    )
    state = session.wait()
    assert state["reason"] == "breakpoint" and state["location"]["line"] == inner
    assert session.value("x") == "3"
    session.call("clear")
    session.brk(script, call, hits="2")
    session.brk(script, after, log="total={total} twice={total * 2}")
    state = session.cont()
    assert state["state"] == "exited"  # i == 4 is the 1st hit of the call site after the clear
    assert "total=20 twice=40" in session.output()


def test_hit_counts_stop_on_the_nth_hit(session: Session, write, python: str) -> None:
    script = write("loop.py", LOOP)
    inner = line_of(script, "in double")
    session.start(script, python=python)
    session.brk(script, inner, hits="3")
    assert session.cont()["location"]["line"] == inner
    assert session.value("x") == "2"
    session.brk(script, inner, hits="%2")  # replaces it: every 2nd hit from now on
    state = session.cont()
    assert state["reason"] == "breakpoint" and session.value("x") == "4"


def test_condition_that_raises_stops_and_says_so(session: Session, write, python: str) -> None:
    script = write("loop.py", LOOP)
    inner = line_of(script, "in double")
    session.start(script, python=python)
    session.brk(script, inner, condition="undefined_name > 1")
    state = session.cont()
    assert state["reason"] == "breakpoint"
    assert "NameError" in state["condition_error"]


def test_bad_breakpoints_are_refused_with_a_way_forward(
    session: Session, write, python: str
) -> None:
    script = write("blank.py", "x = 1\n\n\n# comment\ny = 2\n")
    session.start(script, python=python)
    error = session.brk(script, 2, expect=400)
    assert error["nearest_lines"] == [1, 5]
    assert "nearest executable lines: 1, 5" in error["error"]
    error = session.brk(session.cwd / "missing.py", 3, expect=400)
    assert "no such file" in error["error"]
    error = session.brk(script, 1, condition="x ==", expect=400)
    assert "not a valid Python expression" in error["error"]
    error = session.brk(script, 1, hits="banana", expect=400)
    assert "bad hit count" in error["error"]


def test_breakpoint_paths_are_normalized(
    session: Session, write, python: str, tmp_path: Path
) -> None:
    script = write("real/model.py", LOOP)
    link = tmp_path / "linked"
    link.symlink_to(tmp_path / "real")
    session.start(link / "model.py", python=python)
    relative = os.path.relpath(script, session.cwd)
    # A relative path resolves against the session's cwd; the symlinked run still matches.
    session.brk(relative, line_of(script, "in double"))
    state = session.cont()
    assert state["reason"] == "breakpoint"
    assert state["location"]["file"] == str(script.resolve())


def test_step_over_into_out_with_just_my_code(session: Session, write, python: str) -> None:
    helper = write(
        "helper.py",
        """
        import json

        def encode(value):
            text = json.dumps(value)  # in encode
            return text
    """,
    )
    script = write(
        "main.py",
        """
        import helper

        def run():
            out = helper.encode([1, 2])  # call encode
            return out

        result = run()  # top call
        print(result)
    """,
    )
    session.start(
        script,
        python=python,
        breakpoints=[{"file": str(script), "line": line_of(script, "call encode")}],
    )
    assert session.cont()["location"]["line"] == line_of(script, "call encode")
    state = session.step("into")
    assert state["location"]["file"] == str(helper.resolve())
    assert state["location"]["line"] == line_of(helper, "in encode")
    state = session.step("into")  # json.dumps is a library: stepped over, not into
    assert state["location"]["file"] == str(helper.resolve())
    assert state["location"]["line"] == line_of(helper, "in encode") + 1
    state = session.step("out")  # back in the caller, at its next line
    assert state["location"]["function"] == "run"
    assert state["location"]["line"] == line_of(script, "call encode") + 1
    state = session.step("over")  # returns from run() into the module, at its next line
    assert state["location"]["function"] == "<module>"
    assert state["location"]["line"] == line_of(script, "top call") + 1
    assert session.run_to_end()["exit_code"] == 0


def test_step_into_libraries_when_asked(session: Session, write, python: str) -> None:
    script = write(
        "main.py",
        """
        import json
        data = json.dumps([1])  # call dumps
        print(data)
    """,
    )
    session.start(
        script,
        python=python,
        breakpoints=[{"file": str(script), "line": line_of(script, "call dumps")}],
    )
    session.cont()
    state = session.step("into", into_libraries=True)
    assert state["location"]["file"].endswith(os.path.join("json", "__init__.py"))


def test_breakpoints_in_threads(session: Session, write, python: str) -> None:
    script = write(
        "threads.py",
        """
        import threading

        def work(n):
            value = n * 10  # in worker
            return value

        threads = [threading.Thread(target=work, args=(n,), name=f"worker-{n}") for n in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("joined")
    """,
    )
    line = line_of(script, "in worker")
    session.start(script, python=python)
    session.brk(script, line)
    names = set()
    state = session.cont()
    while state["state"] == "paused":
        assert state["location"]["line"] == line
        names.add(state["thread"]["name"])
        # Evaluation runs on the paused thread itself (MLX streams, CUDA contexts are per thread).
        current = session.value("__import__('threading').current_thread().name")
        assert current == repr(state["thread"]["name"])
        assert session.value("n * 10") == str(int(state["thread"]["name"][-1]) * 10)
        state = session.cont()
    assert names == {"worker-0", "worker-1"}
    assert state["exit_code"] == 0 and "joined" in session.output()


def test_pause_stops_a_busy_loop_and_breakpoint_set_while_running(
    session: Session, write, python: str
) -> None:
    script = write(
        "spin.py",
        """
        import time
        count = 0
        deadline = time.time() + 60
        print("spinning", flush=True)
        while time.time() < deadline:
            count += 1  # spin
        print("done")
    """,
    )
    session.start(script, python=python, stop_on_entry=False)
    session.wait_for_output("spinning")  # in the loop, however busy the machine is
    assert session.state()["state"] == "running"
    state = session.call("pause", wait=10)
    assert state["state"] == "paused" and state["reason"] == "pause"
    assert state["location"]["file"] == str(script.resolve())
    first = int(session.value("count"))
    assert first > 0
    session.cont(wait=0)
    # The loop frame is already running: a breakpoint set now must still stop it.
    session.brk(script, line_of(script, "# spin"))
    state = session.wait(10)
    assert state["reason"] == "breakpoint", state
    assert int(session.value("count")) > first
    session.eval("deadline = 0")  # side effects persist: the loop ends
    session.call("clear")
    final = session.cont()
    assert final["state"] == "exited" and final["exit_code"] == 0
    assert "done" in session.output()


def test_uncaught_exception_is_post_mortem(session: Session, write, python: str) -> None:
    script = write(
        "boom.py",
        """
        def inner(values):
            scale = 0
            return [v / scale for v in values]  # raises

        def outer():
            data = [1.0, 2.0]
            return inner(data)

        outer()
    """,
    )
    session.start(script, python=python, stop_on_entry=False)
    state = session.wait()
    assert state["reason"] == "exception"
    assert state["exception"]["type"] == "ZeroDivisionError"
    assert "division by zero" in state["exception"]["message"]
    assert "Traceback" in state["exception"]["traceback"]
    assert "mldbg" not in state["exception"]["traceback"]
    # The raising frame is selected (a comprehension on 3.11, inlined into inner on 3.12+).
    assert state["location"]["line"] == line_of(script, "raises")
    assert session.value("scale") == "0"
    frames = session.stack()["frames"]
    assert [f["function"] for f in frames][-3:] == ["inner", "outer", "<module>"]
    session.call("frame", index=len(frames) - 2)
    assert session.value("data") == "[1.0, 2.0]"
    final = session.cont()
    assert final["state"] == "exited" and final["exit_code"] == 1
    assert "ZeroDivisionError" in session.output()
    run = json.loads((Path(final["run_dir"]) / "run.json").read_text())
    assert run["exit_code"] == 1 and run["exception"]["type"] == "ZeroDivisionError"


def test_exception_in_a_thread_is_post_mortem(session: Session, write, python: str) -> None:
    script = write(
        "tboom.py",
        """
        import threading

        def work():
            secret = 42
            raise ValueError("bad worker")

        t = threading.Thread(target=work, name="w")
        t.start()
        t.join()
        print("main goes on")
    """,
    )
    session.start(script, python=python, stop_on_entry=False)
    state = session.wait()
    assert state["reason"] == "exception" and state["thread"]["name"] == "w"
    assert session.value("secret") == "42"
    final = session.cont()
    assert final["exit_code"] == 0
    assert "main goes on" in session.output() and "bad worker" in session.output()


def test_eval_multiline_imports_and_side_effects(session: Session, write, python: str) -> None:
    script = write(
        "ev.py",
        """
        def f():
            a = 1
            b = [1, 2, 3]  # stop here
            return a + len(b)

        print("result", f())
    """,
    )
    session.start(
        script,
        python=python,
        breakpoints=[{"file": str(script), "line": line_of(script, "stop here")}],
    )
    session.cont()
    result = session.eval("import math\nz = math.sqrt(16)\nz + a")
    assert result["result"] == "5.0" and result["type"] == "float"
    assert session.value("z") == "4.0"  # names defined by one evaluation persist in this pause
    assert session.eval("a")["result"] == "1"
    # nested scopes see the frame's variables: a helper def, a lambda, comprehensions
    helper = session.eval("def total(k):\n    return z * k + a\ntotal(2)")
    assert helper["result"] == "9.0"
    assert session.value("[a * x for x in range(3)]") == "[0, 1, 2]"
    assert session.value("sorted([1, 2, 3], key=lambda v: -v * a)") == "[3, 2, 1]"
    assert session.value("y = 5\ndef later():\n    return y + a\nlater()") == "6"
    assert session.value("total(1)") == "5.0"  # the helper lives on in this pause
    session.eval("global SHARED\nSHARED = 7")  # `global` still means the module's globals
    assert session.value("f.__globals__['SHARED']") == "7"
    session.eval("a = 10")
    assert session.eval("for i in range(2):\n    pass")["result"] == "None"
    error = session.eval("1/0", expect=400)
    assert "ZeroDivisionError" in error["error"]
    error = session.eval("def (", expect=400)
    assert "syntax error" in error["error"]
    error = session.eval("   ", expect=400)
    assert "empty" in error["error"]
    session.eval("import sys; sys.exit(3)", expect=400)  # cannot end the script from eval
    final = session.run_to_end()
    assert "result 13" in session.output()  # a = 10 reached the running frame
    assert final["exit_code"] == 0


def test_variables_and_frames(session: Session, write, python: str) -> None:
    script = write(
        "vars.py",
        """
        GLOBAL_CONST = 7

        def g(n):
            local_list = list(range(n))
            return local_list  # here

        g(3)
    """,
    )
    session.start(
        script, python=python, breakpoints=[{"file": str(script), "line": line_of(script, "here")}]
    )
    session.cont()
    data = session.call("vars")
    by_name = {v["name"]: v for v in data["variables"]}
    assert by_name["n"]["summary"] == "3" and by_name["local_list"]["type"] == "list"
    assert "GLOBAL_CONST" not in by_name
    data = session.call("vars", all=True)
    assert any(v["name"] == "GLOBAL_CONST" and v["scope"] == "global" for v in data["variables"])
    moved = session.call("up", count=1)
    assert moved["frame"]["function"] == "<module>"
    clamped = session.call("up")  # past the outermost: stays there
    assert clamped["selected"] == 1 and "outermost" in clamped["note"]
    error = session.call("frame", 400, index=2)
    assert "no frame 2" in error["error"] and error["code"] == "no_such_frame"
    assert session.call("frame", index=0)["frame"]["function"] == "g"


def test_segfault_and_os_exit_leave_the_daemon_running(
    session: Session, write, python: str, api
) -> None:
    crash = write(
        "crash.py",
        """
        import ctypes
        print("about to crash", flush=True)
        ctypes.string_at(0)
    """,
    )
    session.start(crash, python=python, stop_on_entry=False)
    state = session.wait()
    assert state["state"] == "crashed" and state["signal"] == "SIGSEGV"
    assert "about to crash" in state["output_tail"]
    run = json.loads((Path(state["run_dir"]) / "run.json").read_text())
    assert run["state"] == "crashed" and run["signal"] == "SIGSEGV"
    assert api.get("/v1/health")["ok"]
    error = session.eval("1", expect=409)
    assert error["code"] == "session_ended"

    quit_ = write("quit.py", "import os\nprint('bye', flush=True)\nos._exit(3)\n")
    state = session.start(quit_, python=python, stop_on_entry=False, replace=True)
    state = session.wait()
    assert state["state"] == "exited" and state["exit_code"] == 3


def test_killed_script_is_reported_as_crashed(session: Session, write, python: str) -> None:
    script = write("sleepy.py", "import time\nprint('sleeping', flush=True)\ntime.sleep(120)\n")
    state = session.start(script, python=python, stop_on_entry=False)
    session.wait_for_output("sleeping")  # a busy machine may not have run the print yet
    os.kill(state["pid"], signal.SIGKILL)
    state = session.wait(10)
    assert state["state"] == "crashed" and state["signal"] == "SIGKILL"
    assert state["terminated"] is False and "sleeping" in state["output_tail"]


def test_terminate_ends_a_paused_script(session: Session, write, python: str) -> None:
    script = write("paused.py", "x = 1\ny = 2\n")
    session.start(script, python=python)
    state = session.terminate()
    assert state["state"] == "exited" and state["terminated"] is True
    run = json.loads((Path(state["run_dir"]) / "run.json").read_text())
    assert run["terminated"] is True


def test_run_module_with_dash_m(session: Session, write, python: str) -> None:
    write("pkg/__init__.py", "")
    write(
        "pkg/tool.py",
        """
        import sys
        print("argv", sys.argv[1:], __name__)
    """,
    )
    state = session.call(
        "start", module="pkg.tool", args=["a"], cwd=str(session.cwd), python=python
    )
    assert state["reason"] == "entry" and state["location"]["file"].endswith("tool.py")
    assert session.run_to_end()["exit_code"] == 0
    assert "argv ['a'] __main__" in session.output()


def test_events_and_run_store(session: Session, write, python: str) -> None:
    script = write("loop.py", LOOP)
    state = session.start(
        script,
        python=python,
        breakpoints=[{"file": str(script), "line": line_of(script, "in double")}],
    )
    session.cont()
    session.eval("x + 100")
    session.step("over")
    final = session.run_to_end()
    run_dir = Path(final["run_dir"])
    assert run_dir.parent.name == "runs" and run_dir.name.startswith("loop-")
    assert run_dir.name.endswith(f"-{state['pid']}")
    assert (run_dir.parent.parent / "latest").resolve() == run_dir.resolve()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    for expected in ("started", "stopped", "continue", "eval", "step", "ended"):
        assert expected in kinds
    evaluation = next(e for e in events if e["event"] == "eval")
    assert evaluation["expression"] == "x + 100" and evaluation["result"] == "100"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["state"] == "exited" and run["exit_code"] == 0 and run["ended_at"]
    assert run["script"] == str(script) and run["pid"] == state["pid"]
    assert (run_dir / "output.log").read_text() == "total 20\n"


def test_missing_script_and_bad_python_are_refused(session: Session, python: str) -> None:
    error = session.start(session.cwd / "nope.py", python=python, expect=400)
    assert "no such script" in error["error"]
    error = session.start(session.cwd / "nope.py", python="/no/such/python", expect=400)
    assert "no such script" in error["error"] or "no executable" in error["error"]


def test_unknown_session_lists_live_ones(api, python: str) -> None:
    error = call(api.client, "status", "never-started", 404)
    assert error["code"] == "unknown_session" and isinstance(error["sessions"], list)


def test_python_version_matches_backend(session: Session, write, python: str) -> None:
    script = write("v.py", "import sys\nv = sys.version_info[:2]\nprint(v)\n")
    session.start(script, python=python)
    session.step("over")
    session.step("over")
    version = eval(session.value("v"))
    assert (version >= (3, 12)) == (session.state()["backend"] == "monitoring")
    assert sys.version_info >= (3, 10)


def test_agent_imports_only_the_standard_library(python: str) -> None:
    """The agent runs in the user's interpreter, which may have none of mldbg's dependencies."""
    import subprocess

    src = Path(__file__).resolve().parent.parent / "src"
    check = (
        "import sys, mldbg, mldbg.agent.runner, mldbg.agent.debugger, mldbg.summary, mldbg.store.runs\n"
        "import mldbg.agent.tracer_settrace\n"
        "heavy = {'torch', 'numpy', 'mlx', 'fastapi', 'httpx', 'rich', 'pydantic'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [python, "-c", check],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
