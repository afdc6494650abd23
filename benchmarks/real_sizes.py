"""Parity verdicts at FLUX.1's real sizes, and their margins (issue 33, item 6).

    .venv/bin/python benchmarks/real_sizes.py                    # depth and width, fp32 and bf16
    .venv/bin/python benchmarks/real_sizes.py --only depth --dtype bfloat16
    .venv/bin/python benchmarks/real_sizes.py --tokens 64,16     # width at fewer tokens

diffusers' ``FluxTransformer2DModel`` against the hand-written MLX port of
``tests/parity_zoo/flux.py`` (same weights, the same dtype on both sides), captured and
compared at the defaults:

* ``depth``: 19 double and 38 single blocks at the zoo's tiny width (1,216 module calls);
* ``width``: one double and one single block at hidden 3,072 (24 heads of 128, 4,096-dim
  text, 64 latent channels) over 1,024 image and 256 text tokens (``--tokens`` cuts
  them: the test suite runs 64 + 16, ``tests/test_parity_real_sizes.py``).

For each it runs the clean port and a port whose middle single block reads its shift and
scale swapped, and prints the margins: the clean port's largest ``headroom`` (its error
over its bound, anywhere: below 1 passes) and the bug's (the culprit's entries' error
over their bound: how far above the bound the verdict sits), with a warning where the
bug's margin is below 3x.  docs/parity-precision.md ("Margins at a real model's size")
records a run.  It exits non-zero only when something fails to run, never because a
verdict is wrong (it says so).  This is CPU work: the width at 1,280 tokens takes minutes per dtype.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

MIN_MARGIN = 3.0  # a bug below this many times its bound is too close to call


def margins(result: dict[str, Any]) -> tuple[float, float | None]:
    """(largest headroom of any entry, smallest headroom among the culprit's entries)."""
    entries = result["entries"]
    largest = max((e.get("headroom") or 0.0) for e in entries)
    culprit = result["first_divergence"]
    if culprit is None:
        return largest, None
    named = [e.get("headroom") or 0.0 for e in entries if e["name"] in culprit["entries"]]
    return largest, (min(named) if named else None)


def run(label: str, sizes: Any, dtype: str) -> list[str]:
    import mldbg
    from mldbg.store import current_run
    from parity_zoo import flux

    lines = []
    began = time.perf_counter()
    clean = flux.build(dtype, None, sizes=sizes)
    bug = flux.build(dtype, "single_modulation", sizes=sizes)
    with mldbg.capture(clean.ref, "ref"):
        clean.run_ref()
    current_run.reset()
    for name, z in (("clean", clean), ("bug", bug)):
        with mldbg.capture(z.port, name):
            z.run_port()
        current_run.reset()
    clean_result = mldbg.compare("ref", "clean").result
    bug_result = mldbg.compare("ref", "bug").result
    clean_largest, _ = margins(clean_result)
    _, bug_margin = margins(bug_result)
    culprit = bug_result["first_divergence"]
    named = culprit is not None and culprit["module"] == bug.culprit
    lines.append(
        f"{label:6} {dtype:9} clean: {'exit 0' if clean_result['ok'] else 'FAILS'}, largest "
        f"error/bound {clean_largest:.3g}; bug: "
        + (
            f"named ({culprit['module']}), error/bound {bug_margin:.3g}"
            if named and bug_margin is not None
            else f"NOT named ({culprit['module'] if culprit else 'no culprit'})"
        )
        + f"  [{time.perf_counter() - began:.0f} s]"
    )
    if named and bug_margin is not None and bug_margin < MIN_MARGIN:
        lines.append(f"  margin below {MIN_MARGIN:.0f}x: {bug_margin:.3g}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", choices=("depth", "width"), help="one of the two sizes")
    parser.add_argument(
        "--dtype", action="append", choices=("float32", "bfloat16"), help="repeatable"
    )
    parser.add_argument(
        "--tokens", default="1024,256", help="image,text tokens of the width run (squares)"
    )
    args = parser.parse_args()
    os.environ.setdefault("MLDBG_HOME", tempfile.mkdtemp(prefix="mldbg-real-sizes-"))
    from parity_zoo import flux

    image, text = (int(n) for n in args.tokens.split(","))
    side = int(round(image**0.5))
    width = dataclasses.replace(flux.REAL_WIDTH, image_side=side, text_tokens=text)
    sizes = {"depth": flux.REAL_DEPTH, "width": width}
    for label, chosen in sizes.items():
        if args.only not in (None, label):
            continue
        for dtype in args.dtype or ["float32", "bfloat16"]:
            for line in run(label, chosen, dtype):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
