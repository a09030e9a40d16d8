"""Shared by the agent-loop and streaming tests: an interpreter whose second round
waits for a gate. (Their ``store`` fixture, each kind of store in turn, is in
``conftest.py``.)"""

from __future__ import annotations

import asyncio

from intention_kernel import Intent, Interpretation, InterpretationRequest

__all__ = ["GatedRounds"]


class GatedRounds:
    """Works in rounds; round 2 waits for ``gate`` before it answers."""

    multi_round = True

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.calls = 0

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        self.calls += 1
        if not request.rounds:
            return Interpretation(intents=[Intent("billing.balance", {"due": 5})])
        await self.gate.wait()
        return Interpretation(reply="You owe 5.")
