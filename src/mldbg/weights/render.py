"""The weight audit for a person: the verdict, then each problem, failures first."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .params import Audit


def render_audit(result: Audit, limit: int = 20) -> str:
    """The human report: the verdict, then each problem (failures first)."""
    counts = ", ".join(f"{n} {status}" for status, n in sorted(result["counts"].items()))
    lines = [
        f"weights: {'OK' if result['ok'] else 'PROBLEMS'} - {result['reference']['label']} "
        f"({result['reference']['count']}) vs {result['port']['label']} ({result['port']['count']}): {counts}"
    ]
    for row in result["problems"][:limit]:
        name = row["name"] or row["name_port"]
        port = f" (port: {row['name_port']})" if row.get("name_port") not in (None, name) else ""
        lines.append(f"  {row['status']:<13} {name}{port}: {row['note']}")
    more = len(result["problems"]) - limit
    if more > 0:
        lines.append(f"  … {more} more (--limit, or --json for all)")
    if result.get("proposed_map"):
        lines.append("  map for the renamed ones: " + str(result["proposed_map"]))
    return "\n".join(lines)
