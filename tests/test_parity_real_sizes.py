"""Flux-class ports at FLUX.1's real depth and width (issue 33, item 6).

diffusers' ``FluxTransformer2DModel`` against the hand-written MLX port of
``parity_zoo.flux`` (same weights, the same dtype on both sides), at the defaults:

* **real depth**: 19 double and 38 single blocks at the zoo's tiny width (1,216 module
  calls a forward), in float32 and bfloat16;
* **real width**: one double and one single block at hidden 3,072 (24 heads of 128,
  4,096-dim text, 64 latent channels), here over 64 image and 16 text tokens: the
  weights and every per-token op are FLUX.1's, the token count is cut so that the suite
  stays short (``benchmarks/real_sizes.py`` runs 1,024 + 256 tokens and records the
  margins in docs/parity-precision.md).

Clean ports exit 0; a modulation shift/scale swap in one single block (the middle one)
is named there.  The margins (the culprit's ``headroom``, the clean port's largest) are
in docs/parity-precision.md, "Margins at a real model's size": at the real depth in
bfloat16 the bug sits at 2.1x its bound, below the 3x the issue asked for.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
pytest.importorskip("diffusers")

import mldbg  # noqa: E402
from mldbg.store import current_run  # noqa: E402
from parity_zoo import flux  # noqa: E402
from parity_zoo.core import ZooPort  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("home")]  # FLUX.1-sized models

WIDE = dataclasses.replace(flux.REAL_WIDTH, image_side=8, text_tokens=16)


def compared(z: ZooPort) -> dict[str, Any]:
    with mldbg.capture(z.ref, "ref") as cap:
        z.run_ref()
    assert not cap.errors, cap.errors
    current_run.reset()
    with mldbg.capture(z.port, "port") as cap:
        z.run_port()
    assert not cap.errors, cap.errors
    current_run.reset()
    return mldbg.compare("ref", "port").result


def verdict(result: dict[str, Any]) -> str:
    failing = [e for e in result["entries"] if not e["ok"]][:6]
    lines = [json.dumps(result["first_divergence"], default=str)[:600]]
    lines += [f"{e['name']} {e['rel_rms']:.3g} > {e['expected']:.3g}" for e in failing]
    return "\n".join(lines)


def largest_headroom(result: dict[str, Any]) -> float:
    return max((e.get("headroom") or 0.0) for e in result["entries"])


@pytest.mark.parametrize(
    ("sizes", "dtype"),
    [(flux.REAL_DEPTH, "float32"), (flux.REAL_DEPTH, "bfloat16"), (WIDE, "bfloat16")],
    ids=["depth-float32", "depth-bfloat16", "width-bfloat16"],
)
def test_a_clean_flux_at_real_size_agrees(sizes: flux.Sizes, dtype: str) -> None:
    result = compared(flux.build(dtype, None, sizes=sizes))
    assert result["ok"] and result["first_divergence"] is None, verdict(result)
    assert largest_headroom(result) < 1


@pytest.mark.parametrize(
    ("sizes", "dtype"),
    [(flux.REAL_DEPTH, "bfloat16"), (WIDE, "bfloat16")],
    ids=["depth-bfloat16", "width-bfloat16"],
)
def test_a_single_block_modulation_swap_is_named_at_real_size(
    sizes: flux.Sizes, dtype: str
) -> None:
    z = flux.build(dtype, "single_modulation", sizes=sizes)
    result = compared(z)
    culprit = result["first_divergence"]
    assert not result["ok"] and culprit is not None, verdict(result)
    assert culprit["module"] == z.culprit, verdict(result)
    # How far above its bound: 2.1x at the real depth in bfloat16 (the bound grows with
    # the 1,000 leaf calls before it), recorded in the README with the real width's.
    margin = min(e["headroom"] for e in result["entries"] if e["name"] in culprit["entries"])
    assert margin > 1.5, (margin, verdict(result))
