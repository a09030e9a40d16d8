"""An agent for tests/test_host_drain.py, served by ``intention-kernel serve``.

Its model works in rounds and writes each ask to ``$DRAIN_DIR/asks`` (one JSON line).
Round 1 of ``paint it`` creates ``$DRAIN_DIR/entered`` and waits for
``$DRAIN_DIR/release`` (unless ``$DRAIN_DIR/released`` says a delivery went past it),
then looks up a balance; round 2 replies ``done``. Any other message replies at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

from intention_kernel import Agent, Intent, Interpretation, InterpretationRequest
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import append_line


class HeldModel:
    multi_round = True

    def __init__(self, root: Path) -> None:
        self.root = root

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        number = len(request.rounds) + 1
        append_line(str(self.root / "asks"), {"round": number, "pid": os.getpid()})
        if request.message != "paint it":
            return Interpretation(reply="at once")
        if number == 1:
            (self.root / "entered").touch()
            while not (self.root / "release").exists():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            return Interpretation(intents=[Intent("billing.balance", {"due": 4})])
        return Interpretation(reply="done")


def agent() -> Agent:
    root = Path(os.environ["DRAIN_DIR"])
    return dataclasses.replace(billing_agent(FakeProvider()), interpreter=HeldModel(root))
