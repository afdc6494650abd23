"""The agent port: only the session's own processes get in, and nothing they or a
stranger send can take the daemon's memory or time.

Real sockets throughout: the listener in this process for the protocol's rules, and
the test daemon's own agent ports for strangers hitting a live session.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Session, call, wait_until
from mldbg.agent import protocol as P
from mldbg.agent.wire import LineReader, LinkError, preamble
from mldbg.server import agent_link
from mldbg.server.agent_link import AgentLink, AgentListener

pytestmark = pytest.mark.timeout(120)


class Collector:
    def __init__(self) -> None:
        self.links: list[AgentLink] = []
        self.arrived = threading.Event()

    def __call__(self, link: AgentLink) -> None:
        self.links.append(link)
        self.arrived.set()


def connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=30)


def closed_by_peer(sock: socket.socket, timeout: float = 30.0) -> bool:
    """True once the other end closed (EOF or reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


@pytest.fixture
def listener() -> Any:
    collector = Collector()
    listening = AgentListener(collector, "test")
    yield listening, collector
    listening.close()


def test_the_secret_and_a_hello_open_the_link(listener: Any) -> None:
    listening, collector = listener
    sock = connect(listening.address)
    sock.sendall(
        preamble(listening.token) + json.dumps({"event": "hello", "pid": 42}).encode() + b"\n"
    )
    assert collector.arrived.wait(30)
    link = collector.links[0]
    assert link.hello["pid"] == 42 and link.pid == 42
    events: list[dict[str, Any]] = []
    link.start(events.append, lambda: None)
    # an event its declaration refuses (protocol.LOG: no breakpoint, file, line) is dropped
    sock.sendall(b'{"event": "log", "message": "bad"}\n{"event": "nonesuch"}\n')
    good = {"event": "log", "message": "hi", "file": "x.py", "line": 3, "breakpoint": 1}
    sock.sendall(json.dumps(good).encode() + b"\n")
    deadline = time.monotonic() + 30
    while not events and time.monotonic() < deadline:
        time.sleep(0.02)
    assert events == [good]
    # the listener keeps accepting: a second process of the session gets in too
    collector.arrived.clear()
    other = connect(listening.address)
    other.sendall(preamble(listening.token) + b'{"event": "hello", "pid": 43}\n')
    assert collector.arrived.wait(30) and collector.links[1].pid == 43
    link.close()
    for s in (sock, other):
        s.close()


def test_a_silent_stranger_does_not_hold_up_the_debuggee(listener: Any) -> None:
    listening, collector = listener
    silent = connect(listening.address)  # first in line, and says nothing
    sock = connect(listening.address)
    sock.sendall(preamble(listening.token) + b'{"event": "hello", "pid": 7}\n')
    assert collector.arrived.wait(30) and collector.links[0].pid == 7
    assert listening.rejected == 0  # the silent one is still waiting for its deadline
    assert closed_by_peer(silent)
    assert listening.rejected == 1
    collector.links[0].close()
    silent.close()
    sock.close()


def test_an_oversized_message_from_the_debuggee_cuts_the_link_with_a_reason(
    listener: Any,
) -> None:
    listening, collector = listener
    sock = connect(listening.address)
    sock.sendall(preamble(listening.token) + b'{"event": "hello", "pid": 9}\n')
    assert collector.arrived.wait(30)
    link = collector.links[0]
    closed = threading.Event()
    link.start(lambda message: None, closed.set)
    pending = link.send(P.EVAL, {"expression": "x"})
    with pytest.raises(OSError):
        for _ in range(P.MAX_LINE // (1 << 20) + 64):
            sock.sendall(b"z" * (1 << 20))
    assert closed.wait(60)
    assert link.closed and link.error is not None
    assert f"more than {P.MAX_LINE} bytes" in link.error and "pid 9" in link.error
    with pytest.raises(Exception, match="ended before it answered"):
        pending.result(10)  # a request in flight fails at once, it does not hang
    sock.close()


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"", id="nothing"),
        pytest.param(b'{"event": "hello", "pid": 1}\n', id="hello-without-secret"),
        pytest.param(preamble("0" * 2 * P.TOKEN_BYTES), id="wrong-secret"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http"),
        pytest.param(bytes(range(256)) * 4, id="garbage"),
    ],
)
def test_strangers_are_dropped(
    listener: Any, payload: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_link, "HANDSHAKE_TIMEOUT", 1.0)
    listening, collector = listener
    sock = connect(listening.address)
    if payload:
        sock.sendall(payload)
    assert closed_by_peer(sock)
    sock.close()
    assert not collector.links
    assert listening.rejected == 1


