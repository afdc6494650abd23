"""The options of ``start --capture``: each declared once, as a field of :class:`Spec`.

``mldbg start --capture NAME`` records an unmodified script's models (``zero_edit.py``);
the daemon hands the debuggee what to record as one JSON :class:`Spec` in
``$MLDBG_CAPTURE``.  Each option is one field of :class:`Spec` declared with
:func:`option`: the setting the debuggee reads, how it is checked, and the help, type and
limits of the verb argument ``capture_<name>`` that every surface derives from it (the
CLI flag, the REST and MCP schema: ``verbs.CAPTURE_ARGS``; the daemon's ``start``, which
takes them as one mapping: :func:`settings_from_arguments`).  Adding an option is one
field here, plus the code that acts on it (``tests/test_capture_options.py`` holds every
surface to this).

A setting whose default is True is turned off by its argument: ``sensitivity`` is
``--capture-no-sensitivity``.

Standard library only, and light: the CLI imports this through the verb table on every
call; the checks that need the capture package import it when they run.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TypeVar

ENV = "MLDBG_CAPTURE"
MAX_MODELS = 64  # models (captures) one process may open; more are run uncaptured
# The longest NAME: room left in a capture name's 100 characters for ".64" and "@rank99999".
MAX_NAME = 100 - len(f".{MAX_MODELS}") - len("@rank99999")
PREFIX = "capture_"  # an option's verb argument is its name after this

T = TypeVar("T")


@dataclass(frozen=True)
class Option:
    """How one setting of :class:`Spec` is given to ``start``: its argument's type (what a
    client sends; the setting may be parsed from it), help and limits, and the check
    that turns a given value into the setting (``ValueError``/``TypeError``: refused)."""

    type: object  # the verb argument's type: int, str, bool, list[str]
    help: str
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    flag: str | None = None  # the CLI flag, when not --capture-<name>
    check: Callable[[object], object] | None = None  # the setting from a given value


def option(
    default: T,
    type: object,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    minimum: int | None = None,
    flag: str | None = None,
    check: Callable[[object], object] | None = None,
) -> T:
    """A field of :class:`Spec` that ``start`` takes as ``capture_<name>``."""
    declared = Option(type, help, choices, minimum, flag, check)
    found: T = dataclasses.field(default=default, metadata={"option": declared})
    return found


def _budget(value: object) -> object:
    from .capture.budget import parse_size

    return parse_size(value)  # type: ignore[arg-type]  # parse_size refuses other types


def _mode(value: object) -> object:
    from .capture.budget import check_mode

    return check_mode(str(value))


def _precision(value: object) -> object:
    from .capture.precision import PRECISIONS

    if value not in PRECISIONS:
        raise ValueError(f"precision takes {' or '.join(PRECISIONS)}, not {str(value)[:40]!r}")
    return value


def _patterns(example: str) -> Callable[[object], object]:
    """A list of non-empty texts (class names, module paths, globs)."""

    def check(value: object) -> object:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ValueError(example)
        return list(value) or None

    return check


def _text(example: str, empty: bool = True) -> Callable[[object], object]:
    def check(value: object) -> object:
        if not isinstance(value, str) or not (value or empty):
            raise ValueError(example)
        return value

    return check


@dataclass
class Spec:
    """What to capture.  ``name`` is ``start``'s ``capture`` argument itself; every other
    field but ``inputs`` is an option of ``start`` (:func:`option`); :meth:`parse` is the
    daemon's and the agent's one validation."""

    name: str
    models: list[str] | None = option(
        None,
        list[str],
        "capture these models instead: a class name or glob (LlamaModel, *UNet*); repeatable",
        flag="--capture-model",
        check=_patterns("models takes class names or glob patterns, e.g. LlamaModel"),
    )
    mode: str = option(
        "full",
        str,
        "full: every tensor; summary: statistics + an 8 KB sketch per tensor (coarse pass)",
        choices=("full", "summary"),
        check=_mode,
    )
    depth: int | None = option(
        None,
        int,
        "record only calls nested at most this deep in the model (0: the model's own call)",
        minimum=0,
    )
    budget: int | None = option(
        None,
        str,
        "most bytes the tensor files may take (500MB, 1GB); the rest is skipped, reported",
        check=_budget,
    )
    within: str | None = option(
        None,
        str,
        "record only this module and what it contains (the culprit a coarse pass named)",
        check=_text("within takes a module path, e.g. model.layers.7"),
    )
    calls: int | None = option(None, int, "record only the first N calls of each model", minimum=1)
    ops: list[str] | None = option(
        None,
        list[str],
        "also record the torch / mx.* operations inside this module (path or glob); repeatable",
        flag="--capture-ops",
        check=_patterns("ops takes module paths or globs, e.g. model.layers.0.self_attn"),
    )
    weights: bool = option(
        False, bool, "also save each model's parameters at its first call (for the weights audit)"
    )
    # the re-runs that measure each call's floor (compare's bounds)
    sensitivity: bool = option(
        True, bool, "skip the sensitivity re-runs (faster; compare then bounds by rounding alone)"
    )
    # a better run for compare --better: each model in this wider dtype (torch only)
    precision: str | None = option(
        None,
        str,
        "run torch models in this wider dtype: the better run compare takes",
        choices=("float32", "float64"),
        check=_precision,
    )
    replay: str | None = option(
        None,
        str,
        "replay each model on this reference capture instead (its modules fed its "
        "inputs), as capture NAME",
        check=_text(
            "replay takes the reference capture's name (or run/name, or a path)", empty=False
        ),
    )
    inputs: bool = True  # module inputs too (not an option of start: always)

    @classmethod
    def parse(cls, data: object) -> Spec:
        if not isinstance(data, dict):
            raise ValueError("the capture settings are a JSON object")
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown capture setting(s): {', '.join(sorted(unknown))}")
        from .capture.store import check_capture_name

        name = check_capture_name(data.get("name"))  # type: ignore[arg-type]
        if len(name) > MAX_NAME:  # NAME.64@rank12345 must still be a capture name
            raise ValueError(
                f"capture name {name[:40]!r}… has {len(name)} characters: at most {MAX_NAME}, "
                f"since later models are NAME.2 … NAME.{MAX_MODELS} and torchrun ranks add "
                "@rankN"
            )
        settings: dict[str, object] = {"name": name, "inputs": bool(data.get("inputs", True))}
        for field, declared in OPTIONS.items():
            value = data.get(field)
            if value is not None:
                settings[field] = _checked(field, declared, value)
        return cls(**settings)  # type: ignore[arg-type]  # each checked above

    def to_env(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def _checked(field: str, declared: Option, value: object) -> object:
    """A given setting, as its declaration checks it."""
    if declared.type is int:
        low = declared.minimum
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or (low is not None and value < low)
        ):
            raise ValueError(f"{field} takes a whole number, not {str(value)[:40]!r}")
    if declared.type is bool:
        return bool(value)
    return declared.check(value) if declared.check is not None else value


OPTIONS: dict[str, Option] = {
    f.name: f.metadata["option"] for f in dataclasses.fields(Spec) if "option" in f.metadata
}


def argument_of(field: str) -> str:
    """The verb argument that gives setting ``field``: ``capture_<field>``, or
    ``capture_no_<field>`` for a setting that is on unless turned off."""
    default = next(f.default for f in dataclasses.fields(Spec) if f.name == field)
    return f"{PREFIX}no_{field}" if default is True else f"{PREFIX}{field}"


def argument_default(field: str) -> object:
    """What the argument is when not given (a flag that turns a setting off: False)."""
    default = next(f.default for f in dataclasses.fields(Spec) if f.name == field)
    return False if default is True else default


def settings_from_arguments(arguments: Mapping[str, object]) -> dict[str, object]:
    """The settings ``start``'s ``capture_*`` arguments give (those at their defaults,
    and empty lists: a CLI flag never repeated, left out), by setting name."""
    given: dict[str, object] = {}
    for field in OPTIONS:
        value = arguments.get(argument_of(field))
        default = argument_default(field)
        if value is None or value == [] or (type(value) is type(default) and value == default):
            continue
        given[field] = (not value) if argument_of(field) != PREFIX + field else value
    return given
