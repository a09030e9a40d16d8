"""Agents that need async set-up, for ``intention-kernel serve --agent`` (issue 31).

Each records in ``$ASYNC_AGENT_LOG`` what happened to it, one line each: ``entered``
with the ID of the running event loop, ``exited``. The agent is the demo's billing
agent (``host_support.billing_agent``); its capabilities record the loop they run on,
so a test can see that the agent was entered on the loop that serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

from host_support import billing_agent
from intention_kernel import Agent

LOG_ENV = "ASYNC_AGENT_LOG"


def log(line: str) -> None:
    with open(os.environ[LOG_ENV], "a", encoding="utf-8") as f:
        f.write(line + "\n")


@contextlib.asynccontextmanager
async def managed_agent() -> AsyncIterator[Agent]:
    """An ``@asynccontextmanager`` factory: set-up before serving, tear-down after."""
    await asyncio.sleep(0)
    log(f"entered {id(asyncio.get_running_loop())}")
    try:
        yield billing_agent()
    finally:
        log("exited")


#: The manager itself (not a factory): entered as it is.
MANAGED = managed_agent()


async def async_factory() -> Agent:
    """An async factory: awaited on the serving loop."""
    await asyncio.sleep(0)
    log(f"built {id(asyncio.get_running_loop())}")
    return billing_agent()


@contextlib.asynccontextmanager
async def failing_agent() -> AsyncIterator[Agent]:
    """Set-up that fails: the server it needs is not there."""
    raise ConnectionRefusedError("the MCP server at 127.0.0.1:1 refused the connection")
    yield billing_agent()  # pragma: no cover - never reached
