"""The inbox's events in a streamed turn (issue 36): ``queued``, ``steered``,
``interrupted`` and ``cancelled``, from ``Kernel.stream_turn`` and as server-sent
events of the HTTP host. On every store.

The running turn is really running, held on an event, when the other message or
the cancel comes."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from host_support import asgi_client
from intention_kernel import Kernel, Queued, TurnEvent
from intention_kernel.durability import Durability
from intention_kernel.host import Principal, create_app
from intention_kernel.testing._agents import FakeProvider, billing_agent
from test_host_streaming import parse_sse
from test_inbox import HeldInterpreter
from test_steer import SteeredRounds, until_queued

HELD = 10.0


async def collect(events: AsyncIterator[TurnEvent]) -> list[TurnEvent]:
    return [event async for event in events]


def kinds(events: list[TurnEvent]) -> list[str]:
    return [e.type for e in events]


async def test_a_streamed_turn_that_waits_in_the_inbox_says_queued_then_streams_its_run(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = Kernel(dataclasses.replace(billing_agent(provider), on_busy="queue"), store)
    await kernel.turn("t", "1", "charge pi_1 500")
    provider.behaviour["pi_1"] = "block"
    running = asyncio.create_task(kernel.turn("t", "2", "yes"))
    await asyncio.wait_for(provider.entered.wait(), HELD)
    events = kernel.stream_turn("t", "3", "balance")
    first = await asyncio.wait_for(anext(events), HELD)  # at once: the thread is busy
    assert (first.type, first.data) == ("queued", Queued("t", "3", 1).to_dict())
    assert first.id is not None  # a recorded stream's events each have an ID
    provider.released.set()
    await asyncio.wait_for(running, HELD)
    rest = await asyncio.wait_for(collect(events), HELD)
    # This kernel ran it from the inbox, streaming its steps as they finished.
    assert kinds(rest) == ["step", "result"]
    assert rest[-1].data["turn_id"] == "3" and rest[-1].data["checkpoint_version"] == 3


async def test_a_streamed_turn_says_which_message_steered_it_and_when(
    store: Durability,
) -> None:
    interpreter = SteeredRounds()
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=interpreter, on_busy="steer"
    )
    kernel = Kernel(agent, store)
    streamed = asyncio.create_task(collect(kernel.stream_turn("t", "1", "paint it")))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    assert await kernel.submit("t", "2", "make it blue") == Queued("t", "2", 1)
    interpreter.release.set()
    events = await asyncio.wait_for(streamed, HELD)
    assert kinds(events) == ["step", "steered", "result"]
    assert events[1].data == {"turn_id": "2", "round": 2}
    assert events[-1].data["reply"] == "Painted, hearing: make it blue"


async def test_a_streamed_turn_says_it_was_cancelled_as_it_stops(store: Durability) -> None:
    interpreter = HeldInterpreter()
    agent = dataclasses.replace(billing_agent(FakeProvider()), interpreter=interpreter)
    kernel = Kernel(agent, store, cancel_check_after=0.0)
    other = Kernel(agent, store)  # another process: only the store carries the request
    streamed = asyncio.create_task(collect(kernel.stream_turn("t", "1", "look twice")))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    assert (await other.cancel("t", "1", reason="stop")).status == "requested"
    interpreter.release.set()
    events = await asyncio.wait_for(streamed, HELD)
    assert kinds(events) == ["cancelled", "result"]
    assert events[0].data == {"reply": "Cancelled before it finished: stop"}
    assert events[-1].data["steps"] == []


async def test_a_streamed_turn_says_it_was_interrupted_as_it_stops(store: Durability) -> None:
    interpreter = HeldInterpreter()
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=interpreter, on_busy="interrupt"
    )
    kernel = Kernel(agent, store, cancel_check_after=0.0)
    await kernel.turn("t", "1", "balance")
    streamed = asyncio.create_task(collect(kernel.stream_turn("t", "2", "look twice")))
    await asyncio.wait_for(interpreter.entered.wait(), HELD)
    assert await Kernel(agent, store).submit("t", "3", "balance") == Queued("t", "3", 1)
    interpreter.release.set()
    events = await asyncio.wait_for(streamed, HELD)
    assert kinds(events) == ["interrupted", "result"]
    assert events[0].data == {"reply": "Interrupted by a new message."}
    # Turn 3 runs from the inbox in the background: the store closes after it.
    # Closed under a drain, a PostgreSQL session could keep the schema locked.
    for _ in range(500):
        if (await kernel.turn_status("t", "3")).status == "committed":
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("turn 3 never ran from the inbox")


async def test_the_host_sends_queued_then_the_run_as_server_sent_events(
    store: Durability,
) -> None:
    interpreter = SteeredRounds()
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=interpreter, on_busy="steer"
    )
    app = create_app(Kernel(agent, store), tokens={"tok": Principal("ana", "acme")})
    auth = {"authorization": "Bearer tok"}
    stream = {**auth, "accept": "text/event-stream"}
    async with asgi_client(app) as client:
        running = asyncio.create_task(
            client.post(
                "/v1/threads/t/turns", json={"turn_id": "1", "message": "paint it"}, headers=stream
            )
        )
        await asyncio.wait_for(interpreter.entered.wait(), HELD)
        steer = asyncio.create_task(
            client.post(
                "/v1/threads/t/turns",
                json={"turn_id": "2", "message": "make it blue"},
                headers=stream,
            )
        )
        await until_queued(store, "t", 1)
        interpreter.release.set()
        first = await asyncio.wait_for(running, HELD)
        second = await asyncio.wait_for(steer, HELD)
    events: list[tuple[str, Any]] = parse_sse(first.text)
    assert [name for name, _ in events] == ["step", "steered", "result"]
    assert events[1][1] == {"turn_id": "2", "round": 2}
    # The steer's own stream: queued, then the running turn's result.
    steered = parse_sse(second.text)
    assert [name for name, _ in steered] == ["queued", "result"]
    assert steered[0][1] == {"thread_id": "t", "turn_id": "2", "position": 1}
    assert steered[1][1]["turn_id"] == "1"
    assert steered[1][1]["reply"] == "Painted, hearing: make it blue"
