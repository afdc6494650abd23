"""Every process of a run is debuggable: forked workers, spawned pools, python
subprocesses and torchrun ranks stop as their own sessions, named after their parent.

Real processes throughout (PyTorch CPU, multiprocessing, torch.distributed with gloo);
each test also checks that no process of the run is left once it ended.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Api, Session, backend_params, call, line_of, wait_until
from mldbg.server.process_tree import alive, descendants

pytestmark = pytest.mark.timeout(180)


def listed(api: Api) -> list[dict[str, Any]]:
    return call(api.client, "sessions", None)["sessions"]  # type: ignore[no-any-return]


def paused_child(api: Api, prefix: str, timeout: float = 90.0) -> dict[str, Any]:
    """The first listed session named ``prefix...`` that is paused (polls: machines vary)."""

    def paused() -> dict[str, Any] | None:
        found = [s for s in listed(api) if s["session"].startswith(prefix)]
        return next((s for s in found if s["state"] == "paused"), None)

    return wait_until(paused, timeout, f"a paused session {prefix}*")  # type: ignore[no-any-return]


def run_tree(session: Session) -> list[int]:
    """The script's process and every descendant, now."""
    pid = session.state()["pid"]
    return [pid, *descendants(pid)]


def assert_gone(pids: list[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    assert not left, f"processes left running: {left}"


def finish(session: Session, timeout: float = 120.0) -> dict[str, Any]:
    """Continue past every stop until the script ends; its last state."""
    last = [session.wait(20)]

    def ended() -> dict[str, Any] | None:
        state = last[0]
        if state["state"] in ("exited", "crashed"):
            return state
        last[0] = session.cont(20) if state["state"] == "paused" else session.wait(20)
        return None

    return wait_until(ended, timeout, "the script to end")  # type: ignore[no-any-return]


def child_api(session: Session, name: str) -> Session:
    return Session(session.api, name, session.cwd)


DATALOADER = """
import sys
import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        value = index * index  # BREAK
        return torch.tensor([value])


if __name__ == "__main__":
    loader = DataLoader(Squares(), batch_size=1, num_workers=2, multiprocessing_context="fork")
    seen = sorted(int(batch.item()) for batch in loader)
    print("SEEN", seen, flush=True)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_worker_pauses_as_its_own_session(
    session: Session, write: Any, method: str
) -> None:
    script = write("loader.py", DATALOADER.replace('"fork"', repr(method)))
    line = line_of(script, "# BREAK")
    bp = {"file": str(script), "line": line, "condition": "index == 5"}
    state = session.start(script, breakpoints=[bp], stop_on_entry=False)
    assert state["state"] == "running", state

    child = paused_child(session.api, f"{session.name}.w")
    tree = run_tree(session)
    assert child["parent"] == session.name and session.state()["parent"] is None
    assert child["pid"] != state["pid"] and child["pid"] in tree
    assert child["location"]["line"] == line and child["reason"] == "breakpoint"
    worker = child_api(session, child["session"])
    assert worker.value("index") == "5"
    assert worker.value("index * 3") == "15"
    frames = worker.stack()["frames"]
    assert frames[0]["function"] == "__getitem__"
    assert "index" in {v["name"] for v in worker.call("vars")["variables"]}
    # the parent is not paused: it keeps its own state (it waits for the worker's data),
    # and its state says which of its children is
    parent = session.state()
    assert parent["state"] == "running" and parent["paused_children"] == [child["session"]]

    resumed = worker.cont(wait=0)
    assert resumed["state"] in ("running", "exited")
    end = finish(session)
    assert end["state"] == "exited" and end["exit_code"] == 0, end
    assert "SEEN [0, 1, 4, 9, 16, 25, 36, 49]" in session.output()
    assert_gone(tree)
    # the worker's session ended with its process
    wait_until(
        lambda: worker.state()["state"] in ("exited", "crashed"), 30, "the worker session to end"
    )


SPAWN_POOL = """
import multiprocessing as mp


def work(x):
    y = x + 100  # BREAK
    return y


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        print("RESULTS", pool.map(work, range(4)), flush=True)
"""


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
@pytest.mark.parametrize("python", backend_params())
def test_multiprocessing_pool_worker_is_followed(
    session: Session, write: Any, python: str, method: str
) -> None:
    script = write("pool.py", SPAWN_POOL.replace('"spawn"', repr(method)))
    line = line_of(script, "# BREAK")
    bp = {"file": str(script), "line": line, "condition": "x == 2"}
    session.start(script, python=python, breakpoints=[bp], stop_on_entry=False)

    child = paused_child(session.api, f"{session.name}.w")
    tree = run_tree(session)
    worker = child_api(session, child["session"])
    assert worker.value("x") == "2"
    # the script's environment is what python gives it: no agent variables, no shim
    assert (
        worker.value("[k for k in __import__('os').environ if k.startswith('MLDBG_AGENT')]") == "[]"
    )
    step = worker.step("over")
    assert step["state"] == "paused" and step["location"]["line"] == line + 1
    assert worker.value("y") == "102"
    worker.cont(wait=0)
    end = finish(session)
    assert end["exit_code"] == 0, end
    assert "RESULTS [100, 101, 102, 103]" in session.output()
    assert_gone(tree)


SUBPROCESS_PARENT = """
import os
import subprocess
import sys

print("PARENT", os.environ.get("PYTHONPATH"), flush=True)
done = subprocess.run([sys.executable, "-u", "child.py", "7"], check=False)
print("CHILD EXIT", done.returncode, flush=True)
"""

SUBPROCESS_CHILD = """
import os
import sys

number = int(sys.argv[1])
doubled = number * 2  # BREAK
print("CHILD", sys.argv, doubled, os.environ.get("PYTHONPATH"), flush=True)
sys.exit(3)
"""


@pytest.mark.parametrize("python", backend_params())
def test_subprocess_python_child_is_followed(session: Session, write: Any, python: str) -> None:
    parent = write("parent.py", SUBPROCESS_PARENT)
    child_script = write("child.py", SUBPROCESS_CHILD)
    line = line_of(child_script, "# BREAK")
    session.start(
        parent,
        python=python,
        breakpoints=[{"file": str(child_script), "line": line}],
        stop_on_entry=False,
    )

    child = paused_child(session.api, f"{session.name}.w")
    tree = run_tree(session)
    sub = child_api(session, child["session"])
    assert sub.value("number") == "7"
    assert sub.value("sys.argv") == "['child.py', '7']"
    assert sub.value("[p for p in sys.path if 'mldbg-agent' in p]") == "[]"
    assert sub.value("sys.orig_argv[1:]") == "['-u', 'child.py', '7']"
    sub.cont(wait=0)
    end = finish(session)
    assert end["exit_code"] == 0
    output = session.output()
    # the child's environment is the parent's: PYTHONPATH as the user set it (or unset)
    parent_path = output.split("PARENT ", 1)[1].split("\n", 1)[0]
    assert f"CHILD ['child.py', '7'] 14 {parent_path}" in output
    assert "CHILD EXIT 3" in output
    assert_gone(tree)


@pytest.mark.parametrize(
    ("source", "printed"),
    [
        (DATALOADER, "SEEN [0, 1, 4, 9, 16, 25, 36, 49]"),
        (SPAWN_POOL, "RESULTS [100, 101, 102, 103]"),
    ],
    ids=["fork", "spawn"],
)
def test_no_follow_leaves_children_alone(
    session: Session, write: Any, source: str, printed: str
) -> None:
    script = write("script.py", source)
    line = line_of(script, "# BREAK")
    bp = {"file": str(script), "line": line}
    session.start(script, breakpoints=[bp], stop_on_entry=False, no_follow=True)
    end = finish(session)
    assert end["exit_code"] == 0, end
    assert printed in session.output()
    assert not [s for s in listed(session.api) if s["session"].startswith(f"{session.name}.")]


HANGING_CHILDREN = """
import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.1)"])
grandchild = subprocess.Popen(
    [sys.executable, "-c", "import time\\nwhile True: time.sleep(0.1)"], start_new_session=True
)
print("STARTED", child.pid, grandchild.pid, flush=True)
while True:
    time.sleep(0.1)  # BREAK
"""


def test_terminate_of_the_parent_ends_every_child(
    session: Session, write: Any, tmp_path: Path
) -> None:
    script = write("hang.py", HANGING_CHILDREN)
    session.start(script, stop_on_entry=False)
    output = session.wait_for_output("STARTED")
    pids = [int(p) for p in output.split("STARTED", 1)[1].split()[:2]]
    # plus a paused forked-worker style child session: the DataLoader script in a second session
    tree = run_tree(session)
    assert set(pids) <= set(tree)
    end = session.terminate()
    assert end["state"] in ("exited", "crashed")
    assert_gone(tree + pids)


def test_terminate_of_the_parent_ends_paused_child_sessions(session: Session, write: Any) -> None:
    script = write("loader.py", DATALOADER)
    line = line_of(script, "# BREAK")
    session.start(
        script,
        breakpoints=[{"file": str(script), "line": line, "condition": "index == 1"}],
        stop_on_entry=False,
    )
    child = paused_child(session.api, f"{session.name}.w")
    tree = run_tree(session)
    session.terminate()
    assert_gone(tree)
    worker = child_api(session, child["session"])
    assert worker.state()["state"] in ("exited", "crashed")
    assert worker.eval("index", expect=409)["code"] == "session_ended"


TORCHRUN = """
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
tensor = torch.tensor([float(rank + 1)])
dist.all_reduce(tensor)
total = tensor.item()  # BREAK
print(f"RANK {rank} TOTAL {total}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("ending", ["continue", "terminate"])
def test_torchrun_ranks_are_sessions_named_by_rank(
    session: Session, write: Any, ending: str
) -> None:
    script = write("train.py", TORCHRUN)
    line = line_of(script, "# BREAK")
    bp = {"file": str(script), "line": line, "condition": "rank == 1"}
    env = {
        **os.environ,
        "MLDBG_HOME": str(session.cwd / ".mldbg"),
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
    }
    body = {
        "module": "torch.distributed.run",
        "args": ["--nproc_per_node=2", "--master_port=0", "--standalone", str(script)],
        "cwd": str(session.cwd),
        "breakpoints": [bp],
        "stop_on_entry": False,
        "env": env,
    }
    session.call("start", **body)
    child = paused_child(session.api, f"{session.name}.rank", timeout=150)
    assert child["session"] == f"{session.name}.rank1"
    tree = run_tree(session)
    rank1 = child_api(session, child["session"])
    assert rank1.value("rank") == "1"
    assert rank1.value("tensor.item()") == "3.0"  # the all_reduce ran in both ranks
    assert rank1.value("int(os.environ['RANK'])") == "1"
    if ending == "terminate":  # the ranks left the process group (setsid): still all ended
        session.terminate()
        assert_gone(tree)
        assert rank1.state()["state"] in ("exited", "crashed")
        return
    rank1.cont(wait=0)
    end = finish(session, timeout=150)
    assert end["exit_code"] == 0, session.output()
    output = session.output()
    assert "RANK 0 TOTAL 3.0" in output and "RANK 1 TOTAL 3.0" in output
    assert_gone(tree)


EXEC_FIRST = """
import os
import sys

print("FIRST", os.getpid(), flush=True)
os.execv(sys.executable, [sys.executable, "second.py", "again"])
"""

EXEC_SECOND = """
import os
import sys

where = sys.argv[1]  # BREAK
print("SECOND", os.getpid(), where, sorted(k for k in os.environ if k.startswith("MLDBG_AGENT")))
"""


@pytest.mark.parametrize("python", backend_params())
def test_exec_of_python_stays_the_same_session(session: Session, write: Any, python: str) -> None:
    first = write("first.py", EXEC_FIRST)
    second = write("second.py", EXEC_SECOND)
    line = line_of(second, "# BREAK")
    state = session.start(first, python=python)
    # a breakpoint set in the first program still applies after the exec
    session.brk(second, line)
    state = session.cont(20)
    deadline = time.monotonic() + 60
    while state["state"] == "running" and time.monotonic() < deadline:
        state = session.wait(20)
    assert state["state"] == "paused", state
    assert state["location"]["file"] == str(second) and state["location"]["line"] == line
    assert session.value("sys.argv") == "['second.py', 'again']"
    end = finish(session)
    assert end["exit_code"] == 0
    output = session.output()
    pid = output.split("FIRST ", 1)[1].split()[0]
    assert f"SECOND {pid} again []" in output


WAITING_CHILD = """
import os
import sys
import time

print("CHILD READY", flush=True)
while not os.path.exists("go"):
    time.sleep(0.05)


def compute(n):
    result = n * 10  # BREAK
    return result


total = compute(4)
if sys.argv[1] == "raise":
    raise ValueError(f"bad total {total}")
print("CHILD TOTAL", total, flush=True)
"""

WAITING_PARENT = """
import subprocess
import sys

code = subprocess.run([sys.executable, "child.py", sys.argv[1]]).returncode
print("PARENT SAW", code, flush=True)
"""


def test_breakpoints_set_later_reach_a_running_child(session: Session, write: Any) -> None:
    parent = write("parent.py", WAITING_PARENT)
    child_script = write("child.py", WAITING_CHILD)
    line = line_of(child_script, "# BREAK")
    session.start(parent, "ok", stop_on_entry=False)
    session.wait_for_output("CHILD READY")
    session.brk(child_script, line, condition="n == 4")  # set on the parent session
    (session.cwd / "go").write_text("")
    child = paused_child(session.api, f"{session.name}.w")
    assert child["location"]["line"] == line
    sub = child_api(session, child["session"])
    assert sub.value("n") == "4"
    assert sub.step("out")["state"] == "paused"
    assert sub.value("total") == "40"
    sub.cont(wait=0)
    end = finish(session)
    assert end["exit_code"] == 0 and "PARENT SAW 0" in session.output()


def test_uncaught_exception_in_a_child_pauses_it_and_terminate_ends_only_it(
    session: Session, write: Any
) -> None:
    parent = write("parent.py", WAITING_PARENT)
    write("child.py", WAITING_CHILD)
    (session.cwd / "go").write_text("")
    session.start(parent, "raise", stop_on_entry=False)
    child = paused_child(session.api, f"{session.name}.w")
    assert child["reason"] == "exception"
    assert "bad total 40" in str(child["exception"])
    sub = child_api(session, child["session"])
    assert sub.value("total") == "40"
    tree = [child["pid"], *descendants(child["pid"])]
    ended = sub.terminate()
    assert ended["state"] in ("exited", "crashed") and ended["terminated"] is True
    assert_gone(tree)
    # the parent goes on: it sees its child killed by SIGTERM
    end = finish(session)
    assert end["exit_code"] == 0 and "PARENT SAW -15" in session.output()


AGENT = ["-m", "mldbg.agent"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["py", "-u", "x.py", "a"], ["py", "-u", *AGENT, "x.py", "a"]),
        (["py", "-c", "code", "--mp-fork"], ["py", *AGENT, "-c", "code", "--mp-fork"]),
        (["py", "-uc", "code"], ["py", "-u", *AGENT, "-c", "code"]),
        (["py", "-Bccode", "a"], ["py", "-B", *AGENT, "-c", "code", "a"]),
        (
            ["py", "-W", "ignore", "-m", "pkg", "x"],
            ["py", "-W", "ignore", *AGENT, "-m", "pkg", "x"],
        ),
        (["py", "-Wignore", "s.py"], ["py", "-Wignore", *AGENT, "s.py"]),
        (
            ["py", "-X", "dev", "-mtorch.distributed.run"],
            ["py", "-X", "dev", *AGENT, "-m", "torch.distributed.run"],
        ),
        (["py", "--", "-odd.py", "a"], ["py", *AGENT, "-odd.py", "a"]),
        (
            ["py", "--check-hash-based-pycs", "never", "s.py"],
            ["py", "--check-hash-based-pycs", "never", *AGENT, "s.py"],
        ),
        (["py"], None),
        (["py", "-"], None),
        (["py", "-i", "x.py"], None),
        (["py", "-E", "x.py"], None),
        (["py", "-sI", "x.py"], None),
        (["py", "--version"], None),
        (["py", "-m", "mldbg.agent", "x.py"], None),
        (["py", "-c"], None),
    ],
)
def test_python_command_lines_are_rewritten_like_python_parses_them(
    argv: list[str], expected: list[str] | None
) -> None:
    from mldbg.agent.follow import rewrite_argv

    assert rewrite_argv(argv) == expected


