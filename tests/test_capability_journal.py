"""``ctx.recorded``: a capability's own values in the turn's journal, on every store.

A value computed in a delivery that died before its commit comes back to the next
delivery of the same turn ID without being computed again; each step reads only its
own values; a key the journal cannot store, or a call after the step ended, is a
``JournalError`` that records nothing; the commit leaves no journal entry behind.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from intention_kernel import (
    Agent,
    CapabilityContext,
    Intent,
    Interpretation,
    JournalError,
    Kernel,
    capability,
)
from intention_kernel.durability import Durability
from intention_kernel.durability.abc import RecordedDurability
from intention_kernel.testing import ScriptedInterpreter, faults


async def journal(store: Durability, turn_id: str) -> list[str]:
    """The keys of the journal entries of ``turn_id`` on thread ``t1``."""
    assert isinstance(store, RecordedDurability)  # every store of the ``store`` fixture
    recorder = await store.recorder()
    return [entry.key for entry in await recorder.read_journal("t1", turn_id)]


class Model:
    """A costly computation: each call returns a new value."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        return {"answer": self.calls, "pair": (1, 2)}


def kernel_for(store: Durability, handler: Any, intents: int = 1) -> Kernel:
    ask = capability("desk.ask", effect="read", description="Ask the model")(handler)
    script = ScriptedInterpreter(
        {"ask": Interpretation(intents=[Intent("desk.ask", {}) for _ in range(intents)])}
    )
    agent = Agent(name="desk", version="1", capabilities=[ask], interpreter=script)
    return Kernel(agent, store)


async def test_a_recorded_value_is_not_computed_again_when_its_turn_is_redelivered(
    store: Durability,
) -> None:
    model = Model()

    async def handle(input: dict[str, Any], ctx: CapabilityContext) -> Any:
        return await ctx.recorded("model.1", model)

    kernel = kernel_for(store, handle)
    with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
        await kernel.turn("t1", "turn-1", "ask")
    assert model.calls == 1
    assert await journal(store, "turn-1") == ["turn-1#1:model.1"]
    redelivered = await kernel.turn("t1", "turn-1", "ask")
    assert model.calls == 1
    # As the store reads it back, in the first delivery too: the tuple is a list.
    assert [s.value for s in redelivered.steps] == [{"answer": 1, "pair": [1, 2]}]
    assert await journal(store, "turn-1") == []
    # A new turn ID computes anew.
    later = await kernel.turn("t1", "turn-2", "ask")
    assert [s.value for s in later.steps] == [{"answer": 2, "pair": [1, 2]}]


async def test_each_step_reads_only_the_values_it_recorded(store: Durability) -> None:
    model = Model()

    async def handle(input: dict[str, Any], ctx: CapabilityContext) -> Any:
        return await ctx.recorded("model.1", model)

    kernel = kernel_for(store, handle, intents=2)
    first = await kernel.turn("t1", "turn-1", "ask")
    assert [s.value["answer"] for s in first.steps] == [1, 2]
    assert model.calls == 2


async def test_a_key_the_journal_cannot_store_fails_the_step_and_records_nothing(
    store: Durability,
) -> None:
    model = Model()
    raised: list[JournalError] = []

    async def handle(input: dict[str, Any], ctx: CapabilityContext) -> Any:
        for key in ("", "nul\x00"):
            try:
                await ctx.recorded(key, model)
            except JournalError as exc:
                raised.append(exc)
        return "done"

    kernel = kernel_for(store, handle)
    with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
        await kernel.turn("t1", "turn-1", "ask")
    assert [exc.turn_id for exc in raised] == ["turn-1", "turn-1"]
    assert "non-empty string" in str(raised[0])
    assert model.calls == 0
    assert await journal(store, "turn-1") == []


async def test_a_value_recorded_after_its_step_ended_is_refused(store: Durability) -> None:
    model = Model()
    left: list[asyncio.Task[Any]] = []
    started = asyncio.Event()

    async def late(ctx: CapabilityContext) -> Any:
        started.set()
        await asyncio.sleep(0)  # the step ends first
        return await ctx.recorded("model.1", model)

    async def handle(input: dict[str, Any], ctx: CapabilityContext) -> Any:
        left.append(asyncio.create_task(late(ctx)))
        await started.wait()
        return "done"

    kernel = kernel_for(store, handle)
    result = await kernel.turn("t1", "turn-1", "ask")
    assert [s.status for s in result.steps] == ["completed"]
    with pytest.raises(JournalError, match="after step 'turn-1#1' ended"):
        await left[0]
    assert model.calls == 0
    assert await journal(store, "turn-1") == []
