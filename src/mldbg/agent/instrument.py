"""Instrumented copies of a file's code objects: a hook call on each breakpoint line.

This is how the 3.10/3.11 backend gets breakpoints without a trace function: the code
objects that hold breakpoints are recompiled from their source with one extra statement,
``__mldbg_bp__(LINE)``, in front of the statement the breakpoint is on (the way coverage
tools and pytest's assertion rewriting change what Python runs).  Everything else about
the code stays as the compiler makes it from that source:

* the hook statement carries the breakpoint statement's own line and column, and every
  original statement keeps its position, so line numbers, tracebacks (3.11's carets
  included), ``inspect.getsource`` and ``co_firstlineno``/``co_name``/``co_filename`` are
  unchanged;
* the plain compilation of the same source is checked against the code the process is
  actually running (code objects compare by value), so a file edited since it was
  imported is never instrumented from the wrong text.

A statement whose breakpoint line is not simply "before this statement runs" (a loop
header, which fires on every iteration; a ``with`` line, which fires again on exit; a
line inside a multi-line statement; a decorator) gets an *arming* hook instead,
``__mldbg_bp__(LINE, True)``: it turns on line tracing for that one frame, which then
sees those lines exactly as ``sys.settrace`` would.  A breakpoint line that neither kind
of hook can serve is reported in :attr:`Instrumented.uncovered`, and the backend traces
that file the old way instead of missing it.

A breakpoint with a condition on a "before this statement" line gets the condition
itself compiled in, in the function's own scope, instead of a bare hook:

    try:
        if CONDITION: __mldbg_bp__(LINE, 2)   # passed: the debugger counts the hit
    except Exception:
        __mldbg_bp__(LINE, 3)                 # raised: the debugger reports it (sys.exc_info)

so an always-false condition on a hot line costs what evaluating the expression costs,
with no Python call into the debugger.  The names of the condition must resolve as
``eval(condition, f_globals, f_locals)`` would: a condition that would give the code
object a new local, cell or free variable (a walrus, a name bound by an enclosing
function and not used by this one, ``super()``), or nested code (a lambda or a
comprehension), is not compiled in; its line gets the bare hook and the debugger
evaluates it as before.
"""

from __future__ import annotations

import ast
import copy
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import CodeType

from ..errors import InstrumentError
from .compiling import compile_text, depth, parse

HOOK = "__mldbg_bp__"
# Second argument of the hook: what the compiled code already decided about the line.
ARM = 1  # turn on line tracing for this frame (a loop header, a `with` line...)
PASSED = 2  # the breakpoint's condition was compiled in and is true
RAISED = 3  # the compiled-in condition raised: the exception is sys.exc_info()'s
# A condition holding these would create code objects or bindings of its own.
_NOT_INLINE = (
    ast.Lambda,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
    ast.NamedExpr,
    ast.Yield,
    ast.YieldFrom,
    ast.Await,
)

