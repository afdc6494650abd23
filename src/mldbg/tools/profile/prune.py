"""``mldbg prune``: a ``<branch>-pruned`` branch of a library holding only what a script ran.

Porting a model means reading the library code it runs, which is a few dozen files of
a library of thousands.  The pruned branch removes every Python file that never ran (nor
was imported), keeping each package importable.  It never touches the user's current
branch, index or work tree: commits are built in a temporary index with
``git commit-tree`` and the branch ref is moved with ``git update-ref``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from ...errors import (
    BAD_ARGUMENT,
    BRANCH_EXISTS,
    DIRTY_TREE,
    FILE_NOT_FOUND,
    GIT_FAILED,
    GIT_MISSING,
    NO_GIT_IDENTITY,
    NOT_A_GIT_REPO,
    NOT_SET_UP,
    REPO_NOT_USED,
    SCRIPT_FAILED,
    WRONG_BRANCH,
    MldbgError,
)
from .collect import RawProfile, run_profiled

if TYPE_CHECKING:
    from rich.console import Console

SUFFIX = "-pruned"
SOURCE_KEY = "mldbgsource"  # git config branch.<pruned>.mldbgsource = <source branch>
KEEP_KEY = "mldbgkeep"  # git config branch.<pruned>.mldbgkeep = a file restore brought back
MAX_LISTED = 200


class PruneSetupResult(TypedDict):
    action: Literal["setup"]
    repo: str
    source_branch: str
    pruned_branch: str
    created: bool
    commit: str


class PruneRunResult(TypedDict):
    action: Literal["run"]
    repo: str
    source_branch: str
    pruned_branch: str
    dry_run: bool
    removed: list[str]
    removed_count: int
    restored: list[str]
    restored_count: int
    kept_count: int
    commit: str | None
    run_id: str
    report_files: int
    truncated: bool


class PruneRestoreResult(TypedDict):
    action: Literal["restore"]
    repo: str
    pruned_branch: str
    restored: list[str]
    already_present: list[str]
    commit: str | None


class PruneStatusResult(TypedDict):
    action: Literal["status"]
    repo: str
    current_branch: str | None
    source_branch: str | None
    pruned_branch: str | None
    pruned_exists: bool
    pruned_checked_out: bool
    dirty: list[str]
    removed: list[str]
    removed_count: int
    kept: list[str]  # restored files every later run keeps
    prune_commits: int
    source_ahead: int
    truncated: bool


# -- git ----------------------------------------------------------------------------------------


def _git(top: Path | str, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    try:
        proc = subprocess.run(
            ["git", "-C", str(top), *args],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=120,
        )
    except FileNotFoundError:
        raise MldbgError("git is not installed (prune needs git)", code=GIT_MISSING) from None
    if check and proc.returncode != 0:
        raise MldbgError(
            f"git {' '.join(args[:3])} failed in {top}: {proc.stderr.strip()[-500:]}",
            code=GIT_FAILED,
        )
    return proc.stdout


def _toplevel(repo: str | None) -> Path:
    path = os.path.abspath(os.path.expanduser(repo or os.getcwd()))
    if not os.path.exists(path):
        raise MldbgError(f"{path} does not exist", code=FILE_NOT_FOUND)
    where = path if os.path.isdir(path) else os.path.dirname(path)
    proc = subprocess.run(
        ["git", "-C", where, "rev-parse", "--show-toplevel"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise MldbgError(
            f"{path} is not inside a git checkout: prune works on a library's git clone "
            "(typically the one installed with `pip install -e`); `mldbg doctor PKG` shows "
            "where a package is imported from",
            code=NOT_A_GIT_REPO,
        )
    return Path(proc.stdout.strip()).resolve()


def _current_branch(top: Path) -> str | None:
    out = _git(top, "symbolic-ref", "--quiet", "--short", "HEAD", check=False).strip()
    return out or None


def _exists(top: Path, branch: str) -> bool:
    return bool(_git(top, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False))


def _source_of(top: Path, pruned: str) -> str | None:
    return (
        _git(top, "config", "--get", f"branch.{pruned}.{SOURCE_KEY}", check=False).strip() or None
    )


def _kept(top: Path, pruned: str) -> list[str]:
    """Files ``restore`` brought back: later runs keep them, whether or not they ran."""
    out = _git(top, "config", "--get-all", f"branch.{pruned}.{KEEP_KEY}", check=False)
    return sorted({line for line in out.splitlines() if line})


def _keep(top: Path, pruned: str, files: list[str]) -> None:
    known = set(_kept(top, pruned))
    for path in files:
        if path not in known:
            _git(top, "config", "--add", f"branch.{pruned}.{KEEP_KEY}", path)
            known.add(path)


def _require_identity(top: Path) -> None:
    """Prune commits on the pruned branch: without a git identity the commit fails, after
    the profile run and with git's own words.  Asked first, before anything is written."""
    for who in ("GIT_AUTHOR_IDENT", "GIT_COMMITTER_IDENT"):
        if _git(top, "var", who, check=False).strip():
            continue
        raise MldbgError(
            f"git has no identity to commit the pruned branch with (user.name and "
            f'user.email): run `git config --global user.email "you@example.com"` and '
            f'`git config --global user.name "Your Name"` (or the same without --global '
            f"in {top}, for this checkout only), then try again; nothing was changed",
            code=NO_GIT_IDENTITY,
        )


