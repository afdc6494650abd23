"""Ratchets that only tighten: `make lint` fails when one grows.

* **Complex blocks**: functions and methods radon grades D or worse (cyclomatic complexity
  21 and up) may not grow in number, and none may be F (41 and up).
* **`Any` lines**: lines of src/mldbg that name ``typing.Any`` may not grow in number.

The ceilings live in ``scripts/ratchets.json``.  When a count falls below its ceiling,
lower the ceiling in the same commit (this script says so), so the next change cannot
spend the room.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from radon.complexity import cc_rank, cc_visit

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "mldbg"
CEILINGS = Path(__file__).with_name("ratchets.json")
ANY = re.compile(r"\bAny\b")


def complex_blocks() -> list[tuple[str, str]]:
    """``(place, rank)`` of every block graded D or worse."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for block in cc_visit(path.read_text(encoding="utf-8")):
            rank = cc_rank(block.complexity)
            if rank in "DEF":
                where = f"{path.relative_to(ROOT)}:{block.lineno} {block.fullname}"
                found.append((f"{where} ({block.complexity})", rank))
    return found


def any_lines() -> int:
    return sum(
        1
        for path in SRC.rglob("*.py")
        for line in path.read_text(encoding="utf-8").splitlines()
        if ANY.search(line)
    )


def main() -> int:
    ceilings = json.loads(CEILINGS.read_text(encoding="utf-8"))
    blocks = complex_blocks()
    counts = {"complex_blocks": len(blocks), "any_lines": any_lines()}
    failed = False
    graded_f = [place for place, rank in blocks if rank == "F"]
    if graded_f:
        failed = True
        print("radon grades these F (split them into named steps):", *graded_f, sep="\n  ")
    for name, count in counts.items():
        ceiling = ceilings[name]
        if count > ceiling:
            failed = True
            print(f"{name}: {count}, over its ceiling of {ceiling}")
            if name == "complex_blocks":
                print("  blocks graded D or worse:", *(p for p, _ in blocks), sep="\n  ")
        elif count < ceiling:
            print(f"{name}: {count}, under its ceiling of {ceiling}: lower it in {CEILINGS.name}")
        else:
            print(f"{name}: {count} (ceiling {ceiling})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