# Statements whose first line fires more than one line event per execution, or whose
# first line event comes after code on other lines ran (decorators): they need arming.
# The deepest condition compiled into the code (see parse_condition); deeper ones are
# evaluated by the debugger.  Real conditions nest a few levels.
INLINE_DEPTH = 100
_REPEATING = (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# Code objects compiled from an expression inside another scope's statement.
INLINE_NAMES = frozenset({"<lambda>", "<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})
_BODY_FIELDS = ("body", "orelse", "finalbody")
# Code made on one line but possibly run later from another (a lambda stored and called, a
# generator expression consumed elsewhere): settrace stops inside them there, and no hook
# in the line that made them can, so their lines are left to tracing.
_DEFERRED = frozenset({"<lambda>", "<genexpr>"})

ScopeKey = tuple[str, int]  # (co_name, co_firstlineno); the module is ("<module>", 0)
MODULE_KEY: ScopeKey = ("<module>", 0)
# A frame of these suspends at every yield/await, and the arming hook's trace would end
# there: their lines must be hooked directly.  CO_GENERATOR | CO_COROUTINE |
# CO_ASYNC_GENERATOR, spelled out so the agent does not import inspect at start-up.
_SUSPENDING = 0x20 | 0x80 | 0x200


@dataclass
class Instrumented:
    """One file's instrumented code tree, paired with the plain compilation of the same text."""

    file: str
    lines: frozenset[int]
    plain: CodeType
    module: CodeType
    # plain code (looked up by value, so a running code object finds its entry) ->
    # instrumented code, for every code object whose tree holds a hook
    changed: dict[CodeType, CodeType] = field(default_factory=dict)
    # id(instrumented code) -> (instrumented code, plain code), for the whole tree
    origin: dict[int, tuple[CodeType, CodeType]] = field(default_factory=dict)
    # (code name, line): breakpoints in code no hook can serve
    uncovered: list[tuple[str, int]] = field(default_factory=list)
    # line -> condition, for the conditional breakpoints asked for (compiled in or not)
    conditions: dict[int, str] = field(default_factory=dict)
    # id(instrumented code) -> lines whose condition is compiled into that code object
    inline: dict[int, frozenset[int]] = field(default_factory=dict)

    @property
    def inlined(self) -> frozenset[int]:
        """Every line whose condition is compiled in."""
        return frozenset().union(*self.inline.values()) if self.inline else frozenset()


def _first_line(stmt: ast.stmt) -> int:
    decorators = getattr(stmt, "decorator_list", None) or []
    return min([stmt.lineno, *(d.lineno for d in decorators)])


def _child_blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    blocks: list[list[ast.stmt]] = []
    for name in _BODY_FIELDS:
        value = getattr(stmt, name, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            blocks.append(value)
    for handler in getattr(stmt, "handlers", None) or []:
        blocks.append(handler.body)
    for case in getattr(stmt, "cases", None) or []:
        blocks.append(case.body)
    return blocks


def _own_lines(stmt: ast.stmt) -> set[int]:
    """Lines of ``stmt`` that are not lines of a statement nested in it (or of a nested scope)."""
    end = stmt.end_lineno or stmt.lineno
    lines = set(range(_first_line(stmt), end + 1))
    for block in _child_blocks(stmt):
        for child in block:
            lines -= set(range(_first_line(child), (child.end_lineno or child.lineno) + 1))
    lines.add(stmt.lineno)  # a header keeps its line even when its body shares it
    return lines


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _hook_call(line: int, mode: int = 0) -> ast.stmt:
    args: list[ast.expr] = [ast.Constant(line)]
    if mode:
        args.append(ast.Constant(mode))
    return ast.Expr(ast.Call(func=ast.Name(HOOK, ast.Load()), args=args, keywords=[]))


def _placed(node: ast.stmt, stmt: ast.stmt, line: int) -> ast.stmt:
    """Every node on the breakpoint statement's line and column, so positions stay put."""
    for child in ast.walk(node):
        if isinstance(child, (ast.expr, ast.stmt, ast.excepthandler)):
            child.lineno = child.end_lineno = line
            child.col_offset = child.end_col_offset = stmt.col_offset
    return node


def _hook_statement(stmt: ast.stmt, line: int, arm: bool) -> ast.stmt:
    return _placed(_hook_call(line, ARM if arm else 0), stmt, line)


def parse_condition(condition: str) -> ast.expr | None:
    """The condition's expression, or None when it cannot be compiled in (see the module
    doc).  Nested deeper than ``INLINE_DEPTH``, it is not compiled in either: copying it
    into the function and compiling that recurse once per level (``RecursionError``), so
    the debugger evaluates it instead, as it does every condition it cannot compile in."""
    try:
        tree = parse(condition.strip(), "<condition>", "eval")
    except (SyntaxError, ValueError):
        return None
    if depth(tree, INLINE_DEPTH + 1) > INLINE_DEPTH:
        return None
    if any(isinstance(node, _NOT_INLINE) for node in ast.walk(tree)):
        return None
    return tree.body


def _condition_statement(stmt: ast.stmt, line: int, condition: ast.expr) -> ast.stmt:
    test = ast.If(test=condition, body=[_hook_call(line, PASSED)], orelse=[])
    handler = ast.ExceptHandler(
        type=ast.Name("Exception", ast.Load()), name=None, body=[_hook_call(line, RAISED)]
    )
    node = ast.Try(body=[test], handlers=[handler], orelse=[], finalbody=[])
    return _placed(node, stmt, line)


class _Hooks:
    """Inserts the hooks and records, per scope, which lines they serve."""

    def __init__(
        self,
        lines: frozenset[int],
        conditions: dict[int, ast.expr] | None = None,
        inline_only: bool = False,
    ) -> None:
        self.lines = lines
        self.conditions = conditions or {}
        # Only compiled-in conditions, no bare or arming hook: the lines the monitoring
        # backend (3.12+) hands over; what cannot be compiled in stays with its LINE events.
        self.inline_only = inline_only
        self.covered: dict[ScopeKey, set[int]] = {}
        self.armed: dict[ScopeKey, set[int]] = {}
        self.direct: dict[ScopeKey, set[int]] = {}
        self.inlined: dict[ScopeKey, set[int]] = {}

    def scope(self, body: list[ast.stmt], key: ScopeKey) -> list[ast.stmt]:
        self.covered.setdefault(key, set())
        self.armed.setdefault(key, set())
        self.direct.setdefault(key, set())
        self.inlined.setdefault(key, set())
        return self.block(body, key, docstring=True)

    def block(self, body: list[ast.stmt], key: ScopeKey, docstring: bool = False) -> list[ast.stmt]:
        covered, armed, direct = self.covered[key], self.armed[key], self.direct[key]
        out: list[ast.stmt] = []
        for index, stmt in enumerate(body):
            if docstring and index == 0 and _is_docstring(stmt):
                # A module's or class's docstring is code (it stores __doc__), but a hook in
                # front of it would make it an ordinary expression: left unserved (traced).
                self._descend(stmt, key)
                out.append(stmt)
                continue
            wanted = (_own_lines(stmt) & self.lines) - covered
            if wanted:
                first = _first_line(stmt)
                simple = (
                    wanted == {stmt.lineno}
                    and first == stmt.lineno
                    and not isinstance(stmt, _REPEATING)
                )
                condition = self.conditions.get(stmt.lineno) if simple else None
                if condition is not None:
                    out.append(_condition_statement(stmt, first, copy.deepcopy(condition)))
                    self.inlined[key].add(stmt.lineno)
                elif self.inline_only:
                    self._descend(stmt, key)
                    out.append(stmt)
                    continue
                else:
                    out.append(_hook_statement(stmt, first, arm=not simple))
                covered |= wanted
                if simple:
                    direct.add(stmt.lineno)
                else:
                    armed |= set(range(first, (stmt.end_lineno or stmt.lineno) + 1))
            # After the statement's own hook: a body on the same line (`if x: y`) fires
            # no line event of its own, so it must not get a second hook.
            self._descend(stmt, key)
            out.append(stmt)
        return out

    def _descend(self, stmt: ast.stmt, key: ScopeKey) -> None:
        if isinstance(stmt, _SCOPES):
            inner: ScopeKey = (stmt.name, _first_line(stmt))
            stmt.body = self.scope(stmt.body, inner)
            return
        for name in _BODY_FIELDS:
            value = getattr(stmt, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(stmt, name, self.block(value, key))
        for holder in [
            *(getattr(stmt, "handlers", None) or []),
            *(getattr(stmt, "cases", None) or []),
        ]:
            holder.body = self.block(holder.body, key)


def _code_lines(code: CodeType) -> set[int]:
    return {line for _, _, line in code.co_lines() if line is not None and line > 0}


def _nested(code: CodeType) -> list[CodeType]:
    return [const for const in code.co_consts if isinstance(const, CodeType)]


class _ShapeChanged(InstrumentError):
    """A compiled-in condition gave a code object new variables or nested code."""


def instrument_source(
    source: bytes,
    file: str,
    lines: frozenset[int],
    conditions: Mapping[int, str] | None = None,
    inline_only: bool = False,
) -> Instrumented:
    """Compile ``source`` (the text of ``file``) plain and with hooks on ``lines``.

    ``conditions`` (line -> expression) are compiled in where they can be; with
    ``inline_only``, only those lines get anything, and only if compiled in.
    """
    try:
        plain = compile_text(source, file, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        raise InstrumentError(f"{file} does not compile: {exc}") from None
    asked = {line: text for line, text in (conditions or {}).items() if line in lines}
    parsed = {line: parse_condition(text) for line, text in asked.items()}
    candidates = {line: expr for line, expr in parsed.items() if expr is not None}
    try:
        result = _build(source, file, lines, plain, candidates, inline_only)
    except _ShapeChanged:
        # Find the conditions that change the code's shape, one at a time (rare: a name
        # bound only by an enclosing function, super(), ...), and leave those to the hook.
        kept = {}
        for line, expr in candidates.items():
            try:
                _build(source, file, lines, plain, {line: expr}, inline_only)
            except _ShapeChanged:
                continue
            kept[line] = expr
        result = _build(source, file, lines, plain, kept, inline_only)
    result.conditions = asked
    return result


def _build(
    source: bytes,
    file: str,
    lines: frozenset[int],
    plain: CodeType,
    conditions: dict[int, ast.expr],
    inline_only: bool,
) -> Instrumented:
    tree = ast.parse(source, file)
    hooks = _Hooks(lines, conditions, inline_only)
    tree.body = hooks.scope(tree.body, MODULE_KEY)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = compile_text(tree, file, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:  # e.g. a hook in front of `from __future__`
        raise InstrumentError(f"{file} cannot take a hook: {exc}") from None
    result = Instrumented(file, lines, plain, module)
    _pair(result, hooks, plain, module, MODULE_KEY, None)
    return result


_SHAPE = ("co_varnames", "co_cellvars", "co_freevars", "co_argcount", "co_flags")


def _pair(
    result: Instrumented,
    hooks: _Hooks,
    plain: CodeType,
    instr: CodeType,
    scope: ScopeKey,
    parent_scope: ScopeKey | None,
) -> None:
    if plain.co_name != instr.co_name or plain.co_firstlineno != instr.co_firstlineno:
        raise InstrumentError(f"{result.file}: code objects do not pair up at {plain.co_name}")
    if any(getattr(plain, name) != getattr(instr, name) for name in _SHAPE):
        raise _ShapeChanged(f"{result.file}: a compiled-in condition changes {plain.co_name}")
    result.origin[id(instr)] = (instr, plain)
    if plain != instr:
        result.changed[plain] = instr
    if plain.co_name not in INLINE_NAMES:
        inlined = hooks.inlined.get(scope)
        if inlined:
            result.inline[id(instr)] = frozenset(inlined)
    wanted = _code_lines(plain) & result.lines
    if plain.co_name in _DEFERRED:
        missing = wanted  # may run later, from another line: only tracing sees those lines
    elif plain.co_name in INLINE_NAMES and parent_scope is not None:
        # A comprehension, run at once by the line that makes it: that line's hook or arm.
        wanted.discard(plain.co_firstlineno)
        single = len(_code_lines(plain)) <= 1
        serving = hooks.covered if single else hooks.armed
        missing = wanted - serving.get(parent_scope, set())
    else:
        if plain.co_name != "<module>":
            wanted.discard(plain.co_firstlineno)  # the def/class line: the outer hook's
        missing = wanted - hooks.covered.get(scope, set())
        if plain.co_flags & _SUSPENDING:
            missing |= wanted & (hooks.armed.get(scope, set()) - hooks.direct.get(scope, set()))
    result.uncovered.extend((plain.co_name, line) for line in sorted(missing))
    children_plain, children_instr = _nested(plain), _nested(instr)
    if len(children_plain) != len(children_instr):
        raise _ShapeChanged(f"{result.file}: nested code differs in {plain.co_name}")
    for child_plain, child_instr in zip(children_plain, children_instr, strict=True):
        if child_plain.co_name in INLINE_NAMES:
            child_scope = scope  # lambdas and comprehensions live in the enclosing scope
        else:
            child_scope = (child_plain.co_name, child_plain.co_firstlineno)
        _pair(result, hooks, child_plain, child_instr, child_scope, scope)


def instrument_file(
    file: str,
    lines: frozenset[int],
    conditions: Mapping[int, str] | None = None,
    inline_only: bool = False,
) -> Instrumented:
    try:
        with open(file, "rb") as fh:
            source = fh.read()
    except OSError as exc:
        raise InstrumentError(f"cannot read {file}: {exc}") from None
    return instrument_source(source, file, lines, conditions, inline_only)
