"""A process killed mid-turn, then the turn delivered again:
``python -m examples.langgraph_desk.crash --db URL --thread ID --ledger PATH
--model-log PATH [--die]``.

The turn asks the desk to cancel order 42. With ``--die`` the process exits (status
137, as if killed) right after the shop applied the cancel and its receipt was
stored, before the turn commits: nothing of the turn is committed. Run it again
without ``--die`` and the same turn is delivered again: the graph runs again from the
model response recorded before the cancel ran (the model is not asked for it again),
the cancel meets its completed receipt, the shop is not called, and the model is asked
only for the call that reads the cancel's result. The turn commits with the stored
result. The shop's calls are lines of the ``--ledger`` file and the model's calls
lines of the ``--model-log`` file (both outlive the process), so the output reads
``model: requests=2 asked=2`` (each call asked once, across both processes) and
``provider_calls=1``.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from examples._conversation import Tally, print_summary
from examples._desk import FakeShop
from examples.langgraph_desk.agent import build_agent
from intention_kernel import Kernel
from intention_kernel.durability import open_durability
from intention_kernel.testing import faults


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.langgraph_desk.crash")
    parser.add_argument("--db", default="sqlite:///langgraph_desk.db")
    parser.add_argument("--thread", default="langgraph_desk-crash")
    parser.add_argument("--ledger", type=Path, default=Path("langgraph_desk.ledger"))
    parser.add_argument("--model-log", type=Path, default=Path("langgraph_desk.model.log"))
    parser.add_argument("--die", action="store_true", help="exit after the write, before commit")
    args = parser.parse_args()
    shop = FakeShop(ledger=args.ledger)
    async with open_durability(args.db) as store:
        kernel = Kernel(build_agent(shop, args.model_log), store)
        if args.die:
            # The fault kit's named point: after the receipt is completed, before commit.
            faults.inject(faults.AFTER_RECEIPT_COMPLETED, "exit")
        result = await kernel.turn(args.thread, "crash-1", "cancel order 42")
    print(f"[crash-1] agent: {result.reply}")
    for step in result.steps:
        print(f"[crash-1] step {step.capability_id}: {step.status}")
    calls = args.ledger.read_text().splitlines() if args.ledger.exists() else []
    # A call is told by how many messages it carried; a model asked again for one it
    # answered would show more asks than requests.
    asks = args.model_log.read_text().split() if args.model_log.exists() else []
    print(f"model: requests={len(set(asks))} asked={len(asks)}")
    print_summary(Tally.of(result), len(calls))


if __name__ == "__main__":
    asyncio.run(main())
