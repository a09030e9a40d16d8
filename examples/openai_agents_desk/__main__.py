"""Run the help desk: ``python -m examples.openai_agents_desk [--db URL] [--thread ID]``.

An OpenAI Agents SDK agent inside durable turns: a read, a cancel that the provider
sees once although the turn is delivered again, a refund held for approval (its paused
``RunState`` in the thread's checkpoint) across a restart, and the "yes" that resumes
exactly that run and refunds once; the model reads the result and writes the reply.
``python -m examples.openai_agents_desk.crash`` kills a process mid-turn and delivers
the turn again (see its docstring).
"""

from __future__ import annotations

import asyncio
import sys

from examples._conversation import (
    Redeliver,
    Restart,
    Say,
    Step,
    parse_args,
    print_provider,
    print_summary,
    run,
)
from examples._desk import FakeShop
from examples.openai_agents_desk.agent import build_agent

SCRIPT: list[Step] = [
    Say("status of order 42"),
    Say("cancel order 43"),
    Redeliver(),
    Say("refund order 42"),
    Restart(),
    Say("yes"),
    Redeliver(),
]


async def main() -> None:
    options = parse_args("openai_agents_desk", "An OpenAI Agents SDK help desk in durable turns.")
    if options.llm:
        sys.exit("this example's model is a scripted agents Model: --llm does not apply")
    shop = FakeShop()  # the outside world: it outlives the restart
    tally = await run(options, SCRIPT, lambda interpreter: build_agent(shop))
    print_summary(tally, len(shop.calls))
    print_provider(shop.calls, "applied")


if __name__ == "__main__":
    asyncio.run(main())
