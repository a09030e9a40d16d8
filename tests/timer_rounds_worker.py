"""A timer worker for tests/test_timer_turn_processes.py: fires due timers whose turns
run in model rounds, or hold until released, in an OS process of its own.

Run as ``python tests/timer_rounds_worker.py '<json config>'``:

- ``store``: :meth:`proving_support.Store.config`.
- ``agent``: ``"rounds"`` (the three rounds of ``rounds_worker.py``: balance, pay,
  final text) or ``"held"`` (two steps; the first writes a line to ``files["entered"]``
  and waits until ``files["release"]`` exists).
- ``files``: ``{"asks", "tools", "ledger"}`` (and ``"entered"``, ``"release"``).
- ``die``: as in ``rounds_worker.py`` (``"asked_round_3"``, ``"in_pay"``).
- ``claim_for``: seconds a claim keeps other workers off a timer.
- ``cancel``: ``{"thread_id", "turn_id", "reason"}``: fire nothing, only cancel that
  turn, print ``{"cancelled": <status>}`` and exit 0.

It prints one JSON line per outcome (``{"t", "u", "o", "reply"}``) and exits 0 once
no timer is due.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from intention_kernel import (
    Agent,
    CapabilityContext,
    Intent,
    Interpretation,
    InterpretationRequest,
    Kernel,
    capability,
)
from proving_support import append_line, open_store
from rounds_worker import rounds_agent


def held_agent(files: dict[str, str]) -> Agent:
    @capability("jobs.first", description="Held until released")
    async def first(input: dict[str, Any], ctx: CapabilityContext) -> str:
        append_line(files["entered"], {"turn_id": ctx.turn_id, "pid": os.getpid()})
        while not Path(files["release"]).exists():  # noqa: ASYNC110, ASYNC240 (another process)
            await asyncio.sleep(0.02)
        append_line(files["tools"], {"tool": "jobs.first"})
        return "first"

    @capability("jobs.second", description="After the first")
    async def second(input: dict[str, Any], ctx: CapabilityContext) -> str:
        append_line(files["tools"], {"tool": "jobs.second"})
        return "second"

    class Interpreter:
        async def interpret(self, request: InterpretationRequest) -> Interpretation:
            return Interpretation([Intent("jobs.first", {}), Intent("jobs.second", {})])

    return Agent(name="held", version="1", capabilities=[first, second], interpreter=Interpreter())


def agent_of(config: dict[str, Any]) -> Agent:
    if config["agent"] == "held":
        return held_agent(config["files"])
    return rounds_agent(config["files"], config.get("die"))


async def main(config: dict[str, Any]) -> None:
    async with open_store(config["store"]) as store:
        kernel = Kernel(agent_of(config), store)
        if (cancel := config.get("cancel")) is not None:
            answer = await kernel.cancel(
                cancel["thread_id"], cancel["turn_id"], reason=cancel["reason"]
            )
            print(json.dumps({"cancelled": answer.status}), flush=True)
            return
        while True:
            fired = await kernel.fire_due_timers(claim_for=config["claim_for"])
            for outcome in fired:
                reply = outcome.result.reply if outcome.result is not None else None
                line = {"t": outcome.thread_id, "u": outcome.turn_id, "o": outcome.outcome}
                print(json.dumps({**line, "reply": reply}), flush=True)
            due = [
                t for t in await kernel.timers(status="pending") if t.due_at <= datetime.now(UTC)
            ]
            if not due:
                return
            await asyncio.sleep(0.05)  # claimed by another worker: wait for its end


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