def test_only_pythons_the_agent_runs_in_are_followed(tmp_path: Path) -> None:
    import sys

    from mldbg.agent.follow import is_python

    assert is_python(sys.executable)
    assert not is_python("/bin/sh")
    old = tmp_path / "python3.8"
    old.symlink_to(sys.executable)  # its real name is what counts, not the link's
    assert is_python(str(old))
    fake = tmp_path / "bin" / "python3.8"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    assert not is_python(str(fake))  # too old for the agent: left alone
    other = tmp_path / "bin" / "python"
    other.write_text("#!/bin/sh\n")
    assert not is_python(str(other))  # unversioned and not beside this interpreter


ORPHANING_PARENT = """
import subprocess
import sys

child = subprocess.Popen([sys.executable, "child.py", "ok"])
print("LEFT", child.pid, flush=True)
"""


def test_terminate_after_the_script_ended_ends_the_children_it_left(
    session: Session, write: Any
) -> None:
    parent = write("parent.py", ORPHANING_PARENT)
    child_script = write("child.py", WAITING_CHILD)
    (session.cwd / "go").write_text("")
    line = line_of(child_script, "# BREAK")
    session.start(
        parent, breakpoints=[{"file": str(child_script), "line": line}], stop_on_entry=False
    )
    child = paused_child(session.api, f"{session.name}.w")
    end = finish(session)  # the parent ran to its end; its child is paused on its own
    assert end["exit_code"] == 0
    sub = child_api(session, child["session"])
    assert sub.state()["state"] == "paused" and sub.value("n") == "4"
    session.terminate()
    assert_gone([child["pid"]])
    assert sub.state()["state"] in ("exited", "crashed")


