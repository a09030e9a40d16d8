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

from examples._desk import play
from examples.openai_agents_desk.agent import build_agent


async def main() -> None:
    await play(
        "openai_agents_desk",
        "An OpenAI Agents SDK help desk in durable turns.",
        "a scripted agents Model",
        build_agent,
    )


if __name__ == "__main__":
    asyncio.run(main())
