"""A thread's inbox (issue 36): ``Agent(on_busy="queue")`` commits a message that finds
its thread busy to the thread's durable inbox, and runs it as its own turn, in the order
of acceptance, after the running turn commits. On every store.

The first turn is really running, held inside its provider call, when the next
messages arrive."""

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
from intention_kernel import (
    Intent,
    Interpretation,
    InterpretationRequest,
    Kernel,
    Queued,
    TurnConflictError,
    TurnResult,
)
from intention_kernel.durability import Durability
from intention_kernel.durability._engine.recorded import RecordedDurability
from intention_kernel.testing import faults
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import LedgerProvider, Store, make_sql_store, proving_agent, read_all_events

WORKER = Path(__file__).with_name("crash_worker.py")

HELD = 10.0  # seconds a test waits for the held turn to reach its provider call


def queue_kernel(provider: FakeProvider, store: Durability) -> Kernel:
    return Kernel(dataclasses.replace(billing_agent(provider), on_busy="queue"), store)


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


def of_turn(events: list[Any], turn_id: str, type: str) -> list[Any]:
    return [e for e in events if e.turn_id == turn_id and e.type == type]


def committed(events: list[Any], turn_id: str) -> int:
    return sum(1 for e in events if e.type == "turn.committed" and e.turn_id == turn_id)


async def inbox(store: Durability, thread_id: str) -> list[str]:
    assert isinstance(store, RecordedDurability)
    return [entry.turn_id for entry in await store.read_inbox(thread_id)]


