"""One delivery in a process that dies right after the tool's call.

``python -m examples.mcp_desk.crash DB THREAD TURN_ID MESSAGE``: builds the desk agent
(with a server process of its own), arms the kernel's ``after_receipt_completed``
fault point to exit the process there (``os._exit``, as a SIGKILL would: no cleanup,
no commit), and delivers the turn. The ticket is opened on the server and its receipt
is completed, but the turn never commits: the delivery is still to be made.
"""

from __future__ import annotations

import asyncio
import sys

from examples.mcp_desk.agent import build_agent, connect
from intention_kernel import Kernel
from intention_kernel.durability import open_durability
from intention_kernel.integrations.mcp import mcp_capabilities
from intention_kernel.testing import faults


async def main(db: str, thread: str, turn_id: str, message: str) -> None:
    async with connect(thread) as client, open_durability(db) as store:
        tools = await mcp_capabilities(client, namespace="tickets", trusted=True)
        kernel = Kernel(build_agent(tools), store)
        faults.inject(faults.AFTER_RECEIPT_COMPLETED, "exit")
        result = await kernel.turn(thread, turn_id, message)
        # Reached only when the turn was already committed (a rerun replays it).
        print(f"[{turn_id}] already committed: replayed={result.replayed}")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
