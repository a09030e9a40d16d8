"""Run the help desk: ``python -m examples.pydantic_ai_desk [--db URL] [--thread ID]``.

A Pydantic AI agent inside durable turns: a read, a cancel that the provider sees
once although the turn is delivered again, a refund held for approval across a
restart, and the "yes" that runs exactly the held refund once; the model reads its
result and writes the reply. ``python -m examples.pydantic_ai_desk.crash`` kills a
process mid-turn and delivers the turn again (see its docstring).
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
from examples.pydantic_ai_desk.agent import build_agent

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
    options = parse_args("pydantic_ai_desk", "A Pydantic AI help desk inside durable turns.")
    if options.llm:
        sys.exit("this example's model is Pydantic AI's FunctionModel: --llm does not apply")
    shop = FakeShop()  # the outside world: it outlives the restart
    tally = await run(options, SCRIPT, lambda interpreter: build_agent(shop))
    print_summary(tally, len(shop.calls))
    print_provider(shop.calls, "applied")


if __name__ == "__main__":
    asyncio.run(main())