def _dirty(top: Path) -> list[str]:
    """Tracked files with uncommitted changes (untracked files, e.g. build output, are fine)."""
    out = _git(top, "status", "--porcelain", "--untracked-files=no")
    return [line[3:] for line in out.splitlines() if line.strip()]


def _refuse_dirty(top: Path) -> None:
    dirty = _dirty(top)
    if dirty:
        raise MldbgError(
            f"{top} has uncommitted changes in {len(dirty)} file(s) ({', '.join(dirty[:5])}): "
            "commit or stash them first, so the pruned branch matches the code that ran",
            code=DIRTY_TREE,
            files=dirty[:MAX_LISTED],
        )


def _branches(top: Path) -> tuple[str, str]:
    """(source, pruned) for the checked-out branch; refuses a detached HEAD or the pruned one."""
    current = _current_branch(top)
    if current is None:
        raise MldbgError(
            f"{top} has a detached HEAD: check out the branch to prune from first",
            code=BAD_ARGUMENT,
        )
    source = _source_of(top, current)
    if source is not None:
        raise MldbgError(
            f"{top} has the pruned branch {current} checked out: check out {source} "
            f"(the full library) first; `mldbg prune restore` works from either",
            code=WRONG_BRANCH,
        )
    return current, current + SUFFIX


def _tracked(top: Path, ref: str) -> set[str]:
    out = _git(top, "ls-tree", "-r", "-z", "--name-only", ref)
    return {name for name in out.split("\0") if name}


def _commit(
    top: Path, branch: str, remove: list[str], add_from: str, add: list[str], message: str
) -> str:
    """Commit (tree of ``branch`` − ``remove`` + ``add`` taken from ``add_from``) on ``branch``.

    A temporary index keeps the user's index and work tree untouched; the ref moves only
    if nobody moved it meanwhile.  When ``branch`` is the one checked out, its work tree
    is moved along (a two-tree read-tree, as checkout does).
    """
    old = _git(top, "rev-parse", f"refs/heads/{branch}").strip()
    with tempfile.TemporaryDirectory(prefix="mldbg-prune-") as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        _git(top, "read-tree", old, env=env)
        for chunk in _chunks(remove):
            _git(top, "update-index", "--force-remove", "--", *chunk, env=env)
        for chunk in _chunks(add):
            listing = _git(top, "ls-tree", "-z", add_from, "--", *chunk)
            entries = [e for e in listing.split("\0") if e]
            info = "".join(
                f"{meta.split()[0]} {meta.split()[2]}\t{path}\n"
                for meta, path in (e.split("\t", 1) for e in entries)
            )
            subprocess.run(
                ["git", "-C", str(top), "update-index", "--index-info"],
                input=info,
                text=True,
                env={**os.environ, **env},
                check=True,
            )
        tree = _git(top, "write-tree", env=env).strip()
    commit = _git(top, "commit-tree", tree, "-p", old, "-m", message).strip()
    if _current_branch(top) == branch:
        _git(top, "read-tree", "-m", "-u", old, commit)
    _git(top, "update-ref", f"refs/heads/{branch}", commit, old)
    return commit


