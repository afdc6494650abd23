"""Which Python runs the user's code, and which copy of each library it imports.

"My breakpoint never hits" is most often a breakpoint in one copy of a library while the
script imports another (a site-packages install shadowing the editable clone, or the
other way round).  Everything is read in the *target* interpreter (a subprocess), without
importing the libraries themselves: ``importlib.util.find_spec`` on the top-level name,
versions from metadata, editable installs from ``direct_url.json`` (PEP 610).  Git state
comes from ``git`` on the source checkout.  The daemon asks this at ``start
--require-editable`` and ``break`` (the copy warning); ``mldbg doctor`` and the profiler
too, so one rule picks the interpreter everywhere (:func:`resolve_python`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict, cast

from .errors import BAD_ARGUMENT, FILE_NOT_FOUND, NOT_EDITABLE, PROBE_FAILED, MldbgError


def resolve_python(requested: str | None, cwd: str, env: Mapping[str, str] | None = None) -> str:
    """``--python`` (a name on the PATH, or a path against ``cwd``), else the active
    virtualenv's python (``VIRTUAL_ENV`` of ``env``: the client's), else this interpreter."""
    env = os.environ if env is None else env
    if requested:
        candidate = os.path.expanduser(requested)
        if os.sep not in candidate:
            found = shutil.which(candidate, path=env.get("PATH"))
            if found is None:
                raise MldbgError(
                    f"no interpreter named {requested!r} on the PATH",
                    code=BAD_ARGUMENT,
                    argument="python",
                )
            return found
        candidate = os.path.join(cwd, candidate)
        if not os.path.isfile(candidate) or not os.access(candidate, os.X_OK):
            raise MldbgError(
                f"--python {requested}: no executable at {candidate}",
                code=FILE_NOT_FOUND,
                argument="python",
            )
        return candidate
    venv = env.get("VIRTUAL_ENV")
    if venv:
        for name in ("bin/python", "Scripts/python.exe"):
            candidate = os.path.join(venv, name)
            if os.path.isfile(candidate):
                return candidate
    return sys.executable


# Runs in the target interpreter: standard library only, imports nothing it inspects.
_PROBE = r"""
import importlib.metadata as md, importlib.util, json, os, site, sys
names, script = json.loads(sys.argv[1]), sys.argv[2]
if script:
    sys.path[0] = os.path.dirname(os.path.realpath(script))
try:
    dists_of = md.packages_distributions()
except Exception:
    dists_of = {}
out = {"python": sys.executable, "version": sys.version.split()[0], "prefix": sys.prefix,
       "base_prefix": getattr(sys, "base_prefix", sys.prefix),
       "site_packages": [p for p in (site.getsitepackages() if hasattr(site, "getsitepackages") else [])],
       "packages": {}}
for name in names:
    module = name.replace("-", "_")
    info = {"name": name, "module": module, "found": False}
    try:
        spec = importlib.util.find_spec(module)
    except Exception as exc:
        spec = None
        info["error"] = f"{type(exc).__name__}: {exc}"
    if spec is not None:
        info["found"] = True
        locations = list(spec.submodule_search_locations or [])
        origin = spec.origin if spec.origin not in (None, "namespace") else None
        info["origin"] = origin
        info["location"] = locations[0] if locations else (os.path.dirname(origin) if origin else None)
    candidates = [name, module] + list(dists_of.get(module, []))
    for dist_name in candidates:
        try:
            dist = md.distribution(dist_name)
        except md.PackageNotFoundError:
            continue
        info["distribution"] = dist.metadata["Name"]
        info["version"] = dist.version
        try:
            info["dist_path"] = str(dist._path)
        except AttributeError:
            pass
        text = dist.read_text("direct_url.json")
        if text:
            try:
                info["direct_url"] = json.loads(text)
            except ValueError:
                pass
        break
    out["packages"][name] = info
