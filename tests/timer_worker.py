"""A timer worker for tests/test_timer_processes.py: fires due timers until none is left.

Run as ``python tests/timer_worker.py '<json config>'``:

- ``store``: as in ``crash_worker.py`` (:func:`proving_support.open_store`);
- ``claim_for``: seconds a claim keeps other workers off a timer;
- ``limit``: timers claimed per pass;
- ``hold``: seconds each timer's turn awaits in its capability, so that many turns are
  in flight when the test kills this process;
- ``fault``: optional ``{"point", "skip"}``: die (``os._exit``) the ``skip + 1``-th time
  a turn of this process reaches ``point``.

It prints one JSON line per outcome (``{"t", "k", "u", "o"}``) and exits 0 once no
timer is pending.
"""

from __future__ import annotations

import asyncio
import json
import sys
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
from intention_kernel.testing import faults
from proving_support import open_store


def timer_agent(hold: float) -> Agent:
    @capability("jobs.run", effect="read", description="Run a timer's job")
    async def run(input: dict[str, Any], ctx: CapabilityContext) -> str:
        await asyncio.sleep(hold)
        return f"ran {input['key']}"

    class Interpreter:
        async def interpret(self, request: InterpretationRequest) -> Interpretation:
            if request.timer is None:
                return Interpretation(reply="no timer")
            return Interpretation([Intent("jobs.run", {"key": request.timer.key})])

    return Agent(name="jobs", version="1", capabilities=[run], interpreter=Interpreter())


async def main(config: dict[str, Any]) -> None:
    fault = config.get("fault")
    if fault:
        faults.inject(fault["point"], "exit", skip=fault["skip"])
    async with open_store(config["store"]) as store:
        kernel = Kernel(timer_agent(config.get("hold", 0.0)), store)
        while True:
            fired = await kernel.fire_due_timers(
                limit=config.get("limit", 10), claim_for=config["claim_for"]
            )
            for outcome in fired:
                line = {"t": outcome.thread_id, "k": outcome.key, "u": outcome.turn_id}
                print(json.dumps({**line, "o": outcome.outcome}), flush=True)
            if not fired:
                if not await kernel.timers(status="pending", limit=1):
                    return
                await asyncio.sleep(0.05)  # claimed by another worker: wait for its end


def jobs_agent() -> Agent:
    """The agent ``intention-kernel timers run --agent timer_worker:jobs_agent`` runs."""
    return timer_agent(0.0)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