def test_a_flood_is_cut_after_the_preamble(listener: Any) -> None:
    listening, collector = listener
    sock = connect(listening.address)
    sent = 0
    block = b"x" * (1 << 20)
    with pytest.raises(OSError):
        while sent < 1 << 30:  # a GB, if nobody stopped it
            sock.sendall(block)
            sent += len(block)
    assert sent < 64 << 20  # the daemon read 72 bytes, then closed: the sender fails soon
    assert not collector.links
    sock.close()


def test_an_oversized_hello_is_refused_even_with_the_secret(listener: Any) -> None:
    listening, collector = listener
    sock = connect(listening.address)
    sock.sendall(preamble(listening.token))
    hello = json.dumps({"event": "hello", "pid": 1, "pad": "x" * (P.MAX_HELLO + 10)})
    with pytest.raises(OSError):
        sock.sendall(hello.encode() + b"\n")
        sock.sendall(b"y" * (8 << 20))
    assert closed_by_peer(sock)
    assert not collector.links and listening.rejected == 1
    sock.close()


def test_line_reader_limits_size_and_time() -> None:
    a, b = socket.socketpair()
    try:
        reader = LineReader(a, limit=16, idle=None, partial=0.5)
        b.sendall(b"short\n" + b"y" * 40)
        assert reader.read_line() == b"short"
        with pytest.raises(LinkError, match="more than 16 bytes"):
            reader.read_line()
        reader = LineReader(a, limit=1024, idle=0.3, partial=0.3)
        with pytest.raises(LinkError, match="nothing arrived"):
            reader.read_line()  # silent
        b.sendall(b"half a mess")
        with pytest.raises(LinkError, match="nothing arrived"):
            reader.read_line()  # a message begun, never finished
        with pytest.raises(LinkError, match="fewer than 100 bytes"):
            reader.read_exact(100, 0.3)
        b.close()
        with pytest.raises(LinkError, match="inside a message"):
            reader.read_line()
    finally:
        a.close()


# -- against a live session of the test daemon ------------------------------------------------


