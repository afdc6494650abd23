"""Follow the script's child processes, so every process of a run can be debugged.

Two kinds of children, two ways in:

* **Forked** children (DataLoader workers, ``multiprocessing`` fork pools, ``os.fork``)
  inherit the debugger, its breakpoints and the tracer already armed.  What they must
  not inherit is the parent's connection, locks a parent thread may have held, or the
  parent's paused state: ``os.register_at_fork`` resets those in the child.  The child
  connects to the daemon **lazily**, on its first stop (or logpoint): a worker that never
  stops costs one dictionary reset and no socket, which matters because a DataLoader
  forks its workers again every epoch.  The price: breakpoints set after the fork do not
  reach a forked child that has not stopped yet.
* **Exec'd** children (``multiprocessing`` spawn and forkserver, ``subprocess`` running
  python, ``os.exec*`` of python, torchrun ranks) start a fresh interpreter.  Their
  command line is rewritten from ``python [FLAGS] TARGET ARGS`` to
  ``python [FLAGS] -m mldbg.agent TARGET ARGS`` (at ``_posixsubprocess.fork_exec``, the
  one door ``subprocess`` and ``multiprocessing`` both use, and at ``os.execv``/
  ``os.execve``/``os.posix_spawn``), and the session's address and secret travel in the
  child's environment, where the child's agent removes them before the script runs,
  exactly as the daemon does for the first process.  Such a child connects **at once**:
  a new interpreter costs far more than one loopback connection, and it needs the
  parent's current breakpoints anyway.

The secret never sits in this process's ``os.environ`` (the script could read it);
it is kept here, in memory, and put only into the environment handed to a child.

Standard library only: the debuggee imports this.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import protocol as P
from .wire import Wire

if TYPE_CHECKING:
    from typing import Unpack

    from .debugger import Debugger

# A path as os.exec*, os.posix_spawn and subprocess take it.
_PathArg = str | bytes | os.PathLike[str] | os.PathLike[bytes]

UNSET = "__MLDBG_UNSET__"
CHILD_ENV = "MLDBG_AGENT_CHILD"
# Interpreter options that take a value (as the next argument or glued on: -Wignore).
_VALUE_OPTIONS = "WX"
# Options after which the agent cannot be imported from PYTHONPATH (-E, -I) or that make
# the child something other than a script run (-h, -V, -i): such children are not followed.
_UNFOLLOWABLE = "EIhV?i"
_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?[a-z]?(\.exe)?$")


@dataclass
class Credentials:
    """What a child needs to reach the daemon; held in memory only."""

    address: str
    token: str
    shim: str  # the directory holding only ``mldbg`` (for a child's PYTHONPATH)
    run_dir: str = ""  # where a child that cannot reach the daemon says so (P.DETACHED_FILE)


_credentials: Credentials | None = None
_debugger: Debugger | None = None
_installed = False


def install(debugger: Debugger, credentials: Credentials, follow: bool) -> None:
    """Reset forked children always; rewrite exec'd python children when ``follow``.

    Even with following off, a forked child must drop the parent's socket and
    breakpoints: otherwise it would stop on them and talk on the parent's connection.
    """
    global _credentials, _debugger, _installed
    _credentials, _debugger = credentials, debugger
    debugger.following = follow
    if _installed:
        return
    _installed = True
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _patch_run_path(debugger)
    if follow:
        _patch_exec()


# -- forked children --------------------------------------------------------------------------


def _after_fork_in_child() -> None:
    debugger = _debugger
    if debugger is None:
        return
    old = debugger.wire
    with contextlib.suppress(Exception):
        old.abandon()  # first of all: the parent's connection is never written to from here
    try:
        from . import breakpoints

        native = getattr(debugger.backend, "_native", None)  # the 3.10/3.11 backend's helper
        _reset_locks(debugger, debugger.breakpoints, debugger.backend, breakpoints, native)
        debugger._busy = set()
        debugger.paused = None
        debugger.pause_requested = False
        debugger.step = None
        if getattr(debugger, "following", False) and _credentials is not None:
            debugger.wire = ChildWire(debugger, _credentials)
            return
    except Exception as exc:  # never break the user's fork
        stream = sys.__stderr__
        if stream is not None:
            stream.write(f"mldbg: could not prepare a forked child for debugging: {exc!r}\n")
    with contextlib.suppress(Exception):
        debugger.detach()


def _reset_locks(*objects: object) -> None:
    """Fresh locks: a thread of the parent may have held one at the fork, forever in here."""
    kinds = ((type(threading.Lock()), threading.Lock), (type(threading.RLock()), threading.RLock))
    for obj in objects:
        if obj is None:
            continue
        for name, value in list(vars(obj).items()):
            if name.startswith("__"):
                continue
            for kind, make in kinds:
                if isinstance(value, kind):
                    setattr(obj, name, make())


class ChildWire(Wire):
    """The connection of a forked child, opened on its first message (lazily, see above)."""

    def __init__(self, debugger: Debugger, credentials: Credentials) -> None:  # noqa: D107
        self._debugger = debugger
        self._credentials = credentials
        self._wire: Wire | None = None
        self._connect_lock = threading.Lock()
        self._failed = False

    @property  # type: ignore[override]
    def closed(self) -> bool:
        if self._wire is None:
            return self._failed
        return self._wire.closed

    @closed.setter
    def closed(self, value: bool) -> None:
        if self._wire is not None:
            self._wire.closed = value

    def _open(self) -> Wire | None:
        with self._connect_lock:
            if self._wire is not None or self._failed:
                return self._wire
            message = hello(child=True, forked=True, backend=self._debugger.backend.name)
            try:
                wire = connect_child(self._credentials.address, self._credentials.token, message)
            except OSError as exc:
                self._failed = True
                if not isinstance(exc, ConnectionRefusedError):  # refused: the run is over
                    report_detached(self._credentials, str(exc))
                self._debugger.detach()
                return None
            self._wire = wire
        from .commands import CommandServer

        threading.Thread(
            target=CommandServer(self._debugger).serve,
            args=(threading.Event(), {}),
            name="mldbg-agent",
            daemon=True,
        ).start()
        return wire

    def send(self, message: Mapping[str, object]) -> None:
        wire = self._wire or self._open()
        if wire is not None:
            wire.send(message)

    def receive(self) -> dict[str, Any] | None:
        wire = self._wire
        return wire.receive() if wire is not None else None

    def close(self) -> None:
        if self._wire is not None:
            self._wire.close()

    def abandon(self) -> None:
        if self._wire is not None:
            self._wire.abandon()


CONNECT_ATTEMPTS = 6  # a child's tries to reach the daemon, backing off 0.2 s, 0.4 s, ... 3.2 s
WELCOME_TIMEOUT = 10.0  # the daemon admits a connection well within its 5 s handshake limit


def connect_child(address: str, token: str, message: P.Hello) -> Wire:
    """A child's connection to the daemon, admitted (the daemon's WELCOME), or OSError.

    A child must not drop out of debugging because one attempt failed: the daemon drops
    connections while its handshake queue is full (a burst of workers, or a stranger
    flooding the port), and a refused or reset connection can be momentary.  Each attempt
    says how many went before it (``attempts``), so the daemon can tell.
    """
    delay = 0.2
    last: Exception | None = None
    for attempt in range(CONNECT_ATTEMPTS):
        if attempt:
            time.sleep(delay)
            delay *= 2
        try:
            wire = Wire.connect(address, token, 10.0)
        except ConnectionRefusedError:
            raise  # nobody listens: the session is over, not busy
        except OSError as exc:
            last = exc
            continue
        wire.send({**message, "welcome": True, "attempts": attempt})
        if wire.await_welcome(WELCOME_TIMEOUT):
            return wire
        with contextlib.suppress(OSError):
            wire.close()
        last = OSError(f"the daemon did not admit the connection (attempt {attempt + 1})")
    raise OSError(f"could not reach the debugger after {CONNECT_ATTEMPTS} attempts: {last}")


def report_detached(credentials: Credentials | None, reason: str) -> None:
    """This child could not reach the daemon and runs on undebugged: never silently.

    It cannot tell the daemon over the link it could not open, so it appends a line to
    the run directory's ``detached.jsonl`` (the daemon shows the count and the last few
    in the parent's state and in ``sessions``), and says so on stderr, which is the
    script's output.
    """
    note = f"mldbg: process {os.getpid()} runs undebugged: {reason}\n"
    with contextlib.suppress(Exception):
        if sys.__stderr__ is not None:
            sys.__stderr__.write(note)
            sys.__stderr__.flush()
    if credentials is None or not credentials.run_dir:
        return
    record = {"pid": os.getpid(), "ppid": os.getppid(), "reason": reason[:500], "time": time.time()}
    with contextlib.suppress(OSError):
        fd = os.open(
            os.path.join(credentials.run_dir, P.DETACHED_FILE),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT,
            0o600,
        )
        try:
            os.write(fd, (json.dumps(record) + "\n").encode("utf-8", "backslashreplace"))
        finally:
            os.close(fd)


def hello(**extra: Unpack[P.Hello]) -> P.Hello:
    """The first message of every connection (the secret went before it)."""
    return {
        "event": "hello",
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        **extra,
    }


def _patch_run_path(debugger: Debugger) -> None:
    """``runpy.run_path`` compiles a file itself, past the import system: a backend that
    compiles breakpoints into code as modules load (3.10/3.11) gets it here instead.

    That is how a spawned ``multiprocessing`` child runs the parent's main script (as
    ``__mp_main__``), where the pool's worker functions live.
    """
    prepare = getattr(debugger.backend, "prepare_main", None)
    if prepare is None:
        return
    import runpy

    original = getattr(runpy, "_get_code_from_file", None)
    if original is None:
        return

    def get_code(*args: object, **kwargs: object) -> object:
        found = original(*args, **kwargs)
        # 3.10/3.11 return (code, fname); 3.12+ the code alone
        code = found[0] if isinstance(found, tuple) else found
        try:
            prepared = prepare(code)
        except Exception:  # never worse than undebugged
            return found
        return (prepared, *found[1:]) if isinstance(found, tuple) else prepared

    runpy._get_code_from_file = get_code  # type: ignore[attr-defined]


# -- exec'd children --------------------------------------------------------------------------


def is_python(program: str, path: str | None = None) -> bool:
    """A python the agent runs in: this interpreter, or any CPython 3.10 or newer.

    A child that runs some other python (a system 3.8, a python 2) is left alone: the
    agent could not even import there, and a debugger must never break the script.
    """
    named_python = bool(_PYTHON_NAME.match(os.path.basename(program)))
    if not named_python and os.path.realpath(program) != os.path.realpath(sys.executable):
        return False
    found = program
    if not os.path.dirname(program):
        found = shutil.which(program, path=path) or ""
    if not found:
        return False
    real = os.path.realpath(found)
    if real == os.path.realpath(sys.executable):
        return True
    version = re.search(r"python(\d+)\.(\d+)", os.path.basename(real))
    if version is not None:
        return (int(version.group(1)), int(version.group(2))) >= (3, 10)
    # an unversioned name: trusted only beside this interpreter (the same virtualenv)
    here = os.path.dirname(os.path.realpath(sys.executable))
    return os.path.dirname(real) in (here, os.path.dirname(sys.executable))


def rewrite_argv(argv: Sequence[str]) -> list[str] | None:
    """``python [FLAGS] TARGET ARGS`` -> ``python [FLAGS] -m mldbg.agent TARGET ARGS``.

    None when the command is not one we can follow: no target (a REPL, stdin), an
    option that hides PYTHONPATH (-E, -I) or asks for something else (-h, -V, -i), or
    the agent itself.
    """
    if len(argv) < 2:
        return None
    flags: list[str] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return _with_agent(argv[0], flags, list(argv[i + 1 : i + 2]), argv[i + 2 :])
        if arg == "-" or not arg.startswith("-"):
            if arg == "-":
                return None
            return _with_agent(argv[0], flags, [arg], argv[i + 1 :])
        if arg.startswith("--"):
            if arg == "--check-hash-based-pycs" and i + 1 < len(argv):
                flags += argv[i : i + 2]
                i += 2
                continue
            return None  # --help, --version, or something this version does not know
        cluster = arg[1:]
        for pos, letter in enumerate(cluster):
            if letter in _UNFOLLOWABLE:
                return None
            if letter in "cm":
                glued = cluster[pos + 1 :]
                if glued:
                    value, rest = glued, argv[i + 1 :]
                elif i + 1 < len(argv):
                    value, rest = argv[i + 1], argv[i + 2 :]
                else:
                    return None
                if pos:
                    flags.append("-" + cluster[:pos])
                if letter == "m" and (value == "mldbg.agent" or value.startswith("mldbg.")):
                    return None
                return _with_agent(argv[0], flags, ["-" + letter, value], rest)
            if letter in _VALUE_OPTIONS:
                if pos + 1 < len(cluster):
                    flags.append(arg)
                    i += 1
                elif i + 1 < len(argv):
                    flags += argv[i : i + 2]
                    i += 2
                else:
                    return None
                break
        else:
            flags.append(arg)
            i += 1
    return None


def _with_agent(
    program: str, flags: list[str], target: list[str], rest: Sequence[str]
) -> list[str] | None:
    if not target:
        return None
    return [program, *flags, "-m", "mldbg.agent", *target, *rest]


def child_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The child's environment plus what its agent needs (and removes again at once)."""
    credentials = _credentials
    assert credentials is not None
    child = dict(env)
    original = child.get("PYTHONPATH")
    child["PYTHONPATH"] = credentials.shim + (os.pathsep + original if original else "")
    child["MLDBG_AGENT_PYTHONPATH"] = original if original is not None else UNSET
    child["MLDBG_AGENT_PATH"] = credentials.shim
    child["MLDBG_AGENT_ADDR"] = credentials.address
    child["MLDBG_AGENT_TOKEN"] = credentials.token
    child["MLDBG_AGENT_RUN_DIR"] = credentials.run_dir
    child[CHILD_ENV] = "1"
    return child


