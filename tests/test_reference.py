"""The verb reference (docs/reference.md) is generated from the verb table and kept fresh."""

from __future__ import annotations

import re
from pathlib import Path

from mldbg import verbs
from mldbg.text.reference import reference

PAGE = Path(__file__).parent.parent / "docs" / "reference.md"


def test_the_committed_reference_is_what_the_verb_table_says() -> None:
    assert PAGE.read_text(encoding="utf-8") == reference(), (
        "docs/reference.md is stale: python -m mldbg.text.reference > docs/reference.md"
    )


def test_every_verb_argument_and_error_code_is_in_the_reference() -> None:
    page = reference()
    for verb in verbs.VERBS:
        section = page[page.index(f"## {verb.name}\n") :]
        section = section[: section.find("\n## ", 1)]
        assert re.search(rf"`{verb.method} /v1/", section), verb.name
        for arg in verb.args:
            if arg.cli or arg.mcp:
                assert f"| `{arg.name}` |" in section, (verb.name, arg.name)
        for code in verb.all_errors:
            assert f"`{code}`" in section, (verb.name, code)