print(json.dumps(out))
"""


class DirectUrl(TypedDict, total=False):
    """A distribution's ``direct_url.json`` (PEP 610): where it was installed from."""

    url: str
    dir_info: dict[str, bool]  # {"editable": true} for ``pip install -e``


class ProbedPackage(TypedDict, total=False):
    """What ``_PROBE`` finds of one package in the target interpreter."""

    name: str
    module: str
    found: bool
    error: str  # what finding its module raised
    origin: str | None
    location: str | None  # the directory it is imported from
    distribution: str
    version: str
    dist_path: str
    direct_url: DirectUrl


class Probe(TypedDict):
    """``_PROBE``'s answer: the interpreter, and each package asked for."""

    python: str
    version: str
    prefix: str
    base_prefix: str  # != prefix: this interpreter is a virtualenv's, at prefix
    site_packages: list[str]
    packages: dict[str, ProbedPackage]


class GitState(TypedDict):
    root: str
    branch: str | None
    commit: str | None
    dirty: bool
    dirty_files: list[str]


class PackageReport(TypedDict):
    name: str
    found: bool
    version: str | None
    distribution: str | None
    imported_from: str | None
    editable: bool  # the copy imported is the editable install (``pip install -e``)
    # an editable install exists, but another copy is imported instead (its ``source``
    # is not what runs)
    shadowed: bool
    source: str | None
    git: GitState | None
    warnings: list[str]


class ImportedCopy(TypedDict):
    file: str
    module: str | None
    imported_file: str | None
    same: bool | None
    warning: str | None


def probe(
    python: str, names: list[str], script: str | None = None, cwd: str | None = None
) -> Probe:
    """Run ``_PROBE`` in ``python`` (its own interpreter) for ``names``."""
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE, json.dumps(names), script or ""],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=cwd,
        )
    except OSError as exc:
        raise MldbgError(f"cannot run {python}: {exc.strerror}", code=BAD_ARGUMENT) from None
    if proc.returncode != 0:
        raise MldbgError(
            f"{python} could not inspect its packages: {proc.stderr.strip()[-500:]}",
            code=PROBE_FAILED,
        )
    return cast("Probe", json.loads(proc.stdout))  # what _PROBE prints


