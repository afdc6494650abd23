"""The mldbg daemon: sessions, the REST API and (later) the MCP server."""