def _followed(program: _PathArg | None, argv: Iterable[_PathArg]) -> tuple[str, list[str]] | None:
    """(the program to run, its rewritten argv) for a python child; None leaves it alone.

    A script with a python shebang (``torchrun``, ``accelerate`` and every other console
    script pip writes) is run the way the kernel would, by its interpreter, so it is
    followed too.
    """
    if _credentials is None or _debugger is None or getattr(_debugger, "detached", False):
        return None
    try:
        args = [os.fsdecode(os.fspath(a)) for a in argv]
        name = os.fsdecode(os.fspath(program)) if program is not None else (args[:1] or [""])[0]
    except (TypeError, ValueError):
        return None
    if not args:
        return None
    if not is_python(name):
        shebang = _python_shebang(name)
        if shebang is None:
            return None
        name, args = shebang[0], [*shebang, name, *args[1:]]
    new = rewrite_argv(args)
    return None if new is None else (name, new)


def _python_shebang(path: str) -> list[str] | None:
    """``[interpreter, *its options]`` when ``path`` is a script whose ``#!`` line names a
    python the agent runs in (``#!/usr/bin/env python3`` included); else None."""
    try:
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    try:
        words = first[2:].decode().split()
    except UnicodeDecodeError:
        return None
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")][:1] + [
            w for w in words[2:] if w.startswith("-")
        ]
        if words:
            words[0] = shutil.which(words[0]) or words[0]
    if not words or not is_python(words[0]):
        return None
    return words


