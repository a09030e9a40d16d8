"""A model in rounds that streams its text, for the turn-stream tests and their worker."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

from intention_kernel import (
    Agent,
    Intent,
    Interpretation,
    InterpretationRequest,
    Interpreter,
    Kernel,
)
from intention_kernel.durability import Durability
from intention_kernel.testing._agents import FakeProvider, billing_agent


class StreamingRounds:
    """Three rounds: two read the balance, the third writes the reply. Each round
    streams two pieces of text. ``hang``: that round streams one provisional piece, then
    waits forever. ``gate``: round 3 waits for it (the turn stays running). ``slow``:
    round 2 first sleeps that long."""

    multi_round = True

    def __init__(
        self, hang: int | None = None, gate: asyncio.Event | None = None, slow: float = 0.0
    ) -> None:
        self.hang, self.gate, self.slow = hang, gate, slow

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        number = len(request.rounds) + 1
        stream = request.stream or (lambda text: None)  # not streamed: ``kernel.turn``
        if number == self.hang:
            stream(f"r{number} provisional ")
            await asyncio.Event().wait()
        if number == 3 and self.gate is not None:
            await self.gate.wait()
        if number == 2 and self.slow:
            await asyncio.sleep(self.slow)
        for piece in (f"r{number}a ", f"r{number}b "):
            stream(piece)
        if number < 3:
            return Interpretation(
                intents=[Intent("billing.balance", {"due": 7 * number})],
                reply=f"r{number}a r{number}b ",
            )
        return Interpretation(reply="r3a r3b ")


def streams_kernel(store: Durability, interpreter: Interpreter, **options: Any) -> Kernel:
    agent = dataclasses.replace(billing_agent(FakeProvider()), interpreter=interpreter)
    return Kernel(agent, store, **options)


#: The seconds round 2 of :func:`host_agent`'s model sleeps first.
SLOW_ENV = "STREAMS_TEST_SLOW"


def host_agent() -> Agent:
    """The billing agent with :class:`StreamingRounds` (for ``serve --agent``)."""
    model = StreamingRounds(slow=float(os.environ.get(SLOW_ENV, "0")))
    return dataclasses.replace(billing_agent(FakeProvider()), interpreter=model)
