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
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import (
    Intent,
    Interpretation,
    InterpretationRequest,
    Kernel,
    Queued,
    TurnResult,
)
from intention_kernel.durability import Durability
from intention_kernel.interpretation import Round
from intention_kernel.interpreters._chat import round_messages
from intention_kernel.testing import faults
from intention_kernel.testing.agents import FakeProvider, billing_agent
from proving_support import Store, make_sql_store, read_all_events
from steer_worker import SteeredModel

HELD = 10.0


class SteeredRounds:
    """Round 1 of ``paint it`` is held until ``release``, then looks up a balance;
    round 2 replies with what the person said meanwhile (``seen``)."""

    multi_round = True

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.seen: list[tuple[str, ...]] = []

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
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
    interpreter = SteeredRounds()
    kernel = steering(store, interpreter)
    failing = {"on": True}
    real = interpreter.interpret

    async def fails_in_round_two(request: InterpretationRequest) -> Interpretation:
        if request.rounds and failing["on"]:
            failing["on"] = False
            raise RuntimeError("the model went away")
        return await real(request)

    interpreter.interpret = fails_in_round_two  # type: ignore[method-assign]
    running = asyncio.create_task(kernel.turn("t", "1", "paint it"))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    assert await kernel.submit("t", "2", "make it blue") == Queued("t", "2", 1)
    interpreter.release.set()
    with pytest.raises(Exception, match="the model went away"):
        await asyncio.wait_for(running, HELD)
    # Handed to turn 1, which did not commit: the steer waits for its redelivery.
    assert await kernel.submit("t", "2", "make it blue") == Queued("t", "2", 0, "1")
    result = await asyncio.wait_for(kernel.turn("t", "1", "paint it"), HELD)
    # The redelivery's round 2 carried exactly the steer its first delivery took.
    assert result.reply == "Painted, hearing: make it blue"
    second = await kernel.submit("t", "2", "make it blue")
    assert isinstance(second, TurnResult) and second.reply == result.reply
    assert interpreter.seen == [("make it blue",)]  # the model's round 2, asked once


def test_a_chat_model_reads_the_steers_after_the_rounds_outcomes() -> None:
    response: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
    [assistant, person] = round_messages(
        [Round(Interpretation(response=response), steered=("make it blue",))]
    )
    assert assistant == response
    assert person == {"role": "user", "content": "make it blue"}


WORKER = Path(__file__).with_name("steer_worker.py")


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
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            json.dumps(config),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            for _ in range(3000):
                if Path(files["entered"]).exists():  # noqa: ASYNC240
                    break
                await asyncio.sleep(0.01)
            # The worker holds the thread: the message is committed as a steer.
            assert await kernel.submit("t", "2", "make it blue") == Queued("t", "2", 1)
            Path(files["release"]).touch()  # noqa: ASYNC240
            _, err = await asyncio.wait_for(worker.communicate(), 60)
        finally:
            if worker.returncode is None:
                worker.kill()
                await worker.communicate()
        assert worker.returncode == faults.EXIT_STATUS, err.decode()
        first = {line["pid"] for line in lines(Path(files["asks"]))}
        # Taken by turn 1 before the process died: never a turn of its own.
        assert await durability.taker("t", "2") == "1"  # type: ignore[attr-defined]
        assert await durability.read_inbox("t") == []  # type: ignore[attr-defined]

        redelivery = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            json.dumps(dict(config, die=None)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
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
