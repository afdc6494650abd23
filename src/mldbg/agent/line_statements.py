"""What each line of a source file is, for the line step: the statement it belongs to,
its text, and the names it reads.

A line event only says which line is about to run.  The line step records what a line
*bound* (seen at the next event of its frame) and links it to the values it *read*, so
that a difference can be followed through the code (``compare/line/``): "this value
was computed from those".  The names a statement reads come from its syntax tree: the
plain names it loads (``q``, ``cos``) and the attributes of a name (``self.scale``);
what a call reads inside itself is that call's own frame's business.  A statement that
spans lines is one statement: a line event on a continuation line (Python reports those
too) belongs to the statement that started above it.

Standard library only; each file is parsed once per process.
"""

from __future__ import annotations

import ast
import functools
import linecache
from dataclasses import dataclass

TEXT_LIMIT = 160  # characters of a statement's first line kept as its text


@dataclass(frozen=True)
class Statement:
    """One statement (or a compound statement's header: ``for``, ``if``, ``with``)."""

    start: int  # its first line: the line a record names
    text: str  # its first line, stripped (cut at TEXT_LIMIT, " …" when it goes on)
    reads: frozenset[str]  # names it loads
    attributes: frozenset[tuple[str, str]]  # (name, attribute) it loads: ("self", "scale")


def _reads(nodes: list[ast.AST]) -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
    names: set[str] = set()
    attributes: set[tuple[str, str]] = set()
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
                names.add(node.id)  # Load, and Del / AugStore's read of the old value
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and isinstance(node.ctx, ast.Load)
            ):
                attributes.add((node.value.id, node.attr))
    return frozenset(names), frozenset(attributes)


def _header(node: ast.stmt) -> tuple[list[ast.AST], int]:
    """A compound statement's own expressions and the last line of its header."""
    body = getattr(node, "body", None)
    first_body = body[0].lineno if isinstance(body, list) and body else node.lineno + 1
    last = max(node.lineno, first_body - 1)
    if isinstance(node, ast.For | ast.AsyncFor):
        return [node.iter, node.target], last
    if isinstance(node, ast.While | ast.If):
        return [node.test], last
    if isinstance(node, ast.With | ast.AsyncWith):
        return [item.context_expr for item in node.items], last
    if isinstance(node, ast.Match):
        return [node.subject], node.lineno
    return [], last  # def, class, try: nothing of their own runs as a value


_COMPOUND = (
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.If,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Match,
)


@functools.lru_cache(maxsize=256)
def statements_of(file: str) -> dict[int, Statement]:
    """Each line of ``file`` that belongs to a statement -> that statement ({} when the
    file cannot be read or parsed: each line is then its own statement)."""
    lines = linecache.getlines(file)
    if not lines:
        return {}
    try:
        tree = ast.parse("".join(lines), file)
    except (SyntaxError, ValueError, RecursionError):
        return {}
    found: dict[int, Statement] = {}
    # Outer statements first: an inner one overwrites the lines it holds.
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop(0)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                todo.append(child)
        if not isinstance(node, ast.stmt):
            continue
        if isinstance(node, _COMPOUND):
            nodes, last = _header(node)
        else:
            nodes, last = [node], getattr(node, "end_lineno", None) or node.lineno
        names, attributes = _reads(nodes)
        text = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ""
        if len(text) > TEXT_LIMIT or last > node.lineno:
            text = text[:TEXT_LIMIT] + " …"
        statement = Statement(node.lineno, text, names, attributes)
        for line in range(node.lineno, last + 1):
            found[line] = statement
    return found


def statement_at(file: str, line: int) -> Statement:
    """The statement line ``line`` of ``file`` belongs to (the line alone when unknown)."""
    known = statements_of(file).get(line)
    if known is not None:
        return known
    text = linecache.getline(file, line).strip()
    return Statement(line, text[:TEXT_LIMIT], frozenset(), frozenset())
