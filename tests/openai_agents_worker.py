"""Turns of the Agents SDK desk in their own OS process, for tests/test_openai_agents.py.

Run as ``python tests/openai_agents_worker.py '<json config>'``: ``store`` (see
:meth:`proving_support.Store.config`), ``ledger`` (the provider's file), ``turns``
(``[{"thread_id", "turn_id", "message"}]`` or ``"answer": {Answer fields}`` instead of
``"message"``), and an optional ``fault`` ``{"point"}`` at which the process sends
itself SIGKILL, armed before the first turn. Each finished turn prints one JSON line:
``{"turn_id", "result", "outputs", "model_requests"}``: the tool outputs the model's
last request carried, and how many requests this process sent the model.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from intention_kernel import Answer, Kernel
from intention_kernel.testing import faults
from openai_agents_support import Desk, outputs
from proving_support import open_store


def kill(point: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # a real death: nothing after this runs


async def main(config: dict[str, Any]) -> None:
    desk = Desk(config["ledger"])
    async with open_store(config["store"]) as durability:
        kernel = Kernel(desk.bridge.as_agent(version="1"), durability)
        fault = config.get("fault")
        if fault is not None:
            faults.inject(fault["point"], kill)
        for turn in config["turns"]:
            answer = Answer(**turn["answer"]) if "answer" in turn else None
            result = await kernel.turn(
                turn["thread_id"], turn["turn_id"], turn.get("message"), answer=answer
            )
            last = desk.requests[-1] if desk.requests else []
            print(
                json.dumps(
                    {
                        "turn_id": turn["turn_id"],
                        "result": result.to_dict(),
                        "outputs": [list(o) for o in outputs(last)],
                        "model_requests": len(desk.requests),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
