"""Each rule of the verdict (``mldbg.compare.culprit.rules``) on its own, on small hand-made
evidence: a capture's calls (order, nesting, call sites) and judged entries, as compare
builds them.  The end-to-end tests (test_parity_ports, test_parity_pipelines) check the
same rules on real models; these pin down what each rule decides and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mldbg.compare.culprit.rules import (
    DWARF,
    RULES,
    Evidence,
    Verdict,
    agreement,
    first_divergence,
    glue,
    growth,
    pairing,
)
from mldbg.compare.read.sources import Call, Source

BOUND = 1e-6


class Trace:
    """Calls in execution order: ``enter``/``leave`` give each its start and end order."""

    def __init__(self) -> None:
        self.source = Source("a", "capture", Path("."), "a")
        self.order = 0
        self.results: list[dict[str, Any]] = []

    def call(
        self, module: str, index: int = 0, parent: Call | None = None, site: str | None = None
    ) -> Call:
        call = Call(
            module,
            index,
            seq=len(self.source.calls),
            parent=None if parent is None else parent.seq,
            start_order=self.tick(),
            site=site,
        )
        self.source.calls[(module, index)] = call
        return call

    def end(self, call: Call) -> None:
        call.end_order = self.tick()

    def tick(self) -> int:
        self.order += 1
        return self.order

    def entry(self, call: Call, role: str, rel: float, key: str = "0") -> None:
        name = f"{call.module}#{call.call}.{role}" + (f".{key}" if role == "in" else "")
        ok = rel <= BOUND
        self.results.append(
            {
                "name": name,
                "module": call.module,
                "call": call.call,
                "role": role,
                "ok": ok,
                "scale_ok": ok,
                "rel_rms": rel,
                "max_abs": rel,
                "expected": BOUND,
                "expected_local": BOUND,
                "dtype_a": "F32",
                "dtype_b": "F32",
                "shape_a": [4],
                "head_a": [1.0],
                "head_b": [1.0 + rel],
            }
        )


def chain(errors: list[tuple[float, float]], model_out: float) -> Trace:
    """A root calling leaves ``m0, m1, ...`` in turn, each with (input, output) error."""
    t = Trace()
    root = t.call("<root>")
    t.entry(root, "in", 0.0)
    for i, (err_in, err_out) in enumerate(errors):
        leaf = t.call(f"m{i}", parent=root)
        t.entry(leaf, "in", err_in)
        t.end(leaf)
        t.entry(leaf, "out", err_out)
    t.end(root)
    t.entry(root, "out", model_out)
    return t


def test_the_rules_apply_in_the_documented_order() -> None:
    assert [name for name, _ in RULES] == [
        "pairing",
        "agreement",
        "unstructured",
        "boundary",
        "glue",
        "growth",
        "quantized",
        "replay",
        "fallback",
    ]


def test_agreement_decides_only_when_nothing_fails() -> None:
    clean = chain([(0.0, 0.0)], 0.0)
    assert agreement(Evidence(clean.source, clean.results), Verdict()) is not None
    broken = chain([(0.0, 0.1)], 0.1)
    assert agreement(Evidence(broken.source, broken.results), Verdict()) is None


def test_growth_names_the_first_unexplained_jump() -> None:
    t = chain([(0.0, 0.0), (0.0, 0.05), (0.05, 0.06)], 0.06)
    verdict = growth(Evidence(t.source, t.results), Verdict())
    assert verdict is not None and verdict.culprit is not None
    assert verdict.culprit["module"] == "m1"  # m2 passes m1's error on: a victim
    assert verdict.notes == []


def test_a_small_jump_dwarfed_by_a_later_one_is_a_note() -> None:
    """m0's out-of-bound error (1e-5) is DWARF x smaller than m1's own jump: the output's
    error is m1's, so m1 is the culprit and m0 a note."""
    small = 1e-5
    t = chain([(0.0, small), (small, 0.2)], 0.2)
    verdict = first_divergence(t.source, t.results)
    assert verdict.culprit is not None and verdict.culprit["module"] == "m1"
    assert [n["module"] for n in verdict.notes] == ["m0"]
    assert "dwarfs" in verdict.notes[0]["note"]
    # Not dwarfed: a later jump less than DWARF x larger leaves the first suspect named.
    t = chain([(0.0, 0.01), (0.01, 0.01 * DWARF / 2)], 0.5)
    assert first_divergence(t.source, t.results).culprit["module"] == "m0"  # type: ignore[index]


def test_a_difference_that_dies_out_before_the_outputs_is_a_note() -> None:
    """m0's output differs, nothing computed after it does, the model's output agrees."""
    t = chain([(0.0, 0.01), (0.0, 0.0)], 0.0)
    verdict = first_divergence(t.source, t.results)
    assert verdict.culprit is None
    assert [n["module"] for n in verdict.notes] == ["m0"]
    # When something after it differs, it reaches on: named, even if the output passes.
    t = chain([(0.0, 0.01), (0.01, 0.01)], 0.0)
    assert first_divergence(t.source, t.results).culprit["module"] == "m0"  # type: ignore[index]


