"""Propose a ``--map`` when few entries pair: align the two module trees.

A hand-written port names its modules its own way (``blocks.1.attention.wq`` for
``model.layers.1.self_attn.q_proj``).  Both captures list their module calls in execution
order with class names and output shapes, and a port computes the same things in the
same order, so the two call sequences line up: ``difflib.SequenceMatcher`` aligns them
on a signature of each call (a coarse class family, such as ``linear`` for ``Linear`` and
MLX ``QuantizedLinear``, plus the output shapes with a channels-last layout folded
away).  Matched calls whose paths differ become rules.  Numbered paths that differ
only in their numbers (``blocks.N`` ↔ ``layers.N``) collapse into one regex rule; the rest
are ``rename`` entries.  The result is a ready map file.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, TypeAlias

from ..read.sources import Call, Entry, Source
from .mapping import NameMap

_FAMILIES = (
    ("embed", re.compile(r"embed", re.I)),
    ("norm", re.compile(r"norm", re.I)),
    ("attn", re.compile(r"atten|attn|self_?att", re.I)),
    ("mlp", re.compile(r"mlp|feedforward|ffn|feed_forward", re.I)),
    ("conv", re.compile(r"conv", re.I)),
    ("linear", re.compile(r"linear|dense|proj", re.I)),
    ("act", re.compile(r"silu|gelu|relu|swish|tanh|sigmoid|act", re.I)),
    ("block", re.compile(r"block|layer|decoder|encoder", re.I)),
)
# A map as the map file holds it: {"rename": {...}, "regex": [[pattern, replacement], ...]}.
Proposal: TypeAlias = dict[str, Any]
_NUMBER = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


def family(class_name: str) -> str:
    for name, pattern in _FAMILIES:
        if pattern.search(class_name):
            return name
    return "other"


def _signature(call: Call, outputs: dict[tuple[str, int], list[Entry]]) -> str:
    """Class family and the main output's shape (sorted: layout-free).  Only the first
    output counts: transformers' attention also returns its weights, mlx-lm's does not."""
    found = outputs.get((call.module, call.call), [])
    shape = "x".join(str(n) for n in sorted(found[0].shape)) if found else ""
    return f"{family(call.class_name)}|{shape}"


def _first_calls(source: Source) -> list[Call]:
    """Each module's first call, in execution order (later calls repeat the same paths).
    Operations recorded with ``ops=`` are not modules: no map names them (``ops.py``
    aligns them by value), so they are left out of the sequence."""
    first = (c for c in source.calls.values() if c.call == 0 and not c.is_operation)
    return sorted(first, key=lambda c: c.start_order)


def _outputs(source: Source) -> dict[tuple[str, int], list[Entry]]:
    found: dict[tuple[str, int], list[Entry]] = {}
    for entry in source.entries:
        if entry.role == "out" and entry.call_key is not None:
            found.setdefault(entry.call_key, []).append(entry)
    return found


def propose_map(a: Source, b: Source, names: NameMap) -> Proposal | None:
    """A map sending B's module paths onto A's, or None when nothing could be aligned."""
    if not a.calls or not b.calls:
        return None
    calls_a, calls_b = _first_calls(a), _first_calls(b)
    out_a, out_b = _outputs(a), _outputs(b)
    sig_a = [_signature(c, out_a) for c in calls_a]
    sig_b = [_signature(c, out_b) for c in calls_b]
    matcher = difflib.SequenceMatcher(a=sig_a, b=sig_b, autojunk=False)
    pairs: list[tuple[str, str]] = []
    for block in matcher.get_matching_blocks():
        for i in range(block.size):
            module_a = calls_a[block.a + i].module
            module_b = calls_b[block.b + i].module
            if names.to_a(f"{module_b}#0.out").split("#", 1)[0] != module_a:
                pairs.append((module_b, module_a))
    if not pairs:
        return None
    return rules_of(pairs)


def _template(path: str) -> tuple[str, list[str]]:
    numbers = _NUMBER.findall(path)
    return _NUMBER.sub("{}", path), numbers


def rules_of(pairs: list[tuple[str, str]]) -> Proposal:
    """A map of ``(B path, A path)`` pairs: ``blocks.0.x -> layers.0.y``, ``blocks.1.x ->
    layers.1.y`` collapse into one regex, the rest are renames."""
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    rename: dict[str, str] = {}
    for module_b, module_a in pairs:
        tb, nb = _template(module_b)
        ta, na = _template(module_a)
        if nb and nb == na:
            groups.setdefault((tb, ta), []).append((module_b, module_a))
        else:
            rename[module_b] = module_a
    regex: list[list[str]] = []
    for (tb, ta), members in groups.items():
        if len(members) == 1:
            rename[members[0][0]] = members[0][1]
            continue
        pattern = "^" + r"(\d+)".join(re.escape(part) for part in tb.split("{}")) + "(?=#)"
        count = 0

        def number(_match: re.Match[str]) -> str:
            nonlocal count
            count += 1
            return f"\\{count}"

        replacement = re.sub(r"\{\}", number, ta.replace("\\", "\\\\"))
        regex.append([pattern, replacement])
    proposal: Proposal = {}
    if rename:
        proposal["rename"] = rename
    if regex:
        proposal["regex"] = regex
    return proposal


def merged(proposal: Proposal | None, pairs: list[tuple[str, str]]) -> Proposal | None:
    """``proposal`` with the rules for ``pairs`` (B path, A path) added."""
    if not pairs:
        return proposal
    extra = rules_of(pairs)
    if proposal is None:
        return extra
    combined = dict(proposal)
    if extra.get("rename"):
        combined["rename"] = {**(proposal.get("rename") or {}), **extra["rename"]}
    if extra.get("regex"):
        combined["regex"] = [*(proposal.get("regex") or []), *extra["regex"]]
    return combined
