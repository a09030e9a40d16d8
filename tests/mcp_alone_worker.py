"""A plain ``mcp`` client, with no intention-kernel, in its own OS process, for
tests/test_compare_mcp.py: it starts the tickets server (``mcp_tickets_server.py``) over
stdio and calls ``create_ticket`` once, as an application that does not know whether
an earlier attempt ran would call it again.

Run as ``python tests/mcp_alone_worker.py '<json config>'``: ``dir`` (the server's
directory) and an optional ``die_after_call``: the process sends itself SIGKILL as soon
as ``call_tool`` returned, before the application records the result. Prints the call's
structured result as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import mcp

SERVER = Path(__file__).with_name("mcp_tickets_server.py")
TICKET = {"title": "Printer jam", "priority": 2}


async def main(config: dict[str, Any]) -> None:
    server = mcp.StdioServerParameters(
        command=sys.executable, args=[str(SERVER), "stdio", config["dir"]]
    )
    async with mcp.Client(server) as client:
        result = await client.call_tool("create_ticket", TICKET)
        if config.get("die_after_call"):
            os.kill(os.getpid(), signal.SIGKILL)
        print(json.dumps(result.structured_content), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
