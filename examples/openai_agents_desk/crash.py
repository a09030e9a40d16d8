"""A process killed mid-turn, then the turn delivered again:
``python -m examples.openai_agents_desk.crash --db URL --thread ID --ledger PATH [--die]``.

The turn asks the desk to cancel order 42. With ``--die`` the process sends itself
SIGKILL right after the shop applied the cancel and its receipt was stored, before the
turn commits: nothing of the turn is committed. Run it again without ``--die`` and the
same turn is delivered again: the model's response that asked for the cancel is read
from the turn's journal, the cancel meets its completed receipt, the shop is not
called, and the turn commits with the stored result. The shop's calls are lines of the
``--ledger`` file (it is the outside world: it outlives the process), so the summary
reads ``provider_calls=1``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path

from examples._conversation import Tally, print_summary
from examples._desk import FakeShop
from examples.openai_agents_desk.agent import build_agent
from intention_kernel import Kernel
from intention_kernel.durability import open_durability
from intention_kernel.testing import faults


def kill(point: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # a real death: no cleanup, no flush


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.openai_agents_desk.crash")
    parser.add_argument("--db", default="sqlite:///openai_agents_desk.db")
    parser.add_argument("--thread", default="openai_agents_desk-crash")
    parser.add_argument("--ledger", type=Path, default=Path("openai_agents_desk.ledger"))
    parser.add_argument("--die", action="store_true", help="SIGKILL after the write, before commit")
    args = parser.parse_args()
    shop = FakeShop(ledger=args.ledger)
    async with open_durability(args.db) as store:
        kernel = Kernel(build_agent(shop), store)
        if args.die:
            # The fault kit's named point: after the receipt is completed, before commit.
            faults.inject(faults.AFTER_RECEIPT_COMPLETED, kill)
        result = await kernel.turn(args.thread, "crash-1", "cancel order 42")
    print(f"[crash-1] agent: {result.reply}")
    for step in result.steps:
        print(f"[crash-1] step {step.capability_id}: {step.status}")
    calls = args.ledger.read_text().splitlines() if args.ledger.exists() else []
    print_summary(Tally.of(result), len(calls))


if __name__ == "__main__":
    asyncio.run(main())
