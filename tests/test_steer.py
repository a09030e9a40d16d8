"""Steering (issue 36): with ``Agent(on_busy="steer")`` a message that finds its thread
busy is committed to the inbox, then handed to the running turn at its next round
boundary. The boundary's journal entry records it, the model's next request carries
it, and its turn ID replays the running turn's result. On every store.

The running turn is really running, its first round held on an event, when the
messages come."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host_support import asgi_client
from inbox_support import STEER_WORKER, run_worker, wait_for_file, worker_process
from intention_kernel import (
    Intent,
    Interpretation,
    InterpretationRequest,
    Kernel,
    Queued,
    SteerOrphanedError,
    ThreadBusyError,
    TurnResult,
    TurnScope,
)
from intention_kernel._interpretation import Round
from intention_kernel.durability import Durability
from intention_kernel.host import create_app
from intention_kernel.interpreters._chat import round_messages
from intention_kernel.testing import InMemoryDurability, faults
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import Store, make_sql_store, read_all_events
from steer_worker import SteeredModel

HELD = 10.0


class SteeredRounds:
    """Round 1 of ``paint it`` is held until ``release``, then looks up a balance;
    round 2 replies with what the person said meanwhile (``seen``).

    ``fail_round_two``: the first ask of a round 2 fails, as a model gone away.
    ``asked`` lists the round of every ask."""

    multi_round = True

    def __init__(self, *, fail_round_two: bool = False) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.seen: list[tuple[str, ...]] = []
        self.asked: list[int] = []
        self.fail_round_two = fail_round_two

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        self.asked.append(len(request.rounds) + 1)
        if request.rounds and self.fail_round_two:
            self.fail_round_two = False
            raise RuntimeError("the model went away")
        if not request.rounds:
            if request.message == "paint it":
                self.entered.set()
                await self.release.wait()
                return Interpretation(intents=[Intent("billing.balance", {"due": 1})])
            return Interpretation(reply=f"on its own: {request.message}")
        steered = request.rounds[-1].steered
        self.seen.append(steered)
        return Interpretation(reply="Painted, hearing: " + "; ".join(steered))


def steering(store: Durability, interpreter: Any) -> Kernel:
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=interpreter, on_busy="steer"
    )
    return Kernel(agent, store)


def of_turn(events: list[Any], turn_id: str, type: str) -> list[Any]:
    return [e for e in events if e.turn_id == turn_id and e.type == type]


async def until_queued(store: Durability, thread_id: str, count: int) -> None:
    for _ in range(500):
        if len(await store.read_inbox(thread_id)) >= count:  # type: ignore[attr-defined]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the messages never reached the inbox")


async def test_a_steer_is_handed_to_the_running_turn_at_its_next_round(store: Durability) -> None:
    interpreter = SteeredRounds()
    kernel = steering(store, interpreter)
    running = asyncio.create_task(kernel.turn("t", "1", "paint it"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    assert await kernel.submit("t", "2", "make it blue") == Queued("t", "2", 1)
    waiting = asyncio.create_task(kernel.turn("t", "3", "and big"))
    await until_queued(store, "t", 2)
    interpreter.release.set()
    result = await asyncio.wait_for(running, HELD)
    # Round 2's request carried both, in the order of acceptance, after round 1.
    assert interpreter.seen == [("make it blue", "and big")]
    assert result.reply == "Painted, hearing: make it blue; and big"
    assert result.checkpoint_version == 1
    # Each steer's turn ID answers with the running turn's result.
    third = await asyncio.wait_for(waiting, HELD)
    assert (third.turn_id, third.reply, third.replayed) == ("1", result.reply, True)
    second = await kernel.submit("t", "2", "make it blue")
    assert isinstance(second, TurnResult)
    assert (second.turn_id, second.reply, second.replayed) == ("1", result.reply, True)
    await kernel.drained()
    events = await read_all_events(store, thread_id="t")
    steered = of_turn(events, "1", "turn.steered")
    assert [e.payload["turn_id"] for e in steered] == ["2", "3"]
    assert of_turn(events, "2", "turn.committed") == []  # never a turn of its own
    assert of_turn(events, "3", "turn.committed") == []
    assert await store.read_inbox("t") == []  # type: ignore[attr-defined]
    checkpoint = await store.load_checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 1
    # The thread goes on; a steer is not run again.
    later = await kernel.turn("t", "4", "hello")
    assert (later.reply, later.checkpoint_version) == ("on its own: hello", 2)


async def test_a_steer_taken_by_a_turn_that_failed_before_recording_it_runs_alone(
    store: Durability,
) -> None:
    """Turn 1 takes the steer at its round boundary and fails before its journal
    records it; nobody delivers turn 1 again. The steer's own delivery, holding the
    thread's lock, finds its taker not running, not committed, and its journal
    without the steer: the message goes back to the inbox and runs as its own turn,
    once. A late redelivery of turn 1 takes nothing, and never hears it."""
    interpreter = SteeredRounds()
    kernel = steering(store, interpreter)
    take = store.take_steers  # type: ignore[attr-defined]
    failing = {"on": True}

    async def take_then_fail(thread_id: str, turn_id: str) -> Any:
        taken = await take(thread_id, turn_id)
        if taken and failing["on"]:
            failing["on"] = False
            raise RuntimeError("the worker went away")
        return taken

    store.take_steers = take_then_fail  # type: ignore[attr-defined]
    running = asyncio.create_task(kernel.turn("t", "1", "paint it"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    assert await kernel.submit("t", "2", "make it blue") == Queued("t", "2", 1)
    interpreter.release.set()
    with pytest.raises(Exception, match="the worker went away"):
        await asyncio.wait_for(running, HELD)
    await kernel.drained()
    assert await store.taker("t", "2") == "1"  # type: ignore[attr-defined]
    assert await store.read_inbox("t") == []  # type: ignore[attr-defined]

    own = await asyncio.wait_for(kernel.turn("t", "2", "make it blue"), HELD)
    assert (own.turn_id, own.replayed, own.reply) == ("2", False, "on its own: make it blue")
    assert own.checkpoint_version == 1
    assert await store.taker("t", "2") is None  # type: ignore[attr-defined]
    again = await kernel.submit("t", "2", "make it blue")
    assert isinstance(again, TurnResult) and (again.turn_id, again.replayed) == ("2", True)
    late = await asyncio.wait_for(kernel.turn("t", "1", "paint it"), HELD)
    assert (late.reply, late.checkpoint_version) == ("Painted, hearing: ", 2)
    assert interpreter.seen == [()]  # round 2 was asked once, without the steer
    events = await read_all_events(store, thread_id="t")
    assert [len(of_turn(events, t, "turn.committed")) for t in ("1", "2")] == [1, 1]
    assert of_turn(events, "1", "turn.steered") == []
    assert await store.read_inbox("t") == []  # type: ignore[attr-defined]


async def test_a_steer_that_no_round_took_runs_as_its_own_turn(store: Durability) -> None:
    """The running turn had no round left: the message runs after it, as if queued."""
    interpreter = SteeredRounds()
    kernel = steering(store, interpreter)
    await kernel.turn("t", "0", "hello")
    interpreter.entered.clear()
    agent = dataclasses.replace(kernel.agent, max_rounds=1)  # one round: no boundary
    one_round = Kernel(agent, store)
    running = asyncio.create_task(one_round.turn("t", "1", "paint it"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    assert await one_round.submit("t", "2", "make it blue") == Queued("t", "2", 1)
    interpreter.release.set()
    await asyncio.wait_for(running, HELD)
    await one_round.drained()
    own = await one_round.submit("t", "2", "make it blue")
    assert isinstance(own, TurnResult)
    assert (own.turn_id, own.reply, own.checkpoint_version) == (
        "2",
        "on its own: make it blue",
        3,
    )
    assert interpreter.seen == []


async def test_a_redelivered_turn_hands_over_the_same_steers_at_the_same_round(
    store: Durability,
) -> None:
    """The first delivery fails after the boundary's journal entry; the redelivery
    takes it from there."""
    interpreter = SteeredRounds(fail_round_two=True)
    kernel = steering(store, interpreter)
    running = asyncio.create_task(kernel.turn("t", "1", "paint it"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    assert await kernel.submit("t", "2", "make it blue") == Queued("t", "2", 1)
    interpreter.release.set()
    with pytest.raises(Exception, match="the model went away"):
        await asyncio.wait_for(running, HELD)
    await kernel.drained()  # the drain found the steer taken: it ran nothing
    # Handed to turn 1, which recorded it and did not commit: the steer waits for
    # its redelivery, even with the thread free (its model may have acted on it).
    # Turn 1 was delivered directly, so nothing here can deliver it: both say so.
    for deliver in (kernel.submit, kernel.turn):
        with pytest.raises(SteerOrphanedError, match="deliver '1' again") as orphaned:
            await deliver("t", "2", "make it blue")
        assert (orphaned.value.turn_id, orphaned.value.taken_by) == ("2", "1")
        assert isinstance(orphaned.value, ThreadBusyError)
    result = await asyncio.wait_for(kernel.turn("t", "1", "paint it"), HELD)
    # The redelivery's round 2 carried exactly the steer its first delivery took.
    assert result.reply == "Painted, hearing: make it blue"
    second = await kernel.submit("t", "2", "make it blue")
    assert isinstance(second, TurnResult) and second.reply == result.reply
    assert interpreter.seen == [("make it blue",)]  # the model's round 2, asked once


class Held(Exception):
    """Ends a hold of the thread's lock without a commit."""


