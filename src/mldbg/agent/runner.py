"""Run the user's script under the debugger exactly as ``python SCRIPT ARGS`` would.

``sys.argv``, ``sys.path[0]``, ``__main__`` and the environment are what plain Python
would give the script; the agent's own traces (its environment variables, its
``PYTHONPATH`` entry, its frames in tracebacks) are removed before the first line runs.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.machinery
import os
import sys
import threading
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType

from . import follow, orphan
from . import protocol as P
from .backends import choose_backend
from .commands import CommandServer
from .debugger import Debugger
from .paused import ExceptionInfo, exception_info, strip_agent_frames
from .stepping import StepRequest
from .wire import Wire

REPORTED_LIBRARIES = ("torch", "mlx", "numpy", "transformers", "diffusers", "mlx-lm", "safetensors")
PRIVATE_ENV = (
    "MLDBG_AGENT_ADDR",
    "MLDBG_AGENT_TOKEN",
    "MLDBG_AGENT_PATH",
    "MLDBG_AGENT_PYTHONPATH",
    "MLDBG_AGENT_RUN_DIR",
    follow.CHILD_ENV,
)
EXIT_USAGE = 2


@dataclass
class Target:
    code: CodeType
    argv0: str
    main_globals: dict[str, object]  # the script's module namespace
    path0: str | None


def library_versions() -> dict[str, str]:
    """Versions of the ML libraries this interpreter has, from metadata: nothing is imported."""
    from importlib import metadata

    versions = {}
    for name in REPORTED_LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _restore_environment(private: dict[str, str | None]) -> None:
    """Undo what the daemon added so the script (and its children) see the user's environment."""
    original = private.get("MLDBG_AGENT_PYTHONPATH")
    if original is None or original == "__MLDBG_UNSET__":
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = original
    shim = private.get("MLDBG_AGENT_PATH")
    if shim:
        sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != os.path.realpath(shim)]


def load_script(path: str, argv0: str) -> Target:
    filename = os.path.abspath(path)
    with open(filename, "rb") as fh:  # bytes: compile() honours the encoding cookie
        source = fh.read()
    code = compile(source, filename, "exec", dont_inherit=True)
    main_globals: dict[str, object] = {
        "__name__": "__main__",
        "__file__": filename,
        "__builtins__": builtins,
        "__loader__": importlib.machinery.SourceFileLoader("__main__", filename),
        "__spec__": None,
        "__package__": None,
        "__cached__": None,
        "__doc__": None,
    }
    return Target(code, argv0, main_globals, os.path.dirname(os.path.realpath(filename)))


def load_module(name: str) -> Target:
    import runpy

    # The same lookup `python -m` does, including a package's __main__ submodule.
    mod_name, spec, code = runpy._get_module_details(name)  # type: ignore[attr-defined]
    main_globals: dict[str, object] = {
        "__name__": "__main__",
        "__file__": spec.origin,
        "__builtins__": builtins,
        "__loader__": spec.loader,
        "__spec__": spec,
        "__package__": spec.parent,
        "__cached__": spec.cached,
        "__doc__": None,
    }
    return Target(code, spec.origin or mod_name, main_globals, os.getcwd())


def load_command(source: str) -> Target:
    """``python -c CODE``: how multiprocessing's spawn and forkserver children start."""
    code = compile(source, "<string>", "exec", dont_inherit=True)
    main_globals: dict[str, object] = {
        "__name__": "__main__",
        "__builtins__": builtins,
        "__loader__": importlib.machinery.BuiltinImporter,
        "__spec__": None,
        "__package__": None,
        "__doc__": None,
        "__annotations__": {},
    }
    return Target(code, "-c", main_globals, "")


def _install_main(target: Target, args: list[str]) -> None:
    main = types.ModuleType("__main__")
    main.__dict__.update(target.main_globals)
    target.main_globals = main.__dict__
    sys.modules["__main__"] = main
    sys.argv[:] = [target.argv0, *args]
    _restore_orig_argv()
    if not getattr(sys.flags, "safe_path", False) and target.path0 is not None:
        if sys.path:
            sys.path[0] = target.path0
        else:
            sys.path.insert(0, target.path0)


