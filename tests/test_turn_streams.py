"""Resumable turn streams: every event has an ID, any process resumes after any of them.

On every store, the IDs are ordered and unique. A watcher resumed after any event ID of
a recorded turn gets exactly the suffix. A watcher sees only recorded rounds, never a
provisional one. A retried delivery after a failure streams the recorded rounds as
recorded (same IDs, same data). Then it runs the rest. Fifty watchers of one turn see
the same events. A reader that falls behind does not hold the turn back. A detached
turn runs to its commit with nobody watching. With real processes: a delivery killed
(SIGKILL) mid-stream is resumed by another process on the same store.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import (
    InterpretationError,
    InvalidRequestError,
    Kernel,
    Principal,
    TenantMismatchError,
    TurnEvent,
    TurnExpiredError,
)
from intention_kernel._effects import utcnow
from intention_kernel.durability import Durability
from intention_kernel.operations import prune
from intention_kernel.testing import InMemoryDurability
from proving_support import Store, make_sql_store
from sqlite_history import undo_migration_13
from streams_support import StreamingRounds, streams_kernel

THREAD = "acct-1"
MESSAGE = "what do I owe"
WORKER = Path(__file__).with_name("streams_worker.py")


async def collect(stream: AsyncIterator[TurnEvent]) -> list[TurnEvent]:
    return [event async for event in stream]


def position(event: TurnEvent) -> tuple[int, int]:
    assert event.id is not None
    if event.id == "result":
        return (1 << 30, 0)
    segment, seq, _ = event.id.split(".")
    return int(segment), int(seq)


def texts(events: list[TurnEvent]) -> str:
    return "".join(e.data["text"] for e in events if e.type == "delta")


async def test_every_event_has_an_ordered_unique_id(store: Durability) -> None:
    kernel = streams_kernel(store, StreamingRounds())
    events = await collect(kernel.stream_turn(THREAD, "t1", MESSAGE))

    ids = [e.id for e in events]
    assert None not in ids and len(set(ids)) == len(ids)
    assert [position(e) for e in events] == sorted(position(e) for e in events)
    assert ids[-1] == "result"
    assert texts(events) == "r1a r1b r2a r2b r3a r3b "
    # Segment N: round N-1's steps, then round N's text.
    assert [(position(e)[0], e.type) for e in events[:-1]] == [
        (1, "delta"),
        (1, "delta"),
        (2, "step"),
        (2, "delta"),
        (2, "delta"),
        (3, "step"),
        (3, "delta"),
        (3, "delta"),
    ]


async def test_a_watcher_resumed_after_any_event_id_gets_exactly_the_suffix(
    store: Durability,
) -> None:
    kernel = streams_kernel(store, StreamingRounds())
    live = await collect(kernel.stream_turn(THREAD, "t1", MESSAGE))

    recorded = await collect(kernel.watch_turn(THREAD, "t1"))
    # The two recorded rounds, as they were streamed live; the rest is in ``result``.
    assert recorded[:-1] == [e for e in live if position(e)[0] <= 2]
    assert recorded[-1].type == "result"
    assert recorded[-1].data == {**live[-1].data, "replayed": True}
    for index, event in enumerate(recorded):
        assert event.id is not None
        suffix = await collect(kernel.watch_turn(THREAD, "t1", after=event.id))
        assert suffix == recorded[index + 1 :], event.id
    # The same from another adapter on the same store (a process that ran nothing).
    if not isinstance(store, InMemoryDurability):
        other = streams_kernel(store, StreamingRounds())
        assert await collect(other.watch_turn(THREAD, "t1", after=recorded[0].id)) == recorded[1:]


async def test_a_retried_delivery_resumes_after_the_event_its_client_saw_last(
    store: Durability,
) -> None:
    kernel = streams_kernel(store, StreamingRounds())
    live = await collect(kernel.stream_turn(THREAD, "t1", MESSAGE))
    # Committed: a retry from the last event before ``result`` gets the result only.
    again = await collect(kernel.stream_turn(THREAD, "t1", MESSAGE, after=live[-2].id))
    assert [e.type for e in again] == ["result"]
    assert await collect(kernel.stream_turn(THREAD, "t1", MESSAGE, after="result")) == []


async def test_a_failed_delivery_is_continued_without_streaming_recorded_rounds_twice(
    store: Durability,
) -> None:
    failing = StreamingRounds()
    kernel = streams_kernel(store, failing)

    async def fail(request: Any) -> Any:
        raise RuntimeError("the model went away")

    seen: list[TurnEvent] = []
    original = failing.interpret

    async def third_round_fails(request: Any) -> Any:
        if len(request.rounds) == 2:
            request.stream("r3 provisional ")
            return await fail(request)
        return await original(request)

    failing.interpret = third_round_fails  # type: ignore[method-assign]
    with pytest.raises(InterpretationError, match="the model went away"):
        await _read_into(kernel.stream_turn(THREAD, "t1", MESSAGE), seen, asyncio.Event())
    assert texts(seen) == "r1a r1b r2a r2b r3 provisional "

    failing.interpret = original  # type: ignore[method-assign]
    resumed = await collect(kernel.stream_turn(THREAD, "t1", MESSAGE, after=seen[-1].id))
    # Segment 3 was never recorded: it comes again from its start, from the new
    # delivery (a new delivery name in its IDs), which replaces the provisional one.
    assert {e.id for e in seen} & {e.id for e in resumed} == set()
    assert [position(e) for e in resumed[:-1]] == [(3, 0), (3, 1), (3, 2)]
    assert texts(resumed) == "r3a r3b "
    # The recorded rounds were not streamed again; a watcher sees them as first sent.
    watched = await collect(kernel.watch_turn(THREAD, "t1"))
    assert watched[:-1] == [e for e in seen if position(e)[0] <= 2]
    # Committed now: a retry from the start gets its result alone.
    replayed = await collect(kernel.stream_turn(THREAD, "t1", MESSAGE))
    assert [e.type for e in replayed] == ["result"]


async def test_a_redelivery_streams_recorded_rounds_with_their_ids(store: Durability) -> None:
    gate = asyncio.Event()
    kernel = streams_kernel(store, StreamingRounds(hang=3))
    first: list[TurnEvent] = []
    stuck = asyncio.Event()
    reading = _read_into(kernel.stream_turn(THREAD, "t1", MESSAGE), first, stuck)
    consumer = asyncio.create_task(reading)
    await stuck.wait()
    # The delivery is stuck in round 3: a watcher sees rounds 1 and 2 only.
    watcher = kernel.watch_turn(THREAD, "t1", poll=0.01)
    watched = [await anext(watcher) for _ in range(5)]
    assert watched == [e for e in first if position(e)[0] <= 2]
    assert isinstance(watcher, AsyncGenerator)  # watch_turn is an async generator
    await watcher.aclose()
    consumer.cancel()
    for task in list(kernel._streaming):
        task.cancel()  # the delivery dies (as its process would)
    await asyncio.gather(*kernel._streaming, consumer, return_exceptions=True)

    second = streams_kernel(store, StreamingRounds(gate=gate))
    gate.set()
    retried = await collect(second.stream_turn(THREAD, "t1", MESSAGE))
    recorded = [e for e in first if position(e)[0] <= 2]
    assert retried[: len(recorded)] == recorded  # same IDs, same data
    assert texts(retried) == "r1a r1b r2a r2b r3a r3b "
    assert [e.type for e in retried].count("step") == 2


async def _read_into(
    stream: AsyncIterator[TurnEvent], into: list[TurnEvent], stuck: asyncio.Event
) -> None:
    async for event in stream:
        into.append(event)
        if texts(into) == "r1a r1b r2a r2b r3 provisional ":
            stuck.set()


async def test_fifty_watchers_of_one_turn_see_the_same_events(store: Durability) -> None:
    gate = asyncio.Event()
    kernel = streams_kernel(store, StreamingRounds(gate=gate))
    stream = kernel.stream_turn(THREAD, "t1", MESSAGE)
    head = [await anext(stream) for _ in range(5)]  # rounds 1 and 2 are recorded
    watchers = [
        asyncio.create_task(collect(kernel.watch_turn(THREAD, "t1", poll=0.05))) for _ in range(50)
    ]
    await asyncio.sleep(0.05)
    gate.set()
    live = head + await collect(stream)
    results = await asyncio.gather(*watchers)
    expected = [e for e in live if position(e)[0] <= 2]
    for watched in results:
        assert watched[:-1] == expected
        assert watched[-1].data == {**live[-1].data, "replayed": True}


async def test_a_reader_that_falls_behind_does_not_hold_the_turn_back(
    store: Durability,
) -> None:
    kernel = streams_kernel(store, StreamingRounds(), stream_buffer=2)
    stream = kernel.stream_turn(THREAD, "t1", MESSAGE)
    first = await anext(stream)
    # The reader stops reading; the turn runs on to its commit all the same.
    for _ in range(500):
        if (await kernel.turn_status(THREAD, "t1")).status == "committed":
            break
        await asyncio.sleep(0.01)
    assert (await kernel.turn_status(THREAD, "t1")).status == "committed"
    rest = await collect(stream)
    # Its stream went on from the store: no event twice, the recorded rounds whole.
    everything = [first, *rest]
    assert len({e.id for e in everything}) == len(everything)
    watched = await collect(kernel.watch_turn(THREAD, "t1"))
    assert everything[-1] == watched[-1]
    assert [e for e in watched if e in everything] == watched


async def test_a_detached_turn_runs_to_its_commit_with_nobody_watching(
    store: Durability,
) -> None:
    kernel = streams_kernel(store, StreamingRounds())
    accepted = await kernel.detach_turn(THREAD, "t1", MESSAGE)
    assert accepted.status == "queued"
    await kernel.drained()
    status = await kernel.turn_status(THREAD, "t1")
    assert status.status == "committed" and status.result is not None
    assert status.result.reply is not None
    watched = await collect(kernel.watch_turn(THREAD, "t1"))
    assert texts(watched) == "r1a r1b r2a r2b "  # the recorded rounds, then the result
    assert watched[-1].data["reply"] == status.result.reply
    # Accepted again: the stored result, run nothing.
    again = await kernel.detach_turn(THREAD, "t1", MESSAGE)
    assert again.status == "committed" and again.to_dict()["result"]["replayed"] is True


async def test_bad_event_ids_and_other_tenants_are_refused(store: Durability) -> None:
    kernel = streams_kernel(store, StreamingRounds())
    await kernel.turn(THREAD, "t1", MESSAGE, tenant_id="acme")
    for bad in ("", "1.2", "a.b.c", "1.2.3.4", "1.2.x-y"):
        with pytest.raises(InvalidRequestError, match="event ID"):
            kernel.watch_turn(THREAD, "t1", after=bad, tenant_id="acme")
        with pytest.raises(InvalidRequestError, match="event ID"):
            await anext(kernel.stream_turn(THREAD, "t1", MESSAGE, after=bad, tenant_id="acme"))
    with pytest.raises(TenantMismatchError):
        await anext(kernel.watch_turn(THREAD, "t1", tenant_id="globex"))
    with pytest.raises(TenantMismatchError):
        await kernel.turn_status(THREAD, "t1", principal=Principal("eve", tenant_id="globex"))
    with pytest.raises(TenantMismatchError):
        await kernel.detach_turn(THREAD, "t9", MESSAGE, tenant_id="globex")
    unknown = await kernel.turn_status(THREAD, "nope", tenant_id="acme")
    assert unknown.status == "unknown" and unknown.result is None


# -- real processes -----------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path, file="streams.db")


def start_worker(store: Store, **config: Any) -> subprocess.Popen[str]:
    turn = {"thread_id": THREAD, "turn_id": "t1", "message": MESSAGE}
    return subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            json.dumps({"store": store.config(), "turn": turn, **config}),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(WORKER.parent)},
    )


def read_until(worker: subprocess.Popen[str], text: str) -> list[TurnEvent]:
    assert worker.stdout is not None
    events: list[TurnEvent] = []
    while texts(events) != text:
        line = worker.stdout.readline()
        assert line, f"the worker ended early, after {events}"
        data = json.loads(line)
        events.append(TurnEvent(data["type"], data["data"], data["id"]))
    return events


async def test_a_stream_killed_mid_turn_is_resumed_by_another_process(sql_store: Store) -> None:
    worker = start_worker(sql_store, hang=3)
    try:
        seen = await asyncio.to_thread(read_until, worker, "r1a r1b r2a r2b r3 provisional ")
        async with sql_store.durability() as store:
            # While the first process is stuck in round 3, another watches it.
            watcher = streams_kernel(store, StreamingRounds()).watch_turn(THREAD, "t1", poll=0.02)
            recorded = [await anext(watcher) for _ in range(5)]
            assert isinstance(watcher, AsyncGenerator)  # watch_turn is an async generator
            await watcher.aclose()
        os.kill(worker.pid, signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        assert worker.stdout is not None
        worker.stdout.close()
    assert recorded == [e for e in seen if position(e)[0] <= 2]

    # The client resumes after the last event it saw, from another process.
    resumer = start_worker(sql_store, after=seen[-1].id)
    assert resumer.stdout is not None
    out, _ = await asyncio.to_thread(resumer.communicate, timeout=60)
    assert resumer.returncode == 0
    resumed = [TurnEvent(d["type"], d["data"], d["id"]) for d in map(json.loads, out.splitlines())]
    assert {e.id for e in seen} & {e.id for e in resumed} == set()
    # Round 3 never recorded: its segment comes again whole, from the new delivery.
    assert [position(e) for e in resumed[:-1]] == [(3, 0), (3, 1), (3, 2)]
    assert texts(resumed) == "r3a r3b "
    assert resumed[-1].type == "result" and resumed[-1].data["replayed"] is False
    async with sql_store.durability() as store:
        watched = await collect(streams_kernel(store, StreamingRounds()).watch_turn(THREAD, "t1"))
    assert watched[:-1] == recorded
    assert watched[-1].data == {**resumed[-1].data, "replayed": True}


async def test_fifty_watchers_in_another_process_see_what_the_turn_recorded(
    sql_store: Store,
) -> None:
    worker = start_worker(sql_store, slow=1.0)
    try:
        async with sql_store.durability() as store:
            kernel = streams_kernel(store, StreamingRounds())
            watchers = [
                asyncio.create_task(collect(kernel.watch_turn(THREAD, "t1", poll=0.05)))
                for _ in range(50)
            ]
            out, _ = await asyncio.to_thread(worker.communicate, timeout=60)
            results = await asyncio.wait_for(asyncio.gather(*watchers), 60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0
    live = [TurnEvent(d["type"], d["data"], d["id"]) for d in map(json.loads, out.splitlines())]
    expected = [e for e in live if position(e)[0] <= 2]
    assert texts(expected) == "r1a r1b r2a r2b "
    for watched in results:
        assert watched[:-1] == expected
        assert watched[-1].data == {**live[-1].data, "replayed": True}


def test_kernel_refuses_a_bad_stream_buffer() -> None:
    with pytest.raises(InvalidRequestError, match="stream_buffer"):
        streams_kernel(InMemoryDurability(), StreamingRounds(), stream_buffer=0)
    assert isinstance(streams_kernel(InMemoryDurability(), StreamingRounds()), Kernel)


async def test_a_store_from_before_turn_streams_is_upgraded(sql_store: Store) -> None:
    """The migration that adds ``ik_streams`` runs on an older store, and
    a turn left half done there (rounds journaled, no segment) goes on, streamed."""
    async with sql_store.durability() as store:
        await streams_kernel(store, StreamingRounds()).turn(THREAD, "t0", MESSAGE)
    [(version,)] = sql_store.query("SELECT max(version) FROM ik_schema")
    if sql_store.kind == "sqlite":
        with contextlib.closing(sqlite3.connect(sql_store.location)) as conn, conn:
            undo_migration_13(conn)
    else:
        # Migration 15 added the streams; 16 (timers) is undone with it.
        sql_store.query("DROP TABLE ik_streams, ik_timers")
        sql_store.query("DELETE FROM ik_schema WHERE version >= 15")
    async with sql_store.durability() as store:
        kernel = streams_kernel(store, StreamingRounds())
        events = await collect(kernel.stream_turn(THREAD, "t1", MESSAGE))
        assert texts(await collect(kernel.watch_turn(THREAD, "t1"))) == "r1a r1b r2a r2b "
    assert texts(events) == "r1a r1b r2a r2b r3a r3b "
    assert sql_store.query("SELECT max(version) FROM ik_schema") == [(version,)]


async def test_retention_prunes_a_turns_stream_with_its_result_or_its_journal(
    store: Durability,
) -> None:
    model = StreamingRounds()
    kernel = streams_kernel(store, model)
    await collect(kernel.stream_turn(THREAD, "t1", MESSAGE))
    original = model.interpret

    async def third_round_fails(request: Any) -> Any:
        if len(request.rounds) == 2:
            raise RuntimeError("the model went away")
        return await original(request)

    model.interpret = third_round_fails  # type: ignore[method-assign]
    with pytest.raises(InterpretationError):
        await collect(kernel.stream_turn(THREAD, "t2", MESSAGE))  # rounds 1, 2 recorded
    model.interpret = original  # type: ignore[method-assign]
    assert [n for n, _ in (await store.read_stream(THREAD, "t2")).segments] == [1, 2]  # type: ignore[attr-defined]

    report = await prune(store, older_than=timedelta(0), now=utcnow() + timedelta(hours=1))  # type: ignore[arg-type]
    assert (report.turns, report.journal) == (1, 2)
    for turn_id in ("t1", "t2"):
        assert (await store.read_stream(THREAD, turn_id)).segments == ()  # type: ignore[attr-defined]
    with pytest.raises(TurnExpiredError):
        await anext(kernel.watch_turn(THREAD, "t1"))
    # The turn whose journal was pruned runs again from its first round, streamed anew.
    again = await collect(kernel.stream_turn(THREAD, "t2", MESSAGE))
    assert texts(again) == "r1a r1b r2a r2b r3a r3b "
    watched = await collect(kernel.watch_turn(THREAD, "t2"))
    assert watched[:-1] == [e for e in again if position(e)[0] <= 2]


async def test_a_turn_nobody_streams_or_queued_records_no_events(store: Durability) -> None:
    """``kernel.turn`` pays nothing for streams, on a queueing agent too; a turn drained
    from the inbox (a detached one) records its rounds, so that it can be watched."""
    plain = streams_kernel(store, StreamingRounds())
    agent = dataclasses.replace(plain.agent, on_busy="queue")
    queueing = Kernel(agent, store)
    await plain.turn(THREAD, "t1", MESSAGE)
    await queueing.turn(THREAD, "t2", MESSAGE)
    await queueing.detach_turn(THREAD, "t3", MESSAGE)
    await queueing.drained()
    read = store.read_stream  # type: ignore[attr-defined]
    assert [len((await read(THREAD, t)).segments) for t in ("t1", "t2", "t3")] == [0, 0, 2]
