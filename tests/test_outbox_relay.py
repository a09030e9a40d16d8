"""The outbox relay: each thread's events in order, acknowledged before marked, at least
once across restarts, a failing event blocking only its own thread, and several relays
sharing one store without interleaving a thread. On every adapter."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import Kernel, OutboxEvent, StoreError
from intention_kernel.durability.abc import RecordedDurability
from intention_kernel.durability.abc import Recorder as StoreRecorder
from intention_kernel.durability.postgres import PostgresDurability
from intention_kernel.outbox import OutboxRelay, RelayReport
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing.agents import FakeProvider, billing_agent
from proving_support import (
    Store,
    drop_schema,
    make_sql_store,
    make_store,
    new_schema,
    read_all_events,
)

THREADS = ("t-a", "t-b", "t-c")


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store | None]:
    """``None`` for the in-memory adapter."""
    yield from make_store(request.param, request, tmp_path)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def restartable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A store that outlives its adapter. (Not the in-memory one: its state lives and
    dies with the instance, so a restart of the relay there would prove nothing.)"""
    yield from make_sql_store(request.param, request, tmp_path)


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
    restartable: Store,
) -> None:
    """The relay is cancelled while publishing; what the sink acknowledged is marked, and
    a new relay on a new adapter instance publishes the rest, in order."""
    async with adapter(restartable) as durability:
        await converse(durability)
        committed = await read_all_events(durability)
    async with adapter(restartable) as durability:
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
    async with adapter(restartable) as durability:  # a new adapter: the relay restarted
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


# -- PostgreSQL sessions -----------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize(("pool", "concurrency"), [(1, 4), (2, 2), (2, 8), (3, 16)])
async def test_a_relay_with_more_claims_than_pooled_sessions_completes_on_postgres(
    postgres_dsn: str, pool: int, concurrency: int
) -> None:
    """Each claim holds a session; its reads and marks run on that session, and claims
    beyond the pool queue for one, so no concurrency can exhaust the pool (a claim
    borrowing a second session for its reads deadlocked at concurrency >= pool / 2)."""
    schema = new_schema()
    threads = tuple(f"t-{n}" for n in range(12))
    try:
        async with PostgresDurability(
            postgres_dsn, schema=schema, max_pool_size=pool, pool_timeout=3
        ) as durability:
            await converse(durability, threads)
            committed = await read_all_events(durability)
            sink = Recorder(delay=0.002)  # long enough for the claims to overlap
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


# -- store errors ------------------------------------------------------------------------------


class FlakyRecorder:
    """A recorder whose relay methods fail as a test says, and otherwise pass through."""

    def __init__(self, inner: StoreRecorder) -> None:
        self.inner = inner
        self.fail_polls = 0  # pending_threads calls that fail before the store "recovers"
        self.fail_marks: set[str] = set()  # threads whose mark_published fails

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def pending_threads(self, now: datetime, limit: int) -> list[str]:
        if self.fail_polls:
            self.fail_polls -= 1
            raise StoreError("SQLite error on kernel.db: OperationalError: disk I/O error")
        return await self.inner.pending_threads(now, limit)

    async def mark_published(self, thread_id: str, seqs: Sequence[int], at: datetime) -> None:
        if thread_id in self.fail_marks:
            raise StoreError(f"the store refused the mark of {thread_id}")
        await self.inner.mark_published(thread_id, seqs, at)


async def flaky(durability: RecordedDurability, monkeypatch: pytest.MonkeyPatch) -> FlakyRecorder:
    wrapper = FlakyRecorder(await durability.recorder())

    async def recorder() -> Any:
        return wrapper

    monkeypatch.setattr(durability, "recorder", recorder)
    return wrapper


async def test_a_store_error_in_one_thread_stops_the_others_before_the_pass_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with InMemoryDurability() as durability:
        await converse(durability)
        store = await flaky(durability, monkeypatch)
        store.fail_marks.add("t-a")
        stalled, stopped = asyncio.Event(), asyncio.Event()

        async def sink(event: OutboxEvent) -> None:
            if event.thread_id != "t-a":
                stalled.set()
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    stopped.set()
                    raise

        relay = OutboxRelay(durability, sink, concurrency=3)
        with pytest.raises(StoreError, match="refused the mark of t-a"):
            await relay.run_once()  # the error itself, not an ExceptionGroup
        assert stalled.is_set() and stopped.is_set()  # no sibling left publishing


async def test_run_logs_a_store_error_and_carries_on_after_a_backoff(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with InMemoryDurability() as durability:
        await converse(durability)
        committed = await read_all_events(durability)
        store = await flaky(durability, monkeypatch)
        store.fail_polls = 2
        sink = Recorder()
        stop = asyncio.Event()
        passes: list[RelayReport] = []

        def on_pass(report: RelayReport) -> None:
            passes.append(report)
            stop.set()  # everything due is published in one pass

        relay = OutboxRelay(durability, sink, poll_interval=0.01, retry_base=0.01)
        with caplog.at_level(logging.WARNING, logger="intention_kernel.outbox"):
            total = await asyncio.wait_for(relay.run(stop, on_pass=on_pass), 10)
    assert total == RelayReport(len(committed), 0) and passes == [total]
    assert sorted((e.thread_id, e.seq) for e in sink.seen) == sorted(
        (e.thread_id, e.seq) for e in committed
    )
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.attempts for r in errors] == [1, 2]  # type: ignore[attr-defined]
    assert all("disk I/O error" in r.getMessage() and not r.exc_info for r in errors)
    [recovered] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "recovered after 2 failed pass(es)" in recovered.getMessage()


async def test_a_sync_function_sink_runs_off_the_event_loop(tmp_path: Path) -> None:
    """A blocking sink function (a sync SDK) runs in a worker thread: while it blocks,
    a turn on the same loop completes."""
    import threading

    async with InMemoryDurability() as durability:
        kernel = Kernel(billing_agent(FakeProvider()), durability)
        await kernel.turn("t", "1", "balance 1")
        entered, release = threading.Event(), threading.Event()
        delivered: list[OutboxEvent] = []

        def blocking(event: OutboxEvent) -> None:
            entered.set()
            assert release.wait(10), "never released"
            delivered.append(event)

        relay = asyncio.create_task(OutboxRelay(durability, blocking, concurrency=1).run_once())
        assert await asyncio.to_thread(entered.wait, 10)
        # The sink is blocked in its thread; the loop still runs a whole turn.
        other = await asyncio.wait_for(kernel.turn("u", "1", "balance 2"), 5)
        release.set()
        report = await asyncio.wait_for(relay, 10)
    assert other.checkpoint_version == 1
    assert report.failed == 0 and delivered
