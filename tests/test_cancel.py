"""Cancelling a turn (issue 36): ``Kernel.cancel`` stops a running turn at its next safe
point (before its next step or round), in this process or another; the turn commits
what it did, and its reply says it was cancelled. On every store.

The turn is really running, its interpreter held on an event, when the cancel comes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import prefork
from intention_kernel import (
    Cancellation,
    Intent,
    Interpretation,
    InterpretationRequest,
    InvalidRequestError,
    Kernel,
    Queued,
    TenantMismatchError,
    TurnCancelledError,
    TurnResult,
)
from intention_kernel._effects import utcnow
from intention_kernel.durability import Durability
from intention_kernel.durability._contract.records import ThreadOwner
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import Store, make_sql_store, read_all_events

WORKER = Path(__file__).with_name("crash_worker.py")

HELD = 10.0


class HeldInterpreter:
    """Asks for two balance look-ups, once ``release`` is set; ``entered`` says it was
    asked. Other messages ask for one look-up at once."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        if request.message == "look twice":
            self.entered.set()
            await self.release.wait()
            return Interpretation(
                intents=[Intent("billing.balance", {"due": 1}), Intent("billing.balance", {})]
            )
        return Interpretation(intents=[Intent("billing.balance", {"due": 7})])


def kernel_for(store: Durability, interpreter: HeldInterpreter, **options: Any) -> Kernel:
    agent = dataclasses.replace(billing_agent(FakeProvider()), interpreter=interpreter)
    return Kernel(agent, store, **options)


def of_turn(events: list[Any], turn_id: str, type: str) -> list[Any]:
    return [e for e in events if e.turn_id == turn_id and e.type == type]


