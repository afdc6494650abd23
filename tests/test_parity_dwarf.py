"""Why ``rules.DWARF`` (100) is a margin, not a constant tuned on one model (issue 20).

The growth rule lists an out-of-bound suspect as a note when a later suspect's own jump
is ``DWARF`` times its error.  The factor compares two *relative* errors, so it does not
depend on a model's scale or dtype; what it needs is that an earlier error reaches the
outputs about unchanged: relative errors pass through a module at most ``GROWTH`` times
(the growth rule's premise; clean ports measure x1 to x1.2 end to end).  Then fixing the
dwarfed error changes the outputs by at most ``GROWTH / DWARF`` (2%) of what the later
jump puts there: nothing a user would act on first.  A smaller factor would start hiding
real earlier bugs (two real bugs are 2x to 10x apart, never 100x); a larger one would let
rounding-level slips (1e-6..1e-4 relative) win over real bugs (0.1..1).

Each case below plants both in a real port, of two architectures (transformers Llama
against mlx-lm; diffusers Flux against the hand-written MLX DiT): a small slip early (a
norm eps, an embedding bias) and a real bug later (a forgotten attention scale, RoPE
pairs).  It measures what the premise claims, on the port's actual outputs: how much the
slip changes them (the port with the slip against the port without it) against the slip's
own error and against the later bug's effect.  And when the earlier error is a real bug
too (within ``DWARF`` of the later jump), the earlier one is named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")
pytest.importorskip("diffusers")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("home"),
]  # real transformers, mlx-lm and diffusers models

import mldbg  # noqa: E402
from mldbg.compare.culprit.rules import DWARF  # noqa: E402
from mldbg.compare.judge.bounds import GROWTH  # noqa: E402
from mldbg.store import current_run  # noqa: E402
from parity_zoo import flux, llama_family  # noqa: E402
from parity_zoo.core import ZooPort, as_numpy  # noqa: E402


def llama_slip(eps: float) -> Callable[[ZooPort], str]:
    def plant(z: ZooPort) -> str:
        z.port.model.layers[0].input_layernorm.eps = eps
        return "model.layers.0.input_layernorm"

    return plant


def flux_slip(shift: float) -> Callable[[ZooPort], str]:
    def plant(z: ZooPort) -> str:
        z.port.x_embedder.bias = z.port.x_embedder.bias + shift
        return "x_embedder"

    return plant


def llama(bug: str) -> ZooPort:
    return llama_family.build("llama", "float32", bug)


def flux_port(bug: str) -> ZooPort:
    return flux.build("float32", bug)


CASES = {
    "llama": (llama, "attn_scale", llama_slip),
    "flux": (flux_port, "rope", flux_slip),
}
SLIPS = {"llama": 1e-4, "flux": 1e-4}  # rounding-level: 1e-5..1e-4 relative
BUGS = {"llama": 0.3, "flux": 0.1}  # a real bug: an eps of 0.3, a bias shift of 0.1


def outputs(z: ZooPort) -> np.ndarray:
    return as_numpy(z.run_port()).astype(np.float64)


def compared(z: ZooPort, name: str) -> dict[str, Any]:
    with mldbg.capture(z.ref, "ref"):
        reference = as_numpy(z.run_ref()).astype(np.float64)
    current_run.reset()
    with mldbg.capture(z.port, name):
        z.run_port()
    current_run.reset()
    result = mldbg.compare("ref", name).result
    result["reference"] = reference
    return result


@pytest.mark.parametrize("arch", sorted(CASES))
def test_a_dwarfed_slip_changes_the_outputs_by_a_few_percent_of_the_later_bug(arch: str) -> None:
    build, bug, slip = CASES[arch]
    both = build(bug)
    slipped = slip(SLIPS[arch])(both)
    result = compared(both, "both")
    culprit = result["first_divergence"]
    assert culprit["module"] == both.culprit, culprit
    note = next(n for n in result["notes"] if n["module"] == slipped)
    assert "dwarfs" in note["note"]
    # The premise, measured on the outputs: the slip's effect there against its own error
    # and against the later bug's effect (the same port without the slip).
    alone = build(bug)
    reference = result["reference"]
    scale = float(np.linalg.norm(reference))
    slip_effect = float(np.linalg.norm(outputs(both) - outputs(alone))) / scale
    bug_effect = float(np.linalg.norm(outputs(alone) - reference)) / scale
    assert slip_effect <= GROWTH * note["rel_rms"], (slip_effect, note["rel_rms"])
    assert slip_effect <= GROWTH / DWARF * bug_effect, (slip_effect, bug_effect)


@pytest.mark.parametrize("arch", sorted(CASES))
def test_an_earlier_real_bug_is_named_even_with_a_larger_one_later(arch: str) -> None:
    build, bug, slip = CASES[arch]
    both = build(bug)
    earlier = slip(BUGS[arch])(both)
    result = compared(both, "both")
    assert result["first_divergence"]["module"] == earlier, result["first_divergence"]
