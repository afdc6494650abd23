"""What the debugged process holds in memory at a stop: MLX's allocator, torch's, the process.

Porting bugs show up as memory long before they show up as wrong numbers (a lazy MLX
graph that is never evaluated, an fp32 copy the reference never made, a cache that only
grows), so every stop carries these few numbers.  Standard library only: this runs inside
the debugged script, and a framework is read only when the script has already imported it
(``sys.modules``); nothing here imports torch or MLX, and nothing initialises a device
(CUDA is read only once the script has initialised it).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any


def snapshot() -> dict[str, Any]:
    """``{"process": {...}, "mlx": {...}, "torch": {...}}``, each part only where it applies.

    * ``process``: ``rss_bytes`` now and ``peak_rss_bytes`` (the OS's high-water mark).
    * ``mlx``: ``active_bytes``, ``peak_bytes``, ``cache_bytes`` (MLX's allocator) and the
      default ``device``.
    * ``torch``: ``cuda`` (``allocated_bytes``, ``peak_bytes``, ``reserved_bytes`` of the
      current device) once CUDA is initialised, ``mps`` (``allocated_bytes``,
      ``driver_bytes``) where MPS is in use; plain CPU tensors have no allocator to ask, the
      process numbers cover them.

    Never raises: a part that cannot be read is left out.
    """
    out: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        process = _process()
        if process:
            out["process"] = process
    with contextlib.suppress(Exception):
        mlx = _mlx()
        if mlx:
            out["mlx"] = mlx
    with contextlib.suppress(Exception):
        if "torch" in sys.modules:  # empty on a CPU-only run: the process numbers cover it
            out["torch"] = _torch()
    return out


def _process() -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/statm") as fh:
        out["rss_bytes"] = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["peak_rss_bytes"] = peak if sys.platform == "darwin" else peak * 1024  # KB on Linux
    return out


def _mlx() -> dict[str, int | str]:
    mx = sys.modules.get("mlx.core")
    if mx is None or not hasattr(mx, "get_active_memory"):
        return {}
    device = str(mx.default_device())
    return {
        "active_bytes": int(mx.get_active_memory()),
        "peak_bytes": int(mx.get_peak_memory()),
        "cache_bytes": int(mx.get_cache_memory()),
        "device": device.removeprefix("Device(").removesuffix(")").split(",")[0].strip(),
    }


def _torch() -> dict[str, dict[str, int]]:
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    out: dict[str, dict[str, int]] = {}
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        device = cuda.current_device()
        out["cuda"] = {
            "device": int(device),
            "allocated_bytes": int(cuda.memory_allocated(device)),
            "peak_bytes": int(cuda.max_memory_allocated(device)),
            "reserved_bytes": int(cuda.memory_reserved(device)),
        }
    mps = getattr(torch, "mps", None)
    if mps is not None and hasattr(mps, "current_allocated_memory"):
        backends = getattr(torch, "backends", None)
        available = getattr(getattr(backends, "mps", None), "is_available", lambda: False)
        if available():
            out["mps"] = {
                "allocated_bytes": int(mps.current_allocated_memory()),
                "driver_bytes": int(mps.driver_allocated_memory()),
            }
    return out


def one_line(memory: dict[str, Any]) -> str:
    """``mlx active 64.0 MB peak 128.0 MB cache 0 B · cuda ... · rss 1.2 GB`` for humans."""
    parts = []
    mlx = memory.get("mlx")
    if mlx:
        parts.append(
            f"mlx ({mlx.get('device')}) active {human_size(mlx['active_bytes'])} peak "
            f"{human_size(mlx['peak_bytes'])} cache {human_size(mlx['cache_bytes'])}"
        )
    torch = memory.get("torch") or {}
    if torch.get("cuda"):
        c = torch["cuda"]
        parts.append(
            f"cuda:{c['device']} allocated {human_size(c['allocated_bytes'])} peak "
            f"{human_size(c['peak_bytes'])} reserved {human_size(c['reserved_bytes'])}"
        )
    if torch.get("mps"):
        m = torch["mps"]
        parts.append(
            f"mps allocated {human_size(m['allocated_bytes'])} driver {human_size(m['driver_bytes'])}"
        )
    if "torch" in memory and not torch:
        parts.append("torch (cpu: no allocator of its own)")
    process = memory.get("process")
    if process and "rss_bytes" in process:
        peak = process.get("peak_rss_bytes")
        parts.append(
            f"rss {human_size(process['rss_bytes'])}"
            + (f" (peak {human_size(peak)})" if peak else "")
        )
    return " · ".join(parts)


def human_size(n: int) -> str:
    """Bytes as people read them: ``512 B``, ``1.5 MB``."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"
