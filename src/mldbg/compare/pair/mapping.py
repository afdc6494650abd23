"""``--map FILE``: how the second run's names become the first run's.

A port rarely keeps every module name of its reference.  The map is a JSON file::

    {
      "rename": {"transformer.h.0.attn": "model.layers.0.self_attn"},
      "regex":  [["^transformer\\.h\\.(\\d+)\\.", "model.layers.\\1."]],
      "ignore": ["*.rotary_emb#*", "*.rope#*"]
    }

``rename`` replaces whole module paths or whole entry names, ``regex`` rules are
``re.sub`` applied in order to each name of B, and ``ignore`` globs drop entries of
either side (after renaming) from the comparison.

A rule's work is bounded: a pattern that backtracks for ages (``(x|x)+#1`` on a name of
40 x's) ran inside ``re``'s C loop with the GIL held, where no deadline reaches, and froze
the daemon.  Rules run on the ``regex`` engine (``re``'s syntax, ``VERSION0``) with a
timeout of ``RULE_SECONDS`` per name: past it the map is ``bad_map``, naming the rule.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex as rx  # NameMap.regex is the rules

from ...errors import BAD_MAP
from ...store import reading
from ..read.sources import CompareInputError

_ENTRY = re.compile(r"^(?P<module>.*)#(?P<call>\d+)\.(?P<key>(?:in|out)(?:\..*)?)$")


RULE_SECONDS = 1.0  # one regex rule on one name: microseconds, unless it backtracks


@dataclass
class NameMap:
    rename: dict[str, str] = field(default_factory=dict)
    regex: list[tuple[rx.Pattern[str], str]] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    # Module paths (in A's terms, after the rules above) renamed past identity modules one
    # tree lacks, with everything under them (``structure.identity_shifts``).
    structure: dict[str, str] = field(default_factory=dict)

    def to_a(self, name: str) -> str:
        """B's entry name in A's terms."""
        if name in self.rename:
            return self.rename[name]
        match = _ENTRY.match(name)
        if match and match["module"] in self.rename:
            name = f"{self.rename[match['module']]}#{match['call']}.{match['key']}"
        for pattern, replacement in self.regex:
            try:
                name = pattern.sub(replacement, name, timeout=RULE_SECONDS)
            except (rx.error, IndexError) as exc:  # the replacement is parsed on a match
                raise CompareInputError(
                    f"map: bad replacement {replacement!r} for {pattern.pattern!r}: {exc}",
                    code=BAD_MAP,
                ) from None
            except TimeoutError:
                raise CompareInputError(
                    f"map: the regex {pattern.pattern[:200]!r} took more than {RULE_SECONDS:g} s "
                    f"on one name ({name[:80]!r}): a pattern that backtracks (nested repeats "
                    "such as (a+)+); anchor it, or use rename",
                    code=BAD_MAP,
                ) from None
        return self._restructured(name) if self.structure else name

    def _restructured(self, name: str) -> str:
        """``name`` with its module path, or the closest ancestor of it that
        ``structure`` renames, renamed."""
        match = _ENTRY.match(name)
        if match is None:
            return name
        module = path = match["module"]
        while path not in self.structure:
            if "." not in path:
                return name
            path = path.rsplit(".", 1)[0]
        module = self.structure[path] + module[len(path) :]
        return f"{module}#{match['call']}.{match['key']}"

    def ignored(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.ignore)


def load_map(path: str | os.PathLike[str] | None) -> NameMap:
    if path is None:
        return NameMap()
    file = Path(path).expanduser()
    try:
        data = reading.read_json(file)  # a FIFO or /dev/zero is refused, not read forever
    except FileNotFoundError:
        raise CompareInputError(f"map file {file} does not exist", code=BAD_MAP) from None
    except OSError as exc:  # a directory, a FIFO or device, no permission
        raise CompareInputError(
            f"map file {file} cannot be read: {exc.strerror or exc}", code=BAD_MAP
        ) from None
    except ValueError as exc:
        raise CompareInputError(
            f"map file {file} is not valid JSON: {str(exc)[:300]}", code=BAD_MAP
        ) from None
    return parse_map(data, str(file))


def parse_map(data: Any, where: str = "map") -> NameMap:
    if not isinstance(data, dict):
        raise CompareInputError(
            f"{where}: expected an object with rename / regex / ignore", code=BAD_MAP
        )
    unknown = set(data) - {"rename", "regex", "ignore"}
    if unknown:
        raise CompareInputError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; use rename, regex, ignore",
            code=BAD_MAP,
        )
    rename = data.get("rename") or {}
    if not isinstance(rename, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in rename.items()
    ):
        raise CompareInputError(f"{where}: rename must map names to names", code=BAD_MAP)
    rules = data.get("regex") or []
    if isinstance(rules, dict):
        rules = list(rules.items())
    if not isinstance(rules, list):
        raise CompareInputError(
            f"{where}: regex takes a list of [pattern, replacement] rules", code=BAD_MAP
        )
    compiled = []
    for rule in rules:
        if not (
            isinstance(rule, list | tuple)
            and len(rule) == 2
            and all(isinstance(s, str) for s in rule)
        ):
            raise CompareInputError(
                f"{where}: each regex rule is [pattern, replacement], not {rule!r}", code=BAD_MAP
            )
        try:
            compiled.append((rx.compile(rule[0], rx.VERSION0), rule[1]))
        except (rx.error, ValueError, OverflowError) as exc:
            raise CompareInputError(
                f"{where}: bad regex {rule[0]!r}: {exc}", code=BAD_MAP
            ) from None
    ignore = data.get("ignore") or []
    if isinstance(ignore, str):
        ignore = [ignore]
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise CompareInputError(f"{where}: ignore takes glob patterns", code=BAD_MAP)
    return NameMap(dict(rename), compiled, list(ignore))


def split_name(name: str) -> tuple[str, int, str] | None:
    """``(module, call, key)`` of a capture entry name, None for a plain tensor name."""
    match = _ENTRY.match(name)
    return (match["module"], int(match["call"]), match["key"]) if match else None
