"""A capture on disk: ``runs/<run>/captures/<name>/`` with an index and tensor files.

Layout::

    capture.json          name, framework, model class, options, state, counts
    index.jsonl           one line when a module call starts (its inputs) and one when it
                          ends (its outputs), in the order they happened
    000012.in.safetensors / 000012.out.safetensors   the tensors of call 12

Each tensor file is written whole (temp file, then rename) before its index line is
appended and flushed, so a crash or kill at any point leaves a readable prefix.  The
entry name of a tensor is ``<module>#<call>.<key>``: the module path as
``named_modules()`` gives it (``<root>`` for the model itself), the call index of that
module, and the key from :mod:`.flatten`.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from ..store.runs import PRIVATE_DIR, JsonlWriter, RunDir, make_private_dirs, write_json_atomic

CAPTURES = "captures"
CAPTURE_JSON = "capture.json"
INDEX = "index.jsonl"
ROOT = "<root>"
MAX_NAME = 100  # characters of a capture's name
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=@-]{0,99}")


def check_capture_name(name: str) -> str:
    """``name`` if it is a capture's name.  ``fullmatch``: with ``match``, ``$`` also
    matches before a final newline, and ``"ref\n"`` became a directory."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        shown = (
            repr(name) if not isinstance(name, str) or len(name) <= 120 else repr(name[:120]) + "…"
        )
        raise ValueError(
            f"bad capture name {shown}: use letters, digits and _ . + = @ - "
            "(no '/', no '..', not starting with '.'), at most 100 characters"
        )
    return name


def module_label(path: str) -> str:
    return path or ROOT


def entry_name(path: str, call: int, key: str) -> str:
    return f"{module_label(path)}#{call}.{key}"


class CaptureDir:
    """Creates one capture's directory and appends to its index.

    The capture's name is its directory's: ``ref``, or ``ref-2`` when this run already
    has a ``ref`` (then ``requested_name`` keeps ``ref``), so ``mldbg compare ref-2`` finds it.
    """

    def __init__(self, run: RunDir, name: str, meta: dict[str, Any]) -> None:
        root = run.file(CAPTURES)
        make_private_dirs(root)  # captures hold activations: private, like the run store
        self.path = _unique_dir(root, check_capture_name(name))
        self.name = self.path.name
        self.meta: dict[str, Any] = {
            "name": self.name,
            **({"requested_name": name} if name != self.name else {}),
            "run_id": run.run_id,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "created": time.time(),
            "state": "capturing",
            "records": 0,
            "tensors": 0,
            "bytes": 0,
            **meta,
        }
        try:
            write_json_atomic(self.path / CAPTURE_JSON, self.meta)
            self.index = JsonlWriter(self.path / INDEX)
        except BaseException:
            with contextlib.suppress(OSError):
                for leftover in self.path.iterdir():
                    leftover.unlink()
                self.path.rmdir()
            raise

    def tensor_path(self, seq: int, role: str) -> tuple[Path, Path]:
        """The final file and a temp name beside it (the same suffix: MLX insists on it)."""
        final = self.path / f"{seq:06d}.{role}.safetensors"
        tmp = self.path / f".{seq:06d}.{role}.{os.getpid()}.{secrets.token_hex(3)}.safetensors"
        return final, tmp

    def finish(self, state: str, **fields: Any) -> list[str]:
        """Close the index and write the final ``capture.json``; returns what failed (never raises)."""
        errors: list[str] = []
        try:
            self.index.close()
        except Exception as exc:  # its last lines could not be flushed (a full disk)
            errors.append(f"{INDEX}: {type(exc).__name__}: {exc}")
        self.meta.update(state=state, finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields)
        if errors:
            self.meta["write_errors"] = [*self.meta.get("write_errors", []), *errors]
            self.meta["write_error_count"] = self.meta.get("write_error_count", 0) + len(errors)
            if self.meta["state"] == "complete":
                self.meta["state"] = "incomplete"
        try:
            write_json_atomic(self.path / CAPTURE_JSON, self.meta)
        except Exception as exc:
            errors.append(f"{CAPTURE_JSON}: {type(exc).__name__}: {exc}")
        return errors


def _unique_dir(root: Path, name: str) -> Path:
    """``name``, or ``name-2``, ``name-3``… when this run already captured under that name."""
    candidate, n = root / name, 1
    while True:
        try:
            candidate.mkdir(mode=PRIVATE_DIR)
            candidate.chmod(PRIVATE_DIR)  # whatever the umask
            return candidate
        except FileExistsError:
            n += 1
            candidate = root / f"{name}-{n}"
