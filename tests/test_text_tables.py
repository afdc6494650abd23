"""Tables on an 80-column terminal: a name is never split, the rows fit the terminal.

Each table a command prints is rendered by its real renderer on a real rich terminal
console 80 columns wide, with names long enough that the old tables folded them
mid-word.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mldbg.text import compare as compare_render
from mldbg.text import render
from mldbg.text.console import captured
from test_compare_html import realistic_result

WIDTH = 80
MODULE = "model.language_model.layers.17.self_attention.rotary_embedding_q"  # 63 characters
RUN = "llama_generation_script-20261128-101010-123456"


def compare_result() -> dict[str, Any]:
    result = realistic_result()
    for i, entry in enumerate(result["entries"]):
        entry["name"] = f"{MODULE}.{i}#0.out"
    return result


SHOWN = [e["name"] for e in compare_result()["entries"] if e.get("role") != "in"]
# what compare prints around its table, one line each whatever the width
OUTSIDE = ("A ", "B ", "warning:", "only in ", "first divergence")


def shown(show: Callable[[], None]) -> list[str]:
    with captured(WIDTH, terminal=True) as buffer:
        show()
    return buffer.getvalue().splitlines()


def assert_whole(lines: list[str], names: list[str]) -> None:
    for name in names:
        assert any(name in line for line in lines), f"{name!r} split or cut:\n" + "\n".join(lines)


TABLES: dict[str, tuple[Callable[[], None], list[str]]] = {
    "compare": (
        lambda: compare_render.show(compare_result(), show_all=True),
        SHOWN,
    ),
    "module-table": (
        lambda: render.module_rows(
            {
                "rows": [
                    {
                        "module": MODULE,
                        "call": 0,
                        "depth": 0,
                        "class": "RotaryEmbeddingWithLongName",
                        "a": {
                            "seconds": 0.0123,
                            "self_seconds": 0.001,
                            "in_dtypes": ["bfloat16", "float32"],
                            "out_dtypes": ["bfloat16"],
                        },
                        "b": {
                            "seconds": 0.02,
                            "self_seconds": 0.002,
                            "in_dtypes": ["bfloat16"],
                            "out_dtypes": ["float32"],
                        },
                        "time_ratio": 1.6,
                        "dtype_differs": True,
                    }
                ],
                "b": {"label": "port"},
            }
        ),
        [f"{MODULE}#0"],
    ),
    "runs": (
        lambda: render.runs(
            {
                "runs": [
                    {
                        "run_id": RUN,
                        "state": "exited",
                        "exit_code": 0,
                        "checkpoints": 12,
                        "size_bytes": 123456789,
                        "script": "/home/someone/projects/port/scripts/" + "generate_" * 4 + ".py",
                    }
                ],
                "home": "/x",
            }
        ),
        [RUN],
    ),
    "captures": (
        lambda: render_captures(),
        ["reference_capture_of_the_language_model.2", RUN],
    ),
    "tensors": (
        lambda: render.tensors(
            {
                "path": "/x/tensors",
                "size_bytes": 10,
                "tensors": [
                    {
                        "name": "decoder.layers.31.hidden_states_after_attention",
                        "dtype": "bfloat16",
                        "shape": [1, 4096, 4096],
                        "size_bytes": 33554432,
                        "metadata": {
                            "framework": "torch",
                            "saved_at": "2026-11-28T10:10:10.123456+00:00",
                        },
                    }
                ],
            }
        ),
        ["decoder.layers.31.hidden_states_after_attention"],
    ),
    "vars": (
        lambda: render.variables(
            {
                "variables": [
                    {
                        "name": "hidden_states_after_the_rotary_embedding",
                        "scope": "local",
                        "type": "torch.Tensor",
                        "summary": "bfloat16[1, 4096, 4096] cpu mean=0.001 std=1.02 " * 2,
                    }
                ]
            }
        ),
        ["hidden_states_after_the_rotary_embedding"],
    ),
}


def render_captures() -> None:
    compare_render.captures(
        {
            "captures": [
                {
                    "name": "reference_capture_of_the_language_model.2",
                    "run_id": RUN,
                    "framework": "torch",
                    "state": "complete",
                    "records": 1234,
                    "tensors": 5678,
                    "bytes": 98765432,
                    "model_class": "LlamaForCausalLMWithAVeryLongName",
                }
            ],
            "home": "/x",
        }
    )


@pytest.mark.parametrize("table", sorted(TABLES))
def test_names_are_never_split_and_rows_fit(table: str) -> None:
    show, names = TABLES[table]
    lines = shown(show)
    assert_whole(lines, names)
    table = [line for line in lines if not line.startswith(OUTSIDE) and "agree" not in line]
    wide = [line for line in table if len(line.rstrip()) > WIDTH]
    assert not wide, f"{len(wide)} line(s) wider than {WIDTH}:\n" + "\n".join(wide)
