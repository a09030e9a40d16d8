"""One process of tests/test_inbox_soak.py: it delivers its messages to one thread of
a ``"queue"`` agent, and is killed (SIGKILL) and started again at random.

Run as ``python tests/inbox_soak_worker.py '<json config>'``. The config holds
``store`` (:meth:`proving_support.Store.config`), ``thread_id``, ``turns``, ``barrier``
and ``acks``. ``turns`` are the turn IDs it delivers, in order. ``barrier`` holds a
directory where it says it is ready, the number of parties, and whether to wait for
them. ``acks`` is a file with one fsynced JSON line per delivery the kernel
acknowledged. Each line is ``{"turn_id", "ack"}``, ``ack`` being ``queued`` or
``ran``. Each turn's model takes a few milliseconds, so that deliveries meet a busy
thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from intention_kernel import Intent, Interpretation, InterpretationRequest, Kernel, Queued
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import append_line, open_store


class SlowModel:
    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        await asyncio.sleep(random.uniform(0.02, 0.06))
        return Interpretation(intents=[Intent("billing.balance", {"due": 1})])


def meet(barrier: dict[str, Any]) -> None:
    """Say this worker is ready; on a first start, wait until every worker is.

    It blocks the loop on purpose: nothing else runs before the deliveries.
    """
    ready = Path(barrier["dir"])
    (ready / barrier["name"]).touch()
    while barrier["wait"] and len(list(ready.iterdir())) < barrier["parties"]:
        time.sleep(0.01)


async def main(config: dict[str, Any]) -> None:
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=SlowModel(), on_busy="queue"
    )
    async with open_store(config["store"]) as durability:
        kernel = Kernel(agent, durability)
        meet(config["barrier"])
        for turn_id in config["turns"]:
            answer = await kernel.submit(config["thread_id"], turn_id, f"message {turn_id}")
            ack = "queued" if isinstance(answer, Queued) else "ran"
            append_line(config["acks"], {"turn_id": turn_id, "ack": ack})
            await asyncio.sleep(random.uniform(0.0, 0.002))
        await kernel.drained()
    print(json.dumps({"done": len(config["turns"])}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
