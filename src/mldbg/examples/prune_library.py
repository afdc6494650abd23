"""The tutorial's library for ``mldbg prune``: a small package in its own git checkout.

A model library is thousands of files, of which a script runs a few dozen.  This one has
two model families and two attention kernels; the tutorial's script uses one of each, so
prune removes the other two.  Plain Python: it runs on either track.
"""

from __future__ import annotations

REPO = "minilib-src"  # the checkout, as a clone installed with `pip install -e` would be
SCRIPT = "use_minilib.py"
NEVER_RAN = ("minilib/flash_attention.py", "minilib/models/gpt.py")
RESTORED = "minilib/models/gpt.py"  # the file the tutorial brings back

FILES = {
    "pyproject.toml": """\
[project]
name = "minilib"
version = "0.1.0"
""",
    "minilib/__init__.py": """\
from .models import load_model
""",
    "minilib/attention.py": """\
import math


def sdpa_attention(q, k, v):
    scores = [qi * ki / math.sqrt(len(q)) for qi, ki in zip(q, k)]
    total = sum(math.exp(s) for s in scores)
    return [math.exp(s) / total * vi for s, vi in zip(scores, v)]
""",
    "minilib/flash_attention.py": """\
def flash_attention(q, k, v):
    raise NotImplementedError("needs a GPU kernel")
""",
    "minilib/models/__init__.py": """\
def load_model(name):
    if name == "llama":
        from .llama import Llama

        return Llama()
    from .gpt import Gpt

    return Gpt()
""",
    "minilib/models/llama.py": """\
from ..attention import sdpa_attention


class Llama:
    def forward(self, xs):
        return sdpa_attention(xs, xs, xs)
""",
    "minilib/models/gpt.py": """\
from ..flash_attention import flash_attention


class Gpt:
    def forward(self, xs):
        return flash_attention(xs, xs, xs)
""",
}

SCRIPT_TEXT = f"""\
import os
import sys

# the checkout on the path, as `pip install -e {REPO}` would put it
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "{REPO}"))

from minilib import load_model

print("llama", load_model("llama").forward([0.5, 1.0, 2.0]))
"""
