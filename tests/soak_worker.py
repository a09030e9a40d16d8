"""A soak worker: walks every conversation of the schedule, for tests/test_soak.py.

Run as ``python tests/soak_worker.py '<json config>'``:

- ``store``, ``ledger``: as in ``crash_worker.py``; ``schedule``: a JSON file
  ``{"threads": {thread_id: [message, ...]}, "behaviour": {payment_intent: mode}}``.
- ``seed``: this worker's own randomness (the order it takes threads in, its
  duplicate and conflicting deliveries). ``tasks``: concurrent conversations.
- ``duplicates`` / ``conflicts``: the chance that a delivery is sent again at once
  with the same request (must replay) or with another one (must be refused).
- ``fault``: optional ``{"point", "skip"}``: die (``os._exit(137)``) the
  ``skip + 1``-th time a turn of this process reaches ``point``.
- ``resume``: start each thread at its last committed turn (delivered again) rather
  than at its first, as a host restarted after a crash retries what was in flight.

Every thread is walked in order, each turn delivered until it returns, so that a
thread's turns commit in schedule order whichever process commits them. One
JSON line per delivery: ``{"t", "u", "replayed", "digest", "steps"}`` (the digest of
the result without its ``replayed`` flag; each step's capability and status),
``{"t", "u", "refused"}`` for a refused
conflicting request, or ``{"t", "u", "error"}`` for anything unexpected.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

from intention_kernel import Kernel, ThreadBusyError, TurnConflictError, TurnResult
from intention_kernel.testing import faults
from intention_kernel.testing.agents import billing_agent
from proving_support import LedgerProvider, open_store


def digest(result: TurnResult) -> str:
    document = dict(result.to_dict(), replayed=None)
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]


def turn_id(index: int) -> str:
    return f"turn-{index + 1:04d}"


async def main(config: dict[str, Any], schedule: dict[str, Any]) -> None:
    rng = random.Random(config["seed"])
    provider = LedgerProvider(path=config["ledger"], sync=False)
    provider.behaviour.update(schedule["behaviour"])
    if config.get("fault"):
        faults.inject(config["fault"]["point"], "exit", skip=config["fault"]["skip"])

    def emit(record: dict[str, Any]) -> None:
        print(json.dumps(record), flush=True)

    async with open_store(config["store"]) as durability:
        kernel = Kernel(billing_agent(provider), durability)

        async def deliver(thread_id: str, turn: str, message: str) -> TurnResult:
            while True:
                try:
                    return await kernel.turn(thread_id, turn, message)
                except ThreadBusyError:
                    await asyncio.sleep(rng.uniform(0, 0.01))

        async def walk(thread_id: str) -> None:
            start = 0
            if config.get("resume"):  # from the thread's last committed turn, delivered again
                checkpoint = await durability.load_checkpoint(thread_id)
                start = max(checkpoint.version - 1, 0) if checkpoint else 0
            for index, message in enumerate(schedule["threads"][thread_id]):
                if index < start:
                    continue
                turn = turn_id(index)
                copies = 2 if rng.random() < config["duplicates"] else 1
                for _ in range(copies):
                    result = await deliver(thread_id, turn, message)
                    emit(
                        {
                            "t": thread_id,
                            "u": turn,
                            "replayed": result.replayed,
                            "digest": digest(result),
                            "steps": [[s.capability_id, str(s.status)] for s in result.steps],
                        }
                    )
                if rng.random() < config["conflicts"]:
                    try:
                        await kernel.turn(
                            thread_id, turn, "balance 1" if message != "balance 1" else "no"
                        )
                    except TurnConflictError:
                        emit({"t": thread_id, "u": turn, "refused": True})
                    else:
                        emit(
                            {
                                "t": thread_id,
                                "u": turn,
                                "error": "a conflicting request was answered",
                            }
                        )

        queue = list(schedule["threads"])
        rng.shuffle(queue)

        async def task() -> None:
            while queue:
                await walk(queue.pop())

        await asyncio.gather(*(task() for _ in range(config["tasks"])))


if __name__ == "__main__":
    configuration = json.loads(sys.argv[1])
    asyncio.run(main(configuration, json.loads(Path(configuration["schedule"]).read_text())))