def git_state(path: str) -> GitState | None:
    """Branch, commit and uncommitted changes of the checkout holding ``path``, if any."""
    where = path if os.path.isdir(path) else os.path.dirname(path)

    def git(*args: str, strip: bool = True) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "-C", where, *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if proc.returncode != 0:
            return None
        return proc.stdout.strip() if strip else proc.stdout

    root = git("rev-parse", "--show-toplevel")
    if not root:
        return None
    dirty = [
        line[3:]
        for line in (
            git("status", "--porcelain", "--untracked-files=no", strip=False) or ""
        ).splitlines()
        if line
    ]
    return {
        "root": root,
        "branch": git("symbolic-ref", "--quiet", "--short", "HEAD"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(dirty),
        "dirty_files": dirty[:20],
    }


def _file_url_path(url: str) -> str | None:
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    return unquote(parsed.path) if parsed.scheme == "file" else None


def package_report(info: ProbedPackage) -> PackageReport:
    warnings: list[str] = []
    direct = info.get("direct_url")
    editable = bool(direct and (direct.get("dir_info") or {}).get("editable"))
    source = _file_url_path(direct.get("url", "")) if direct else None
    location = info.get("location")
    real_location = os.path.realpath(location) if location else None
    shadowed = False
    if editable and source and real_location:
        real_source = os.path.realpath(source)
        if not (real_location + os.sep).startswith(real_source.rstrip(os.sep) + os.sep):
            shadowed = True
            warnings.append(
                f"{info['name']} is installed editable from {source}, but this Python imports "
                f"it from {location}: another copy shadows the checkout (breakpoints in "
                f"{source} will not hit); remove it or fix sys.path"
            )
    if info.get("found") and not info.get("version"):
        warnings.append(
            f"{info['name']} is importable from {location} but no installed distribution "
            "owns it (on sys.path through PYTHONPATH or the script's directory?)"
        )
    git_root = source if editable and source else real_location
    return {
        "name": info["name"],
        "found": bool(info.get("found")),
        "version": info.get("version"),
        "distribution": info.get("distribution"),
        "imported_from": real_location,
        "editable": editable and not shadowed,
        "shadowed": shadowed,
        "source": source,
        "git": git_state(git_root) if git_root and (editable or not _in_site(git_root)) else None,
        "warnings": warnings,
    }


def _in_site(path: str) -> bool:
    return "site-packages" in path or "dist-packages" in path


def _module_of(file: str) -> tuple[str, str] | None:
    """(module name, directory holding its top-level package) for a file inside a package."""
    path = Path(file).resolve()
    parts = [path.stem] if path.name != "__init__.py" else []
    directory = path.parent
    if not (directory / "__init__.py").exists():
        return None
    while (directory / "__init__.py").exists():
        parts.insert(0, directory.name)
        directory = directory.parent
    return ".".join(parts), str(directory)


def imported_copy(
    python: str | None, file: str, *, script: str | None = None, cwd: str | None = None
) -> ImportedCopy:
    """Is ``file`` the copy of its module that ``python`` (running ``script``) imports?

    For ``break FILE:LINE``: a breakpoint in a copy the script never imports never hits.
    ``same`` is None where it cannot be told (a file outside any package).
    """
    cwd = os.path.abspath(cwd or os.getcwd())
    real = os.path.realpath(os.path.join(cwd, os.path.expanduser(file)))
    found = _module_of(real)
    if found is None:
        return {"file": real, "module": None, "imported_file": None, "same": None, "warning": None}
    module, root = found
    top = module.split(".", 1)[0]
    data = probe(resolve_python(python, cwd), [top], script=script, cwd=cwd)
    info = data["packages"][top]
    location = info.get("location")
    if not info.get("found") or not location:
        return {
            "file": real,
            "module": module,
            "imported_file": None,
            "same": None,
            "warning": f"{data['python']} cannot import {top} at start-up; if the script adds "
            f"{root} to sys.path itself, the breakpoint is fine",
        }
    relative = os.path.relpath(real, os.path.join(root, top))
    imported = os.path.realpath(os.path.join(location, relative))
    same = imported == real
    warning = None
    if not same:
        warning = (
            f"{data['python']} imports {module} from {imported}, not {real}: this breakpoint "
            f"will not hit; set it in {imported}, or install {root} editable "
            f"(`pip install -e`)"
        )
    return {
        "file": real,
        "module": module,
        "imported_file": imported,
        "same": same,
        "warning": warning,
    }


def require_editable(python: str | None, package: str, *, cwd: str | None = None) -> None:
    """Raise (code ``not_editable``) unless ``package`` is an editable install for ``python``."""
    cwd = os.path.abspath(cwd or os.getcwd())
    interpreter = resolve_python(python, cwd)
    info = package_report(probe(interpreter, [package], cwd=cwd)["packages"][package])
    if not info["found"]:
        raise MldbgError(
            f"{package} is not importable by {interpreter}; install your checkout with "
            f"`{interpreter} -m pip install -e PATH/TO/{package}`",
            code=NOT_EDITABLE,
            package=package,
        )
    if info["shadowed"]:  # installed editable, but another copy is what runs
        raise MldbgError(info["warnings"][0], code=NOT_EDITABLE, package=package)
    if not info["editable"]:
        raise MldbgError(
            f"{package} {info['version'] or ''} is imported from {info['imported_from']}, a regular "
            f"install, not an editable one; install your checkout with "
            f"`{interpreter} -m pip install -e PATH/TO/{package}`",
            code=NOT_EDITABLE,
            package=package,
            imported_from=info["imported_from"],
        )
    if info["warnings"]:
        raise MldbgError(info["warnings"][0], code=NOT_EDITABLE, package=package)