def _env_from_list(env_list: Sequence[bytes] | None) -> dict[str, str]:
    if env_list is None:
        return dict(os.environ)
    env = {}
    for item in env_list:
        key, _, value = os.fsdecode(item).partition("=")
        env[key] = value
    return env


def _patch_exec() -> None:
    import _posixsubprocess  # type: ignore[import-not-found]

    fork_exec: Callable[..., int] = _posixsubprocess.fork_exec  # the child's pid

    def follow_fork_exec(
        args: Sequence[_PathArg] | None,
        executable_list: Sequence[bytes] | None,
        *rest: Any,  # the C function's own arguments, which vary by version
        **kw: object,
    ) -> int:
        # The positions of args (0), executable_list (1) and env (5) are the same in
        # every supported CPython (3.10 to 3.13).
        try:
            # the candidates of a PATH search, in order: the first that exists is what runs
            program = next((p for p in executable_list or () if os.path.exists(p)), None)
            found = _followed(program, args or []) if program is not None else None
            if found is not None and len(rest) >= 4:
                env = child_environment(_env_from_list(rest[3]))
                env_list = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]
                args, executable_list = found[1], [os.fsencode(found[0])]
                rest = (*rest[:3], env_list, *rest[4:])
        except Exception as exc:  # following must never break the script's own call
            _not_followed(exc)
        return fork_exec(args, executable_list, *rest, **kw)

    _posixsubprocess.fork_exec = follow_fork_exec

    execv, execve = os.execv, os.execve

    def follow_execv(path: Any, argv: Any) -> Any:
        try:
            found = _followed(path, argv)
            if found is not None:
                env = child_environment(os.environ)
        except Exception as exc:
            _not_followed(exc)
            found = None
        if found is None:
            return execv(path, argv)
        return execve(found[0], found[1], env)

    def follow_execve(path: Any, argv: Any, env: Any) -> Any:
        try:
            found = _followed(path, argv)
            if found is not None:
                child_env = child_environment(env)
        except Exception as exc:
            _not_followed(exc)
            found = None
        if found is None:
            return execve(path, argv, env)
        return execve(found[0], found[1], child_env)

    os.execv, os.execve = follow_execv, follow_execve  # type: ignore[assignment]

    for name in ("posix_spawn", "posix_spawnp"):
        original = getattr(os, name, None)
        if original is not None:
            setattr(os, name, _spawn_patch(original))


