"""``mldbg profile``: real scripts in real interpreters, counts checked against the code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import find_python, line_of

LLAMA = """
import sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
config._attn_implementation = sys.argv[1]
torch.manual_seed(0)
model = LlamaForCausalLM(config).eval()
with torch.no_grad():
    for _ in range(2):
        out = model(torch.arange(8).unsqueeze(0))
print("logits", tuple(out.logits.shape))
"""


def _variant(result: dict, name: str) -> dict:
    for group in result["variants"]:
        if any(m["name"] == name for m in group["members"]):
            return group
    raise AssertionError(f"no look-alike group holds {name}: {result['variants']}")


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_transformers_llama_names_the_attention_that_ran(cli, write, attention: str) -> None:
    pytest.importorskip("transformers")
    write("llama_script.py", LLAMA)
    result = cli(
        "profile", "--include", "transformers", "llama_script.py", attention, json_out=True
    )
    assert result["exit_code"] == 0 and "logits (1, 8, 64)" in result["output_tail"]
    assert result["args"] == [attention]
    paths = [f["path"] for f in result["files"]]
    modeling = next(p for p in paths if p.endswith("models/llama/modeling_llama.py"))
    assert Path(modeling).is_absolute() and Path(modeling).exists()
    assert all("/transformers/" in p for p in paths)  # --include kept the scope
    assert result["read_first"][0] == modeling
    entry = next(f for f in result["files"] if f["path"] == modeling)
    assert entry["component"] == "transformer/DiT" and entry["package"] == "transformers"
    by_name = {fn["name"]: fn["calls"] for fn in entry["top_functions"]}
    # 3 layers x 2 norms + the final norm, two forward passes: counted exactly.
    assert by_name.get("LlamaRMSNorm.forward") == 14, entry["top_functions"]

    group = _variant(result, "sdpa_attention_forward")
    assert group["pattern"] == "*_attention_forward"
    ran = "sdpa_attention_forward" if attention == "sdpa" else "eager_attention_forward"
    other = "eager_attention_forward" if attention == "sdpa" else "sdpa_attention_forward"
    assert ran in group["ran"] and other in group["not_run"]
    member = next(m for m in group["members"] if m["name"] == ran)
    assert member["calls"] == 6  # 3 layers, 2 passes
    classes = _variant(result, "LlamaAttention")
    assert "LlamaAttention" in classes["ran"]

    report = Path(result["report"])
    assert report.parent == Path(result["run_dir"]) and report.name.startswith(
        "PROFILE_REPORT_llama_script_"
    )
    text = report.read_text()
    assert "Where to put breakpoints and what to read first" in text.split("\n## ")[0]
    assert modeling in text and ran in text
    run = json.loads((Path(result["run_dir"]) / "run.json").read_text())
    assert run["kind"] == "profile" and run["exit_code"] == 0
    if attention == "sdpa":
        human = cli("profile", "--include", "transformers", "llama_script.py", attention).stdout
        assert "read first" in human and "report:" in human and ran in human


PACKAGE_INIT = """
from . import kernels
"""
KERNELS = """
CALLS_AT_IMPORT = [len(str(i)) for i in range(50)]

def fast_attention_forward(x):
    return x + 1

def slow_attention_forward(x):
    return x - 1

class FastAttention:
    def forward(self, x):
        return fast_attention_forward(x)

class SlowAttention:
    def forward(self, x):
        return slow_attention_forward(x)
"""
MAIN = """
import sys
from toypkg.kernels import FastAttention

def helper(i):
    return i * 2

