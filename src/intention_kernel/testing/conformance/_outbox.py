"""The outbox part of the storage contract, and the relay that publishes it.

Events are read back in the order they were committed.
The relay that publishes them behaves as follows:

- each thread's events are published in order.
- an event is acknowledged before it is marked.
- events are published at least once across restarts.
- a failing event blocks only its own thread.
- several relays share one store without interleaving a thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import pytest

from intention_kernel._kernel import Kernel
from intention_kernel._turns import OutboxEvent
from intention_kernel.durability import Durability
from intention_kernel.durability.abc import Operable, Recorder
from intention_kernel.errors import StoreError
from intention_kernel.outbox import OutboxRelay, RelayReport
from intention_kernel.testing._agents import FakeProvider, billing_agent
from intention_kernel.testing.conformance._support import (
    ConformanceCase,
    as_operable,
    read_all_events,
)

__all__ = ["OutboxConformance"]

THREADS = ("t-a", "t-b", "t-c")


class OutboxConformance(ConformanceCase):
    """Subclass and provide ``make_durability``; see :mod:`intention_kernel.testing.conformance`."""

    # =========================================================================================
    # Reading the outbox
    # =========================================================================================

    async def test_outbox_events_exist_only_for_committed_turns_in_order(
        self, kernel: Kernel, durability: Durability
    ) -> None:
        await kernel.turn("a", "1", "charge pi_1 500")
        await kernel.turn("b", "1", "balance")
        await kernel.turn("a", "2", "yes")
        await kernel.turn("a", "2", "yes")  # a replay adds nothing
        events = await durability.read_outbox()
        positions = [e.position for e in events]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        assert len({e.id for e in events}) == len(events)
        for thread in ("a", "b"):
            seqs = [e.seq for e in events if e.thread_id == thread]
            assert seqs == list(range(1, len(seqs) + 1))
        committed = [(e.thread_id, e.turn_id) for e in events if e.type == "turn.committed"]
        assert committed == [("a", "1"), ("b", "1"), ("a", "2")]
        accepted = [e.type for e in events if (e.thread_id, e.turn_id) == ("a", "2")]
        assert accepted == [
            "interaction.resolved",
            "effect.completed",
            "fact.recorded",
            "billing.charged",
            "turn.committed",
        ]

    async def test_read_outbox_pages_by_position_and_filters_by_thread(
        self, kernel: Kernel, durability: Durability
    ) -> None:
        for i in range(3):
            await kernel.turn("a", str(i), "balance")
            await kernel.turn("b", str(i), "balance")
        everything = await durability.read_outbox(limit=1000)
        first = await durability.read_outbox(limit=4)
        rest = await durability.read_outbox(after=first[-1].position, limit=1000)
        assert first + rest == everything
        only_b = await durability.read_outbox(thread_id="b", limit=1000)
        assert only_b == [e for e in everything if e.thread_id == "b"]

    # =========================================================================================
    # The relay
    # =========================================================================================

    async def test_the_relay_publishes_every_thread_in_order_once_and_marks_it(
        self, durability: Durability, operable: bool
    ) -> None:
        relayed = relayable(durability, operable)
        await converse(relayed)
        committed = await read_all_events(relayed)
        sink = RelaySink()
        relay = OutboxRelay(relayed, sink, batch_size=3, concurrency=2)
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
        await Kernel(billing_agent(FakeProvider()), relayed).turn("t-a", "4", "balance 7")
        assert (await relay.run_once()).published > 0
        assert sink.by_thread()["t-a"] == list(range(1, len(sink.by_thread()["t-a"]) + 1))

    async def test_a_failing_event_blocks_its_thread_only_and_is_retried_with_backoff(
        self, durability: Durability, operable: bool
    ) -> None:
        relayed = relayable(durability, operable)
        await converse(relayed)
        sink = RelaySink()
        sink.refuse.add(("t-b", 3))
        relay = OutboxRelay(relayed, sink, retry_base=1.0, retry_max=1.0)
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
        self, make_durability: Callable[[], Durability], operable: bool
    ) -> None:
        """The relay is cancelled while publishing, and what the sink acknowledged is marked.

        A new relay on a new adapter instance publishes the rest, in order.
        """
        if not self.persistent:
            pytest.skip("this adapter keeps no state across instances")
        async with make_durability() as durability:
            relayed = relayable(durability, operable)
            await converse(relayed)
            committed = await read_all_events(relayed)
        async with make_durability() as durability:
            relayed = relayable(durability, operable)
            sink = RelaySink()
            acknowledged = asyncio.Event()

            async def slow_after_three(event: OutboxEvent) -> None:
                await sink(event)
                if len(sink.seen) == 3:
                    acknowledged.set()
                    await asyncio.sleep(3600)

            relay = OutboxRelay(relayed, slow_after_three, concurrency=1)
            task = asyncio.create_task(relay.run_once())
            await acknowledged.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The first two were acknowledged and marked as published.
            # The third reached the sink, which never answered.
            # The next relay publishes it again (at least once), then the rest.
            assert (await relay.status()).unpublished == len(committed) - 2
        async with make_durability() as durability:  # a new adapter: the relay restarted
            await OutboxRelay(relayable(durability, operable), sink).run_once()
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

    async def test_a_cancelled_relay_keeps_its_claim_until_its_mark_is_written(
        self, durability: Durability, operable: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A relay cancelled while marking still writes the mark.

        It keeps the thread's claim until it has.
        Released earlier, another relay would read those events as unpublished.
        That relay would then publish them a second time.
        """
        relayed = relayable(durability, operable)
        await converse(relayed, ("t-a",))
        wrapper = await flaky(relayed, monkeypatch)
        hold = wrapper.hold = asyncio.Event()
        first, second = RelaySink(), RelaySink()
        task = asyncio.create_task(OutboxRelay(relayed, first, concurrency=1).run_once())
        await asyncio.wait_for(wrapper.marking.wait(), 10)
        task.cancel()
        for _ in range(5):  # let the cancel reach the relay
            await asyncio.sleep(0)
        report = await asyncio.wait_for(OutboxRelay(relayed, second).run_once(), 10)
        assert (report.published, second.seen) == (0, [])  # the thread is still claimed
        assert not task.done()  # waiting for its mark
        hold.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert first.seen and (await OutboxRelay(relayed, second).status()).unpublished == 0

    async def test_relays_on_one_store_share_the_threads_and_never_interleave_one(
        self, make_durability: Callable[[], Durability], operable: bool
    ) -> None:
        if not self.persistent:
            pytest.skip("this adapter keeps no state across instances")
        threads = tuple(f"t-{n}" for n in range(12))
        async with make_durability() as durability:
            relayed = relayable(durability, operable)
            await converse(relayed, threads)
            committed = await read_all_events(relayed)
        published: list[tuple[str, OutboxEvent]] = []

        def sink(name: str) -> Any:
            async def publish(event: OutboxEvent) -> None:
                await asyncio.sleep(0.002)  # long enough for the relays to overlap
                published.append((name, event))

            return publish

        stores = [relayable(make_durability(), operable) for _ in range(3)]
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
        assert sum(r.published for r in reports) == len(committed)  # each exactly once
        assert sorted((e.thread_id, e.seq) for _, e in published) == sorted(
            (e.thread_id, e.seq) for e in committed
        )
        for thread in threads:
            seqs = [e.seq for _, e in published if e.thread_id == thread]
            assert seqs == list(range(1, len(seqs) + 1)), f"{thread} out of order: {seqs}"
        assert len({name for name, _ in published}) > 1, "the relays did not share the work"

    async def test_run_keeps_publishing_new_events_until_stopped(
        self, durability: Durability, operable: bool
    ) -> None:
        relayed = relayable(durability, operable)
        kernel = Kernel(billing_agent(FakeProvider()), relayed)
        sink = RelaySink()
        stop = asyncio.Event()
        relay = OutboxRelay(relayed, sink, poll_interval=0.01)
        running = asyncio.create_task(relay.run(stop))
        for n in range(3):
            await kernel.turn("t", str(n), f"balance {n}")
            for _ in range(200):
                if len(sink.seen) == len(await read_all_events(relayed)):
                    break
                await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(running, 5)
        assert [e.seq for e in sink.seen] == list(range(1, len(sink.seen) + 1))
        assert [e.turn_id for e in sink.seen if e.type == "turn.committed"] == ["0", "1", "2"]

    async def test_a_sync_function_sink_runs_off_the_event_loop(
        self, durability: Durability, operable: bool
    ) -> None:
        """A blocking sink function, such as a sync SDK, runs in a worker thread.

        While it blocks, a turn on the same loop completes.
        """
        relayed = relayable(durability, operable)
        kernel = Kernel(billing_agent(FakeProvider()), relayed)
        await kernel.turn("t", "1", "balance 1")
        entered, release = threading.Event(), threading.Event()
        delivered: list[OutboxEvent] = []

        def blocking(event: OutboxEvent) -> None:
            entered.set()
            assert release.wait(10), "never released"
            delivered.append(event)

        relay = asyncio.create_task(OutboxRelay(relayed, blocking, concurrency=1).run_once())
        assert await asyncio.to_thread(entered.wait, 10)
        # The sink is blocked in its thread; the loop still runs a whole turn.
        other = await asyncio.wait_for(kernel.turn("u", "1", "balance 2"), 5)
        release.set()
        report = await asyncio.wait_for(relay, 10)
        assert other.checkpoint_version == 1
        assert report.failed == 0 and delivered

    # -- store errors during a relay pass ------------------------------------------------------

    async def test_a_store_error_in_one_thread_stops_the_others_before_the_pass_raises(
        self, durability: Durability, monkeypatch: pytest.MonkeyPatch, operable: bool
    ) -> None:
        relayed = relayable(durability, operable)
        await converse(relayed)
        store = await flaky(relayed, monkeypatch)
        store.fail_marks.add("t-a")
        stalled, stopped = asyncio.Event(), asyncio.Event()

        async def sink(event: OutboxEvent) -> None:
            if event.thread_id == "t-a":
                # A store's claims may take a while: t-a's mark fails once a sibling publishes.
                await asyncio.wait_for(stalled.wait(), 10)
            else:
                stalled.set()
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    stopped.set()
                    raise

        relay = OutboxRelay(relayed, sink, concurrency=3)
        with pytest.raises(StoreError, match="refused the mark of t-a"):
            await relay.run_once()  # the error itself, not an ExceptionGroup
        assert stalled.is_set() and stopped.is_set()  # no sibling left publishing

    async def test_run_logs_a_store_error_and_carries_on_after_a_backoff(
        self,
        durability: Durability,
        monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
        operable: bool,
    ) -> None:
        relayed = relayable(durability, operable)
        await converse(relayed)
        committed = await read_all_events(relayed)
        store = await flaky(relayed, monkeypatch)
        store.fail_polls = 2
        sink = RelaySink()
        stop = asyncio.Event()
        passes: list[RelayReport] = []

        def on_pass(report: RelayReport) -> None:
            passes.append(report)
            stop.set()  # everything due is published in one pass

        relay = OutboxRelay(relayed, sink, poll_interval=0.01, retry_base=0.01)
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