def _chunks(items: list[str], size: int = 500) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# -- verbs --------------------------------------------------------------------------------------


def setup(repo: str) -> PruneSetupResult:
    """Make ``<branch>-pruned`` at the current commit; safe to run again."""
    top = _toplevel(repo)
    source, pruned = _branches(top)
    _refuse_dirty(top)
    _require_identity(top)  # every later run and restore commits
    created = not _exists(top, pruned)
    if created:
        _git(top, "branch", pruned, "HEAD")
        _git(top, "config", f"branch.{pruned}.{SOURCE_KEY}", source)
    elif _source_of(top, pruned) != source:
        raise MldbgError(
            f"a branch {pruned} already exists in {top} but was not made by mldbg prune: "
            "rename or delete it first",
            code=BRANCH_EXISTS,
        )
    commit = _git(top, "rev-parse", f"refs/heads/{pruned}").strip()
    return {
        "action": "setup",
        "repo": str(top),
        "source_branch": source,
        "pruned_branch": pruned,
        "created": created,
        "commit": commit,
    }


def _used_files(raw: RawProfile, top: Path) -> set[str]:
    """Paths (relative to the checkout) of files that ran or were imported."""
    used: set[str] = set()
    paths = [f.file for f in raw.functions] + list(raw.modules.values())
    prefix = str(top) + os.sep
    for path in paths:
        if path.startswith(prefix):
            used.add(path[len(prefix) :].replace(os.sep, "/"))
    return used


def _prunable(tracked: set[str], used: set[str]) -> list[str]:
    """Python files inside a package that never ran; every ``__init__.py`` stays."""
    candidates = []
    for path in tracked:
        if not path.endswith(".py") or path.rsplit("/", 1)[-1] == "__init__.py":
            continue
        directory = path.rsplit("/", 1)[0] if "/" in path else ""
        if not directory or f"{directory}/__init__.py" not in tracked:
            continue  # setup.py, scripts, docs/conf.py: not part of an importable package
        if path not in used:
            candidates.append(path)
    return sorted(candidates)