layer = FastAttention()
total = sum(layer.forward(helper(i)) for i in range(7))
print("total", total, sys.argv[1:])
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("version", ["3.12", "3.10"])
def test_counts_are_exact_on_both_backends(cli, write, tmp_path: Path, version: str) -> None:
    python = find_python(version)
    if python is None:
        pytest.skip(f"no Python {version}")
    write("toypkg/__init__.py", PACKAGE_INIT)
    kernels = write("toypkg/kernels.py", KERNELS)
    write("main.py", MAIN)
    result = cli("profile", "--python", python, "main.py", "3", "--flag", json_out=True)
    assert result["backend"] == ("monitoring" if version == "3.12" else "setprofile")
    assert result["python_version"].startswith(version)
    assert result["exit_code"] == 3 and "total 49 ['3', '--flag']" in result["output_tail"]
    files = {f["path"]: f for f in result["files"]}
    entry = files[str(kernels.resolve())]
    calls = {fn["name"]: fn["calls"] for fn in entry["top_functions"]}
    assert calls == {"FastAttention.forward": 7, "fast_attention_forward": 7}
    # The list comprehension ran while importing: import time, not what the script ran.
    assert entry["calls"] == 14 and entry["package"] == "toypkg"
    script = files[str((tmp_path / "main.py").resolve())]
    assert script["package"] == "(script)"
    assert {fn["name"]: fn["calls"] for fn in script["top_functions"]}["helper"] == 7
    group = _variant(result, "fast_attention_forward")
    assert group["ran"] == ["fast_attention_forward"]
    assert group["not_run"] == ["slow_attention_forward"]
    classes = _variant(result, "SlowAttention")
    assert classes["ran"] == ["FastAttention"] and classes["not_run"] == ["SlowAttention"]
    assert classes["members"][0]["line"] == line_of(kernels, "class FastAttention")


def test_bad_input_and_crashing_scripts(cli, write) -> None:
    error = cli("profile", "missing.py", json_out=True, expect=1)
    assert error["code"] == "file_not_found" and "missing.py" in error["error"]
    error = cli("profile", "--python", "/no/such/python", "x.py", json_out=True, expect=1)
    assert error["code"] == "file_not_found"
    write("boom.py", "def f():\n    raise ValueError('boom')\nf()\n")
    result = cli("profile", "boom.py", json_out=True)
    assert result["exit_code"] == 1 and "ValueError: boom" in result["exception"]
    assert "ValueError: boom" in result["output_tail"]
    write("quiet.py", "print('hi')\n")
    result = cli("profile", "--include", "not_a_package_here", "quiet.py", json_out=True)
    assert result["include_unmatched"] == ["not_a_package_here"] and result["files"] == []


MODELING = """
def rotate(x):
    return -x


def scale(x):
    return x * 0.5


def gate(x):
    return max(x, 0)


def norm(x):
    return x / 2


class ToyAttention:
    def forward(self, xs):
        return [rotate(scale(gate(norm(x)))) for x in xs]


class ToyBlock:
    def __init__(self):
        self.attn = ToyAttention()

    def forward(self, xs):
        return self.attn.forward(xs)


class ToyModel:
    def __init__(self):
        self.blocks = [ToyBlock(), ToyBlock()]

    def forward(self, xs):
        for block in self.blocks:
            xs = block.forward(xs)
        return xs
"""


def test_breakpoints_include_the_models_forward_methods(cli, write) -> None:
    """The most-called functions of a modeling file are its helpers (called per element);
    the model's ``forward`` methods run a few times each, and are where a person stops
    first: the suggestions name them too."""
    write("toymodels/__init__.py", "")
    modeling = write("toymodels/modeling_toy.py", MODELING)
    write(
        "run_toy.py",
        "from toymodels.modeling_toy import ToyModel\nprint(ToyModel().forward(list(range(50))))\n",
    )
    result = cli("profile", "--include", "toymodels", "run_toy.py", json_out=True)
    suggested = {bp["function"]: bp["location"] for bp in result["breakpoints"]}
    for method in ("ToyModel.forward", "ToyBlock.forward", "ToyAttention.forward"):
        line = line_of(modeling, f"class {method.split('.')[0]}")
        assert method in suggested, result["breakpoints"]
        defined = int(suggested[method].rsplit(":", 1)[1])
        assert line < defined <= line + 6  # the method's own def, in its class
    assert {"rotate", "scale"} & set(suggested)  # the most-called ones still too
    text = Path(result["report"]).read_text()
    assert "ToyModel.forward" in text.split("## Where to put breakpoints")[1].split("##")[0]
