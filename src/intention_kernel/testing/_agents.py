"""A small billing agent and a fake payment provider, for conformance tests.

The provider keeps a ledger of every call that reached it, so a test can prove
that a write happened exactly once. Its behaviour per payment intent is scripted.
It may succeed, fail without applying, or apply and then lose the response.
It may also return a value that cannot be stored, or block until released.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import pydantic

from intention_kernel._agent import Agent
from intention_kernel._authority import Approvers
from intention_kernel._capabilities import CapabilityContext, CapabilityResult, capability
from intention_kernel._effects import EffectAuthority
from intention_kernel._facts import Fact
from intention_kernel._interpretation import Intent, Interpretation, InterpretationRequest
from intention_kernel.errors import EffectNotAppliedError
from intention_kernel.testing._scripted import ScriptedInterpreter

__all__ = ["ChargeInput", "FakeProvider", "billing_agent", "billing_interpreter"]

Behaviour = Literal["ok", "not_applied", "lost_response", "unstorable", "block"]


@dataclass
class FakeProvider:
    """A payment provider that records every call that reached it."""

    ledger: list[str] = field(default_factory=list)
    authorities: list[EffectAuthority] = field(default_factory=list)
    behaviour: dict[str, Behaviour] = field(default_factory=dict)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    entered: asyncio.Event = field(default_factory=asyncio.Event)

    def calls(self, key: str | None = None) -> int:
        """How many charges reached the provider, all of them or under one key."""
        return len(self.ledger) if key is None else self.ledger.count(key)

    async def charge(self, payment_intent_id: str, amount: int, authority: EffectAuthority) -> Any:
        """Charge ``amount`` as ``behaviour`` scripts for this payment intent.

        ``"ok"`` (the default) applies and answers with a charge ID.
        ``"not_applied"`` declines, ``"lost_response"`` applies but raises a timeout.
        ``"unstorable"`` answers with a value no store can keep.
        ``"block"`` sets ``entered`` and waits for ``released`` before it applies.
        """
        mode = self.behaviour.get(payment_intent_id, "ok")
        self.authorities.append(authority)
        if mode == "not_applied":
            raise EffectNotAppliedError(f"card declined for {payment_intent_id}")
        if mode == "block":
            self.entered.set()
            await self.released.wait()
        self.ledger.append(authority.idempotency_key)
        if mode == "lost_response":
            raise TimeoutError("the provider did not answer in time")
        if mode == "unstorable":
            return object()
        return {"charge_id": f"ch_{payment_intent_id}_{len(self.ledger)}", "amount": amount}


class ChargeInput(pydantic.BaseModel):
    payment_intent_id: str = pydantic.Field(pattern=r"^pi_\w+$")
    amount: int = pydantic.Field(gt=0)


class RefundInput(pydantic.BaseModel):
    payment_intent_id: str
    amount: int = pydantic.Field(gt=0)


def billing_agent(
    provider: FakeProvider,
    *,
    version: str = "1",
    max_messages: int = 50,
    max_receipts: int = 100,
    compatible_fingerprints: Sequence[str] = (),
    interpreter: ScriptedInterpreter | None = None,
    confirm_within: timedelta | None = None,
    approvals: int = 1,
    approvers: Approvers = None,
    self_approval: bool = True,
) -> Agent:
    """A billing agent of four capabilities.

    They are a read (``billing.balance``) and a confirmed write (``payments.charge``).
    A write confirms on its own (``payments.refund``), and a read misbehaves (``billing.peek``).
    ``confirm_within`` is the deadline of both writes' confirmations (none by default).
    ``approvals`` is how many distinct actors must accept a charge (one by default).
    ``approvers`` and ``self_approval`` are both writes' approver policy.
    By default anyone may approve.
    """

    @capability("billing.balance", description="Amount due")
    async def balance(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        due = int(input.get("due", 4200))
        return CapabilityResult(
            value={"due": due}, facts=[Fact("balance", due)], reply=f"You owe {due}."
        )

    @capability(
        "payments.charge",
        effect="write",
        description="Charge a payment intent",
        prompt="Charge {amount} to {payment_intent_id}?",
        confirm_within=confirm_within,
        approvals=approvals,
        approvers=approvers,
        self_approval=self_approval,
    )
    async def charge(input: ChargeInput, ctx: CapabilityContext) -> CapabilityResult:
        pi = input.payment_intent_id
        effect = await ctx.run_effect(
            f"charge:{pi}", lambda authority: provider.charge(pi, input.amount, authority)
        )
        derived = ("balance",) if "balance" in ctx.facts else ()
        ctx.emit("billing.charged", {"payment_intent_id": pi})
        return CapabilityResult(
            value=effect.value,
            facts=[Fact(f"charge.{pi}", effect.value, derived_from=derived)],
            reply=f"Charged {input.amount} to {pi}.",
        )

    @capability(
        "payments.refund",
        effect="write",
        confirmation="capability",
        confirm_within=confirm_within,
        approvers=approvers,
        self_approval=self_approval,
    )
    async def refund(input: RefundInput, ctx: CapabilityContext) -> CapabilityResult:
        """Refund part of a charge."""
        if ctx.answer is None:
            return CapabilityResult.needs_confirmation(
                f"Refund {input.amount} on {input.payment_intent_id}?",
                details={"amount": input.amount},
            )
        if ctx.answer.decision != "accept":
            return CapabilityResult(reply="Refund cancelled.")
        pi = input.payment_intent_id
        effect = await ctx.run_effect(
            f"refund:{pi}", lambda authority: provider.charge(pi, -input.amount, authority)
        )
        return CapabilityResult(value=effect.value, reply=f"Refunded {input.amount}.")

    @capability("billing.peek", description="A read that wrongly tries to write")
    async def peek(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        await ctx.run_effect("peek", lambda authority: provider.ledger.append("peek"))
        return CapabilityResult(value="unreachable")

    return Agent(
        name="billing",
        version=version,
        capabilities=[balance, charge, refund, peek],
        interpreter=interpreter or billing_interpreter(),
        max_messages=max_messages,
        max_receipts=max_receipts,
        compatible_fingerprints=compatible_fingerprints,
    )


_COMMAND = re.compile(r"^(?P<verb>\w+)(?:\s+(?P<pi>\S+))?(?:\s+(?P<amount>-?\d+))?$")


def billing_interpreter() -> ScriptedInterpreter:
    """An interpreter of the billing agent's commands.

    It understands ``balance``, ``charge pi_1 500``, ``refund pi_1 100`` and ``peek``.
    It also understands ``ghost`` (an unknown capability), ``yes`` and ``no``.
    Several commands may be joined with `` and ``.
    """

    def interpret(request: InterpretationRequest) -> Interpretation:
        intents: list[Intent] = []
        answer: Literal["accept", "reject"] | None = None
        for part in request.message.split(" and "):
            match = _COMMAND.match(part.strip())
            if match is None:
                continue
            verb, pi, amount = match["verb"], match["pi"], match["amount"]
            if verb == "yes":
                answer = "accept"
            elif verb == "no":
                answer = "reject"
            elif verb == "balance":
                due = amount or pi
                intents.append(Intent("billing.balance", {"due": int(due)} if due else {}))
            elif verb in ("charge", "refund"):
                data: dict[str, Any] = {"payment_intent_id": pi}
                if amount is not None:
                    data["amount"] = int(amount)
                intents.append(Intent(f"payments.{verb}", data))
            elif verb == "peek":
                intents.append(Intent("billing.peek", {}))
            elif verb == "ghost":
                intents.append(Intent("billing.ghost", {}))
        return Interpretation(intents=intents, answer=answer)

    return ScriptedInterpreter(interpret)
