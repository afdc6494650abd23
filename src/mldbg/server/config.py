"""Where clients find the daemon: ``server.json`` in the config directory (mode 0600).

The directory is ``$MLDBG_CONFIG_DIR`` or ``~/.mldbg``; it holds the URL, pid and the
bearer token, so it is readable by its owner only.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

SERVER_JSON = "server.json"


def config_dir() -> Path:
    configured = os.environ.get("MLDBG_CONFIG_DIR")
    path = Path(configured).expanduser() if configured else Path.home() / ".mldbg"
    # Created private; an existing directory is never re-moded (it may be shared, on purpose).
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def server_file() -> Path:
    return config_dir() / SERVER_JSON


def write_server_info(info: dict[str, Any]) -> None:
    # Imported here: the run store module (secrets, threading...) is the daemon's; every CLI
    # command reads this config and should not pay for it.
    from ..runs import write_json_atomic

    path = server_file()
    old_umask = os.umask(0o077)  # the temp file is born 0600: the token is never world-readable
    try:
        write_json_atomic(path, info)
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)


def read_server_info() -> dict[str, Any] | None:
    try:
        with open(server_file(), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and {"url", "token", "pid"} <= data.keys() else None


def remove_server_info(pid: int) -> None:
    """Remove server.json only if it still describes this daemon."""
    info = read_server_info()
    if info is not None and info.get("pid") == pid:
        with contextlib.suppress(OSError):
            server_file().unlink()
