"""The work unit, shared by every row: one read, one write through an effect, one fact.

A turn reads a balance with a read capability. It charges a payment through an
in-process fake provider: a write capability whose effect goes through
``run_effect``. It records the charge as a fact, a new key each turn, so facts grow
with the thread. It appends the user message and the reply to the bounded
conversation.

The provider is an async client, as most provider SDKs offer one: the kernel awaits it
on the event loop. ``agent(provider, sync_provider=True)`` calls its sync twin instead,
which the kernel runs in a worker thread (the ``-syncfn`` rows show what that costs);
the floor calls the sync one inline, as hand-written code would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    Fact,
    Intent,
    Interpretation,
    InterpretationRequest,
    capability,
)

MAX_MESSAGES = 50
THREADS = 10


class FakeProvider:
    """An in-process payment provider: returns a charge and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def charge(self, payment_id: str, amount: int, idempotency_key: str) -> dict[str, Any]:
        self.calls += 1
        return {"charge_id": f"ch_{payment_id}", "amount": amount, "key": idempotency_key}

    async def charge_async(
        self, payment_id: str, amount: int, idempotency_key: str
    ) -> dict[str, Any]:
        """The same charge through the provider's async client."""
        return self.charge(payment_id, amount, idempotency_key)


def message(n: int) -> str:
    return f"pay invoice {n}"


def payment(n: int) -> str:
    return f"pi_{n}"


class Interpreter:
    """Rules, not a model: the benchmark measures durability, not inference.

    ``awaits``: the interpretation awaits once (``asyncio.sleep(0)``), as a model call
    would, so that other turns run meanwhile: the concurrency group's turns overlap
    only through this (see ``bench.concurrency``).

    ``model``: awaited with the thread's ID in place of that await, as the model's call
    (the latency group's, which awaits its latency there: see ``bench.latency``)."""

    def __init__(
        self, awaits: bool = False, model: Callable[[str], Awaitable[None]] | None = None
    ) -> None:
        self.awaits, self.model = awaits, model

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        if self.model is not None:
            await self.model(request.thread_id)
        elif self.awaits:
            await asyncio.sleep(0)
        n = request.message.rsplit(" ", 1)[1]
        return Interpretation(
            intents=[
                Intent("account.balance", {}),
                Intent("payments.charge", {"payment_id": f"pi_{n}", "amount": 100}),
            ]
        )


def agent(
    provider: FakeProvider,
    *,
    sync_provider: bool = False,
    model_awaits: bool = False,
    model: Callable[[str], Awaitable[None]] | None = None,
) -> Agent:
    @capability("account.balance", description="Amount due")
    async def balance(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        return CapabilityResult(value={"due": 4200}, reply="You owe 4200.")

    # confirmation="capability": the capability decides, and a small charge needs none,
    # so the write runs in the turn that asks for it.
    @capability("payments.charge", effect="write", confirmation="capability")
    async def charge(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        """Charge a payment."""
        pid, amount = input["payment_id"], input["amount"]
        if sync_provider:  # a sync function: the kernel runs it in a worker thread
            effect = await ctx.run_effect(
                f"charge:{pid}", lambda a: provider.charge(pid, amount, a.idempotency_key)
            )
        else:

            async def call(a: EffectAuthority) -> dict[str, Any]:
                return await provider.charge_async(pid, amount, a.idempotency_key)

            effect = await ctx.run_effect(f"charge:{pid}", call)
        return CapabilityResult(
            value=effect.value,
            facts=[Fact(f"charge.{pid}", effect.value)],
            reply=f"Charged {amount} to {pid}.",
        )

    return Agent(
        name="bench",
        version="1",
        capabilities=[balance, charge],
        interpreter=Interpreter(model_awaits, model),
        max_messages=MAX_MESSAGES,
    )