def loop(second_input: float, *, sites: bool = True) -> Trace:
    """A model called twice by the script; each call has one leaf."""
    t = Trace()
    for index in (0, 1):
        root = t.call("<root>", index, site="ref.py:7" if sites else None)
        t.entry(root, "in", second_input if index == 1 else 0.0)
        leaf = t.call("m", index, parent=root)
        t.entry(leaf, "in", second_input if index == 1 else 0.0)
        t.end(leaf)
        t.entry(leaf, "out", second_input if index == 1 else 0.0)
        t.end(root)
        t.entry(root, "out", second_input if index == 1 else 0.0)
    return t


def test_glue_names_the_calls_between_which_the_difference_enters() -> None:
    t = loop(0.3)
    evidence = Evidence(t.source, t.results, b_sites={("<root>", 0): "port.py:3"})
    verdict = glue(evidence, Verdict())
    assert verdict is not None and verdict.culprit is not None
    assert verdict.culprit["name"] == "<root>#1"
    assert verdict.culprit["glue"]["after"] == {
        "call": "<root>#0",
        "site_a": "ref.py:7",
        "site_b": "port.py:3",
    }
    assert verdict.culprit["glue"]["input"]["head_b"] == [1.3]
    # The whole decision: glue, not growth (every later output only follows its input).
    assert first_divergence(t.source, t.results).rule == "glue"


def test_glue_stays_silent_when_a_call_before_already_differs() -> None:
    t = loop(0.3)
    first_out = next(r for r in t.results if r["name"] == "m#0.out")
    first_out.update(ok=False, scale_ok=False, rel_rms=0.3)
    assert glue(Evidence(t.source, t.results), Verdict()) is None
    assert first_divergence(t.source, t.results).culprit["module"] == "m"  # type: ignore[index]


def test_too_few_pairs_name_no_culprit_and_point_to_the_map() -> None:
    """1 of 77 entries paired (other module names): blaming the one that did (the root)
    would be a guess; the verdict says why there is none."""
    t = chain([(0.0, 0.1)], 0.1)
    evidence = Evidence(t.source, t.results, paired=(1, 77))
    verdict = pairing(evidence, Verdict())
    assert verdict is not None and verdict.culprit is None
    assert verdict.undecided is not None and "1 of 77" in verdict.undecided
    assert "a map" in verdict.undecided and "proposed_map" in verdict.undecided
    decided = first_divergence(t.source, t.results, paired=(1, 77))
    assert decided.culprit is None and decided.rule == "pairing"
    assert pairing(Evidence(t.source, t.results), Verdict()) is None  # enough pairs


def test_a_reference_child_the_port_computes_inline_is_named_on_the_culprit() -> None:
    """The reference's MLP calls ``act_fn``; the port has no such module (it applies the
    activation inline): the culprit (the MLP) says where to look."""
    t = Trace()
    root = t.call("<root>")
    t.entry(root, "in", 0.0)
    mlp = t.call("mlp", parent=root)
    t.entry(mlp, "in", 0.0)
    for name in ("mlp.up", "mlp.act_fn", "mlp.down"):
        child = t.call(name, parent=mlp)
        t.end(child)
    t.end(mlp)
    t.entry(mlp, "out", 0.2)
    t.end(root)
    t.entry(root, "out", 0.2)
    b_modules = {"<root>", "mlp", "mlp.up", "mlp.down"}
    verdict = first_divergence(t.source, t.results, b_calls=b_modules, b_modules=b_modules)
    assert verdict.culprit is not None and verdict.culprit["module"] == "mlp"
    assert verdict.culprit["unpaired_children"] == ["mlp.act_fn"]
    assert "computes inline" in verdict.culprit["hint"]


def test_different_first_inputs_are_said_plainly_with_the_call_site() -> None:
    """The very first call's inputs differ (another prompt, another seed): no module is
    to blame; the verdict says so and where each script made the call."""
    t = Trace()
    root = t.call("<root>", 0, site="ref.py:7")
    t.entry(root, "in", 0.5)
    leaf = t.call("m", 0, parent=root)
    t.entry(leaf, "in", 0.5)
    t.end(leaf)
    t.entry(leaf, "out", 0.5)
    t.end(root)
    t.entry(root, "out", 0.5)
    verdict = first_divergence(t.source, t.results, b_sites={("<root>", 0): "port.py:9"})
    assert verdict.rule == "glue" and verdict.culprit is not None
    assert "given different inputs" in verdict.culprit["reason"]
    assert verdict.culprit["glue"]["after"] is None
    assert verdict.culprit["glue"]["before"] == {
        "call": "<root>#0",
        "site_a": "ref.py:7",
        "site_b": "port.py:9",
    }
