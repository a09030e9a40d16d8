"""The support-desk example: an agent whose tools come from an MCP server."""
