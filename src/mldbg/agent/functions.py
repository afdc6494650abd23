"""Function breakpoints by dotted name: ``break --function pkg.mod.Class.method``.

A name is resolved to the first line of the function's body, where an ordinary line
breakpoint then stops on every call:

* the module part is found without importing anything (importing from the agent's
  thread could run a package's ``__init__`` there, or deadlock with the script's own
  imports): ``sys.modules`` if it is loaded, else the files on the script's ``sys.path``
  (``pkg/mod.py``, ``pkg/mod/__init__.py``); ``__main__`` is the script itself;
* the rest is looked up in that file's source (classes, methods, nested classes and
  functions, also under ``if``/``try`` at module level);
* a name the source does not define (a re-export, a class made at run time) is looked up
  in the loaded module's namespace, without calling any ``__getattr__``.

A module that cannot be found yet, or one whose source does not define the name (a
package re-exporting it), leaves the breakpoint *pending*: it is set as soon as that module
has been loaded (:class:`ImportWatcher`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import BAD_ARGUMENT, NO_SUCH_FUNCTION, NOT_A_SOURCE_FILE
from .breakpoints import BreakpointError, executable_lines
from .locate import search_roots
from .paths import canonical

if TYPE_CHECKING:
    pass


# A function's definition in the source: its body's first line is where it stops.
Definition = ast.FunctionDef | ast.AsyncFunctionDef


def check_name(name: str) -> list[str]:
    parts = name.strip().split(".")
    if not name.strip() or not all(p.isidentifier() for p in parts):
        raise BreakpointError(
            f"{name!r} is not a dotted name (e.g. pkg.module.Class.method or __main__.parse)",
            code=BAD_ARGUMENT,
        )
    if len(parts) < 2:
        raise BreakpointError(
            f"{name!r} names no module: write MODULE.FUNCTION (__main__.{name} for the script)",
            code=BAD_ARGUMENT,
        )
    return parts


def resolve(name: str, cwd: str | None, main_file: str | None) -> tuple[str, int] | None:
    """(file, line) of the function's first body line; ``None`` while its module is missing."""
    parts = check_name(name)
    if parts[0] == "__main__":
        if not main_file:
            return None
        return _in_file(name, main_file, parts[1:], None, final=True)
    for k in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:k])
        module = sys.modules.get(module_name)
        file = _module_file(module_name, module, cwd)
        if file is None:
            continue
        # Not loaded yet, and its source does not define the name (a package re-exporting
        # it, torch.nn.Linear): pending until the module is loaded and can be asked.
        return _in_file(name, file, parts[k:], module, final=module is not None)
    return None


def _module_file(name: str, module: ModuleType | None, cwd: str | None) -> str | None:
    if module is not None:
        file = getattr(module, "__file__", None)
        return canonical(file) if isinstance(file, str) and file.endswith(".py") else None
    relative = name.replace(".", os.sep)
    for root in search_roots(cwd):
        for candidate in (relative + ".py", os.path.join(relative, "__init__.py")):
            path = os.path.join(root, candidate)
            if os.path.isfile(path):
                return canonical(path)
    return None


