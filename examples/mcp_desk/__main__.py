"""Run the desk conversation: ``python -m examples.mcp_desk [--db URL] [--thread ID] [--llm]``.

A read answered by the MCP server at once, a ticket that waits for confirmation across a
restart, a worker process that delivers the "yes" and dies right after the tool's call,
the same delivery made again (the receipt answers: the server is not called again), the
same delivery retried (replayed), and the same ticket asked for and accepted again.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

from examples._conversation import (
    Meanwhile,
    Redeliver,
    Restart,
    Say,
    Step,
    parse_args,
    print_summary,
    run,
)
from examples.mcp_desk.agent import build_agent, connect, ledger_path
from intention_kernel.integrations.mcp import mcp_capabilities


def lines(thread: str) -> int:
    path = ledger_path(thread)
    return len(path.read_text().splitlines()) if path.exists() else 0


def crash(db: str, thread: str, turn_id: str, message: str) -> None:
    """Deliver ``turn_id`` in a worker process that dies right after the tool's call."""
    worker = subprocess.run(
        [sys.executable, "-m", "examples.mcp_desk.crash", db, thread, turn_id, message],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    print(worker.stdout, end="")
    if worker.returncode != 0:
        print(f"[{turn_id}] the worker delivering {message!r} died (exit {worker.returncode})")


async def main() -> None:
    options = parse_args("mcp_desk", "A support desk whose tools come from an MCP server.")
    before = lines(options.thread)
    script: list[Step] = [
        Say("where is order 7?"),
        Say("please open a ticket for the printer"),
        Restart(),
        Meanwhile(
            "a worker process delivered turn-3, armed to die right after the tool's call",
            lambda: crash(options.db, options.thread, "turn-3", "yes"),
        ),
        Say("yes"),
        Redeliver(),
        Say("please open a ticket for the printer"),
        Say("yes"),
    ]
    print(f"tickets ledger: {ledger_path(options.thread)}")
    async with connect(options.thread) as client:
        tools = await mcp_capabilities(client, namespace="tickets", trusted=True)
        tally = await run(options, script, lambda interpreter: build_agent(tools, interpreter))
    print_summary(tally, lines(options.thread) - before)


if __name__ == "__main__":
    asyncio.run(main())