def run(
    script: str,
    args: list[str],
    *,
    repo: str | None = None,
    dry_run: bool = False,
    python: str | None = None,
    cwd: str | None = None,
) -> PruneRunResult:
    """Profile ``script``, then commit on the pruned branch the removal of what never ran."""
    top = _toplevel(repo)
    source, pruned = _branches(top)
    if not _exists(top, pruned) or _source_of(top, pruned) != source:
        raise MldbgError(
            f"{top} has no pruned branch for {source}: run `mldbg prune setup {top}` first",
            code=NOT_SET_UP,
        )
    _refuse_dirty(top)
    if not dry_run:
        _require_identity(top)
    raw = run_profiled(script, args, python=python, cwd=cwd)
    if raw.exit_code != 0 or raw.signal:
        raise MldbgError(
            f"the script failed (exit code {raw.exit_code}, signal {raw.signal}); nothing was "
            f"pruned, since a failed run may not reach the code it needs. Output: "
            f"{raw.run.path / 'output.log'}",
            code=SCRIPT_FAILED,
            output_tail=raw.output_tail,
            run_dir=str(raw.run.path),
        )
    used = _used_files(raw, top)
    if not used:
        raise MldbgError(
            f"the script imported nothing from {top}, so everything would go; is it installed "
            "editable (`pip install -e`) in the interpreter that ran? `mldbg doctor PKG` shows "
            "which copy is imported",
            code=REPO_NOT_USED,
            run_dir=str(raw.run.path),
        )
    tracked_pruned = _tracked(top, pruned)
    tracked_source = _tracked(top, source)
    remove = _prunable(tracked_pruned, used | set(_kept(top, pruned)))
    restore = sorted(p for p in used if p in tracked_source and p not in tracked_pruned)
    commit = None
    if not dry_run and (remove or restore):
        message = (
            f"mldbg prune: keep what `{Path(script).name} {' '.join(args)}` ran\n\n"
            f"{len(remove)} Python file(s) that never ran removed, {len(restore)} restored "
            f"(profile run {raw.run.run_id})."
        )
        commit = _commit(top, pruned, remove, source, restore, message)
    kept = sum(1 for p in tracked_pruned if p.endswith(".py")) - len(remove) + len(restore)
    return {
        "action": "run",
        "repo": str(top),
        "source_branch": source,
        "pruned_branch": pruned,
        "dry_run": dry_run,
        "removed": remove[:MAX_LISTED],
        "removed_count": len(remove),
        "restored": restore[:MAX_LISTED],
        "restored_count": len(restore),
        "kept_count": kept,
        "commit": commit,
        "run_id": raw.run.run_id,
        "report_files": len(used),
        "truncated": len(remove) > MAX_LISTED or len(restore) > MAX_LISTED,
    }


def _pair(top: Path) -> tuple[str, str]:
    """(source, pruned) from either branch being checked out."""
    current = _current_branch(top)
    if current is None:
        raise MldbgError(f"{top} has a detached HEAD: check out a branch", code=BAD_ARGUMENT)
    source = _source_of(top, current)
    if source is not None:
        return source, current
    pruned = current + SUFFIX
    if not _exists(top, pruned) or _source_of(top, pruned) != current:
        raise MldbgError(
            f"{top} has no pruned branch for {current}: run `mldbg prune setup {top}` first",
            code=NOT_SET_UP,
        )
    return current, pruned


def restore(files: list[str], *, repo: str | None = None) -> PruneRestoreResult:
    """Bring files back onto the pruned branch from its source branch."""
    top = _toplevel(repo or (files[0] if files and os.path.isabs(files[0]) else None))
    source, pruned = _pair(top)
    if _current_branch(top) == pruned:
        _refuse_dirty(top)
    _require_identity(top)
    in_source = _tracked(top, source)
    in_pruned = _tracked(top, pruned)
    wanted: list[str] = []
    missing: list[str] = []
    for item in files:
        absolute = os.path.abspath(os.path.expanduser(item))
        if absolute.startswith(str(top) + os.sep):
            rel = os.path.relpath(absolute, top).replace(os.sep, "/")
        else:
            rel = os.path.normpath(item).replace(os.sep, "/")
        (wanted if rel in in_source else missing).append(rel)
    if missing:
        raise MldbgError(
            f"not in {source}: {', '.join(missing[:10])} (paths are relative to {top} or absolute)",
            code=FILE_NOT_FOUND,
            files=missing[:MAX_LISTED],
        )
    add = sorted({p for p in wanted if p not in in_pruned})
    present = sorted({p for p in wanted if p in in_pruned})
    commit = None
    if add:
        commit = _commit(
            top, pruned, [], source, add, f"mldbg prune: restore {len(add)} file(s) from {source}"
        )
    _keep(top, pruned, sorted(set(wanted)))  # sticky: the next run does not remove them again
    return {
        "action": "restore",
        "repo": str(top),
        "pruned_branch": pruned,
        "restored": add[:MAX_LISTED],
        "already_present": present[:MAX_LISTED],
        "commit": commit,
    }


