"""The outbox relay: each thread's events in order, acknowledged before marked, at least
once across restarts, a failing event blocking only its own thread, and several relays
sharing one store without interleaving a thread. On every adapter."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import Kernel, OutboxEvent
from intention_kernel.durability.base import RecordedDurability
from intention_kernel.outbox import OutboxRelay
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing.agents import FakeProvider, billing_agent
from proving_support import Store, drop_schema, new_schema, read_all_events

THREADS = ("t-a", "t-b", "t-c")


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store | None]:
    """``None`` for the in-memory adapter."""
    if request.param == "memory":
        yield None
    elif request.param == "sqlite":
        yield Store("sqlite", str(tmp_path / "kernel.db"))
    else:
        dsn: str = request.getfixturevalue("postgres_dsn")
        schema = new_schema()
        yield Store("postgres", dsn, schema)
        drop_schema(dsn, schema)


def adapter(store: Store | None) -> RecordedDurability:
    durability = InMemoryDurability() if store is None else store.durability()
    assert isinstance(durability, RecordedDurability)
    return durability


async def converse(durability: RecordedDurability, threads: tuple[str, ...] = THREADS) -> None:
    """Three turns per thread: a question, a proposed charge, its acceptance."""
    kernel = Kernel(billing_agent(FakeProvider()), durability)
    for thread in threads:
        await kernel.turn(thread, "1", "balance 100")
        await kernel.turn(thread, "2", "charge pi_1 500")
        await kernel.turn(thread, "3", "yes")


class Recorder:
    """A sink that records what it acknowledged, and refuses events it is told to."""

    def __init__(self, delay: float = 0.0) -> None:
        self.seen: list[OutboxEvent] = []
        self.refuse: set[tuple[str, int]] = set()
        self.delay = delay

    async def __call__(self, event: OutboxEvent) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        if (event.thread_id, event.seq) in self.refuse:
            raise ConnectionError(f"broker refused {event.type}")
        self.seen.append(event)

    def by_thread(self) -> dict[str, list[int]]:
        seqs: dict[str, list[int]] = defaultdict(list)
        for event in self.seen:
            seqs[event.thread_id].append(event.seq)
        return dict(seqs)


async def test_the_relay_publishes_every_thread_in_order_once_and_marks_it(
    store: Store | None,
) -> None:
    async with adapter(store) as durability:
        await converse(durability)
        committed = await read_all_events(durability)
        sink = Recorder()
        relay = OutboxRelay(durability, sink, batch_size=3, concurrency=2)
        before = await relay.status()
        assert before.unpublished == len(committed) and before.oldest_unpublished_at is not None
        report = await relay.run_once()
        assert report.published == len(committed) and report.failed == 0
        assert sorted(sink.seen, key=lambda e: e.position) == committed
        for thread, seqs in sink.by_thread().items():
            assert seqs == list(range(1, len(seqs) + 1)), thread
        after = await relay.status()
        assert (after.unpublished, after.oldest_unpublished_at, list(after.failing)) == (
            0,
            None,
            [],
        )
        assert (await relay.run_once()).published == 0  # nothing twice
        # A new turn's events follow on the next pass, after the earlier ones.
        await Kernel(billing_agent(FakeProvider()), durability).turn("t-a", "4", "balance 7")
        assert (await relay.run_once()).published > 0
        assert sink.by_thread()["t-a"] == list(range(1, len(sink.by_thread()["t-a"]) + 1))


async def test_a_failing_event_blocks_its_thread_only_and_is_retried_with_backoff(
    store: Store | None,
) -> None:
    async with adapter(store) as durability:
        await converse(durability)
        sink = Recorder()
        sink.refuse.add(("t-b", 3))
        relay = OutboxRelay(durability, sink, retry_base=1.0, retry_max=1.0)
        report = await relay.run_once()
        assert report.failed == 1
        seqs = sink.by_thread()
        assert seqs["t-b"] == [1, 2]  # nothing after the failing event
        assert seqs["t-a"] == seqs["t-c"] == list(range(1, len(seqs["t-a"]) + 1))
        backlog = await relay.status()
        [failing] = backlog.failing
        assert (failing.event.thread_id, failing.event.seq, failing.attempts) == ("t-b", 3, 1)
        assert failing.last_error == "ConnectionError: broker refused interaction.opened"
        assert failing.retry_at is not None and backlog.unpublished > 1
        # Not due again before its backoff (0.5 to 1 s): a pass now leaves it alone.
        assert await relay.run_once() == type(report)(0, 0)
        await asyncio.sleep(1.05)
        assert (await relay.run_once()).failed == 1  # due, still refused: attempts go on
        [failing] = (await relay.status()).failing
        assert failing.attempts == 2
        await asyncio.sleep(1.05)
        sink.refuse.clear()
        assert (await relay.run_once()).failed == 0
        assert sink.by_thread()["t-b"] == list(range(1, len(sink.by_thread()["t-b"]) + 1))
        assert (await relay.status()).unpublished == 0


async def test_a_relay_stopped_mid_batch_loses_nothing_after_a_restart(
    store: Store | None,
) -> None:
    """The relay is cancelled while publishing; what the sink acknowledged is marked, and
    a new relay on a new adapter instance publishes the rest, in order."""
    async with adapter(store) as durability:
        await converse(durability)
        committed = await read_all_events(durability)
    durability = durability if store is None else adapter(store)
    async with durability:
        sink = Recorder()
        acknowledged = asyncio.Event()

        async def slow_after_three(event: OutboxEvent) -> None:
            await sink(event)
            if len(sink.seen) == 3:
                acknowledged.set()
                await asyncio.sleep(3600)

        relay = OutboxRelay(durability, slow_after_three, concurrency=1)
        task = asyncio.create_task(relay.run_once())
        await acknowledged.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The first two were acknowledged and marked; the third reached the sink, which
        # never answered: the next relay publishes it again (at least once), then the rest.
        assert (await relay.status()).unpublished == len(committed) - 2
    durability = durability if store is None else adapter(store)
    async with durability:
        await OutboxRelay(durability, sink).run_once()
    first_three = sink.seen[:3]
    rest = sink.seen[3:]
    assert {(e.thread_id, e.seq) for e in first_three + rest} == {
        (e.thread_id, e.seq) for e in committed
    }
    again = [e for e in rest if (e.thread_id, e.seq) == (first_three[2].thread_id, 3)]
    assert [e.id for e in again] == [first_three[2].id]  # republished once, same ID
    for thread in THREADS:
        seqs = [e.seq for e in rest if e.thread_id == thread]
        assert seqs == sorted(seqs)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_relays_on_one_store_share_the_threads_and_never_interleave_one(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        shared = Store("sqlite", str(tmp_path / "kernel.db"))
    else:
        shared = Store("postgres", request.getfixturevalue("postgres_dsn"), new_schema())
    threads = tuple(f"t-{n}" for n in range(12))
    try:
        async with adapter(shared) as durability:
            await converse(durability, threads)
            committed = await read_all_events(durability)
        published: list[tuple[str, OutboxEvent]] = []

        def sink(name: str) -> Any:
            async def publish(event: OutboxEvent) -> None:
                await asyncio.sleep(0.002)  # long enough for the relays to overlap
                published.append((name, event))

            return publish

        stores = [adapter(shared) for _ in range(3)]
        for each in stores:
            await each.__aenter__()
        try:
            relays = [
                OutboxRelay(each, sink(f"relay-{n}"), batch_size=2, concurrency=3)
                for n, each in enumerate(stores)
            ]
            reports = await asyncio.gather(*(r.run_once() for r in relays))
        finally:
            for each in stores:
                await each.aclose()
    finally:
        if kind == "postgres":
            drop_schema(shared.location, shared.schema)
    assert sum(r.published for r in reports) == len(committed)  # each exactly once
    assert sorted((e.thread_id, e.seq) for _, e in published) == sorted(
        (e.thread_id, e.seq) for e in committed
    )
    for thread in threads:
        seqs = [e.seq for _, e in published if e.thread_id == thread]
        assert seqs == list(range(1, len(seqs) + 1)), f"{thread} out of order: {seqs}"
    assert len({name for name, _ in published}) > 1, "the relays did not share the work"


async def test_run_keeps_publishing_new_events_until_stopped() -> None:
    async with InMemoryDurability() as durability:
        kernel = Kernel(billing_agent(FakeProvider()), durability)
        sink = Recorder()
        stop = asyncio.Event()
        relay = OutboxRelay(durability, sink, poll_interval=0.01)
        running = asyncio.create_task(relay.run(stop))
        for n in range(3):
            await kernel.turn("t", str(n), f"balance {n}")
            for _ in range(200):
                if len(sink.seen) == len(await read_all_events(durability)):
                    break
                await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(running, 5)
    assert [e.seq for e in sink.seen] == list(range(1, len(sink.seen) + 1))
    assert [e.turn_id for e in sink.seen if e.type == "turn.committed"] == ["0", "1", "2"]
