"""An effect call the capability did not await (issue 31), on every store.

``ctx.run_effect(...)`` without ``await`` makes a coroutine that never runs: no
receipt, no provider call. Before, the step was ``completed`` and the person read
that it was done. Now the step fails, before the turn commits, with an error naming
the capability and the key, and no "never awaited" warning leaks.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    Intent,
    Interpretation,
    Kernel,
    StepStatus,
    capability,
)
from intention_kernel.durability import Durability
from intention_kernel.testing import ScriptedInterpreter
from proving_support import read_all_events


class Provider:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def charge(self, authority: EffectAuthority) -> str:
        self.calls.append(authority.key)
        return "ch_1"


def kernel_with(store: Durability, handler: Any) -> Kernel:
    charge = capability(
        "payments.charge", effect="write", confirmation="capability", description="Charge"
    )(handler)
    script = {
        "charge": Interpretation([Intent("payments.charge", {"pi": "pi_1"})]),
        "hi": Interpretation(reply="hello"),
    }
    return Kernel(Agent("shop", "1", [charge], ScriptedInterpreter(script)), store)


async def run_collecting_warnings(kernel: Kernel, turn_id: str, message: str) -> Any:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = await kernel.turn("t", turn_id, message)
        gc.collect()
    assert [str(w.message) for w in caught] == []
    return result


async def test_a_forgotten_await_fails_the_step_and_runs_nothing(store: Durability) -> None:
    provider = Provider()

    async def charge(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        ctx.run_effect(f"charge:{input['pi']}", provider.charge)  # type: ignore[unused-coroutine]
        return CapabilityResult(value="done", reply="Charged.")

    kernel = kernel_with(store, charge)
    result = await run_collecting_warnings(kernel, "1", "charge")

    [step] = result.steps
    assert step.status == StepStatus.FAILED
    assert step.error is not None
    assert "payments.charge" in step.error and "'charge:pi_1'" in step.error
    assert "await" in step.error
    assert "Charged." not in result.reply and "not completed" in result.reply
    assert provider.calls == [] and await store.list_receipts(thread_id="t") == []
    types = [e.type for e in await read_all_events(store, thread_id="t")]
    assert not any(t.startswith("effect.") for t in types)
    assert types[-1] == "turn.committed"
    assert (await kernel.turn("t", "2", "hi")).checkpoint_version == 2


async def test_one_forgotten_call_among_awaited_ones_fails_the_step(store: Durability) -> None:
    provider = Provider()

    async def charge(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        await asyncio.gather(
            ctx.run_effect("a", provider.charge), ctx.run_effect("b", provider.charge)
        )
        ctx.run_effect("c", provider.charge)  # type: ignore[unused-coroutine]
        return CapabilityResult(value="done")

    result = await run_collecting_warnings(kernel_with(store, charge), "1", "charge")

    [step] = result.steps
    assert step.status == StepStatus.FAILED and "'c'" in (step.error or "")
    assert "'a'" not in (step.error or "")
    assert sorted(provider.calls) == ["payments.charge:a", "payments.charge:b"]
    receipts = await store.list_receipts(thread_id="t")
    assert sorted(r.key for r in receipts) == ["payments.charge:a", "payments.charge:b"]
    assert all(r.status == "completed" for r in receipts)


async def test_every_awaited_call_completes_the_step_as_before(store: Durability) -> None:
    provider = Provider()

    async def charge(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        effect = await ctx.run_effect("a", provider.charge)
        task = asyncio.create_task(ctx.run_effect("b", provider.charge))
        await task
        return CapabilityResult(value=effect.value)

    result = await run_collecting_warnings(kernel_with(store, charge), "1", "charge")
    assert [s.status for s in result.steps] == [StepStatus.COMPLETED]
    assert sorted(provider.calls) == ["payments.charge:a", "payments.charge:b"]
