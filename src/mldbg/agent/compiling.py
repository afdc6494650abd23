"""Parsing and compiling the user's text: evaluations, conditions, watches, log templates.

Python refuses code nested too deeply (``"1+" * 5000 + "1"``, ``"-" * 90000 + "1"``) not
with ``SyntaxError`` but with ``RecursionError`` or ``MemoryError`` ("too complex to
parse"), each version at its own depth; every caller that turned a ``SyntaxError`` into
its own error code answered those as ``internal``.  These two functions say it as a
``SyntaxError``, so one ``except SyntaxError`` serves every depth.  Standard library only.
"""

from __future__ import annotations

import ast
from types import CodeType
from typing import Literal, overload

Mode = Literal["exec", "eval", "single"]
Source = str | bytes | ast.Module | ast.Expression | ast.Interactive


def _too_deep(exc: BaseException) -> SyntaxError:
    detail = str(exc) or "the parser's stack overflowed"
    return SyntaxError(f"nested too deeply for Python's compiler ({type(exc).__name__}: {detail})")


@overload
def parse(source: str, filename: str, mode: Literal["exec"]) -> ast.Module: ...
@overload
def parse(source: str, filename: str, mode: Literal["eval"]) -> ast.Expression: ...
def parse(source: str, filename: str, mode: Literal["exec", "eval"]) -> ast.AST:
    """``ast.parse``, with code nested too deeply refused as a ``SyntaxError``."""
    try:
        return ast.parse(source, filename, mode)
    except (RecursionError, MemoryError) as exc:
        raise _too_deep(exc) from None


def compile_text(source: Source, filename: str, mode: Mode, dont_inherit: bool = False) -> CodeType:
    """``compile``, with code nested too deeply refused as a ``SyntaxError``."""
    try:
        return compile(source, filename, mode, dont_inherit=dont_inherit)
    except (RecursionError, MemoryError) as exc:
        raise _too_deep(exc) from None


def depth(tree: ast.AST, limit: int) -> int:
    """How deep ``tree`` nests, counted without recursion up to ``limit`` (then ``limit``):
    a tree deeper than mldbg's own recursive passes over it (``copy.deepcopy``, the
    compiler) take is kept away from them."""
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, level = stack.pop()
        if level > deepest:
            deepest = level
            if deepest >= limit:
                return limit
        stack.extend((child, level + 1) for child in ast.iter_child_nodes(node))
    return deepest
