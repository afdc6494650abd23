"""The README's promises: its recipe works when pasted, its links lead somewhere, it stays
short, and every guide in ``docs/`` is reachable from it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The scripts the recipe names, and the bundled pair that stands in for them (the README
# says to run it that way: a PyTorch reference and its MLX port with one planted mistake).
BUNDLED = {
    "ref.py": ["-m", "mldbg.examples.parity_reference"],
    "port.py": ["-m", "mldbg.examples.parity_port"],
}


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def _recipe(title: str) -> list[list[str]]:
    """The first ``sh`` block of a README section, one command a line, comments dropped."""
    block = re.search(r"```sh\n(.*?)```", _section(title), re.S)
    assert block, f"no sh block under {title!r}"
    commands = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    return [c for c in commands if c]


def test_the_readme_is_short_and_leads_with_the_two_jobs() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert headings[:3] == ["Two commands", "Compare a port without editing it", "Debug a script"]
    # the parity recipe on the first screen
    recipe = text.index("mldbg start --capture ref")
    assert text[:recipe].count("\n") < 45


def test_every_link_of_the_readme_and_the_guides_leads_somewhere() -> None:
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}"


def test_every_guide_is_reachable_from_the_readme() -> None:
    linked = set(re.findall(r"\]\(docs/([^)#]+\.md)", README.read_text()))
    guides = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert guides - linked == set()


@pytest.mark.slow
def test_the_parity_recipe_works_as_pasted_on_the_bundled_pair(cli) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    pytest.importorskip("mlx.core")
    commands = _recipe("Compare a port without editing it")
    verbs = [c[1] for c in commands]
    assert verbs == ["start", "wait", "start", "wait", "compare", "line"], verbs
    answers = {}
    for command in commands:
        assert command[0] == "mldbg"
        argv = [word for w in command[1:] for word in BUNDLED.get(w, [w])]
        verb = command[1]
        proc = cli(*argv, expect=None)
        answers.setdefault(verb, []).append(proc)
        expected = 1 if verb == "compare" else 0  # a divergence exits 1
        assert proc.returncode == expected, f"{argv}: {proc.stdout}\n{proc.stderr}"
    assert all("exited (exit code 0)" in p.stdout for p in answers["wait"])
    verdict = answers["compare"][0].stdout
    assert "first divergence: layers.0.attn#0" in verdict
    assert "mldbg line ref port" in verdict  # the next step the verdict hands out
    line = answers["line"][0].stdout
    assert re.search(r"first wrong line \S*parity_port\.py:28\s+scores = ", line), line
