"""Run the help desk: ``python -m examples.pydantic_ai_desk [--db URL] [--thread ID]``.

A Pydantic AI agent inside durable turns: a read, a cancel that the provider sees
once although the turn is delivered again, a refund held for approval across a
restart, and the "yes" that runs exactly the held refund once; the model reads its
result and writes the reply. ``python -m examples.pydantic_ai_desk.crash`` kills a
process mid-turn and delivers the turn again (see its docstring).
"""

from __future__ import annotations

import asyncio

from examples._desk import play
from examples.pydantic_ai_desk.agent import build_agent


async def main() -> None:
    await play(
        "pydantic_ai_desk",
        "A Pydantic AI help desk inside durable turns.",
        "Pydantic AI's FunctionModel",
        build_agent,
    )


if __name__ == "__main__":
    asyncio.run(main())
