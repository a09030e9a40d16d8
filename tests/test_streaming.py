"""Streamed turns: ``Kernel.stream_turn`` yields a turn's events as they happen, and the
last one is the committed result.

On every store, the stream ends with ``result``. That equals what a redelivery of the
same turn returns (the committed result). Steps arrive in the order they ran across
rounds. A replay streams only its result. A consumer that leaves after the first event
leaves a committed turn behind. A turn's error raises from the iterator as
``kernel.turn`` raises it. ``OpenAIInterpreter`` streams the model's text through the
chat-completions stub.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import (
    Answer,
    Intent,
    Interpretation,
    InterpretationError,
    InterpretationRequest,
    InvalidRequestError,
    Kernel,
    TurnConflictError,
    TurnEvent,
)
from intention_kernel.durability import Durability
from intention_kernel.interpreters.openai import OpenAIInterpreter
from intention_kernel.testing import InMemoryDurability, ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent
from loop_support import GatedRounds
from openai_stub import OpenAIStub, completion

THREAD = "acct-1"


def kernel_for(store: Durability, interpreter: Any, provider: FakeProvider | None = None) -> Kernel:
    agent = dataclasses.replace(billing_agent(provider or FakeProvider()), interpreter=interpreter)
    return Kernel(agent, store)


def three_rounds() -> ScriptedInterpreter:
    """Round 1 reads the balance, round 2 reads it again doubled and proposes a charge
    (held for confirmation), round 3 writes the reply."""

    def script(request: InterpretationRequest) -> Interpretation:
        if not request.rounds:
            return Interpretation(intents=[Intent("billing.balance", {"due": 7})])
        if len(request.rounds) == 1:
            return Interpretation(
                intents=[
                    Intent("billing.balance", {"due": 14}),
                    Intent("payments.charge", {"payment_intent_id": "pi_1", "amount": 14}),
                ]
            )
        return Interpretation(reply="You owe 14; confirm the charge.")

    return ScriptedInterpreter(script, multi_round=True)


async def collect(stream: AsyncIterator[TurnEvent]) -> list[TurnEvent]:
    return [event async for event in stream]


async def test_the_streams_last_event_is_the_committed_result_of_the_delivery(
    store: Durability,
) -> None:
    kernel = kernel_for(store, three_rounds())
    events = await collect(kernel.stream_turn(THREAD, "d1", "pay what I owe"))

    assert events[-1].type == "result"
    assert [e.type for e in events].count("result") == 1
    redelivered = await kernel.turn(THREAD, "d1", "pay what I owe")
    assert redelivered.replayed
    assert {**events[-1].data, "replayed": True} == redelivered.to_dict()
    assert events[-1].data["replayed"] is False
    json.dumps([e.to_dict() for e in events])  # every event is JSON


async def test_steps_stream_in_the_order_they_ran_across_rounds(store: Durability) -> None:
    kernel = kernel_for(store, three_rounds())
    events = await collect(kernel.stream_turn(THREAD, "d1", "pay what I owe"))

    types = [e.type for e in events]
    assert types == ["step", "step", "interaction", "step", "result"]
    steps = [e.data for e in events if e.type == "step"]
    result = events[-1].data
    # Each step event is that step as the committed result serializes it, and its input.
    assert [{k: v for k, v in s.items() if k != "input"} for s in steps] == result["steps"]
    assert [s["input"] for s in steps] == [{"due": 7}, {"due": 14}, None]
    assert [(s["capability_id"], s["status"]) for s in steps] == [
        ("billing.balance", "completed"),
        ("billing.balance", "completed"),
        ("payments.charge", "awaiting_confirmation"),
    ]
    assert [s["value"] for s in steps[:2]] == [{"due": 7}, {"due": 14}]
    [interaction] = [e.data for e in events if e.type == "interaction"]
    assert interaction == result["interaction"]
    assert interaction["capability_id"] == "payments.charge"


async def test_a_request_superseded_later_in_the_turn_is_streamed_again_as_rejected(
    store: Durability,
) -> None:
    charges = [
        Intent("payments.charge", {"payment_intent_id": pi, "amount": 5}) for pi in ("pi_1", "pi_2")
    ]
    interpreter = ScriptedInterpreter({"charge both": Interpretation(intents=charges)})
    events = await collect(kernel_for(store, interpreter).stream_turn(THREAD, "d1", "charge both"))

    steps = [(e.data["step_id"], e.data["status"]) for e in events if e.type == "step"]
    assert steps == [
        ("d1#1", "awaiting_confirmation"),
        ("d1#1", "rejected"),
        ("d1#2", "awaiting_confirmation"),
    ]
    # The last report of each step is the committed one.
    latest = {e.data["step_id"]: without_input(e.data) for e in events if e.type == "step"}
    assert list(latest.values()) == events[-1].data["steps"]


def without_input(step: dict[str, Any]) -> dict[str, Any]:
    """A step event's data as the committed result holds the step (it has no input)."""
    assert "input" in step
    return {key: value for key, value in step.items() if key != "input"}


