"""Each option of ``start --capture`` is declared once (``capture_options.Spec``): the
verb argument, the CLI flag and the setting the debuggee reads all derive from it.

What adding an option takes is one field there; these tests hold every surface to the
declaration, so a field added there is a flag, a REST and MCP argument, and a setting in
``$MLDBG_CAPTURE`` without another line anywhere (the REST and MCP schemas derive from
the verb table: ``tests/test_surfaces.py``).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from mldbg import capture_options, verbs
from mldbg.cli import main as cli_main
from mldbg.errors import MldbgError
from mldbg.server import handlers
from mldbg.server.app import args_model

START = verbs.BY_NAME["start"]
DEFAULTS = {f.name: f.default for f in dataclasses.fields(capture_options.Spec)}


def example(declared: capture_options.Option) -> tuple[object, list[str]]:
    """A value of the option's argument other than its default, and how the CLI says it."""
    if declared.type is bool:
        return True, []
    if declared.type is int:
        return (declared.minimum or 0) + 2, [str((declared.minimum or 0) + 2)]
    if declared.type == list[str]:
        return ["Block*"], ["Block*"]
    value = declared.choices[-1] if declared.choices else "1"
    return value, [value]


def test_every_option_is_an_argument_of_start_on_every_surface() -> None:
    fields = {k: v for k, v in capture_options.OPTIONS.items()}
    assert set(fields) == set(DEFAULTS) - {"name", "inputs"}  # every other field is one
    model = args_model(START).model_fields
    for field, declared in fields.items():
        argument = START.arg(capture_options.argument_of(field))
        assert (argument.type, argument.help) == (declared.type, declared.help)
        assert argument.default == capture_options.argument_default(field)
        assert argument.name in model  # the REST request (and so the OpenAPI schema)
        value, words = example(declared)
        command = ["start", "--capture", "c", argument.cli_flag, *words, "x.py"]
        parsed = cli_main.parse_command_line(command)
        given = cli_main.verb_arguments(START, parsed)
        assert given[argument.name] in (value, [value]), (field, given)


@pytest.mark.parametrize("field", list(capture_options.OPTIONS))
def test_every_option_reaches_the_debuggees_settings(field: str) -> None:
    """The argument, through the daemon's ``start``, is the setting ``$MLDBG_CAPTURE``
    holds and the debuggee parses (a flag for a setting that is on turns it off)."""
    value, _ = example(capture_options.OPTIONS[field])
    argument = capture_options.argument_of(field)
    settings = handlers._capture_settings("c", {argument: value})
    assert settings is not None and settings[0] == capture_options.ENV
    spec = capture_options.Spec.parse(json.loads(settings[1]))
    assert getattr(spec, field) != DEFAULTS[field], (field, spec)
    with pytest.raises(MldbgError, match=f"{argument} needs a capture name"):
        handlers._capture_settings(None, {argument: value})
    assert (
        handlers._capture_settings(None, {argument: capture_options.argument_default(field)})
        is None
    )
