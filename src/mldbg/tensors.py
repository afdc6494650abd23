"""The tensor store: ``debug_save`` / ``debug_load`` move exact tensors between frameworks.

Each tensor is one safetensors file under ``MLDBG_HOME/tensors/NAME.safetensors``; its
header's metadata says where and when it was saved.  Bytes are never converted, so a
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
from pathlib import Path
from typing import Any

from .errors import MldbgError
from .runs import mldbg_home

SUFFIX = ".safetensors"
KEY = "tensor"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=@-]{0,199}$")
_warned = False


class TensorStoreFull(MldbgError):
    code = "tensor_store_full"


def store_dir(home: Path | None = None) -> Path:
    return (home or mldbg_home()) / "tensors"


def _limit(variable: str, default_gb: float) -> float:
    raw = os.environ.get(variable)
    if not raw:
        return default_gb * 1e9
    try:
        return float(raw) * 1e9
    except ValueError:
        raise ValueError(f"{variable}={raw!r} is not a number of gigabytes") from None


def check_name(name: str) -> str:
    """Names are single file names: no '/', no '..', nothing hidden."""
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
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
    global _warned
    current = store_size(home)
    limit = _limit("MLDBG_TENSORS_MAX_GB", 10)
    where = store_dir(home)
    free = (
        f"free space with `mldbg tensors clear --yes` (or `--name NAME`) in {where.parent.parent}"
    )
    if current + incoming > limit:
        raise TensorStoreFull(
            f"the tensor store {where} holds {current / 1e9:.2f} GB; saving {incoming / 1e9:.2f} GB more "
            f"would pass its limit of {limit / 1e9:.2f} GB (MLDBG_TENSORS_MAX_GB); {free}",
            size_bytes=current,
            limit_bytes=int(limit),
        )
    if current + incoming > _limit("MLDBG_TENSORS_WARN_GB", 1) and not _warned:
        _warned = True
        warnings.warn(
            f"the mldbg tensor store {where} holds {(current + incoming) / 1e9:.2f} GB; {free}",
            stacklevel=3,
        )


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
    framework = _framework(tensor)
    path = _path(name)
    _guard(_nbytes(tensor, framework), None)
    path.parent.mkdir(parents=True, exist_ok=True)
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


def debug_load(name: str, *, to: str = "torch") -> Any:
    """The tensor stored under ``name``, as a ``to`` tensor with the same dtype and bytes."""
    path = _path(name)
    if not path.exists():
        stored = [item["name"] for item in list_tensors()]
        close = difflib.get_close_matches(name, stored, n=5, cutoff=0.3)
        hint = (
            f"; closest stored names: {', '.join(close)}"
            if close
            else (f"; stored: {', '.join(stored[:10])}" if stored else "; the store is empty")
        )
        raise FileNotFoundError(f"no tensor named {name!r} in {path.parent}{hint}")
    if to == "torch":
        from safetensors.torch import load_file

        return load_file(str(path))[KEY]
    if to == "mlx":
        import mlx.core as mx

        loaded: Any = mx.load(str(path))
        return loaded[KEY]
    if to == "numpy":
        header = read_header(path)
        if header["dtype"] == "BF16":
            try:
                import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
            except ImportError:
                raise TypeError(
                    f"{name!r} is bfloat16, which numpy has no dtype for: `pip install ml_dtypes`, "
                    "or load it with to='torch' or to='mlx'"
                ) from None
        from safetensors.numpy import load_file as load_numpy

        return load_numpy(str(path))[KEY]
    raise ValueError(f"to={to!r}: use 'torch', 'mlx' or 'numpy'")


def read_header(path: Path) -> dict[str, Any]:
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


def tensor_info(name: str, home: Path | None = None) -> dict[str, Any]:
    path = _path(name, home)
    if not path.exists():
        raise FileNotFoundError(f"no tensor named {name!r} in {path.parent}")
    return _describe(path)


def _describe(path: Path) -> dict[str, Any]:
    info: dict[str, Any] = {
        "name": path.name[: -len(SUFFIX)],
        "path": str(path),
        "size_bytes": path.stat().st_size,
    }
    try:
        info.update(read_header(path))
    except (OSError, ValueError) as exc:
        info["error"] = f"unreadable: {exc}"
    return info


def list_tensors(home: Path | None = None) -> list[dict[str, Any]]:
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
