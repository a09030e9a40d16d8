"""Commits turns on a store from a process of its own, beside relay processes.

Run as ``python tests/turn_producer.py '<json>'``: ``url`` (an ``open_durability``
URL) and ``threads``. Turn 2, 3... is committed on every thread, round after round,
``pause`` seconds apart, until the file ``stop`` exists (checked after each round).
Prints the number of committed turns at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from intention_kernel import Kernel
from intention_kernel.durability import open_durability
from intention_kernel.testing._agents import FakeProvider, billing_agent


async def produce(config: dict[str, Any]) -> int:
    committed, turn = 0, 2
    async with open_durability(config["url"]) as store:
        kernel = Kernel(billing_agent(FakeProvider()), store)
        while True:
            for thread_id in config["threads"]:
                await kernel.turn(thread_id, str(turn), f"balance {turn}")
                committed += 1
                await asyncio.sleep(config["pause"])
            if _stopped(config["stop"]):
                return committed
            turn += 1


def _stopped(path: str) -> bool:
    return os.path.exists(path)


if __name__ == "__main__":
    print(asyncio.run(produce(json.loads(sys.argv[1]))))
