"""Entries one side has and the other lacks, listed by what they can mean.

A module that holds no parameter (an activation, a dropout, an identity, a rotary helper)
is often a module on one side and a line of inline code on the other (transformers'
``act_fn`` against mlx-lm's ``nn.silu(x)`` in the MLP's forward): its entries pair with
nothing, and that says nothing about the port's correctness.  Such entries are counted
apart, not listed and not hinted, unless they sit on the culprit's path (inside the
culprit, or one of its ancestors), where what the other side computes inline may be the
bug.  Entries of modules with parameters are always listed: a missing layer is a finding.
"""

from __future__ import annotations

from ..pair.mapping import split_name
from ..read.sources import Source
from ..records import Culprit


def parameter_free_apart(
    names: list[str], source: Source, culprit: Culprit | None
) -> tuple[list[str], list[str]]:
    """``names`` (one side's unpaired entries) as ``(listed, apart)``: apart, those of
    modules ``source`` recorded as holding no parameter, off the culprit's path."""
    free = source.meta.get("parameter_free")
    if not isinstance(free, list) or not free:
        return names, []
    free_modules = {str(path) for path in free}
    on_path = _culprit_path(culprit)
    listed, apart = [], []
    for name in names:
        parts = split_name(name)
        module = parts[0] if parts is not None else None
        if module in free_modules and not _on(module, on_path):
            apart.append(name)
        else:
            listed.append(name)
    return listed, apart


def _culprit_path(culprit: Culprit | None) -> str | None:
    module = culprit.get("module") if culprit else None
    return module if isinstance(module, str) else None


def _on(module: str | None, culprit: str | None) -> bool:
    """Inside the culprit, or one of the modules it sits in."""
    if module is None or culprit is None:
        return False
    if culprit in ("", "<root>"):
        return True
    inside = module == culprit or module.startswith(culprit + ".")
    above = module == "" or culprit.startswith(module + ".")
    return inside or above
