"""``mldbg.capture``: record every submodule call of a PyTorch or MLX model.

Standard library only at import time (``import mldbg`` must stay cheap inside any
script); torch or MLX is imported when a model of theirs is captured.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from ..current_run import current_run
from .recorder import Recorder
from .store import CaptureDir, check_capture_name, module_label

__all__ = ["Capture", "capture"]


def _framework(model: object) -> str:
    for cls in type(model).__mro__:
        module = cls.__module__ or ""
        if module.startswith("torch.nn"):
            return "torch"
        if module.startswith("mlx.nn"):
            return "mlx"
    raise TypeError(
        f"mldbg.capture takes a torch.nn.Module or an mlx.nn.Module, not {type(model).__qualname__}"
    )


def _patterns(value: str | Iterable[str] | None, option: str) -> list[str] | None:
    if value is None:
        return None
    patterns = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(p, str) and p for p in patterns):
        raise TypeError(f"{option} takes glob patterns on module paths, e.g. 'model.layers.*'")
    return patterns


class Capture:
    """A capture in progress or done: ``with mldbg.capture(model, "ref") as cap: model(x)``.

    After the block, ``cap.path`` is the directory and ``cap.records`` / ``cap.tensors`` /
    ``cap.bytes`` say how much was written; ``cap.errors`` lists tensors that could not be
    written (a full disk), which never stop the model.
    """

    def __init__(
        self,
        model: Any,
        name: str,
        *,
        inputs: bool = True,
        include: str | Iterable[str] | None = None,
        exclude: str | Iterable[str] | None = None,
    ) -> None:
        self.model = model
        self.name = check_capture_name(name)
        self.framework = _framework(model)
        self.inputs = inputs
        self.include = _patterns(include, "include")
        self.exclude = _patterns(exclude, "exclude")
        self.path: Path | None = None
        self._directory: CaptureDir | None = None
        self._recorder: Recorder | None = None
        self._detach: Callable[[], None] | None = None
        self._started = 0.0

    def keeps(self, path: str) -> bool:
        """Whether module ``path`` is recorded: matches an include (if any), no exclude."""
        label = module_label(path)
        if self.include is not None and not any(
            fnmatch.fnmatchcase(label, p) for p in self.include
        ):
            return False
        return not (self.exclude and any(fnmatch.fnmatchcase(label, p) for p in self.exclude))

    def __enter__(self) -> Capture:
        if self._directory is not None:
            raise RuntimeError(f"capture {self.name!r} was already used; make a new one")
        if self.framework == "torch":
            from . import torch_hooks as backend
        else:
            from . import mlx_wrappers as backend  # type: ignore[no-redef]
        self._directory = CaptureDir(
            current_run(),
            self.name,
            {
                "framework": self.framework,
                "model_class": f"{type(self.model).__module__}.{type(self.model).__qualname__}",
                "inputs": self.inputs,
                "include": self.include,
                "exclude": self.exclude,
            },
        )
        self.path = self._directory.path
        self._recorder = Recorder(self._directory, backend.save, self.inputs)
        self._started = time.perf_counter()
        try:
            self._detach = backend.attach(self.model, self._recorder, self.keeps)
        except BaseException as exc:
            self._directory.finish("failed", error=f"{type(exc).__name__}: {exc}")
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._detach is not None:
            self._detach()
            self._detach = None
        assert self._directory is not None and self._recorder is not None
        fields: dict[str, Any] = {
            "records": self._recorder.records,
            "tensors": self._recorder.tensors,
            "bytes": self._recorder.bytes,
            "seconds": round(time.perf_counter() - self._started, 3),
        }
        if self._recorder.errors:
            fields["write_errors"] = self._recorder.errors[:100]
        if exc is not None:
            fields["error"] = f"{type(exc).__name__}: {exc}"
        self._directory.finish("failed" if exc is not None else "complete", **fields)

    @property
    def records(self) -> int:
        return self._recorder.records if self._recorder else 0

    @property
    def tensors(self) -> int:
        return self._recorder.tensors if self._recorder else 0

    @property
    def bytes(self) -> int:
        return self._recorder.bytes if self._recorder else 0

    @property
    def errors(self) -> list[str]:
        return list(self._recorder.errors) if self._recorder else []

    def __repr__(self) -> str:
        return (
            f"<mldbg capture {self.name!r} ({self.framework}) {self.records} calls at {self.path}>"
        )


def capture(
    model: Any,
    name: str,
    *,
    inputs: bool = True,
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
) -> Capture:
    """Record every submodule call of ``model`` while the ``with`` block runs.

    Inputs (unless ``inputs=False``) and outputs of each call go to the current run's
    ``captures/<name>/``; ``include`` / ``exclude`` are glob patterns on module paths
    (``<root>`` is the model itself).  Compare two captures with ``mldbg compare``.
    """
    return Capture(model, name, inputs=inputs, include=include, exclude=exclude)
