"""The MCP server (``mldbg mcp``): every verb of the verb table as a tool, over stdio."""
