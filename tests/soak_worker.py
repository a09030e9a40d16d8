"""A soak worker: walks every conversation of the schedule, for tests/test_soak.py.

Run as ``python tests/soak_worker.py '<json config>'``. Its keys follow.

``store`` and ``ledger`` are as in ``crash_worker.py``. ``schedule`` names a JSON
file: ``{"threads": {thread_id: [message, ...]}, "behaviour": {payment_intent: mode}}``.
``seed`` is this worker's own randomness. It sets the order it takes threads in, and
its duplicate and conflicting deliveries. ``tasks`` is the number of concurrent
conversations. ``duplicates`` is the chance that a delivery is sent again at once
with the same request, which must replay. ``conflicts`` is the chance of one with
another request, which must be refused.

``fault`` is optional, an object ``{"point", "skip"}`` that kills the worker at a
point. It dies (``os._exit(137)``) the ``skip + 1``-th time a turn of this process
reaches that point. A point of :mod:`intention_kernel.testing.sqlite` belongs to a
group commit, and the SQLite writer thread reaches it in groups of two or more. Those
points are ``"before_commit"`` and ``"after_commit"``.

``model_await`` is how long each turn's interpreter awaits once, as a model call
would (seconds, default 0). The turns of the ``tasks`` conversations then overlap,
and their writes share group commits. With ``together``, a duplicate is delivered at
the same moment as the first copy. Both are then in flight, and its commit may be in
a group. With ``resume``, each thread starts at its last committed turn, delivered
again, rather than at its first. A host restarted after a crash retries so.

Every thread is walked in order, each turn delivered until it returns, so that a
thread's turns commit in schedule order whichever process commits them. Each
delivery writes one JSON line, of one of four kinds. The first is
``{"t", "u", "replayed", "digest", "steps"}``. It holds the digest of the result without
its ``replayed`` flag, and each step's capability and status. A refused conflicting
request writes ``{"t", "u", "refused"}``. ``{"t", "u", "lease_lost"}`` is for a
delivery refused a write, because its lease lapsed while the process was stopped. That
delivery is delivered again. ``{"t", "u", "error"}`` is for anything unexpected. A walk
that ends on SQLite writes ``{"writer": {"groups", "grouped"}}`` last: the transactions
its writer thread ran, and how many writes shared one with others.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

from intention_kernel import Kernel, ThreadBusyError, TurnConflictError, TurnResult
from intention_kernel._interpretation import Interpretation, InterpretationRequest
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.errors import LeaseLostError
from intention_kernel.testing import faults
from intention_kernel.testing._agents import billing_agent, billing_interpreter
from intention_kernel.testing.sqlite import GroupAction, GroupPoint, WriterProbe
from proving_support import LedgerProvider, open_store


def digest(result: TurnResult) -> str:
    document = dict(result.to_dict(), replayed=None)
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]


def turn_id(index: int) -> str:
    return f"turn-{index + 1:04d}"


def arm(fault: dict[str, Any]) -> GroupAction | None:
    """Die at ``fault``'s point, after ``skip`` passes (see the module docstring).

    A group commit's point is the SQLite adapter's: the action for its ``WriterProbe``.
    """
    point, skip = fault["point"], fault["skip"]
    if point not in ("before_commit", "after_commit"):
        faults.inject(point, "exit", skip=skip)
        return None
    passes = 0

    def die(reached: GroupPoint, size: int) -> None:
        nonlocal passes
        if reached == point and size >= 2:
            passes += 1
            if passes > skip:
                os._exit(faults.EXIT_STATUS)

    return die


def interpreter(model_await: float, rng: random.Random) -> Any:
    """The billing agent's interpreter, awaiting once a turn for about ``model_await``
    seconds (between none and twice that, so that groups mix differently)."""
    scripted = billing_interpreter()
    if not model_await:
        return scripted
    interpret = scripted.interpret

    async def like_a_model(request: InterpretationRequest) -> Interpretation:
        await asyncio.sleep(rng.uniform(0, 2 * model_await))
        return await interpret(request)

    scripted.interpret = like_a_model  # type: ignore[method-assign]
    return scripted


async def main(config: dict[str, Any], schedule: dict[str, Any]) -> None:
    rng = random.Random(config["seed"])
    provider = LedgerProvider(path=config["ledger"], sync=False)
    provider.behaviour.update(schedule["behaviour"])
    points = arm(config["fault"]) if config.get("fault") else None
    probe = WriterProbe(points=points)
    options = {"seam": probe} if config["store"]["kind"] == "sqlite" else {}

    def emit(record: dict[str, Any]) -> None:
        print(json.dumps(record), flush=True)

    async with open_store(config["store"], **options) as durability:
        agent = billing_agent(provider, interpreter=interpreter(config.get("model_await", 0), rng))
        kernel = Kernel(agent, durability)

        async def deliver(thread_id: str, turn: str, message: str) -> TurnResult:
            while True:
                try:
                    return await kernel.turn(thread_id, turn, message)
                except ThreadBusyError:
                    await asyncio.sleep(rng.uniform(0, 0.01))
                except LeaseLostError:
                    # Paused past its lease (the test's SIGSTOP), this process was
                    # refused a write: delivered again, as a host retries a failed turn.
                    # Any other refusal ends the worker, and the audit fails; so does a
                    # lost lease in a worker that was never stopped.
                    emit({"t": thread_id, "u": turn, "lease_lost": True})

        async def answer(thread_id: str, turn: str, message: str) -> None:
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
                if config.get("together"):
                    await asyncio.gather(*(answer(thread_id, turn, message) for _ in range(copies)))
                else:
                    for _ in range(copies):
                        await answer(thread_id, turn, message)
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
        if isinstance(durability, SQLiteDurability):
            emit({"writer": {"groups": probe.groups, "grouped": probe.grouped}})


if __name__ == "__main__":
    configuration = json.loads(sys.argv[1])
    asyncio.run(main(configuration, json.loads(Path(configuration["schedule"]).read_text())))
