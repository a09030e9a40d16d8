"""The tickets MCP server the desk example talks to over stdio.

``python examples/mcp_desk/server.py LEDGER``: ``lookup_order`` (read-only, by its
annotation) and ``create_ticket``, which appends one line to the ``LEDGER`` file for
every call that reaches it, before it answers, so that the example counts the calls
that reached the server even when the agent process that made one died.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

IDEMPOTENCY_KEY_META = "intention-kernel/idempotency-key"  # see intention_kernel.integrations.mcp

server = MCPServer("tickets")
ledger = Path(sys.argv[1])


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup_order(order_id: str) -> dict[str, str]:
    """Look up an order's status"""
    return {"order_id": order_id, "status": "shipped"}


@server.tool()
def create_ticket(title: str, priority: int, ctx: Context) -> dict[str, str]:
    """Open a support ticket"""
    meta = ctx.request_context.meta or {}
    with ledger.open("a") as f:
        f.write(json.dumps({"title": title, "key": meta.get(IDEMPOTENCY_KEY_META)}) + "\n")
    ticket_id = f"T-{sum(1 for _ in ledger.open())}"
    return {"ticket_id": ticket_id, "title": title}


if __name__ == "__main__":
    server.run()  # stdio