async def test_a_message_queued_while_a_turn_runs_answers_its_position(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = queue_kernel(provider, store)
    async with charging(kernel, provider) as running:
        first = await asyncio.wait_for(kernel.submit("t", "3", "balance"), HELD)
        second = await asyncio.wait_for(kernel.submit("t", "4", "what is my balance"), HELD)
        again = await asyncio.wait_for(kernel.submit("t", "3", "balance"), HELD)
        assert first == Queued("t", "3", 1)
        assert second == Queued("t", "4", 2)
        assert again == Queued("t", "3", 1)  # a redelivery keeps its place
        assert not running.done()
        assert await inbox(store, "t") == ["3", "4"]
        # Accepted, not run: the running turn's checkpoint is still the last one.
        checkpoint = await store.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.version == 1
    accepted: TurnResult = await running
    await kernel.drained()  # the committing kernel drains the inbox after its commit
    assert accepted.checkpoint_version == 2
    assert await inbox(store, "t") == []
    third = await kernel.submit("t", "3", "balance")
    fourth = await kernel.submit("t", "4", "what is my balance")
    assert isinstance(third, TurnResult) and isinstance(fourth, TurnResult)
    # Run in the order of acceptance, each once; a redelivery replays its result.
    assert (third.replayed, third.checkpoint_version) == (True, 3)
    assert (fourth.replayed, fourth.checkpoint_version) == (True, 4)
    events = await read_all_events(store, thread_id="t")
    assert [committed(events, t) for t in ("2", "3", "4")] == [1, 1, 1]
    assert provider.calls() == 1


async def test_turn_on_a_queue_agent_waits_for_its_queued_result(store: Durability) -> None:
    provider = FakeProvider()
    kernel = queue_kernel(provider, store)
    async with charging(kernel, provider) as running:
        waiting = asyncio.create_task(kernel.turn("t", "3", "balance"))
        for _ in range(200):  # until the message is in the inbox: accepted durably
            if await inbox(store, "t"):
                break
            await asyncio.sleep(0.01)
        assert await inbox(store, "t") == ["3"]
        assert not waiting.done() and not running.done()
    result = await asyncio.wait_for(waiting, HELD)
    assert (result.replayed, result.checkpoint_version) == (False, 3)
    assert (await running).checkpoint_version == 2
    await kernel.drained()
    assert await inbox(store, "t") == []


async def test_a_queued_turn_id_sent_with_another_request_is_refused(store: Durability) -> None:
    provider = FakeProvider()
    kernel = queue_kernel(provider, store)
    async with charging(kernel, provider):
        assert await kernel.submit("t", "3", "balance") == Queued("t", "3", 1)
        with pytest.raises(TurnConflictError) as refused:
            await kernel.submit("t", "3", "charge pi_9 100")
        assert refused.value.turn_id == "3"
        assert await inbox(store, "t") == ["3"]
    await kernel.drained()
    events = await read_all_events(store, thread_id="t")
    assert committed(events, "3") == 1
    assert provider.calls() == 1


async def test_a_message_queued_behind_a_turn_that_fails_runs_after_it(
    store: Durability,
) -> None:
    """The holder ends without committing (cancelled): the message queued behind it
    runs all the same, drained by the process that accepted it, before the next turn."""
    provider = FakeProvider()
    kernel = queue_kernel(provider, store)
    async with charging(kernel, provider) as running:
        assert await kernel.submit("t", "3", "balance") == Queued("t", "3", 1)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    await kernel.drained()
    assert await inbox(store, "t") == []
    other = queue_kernel(provider, store)
    next_turn = await other.turn("t", "4", "balance")
    assert (next_turn.replayed, next_turn.checkpoint_version) == (False, 3)
    third = await other.submit("t", "3", "balance")
    assert isinstance(third, TurnResult)
    assert (third.replayed, third.checkpoint_version) == (True, 2)  # it ran first


async def test_two_workers_draining_one_inbox_run_each_message_once(store: Durability) -> None:
    provider = FakeProvider()
    kernel = queue_kernel(provider, store)
    async with charging(kernel, provider) as running:
        for n in range(3, 7):
            assert await kernel.submit("t", str(n), f"balance {n}") == Queued("t", str(n), n - 2)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    # The accepting kernel's background drain races two other workers' drains.
    one, two = queue_kernel(provider, store), queue_kernel(provider, store)
    ran = await asyncio.gather(one.drain("t"), two.drain("t"), kernel.drained())
    fresh = [r.turn_id for results in ran if results for r in results if not r.replayed]
    assert len(fresh) == len(set(fresh))
    events = await read_all_events(store, thread_id="t")
    assert [committed(events, str(n)) for n in range(3, 7)] == [1, 1, 1, 1]
    versions = {e.turn_id: e.payload["version"] for e in events if e.type == "turn.committed"}
    assert [versions[str(n)] for n in range(3, 7)] == [2, 3, 4, 5]
    assert await inbox(store, "t") == []


# -- real processes, killed ----------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path)


async def spawn(config: dict[str, Any]) -> prefork.Forked:
    return await prefork.spawn(WORKER, json.dumps(config))


async def first_line(worker: prefork.Forked) -> Any:
    line = await asyncio.wait_for(worker.stdout.readline(), 60)
    assert line, (await worker.communicate())[1].decode()
    return json.loads(line)


@pytest.mark.slow
async def test_a_message_queued_behind_a_killed_holder_runs_exactly_once(
    sql_store: Store, tmp_path: Path
) -> None:
    """The holder of the thread (another process, inside its provider call) is killed
    after a message was queued behind it: the message runs once the lock is free,
    once, before the thread's next turn, and a redelivery replays it."""
    ledger = str(tmp_path / "provider.ledger")
    async with sql_store.durability() as durability:
        agent = dataclasses.replace(proving_agent(LedgerProvider(path=ledger)), on_busy="queue")
        kernel = Kernel(agent, durability)
        await kernel.turn("t", "1", "charge pi_1 500")
        worker = await spawn(
            {
                "store": sql_store.config(),
                "ledger": ledger,
                "on_busy": "queue",
                "turns": [{"thread_id": "t", "turn_id": "2", "message": "yes"}],
                "fault": {"point": faults.IN_PROVIDER_AFTER_WRITE, "action": "hold"},
            }
        )
        try:
            assert await first_line(worker) == {"held": faults.IN_PROVIDER_AFTER_WRITE}
            assert await kernel.submit("t", "3", "balance") == Queued("t", "3", 1)
        finally:
            worker.kill()
            await worker.communicate()
        # The accepting process waited for the lock; the holder's death freed it.
        await kernel.drained()
        assert await inbox(durability, "t") == []
        next_turn = await kernel.turn("t", "4", "balance")
        assert (next_turn.replayed, next_turn.checkpoint_version) == (False, 3)
        third = await kernel.submit("t", "3", "balance")
        assert isinstance(third, TurnResult)
        assert (third.replayed, third.checkpoint_version) == (True, 2)
        assert await kernel.drain("t") == []
        events = await read_all_events(durability, thread_id="t")
        assert [committed(events, t) for t in ("2", "3", "4")] == [0, 1, 1]
        assert await inbox(durability, "t") == []


@pytest.mark.slow
async def test_a_message_whose_accepting_process_is_killed_runs_once_with_the_next_turn(
    sql_store: Store, tmp_path: Path
) -> None:
    """Another process accepts a message into the inbox of a busy thread, answers its
    position and is killed before it could drain it: the message survives, and the
    thread's next turn runs it first, once."""
    async with sql_store.durability() as durability:
        provider = FakeProvider()
        kernel = queue_kernel(provider, durability)
        async with charging(kernel, provider) as running:
            worker = await spawn(
                {
                    "store": sql_store.config(),
                    "ledger": str(tmp_path / "unused.ledger"),
                    "on_busy": "queue",
                    "hold": True,
                    "turns": [{"thread_id": "t", "turn_id": "3", "message": "balance"}],
                }
            )
            try:
                assert await first_line(worker) == {"turn_id": "3", "queued": 1}
            finally:
                worker.kill()
                await worker.communicate()
            assert not running.done()
        assert (await running).checkpoint_version == 2
        await kernel.drained()
        assert await inbox(durability, "t") == ["3"]
        next_turn = await kernel.turn("t", "4", "balance")
        assert (next_turn.replayed, next_turn.checkpoint_version) == (False, 4)
        assert await inbox(durability, "t") == []
        events = await read_all_events(durability, thread_id="t")
        assert committed(events, "3") == 1
        third = await kernel.submit("t", "3", "balance")
        assert isinstance(third, TurnResult)
        assert (third.replayed, third.checkpoint_version) == (True, 3)


# -- on_busy="interrupt" -------------------------------------------------------------------------


class HeldInterpreter:
    """For "look twice": asks for two balance look-ups once ``release`` is set;
    ``entered`` says it was asked. Any other message asks for one look-up at once."""

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


@pytest.mark.parametrize("same_kernel", [True, False])
async def test_interrupt_stops_the_running_turn_and_runs_the_new_message_next(
    store: Durability, same_kernel: bool
) -> None:
    interpreter = HeldInterpreter()
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=interpreter, on_busy="interrupt"
    )
    kernel = Kernel(agent, store, cancel_check_after=0.0)
    await kernel.turn("t", "1", "balance")
    sender = kernel if same_kernel else Kernel(agent, store)
    running = asyncio.create_task(kernel.turn("t", "2", "look twice"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    ack = await sender.submit("t", "3", "balance please")
    assert ack == Queued("t", "3", 1)
    interpreter.release.set()
    interrupted = await asyncio.wait_for(running, HELD)
    assert interrupted.steps == ()  # stopped before its first step
    assert interrupted.reply.endswith("Interrupted by a new message.")
    assert interrupted.checkpoint_version == 2
    await sender.drained()
    third = await sender.submit("t", "3", "balance please")
    assert isinstance(third, TurnResult)
    # The new message ran next, in full: the interrupt did not stop it.
    assert (third.replayed, third.checkpoint_version) == (True, 3)
    assert [s.value for s in third.steps] == [{"due": 7}]
    events = await read_all_events(store, thread_id="t")
    assert len(of_turn(events, "2", "turn.cancelled")) == 1
    assert of_turn(events, "3", "turn.cancelled") == []


async def test_a_message_of_another_tenant_queued_on_a_thread_does_not_block_it(
    store: Durability,
) -> None:
    """A queued message whose turn can never run (another tenant's, on this thread) is
    dropped by the drain, and the messages behind it run."""
    provider = FakeProvider()
    kernel = queue_kernel(provider, store)
    await kernel.turn("t", "1", "charge pi_1 500", tenant_id="acme")
    provider.behaviour["pi_1"] = "block"
    running = asyncio.create_task(kernel.turn("t", "2", "yes", tenant_id="acme"))
    await asyncio.wait_for(provider.entered.wait(), HELD)
    assert await kernel.submit("t", "3", "balance", tenant_id="other") == Queued("t", "3", 1)
    assert await kernel.submit("t", "4", "balance", tenant_id="acme") == Queued("t", "4", 2)
    provider.released.set()
    await asyncio.wait_for(running, HELD)
    await kernel.drained()
    assert await inbox(store, "t") == []
    events = await read_all_events(store, thread_id="t")
    assert (committed(events, "3"), committed(events, "4")) == (0, 1)


async def test_an_interrupt_finding_only_a_queued_entry_stops_neither_message(
    store: Durability,
) -> None:
    """Nothing runs, but an entry waits: the new message's interrupt names its sender.
    The queued turn it found starts anyway (a queued turn reads only cancels at its
    start), and the new message is never stopped by its own request."""
    from intention_kernel._effects import utcnow
    from intention_kernel._inbox import encode_request
    from intention_kernel._runtime import TurnRequest
    from intention_kernel.durability._contract.records import InboxEntry

    agent = dataclasses.replace(billing_agent(FakeProvider()), on_busy="interrupt")
    kernel = Kernel(agent, store, cancel_check_after=0.0)
    await kernel.turn("t", "1", "balance")
    assert isinstance(store, RecordedDurability)
    request = encode_request(TurnRequest("balance", None))
    await store.enqueue(InboxEntry("t", "2", None, None, request, utcnow()))
    third = await kernel.turn("t", "3", "balance")
    assert (third.replayed, third.checkpoint_version) == (False, 3)
    assert await inbox(store, "t") == []
    events = await read_all_events(store, thread_id="t")
    assert (committed(events, "2"), committed(events, "3")) == (1, 1)
    assert of_turn(events, "3", "turn.cancelled") == []


async def test_another_tenants_interrupt_stops_no_turn_on_a_thread_nobody_owns(
    store: Durability,
) -> None:
    """The thread's first turn runs: nobody owns it yet. Another tenant's message is
    queued, and its interrupt stops only turns of its own tenant: none here."""
    interpreter = HeldInterpreter()
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=interpreter, on_busy="interrupt"
    )
    kernel = Kernel(agent, store, cancel_check_after=0.0)
    running = asyncio.create_task(kernel.turn("t", "1", "look twice", tenant_id="acme"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    ack = await kernel.submit("t", "2", "balance", tenant_id="other")
    assert ack == Queued("t", "2", 1)
    interpreter.release.set()
    first = await asyncio.wait_for(running, HELD)
    assert len(first.steps) == 2  # not interrupted
    assert not first.reply.endswith("Interrupted by a new message.")
    await kernel.drained()
    assert await inbox(store, "t") == []  # the foreign message can never run here
    events = await read_all_events(store, thread_id="t")
    assert of_turn(events, "1", "turn.cancelled") == []
    assert committed(events, "2") == 0


# -- a cancel of a turn that runs answers "requested" ---------------------------------------------


@pytest.mark.parametrize("same_kernel", [True, False])
async def test_a_cancel_of_a_queued_turn_running_from_the_inbox_is_requested(
    store: Durability, same_kernel: bool
) -> None:
    """Its entry is removed only after its commit: the cancel must not answer
    "dequeued", as the turn runs on and commits what it did as cancelled."""
    from intention_kernel._effects import utcnow
    from intention_kernel._inbox import encode_request
    from intention_kernel._runtime import TurnRequest
    from intention_kernel.durability._contract.records import InboxEntry

    interpreter = HeldInterpreter()
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=interpreter, on_busy="queue"
    )
    kernel = Kernel(agent, store, cancel_check_after=0.0)
    await kernel.turn("t", "1", "balance")
    assert isinstance(store, RecordedDurability)
    request = encode_request(TurnRequest("look twice", None))
    await store.enqueue(InboxEntry("t", "2", None, None, request, utcnow()))
    draining = asyncio.create_task(kernel.drain("t"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    canceller = kernel if same_kernel else Kernel(agent, store)
    answer = await canceller.cancel("t", "2", reason="pressed stop")
    assert answer.status == "requested"
    interpreter.release.set()
    [result] = await asyncio.wait_for(draining, HELD)
    assert "pressed stop" in result.reply
    assert (result.steps, result.checkpoint_version) == ((), 2)
    assert await inbox(store, "t") == []
    events = await read_all_events(store, thread_id="t")
    assert (committed(events, "2"), len(of_turn(events, "2", "turn.cancelled"))) == (1, 1)


@pytest.mark.parametrize("same_kernel", [True, False])
async def test_a_cancel_of_a_turn_whose_redelivery_is_queued_while_it_runs_is_requested(
    store: Durability, same_kernel: bool
) -> None:
    """A delivery of turn 2 runs; its redelivery, finding the thread busy, is queued.
    A cancel answers "requested", through the running kernel or another one on the
    same store: the running delivery stops and commits."""
    interpreter = HeldInterpreter()
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=interpreter, on_busy="queue"
    )
    kernel = Kernel(agent, store, cancel_check_after=0.0)
    await kernel.turn("t", "1", "balance")
    running = asyncio.create_task(kernel.turn("t", "2", "look twice"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    assert await kernel.submit("t", "2", "look twice") == Queued("t", "2", 1)
    canceller = kernel if same_kernel else Kernel(agent, store)
    answer = await canceller.cancel("t", "2", reason="pressed stop")
    assert answer.status == "requested"
    interpreter.release.set()
    result = await asyncio.wait_for(running, HELD)
    assert "pressed stop" in result.reply
    assert (result.steps, result.checkpoint_version) == ((), 2)
    await kernel.drained()
    assert await inbox(store, "t") == []
    events = await read_all_events(store, thread_id="t")
    assert committed(events, "2") == 1


async def test_a_queued_turn_cancelled_after_its_process_died_running_commits_cancelled(
    store: Durability,
) -> None:
    """A process started the queued turn (its entry is marked), then died. The cancel
    answers "requested", and the turn's next run commits what it did as cancelled."""
    from intention_kernel._effects import utcnow
    from intention_kernel._inbox import encode_request
    from intention_kernel._runtime import TurnRequest
    from intention_kernel.durability._contract.records import InboxEntry

    agent = dataclasses.replace(billing_agent(FakeProvider()), on_busy="queue")
    kernel = Kernel(agent, store, cancel_check_after=0.0)
    await kernel.turn("t", "1", "balance")
    assert isinstance(store, RecordedDurability)
    request = encode_request(TurnRequest("balance", None))
    await store.enqueue(InboxEntry("t", "2", None, None, request, utcnow()))
    assert await store.start_queued("t", "2", 1) == (None, None)  # the dead process's start
    answer = await Kernel(agent, store).cancel("t", "2", reason="pressed stop")
    assert answer.status == "requested"
    [result] = await kernel.drain("t")
    assert "pressed stop" in result.reply
    assert (result.steps, result.checkpoint_version) == ((), 2)
    assert await inbox(store, "t") == []


@pytest.mark.slow
async def test_a_cancel_of_a_turn_another_process_runs_while_its_redelivery_waits_is_requested(
    sql_store: Store, tmp_path: Path
) -> None:
    """Process A runs turn 2, delivered to it directly, held inside its provider call.
    Its redelivery here finds the thread busy and is queued. Process C, which runs
    neither, cancels turn 2: it answers "requested", not "dequeued", and the queued
    copy stays. Once A is killed, the copy reads the stop as it starts: turn 2 ends
    cancelled, and nothing of it commits."""
    ledger = str(tmp_path / "provider.ledger")
    async with sql_store.durability() as durability:
        agent = dataclasses.replace(proving_agent(LedgerProvider(path=ledger)), on_busy="queue")
        kernel = Kernel(agent, durability)
        await kernel.turn("t", "1", "charge pi_1 500")
        runner = await spawn(
            {
                "store": sql_store.config(),
                "ledger": ledger,
                "on_busy": "queue",
                "turns": [{"thread_id": "t", "turn_id": "2", "message": "yes"}],
                "fault": {"point": faults.IN_PROVIDER_AFTER_WRITE, "action": "hold"},
                # The hold stops A's loop, and its lease's renewal with it: a lease
                # that outlives starting process C, even on a starved CI machine.
                "lease_expiry": 30.0,
            }
        )
        try:
            assert await first_line(runner) == {"held": faults.IN_PROVIDER_AFTER_WRITE}
            assert await kernel.submit("t", "2", "yes") == Queued("t", "2", 1)
            cancel = {"thread_id": "t", "turn_id": "2", "reason": "pressed stop"}
            canceller = await spawn(
                {"store": sql_store.config(), "ledger": ledger, "cancel": cancel}
            )
            assert await first_line(canceller) == {"cancelled": "requested"}
            assert (await canceller.wait()) == 0
            assert await inbox(durability, "t") == ["2"]  # it runs on: its copy stays
        finally:
            runner.kill()
            await runner.communicate()
        # This kernel drains its queued copy once A's lease lapses.
        await asyncio.wait_for(kernel.drained(), 120)
        assert await inbox(durability, "t") == []
        events = await read_all_events(durability, thread_id="t")
        assert committed(events, "2") == 0


@pytest.mark.slow
async def test_a_cancel_from_another_process_of_a_queued_turn_it_runs_is_requested(
    sql_store: Store, tmp_path: Path
) -> None:
    """Another process runs turn 2 from the inbox and is held inside its provider call:
    a cancel here answers "requested", not "dequeued". Once that process is killed,
    the next drain runs turn 2 again, and it commits as cancelled."""
    from intention_kernel._effects import utcnow
    from intention_kernel._inbox import encode_request
    from intention_kernel._runtime import TurnRequest
    from intention_kernel.durability._contract.records import InboxEntry

    ledger = str(tmp_path / "provider.ledger")
    async with sql_store.durability() as durability:
        agent = dataclasses.replace(proving_agent(LedgerProvider(path=ledger)), on_busy="queue")
        kernel = Kernel(agent, durability)
        await kernel.turn("t", "1", "charge pi_1 500")
        assert isinstance(durability, RecordedDurability)
        request = encode_request(TurnRequest("yes", None))
        await durability.enqueue(InboxEntry("t", "2", None, None, request, utcnow()))
        worker = await spawn(
            {
                "store": sql_store.config(),
                "ledger": ledger,
                "on_busy": "queue",
                "turns": [{"thread_id": "t", "turn_id": "2", "message": "yes"}],
                "fault": {"point": faults.IN_PROVIDER_AFTER_WRITE, "action": "hold"},
            }
        )
        try:
            assert await first_line(worker) == {"held": faults.IN_PROVIDER_AFTER_WRITE}
            answer = await kernel.cancel("t", "2", reason="pressed stop")
            assert answer.status == "requested"
            assert await inbox(durability, "t") == ["2"]  # it runs on: its entry stays
        finally:
            worker.kill()
            await worker.communicate()
        [result] = await kernel.drain("t")
        assert "pressed stop" in result.reply
        assert await inbox(durability, "t") == []
        events = await read_all_events(durability, thread_id="t")
        assert (committed(events, "2"), len(of_turn(events, "2", "turn.cancelled"))) == (1, 1)