def mask(input: dict[str, Any]) -> dict[str, Any]:
    return {**input, "payment_intent_id": "pi_" + "*" * 4}


async def test_a_step_event_carries_the_input_that_ran_as_its_receipt_records_it(
    store: Durability,
) -> None:
    """A read's step carries its input; a held write's carries none; the accepted
    write's carries the edited input, redacted as its receipt stores it; a step the
    kernel refused before it ran carries none."""
    agent = billing_agent(FakeProvider())
    charge = next(c for c in agent.capabilities if c.id == "payments.charge")
    others = [c for c in agent.capabilities if c.id != "payments.charge"]
    agent = dataclasses.replace(
        agent, capabilities=[*others, dataclasses.replace(charge, redact=mask)]
    )
    kernel = Kernel(dataclasses.replace(agent, interpreter=three_rounds()), store)
    await collect(kernel.stream_turn(THREAD, "d1", "pay what I owe"))

    edited = {"payment_intent_id": "pi_1", "amount": 9}
    answer = Answer(decision="accept", input=edited, actor="ana")
    events = await collect(kernel.stream_turn(THREAD, "d2", answer=answer))
    [step] = [e.data for e in events if e.type == "step"]
    [receipt] = await store.list_receipts(thread_id=THREAD)
    assert (step["capability_id"], step["status"]) == ("payments.charge", "completed")
    assert step["input"] == receipt.input == {"payment_intent_id": "pi_****", "amount": 9}
    assert step["approved_input"] == edited  # the step's own field is not redacted

    unknown = Interpretation(intents=[Intent("billing.nothing", {"x": 1})])
    refused = kernel_for(store, ScriptedInterpreter({"nothing": unknown}))
    events = await collect(refused.stream_turn("acct-2", "d1", "nothing"))
    [step] = [e.data for e in events if e.type == "step"]
    assert (step["status"], step["input"]) == ("failed", None)


async def test_a_replayed_turn_streams_only_its_result(store: Durability) -> None:
    interpreter = three_rounds()
    kernel = kernel_for(store, interpreter)
    committed = await kernel.turn(THREAD, "d1", "pay what I owe")
    asked = len(interpreter.calls)

    events = await collect(kernel.stream_turn(THREAD, "d1", "pay what I owe"))

    assert [e.type for e in events] == ["result"]
    assert events[0].data == {**committed.to_dict(), "replayed": True}
    assert len(interpreter.calls) == asked


async def test_a_consumer_that_stops_after_the_first_event_leaves_a_committed_turn(
    store: Durability,
) -> None:
    interpreter = GatedRounds()
    kernel = kernel_for(store, interpreter)
    stream = kernel.stream_turn(THREAD, "d1", "what do I owe?")
    first = await anext(stream)
    assert first.type == "step"
    await stream.aclose()  # the consumer leaves while round 2 has not answered
    assert await store.load_checkpoint(THREAD) is None  # not committed yet
    interpreter.gate.set()

    # The retry waits for the thread, then finds the turn committed: nothing runs again.
    retried = await kernel.turn(THREAD, "d1", "what do I owe?")

    assert retried.replayed
    assert retried.reply == "You owe 5."
    assert interpreter.calls == 2
    checkpoint = await store.load_checkpoint(THREAD)
    assert checkpoint is not None and checkpoint.version == 1
    assert checkpoint.facts["balance"].value == 5


async def test_a_cancelled_consumer_does_not_abort_the_turn(store: Durability) -> None:
    interpreter = GatedRounds()
    kernel = kernel_for(store, interpreter)
    first_seen = asyncio.Event()

    async def consume() -> None:
        async for _ in kernel.stream_turn(THREAD, "d1", "what do I owe?"):
            first_seen.set()

    consumer = asyncio.create_task(consume())
    await first_seen.wait()
    consumer.cancel()  # what an ASGI server does to a disconnected client's response
    with pytest.raises(asyncio.CancelledError):
        await consumer
    interpreter.gate.set()

    retried = await kernel.turn(THREAD, "d1", "what do I owe?")
    assert retried.replayed and retried.reply == "You owe 5."
    assert interpreter.calls == 2


async def test_a_turns_error_raises_from_the_iterator_as_kernel_turn_raises_it(
    store: Durability,
) -> None:
    def script(request: InterpretationRequest) -> Interpretation:
        if not request.rounds:
            return Interpretation(intents=[Intent("billing.balance", {"due": 5})])
        raise RuntimeError("the model went away")

    kernel = kernel_for(store, ScriptedInterpreter(script, multi_round=True))
    seen: list[TurnEvent] = []

    async def consume() -> None:
        async for event in kernel.stream_turn(THREAD, "d1", "what do I owe?"):
            seen.append(event)

    with pytest.raises(InterpretationError, match="the model went away"):
        await consume()
    # The step streamed before the failure was provisional: nothing committed.
    assert [e.type for e in seen] == ["step"]
    assert await store.load_checkpoint(THREAD) is None

    await kernel_for(store, three_rounds()).turn(THREAD, "d0", "pay what I owe")
    with pytest.raises(TurnConflictError):
        await collect(kernel.stream_turn(THREAD, "d0", "something else"))
    with pytest.raises(InvalidRequestError):
        await collect(kernel.stream_turn(THREAD, "d2"))


