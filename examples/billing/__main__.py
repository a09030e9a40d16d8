"""Run the billing conversation: ``python -m examples.billing [--db URL] [--thread ID] [--llm]``.

A question, a charge that waits for confirmation across a restart, a question
while it waits, the acceptance that charges once, the same delivery retried
(replayed), and the same invoice proposed and accepted again (the receipt
answers; the provider is not called).
"""

from __future__ import annotations

import asyncio

from examples._conversation import (
    Redeliver,
    Restart,
    Say,
    Step,
    parse_args,
    print_provider,
    print_summary,
    run,
)
from examples.billing.agent import FakePayments, build_agent

SCRIPT: list[Step] = [
    Say("what do I owe on invoice 42?"),
    Say("please pay invoice 42"),
    Restart(),
    Say("and how much is invoice 43?"),
    Say("yes"),
    Redeliver(),
    Say("pay invoice 42"),
    Say("yes"),
]


async def main() -> None:
    options = parse_args(
        "billing", "A billing agent that asks before it charges, and never charges twice."
    )
    payments = FakePayments()  # the outside world: it outlives the restart
    tally = await run(options, SCRIPT, lambda interpreter: build_agent(payments, interpreter))
    print_summary(tally, len(payments.calls))
    print_provider(payments.calls, "charged")


if __name__ == "__main__":
    asyncio.run(main())
