"""A small MCP server for tests/test_mcp.py, run as a real process.

``python mcp_tickets_server.py stdio DIR`` or ``python mcp_tickets_server.py http PORT DIR``.
Every tool call is appended to ``DIR/calls.jsonl`` (tool, arguments, the request's
``_meta``) before the tool does anything else, so a test counts calls on the server's
side. While ``DIR/hang`` exists, ``create_ticket`` logs its call and then waits, for a
test that kills the server mid-call; the server's PID is in ``DIR/pid``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS, ToolAnnotations

DIR = Path(sys.argv[-1])
server = MCPServer("tickets")
TICKETS: dict[str, str] = {}
# Numbers are never reused: a closed ticket's number is not given to a call finishing late.
NUMBERS = itertools.count(1)
# Sync tools run on worker threads, so a lost call and its retry may number at once.
NUMBERING = threading.Lock()


def log_call(tool: str, arguments: dict[str, Any], ctx: Context) -> None:
    meta = ctx.request_context.meta
    line = {"tool": tool, "arguments": arguments, "meta": dict(meta) if meta else {}}
    with (DIR / "calls.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup_order(order_id: str, ctx: Context) -> dict[str, str]:
    """Look up an order's status."""
    log_call("lookup_order", {"order_id": order_id}, ctx)
    return {"order_id": order_id, "status": "shipped"}


@server.tool()
def create_ticket(title: str, priority: int, ctx: Context) -> dict[str, str]:
    """Open a support ticket."""
    log_call("create_ticket", {"title": title, "priority": priority}, ctx)
    while (DIR / "hang").exists():
        time.sleep(0.05)
    with NUMBERING:
        ticket_id = f"T-{next(NUMBERS)}"
        TICKETS[ticket_id] = title
    return {"ticket_id": ticket_id}


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
def close_ticket(ticket_id: str, ctx: Context) -> str:
    """Close a ticket."""
    log_call("close_ticket", {"ticket_id": ticket_id}, ctx)
    if ticket_id not in TICKETS:
        raise ToolError(f"no ticket {ticket_id}")
    del TICKETS[ticket_id]
    return f"closed {ticket_id}"


@server.tool()
def refund(amount: int, ctx: Context) -> str:
    """Refund an amount; the ledger refuses a negative one and fails on 13."""
    log_call("refund", {"amount": amount}, ctx)
    if amount < 0:
        raise MCPError(INVALID_PARAMS, "amount must not be negative")
    if amount == 13:
        raise MCPError(INTERNAL_ERROR, "the ledger failed halfway")
    return f"refunded {amount}"


if __name__ == "__main__":
    (DIR / "pid").write_text(str(os.getpid()))
    if sys.argv[1] == "http":
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
