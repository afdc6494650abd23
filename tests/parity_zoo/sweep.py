"""Every zoo case over other seeds: does a verdict depend on one draw of weights and inputs?

    .venv/bin/python tests/parity_zoo/sweep.py --seeds 1,2,3     # ~75 s per seed here
    .venv/bin/python tests/parity_zoo/sweep.py --seeds 4 --arch pixart --arch flux

The test suite builds every case with seed 0.  A verdict that holds only for that draw
(a bug whose effect happens to clear one bound, a clean port whose error happens to sit
under one) is the kind of failure a user's own model shows first, so this runs each case
with other seeds the way a user does: the reference captured with its sensitivity
measured, the port without (compare reads the reference's), then ``mldbg.compare`` at its
defaults.  A clean port must pass with no culprit; a bugged one must fail with its
builder's culprit.  It prints each wrong verdict and exits 1 when there is one; it is a
check to run after changing the verdict, not part of the suite (it takes minutes).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parity_zoo import Case

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the zoo's package


def wrong_verdict(case: Case, seed: int) -> str | None:
    """Why this case's verdict is wrong with this seed, or None when it is right."""
    import mldbg
    from mldbg.store import current_run
    from parity_zoo import build

    current_run.reset()
    zoo = build(case, seed=seed)
    with mldbg.capture(zoo.ref, "ref"):
        zoo.run_ref()
    with mldbg.capture(zoo.port, "port", sensitivity=False):
        zoo.run_port()
    result = mldbg.compare("ref", "port", map=zoo.map).result
    culprit = result["first_divergence"]
    named = culprit["module"] if culprit else None
    if zoo.culprit is None:
        if result["ok"] and culprit is None:
            return None
        failing = [e["name"] for e in result["entries"] if not e["ok"]][:3]
        return f"clean port failed: culprit {named}, failing {failing}"
    if not result["ok"] and named == zoo.culprit:
        return None
    return f"wants {zoo.culprit}, named {named} (ok={result['ok']}, {result['decided_by']})"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    parser.add_argument("--arch", action="append", help="only this architecture; repeatable")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    import os

    os.environ["MLDBG_HOME"] = tempfile.mkdtemp(prefix="mldbg-zoo-sweep-")
    from parity_zoo import all_cases

    cases = all_cases(tuple(args.arch) if args.arch else None)
    started, wrong, done = time.perf_counter(), 0, 0
    for seed in seeds:
        for case in cases:
            try:
                why = wrong_verdict(case, seed)
            except Exception as exc:  # a case that cannot run is wrong too
                why = f"error: {type(exc).__name__}: {exc}"
            done += 1
            if why is not None:
                wrong += 1
                print(f"seed {seed} {case}: {why}", flush=True)
    seconds = time.perf_counter() - started
    print(
        f"{done} verdicts ({len(cases)} cases x {len(seeds)} seeds) in {seconds:.0f} s: {wrong} wrong"
    )
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
