"""Steering (issue 36): with ``Agent(on_busy="steer")`` a message that finds its thread
busy is committed to the inbox, then handed to the running turn at its next round
boundary. The boundary's journal entry records it, the model's next request carries
it, and its turn ID replays the running turn's result. On every store.

The running turn is really running, its first round held on an event, when the
messages come."""

from __future__ import annotations

import asyncio
import dataclasses
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
from intention_kernel.testing.agents import FakeProvider, billing_agent
from proving_support import read_all_events

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
    response = {"role": "assistant", "content": None, "tool_calls": []}
    [assistant, person] = round_messages(
        [Round(Interpretation(response=response), steered=("make it blue",))]
    )
    assert assistant == response
    assert person == {"role": "user", "content": "make it blue"}
