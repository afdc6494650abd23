"""The tensor store: ``debug_save`` / ``debug_load`` move exact tensors between frameworks.

Each tensor is one safetensors file under ``<store>/tensors/NAME.safetensors``; its
header's metadata says where and when it was saved.  The store is the user's, shared by
every repository (``~/.mldbg/tensors``), unless ``MLDBG_HOME`` names one: the point is a
``debug_save`` in the reference's checkout meeting a ``debug_load`` in the port's, and a
store that followed the current directory kept them apart (even a subdirectory found it
"empty").  Bytes are never converted, so a
bf16 tensor saved from PyTorch loads bit for bit in MLX and back.  The frameworks (and
the ``safetensors`` package for torch and numpy) are imported only when used: this
module is importable anywhere, and listing the store needs the standard library only.
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import re
import secrets
import shutil
import struct
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import dtypes
from ..own_work import own_work
from . import size as _store
from .runs import PRIVATE_FILE, ignore_in_git, make_private_dirs, mldbg_home

if TYPE_CHECKING:  # the listing's shapes, for the type checker (scripts never import them)
    from .. import results as R

SUFFIX = ".safetensors"
KEY = "tensor"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=@-]{0,199}$")
_warned = False


# Kept under its first name: scripts catch it.
TensorStoreFull = _store.StoreFull


def user_home(env: Mapping[str, str] | None = None) -> Path:
    """The per-user store, ``~/.mldbg`` (``HOME`` from ``env`` when given)."""
    env = os.environ if env is None else env
    return Path(env.get("HOME") or Path.home()).expanduser() / ".mldbg"


def tensor_home(
    cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Path:
    """The home whose ``tensors/`` is the store: ``$MLDBG_HOME`` when set (relative to
    ``cwd``), else the per-user ``~/.mldbg``, one store for all of a user's repositories."""
    env = os.environ if env is None else env
    if env.get("MLDBG_HOME"):
        return mldbg_home(cwd, env)
    return user_home(env)


def store_dir(home: Path | None = None) -> Path:
    """``home/tensors``; without ``home``, this process's store (:func:`tensor_home`)."""
    return (home or tensor_home()) / "tensors"


def where(directory: Path) -> str:
    """Which store ``directory`` is and what moves it, for messages."""
    configured = os.environ.get("MLDBG_HOME")
    if configured:
        return f"{directory} (MLDBG_HOME={configured}; unset it for the per-user store)"
    return f"{directory} (the per-user store every repository shares; MLDBG_HOME=DIR moves it)"


