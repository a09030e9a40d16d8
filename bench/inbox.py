"""The cost of a turn on a thread with an empty inbox (issue 36), by ``on_busy``.

Run as ``python -m bench.inbox [--turns N] [--rounds R]``. Each policy runs the same
turns of the billing agent on a fresh SQLite file, one thread per turn batch, no
contention: the inbox is always empty. It prints the median time per turn, its ratio
to ``"wait"`` (no inbox), and the SQLite statements per turn (counted, not assumed).
Medians over ``--rounds`` interleaved rounds; ratios, not absolute times, are the
result (the machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Literal

from bench.counting import install_sqlite_trace

OnBusy = Literal["wait", "reject", "queue", "steer", "interrupt"]

POLICIES: tuple[OnBusy, ...] = ("wait", "queue", "steer", "interrupt")


async def one_round(policy: OnBusy, root: Path, turns: int) -> tuple[float, float]:
    """Seconds per turn and statements per turn for ``turns`` turns under ``policy``."""
    from intention_kernel import Kernel
    from intention_kernel.durability.sqlite import SQLiteDurability
    from intention_kernel.testing._agents import FakeProvider, billing_agent

    agent = dataclasses.replace(billing_agent(FakeProvider()), on_busy=policy)
    path = root / f"{policy}-{time.monotonic_ns()}.db"
    async with SQLiteDurability(path) as store:
        kernel = Kernel(agent, store)
        await kernel.turn("warm", "0", "balance")
        before = COUNTER.statements
        started = time.perf_counter()
        for n in range(turns):
            await kernel.turn(f"t{n % 10}", str(n), "balance")
        elapsed = time.perf_counter() - started
        return elapsed / turns, (COUNTER.statements - before) / turns


COUNTER = install_sqlite_trace()


async def main(turns: int, rounds: int) -> None:
    times: dict[str, list[float]] = {p: [] for p in POLICIES}
    statements: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for policy in POLICIES:
                seconds, counted = await one_round(policy, Path(tmp), turns)
                times[policy].append(seconds)
                statements[policy] = counted
    base = statistics.median(times["wait"])
    print(f"{'on_busy':<10} {'median µs/turn':>15} {'vs wait':>8} {'statements/turn':>16}")
    for policy in POLICIES:
        median = statistics.median(times[policy])
        print(
            f"{policy:<10} {median * 1e6:>15.0f} {median / base:>8.3f} {statements[policy]:>16.1f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    asyncio.run(main(options.turns, options.rounds))