def agent_ports(daemon_pid: int, http_port: int) -> list[int]:
    """The daemon's listening loopback ports other than its HTTP one: the agent ports."""
    import os

    inodes = set()
    for fd in os.listdir(f"/proc/{daemon_pid}/fd"):
        try:
            target = os.readlink(f"/proc/{daemon_pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    with open("/proc/net/tcp") as fh:
        for row in fh.readlines()[1:]:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # LISTEN
                port = int(local.split(":")[1], 16)
                if port != http_port:
                    ports.append(port)
    return ports


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for row in fh:
            if row.startswith("VmRSS:"):
                return int(row.split()[1])
    raise AssertionError("no VmRSS")


def test_strangers_on_a_live_sessions_port_change_nothing(
    session: Session, write: Any, daemon: dict[str, Any]
) -> None:
    script = write("victim.py", "secret = 41\nprint('ANSWER', secret + 1)\n")
    state = session.start(script)
    assert state["state"] == "paused"
    http_port = int(daemon["url"].rsplit(":", 1)[1].split("/")[0])
    ports = agent_ports(daemon["pid"], http_port)
    assert ports, "the session's agent port is not listening"
    before = rss_kb(daemon["pid"])
    silent = [socket.create_connection(("127.0.0.1", p)) for p in ports for _ in range(3)]
    for port in ports:
        flood = socket.create_connection(("127.0.0.1", port))
        with pytest.raises(OSError):
            for _ in range(256):  # up to 256 MB, if nobody stopped it
                flood.sendall(b"z" * (1 << 20))
        flood.close()
        liar = socket.create_connection(("127.0.0.1", port))
        liar.sendall(b"MLDBG1 " + b"f" * 64 + b"\n" + b'{"event": "hello", "pid": 1}\n')
        assert closed_by_peer(liar)
        liar.close()
    # the session answers at once, strangers and all, and its process is the same
    assert session.value("6 * 7") == "42" and session.state()["location"]["line"] == 1
    assert session.state()["pid"] == state["pid"]
    end = session.run_to_end()
    assert end["state"] == "exited" and "ANSWER 42" in session.output()
    for sock in silent:
        assert closed_by_peer(sock)  # dropped at the handshake deadline (or the session's end)
        sock.close()
    assert rss_kb(daemon["pid"]) - before < 64 * 1024  # the flood was never buffered
    listed = [s["session"] for s in call(session.client, "sessions", None)["sessions"]]
    assert not [n for n in listed if n.startswith(f"{session.name}.")]


FORKS = """
import os

def work(i):
    x = i * 2  # the child stops here
    return x

pid = os.fork()
if pid == 0:
    work(1)
    os._exit(0)
os.waitpid(pid, 0)
print("parent done", flush=True)
"""


def _children(session: Session) -> list[str]:
    listed = call(session.client, "sessions", None)["sessions"]
    return [s["session"] for s in listed if s["session"].startswith(f"{session.name}.w")]


def _forking(session: Session, write: Any, daemon: dict[str, Any]) -> list[int]:
    """The session paused at the start of a script that forks a child onto a breakpoint;
    the agent ports of the daemon."""
    from conftest import line_of

    script = write("forks.py", FORKS)
    line = line_of(script, "child stops here")
    state = session.start(script, breakpoints=[{"file": str(script), "line": line}])
    assert state["state"] == "paused"
    http_port = int(daemon["url"].rsplit(":", 1)[1].split("/")[0])
    ports = agent_ports(daemon["pid"], http_port)
    assert ports
    return ports


# Another local user's process: opens N silent connections, says so, and holds them until
# its stdin closes. The system's python, which that user can run (a venv under /root may not).
STRANGER = """
import socket, sys
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = [socket.create_connection((host, port), timeout=60) for _ in range(count)]
print("holding", len(held), flush=True)
sys.stdin.read()
"""
SYSTEM_PYTHON = next((p for p in ("/usr/bin/python3", "/bin/python3") if os.path.exists(p)), None)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another local user")
@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no system python for the other user to run")
def test_a_strangers_flood_does_not_starve_the_scripts_processes(
    listener: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another local user holding every handshake slot made forked workers fail to
    connect: they ran undebugged.  Slots are per local user: while the stranger's
    silent connections hold all of theirs, the session's own process is admitted at once."""
    import subprocess

    listening, collector = listener
    # the stranger's silent connections must all still hold their slots when the session's
    # process arrives, however slowly a loaded machine opens them
    monkeypatch.setattr(agent_link, "HANDSHAKE_TIMEOUT", 300.0)
    nobody = 65534
    host, _, port = listening.address.rpartition(":")
    stranger = subprocess.Popen(
        [str(SYSTEM_PYTHON), "-c", STRANGER, host, port, str(agent_link.MAX_HANDSHAKES)],
        user=nobody,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd="/",
    )
    try:
        assert stranger.stdout is not None
        assert stranger.stdout.readline().startswith(b"holding")
        # counted per user: a stray process reaching this port (a port number reused
        # from an earlier test's session) takes none of the stranger's slots
        wait_until(
            lambda: listening.proving_for(nobody) == agent_link.MAX_HANDSHAKES,
            60,
            "every one of the stranger's slots taken",
        )
        sock = connect(listening.address)
        sock.sendall(preamble(listening.token))
        sock.sendall(json.dumps({"event": "hello", "pid": 4242, "welcome": True}).encode() + b"\n")
        reader = LineReader(sock, 1024)
        welcome = reader.read_line(idle=10)
        assert welcome is not None and json.loads(welcome)["event"] == P.WELCOME
        assert collector.arrived.wait(10) and collector.links[0].pid == 4242
        sock.close()
    finally:
        stranger.kill()
        stranger.communicate(timeout=30)


def test_a_child_turned_away_tries_again(
    session: Session, write: Any, daemon: dict[str, Any]
) -> None:
    """Every handshake slot of this user held once (a burst): the child's first attempts
    are dropped, and it gets in when the slots free up instead of detaching."""
    ports = _forking(session, write, daemon)
    burst = [socket.create_connection(("127.0.0.1", p)) for p in ports for _ in range(80)]
    try:
        session.cont(wait=0)
        children = wait_until(lambda: _children(session), 60, "the forked child's session")
        assert len(children) == 1
    finally:
        for sock in burst:
            sock.close()
    session.terminate()


def test_a_child_that_never_gets_in_says_so(tmp_path: Any) -> None:
    """A child whose connections are never admitted (accepted, then dropped) tries
    ``CONNECT_ATTEMPTS`` times, then runs undebugged and writes why into the run
    directory, where the daemon finds it (next test)."""
    import subprocess
    import sys

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def turn_away() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                sock, _ = server.accept()
            except OSError:
                continue
            sock.close()

    threading.Thread(target=turn_away, daemon=True).start()
    child = (
        "from mldbg.agent import follow\n"
        f"credentials = follow.Credentials('127.0.0.1:{port}', 'f' * 64, '', {str(tmp_path)!r})\n"
        "try:\n"
        "    follow.connect_child(credentials.address, credentials.token, follow.hello())\n"
        "except OSError as exc:\n"
        "    follow.report_detached(credentials, str(exc))\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", child], capture_output=True, text=True, timeout=90
        )
    finally:
        stop.set()
        server.close()
    assert "runs undebugged" in done.stderr, done.stderr
    records = [json.loads(line) for line in (tmp_path / P.DETACHED_FILE).read_text().splitlines()]
    assert len(records) == 1 and records[0]["pid"] > 0
    assert "after 6 attempts" in records[0]["reason"]


def test_the_parent_says_when_a_child_runs_undebugged(session: Session, write: Any) -> None:
    """What a detached child wrote (previous test) is in its parent's state and in
    ``sessions``, as a count and the last few, and in the CLI's rendering."""
    from mldbg.text import render

    script = write("parent.py", "x = 1\n")
    state = session.start(script)
    record = {"pid": 4243, "ppid": state["pid"], "reason": "could not reach", "time": 1.0}
    with open(Path(state["run_dir"]) / P.DETACHED_FILE, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    detached = session.state()["detached_children"]
    assert detached == {"total": 1, "last": [record]}
    listed = {s["session"]: s for s in call(session.client, "sessions", None)["sessions"]}
    assert listed[session.name]["detached_children"]["total"] == 1
    assert "1 child process(es) run undebugged" in render.to_text("status", session.state())
    assert "children undebugged" in render.to_text("sessions", {"sessions": [listed[session.name]]})
    session.terminate()


def test_a_closed_listener_frees_its_port_and_thread() -> None:
    """``close()`` without ``shutdown()`` left the accept thread blocked for good and the
    port listening: one thread and one port leaked per session ever started."""
    listening = AgentListener(Collector(), "closing")
    host, _, port = listening.address.rpartition(":")
    assert listening.accept_thread.is_alive()
    probe = socket.create_connection((host, int(port)), timeout=5)  # the loop is in accept()
    assert closed_by_peer(probe)  # no secret: dropped, and the loop back in accept()
    probe.close()
    wait_until(lambda: listening.rejected == 1, 10, "the probe dropped")
    listening.close()
    listening.accept_thread.join(10)
    assert not listening.accept_thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5)
