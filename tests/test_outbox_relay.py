"""The outbox relay on PostgreSQL's pooled sessions. The relay's behaviour on every
adapter is the conformance suite's (``intention_kernel.testing.conformance._outbox``),
which tests/test_memory.py, test_sqlite.py and test_postgres.py run."""

from __future__ import annotations

import asyncio

import pytest

from intention_kernel import Kernel, OutboxEvent
from intention_kernel.durability.postgres import PostgresDurability
from intention_kernel.outbox import OutboxRelay
from intention_kernel.testing._agents import FakeProvider, billing_agent
from intention_kernel.testing.conformance._outbox import RelaySink, converse
from proving_support import drop_schema, new_schema, read_all_events

# -- PostgreSQL sessions -----------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize(("pool", "concurrency"), [(1, 4), (2, 2), (2, 8), (3, 16)])
async def test_a_relay_with_more_claims_than_pooled_sessions_completes_on_postgres(
    postgres_dsn: str, pool: int, concurrency: int
) -> None:
    """Each claim holds a session, and its reads and marks run on that session. Claims
    beyond the pool queue for one, so no concurrency can exhaust the pool. A claim
    borrowing a second session for its reads deadlocked at concurrency >= pool / 2."""
    schema = new_schema()
    threads = tuple(f"t-{n}" for n in range(12))
    try:
        async with PostgresDurability(
            postgres_dsn, schema=schema, max_pool_size=pool, pool_timeout=3
        ) as durability:
            await converse(durability, threads)
            committed = await read_all_events(durability)
            sink = RelaySink(delay=0.002)  # long enough for the claims to overlap
            relay = OutboxRelay(durability, sink, batch_size=2, concurrency=concurrency)
            report = await asyncio.wait_for(relay.run_once(), 60)
            assert (report.published, report.failed) == (len(committed), 0)
            for thread, seqs in sink.by_thread().items():
                assert seqs == list(range(1, len(seqs) + 1)), thread
            assert (await relay.status()).unpublished == 0
    finally:
        drop_schema(postgres_dsn, schema)


@pytest.mark.postgres
async def test_a_turn_on_the_relays_adapter_commits_while_every_claim_is_busy(
    postgres_dsn: str,
) -> None:
    """The claims leave one pooled session to the application's turns."""
    schema = new_schema()
    try:
        async with PostgresDurability(
            postgres_dsn, schema=schema, max_pool_size=2, pool_timeout=3
        ) as durability:
            await converse(durability, tuple(f"t-{n}" for n in range(6)))
            publishing, release = asyncio.Event(), asyncio.Event()

            async def stalled(event: OutboxEvent) -> None:
                publishing.set()
                await release.wait()

            relay = OutboxRelay(durability, stalled, concurrency=8)
            running = asyncio.create_task(relay.run_once())
            await publishing.wait()
            kernel = Kernel(billing_agent(FakeProvider()), durability)
            result = await asyncio.wait_for(kernel.turn("other", "1", "balance 3"), 10)
            assert result.checkpoint_version == 1
            release.set()
            assert (await asyncio.wait_for(running, 30)).failed == 0
    finally:
        drop_schema(postgres_dsn, schema)