# -- OpenAIInterpreter ---------------------------------------------------------------------


async def test_openai_interpreter_streams_the_models_text_as_deltas(
    store: Durability, stub: OpenAIStub, model: OpenAIInterpreter
) -> None:
    kernel = kernel_for(store, model)
    stub.queue_data(
        [
            completion(
                "Let me look.",
                ("call_b1", "billing__balance", {"due": 4200}),
                ("call_b2", "billing__balance", {"due": 10}),
            ),
            completion("You owe $42.00 on that invoice, and $0.10 on the other."),
        ]
    )
    events = await collect(kernel.stream_turn(THREAD, "d1", "what do I owe?"))

    assert all(r.get("stream") is True for r in stub.requests)
    deltas = [e.data["text"] for e in events if e.type == "delta"]
    assert len(deltas) > 2  # the text arrived in pieces
    assert "".join(deltas) == (
        "Let me look.You owe $42.00 on that invoice, and $0.10 on the other."
    )
    result = events[-1].data
    assert result["reply"] == "You owe $42.00 on that invoice, and $0.10 on the other."
    # The streamed tool calls were put back together: both ran, with their arguments.
    assert [s["value"] for s in result["steps"]] == [{"due": 4200}, {"due": 10}]
    second = stub.requests[1]["messages"]
    [assistant] = [m for m in second if m["role"] == "assistant" and m.get("tool_calls")]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_b1", "call_b2"]
    assert [json.loads(c["function"]["arguments"]) for c in assistant["tool_calls"]] == [
        {"due": 4200},
        {"due": 10},
    ]
    assert [m["tool_call_id"] for m in second if m["role"] == "tool"] == ["call_b1", "call_b2"]
    redelivered = await kernel.turn(THREAD, "d1", "what do I owe?")
    assert {**result, "replayed": True} == redelivered.to_dict()


async def test_a_streamed_redelivery_streams_the_text_of_the_rounds_it_took_from_the_journal(
    store: Durability, stub: OpenAIStub, model: OpenAIInterpreter
) -> None:
    """Round 1 (text and a read) is recorded; the model fails in round 2, so the turn
    commits nothing. The streamed redelivery takes round 1 from the journal, without
    asking the model, and still streams its text before round 2's."""
    kernel = kernel_for(store, model)
    stub.queue_data(
        [
            completion("Let me look.", ("call_b1", "billing__balance", {"due": 4200})),
            {"status": 500, "body": {"error": {"message": "overloaded"}}},
        ]
    )
    with pytest.raises(InterpretationError):
        await collect(kernel.stream_turn(THREAD, "d1", "what do I owe?"))
    assert len(stub.requests) == 2 and await store.load_checkpoint(THREAD) is None

    stub.queue_data([completion("You owe $42.00.")])
    events = await collect(kernel.stream_turn(THREAD, "d1", "what do I owe?"))

    assert len(stub.requests) == 3  # round 1 was not asked again
    [again] = stub.requests[2:]
    assert [m["tool_call_id"] for m in again["messages"] if m["role"] == "tool"] == ["call_b1"]
    deltas = [e.data["text"] for e in events if e.type == "delta"]
    assert deltas[0] == "Let me look."  # the recorded round, in one piece
    assert "".join(deltas) == "Let me look.You owe $42.00."
    assert [e.type for e in events].index("step") > 0  # the read ran again, after the text
    result = events[-1].data
    assert (result["reply"], result["replayed"]) == ("You owe $42.00.", False)
    assert [s["value"] for s in result["steps"]] == [{"due": 4200}]


async def test_an_unstreamed_turn_asks_the_model_without_streaming(
    stub: OpenAIStub, model: OpenAIInterpreter
) -> None:
    kernel = kernel_for(InMemoryDurability(), model)
    stub.queue_data([completion("Hello.")])
    result = await kernel.turn(THREAD, "d1", "hi")

    assert result.reply == "Hello."
    assert "stream" not in stub.requests[0]


async def test_a_streamed_model_error_fails_the_turn_before_any_event(
    stub: OpenAIStub, model: OpenAIInterpreter
) -> None:
    store = InMemoryDurability()
    kernel = kernel_for(store, model)
    stub.queue_data([{"status": 500, "body": {"error": {"message": "overloaded"}}}])
    with pytest.raises(InterpretationError):
        await collect(kernel.stream_turn(THREAD, "d1", "hi"))
    assert await store.load_checkpoint(THREAD) is None


def test_the_guides_streaming_snippet_prints_what_the_guide_shows(tmp_path: Path) -> None:
    guide = Path(__file__).parents[1] / "docs" / "guides" / "agent-loop.md"
    section = guide.read_text(encoding="utf-8").split("## Streaming", 1)[1]
    found = re.search(r"```python\n(.*?)```\s*```text\n(.*?)```", section, re.S)
    assert found is not None
    script = tmp_path / "streaming.py"
    script.write_text(found.group(1), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == found.group(2)