@pytest.mark.parametrize("where", ["this kernel", "another kernel"])
async def test_a_cancelled_turn_stops_before_its_next_step_and_says_so(
    store: Durability, where: str
) -> None:
    interpreter = HeldInterpreter()
    # Another kernel stands for another process: only the store carries the request.
    kernel = kernel_for(store, interpreter, cancel_check_after=0.0)
    canceller = kernel if where == "this kernel" else kernel_for(store, HeldInterpreter())
    running = asyncio.create_task(kernel.turn("t", "1", "look twice"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    asked = await canceller.cancel("t", "1", reason="changed my mind")
    assert asked == Cancellation("t", "1", "requested", "changed my mind")
    interpreter.release.set()
    result = await asyncio.wait_for(running, HELD)
    assert result.steps == ()  # stopped before its first step
    assert result.reply.endswith("Cancelled before it finished: changed my mind")
    assert result.checkpoint_version == 1  # it committed what it did: nothing
    events = await read_all_events(store, thread_id="t")
    assert len(of_turn(events, "1", "turn.cancelled")) == 1
    assert len(of_turn(events, "1", "turn.committed")) == 1
    # A redelivery replays the cancelled result; the thread goes on.
    again = await kernel.turn("t", "1", "look twice")
    assert (again.replayed, again.reply) == (True, result.reply)
    assert (await kernel.turn("t", "2", "balance")).steps[0].value == {"due": 7}


async def test_many_turns_at_a_safe_point_at_once_each_read_their_own_cancel(
    store: Durability,
) -> None:
    """Twenty turns reach their first safe point together, past ``cancel_check_after``.
    Another kernel cancelled every other one, each with its own reason. PostgreSQL reads
    such checks together, in one statement: each turn still gets its own answer."""
    interpreter = HeldInterpreter()
    kernel = kernel_for(store, interpreter)
    other = kernel_for(store, HeldInterpreter())  # only the store carries its cancels
    turns = [asyncio.create_task(kernel.turn(f"t{n}", "1", "look twice")) for n in range(20)]
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    for n in range(1, 20, 2):
        assert (await other.cancel(f"t{n}", "1", reason=f"stop {n}")).status == "requested"
    await asyncio.sleep(0.1)  # every turn is past ``cancel_check_after``
    interpreter.release.set()
    results = await asyncio.wait_for(asyncio.gather(*turns), HELD)
    for n, result in enumerate(results):
        if n % 2:
            assert result.steps == (), n  # stopped before its first step
            assert result.reply.endswith(f"Cancelled before it finished: stop {n}"), n
        else:
            assert [step.status for step in result.steps] == ["completed"] * 2, n


async def test_a_cancel_of_a_committed_turn_changes_nothing(store: Durability) -> None:
    kernel = kernel_for(store, HeldInterpreter())
    done = await kernel.turn("t", "1", "balance")
    before = await store.load_checkpoint("t")
    events = await read_all_events(store)
    assert await kernel.cancel("t", "1") == Cancellation("t", "1", "committed")
    assert await store.load_checkpoint("t") == before
    assert await read_all_events(store) == events
    replay = await kernel.turn("t", "1", "balance")
    assert (replay.replayed, replay.reply) == (True, done.reply)


async def test_a_cancel_of_a_queued_turn_removes_it_from_the_inbox(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(dataclasses.replace(billing_agent(provider), on_busy="queue"), store)
    await kernel.turn("t", "1", "charge pi_1 500")
    provider.behaviour["pi_1"] = "block"
    running = asyncio.create_task(kernel.turn("t", "2", "yes"))
    await asyncio.wait_for(provider.entered.wait(), HELD)
    assert await kernel.submit("t", "3", "balance") == Queued("t", "3", 1)
    assert await kernel.submit("t", "4", "balance") == Queued("t", "4", 2)
    assert await kernel.cancel("t", "3") == Cancellation("t", "3", "dequeued")
    provider.released.set()
    # A write in flight is not undone by a cancel of another turn: it settles.
    assert (await asyncio.wait_for(running, HELD)).steps[0].status == "completed"
    await kernel.drained()
    events = await read_all_events(store, thread_id="t")
    assert of_turn(events, "3", "turn.committed") == []  # it never ran
    assert len(of_turn(events, "4", "turn.committed")) == 1
    fourth = await kernel.submit("t", "4", "balance")
    assert isinstance(fourth, TurnResult) and fourth.checkpoint_version == 3


async def test_a_cancel_with_a_reason_that_is_not_text_is_refused(store: Durability) -> None:
    kernel = kernel_for(store, HeldInterpreter())
    with pytest.raises(InvalidRequestError):
        await kernel.cancel("t", "1", reason=42)  # type: ignore[arg-type]
    assert await store.load_checkpoint("t") is None


async def test_a_caller_waiting_on_a_queued_turn_that_is_cancelled_is_told(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = Kernel(dataclasses.replace(billing_agent(provider), on_busy="queue"), store)
    await kernel.turn("t", "1", "charge pi_1 500")
    provider.behaviour["pi_1"] = "block"
    running = asyncio.create_task(kernel.turn("t", "2", "yes"))
    await asyncio.wait_for(provider.entered.wait(), HELD)
    waiting = asyncio.create_task(kernel.turn("t", "3", "balance"))
    for _ in range(500):  # until the message is in the inbox
        if await store.read_inbox("t"):  # type: ignore[attr-defined]
            break
        await asyncio.sleep(0.01)
    assert await kernel.cancel("t", "3") == Cancellation("t", "3", "dequeued")
    provider.released.set()
    await asyncio.wait_for(running, HELD)
    with pytest.raises(TurnCancelledError) as cancelled:
        await asyncio.wait_for(waiting, HELD)
    assert cancelled.value.turn_id == "3"
    await kernel.drained()
    events = await read_all_events(store, thread_id="t")
    assert of_turn(events, "3", "turn.committed") == []


class RoundsInterpreter:
    """Works in rounds: round 1 looks up a balance at once; round 2 is held until
    ``release``, then asks for another look-up; round 3 writes the reply."""

    multi_round = True

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        if len(request.rounds) == 0:
            return Interpretation(intents=[Intent("billing.balance", {"due": 1})])
        if len(request.rounds) == 1:
            self.entered.set()
            await self.release.wait()
            return Interpretation(intents=[Intent("billing.balance", {"due": 2})])
        return Interpretation(reply="All looked up.")


async def test_a_turn_in_rounds_keeps_the_rounds_it_ran_and_stops_before_the_next_steps(
    store: Durability,
) -> None:
    interpreter = RoundsInterpreter()
    agent = dataclasses.replace(billing_agent(FakeProvider()), interpreter=interpreter)
    kernel, other = Kernel(agent, store, cancel_check_after=0.0), Kernel(agent, store)
    running = asyncio.create_task(kernel.turn("t", "1", "look it all up"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    assert (await other.cancel("t", "1")).status == "requested"
    interpreter.release.set()
    result = await asyncio.wait_for(running, HELD)
    # Round 1's step ran and is committed; round 2's step never ran; no round 3.
    assert [s.value for s in result.steps] == [{"due": 1}]
    assert result.reply.endswith("Cancelled before it finished.")
    checkpoint = await store.load_checkpoint("t")
    assert checkpoint is not None and checkpoint.facts["balance"].value == 1


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path)


@pytest.mark.slow
async def test_a_cancel_from_another_process_stops_the_running_turn(
    sql_store: Store, tmp_path: Path
) -> None:
    async with sql_store.durability() as durability:
        interpreter = HeldInterpreter()
        kernel = kernel_for(durability, interpreter, cancel_check_after=0.0)
        running = asyncio.create_task(kernel.turn("t", "1", "look twice"))
        await asyncio.wait_for(interpreter.entered.wait(), HELD)
        worker = await prefork.spawn(
            WORKER,
            json.dumps(
                {
                    "store": sql_store.config(),
                    "ledger": str(tmp_path / "unused.ledger"),
                    "cancel": {"thread_id": "t", "turn_id": "1", "reason": "stop"},
                }
            ),
        )
        out, err = await asyncio.wait_for(worker.communicate(), 60)
        assert json.loads(out) == {"cancelled": "requested"}, err.decode()
        interpreter.release.set()
        result = await asyncio.wait_for(running, HELD)
        assert result.steps == ()
        assert result.reply.endswith("Cancelled before it finished: stop")


AT_ONCE = 8.0  # the running turn is held until the end: an answer that waited for it misses it


@pytest.mark.parametrize("where", ["this kernel", "another kernel"])
async def test_a_caller_waiting_on_a_queued_turn_is_told_at_once_when_it_is_dequeued(
    store: Durability, where: str
) -> None:
    """The caller of ``Kernel.turn`` is told while the turn ahead still runs, not after."""
    provider = FakeProvider()
    queueing = dataclasses.replace(billing_agent(provider), on_busy="queue")
    kernel = Kernel(queueing, store)
    canceller = kernel if where == "this kernel" else Kernel(queueing, store)
    await kernel.turn("t", "1", "charge pi_1 500")
    provider.behaviour["pi_1"] = "block"
    running = asyncio.create_task(kernel.turn("t", "2", "yes"))
    await asyncio.wait_for(provider.entered.wait(), HELD)
    waiting = asyncio.create_task(kernel.turn("t", "3", "balance"))
    for _ in range(500):  # until the message is in the inbox
        if await store.read_inbox("t"):  # type: ignore[attr-defined]
            break
        await asyncio.sleep(0.01)
    assert await canceller.cancel("t", "3") == Cancellation("t", "3", "dequeued")
    await told_while_held(store, kernel, provider, running, waiting)


async def told_while_held(
    store: Durability,
    kernel: Kernel,
    provider: FakeProvider,
    running: asyncio.Task[TurnResult],
    waiting: Awaitable[TurnResult],
) -> None:
    """``waiting``, turn 3, raises ``TurnCancelledError`` while ``running`` is held.
    Then ``running`` completes once let go, and turn 3 never commits."""
    try:
        with pytest.raises(TurnCancelledError) as cancelled:
            await asyncio.wait_for(waiting, AT_ONCE)
        assert cancelled.value.turn_id == "3"
        assert not running.done()  # told while the turn ahead still runs
    finally:
        provider.released.set()
    assert (await asyncio.wait_for(running, HELD)).steps[0].status == "completed"
    await kernel.drained()
    events = await read_all_events(store, thread_id="t")
    assert of_turn(events, "3", "turn.committed") == []


async def test_a_caller_is_told_when_the_cancel_lands_before_its_drain_reads(
    store: Durability, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel comes between the enqueue and the drain's first read of the inbox.

    That drain finds nothing to run and returns at once. The caller must still be
    told now, not after the lock the running turn holds."""
    provider = FakeProvider()
    queueing = dataclasses.replace(billing_agent(provider), on_busy="queue")
    kernel = Kernel(queueing, store)
    await kernel.turn("t", "1", "charge pi_1 500")
    provider.behaviour["pi_1"] = "block"
    running = asyncio.create_task(kernel.turn("t", "2", "yes"))
    await asyncio.wait_for(provider.entered.wait(), HELD)
    enqueue = store.enqueue  # type: ignore[attr-defined]
    told: list[Cancellation] = []

    async def enqueue_then_cancel(entry: Any) -> Any:
        position = await enqueue(entry)
        told.append(await kernel.cancel("t", entry.turn_id))  # before submit reads on
        return position

    monkeypatch.setattr(store, "enqueue", enqueue_then_cancel)
    await told_while_held(store, kernel, provider, running, kernel.turn("t", "3", "balance"))
    assert told == [Cancellation("t", "3", "dequeued")]


@pytest.mark.parametrize("answer", ["structured", "in the message"])
async def test_a_cancel_before_the_turn_stops_its_accept_of_a_held_confirmation(
    store: Durability, answer: str
) -> None:
    """A cancel recorded before the turn came is read before its accept runs the write:
    the write never starts, and the confirmation stays open to answer later."""
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    proposed = await kernel.turn("t", "1", "charge pi_1 500")
    assert proposed.interaction is not None
    # Another kernel stands for another process: only the store carries the request.
    other = Kernel(billing_agent(FakeProvider()), store)
    assert await other.cancel("t", "2", reason="stop") == Cancellation(
        "t", "2", "requested", "stop"
    )
    if answer == "structured":
        result = await kernel.turn("t", "2", answer="accept")
    else:
        result = await kernel.turn("t", "2", "yes")
    assert provider.calls() == 0  # the write never started
    assert result.steps == ()
    assert result.reply.endswith("Cancelled before it finished: stop")
    assert result.interaction is not None  # still open: stopping is not a refusal
    assert result.interaction.turn_id == "1"
    later = await kernel.turn("t", "3", answer="accept")
    assert later.steps[0].status == "completed" and provider.calls() == 1


async def test_a_cancel_for_a_tenant_touches_only_that_tenants_turns(store: Durability) -> None:
    """``owner=``: judged in the store's transaction, on every store. Another tenant's
    queued turn is refused and stays; its running first turn, on a thread nobody owns
    yet, gets a request that only the canceller's own tenant would read."""
    interpreter = HeldInterpreter()
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=interpreter, on_busy="queue"
    )
    kernel = Kernel(agent, store, cancel_check_after=0.0)
    globex = Kernel(agent, store)  # another process, of another tenant's caller
    running = asyncio.create_task(kernel.turn("u", "1", "look twice", tenant_id="acme"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    queued = await kernel.submit("u", "2", "balance", tenant_id="acme")
    assert queued == Queued("u", "2", 1)
    with pytest.raises(TenantMismatchError):
        await globex.cancel("u", "2", owner=ThreadOwner("globex"))
    with pytest.raises(TenantMismatchError):
        await globex.cancel("u", "2", owner=ThreadOwner(None))  # no tenant is another
    assert [e.turn_id for e in await store.read_inbox("u")] == ["2"]  # type: ignore[attr-defined]
    asked = await globex.cancel("u", "1", reason="mine", owner=ThreadOwner("globex"))
    assert asked.status == "requested"  # free thread: recorded, for globex's turns only
    interpreter.release.set()
    result = await asyncio.wait_for(running, HELD)
    assert len(result.steps) == 2  # it stopped nothing
    await kernel.drained()
    # Committed by acme now: globex neither learns it nor records anything.
    with pytest.raises(TenantMismatchError):
        await globex.cancel("u", "1", owner=ThreadOwner("globex"))
    with pytest.raises(TenantMismatchError):
        await globex.cancel("u", "3", owner=ThreadOwner("globex"))
    assert (await kernel.cancel("u", "1", owner=ThreadOwner("acme"))).status == "committed"
    # The owner's own request, scoped, stops its own turn.
    assert (await kernel.cancel("u", "3", owner=ThreadOwner("acme"))).status == "requested"
    stopped = await kernel.turn("u", "3", "balance", tenant_id="acme")
    assert stopped.steps == () and "Cancelled" in stopped.reply
    events = await read_all_events(store, thread_id="u")
    assert len(of_turn(events, "2", "turn.committed")) == 1  # the queued turn ran


async def test_prune_removes_the_stop_requests_with_their_turns(store: Durability) -> None:
    """A pruned turn's cancel goes with it, as do its thread's spent interrupts; a stop
    request for a turn that never came stays, as the promise it is."""
    from intention_kernel.operations import prune

    interpreter = HeldInterpreter()
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=interpreter, on_busy="interrupt"
    )
    kernel = Kernel(agent, store, cancel_check_after=0.0)
    await kernel.turn("t", "1", "balance")
    running = asyncio.create_task(kernel.turn("t", "2", "look twice"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    assert await kernel.submit("t", "3", "balance") == Queued("t", "3", 1)
    interpreter.release.set()
    assert (await asyncio.wait_for(running, HELD)).reply.endswith("Interrupted by a new message.")
    await kernel.drained()
    assert (await kernel.cancel("t", "4", reason="no")).status == "requested"
    assert (await kernel.turn("t", "4", "balance")).steps == ()
    assert (await kernel.cancel("t", "9", reason="later")).status == "requested"
    stops: Any = store
    assert await stops.read_cancel("t", "4", -1) == ("cancel", "no")
    assert await stops.read_cancel("t", "x", 1) == ("interrupt", None)

    report = await prune(store, older_than=timedelta(0), now=utcnow() + timedelta(minutes=1))  # type: ignore[arg-type]
    assert report.turns == 4
    assert await stops.read_cancel("t", "4", -1) == (None, None)
    assert await stops.read_cancel("t", "x", 1) == (None, None)
    assert await stops.read_cancel("t", "9", -1) == ("cancel", "later")