def relayable(durability: Durability, operable: bool) -> Operable:
    """``durability`` as the relay takes it, since the relay drives the recorder.

    It skips when the adapter does not declare it (the ``operable`` fixture).
    """
    return as_operable(durability, operable)


async def converse(durability: Durability, threads: tuple[str, ...] = THREADS) -> None:
    """Three turns per thread: a question, a proposed charge, its acceptance."""
    kernel = Kernel(billing_agent(FakeProvider()), durability)
    for thread in threads:
        await kernel.turn(thread, "1", "balance 100")
        await kernel.turn(thread, "2", "charge pi_1 500")
        await kernel.turn(thread, "3", "yes")


class RelaySink:
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


class FlakyRecorder:
    """A recorder whose relay methods fail as a test says, and otherwise pass through."""

    def __init__(self, inner: Recorder) -> None:
        self.inner = inner
        self.fail_polls = 0  # pending_threads calls that fail before the store "recovers"
        self.fail_marks: set[str] = set()  # threads whose mark_published fails
        #: When set, the next mark_published sets ``marking`` and then waits.
        #: It waits for ``hold`` to be set before it writes.
        self.hold: asyncio.Event | None = None
        self.marking = asyncio.Event()

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
        if self.hold is not None:
            hold, self.hold = self.hold, None
            self.marking.set()
            await hold.wait()
        await self.inner.mark_published(thread_id, seqs, at)


async def flaky(durability: Operable, monkeypatch: pytest.MonkeyPatch) -> FlakyRecorder:
    """Puts a :class:`FlakyRecorder` between ``durability`` and its recorder."""
    wrapper = FlakyRecorder(await durability.recorder())

    async def recorder() -> Any:
        return wrapper

    monkeypatch.setattr(durability, "recorder", recorder)
    return wrapper
