"""Run the travel conversation: ``python -m examples.travel [--db URL] [--thread ID] [--llm]``.

A search; a cheap flight booked at once (the small-operation policy); an expensive
one that asks first, whose fare moves while the person thinks and across a restart,
so the acceptance is refused and nothing is booked; the same booking asked and
accepted again at the new fare, booked once; and that delivery retried (replayed).
"""

from __future__ import annotations

import asyncio

from examples._conversation import (
    Meanwhile,
    Redeliver,
    Restart,
    Say,
    Step,
    parse_args,
    print_provider,
    print_summary,
    run,
)
from examples.travel.agent import build_agent
from examples.travel.provider import FakeAirline, Offer

OFFERS = [
    Offer("TP538", "LIS", "BER", "2027-03-12", "07:05", "TAP", 18_900),
    Offer("FR8412", "LIS", "BER", "2027-03-12", "18:40", "Ryanair", 7_900),
]


async def main() -> None:
    options = parse_args(
        "travel", "A travel agent whose booking capability decides when to ask for consent."
    )
    airline = FakeAirline(OFFERS)  # the outside world: it outlives the restart
    script: list[Step] = [
        Say("find flights from LIS to BER on 2027-03-12"),
        Say("book FR8412 for Ada Lovelace"),
        Say("book TP538 for Ada Lovelace"),
        Meanwhile(
            "the airline reprices TP538 to €209.00", lambda: airline.reprice("TP538", 20_900)
        ),
        Restart(),
        Say("yes"),
        Say("book TP538 for Ada Lovelace"),
        Say("yes"),
        Redeliver(),
    ]
    tally = await run(options, script, lambda interpreter: build_agent(airline, interpreter))
    print_summary(tally, len(airline.calls))
    print_provider(airline.calls, "booked")


if __name__ == "__main__":
    asyncio.run(main())
