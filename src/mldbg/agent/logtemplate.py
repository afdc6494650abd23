"""Logpoint messages: templates that behave exactly like Python f-strings.

The template is parsed by Python's own f-string parser (so format specs, ``!r``/``!s``/
``!a`` conversions, the ``=`` specifier and nested ``{...}`` in specs all mean what they
mean in an f-string), then each replacement field is evaluated on its own.  That keeps two
things an f-string would not give: a failing field shows its error inline instead of losing
the whole message, and a bare ``{tensor}`` prints mldbg's one-line summary instead of
``str(tensor)``, which may be megabytes.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType, FrameType

from ..errors import TemplateError
from .compiling import compile_text, parse

MAX_FIELD = 1000  # characters of one field's text
MAX_MESSAGE = 8000  # characters of a whole message

_CONVERSIONS: dict[int, Callable[[object], str]] = {ord("r"): repr, ord("s"): str, ord("a"): ascii}
# What a bare ``{expr}`` field shows instead of format(): a tensor's one line, or None.
Summarize = Callable[[object], str | None]


@dataclass
class Field:
    """One ``{expr!c:spec}`` of a template."""

    source: str
    code: CodeType
    conversion: int  # -1: none, else ord('r'), ord('s') or ord('a')
    spec: list[Part] | None


Part = str | Field


def _quote_for(template: str) -> str:
    for quote in ('"""', "'''"):
        if quote not in template and not template.endswith(quote[0]):
            return quote
    raise TemplateError("the message holds both ''' and \"\"\": it cannot be read as an f-string")


def compile_template(template: str) -> list[Part]:
    """Parse ``template`` as the body of an f-string; raises :class:`TemplateError`."""
    if "\x00" in template:
        raise TemplateError("the message holds a NUL byte")
    quote = _quote_for(template)
    try:
        tree = parse(f"f{quote}{template}{quote}", "<log message>", "eval")
    except SyntaxError as exc:
        raise TemplateError(exc.msg) from None
    body = tree.body
    if isinstance(body, ast.Constant):  # no replacement field at all
        return [str(body.value)]
    if not isinstance(body, ast.JoinedStr):  # pragma: no cover - the parser guarantees it
        raise TemplateError("not an f-string")
    try:
        return _parts(body, template)
    except SyntaxError as exc:  # a field nested too deeply to compile
        raise TemplateError(exc.msg) from None
    except RecursionError:  # or to unparse (ast.unparse recurses in Python)
        raise TemplateError("a replacement field is nested too deeply") from None


def _parts(node: ast.JoinedStr, template: str) -> list[Part]:
    parts: list[Part] = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue):
            expression = ast.Expression(value.value)
            ast.fix_missing_locations(expression)
            source = ast.unparse(value.value)
            code = compile_text(expression, "<log expression>", "eval")
            spec = value.format_spec
            parts.append(
                Field(
                    source,
                    code,
                    value.conversion,
                    _parts(spec, template) if isinstance(spec, ast.JoinedStr) else None,
                )
            )
    return parts


def render(parts: list[Part], frame: FrameType, summarize: Summarize | None = None) -> str:
    """The message in ``frame``; each failing field is shown as ``<error: ...>``."""
    out: list[str] = []
    size = 0
    for part in parts:
        text = part if isinstance(part, str) else _field(part, frame, summarize)
        out.append(text)
        size += len(text)
        if size > MAX_MESSAGE:
            break
    message = "".join(out)
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + f"… ({len(message)}+ chars)"
    return message


def _field(field: Field, frame: FrameType, summarize: Summarize | None) -> str:
    try:
        value = eval(field.code, frame.f_globals, frame.f_locals)
        if field.conversion == -1 and field.spec is None and summarize is not None:
            summary = summarize(value)
            if summary is not None:
                return summary
        if field.conversion != -1:
            value = _CONVERSIONS[field.conversion](value)
        spec = render(field.spec, frame, None) if field.spec else ""
        text = format(value, spec)
    except Exception as exc:  # the user's expression: its error is shown, never raised
        text = f"<error: {type(exc).__name__}: {exc}>"
    if len(text) > MAX_FIELD:
        text = text[:MAX_FIELD] + f"… ({len(text)} chars)"
    return text