LOOPING_CHILD = """
import time

counter = 0
print("CHILD LOOPING", flush=True)
while True:
    counter += 1  # BREAK
    time.sleep(0.01)
"""


def test_pause_and_output_on_a_child_session(session: Session, write: Any) -> None:
    parent = write("parent.py", WAITING_PARENT)
    child_script = write("child.py", LOOPING_CHILD)
    line = line_of(child_script, "# BREAK")
    bp = {"file": str(child_script), "line": line, "hits": "1"}
    session.start(parent, "x", breakpoints=[bp], stop_on_entry=False)
    child = paused_child(session.api, f"{session.name}.w")
    sub = child_api(session, child["session"])
    assert sub.cont(wait=0)["state"] == "running"
    paused = sub.call("pause", wait=20)
    assert paused["state"] == "paused" and paused["reason"] == "pause", paused
    assert int(sub.value("counter")) >= 1
    assert "CHILD LOOPING" in sub.output()  # the run's output, children's lines included
    tree = run_tree(session)
    session.terminate()
    assert_gone(tree)


def test_child_sessions_through_the_cli(cli: Any, write: Any) -> None:
    script = write("loader.py", DATALOADER)
    line = line_of(script, "# BREAK")
    started = cli(
        "start", "-s", "clikids", "--run", "--break", f"loader.py:{line}:index == 3", "loader.py"
    )
    assert "running" in started.stdout
    kids = wait_until(
        lambda: [
            s
            for s in cli("sessions", json_out=True)["sessions"]
            if s.get("parent") == "clikids" and s["state"] == "paused"
        ],
        90,
        "a paused child of clikids",
    )
    name = kids[0]["session"]
    assert name.startswith("clikids.w")
    table = cli("sessions").stdout
    assert name in table and "parent" in table
    assert "paused child processes" in cli("status", "-s", "clikids").stdout
    assert cli("eval", "-s", name, "index").stdout.strip() == "3"
    cli("continue", "-s", name)
    wait_until(
        lambda: cli("status", "-s", "clikids", json_out=True)["state"] != "running",
        90,
        "clikids to end",
    )
    assert "SEEN [0, 1, 4, 9, 16, 25, 36, 49]" in cli("output", "-s", "clikids").stdout
    cli("terminate", "-s", "clikids")


