"""``mldbg prune``: a real git checkout with a real editable install, made in the test."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from editable_repo import EditableRepo, git, make_editable_repo


@pytest.fixture
def lib(tmp_path: Path) -> EditableRepo:
    return make_editable_repo(tmp_path)


def files_on(repo: Path, ref: str) -> set[str]:
    return set(git(repo, "ls-tree", "-r", "--name-only", ref).split())


def test_prune_keeps_what_ran_and_never_touches_the_work_tree(cli, lib: EditableRepo) -> None:
    repo, py, script = str(lib.repo), str(lib.venv_python), str(lib.script)
    error = cli("prune", "run", "--repo", repo, "--python", py, script, json_out=True, expect=1)
    assert error["code"] == "not_set_up" and "mldbg prune setup" in error["error"]

    made = cli("prune", "setup", repo, json_out=True)
    assert made["created"] and made["pruned_branch"] == "main-pruned"
    assert made["source_branch"] == "main"
    assert cli("prune", "setup", repo, json_out=True)["created"] is False  # twice is safe
    head = git(lib.repo, "rev-parse", "HEAD")

    (lib.repo / "toylib" / "core.py").write_text("# edited\n")
    error = cli("prune", "run", "--repo", repo, "--python", py, script, json_out=True, expect=1)
    assert error["code"] == "dirty_tree" and "toylib/core.py" in error["error"]
    git(lib.repo, "checkout", "--", "toylib/core.py")

    dry = cli("prune", "run", "--repo", repo, "--dry-run", "--python", py, script, json_out=True)
    gone = ["toylib/layers/flash.py", "toylib/unused.py"]
    assert dry["removed"] == gone and dry["commit"] is None and dry["dry_run"] is True
    assert git(lib.repo, "rev-parse", "main-pruned") == head  # the dry run committed nothing

    done = cli("prune", "run", "--repo", repo, "--python", py, script, json_out=True)
    assert done["removed"] == gone and done["commit"]
    pruned = files_on(lib.repo, "main-pruned")
    assert pruned == files_on(lib.repo, "main") - set(gone)
    assert {"toylib/__init__.py", "toylib/layers/__init__.py", "scripts/convert.py"} <= pruned
    # The user's branch, index and work tree are as they were.
    assert git(lib.repo, "rev-parse", "HEAD") == head
    assert git(lib.repo, "symbolic-ref", "--short", "HEAD").strip() == "main"
    assert git(lib.repo, "status", "--porcelain") == ""
    assert (lib.repo / "toylib" / "unused.py").exists()

    # The pruned tree still runs the script: every package imports.
    export = lib.repo.parent / "export"
    archive = subprocess.run(
        ["git", "-C", repo, "archive", "main-pruned"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(export, filter="data")
    proc = subprocess.run(
        ["python3", str(lib.script)],
        env={"PYTHONPATH": str(export), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "result 42" in proc.stdout, proc.stderr

    again = cli("prune", "run", "--repo", repo, "--python", py, script, json_out=True)
    assert again["removed"] == [] and again["commit"] is None

    back = cli("prune", "restore", "--repo", repo, "toylib/unused.py", json_out=True)
    assert back["restored"] == ["toylib/unused.py"] and back["commit"]
    assert "toylib/unused.py" in files_on(lib.repo, "main-pruned")
    error = cli("prune", "restore", "--repo", repo, "toylib/nope.py", json_out=True, expect=1)
    assert error["code"] == "file_not_found"

    state = cli("prune", "status", "--repo", repo, json_out=True)
    assert state["removed"] == ["toylib/layers/flash.py"] and state["prune_commits"] == 2
    assert state["pruned_exists"] and not state["pruned_checked_out"] and state["dirty"] == []
    assert "main-pruned" in cli("prune", "status", "--repo", repo).stdout

    failed = cli(
        "prune", "run", "--repo", repo, "--python", py, script, "3", json_out=True, expect=1
    )
    assert failed["code"] == "script_failed"
    assert files_on(lib.repo, "main-pruned") == pruned | {"toylib/unused.py"}


def test_restore_on_the_checked_out_pruned_branch_updates_its_files(cli, lib: EditableRepo) -> None:
    repo, py, script = str(lib.repo), str(lib.venv_python), str(lib.script)
    cli("prune", "setup", repo, json_out=True)
    cli("prune", "run", "--repo", repo, "--python", py, script, json_out=True)
    git(lib.repo, "checkout", "-q", "main-pruned")
    assert not (lib.repo / "toylib" / "unused.py").exists()
    error = cli("prune", "run", "--repo", repo, "--python", py, script, json_out=True, expect=1)
    assert error["code"] == "wrong_branch"
    cli("prune", "restore", "--repo", repo, str(lib.repo / "toylib" / "unused.py"), json_out=True)
    assert (lib.repo / "toylib" / "unused.py").exists()
    assert git(lib.repo, "status", "--porcelain") == ""


def test_not_a_repo_and_unused_repo(cli, lib: EditableRepo, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    error = cli("prune", "setup", str(plain), json_out=True, expect=1)
    assert error["code"] == "not_a_git_repo"
    cli("prune", "setup", str(lib.repo), json_out=True)
    other = tmp_path / "other.py"
    other.write_text("print('no toylib here')\n")
    error = cli(
        "prune",
        "run",
        "--repo",
        str(lib.repo),
        "--python",
        str(lib.venv_python),
        str(other),
        json_out=True,
        expect=1,
    )
    assert error["code"] == "repo_not_used"
    assert len(files_on(lib.repo, "main-pruned")) == len(files_on(lib.repo, "main"))


def test_restored_files_stay_through_later_runs(cli, lib: EditableRepo) -> None:
    repo, py, script = str(lib.repo), str(lib.venv_python), str(lib.script)
    cli("prune", "setup", repo, json_out=True)
    cli("prune", "run", "--repo", repo, "--python", py, script, json_out=True)
    cli("prune", "restore", "--repo", repo, "toylib/unused.py", json_out=True)
    again = cli("prune", "run", "--repo", repo, "--python", py, script, json_out=True)
    assert "toylib/unused.py" not in again["removed"] and again["commit"] is None
    assert "toylib/unused.py" in files_on(lib.repo, "main-pruned")
    assert "toylib/layers/flash.py" not in files_on(lib.repo, "main-pruned")
    state = cli("prune", "status", "--repo", repo, json_out=True)
    assert state["kept"] == ["toylib/unused.py"] and state["removed"] == ["toylib/layers/flash.py"]
    assert "kept by restore: toylib/unused.py" in cli("prune", "status", "--repo", repo).stdout


@pytest.fixture
def no_identity(lib: EditableRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user with no git identity anywhere (and git told not to guess one)."""
    git(lib.repo, "config", "--unset", "user.email")
    git(lib.repo, "config", "--unset", "user.name")
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tuseConfigOnly = true\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("EMAIL", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GIT_COMMITTER_EMAIL", raising=False)


def test_no_git_identity_is_refused_before_anything_is_written(
    cli, lib: EditableRepo, no_identity: None, tmp_path: Path
) -> None:
    repo, py, script = str(lib.repo), str(lib.venv_python), str(lib.script)
    branches = git(lib.repo, "branch", "--list")
    error = cli("prune", "setup", repo, json_out=True, expect=1)
    assert error["code"] == "no_git_identity"
    assert 'git config --global user.email "you@example.com"' in error["error"]
    assert git(lib.repo, "branch", "--list") == branches  # no pruned branch made

    git(lib.repo, "config", "user.email", "t@example.com")  # set up by someone who could
    git(lib.repo, "config", "user.name", "T")
    cli("prune", "setup", repo, json_out=True)
    git(lib.repo, "config", "--unset", "user.email")
    git(lib.repo, "config", "--unset", "user.name")
    pruned = git(lib.repo, "rev-parse", "main-pruned")
    error = cli("prune", "run", "--repo", repo, "--python", py, script, json_out=True, expect=1)
    assert error["code"] == "no_git_identity"
    assert not (tmp_path / ".mldbg" / "runs").exists()  # refused before the profile run
    error = cli("prune", "restore", "--repo", repo, "toylib/unused.py", json_out=True, expect=1)
    assert error["code"] == "no_git_identity"
    assert git(lib.repo, "rev-parse", "main-pruned") == pruned
    # a dry run commits nothing: it needs no identity
    dry = cli("prune", "run", "--repo", repo, "--dry-run", "--python", py, script, json_out=True)
    assert dry["removed"] == ["toylib/layers/flash.py", "toylib/unused.py"]
