"""One delivery of an agent whose tools come from an MCP server, in its own OS process,
for tests/test_mcp.py.

Run as ``python tests/mcp_desk_worker.py '<json config>'``: ``db`` (a durability URL),
``dir`` (the tickets server's directory, see ``mcp_tickets_server.py``, which this
process starts over stdio), ``turn_id``, ``message`` and an optional ``fault`` point,
armed to exit the process there (``os._exit``, as by SIGKILL; with ``"action":
"sigkill"``, by a real SIGKILL). Prints the turn's ``TurnResult.to_dict()`` as one JSON
line.
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

from intention_kernel import Agent, Intent, Interpretation, Kernel
from intention_kernel.durability import open_durability
from intention_kernel.integrations.mcp import mcp_capabilities
from intention_kernel.testing import ScriptedInterpreter, faults

SERVER = Path(__file__).with_name("mcp_tickets_server.py")
SCRIPT = {
    "open a ticket": Interpretation(
        intents=[Intent("tickets.create_ticket", {"title": "Printer jam", "priority": 2})]
    ),
    "yes": Interpretation(answer="accept"),
}


async def main(config: dict[str, Any]) -> None:
    server = mcp.StdioServerParameters(
        command=sys.executable, args=[str(SERVER), "stdio", config["dir"]]
    )
    async with mcp.Client(server) as client, open_durability(config["db"]) as store:
        tools = await mcp_capabilities(client, namespace="tickets", trusted=True)
        agent = Agent(
            name="desk", version="1", capabilities=tools, interpreter=ScriptedInterpreter(SCRIPT)
        )
        kernel = Kernel(agent, store)
        if config.get("fault"):
            if config.get("action") == "sigkill":
                faults.inject(config["fault"], lambda point: os.kill(os.getpid(), signal.SIGKILL))
            else:
                faults.inject(config["fault"], "exit")
        result = await kernel.turn("t1", config["turn_id"], config["message"])
        print(json.dumps(result.to_dict()), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
