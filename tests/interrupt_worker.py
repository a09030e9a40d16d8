"""One delivery of an interrupted turn in its own OS process, for tests/test_inbox_kills.py.

Run as ``python tests/interrupt_worker.py '<json config>'``:

- ``store``: :meth:`proving_support.Store.config`.
- ``files``: ``{"entered", "release"}``: a file created once the model is asked,
  and the file whose creation lets the model answer.
- ``turn``: ``{"thread_id", "turn_id", "message"}``.
- ``fault``: optional, a commit's fault point where the process exits at once
  (``os._exit``, no cleanup), armed for one pass.

The model asks for two balance look-ups, once released. The agent interrupts
(``on_busy="interrupt"``), and every safe point reads the store. The process prints
one JSON line per read of the store at a safe point, ``{"stop": found}``, and
``{"result": ...}`` with the result (unless it died first).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from intention_kernel import Intent, Interpretation, InterpretationRequest, Kernel
from intention_kernel.testing import faults
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import open_store


class HeldModel:
    """Says it was asked, waits for the release file, then asks for two look-ups."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        Path(self.files["entered"]).touch()  # noqa: ASYNC240
        while not Path(self.files["release"]).exists():  # noqa: ASYNC110, ASYNC240
            await asyncio.sleep(0.01)
        return Interpretation(
            intents=[Intent("billing.balance", {"due": 1}), Intent("billing.balance", {})]
        )


async def main(config: dict[str, Any]) -> None:
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=HeldModel(config["files"]), on_busy="interrupt"
    )
    async with open_store(config["store"]) as durability:
        if config.get("fault") is not None:
            faults.inject(config["fault"], "exit")
        read_cancel = durability.read_cancel  # type: ignore[attr-defined]

        async def read_then_say(*args: Any) -> Any:
            found = await read_cancel(*args)
            print(json.dumps({"stop": found[0]}), flush=True)  # before the turn goes on
            return found

        durability.read_cancel = read_then_say  # type: ignore[attr-defined]
        turn = config["turn"]
        # Every safe point reads the store: the turn is young when the stop comes.
        kernel = Kernel(agent, durability, cancel_check_after=0.0)
        result = await kernel.turn(turn["thread_id"], turn["turn_id"], turn["message"])
        print(json.dumps({"result": result.to_dict()}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