def check_name(name: str) -> str:
    """Names are single file names: no '/', no '..', nothing hidden.

    ``fullmatch``: with ``match``, ``$`` also matches before a final newline, and a name
    ending in one made a file name nobody can type back.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ValueError(
            f"bad tensor name {name!r}: use letters, digits and _ . + = @ - (no '/', no '..', "
            "not starting with '.'), at most 200 characters"
        )
    return name


def _path(name: str, home: Path | None = None) -> Path:
    return store_dir(home) / f"{check_name(name)}{SUFFIX}"


def store_size(home: Path | None = None) -> int:
    directory = store_dir(home)
    if not directory.is_dir():
        return 0
    return sum(p.stat().st_size for p in directory.glob(f"*{SUFFIX}") if p.is_file())


def _framework(tensor: object) -> str:
    module = type(tensor).__module__ or ""
    if module.startswith("torch"):
        return "torch"
    if module.startswith("mlx"):
        return "mlx"
    if module.startswith("numpy"):
        return "numpy"
    raise TypeError(
        f"debug_save takes a torch tensor, an MLX array or a numpy array, not {type(tensor).__qualname__}"
    )


def _nbytes(tensor: Any, framework: str) -> int:
    if framework == "torch":
        return int(tensor.numel() * tensor.element_size())
    return int(tensor.nbytes)


def _guard(incoming: int, home: Path | None) -> None:
    """The whole mldbg home counts (runs, captures, tensors), not only the tensor store."""
    global _warned
    text = _store.check(incoming, home)
    if text and not _warned:
        _warned = True
        warnings.warn(text, stacklevel=3)


def _caller() -> dict[str, str]:
    frame = inspect.currentframe()
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    if frame is None:
        return {}
    file = frame.f_code.co_filename
    return {
        "file": file if file.startswith("<") else os.path.abspath(file),
        "line": str(frame.f_lineno),
        "function": frame.f_code.co_name,
    }


def debug_save(tensor: Any, name: str, *, exit_after: bool = False) -> Path:
    """Store ``tensor`` exactly (dtype, shape, bytes) under ``name``; a later save replaces it.

    ``exit_after=True`` ends the script cleanly (exit code 0) once the tensor is stored,
    for "run the reference up to here and hand me this tensor" workflows.
    """
    with own_work():  # its copy and export are not the model's operations
        return _save(tensor, name, exit_after)


def _save(tensor: object, name: str, exit_after: bool) -> Path:
    framework = _framework(tensor)
    path = _path(name)
    _guard(_nbytes(tensor, framework), path.parent.parent)
    make_private_dirs(path.parent)  # stored tensors are data: private, like the run store
    ignore_in_git(path.parent.parent)
    metadata = {
        "mldbg_name": name,
        "framework": framework,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "pid": str(os.getpid()),
        "script": os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "",
        **{f"caller_{k}": v for k, v in _caller().items()},
    }
    tmp = path.with_name(f".{name}.{os.getpid()}.{secrets.token_hex(4)}{SUFFIX}")
    try:
        _write(tensor, framework, tmp, metadata)
        os.chmod(tmp, PRIVATE_FILE)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    if exit_after:
        sys.stdout.flush()
        raise SystemExit(0)
    return path


def _write(tensor: Any, framework: str, path: Path, metadata: dict[str, str]) -> None:
    if framework == "torch":
        from safetensors.torch import save_file

        data = tensor.detach()
        metadata["device"] = str(data.device)
        save_file({KEY: data.contiguous().cpu()}, str(path), metadata=metadata)
    elif framework == "mlx":
        import mlx.core as mx

        mx.eval(tensor)
        mx.save_safetensors(str(path), {KEY: tensor}, metadata=metadata)
    else:
        import numpy as np
        from safetensors.numpy import save_file as save_numpy

        save_numpy({KEY: np.ascontiguousarray(tensor)}, str(path), metadata=metadata)


FRAMEWORKS = ("torch", "mlx", "numpy")


def _module_root(value: object) -> str:
    """``torch`` for ``import torch``, ``from torch import nn`` or ``from torch import tensor``."""
    if inspect.ismodule(value):
        name = value.__name__
    elif inspect.isclass(value) or callable(value):
        name = getattr(value, "__module__", None) or ""
    else:
        name = type(value).__module__ or ""
    return name.split(".", 1)[0] if isinstance(name, str) else ""


def _caller_framework(path: Path) -> str:
    """The framework the calling module works in, judged by what its globals import.

    An MLX script gets an MLX array, a PyTorch script a tensor; a module that imports
    both gets the framework the tensor was saved from (when that is one of them), and
    anything else gets numpy, which needs neither framework installed.
    """
    frame = inspect.currentframe()
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    found: set[str] = set()
    if frame is not None:
        for value in list(frame.f_globals.values()):
            root = _module_root(value)
            if root in ("torch", "mlx"):
                found.add(root)
    if len(found) == 1:
        return found.pop()
    if len(found) == 2:
        try:
            saved = read_header(path)["metadata"].get("framework")
        except (OSError, ValueError):
            saved = None
        return saved if saved in found else "torch"
    return "numpy"


def debug_load(name: str, *, to: str | None = None) -> Any:
    """The tensor stored under ``name``, with the same dtype and bytes.

    ``to`` is ``"torch"``, ``"mlx"`` or ``"numpy"``; left out, the caller's framework
    (see :func:`_caller_framework`), so ``debug_load`` in an MLX script needs no torch.
    """
    with own_work():  # its conversions are not the model's operations
        return _load(name, to)


def _load(name: str, to: str | None) -> object:
    path = _path(name)
    if not path.exists():
        stored = [item["name"] for item in list_tensors()]
        close = difflib.get_close_matches(name, stored, n=5, cutoff=0.3)
        hint = (
            f"; closest stored names: {', '.join(close)}"
            if close
            else (f"; stored: {', '.join(stored[:10])}" if stored else "; the store is empty")
        )
        raise FileNotFoundError(
            f"no tensor named {name!r} in {where(path.parent)}{hint}{_elsewhere(path)}"
        )
    if to is None:
        to = _caller_framework(path)
    if to == "torch":
        from safetensors.torch import load_file

        return load_file(str(path))[KEY]
    if to == "mlx":
        import mlx.core as mx

        loaded: Any = mx.load(str(path))
        return loaded[KEY]
    if to == "numpy":
        return _load_numpy(name, path)
    raise ValueError(f"to={to!r}: use 'torch', 'mlx' or 'numpy'")


def _elsewhere(path: Path) -> str:
    """A tensor of that name in ``./.mldbg/tensors`` (where mldbg kept it before the store
    was per-user, or a project store used with MLDBG_HOME) is named, with how to read it."""
    local = Path.cwd() / ".mldbg" / "tensors" / path.name
    if not local.is_file() or local.resolve() == path.resolve():
        return ""
    return f"; {local} has one: MLDBG_HOME={local.parent.parent} reads that store"


def _load_numpy(name: str, path: Path) -> Any:
    """Read the one tensor with numpy alone: no torch, no safetensors package needed."""
    import numpy as np

    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
        entry = header.get(KEY) or next(v for k, v in header.items() if k != "__metadata__")
        found = dtypes.BY_CODE.get(entry["dtype"])
        dtype_name = found.numpy if found is not None and found.bits % 8 == 0 else None
        if dtype_name is None:
            raise TypeError(f"{name!r} has dtype {entry['dtype']}, which numpy cannot hold")
        if not hasattr(np, dtype_name):  # bf16, the fp8s: ml_dtypes has them
            try:
                import ml_dtypes
            except ImportError:
                raise TypeError(
                    f"{name!r} is {dtype_name}, which numpy has no dtype for: "
                    "`pip install ml_dtypes`, or load it with to='torch' or to='mlx'"
                ) from None
            dtype = np.dtype(getattr(ml_dtypes, dtype_name))
        else:
            dtype = np.dtype(dtype_name)
        start, end = entry["data_offsets"]
        fh.seek(8 + length + start)
        data = fh.read(end - start)
    array = np.frombuffer(data, dtype=dtype.newbyteorder("<")).reshape(entry["shape"])
    return array.astype(dtype, copy=True)  # native byte order, writable, owns its memory


def debug_show_all(*, print_table: bool = True) -> list[R.TensorRecord]:
    """Every stored tensor (name, dtype, shape, size, framework, when saved); printed too."""
    items = list_tensors()
    if print_table:
        if not items:
            print(f"no tensors in {where(store_dir())}")
        for item in items:
            meta = item.get("metadata") or {}
            print(
                f"{item['name']:<32} {item.get('dtype')!s:<6} {item.get('shape')!s:<18} "
                f"{item['size_bytes']:>12,d} B  {meta.get('framework', '?'):<6} {meta.get('saved_at', '')}"
            )
    return items


def debug_clear(name: str | None = None, *, confirm: bool | None = None) -> list[str]:
    """Delete one stored tensor, or all of them; returns the names removed.

    ``debug_clear(NAME)`` deletes one.  For all of them, both spellings in use work:
    ``confirm=True`` (mldbg's first meaning: "I confirm") and ``confirm=False`` (the
    tool mldbg replaces: "do not ask me") delete at once; ``debug_clear()`` with neither
    asks on a terminal and, with no terminal to ask (an agent, a pipe), refuses rather
    than delete everything or hang.
    """
    if name is None and confirm is None:
        count = len(list_tensors())
        where = store_dir()
        if count and _interactive():
            print(f"debug_clear(): delete all {count} tensor(s) in {where}? [y/N] ", end="")
            sys.stdout.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return []
        elif count:
            raise ValueError(
                f"debug_clear() deletes all {count} tensor(s) in {where} and there is no "
                "terminal to ask: call debug_clear(confirm=False) (or confirm=True), or "
                "debug_clear(NAME) for one"
            )
    return clear_tensors(name)


def _interactive() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):  # a closed or odd stdin cannot ask
        return False


def read_header(path: Path) -> R.TensorHeader:
    """dtype, shape and metadata from a safetensors header, without reading the data."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > 100_000_000:
            raise ValueError(f"{path} is not a safetensors file (header length {length})")
        header = json.loads(fh.read(length))
    entry = header.get(KEY) or next((v for k, v in header.items() if k != "__metadata__"), None)
    if not isinstance(entry, dict):
        raise ValueError(f"{path} holds no tensor")
    return {
        "dtype": entry.get("dtype"),
        "shape": entry.get("shape"),
        "metadata": header.get("__metadata__") or {},
    }


