"""Run the help desk: ``python -m examples.langgraph_desk [--db URL] [--thread ID]``.

A LangGraph ReAct agent inside durable turns: a read, a cancel that the provider sees
once although the turn is delivered again, a refund held for approval across a
restart, and the "yes" that runs exactly the held refund once; the model reads its
result and writes the reply. ``python -m examples.langgraph_desk.crash`` kills a
process mid-turn and delivers the turn again (see its docstring).
"""

from __future__ import annotations

import asyncio

from examples._desk import play
from examples.langgraph_desk.agent import build_agent


async def main() -> None:
    await play(
        "langgraph_desk",
        "A LangGraph help desk inside durable turns.",
        "a scripted LangChain chat model",
        build_agent,
    )


if __name__ == "__main__":
    asyncio.run(main())