@pytest.mark.parametrize("deliver", ["turn", "submit"])
async def test_a_steer_recorded_by_a_failed_queued_turn_runs_that_turn_to_its_end(
    store: Durability, deliver: str
) -> None:
    """Turn 1 was queued; its drain takes steer 2, journals it, and fails in round 2.
    Turn 1's inbox entry keeps its request. So the steer's own delivery, finding
    its taker not running, drains the inbox up to turn 1. Turn 1 goes on from its
    journal, and the steer's turn ID answers with its result. Round 1 is not asked
    again, and round 2 hears the steer once more. ``submit`` runs it too: the
    thread is free."""
    interpreter = SteeredRounds(fail_round_two=True)
    kernel = steering(store, interpreter)
    locked, release = asyncio.Event(), asyncio.Event()

    async def hold(tx: Any) -> Any:  # another worker's turn holds the thread
        locked.set()
        await release.wait()
        raise Held

    holding = asyncio.create_task(store.with_turn(TurnScope("t", "0", None, None), hold))
    await asyncio.wait_for(locked.wait(), HELD)
    assert await kernel.submit("t", "1", "paint it") == Queued("t", "1", 1)
    release.set()
    with pytest.raises(Held):
        await holding
    await asyncio.wait_for(interpreter.entered.wait(), HELD)  # the drain runs turn 1
    assert await kernel.submit("t", "2", "make it blue") == Queued("t", "2", 2)
    interpreter.release.set()
    await asyncio.wait_for(kernel.drained(), HELD)  # turn 1 failed in round 2
    assert await store.taker("t", "2") == "1"  # type: ignore[attr-defined]
    assert [e.turn_id for e in await store.read_inbox("t")] == ["1"]  # type: ignore[attr-defined]

    steer = await asyncio.wait_for(getattr(kernel, deliver)("t", "2", "make it blue"), HELD)
    assert isinstance(steer, TurnResult) and (steer.turn_id, steer.replayed) == ("1", True)
    assert steer.reply == "Painted, hearing: make it blue"
    assert interpreter.asked == [1, 2, 2]  # round 1 from the journal; round 2 again
    assert interpreter.seen == [("make it blue",)]
    events = await read_all_events(store, thread_id="t")
    assert [len(of_turn(events, t, "turn.committed")) for t in ("1", "2")] == [1, 0]
    assert len(of_turn(events, "1", "turn.steered")) == 1
    assert await store.read_inbox("t") == []  # type: ignore[attr-defined]
    again = await kernel.submit("t", "2", "make it blue")
    assert isinstance(again, TurnResult) and again.reply == steer.reply


