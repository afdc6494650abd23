"""How answers look to a person: the renderer of each verb (``render``), the two consoles
they print to (``console``) and the compare report (``compare``).  The CLI prints with
them; the MCP server gives their text beside each tool's structured answer."""
