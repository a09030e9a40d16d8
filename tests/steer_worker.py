"""One delivery of a steered turn in its own OS process, for tests/test_steer.py.

Run as ``python tests/steer_worker.py '<json config>'``:

- ``store``: :meth:`proving_support.Store.config`.
- ``files``: ``{"asks", "entered", "release"}``: each ask of the model (one JSON line
  per round, with the steers its request carries), a file created once round 1 is
  held, and the file whose creation releases it.
- ``turn``: ``{"thread_id", "turn_id", "message"}``.
- ``die``: optional, where the process exits at once (``os._exit``, no cleanup).
  It is ``"taken"`` or ``"asked_round_2"``. At ``"taken"``, the round boundary took
  the steers. ``taken_by`` is durable, and the journal entry is not written. At
  ``"asked_round_2"``, the steers are journaled and the model is asked round 2 with
  them.
- ``queued``: optional; the turn comes while another holds the thread. So it is
  queued in the inbox, and this process's drain runs it.
- ``submit``: optional; only submit this turn (a steer), print its answer and exit
  at once, as a client's process that goes away. Its drain does not run.

Round 1 of ``paint it`` looks up a balance; round 2 replies with the steers it got.
The process prints one JSON line with the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from intention_kernel import Intent, Interpretation, InterpretationRequest, Kernel, TurnScope
from intention_kernel.testing import faults
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import append_line, open_store


class SteeredModel:
    """Works in rounds, writes down every request, and holds round 1 on a file."""

    multi_round = True

    def __init__(self, files: dict[str, str], die: str | None) -> None:
        self.files, self.die = files, die

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        number = len(request.rounds) + 1
        steered = list(request.rounds[-1].steered) if request.rounds else []
        append_line(self.files["asks"], {"round": number, "pid": os.getpid(), "steered": steered})
        if number == 1:
            if self.die is not None:  # only the delivery that dies waits for the steer
                Path(self.files["entered"]).touch()  # noqa: ASYNC240
                while not Path(self.files["release"]).exists():  # noqa: ASYNC110, ASYNC240
                    await asyncio.sleep(0.01)
            return Interpretation(intents=[Intent("billing.balance", {"due": 1})])
        if self.die == f"asked_round_{number}":
            os._exit(faults.EXIT_STATUS)
        return Interpretation(reply="Painted, hearing: " + "; ".join(steered))


async def main(config: dict[str, Any]) -> None:
    die = config.get("die")
    agent = dataclasses.replace(
        billing_agent(FakeProvider()),
        interpreter=SteeredModel(config["files"], die),
        on_busy="steer",
    )
    async with open_store(config["store"]) as durability:
        if die == "taken":
            take = durability.take_steers  # type: ignore[attr-defined]

            async def take_then_die(thread_id: str, turn_id: str) -> Any:
                taken = await take(thread_id, turn_id)
                if taken:
                    os._exit(faults.EXIT_STATUS)
                return taken

            durability.take_steers = take_then_die  # type: ignore[attr-defined]
        turn, kernel = config["turn"], Kernel(agent, durability)
        if config.get("submit"):
            answer = await kernel.submit(turn["thread_id"], turn["turn_id"], turn["message"])
            print(json.dumps(answer.to_dict()), flush=True)
            os._exit(0)  # its background drain goes with it
        if config.get("queued"):
            result = await queued_behind(durability, kernel, turn)
        else:
            result = await kernel.turn(turn["thread_id"], turn["turn_id"], turn["message"])
        print(json.dumps(result.to_dict()), flush=True)


class Held(Exception):
    """Ends the hold of the thread's lock without a commit."""


async def queued_behind(durability: Any, kernel: Kernel, turn: dict[str, str]) -> Any:
    """Deliver the turn while another holds its thread: it is queued, then drained."""
    locked, release = asyncio.Event(), asyncio.Event()

    async def hold(tx: Any) -> Any:
        locked.set()
        await release.wait()
        raise Held

    scope = TurnScope(turn["thread_id"], "holder", None, None)
    holding = asyncio.create_task(durability.with_turn(scope, hold))
    await locked.wait()
    running = asyncio.create_task(kernel.turn(turn["thread_id"], turn["turn_id"], turn["message"]))
    while not await durability.read_inbox(turn["thread_id"]):  # noqa: ASYNC110
        await asyncio.sleep(0.01)  # queued, its drain waiting for the lock
    release.set()
    with contextlib.suppress(Held):
        await holding
    return await running


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
