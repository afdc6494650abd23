"""Running user code in a paused frame, the way a REPL would.

Multi-line input is accepted; the value of a trailing expression is the result; and
assignments persist in the frame, so ``x = x * 2`` changes what the script sees after
it resumes.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import sys
import traceback
from types import CodeType, FrameType

from .. import budget
from ..errors import EvalError
from .compiling import compile_text, parse
from .interrupt import EvalInterrupt


def _safe_str(value: object) -> str:
    try:
        return str(value)
    except Exception as exc:
        return f"<str failed: {type(exc).__name__}>"


_WRITE_THROUGH = sys.version_info >= (3, 13)  # PEP 667: frame.f_locals is a live proxy


def declares_global(source: str) -> bool:
    """Does the code say ``global NAME``?  Then it means the frame's real globals, and it
    runs against them directly (no overlay of the locals, see ``FrameNamespace.run``)."""
    try:
        tree = parse(source, "<mldbg-eval>", "exec")
        return any(isinstance(node, ast.Global) for node in ast.walk(tree))
    except (SyntaxError, ValueError):
        return False


def compile_input(source: str) -> tuple[list[CodeType] | None, CodeType | None]:
    """Split input into statements to run and a trailing expression to evaluate."""
    if not source.strip():
        raise EvalError("nothing to evaluate: the expression is empty", {"type": "ValueError"})
    try:
        tree = parse(source, "<mldbg-eval>", "exec")
    except ValueError as exc:  # NUL bytes
        raise EvalError(f"cannot compile: {exc}", {"type": "ValueError"}) from None
    except SyntaxError as exc:
        raise _syntax_error(exc) from None
    last = tree.body[-1] if tree.body else None
    body, tail = tree.body, None
    if isinstance(last, ast.Expr):
        body, tail = tree.body[:-1], ast.Expression(last.value)
    try:  # some errors only compile() finds (`*a` alone, `return` outside a function)
        # one code object per statement: the namespace nested scopes read is refreshed
        # between them (see FrameNamespace.run)
        # (together, when a `global` statement must reach the statements after it)
        together = any(isinstance(node, ast.Global) for node in ast.walk(tree))
        groups = [body] if together else [[node] for node in body]
        statements = (
            [
                compile_text(ast.Module(body=group, type_ignores=[]), "<mldbg-eval>", "exec")
                for group in groups
            ]
            if body
            else None
        )
        expression = compile_text(tail, "<mldbg-eval>", "eval") if tail is not None else None
    except SyntaxError as exc:
        raise _syntax_error(exc) from None
    return statements, expression


def _syntax_error(exc: SyntaxError) -> EvalError:
    where = f" (line {exc.lineno}, column {exc.offset})" if exc.lineno is not None else ""
    return EvalError(
        budget.capped(f"syntax error: {exc.msg}{where}", budget.MESSAGE),
        {
            "type": "SyntaxError",
            "line": exc.lineno,
            "offset": exc.offset,
            "text": None if exc.text is None else budget.capped(exc.text, budget.MESSAGE),
        },
    )


class FrameNamespace:
    """The namespace evaluations use for one frame during one pause.

    Before 3.13 ``frame.f_locals`` is a snapshot; writes are pushed back into the frame
    with ``PyFrame_LocalsToFast``, and the same dict is reused for the whole pause so
    names defined by one evaluation are visible to the next.
    """

    def __init__(self, frame: FrameType, live: bool) -> None:
        self.frame = frame
        self.live = live  # False for post-mortem frames: they no longer run, nothing to write back
        self.locals = frame.f_locals

    def run(self, source: str) -> object:
        statements, expression = compile_input(source)
        frame = self.frame
        if not _WRITE_THROUGH:
            # Re-read: syncs the dict from the frame and re-arms PyFrame_LocalsToFast,
            # which writes back only once per read.
            self.locals = frame.f_locals
        # What nested scopes see.  Code run with separate globals and locals (like a class
        # body) gives a `def`, a lambda or a comprehension only the globals: a helper defined
        # in eval raised NameError on the frame's variables.  So the globals handed to the
        # code are the frame's globals overlaid with its locals (what pydevd does), refreshed
        # before each statement; top-level statements still read and write the frame's
        # locals themselves.
        # one namespace (a module's frame), or code that writes globals on purpose: no overlay
        module_level = self.locals is frame.f_globals or declares_global(source)
        scope = frame.f_globals if module_level else dict(frame.f_globals)
        try:
            for code in statements or ():
                if not module_level:
                    scope.update(self.locals)
                exec(code, scope, self.locals)
            if expression is not None and not module_level:
                scope.update(self.locals)
            result = eval(expression, scope, self.locals) if expression else None
        except EvalInterrupt as exc:
            raise EvalError(
                f"the evaluation {exc.reason} and was interrupted; the session is still paused "
                "where it was",
                {"type": type(exc).__name__},
                exc.code,
            ) from None
        except BaseException as exc:  # the user's code: even sys.exit() must not end the script
            tb = exc.__traceback__.tb_next if exc.__traceback__ else None
            lines = traceback.format_exception(type(exc), exc, tb)
            text = "".join(budget.capped(line, budget.TRACEBACK) for line in lines)
            raise EvalError(
                budget.capped(f"{type(exc).__name__}: {_safe_str(exc)}", budget.MESSAGE),
                {
                    "type": type(exc).__name__,
                    "traceback": budget.capped(text, budget.TRACEBACK, "tail"),
                },
            ) from None
        finally:
            self._write_back()
        return result

    def _write_back(self) -> None:
        if _WRITE_THROUGH or not self.live or self.locals is self.frame.f_globals:
            return
        with contextlib.suppress(AttributeError, OSError):
            ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(self.frame), ctypes.c_int(0))
