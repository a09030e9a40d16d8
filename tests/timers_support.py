"""Support for the timer tests (issue 37), shared by their modules.

- :class:`Clock`: a clock the test moves, from :data:`START`.
- :func:`events_of`: the store's outbox events of one type.
- :func:`commit_order`: turn IDs in the order they committed, read as a watcher reads.
- :func:`lapsed_claim`: two fire passes that claim one occurrence. The first one's
  claim lapses while its turn runs.
- :func:`approval_agent`: a write held for a confirmation that expires in 30 minutes.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from intention_kernel import (
    Agent,
    CapabilityContext,
    Intent,
    Interpretation,
    InterpretationRequest,
    Kernel,
    TimerOutcome,
    capability,
)
from intention_kernel.durability import Durability

START = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now

    def move(self, **delta: float) -> None:
        self.now += timedelta(**delta)


async def events_of(store: Durability, type: str) -> list[Any]:
    return [e for e in await store.read_outbox(limit=1000) if e.type == type]


async def commit_order(kernel: Kernel, turn_ids: list[str]) -> list[str]:
    """``turn_ids`` by the checkpoint version each one's committed result names
    (read as a watcher reads it: the last event of its stream is its result)."""
    versions = {}
    for turn_id in turn_ids:
        events = [e async for e in kernel.watch_turn("t", turn_id)]
        versions[turn_id] = events[-1].data["checkpoint_version"]
    assert sorted(versions.values()) == list(range(1, len(turn_ids) + 1))
    return sorted(turn_ids, key=versions.__getitem__)


Pass = asyncio.Task[list[TimerOutcome]]


async def lapsed_claim(first: Kernel, second: Kernel, entered: asyncio.Event) -> tuple[Pass, Pass]:
    """Two fire passes of thread ``t``'s one due timer, the first by ``first``, the
    second by ``second`` (the same kernel, or another).

    The first pass claims it for 10 ms. Its turn holds once ``entered`` is set. The
    second starts once that claim is over, and claims the occurrence again. Both
    passes are returned running."""
    firing = asyncio.create_task(first.fire_due_timers(claim_for=0.01))
    await asyncio.wait_for(entered.wait(), 10)
    (claimed,) = await first.timers("t")
    await asyncio.sleep(0.02)  # the first claim is over while its turn still runs
    again = asyncio.create_task(second.fire_due_timers())
    for _ in range(1000):  # until the second pass claimed it too
        (now,) = await first.timers("t")
        if now.claimed_until != claimed.claimed_until:
            break
        await asyncio.sleep(0.01)
    assert now.claimed_until is not None and claimed.claimed_until is not None
    assert now.claimed_until > claimed.claimed_until
    return firing, again


def approval_agent(remind_before: timedelta | None = None) -> Agent:
    """``ship <order>`` proposes a write held for a confirmation, which expires 30
    minutes after it opens; any other message gets ``ok``."""

    @capability(
        "orders.ship",
        effect="write",
        description="Ship an order",
        prompt="Ship order {order}?",
        confirm_within=timedelta(minutes=30),
        remind_before=remind_before,
    )
    async def ship(input: dict[str, Any], ctx: CapabilityContext) -> str:
        return "shipped"

    class Orders:
        async def interpret(self, request: InterpretationRequest) -> Interpretation:
            if request.message.startswith("ship"):
                return Interpretation([Intent("orders.ship", {"order": request.message[5:]})])
            return Interpretation(reply="ok")

    return Agent(name="orders", version="1", capabilities=[ship], interpreter=Orders())
