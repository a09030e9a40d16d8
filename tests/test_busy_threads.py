"""Busy threads (issue 21): ``Agent(on_busy="reject")`` refuses a turn at once while
another turn on its thread runs; ``"wait"`` (the default) queues it, on every store.

The first turn is really running, held inside its provider call, when the second is
issued."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import prefork
from host_support import asgi_client
from intention_kernel import Agent, CompilationError, Kernel, ThreadBusyError, TurnResult
from intention_kernel.durability import Durability
from intention_kernel.host import Principal, create_app
from intention_kernel.testing import InMemoryDurability, faults
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import LedgerProvider, Store, make_sql_store, proving_agent, read_all_events
from test_host_streaming import parse_sse

WORKER = Path(__file__).with_name("crash_worker.py")

HELD = 10.0  # seconds a test waits for the held turn to reach its provider call
# Far below every store's lock timeout: a refusal that came only after waiting for the
# lock would miss it (asyncio.wait_for raises TimeoutError instead).
AT_ONCE = 2.0


def agent(provider: FakeProvider, on_busy: Any) -> Agent:
    return dataclasses.replace(billing_agent(provider), on_busy=on_busy)


@asynccontextmanager
async def charging(kernel: Kernel, provider: FakeProvider) -> AsyncIterator[asyncio.Task[Any]]:
    """Thread ``t``'s accept of a charge, running and held inside the provider call for
    the block; released at its end."""
    await kernel.turn("t", "1", "charge pi_1 500")
    provider.behaviour["pi_1"] = "block"
    running = asyncio.create_task(kernel.turn("t", "2", "yes"))
    try:
        await asyncio.wait_for(provider.entered.wait(), HELD)
        yield running
    finally:
        provider.released.set()
        if not running.done():
            await asyncio.wait_for(asyncio.shield(running), HELD)


async def test_reject_refuses_a_turn_at_once_while_another_runs(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(agent(provider, "reject"), store)
    async with charging(kernel, provider) as running:
        before = await store.load_checkpoint("t")
        events = len(await read_all_events(store))
        with pytest.raises(ThreadBusyError) as refused:
            await asyncio.wait_for(kernel.turn("t", "3", "balance"), AT_ONCE)
        # Refused while the first turn is still inside its provider call: it never waited.
        assert not running.done()
        assert refused.value.thread_id == "t"
        assert await store.load_checkpoint("t") == before
        assert len(await read_all_events(store)) == events
        # Another thread is not busy.
        other = await kernel.turn("u", "1", "balance")
        assert other.checkpoint_version == 1
    accepted = await running
    assert accepted.steps[0].status == "completed" and provider.calls() == 1
    # The refused delivery committed nothing: sent again, it runs (it is not a replay).
    again = await kernel.turn("t", "3", "balance")
    assert (again.replayed, again.checkpoint_version) == (False, 3)


async def test_wait_queues_a_turn_behind_the_running_one(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(agent(provider, "wait"), store)
    async with charging(kernel, provider) as running:
        queued = asyncio.create_task(kernel.turn("t", "3", "balance"))
        done, _ = await asyncio.wait([queued], timeout=0.2)
        assert done == set() and not running.done()  # it waits for the lock
    first: TurnResult = await running
    second: TurnResult = await asyncio.wait_for(queued, HELD)
    assert (first.checkpoint_version, second.checkpoint_version) == (2, 3)
    assert provider.calls() == 1


async def test_the_host_answers_409_thread_busy_at_once_while_a_turn_runs(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = Kernel(agent(provider, "reject"), store)
    app = create_app(kernel, tokens={"tok": Principal("ana", "acme")})
    auth = {"authorization": "Bearer tok"}
    async with asgi_client(app) as client:
        await client.post(
            "/v1/threads/t/turns", json={"turn_id": "1", "message": "charge pi_1 500"}, headers=auth
        )
        provider.behaviour["pi_1"] = "block"
        running = asyncio.create_task(
            client.post(
                "/v1/threads/t/turns", json={"turn_id": "2", "message": "yes"}, headers=auth
            )
        )
        await asyncio.wait_for(provider.entered.wait(), HELD)
        busy = await asyncio.wait_for(
            client.post(
                "/v1/threads/t/turns", json={"turn_id": "3", "message": "balance"}, headers=auth
            ),
            AT_ONCE,
        )
        # A streamed turn is refused with the same problem, before any event is sent.
        streamed = await asyncio.wait_for(
            client.post(
                "/v1/threads/t/turns",
                json={"turn_id": "4", "message": "balance"},
                headers={**auth, "accept": "text/event-stream"},
            ),
            AT_ONCE,
        )
        assert not running.done()
        provider.released.set()
        accepted = await asyncio.wait_for(running, HELD)
    assert busy.status_code == 409, busy.text
    assert busy.headers["content-type"] == "application/problem+json"
    assert busy.headers["retry-after"] == "1"
    assert busy.json()["type"] == "/problems/thread-busy"
    assert busy.json()["thread_id"] == "t"
    assert streamed.status_code == 409, streamed.text
    assert streamed.json()["type"] == "/problems/thread-busy"
    assert accepted.status_code == 200 and provider.calls() == 1


async def test_the_host_replays_a_committed_turn_at_once_while_a_turn_runs(
    store: Durability,
) -> None:
    """Issue 31, N5: a redelivery of a committed turn is answered 200 with
    ``replayed: true`` while another turn of the thread runs, on JSON and SSE, with
    ``on_busy="reject"``; it was 409 ``thread-busy`` on SQLite and in memory."""
    provider = FakeProvider()
    kernel = Kernel(agent(provider, "reject"), store)
    app = create_app(kernel, tokens={"tok": Principal("ana", "acme")})
    auth = {"authorization": "Bearer tok"}
    proposal = {"turn_id": "1", "message": "charge pi_1 500"}
    async with asgi_client(app) as client:
        first = await client.post("/v1/threads/t/turns", json=proposal, headers=auth)
        assert first.status_code == 200, first.text
        provider.behaviour["pi_1"] = "block"
        running = asyncio.create_task(
            client.post(
                "/v1/threads/t/turns", json={"turn_id": "2", "message": "yes"}, headers=auth
            )
        )
        await asyncio.wait_for(provider.entered.wait(), HELD)
        again = await asyncio.wait_for(
            client.post("/v1/threads/t/turns", json=proposal, headers=auth), AT_ONCE
        )
        streamed = await asyncio.wait_for(
            client.post(
                "/v1/threads/t/turns",
                json=proposal,
                headers={**auth, "accept": "text/event-stream"},
            ),
            AT_ONCE,
        )
        assert not running.done()
        provider.released.set()
        accepted = await asyncio.wait_for(running, HELD)
    assert again.status_code == 200, again.text
    assert again.json() == dict(first.json(), replayed=True)
    assert streamed.status_code == 200, streamed.text
    [(_, result)] = [e for e in parse_sse(streamed.text) if e[0] == "result"]
    assert result == dict(first.json(), replayed=True)
    assert accepted.status_code == 200 and provider.calls() == 1


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path)


@pytest.mark.slow
async def test_reject_refuses_a_turn_while_another_process_runs_one(
    sql_store: Store, tmp_path: Path
) -> None:
    """The one attempt at the lock sees a holder in another process (the SQLite file
    lock, the PostgreSQL advisory lock), not only in this one."""
    ledger = str(tmp_path / "provider.ledger")
    async with sql_store.durability() as durability:
        rejecting = dataclasses.replace(
            proving_agent(LedgerProvider(path=ledger)), on_busy="reject"
        )
        kernel = Kernel(rejecting, durability)
        await kernel.turn("t", "1", "charge pi_1 500")
        config = {
            "store": sql_store.config(),
            "ledger": ledger,
            "turns": [{"thread_id": "t", "turn_id": "2", "message": "yes"}],
            "fault": {"point": faults.IN_PROVIDER_AFTER_WRITE, "action": "hold"},
        }
        worker = await prefork.spawn(WORKER, json.dumps(config))
        try:
            line = await asyncio.wait_for(worker.stdout.readline(), 60)
            assert json.loads(line) == {"held": faults.IN_PROVIDER_AFTER_WRITE}
            with pytest.raises(ThreadBusyError):
                await asyncio.wait_for(kernel.turn("t", "3", "balance"), AT_ONCE)
            checkpoint = await durability.load_checkpoint("t")
            assert checkpoint is not None and checkpoint.version == 1
        finally:
            worker.kill()
            await worker.communicate()


def test_on_busy_is_wait_or_reject() -> None:
    with pytest.raises(
        CompilationError, match="on_busy must be 'wait', 'reject', 'queue', 'steer' or 'interrupt'"
    ):
        Kernel(agent(FakeProvider(), "drop"), InMemoryDurability())


async def test_a_released_lock_promised_to_a_queued_turn_is_still_busy() -> None:
    """Between a release and the wake-up of the turn queued behind it, the lock is
    free but promised: a turn that will not wait is refused rather than queued."""
    from intention_kernel.durability._engine.looplocks import LoopLocks

    locks = LoopLocks()
    queued_in = asyncio.Event()

    async def queued() -> None:
        async with locks.hold("t", None):
            queued_in.set()

    async with locks.hold("t", None):
        waiter = asyncio.create_task(queued())
        await asyncio.sleep(0)  # the waiter is queued on the lock
    # Released: the waiter is woken but has not run yet.
    with pytest.raises(ThreadBusyError):
        async with locks.hold("t", None, wait=False):
            pass
    await asyncio.wait_for(waiter, HELD)
    assert queued_in.is_set()
    async with locks.hold("t", None, wait=False):  # nobody wants it now
        pass
