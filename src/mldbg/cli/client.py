"""Where the README has always named it: ``mldbg.cli.client.Client`` (the typed client).

The client lives in :mod:`mldbg.client`, beside the CLI, the MCP server and the daemon.
"""

from ..client.api import Client, connect
from ..errors import DaemonError

__all__ = ["Client", "DaemonError", "connect"]
