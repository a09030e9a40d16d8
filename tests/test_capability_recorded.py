"""``ctx.recorded``: a capability's own entries in the turn's journal.

A value a step recorded is read back by the same step of a redelivered turn instead
of being computed again (a model response is not paid twice); each step has its own
keys; what cannot be stored is a typed error and records nothing; the commit deletes
the entries, so a new turn computes afresh. Every store alike.
"""

from __future__ import annotations

from typing import Any

import pytest

from intention_kernel import (
    Agent,
    CapabilityContext,
    Intent,
    Interpretation,
    Kernel,
    capability,
)
from intention_kernel.durability import Durability
from intention_kernel.testing import ScriptedInterpreter, faults


def recording_agent(computed: list[str]) -> Agent:
    @capability("desk.ask", description="Ask the oracle")
    async def ask(input: dict[str, Any], ctx: CapabilityContext) -> Any:
        async def compute() -> Any:
            computed.append(ctx.step_id)
            return {"answer": len(computed), "of": (ctx.step_id,)}

        return await ctx.recorded(input.get("key", "oracle"), compute)

    script = ScriptedInterpreter(
        {
            "twice": Interpretation(intents=[Intent("desk.ask", {}), Intent("desk.ask", {})]),
            "bad key": Interpretation(intents=[Intent("desk.ask", {"key": "a\x00b"})]),
        }
    )
    return Agent(name="desk", version="1", capabilities=[ask], interpreter=script)


async def test_a_recorded_value_is_read_back_by_the_redelivered_turn(store: Durability) -> None:
    computed: list[str] = []
    kernel = Kernel(recording_agent(computed), store)
    with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
        await kernel.turn("t1", "turn-1", "twice")
    assert computed == ["turn-1#1", "turn-1#2"]  # each step its own key
    redelivered = await kernel.turn("t1", "turn-1", "twice")
    assert computed == ["turn-1#1", "turn-1#2"]  # nothing computed again
    assert [s.value for s in redelivered.steps] == [
        {"answer": 1, "of": ["turn-1#1"]},  # as the store reads it back: a list
        {"answer": 2, "of": ["turn-1#2"]},
    ]
    # The commit deleted the entries: a new turn computes afresh.
    later = await kernel.turn("t1", "turn-2", "twice")
    assert computed == ["turn-1#1", "turn-1#2", "turn-2#1", "turn-2#2"]
    assert [s.value["answer"] for s in later.steps] == [3, 4]


async def test_a_key_that_cannot_be_stored_fails_the_step_and_records_nothing(
    store: Durability,
) -> None:
    computed: list[str] = []
    kernel = Kernel(recording_agent(computed), store)
    result = await kernel.turn("t1", "turn-1", "bad key")
    assert [s.status for s in result.steps] == ["failed"]
    assert "cannot be recorded" in (result.steps[0].error or "")
    assert computed == []
