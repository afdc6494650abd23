"""A real library checkout with a real editable install, for prune and doctor tests.

A git repository of a small package, installed with ``pip install -e`` (setuptools,
PEP 660) into a fresh virtualenv: the same layout as a transformers clone installed for
porting work, made in about three seconds.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

FILES = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "toylib"
        version = "0.3.1"

        [tool.setuptools.packages.find]
        include = ["toylib*"]
    """,
    "toylib/__init__.py": """
        from .core import run_model
    """,
    "toylib/core.py": """
        def run_model(x):
            from .layers import attention
            return attention.sdpa_attention(x)
    """,
    "toylib/unused.py": """
        def never():
            return 0
    """,
    "toylib/layers/__init__.py": "",
    "toylib/layers/attention.py": """
        def sdpa_attention(x):
            return x * 2

        def eager_attention(x):
            return x * 2
    """,
    "toylib/layers/flash.py": """
        def flash_attention(x):
            return x
    """,
    "scripts/convert.py": """
        print("a tool, not part of the package")
    """,
}
SCRIPT = """
import sys
import toylib
print("result", toylib.run_model(21))
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


@dataclass
class EditableRepo:
    repo: Path
    venv_python: Path
    script: Path


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


def make_editable_repo(root: Path) -> EditableRepo:
    repo = root / "toylib-src"
    for name, text in FILES.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    git(repo, "config", "user.email", "test@example.com")
    git(repo, "config", "user.name", "Test")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "toylib")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # The build runs with this interpreter's setuptools; the install lands in the new venv.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--prefix",
            str(venv),
            "-e",
            str(repo),
        ],
        check=True,
        capture_output=True,
    )
    script = root / "use_toylib.py"
    script.write_text(SCRIPT.lstrip())
    return EditableRepo(repo, venv / "bin" / "python", script)