def _restore_orig_argv() -> None:
    """``sys.orig_argv`` as python would give it: without the ``-m mldbg.agent`` we added."""
    orig = getattr(sys, "orig_argv", None)
    if not orig:
        return
    for i in range(1, len(orig) - 1):
        if orig[i] == "-m" and orig[i + 1] == "mldbg.agent":
            sys.orig_argv = [*orig[:i], *orig[i + 2 :]]
            return
        if orig[i] == "-mmldbg.agent":
            sys.orig_argv = [*orig[:i], *orig[i + 1 :]]
            return


def _line_buffer_output() -> None:
    """The script's output goes to a file; flush it by line so `mldbg output` is current."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(line_buffering=True)


def _exit_code_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    private = {key: os.environ.pop(key, None) for key in PRIVATE_ENV}
    if not private["MLDBG_AGENT_ADDR"]:
        print(
            "mldbg.agent runs scripts for the mldbg daemon; start one with: mldbg start SCRIPT [ARGS...]",
            file=sys.stderr,
        )
        return EXIT_USAGE
    module = command = None
    script = ""
    if argv and argv[0] in ("-m", "-c"):
        if len(argv) < 2:
            print(f"mldbg.agent: {argv[0]} needs an argument", file=sys.stderr)
            return EXIT_USAGE
        if argv[0] == "-m":
            module, args = argv[1], argv[2:]
        else:
            command, args = argv[1], argv[2:]
    elif argv:
        script, args = argv[0], argv[1:]
    else:
        print("mldbg.agent: give a script or -m MODULE", file=sys.stderr)
        return EXIT_USAGE

    _restore_environment(private)
    token = str(private["MLDBG_AGENT_TOKEN"] or "")
    is_child = bool(private[follow.CHILD_ENV])
    address = str(private["MLDBG_AGENT_ADDR"])
    credentials = follow.Credentials(
        address,
        token,
        str(private["MLDBG_AGENT_PATH"] or ""),
        str(private["MLDBG_AGENT_RUN_DIR"] or ""),
    )
    # the link is set once it is open: a backend installs nothing until the script runs
    debugger = Debugger(None, os.getcwd(), choose_backend)  # type: ignore[arg-type]
    if is_child:
        rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")
        hello = follow.hello(child=True, forked=False, rank=rank, backend=debugger.backend.name)
        try:
            wire = follow.connect_child(address, token, hello)
        except OSError as exc:
            if not isinstance(exc, ConnectionRefusedError):  # refused: the run is over
                follow.report_detached(credentials, str(exc))
            # a child of a terminated run goes on as plain python would
            print(f"mldbg.agent: not debugging this child ({exc})", file=sys.stderr)
            return _run_undebugged(module, command, script, args)
    else:
        wire = Wire.connect(address, token)
        wire.send(follow.hello(backend=debugger.backend.name, libraries=library_versions()))
    debugger.wire = wire
    if module is None and script is not None:  # `break --function __main__.NAME`
        debugger.main_file = os.path.realpath(script)
    on_run = threading.Event()
    config: P.RunArgs = {}
    orphan.install(debugger, config, child=is_child)  # daemon gone: end, never run on alone
    reader = threading.Thread(
        target=CommandServer(debugger).serve,
        args=(on_run, config),
        name="mldbg-agent",
        daemon=True,
    )
    reader.start()
    on_run.wait()
    if debugger.detached and is_child:
        return _run_undebugged(module, command, script, args)
    if debugger.detached:
        print("mldbg.agent: the daemon went away before the script started", file=sys.stderr)
        return 70

    credentials.run_dir = str(config.get("run_dir") or credentials.run_dir)
    follow.install(debugger, credentials, bool(config.get("follow", True)))
    try:
        target = load_target(module, command, script)
    except SyntaxError:
        traceback.print_exc(limit=0)
        P.FINISHED.send(wire, {"exit_code": 1})
        return 1
    except (OSError, ImportError) as exc:
        message = f"{sys.executable}: " + (
            f"can't open file {script!r}: {exc}" if module is None else f"{exc}"
        )
        print(message, file=sys.stderr)
        P.FINISHED.send(wire, {"exit_code": EXIT_USAGE if module is None else 1})
        return EXIT_USAGE if module is None else 1

    if config.get("run_dir"):
        from ..store import checkpoint

        checkpoint.attach_debugger(str(config["run_dir"]), debugger.on_checkpoint)
    captures = None
    if os.environ.get("MLDBG_CAPTURE"):  # start --capture: loaded only when asked
        from .. import zero_edit

        try:
            captures = zero_edit.install_from_environment()
        except ValueError as exc:
            print(f"mldbg: cannot capture: {exc}", file=sys.stderr)
            P.FINISHED.send(wire, {"exit_code": EXIT_USAGE})
            return EXIT_USAGE
    lines = _install_lines(debugger, credentials.run_dir)  # mldbg line's re-run
    if isinstance(lines, int):
        return lines
    _install_main(target, args)
    if module is not None and target.main_globals.get("__file__"):
        debugger.main_file = os.path.realpath(str(target.main_globals["__file__"]))
        debugger.retry_pending()
    _line_buffer_output()
    # the script's own conditional breakpoints, compiled in where the backend can
    target.code = debugger.backend.prepare_main(target.code)
    if config.get("stop_on_entry", True):
        debugger.step = StepRequest("entry", threading.get_ident(), entry_code=target.code)
    _install_thread_hook(debugger)
    debugger.backend.install()
    return _run(debugger, target, [*([captures.finish] if captures else []), *lines])


def _install_lines(debugger: Debugger, run_dir: str) -> list[Callable[[], object]] | int:
    """``$MLDBG_LINES`` (``mldbg line``): the debugger records the scope it names into
    this run's directory; the function that closes it (none when not asked), or the
    exit code of settings that do not parse (said, as a capture's are).  Not passed on
    to the script's children: the scope is this process's."""
    if not os.environ.get("MLDBG_LINES"):
        return []
    from .. import line_scope
    from .line_record import LineRecorder

    try:
        spec = line_scope.spec_from_environment()
        os.environ.pop(line_scope.ENV, None)
        if spec is None or not run_dir:
            raise ValueError("no scope, or no run directory to record into")
        writer = line_scope.writer_for(spec, run_dir)
    except (ValueError, OSError) as exc:
        print(f"mldbg: cannot record lines: {exc}", file=sys.stderr)
        debugger.wire.send({"event": "finished", "exit_code": EXIT_USAGE})
        return EXIT_USAGE
    recorder = LineRecorder(writer, debugger.backend)
    debugger.recorder = recorder
    return [line_scope.install(spec, recorder, writer).finish]


def load_target(module: str | None, command: str | None, script: str) -> Target:
    """What ``python -m MODULE``, ``python -c COMMAND`` or ``python SCRIPT`` would run."""
    if module:
        return load_module(module)
    if command is not None:
        return load_command(command)
    return load_script(script, script)


def _run_undebugged(module: str | None, command: str | None, script: str, args: list[str]) -> int:
    """A child whose session ended: run its target as python would, without the agent."""
    target = load_target(module, command, script)
    _install_main(target, args)
    try:
        exec(target.code, target.main_globals)
    except SystemExit as exc:
        return _exit_code_of(exc)
    return 0


def _run(
    debugger: Debugger, target: Target, at_end: list[Callable[[], object]] | None = None
) -> int:
    """Run the script; ``at_end`` (closing captures, the line step's records) runs before
    the end is reported."""
    exception: ExceptionInfo | None = None
    try:
        exec(target.code, target.main_globals)
        exit_code = 0
    except SystemExit as exc:
        exit_code = _exit_code_of(exc)
    except BaseException as exc:
        debugger.post_mortem(exc)
        exception = exception_info(exc)
        sys.excepthook(type(exc), exc, strip_agent_frames(exc.__traceback__))
        exit_code = 1
    finally:
        for ending in at_end or []:
            try:
                ending()
            except Exception as exc:  # a capture that cannot close must not hide the end
                print(f"mldbg: closing the captures: {type(exc).__name__}: {exc}", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                stream.flush()
    P.FINISHED.send(debugger.wire, {"exit_code": exit_code, "exception": exception})
    return exit_code


def _install_thread_hook(debugger: Debugger) -> None:
    original = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
            debugger.post_mortem(args.exc_value)
        original(args)

    threading.excepthook = hook
