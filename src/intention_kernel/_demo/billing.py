"""The billing demo agent, written against the public API only.

Two capabilities and a rule-based interpreter:

- ``billing.balance`` (read): the amount due on an invoice, from :data:`INVOICES`.
  Or it is the charge that paid the invoice, from the thread's facts.
- ``payments.charge`` (write, confirmation ``"required"``) charges the invoice's
  payment intent.
  It calls :class:`~intention_kernel._demo.provider.FakePaymentProvider`
  inside ``ctx.run_effect``, keyed by the payment intent.
  So the charge happens at most once per payment intent in a thread, whatever is retried.

::

    provider = FakePaymentProvider("demo.db")
    agent = build_agent(provider)
    async with SQLiteDurability("demo.db") as durability:
        kernel = Kernel(agent, durability)
        await kernel.turn("acct-acme", "delivery-1", "pay invoice 42")   # asks first
        await kernel.turn("acct-acme", "delivery-2", "yes")              # charges once
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from intention_kernel import (
    Agent,
    Capability,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    EffectNotAppliedError,
    Fact,
    Replies,
    Rule,
    RuleInterpreter,
    StepResult,
    capability,
)
from intention_kernel._demo.provider import ChargeRejected, FakePaymentProvider

__all__ = [
    "INVOICES",
    "BalanceInput",
    "BillingReplies",
    "ChargeInput",
    "Invoice",
    "build_agent",
    "build_interpreter",
    "charge_input",
    "money",
]


@dataclass(frozen=True, slots=True)
class Invoice:
    invoice_id: str
    customer: str
    amount_due_cents: int
    currency: str
    payment_intent_id: str


#: The demo's invoice table. Each invoice has one payment intent: the stable business
#: operation ID that keys its charge (``run_effect(f"charge:{payment_intent_id}")``).
INVOICES: Mapping[str, Invoice] = {
    "42": Invoice("42", "Acme Corp", 12_500, "usd", "pi_demo_42"),
    "43": Invoice("43", "Acme Corp", 4_999, "usd", "pi_demo_43"),
    "44": Invoice("44", "Acme Corp", 18_000, "usd", "pi_demo_44"),
}


class BalanceInput(BaseModel):
    invoice_id: str = Field(pattern=r"^\d+$")


class ChargeInput(BaseModel):
    payment_intent_id: str = Field(min_length=1)
    amount_cents: int = Field(gt=0)
    currency: str = "usd"
    invoice_id: str


def money(cents: int, currency: str = "usd") -> str:
    """``12500`` → ``"$125.00"`` (other currencies get their code)."""
    amount = f"{cents / 100:,.2f}"
    return f"${amount}" if currency == "usd" else f"{amount} {currency.upper()}"


def charge_input(invoice: Invoice) -> dict[str, Any]:
    """The charge the agent proposes for an invoice: its full amount due."""
    return {
        "payment_intent_id": invoice.payment_intent_id,
        "amount_cents": invoice.amount_due_cents,
        "currency": invoice.currency,
        "invoice_id": invoice.invoice_id,
    }


def _prompt(input: ChargeInput) -> str:
    return (
        f"Charge {money(input.amount_cents, input.currency)} to payment intent "
        f"{input.payment_intent_id} for invoice {input.invoice_id}? Reply yes or no."
    )


class BillingReplies(Replies):
    """The kernel's own replies, in the words of a billing assistant: the hook an
    application uses to word them (``Agent(replies=...)``)."""

    def uncertain(self, capability: Capability, step: StepResult) -> str:
        return (
            "I could not tell whether the payment went through: the payment provider did not "
            "answer. To be safe I will not try it again until someone has checked with the "
            "provider."
        )

    def failed(self, capability: Capability, step: StepResult, error: BaseException) -> str:
        if isinstance(error, EffectNotAppliedError):  # the provider refused: nothing charged
            return "The payment did not go through and nothing was charged. You can ask again."
        return super().failed(capability, step, error)


def build_agent(provider: FakePaymentProvider, invoices: Mapping[str, Invoice] = INVOICES) -> Agent:
    """The billing agent, its capabilities bound to ``provider`` and ``invoices``."""

    @capability("billing.balance", description="Look up the amount due on an invoice")
    async def balance(input: BalanceInput, ctx: CapabilityContext) -> CapabilityResult:
        invoice = invoices.get(input.invoice_id)
        if invoice is None:
            return CapabilityResult(reply=f"I can't find invoice {input.invoice_id}.")
        # Workflow state lives in facts recorded by capabilities, not in the kernel.
        payment = ctx.facts.get(f"invoice.{invoice.invoice_id}.payment")
        if payment is not None:
            paid = payment.value
            return CapabilityResult(
                value={"invoice_id": invoice.invoice_id, "amount_due_cents": 0, "paid": paid},
                reply=f"Invoice {invoice.invoice_id} is paid (charge {paid['charge_id']}).",
            )
        due = {
            "invoice_id": invoice.invoice_id,
            "amount_due_cents": invoice.amount_due_cents,
            "currency": invoice.currency,
        }
        return CapabilityResult(
            value=due,
            facts=[
                Fact(f"invoice.{invoice.invoice_id}.amount_due_cents", invoice.amount_due_cents)
            ],
            reply=(
                f"Invoice {invoice.invoice_id} ({invoice.customer}): "
                f"{money(invoice.amount_due_cents, invoice.currency)} due."
            ),
        )

    @capability(
        "payments.charge",
        effect="write",
        confirmation="required",
        description="Charge a payment intent",
        prompt=_prompt,
    )
    async def charge(input: ChargeInput, ctx: CapabilityContext) -> CapabilityResult:
        async def send(authority: EffectAuthority) -> dict[str, Any]:
            try:
                return await provider.create_charge(
                    payment_intent_id=input.payment_intent_id,
                    amount_cents=input.amount_cents,
                    currency=input.currency,
                    # Payment intent IDs are globally unique, so the kernel's key is a
                    # safe provider-wide idempotency key without a thread prefix.
                    idempotency_key=authority.idempotency_key,
                    signal=ctx.signal,
                )
            except ChargeRejected as exc:
                # A definite refusal proves nothing was charged: a later turn may retry.
                # Anything else (a timeout above all) proves nothing, so it propagates and
                # the kernel records the receipt as uncertain.
                raise EffectNotAppliedError(str(exc)) from exc

        effect = await ctx.run_effect(f"charge:{input.payment_intent_id}", send)
        receipt, paid = effect.receipt, effect.value
        amount = money(paid["amount_cents"], paid["currency"])
        if receipt.turn_id == ctx.turn_id:
            reply = f"Charged {amount} for invoice {input.invoice_id} (charge {paid['charge_id']})."
        elif receipt.resolution is not None:
            reply = (
                f"Invoice {input.invoice_id} was already charged {amount} (charge "
                f"{paid['charge_id']}, confirmed by {receipt.resolution.actor}); "
                "no new charge was made."
            )
        else:
            reply = (
                f"Invoice {input.invoice_id} was already charged {amount} in turn "
                f"{receipt.turn_id} (charge {paid['charge_id']}); no new charge was made."
            )
        return CapabilityResult(
            value=paid,
            facts=[Fact(f"invoice.{input.invoice_id}.payment", paid)],
            reply=reply,
        )

    return Agent(
        name="billing-demo",
        version="1",
        capabilities=[balance, charge],
        interpreter=build_interpreter(invoices),
        replies=BillingReplies(),
    )


def build_interpreter(invoices: Mapping[str, Invoice] = INVOICES) -> RuleInterpreter:
    """Regular expressions standing in for a language model.

    "pay invoice N" only matches invoices that exist.
    So an unknown one falls through to the balance rule.
    That rule says it cannot find the invoice.
    """
    known = "|".join(sorted(invoices, key=len, reverse=True)) or "(?!)"
    return RuleInterpreter(
        [
            Rule(r"^\s*(yes|y|yep|confirm|ok|okay|go ahead)\b", answer="accept"),
            Rule(r"^\s*(no|n|nope|cancel|stop|don'?t)\b", answer="reject"),
            Rule(
                r"\b(owe|balance|due|how much)\b.*\binvoice\s*#?\s*(?P<invoice_id>\d+)",
                capability_id="billing.balance",
            ),
            Rule(
                rf"\bpay\b.*\binvoice\s*#?\s*(?P<invoice_id>{known})\b",
                capability_id="payments.charge",
                input=lambda match: charge_input(invoices[match["invoice_id"]]),
            ),
            Rule(
                r"\binvoice\s*#?\s*(?P<invoice_id>\d+)",
                capability_id="billing.balance",
            ),
        ],
        fallback_reply=(
            "I can answer 'what do I owe on invoice 42?' and 'pay invoice 42'; "
            "reply 'yes' or 'no' to a pending charge."
        ),
    )