def status(repo: str | None = None) -> PruneStatusResult:
    """Where the checkout stands: branches, what the pruned branch lacks, uncommitted work."""
    top = _toplevel(repo)
    current = _current_branch(top)
    source: str | None = None
    pruned: str | None = None
    if current is not None:
        configured = _source_of(top, current)
        source, pruned = (configured, current) if configured else (current, current + SUFFIX)
    exists = bool(pruned and source and _exists(top, pruned) and _source_of(top, pruned) == source)
    removed: list[str] = []
    kept: list[str] = []
    commits = ahead = 0
    if exists and source and pruned:
        kept = _kept(top, pruned)
        out = _git(top, "diff", "--name-only", "-z", "--diff-filter=D", source, pruned)
        removed = sorted(p for p in out.split("\0") if p)
        commits = int(_git(top, "rev-list", "--count", f"{source}..{pruned}").strip() or 0)
        ahead = int(_git(top, "rev-list", "--count", f"{pruned}..{source}").strip() or 0)
    return {
        "action": "status",
        "repo": str(top),
        "current_branch": current,
        "source_branch": source,
        "pruned_branch": pruned,
        "pruned_exists": exists,
        "pruned_checked_out": exists and current == pruned,
        "dirty": _dirty(top)[:MAX_LISTED],
        "removed": removed[:MAX_LISTED],
        "removed_count": len(removed),
        "kept": kept[:MAX_LISTED],
        "prune_commits": commits,
        "source_ahead": ahead,
        "truncated": len(removed) > MAX_LISTED,
    }


# -- human output -------------------------------------------------------------------------------


PruneResult = PruneSetupResult | PruneRunResult | PruneRestoreResult | PruneStatusResult


def render_prune(result: PruneResult, console: Console) -> None:
    from rich.markup import escape

    if result["action"] == "setup":
        verb = "made" if result["created"] else "already had"
        console.print(
            f"{escape(result['repo'])}: {verb} branch [bold]{escape(result['pruned_branch'])}[/] "
            f"from {escape(result['source_branch'])} ({result['commit'][:10]}); your branch and "
            f"work tree are untouched. Next: mldbg prune run --repo {escape(result['repo'])} SCRIPT"
        )
    elif result["action"] == "run":
        head = "would remove" if result["dry_run"] else "removed"
        console.print(
            f"{escape(result['pruned_branch'])}: {head} {result['removed_count']} Python file(s) "
            f"that never ran, restored {result['restored_count']}, kept {result['kept_count']}"
        )
        for path in result["removed"][:30]:
            console.print(f"  - {escape(path)}")
        if result["removed_count"] > 30:
            console.print(f"  … {result['removed_count'] - 30} more (--json lists up to 200)")
        for path in result["restored"][:30]:
            console.print(f"  + {escape(path)}")
        if result["commit"]:
            console.print(f"committed {result['commit'][:10]} on {escape(result['pruned_branch'])}")
        elif not result["dry_run"]:
            console.print("nothing to change")
    elif result["action"] == "restore":
        console.print(
            f"{escape(result['pruned_branch'])}: restored {len(result['restored'])} file(s)"
            + (
                f", {len(result['already_present'])} already there"
                if result["already_present"]
                else ""
            )
        )
        for path in result["restored"]:
            console.print(f"  + {escape(path)}")
    else:
        console.print(f"{escape(result['repo'])} on {escape(str(result['current_branch']))}")
        if not result["pruned_exists"]:
            console.print(f"no pruned branch yet: mldbg prune setup {escape(result['repo'])}")
            return
        console.print(
            f"{escape(str(result['pruned_branch']))}: {result['removed_count']} file(s) removed "
            f"in {result['prune_commits']} commit(s); {escape(str(result['source_branch']))} is "
            f"{result['source_ahead']} commit(s) ahead"
            + (" (checked out)" if result["pruned_checked_out"] else "")
        )
        if result["kept"]:
            console.print(f"kept by restore: {escape(', '.join(result['kept'][:10]))}")
        if result["dirty"]:
            console.print(
                f"[yellow]uncommitted changes: {escape(', '.join(result['dirty'][:5]))}[/]"
            )