def _in_file(
    name: str, file: str, rest: list[str], module: ModuleType | None, final: bool
) -> tuple[str, int] | None:
    try:
        with open(file, "rb") as fh:
            tree = ast.parse(fh.read(), file)
    except (OSError, SyntaxError, ValueError) as exc:
        raise BreakpointError(
            f"cannot read {file} to find {name}: {exc}", code=NOT_A_SOURCE_FILE, file=file
        ) from None
    node = _find(tree.body, rest)
    if node is None:
        if module is not None:
            found = _from_namespace(module, rest)
            if found is not None:
                return found
        if not final:
            return None
        raise BreakpointError(
            f"{name}: {file} defines no {'.'.join(rest)}",
            code=NO_SUCH_FUNCTION,
            file=file,
            defined=_names(tree.body)[:30],
        )
    if isinstance(node, ast.ClassDef):
        methods = [
            n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        raise BreakpointError(
            f"{name} is a class: name one of its methods ({', '.join(methods[:10]) or 'none'})",
            code=NO_SUCH_FUNCTION,
            file=file,
            methods=methods[:30],
        )
    return file, _first_body_line(file, node)


def _find(body: list[ast.stmt], names: list[str]) -> Definition | ast.ClassDef | None:
    found: Definition | ast.ClassDef | None = None
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == names[0]:
                found = node if len(names) == 1 else _find(node.body, names[1:]) or found
        elif isinstance(node, (ast.If, ast.Try, ast.With)):  # conditional definitions
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            for block in blocks:
                inner = _find(block, names)
                if inner is not None:
                    found = inner  # the last definition is the one that runs
    return found


def _names(body: list[ast.stmt]) -> list[str]:
    return [
        n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]


def _first_body_line(file: str, node: Definition) -> int:
    body = node.body
    first = body[0]
    if (
        len(body) > 1
        and isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        first = body[1]  # the docstring runs no code
    lines = executable_lines(file)
    for line in lines:
        if line >= first.lineno:
            return int(line)
    return int(node.lineno)


def _from_namespace(module: ModuleType, rest: list[str]) -> tuple[str, int] | None:
    """Walk attributes through ``__dict__``s only (no lazy-import ``__getattr__`` runs)."""
    obj: object = module
    for attr in rest:
        obj = _static_attr(obj, attr)
        if obj is None:
            return None
    code = _code_of(obj)
    if code is None or code.co_filename.startswith("<"):
        return None
    file = canonical(code.co_filename)
    node = _def_starting_at(file, code.co_firstlineno)
    if node is not None:
        return file, _first_body_line(file, node)
    starts = sorted({line for _, _, line in code.co_lines() if line and line > code.co_firstlineno})
    return file, starts[0] if starts else code.co_firstlineno


def _def_starting_at(file: str, first_line: int) -> Definition | None:
    """The ``def`` whose code starts at ``first_line`` (its first decorator's line, if any)."""
    try:
        with open(file, "rb") as fh:
            tree = ast.parse(fh.read(), file)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decorators = [d.lineno for d in node.decorator_list]
            if first_line in (node.lineno, min(decorators, default=node.lineno)):
                return node
    return None


def _static_attr(obj: object, attr: str) -> object:
    if isinstance(obj, ModuleType):
        return vars(obj).get(attr)
    if isinstance(obj, type):
        for klass in obj.__mro__:
            if attr in vars(klass):
                return vars(klass)[attr]
    return None


def _code_of(obj: Any) -> CodeType | None:
    for _ in range(10):
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif isinstance(obj, property):
            obj = obj.fget
        elif isinstance(obj, functools.partial):
            obj = obj.func
        elif hasattr(obj, "__wrapped__"):
            obj = obj.__wrapped__
        else:
            break
    code = getattr(obj, "__code__", None)
    if isinstance(code, CodeType):
        return code
    try:
        unwrapped = inspect.unwrap(obj)
    except ValueError:
        return None
    code = getattr(unwrapped, "__code__", None)
    return code if isinstance(code, CodeType) else None


class ImportWatcher:
    """A ``sys.meta_path`` entry that retries pending breakpoints when modules load.

    Python has no "after import" hook.  For a module a pending name lives in (or a package
    above it), the watcher asks the other finders for its spec and wraps that one loader's
    ``exec_module`` (an attribute of the loader instance, removed again after it ran), so
    the breakpoint is set the moment the module has run, before anything can call the
    function.  Any other lookup also retries (cheap with few pending names).  It finds
    nothing itself and never breaks an import: its own errors are swallowed.
    """

    def __init__(
        self, retry: Callable[[], object], pending_names: Callable[[], Iterable[str]]
    ) -> None:
        self._retry = retry
        self._pending_names = pending_names
        self._busy = threading.local()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if getattr(self._busy, "value", False):
            return None
        self._busy.value = True
        try:
            self._safe_retry()
            # the module itself too: an extension module (mlx.core) may be the last import
            if not any(
                n == fullname or n.startswith(fullname + ".") for n in self._pending_names()
            ):
                return None
            spec = self._spec_from_others(fullname, path, target)
            if spec is not None:
                self._wrap(spec.loader)
            return spec
        except Exception:  # never break the script's imports
            return None
        finally:
            self._busy.value = False

    def _safe_retry(self) -> None:
        with contextlib.suppress(Exception):  # never break the script's imports
            self._retry()

    def _spec_from_others(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> ModuleSpec | None:
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def _wrap(self, loader: Any) -> None:
        original = getattr(loader, "exec_module", None)
        if original is None or "exec_module" in getattr(loader, "__dict__", {}):
            return
        watcher = self

        def exec_module(module: ModuleType) -> None:
            try:
                original(module)
            finally:
                with contextlib.suppress(AttributeError):
                    del loader.exec_module
                watcher._safe_retry()

        with contextlib.suppress(AttributeError, TypeError):
            loader.exec_module = exec_module

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