def _spawn_patch(original: Callable[..., int]) -> Callable[..., int]:
    def follow_spawn(
        path: _PathArg,
        argv: Sequence[_PathArg],
        env: Mapping[str, str] | None,
        *rest: object,
        **kw: object,
    ) -> int:
        try:
            found = _followed(_which(path) if _is_bare(path) else path, argv)
            if found is not None:  # env None (3.13's subprocess): this process's environment
                child_env = child_environment(os.environ if env is None else env)
        except Exception as exc:
            _not_followed(exc)
            found = None
        if found is None:
            return original(path, argv, env, *rest, **kw)
        return original(found[0], found[1], child_env, *rest, **kw)

    return follow_spawn


def _is_bare(path: _PathArg) -> bool:
    try:
        return not os.path.dirname(os.fsdecode(os.fspath(path)))
    except TypeError:
        return False


def _which(path: _PathArg) -> _PathArg:
    """posix_spawnp searches the PATH: so do we, to see what it would run."""
    return shutil.which(os.fsdecode(os.fspath(path))) or path


def _not_followed(exc: BaseException) -> None:
    stream = sys.__stderr__
    if stream is not None:
        with contextlib.suppress(Exception):
            stream.write(f"mldbg: not debugging a child process: {type(exc).__name__}: {exc}\n")