def tensor_info(name: str, home: Path | None = None) -> R.TensorRecord:
    path = _path(name, home)
    if not path.exists():
        raise FileNotFoundError(f"no tensor named {name!r} in {path.parent}")
    return _describe(path)


def _describe(path: Path) -> R.TensorRecord:
    info: R.TensorRecord = {
        "name": path.name[: -len(SUFFIX)],
        "path": str(path),
        "size_bytes": path.stat().st_size,
    }
    try:
        info.update(read_header(path))
    except (OSError, ValueError) as exc:
        info["error"] = f"unreadable: {exc}"
    return info


def list_tensors(home: Path | None = None) -> list[R.TensorRecord]:
    directory = store_dir(home)
    if not directory.is_dir():
        return []
    paths = sorted(p for p in directory.glob(f"*{SUFFIX}") if not p.name.startswith("."))
    return [_describe(p) for p in paths]


def clear_tensors(name: str | None = None, home: Path | None = None) -> list[str]:
    """Delete one tensor or all of them; returns the names removed."""
    if name is not None:
        path = _path(name, home)
        if not path.exists():
            raise FileNotFoundError(f"no tensor named {name!r} in {path.parent}")
        path.unlink()
        return [name]
    removed = [item["name"] for item in list_tensors(home)]
    directory = store_dir(home)
    if directory.is_dir():
        shutil.rmtree(directory)
    return removed