TOOL = """#!{python}
import sys

size = int(sys.argv[1])  # BREAK
print("TOOL", sys.argv, size, flush=True)
"""

TOOL_PARENT = """
import os
import subprocess

here = os.path.dirname(os.path.abspath(__file__))
env = dict(os.environ, PATH=here + os.pathsep + os.environ.get("PATH", ""))
subprocess.run(["tool", "5"], env=env, check=True)   # a console script, found on the PATH
subprocess.run(["sh", "-c", "echo SHELL $0", "ok"], check=True)  # not python: untouched
try:
    subprocess.run(["/nonexistent/python3.12", "x.py"])
except FileNotFoundError as exc:
    print("NOT FOUND", exc.filename, flush=True)  # the error python gives, once
print("PARENT DONE", flush=True)
"""


@pytest.mark.parametrize("python", backend_params())
def test_console_scripts_with_a_python_shebang_are_followed(
    session: Session, write: Any, python: str
) -> None:
    tool = write("tool", TOOL.format(python=python))
    tool.chmod(0o755)
    parent = write("parent.py", TOOL_PARENT)
    line = line_of(tool, "# BREAK")
    session.start(
        parent,
        python=python,
        breakpoints=[{"file": str(tool), "line": line}],
        stop_on_entry=False,
    )
    child = paused_child(session.api, f"{session.name}.w")
    sub = child_api(session, child["session"])
    assert sub.value("sys.argv") == f"[{str(tool)!r}, '5']"
    sub.cont(wait=0)
    end = finish(session)
    assert end["exit_code"] == 0
    output = session.output()
    assert f"TOOL [{str(tool)!r}, '5'] 5" in output and "SHELL ok" in output
    assert "NOT FOUND /nonexistent/python3.12" in output and "PARENT DONE" in output