async def test_the_host_answers_an_orphaned_steer_with_409_naming_its_taker() -> None:
    """Turn 1, delivered directly, records steer 2 and fails in round 2. The steer's
    delivery through the HTTP host gets 409 ``steer-orphaned``, whose ``taken_by``
    names turn 1. The taker's redelivery then answers the steer too."""
    interpreter = SteeredRounds(fail_round_two=True)
    kernel = steering(InMemoryDurability(), interpreter)
    running = asyncio.create_task(kernel.turn("t", "1", "paint it"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    assert await kernel.submit("t", "2", "make it blue") == Queued("t", "2", 1)
    interpreter.release.set()
    with pytest.raises(Exception, match="the model went away"):
        await asyncio.wait_for(running, HELD)
    await kernel.drained()
    steer = {"turn_id": "2", "message": "make it blue"}
    async with asgi_client(create_app(kernel)) as client:
        orphaned = await client.post("/v1/threads/t/turns", json=steer)
        taker = await client.post(
            "/v1/threads/t/turns", json={"turn_id": "1", "message": "paint it"}
        )
        answered = await client.post("/v1/threads/t/turns", json=steer)
    assert orphaned.status_code == 409
    problem = orphaned.json()
    assert problem["type"] == "/problems/steer-orphaned"
    assert (problem["thread_id"], problem["turn_id"], problem["taken_by"]) == ("t", "2", "1")
    assert taker.status_code == 200 and answered.status_code == 200
    assert answered.json()["reply"] == taker.json()["reply"] == "Painted, hearing: make it blue"


def test_a_chat_model_reads_the_steers_after_the_rounds_outcomes() -> None:
    response: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
    [assistant, person] = round_messages(
        [Round(Interpretation(response=response), steered=("make it blue",))]
    )
    assert assistant == response
    assert person == {"role": "user", "content": "make it blue"}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("die", ["taken", "asked_round_2"])
async def test_a_process_killed_while_handing_a_steer_over_hands_the_same_on_redelivery(
    sql_store: Store, tmp_path: Path, die: str
) -> None:
    """The worker's turn takes the steer at its round boundary and dies (``os._exit``)
    before the journal entry, or after it with the model asked. The redelivery, in
    another process, hands the same steer to the same round; the steer's turn ID
    replays the result; nothing runs twice."""
    files = {name: str(tmp_path / name) for name in ("asks", "entered", "release")}
    turn = {"thread_id": "t", "turn_id": "1", "message": "paint it"}
    async with sql_store.durability() as durability:  # the schema, before any worker
        # This process may drain the redelivery queued behind the dead worker's lease:
        # its model writes down its asks as the workers' does.
        kernel = steering(durability, SteeredModel(files, None))
        config = {"store": sql_store.config(), "files": files, "turn": turn, "die": die}
        async with worker_process(STEER_WORKER, config) as worker:
            await wait_for_file(files["entered"])
            # The worker holds the thread: the message is committed as a steer.
            assert await kernel.submit("t", "2", "make it blue") == Queued("t", "2", 1)
            Path(files["release"]).touch()  # noqa: ASYNC240
            _, err = await asyncio.wait_for(worker.communicate(), 60)
        assert worker.returncode == faults.EXIT_STATUS, err.decode()
        first = {line["pid"] for line in lines(Path(files["asks"]))}
        # Taken by turn 1 before the process died: never a turn of its own.
        assert await durability.taker("t", "2") == "1"  # type: ignore[attr-defined]
        assert await durability.read_inbox("t") == []  # type: ignore[attr-defined]

        redelivery = await run_worker(STEER_WORKER, dict(config, die=None))
        out, err = await asyncio.wait_for(redelivery.communicate(), 60)
        assert redelivery.returncode == 0, err.decode()
        result = json.loads(out)
        assert result["reply"] == "Painted, hearing: make it blue"
        again = [line for line in lines(Path(files["asks"])) if line["pid"] not in first]
        # Round 1 comes from the journal; round 2 carries the steer, on every delivery.
        assert [line["round"] for line in again] == [2]
        asked_two = [line for line in lines(Path(files["asks"])) if line["round"] == 2]
        assert all(line["steered"] == ["make it blue"] for line in asked_two)
        steer = await kernel.submit("t", "2", "make it blue")
        assert isinstance(steer, TurnResult)
        assert (steer.turn_id, steer.reply, steer.replayed) == ("1", result["reply"], True)
        await kernel.drained()
        events = await read_all_events(durability, thread_id="t")
        assert of_turn(events, "2", "turn.committed") == []
        assert len(of_turn(events, "1", "turn.steered")) == 1
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.version == 1


async def test_release_steer_puts_back_only_a_steer_of_its_taker(store: Durability) -> None:
    """The store's half of the rule: the steer goes back untaken, in its place, only
    from the turn named as its taker. PostgreSQL does it only under the thread's
    lease, which no caller holds here: it writes nothing."""
    from intention_kernel._effects import utcnow
    from intention_kernel.durability._contract.records import InboxEntry

    recorder: Any = store
    entry = InboxEntry("t", "s1", None, None, '{"message": "blue"}', utcnow(), steer=True)
    assert await recorder.enqueue(entry) == 1
    assert [e.turn_id for e in await recorder.take_steers("t", "T1")] == ["s1"]
    assert await recorder.release_steer("t", "s1", "T2") is False  # not its taker
    released = await recorder.release_steer("t", "s1", "T1")
    if type(store).__name__ == "PostgresDurability":
        assert released is False  # fenced: no lease held
        assert await recorder.taker("t", "s1") == "T1"
        return
    assert released is True
    assert await recorder.taker("t", "s1") is None
    assert [e.turn_id for e in await recorder.read_inbox("t")] == ["s1"]
    assert await recorder.release_steer("t", "s1", "T1") is False  # nothing taken now
