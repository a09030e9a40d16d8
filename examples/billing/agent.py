"""The billing agent: look up an invoice, charge it once the person confirms.

- ``billing.balance`` (read) answers what is due, or which charge paid the invoice;
- ``payments.charge`` (write, ``confirmation="required"``) is never run in the turn
  that proposes it: the kernel stores the exact input and asks. On "yes" it charges
  through :class:`FakePayments` inside ``ctx.run_effect``, keyed by the invoice's
  payment intent, so the invoice is charged at most once in the thread, whatever is
  retried, redelivered or proposed again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    Fact,
    Interpreter,
    Rule,
    RuleInterpreter,
    capability,
)

__all__ = ["INVOICES", "FakePayments", "Invoice", "build_agent", "money", "rules"]


@dataclass(frozen=True, slots=True)
class Invoice:
    invoice_id: str
    customer: str
    amount_due_cents: int
    payment_intent_id: str


INVOICES: Mapping[str, Invoice] = {
    "42": Invoice("42", "Acme Corp", 12_500, "pi_acme_42"),
    "43": Invoice("43", "Acme Corp", 4_999, "pi_acme_43"),
}


def money(cents: int) -> str:
    return f"${cents / 100:,.2f}"


class FakePayments:
    """A payment API with Stripe-like idempotency keys, kept in memory.

    ``calls`` lists every request that reached it: if the kernel ever sent a
    charge twice, it would show here even though the idempotency key would stop
    the customer from paying twice.
    """

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._charges: dict[str, dict[str, Any]] = {}

    async def create_charge(
        self, payment_intent_id: str, amount_cents: int, idempotency_key: str
    ) -> dict[str, Any]:
        self.calls.append(payment_intent_id)
        charge = self._charges.get(idempotency_key)
        if charge is None:
            charge = {
                "charge_id": f"ch_{len(self._charges) + 1:04d}",
                "payment_intent_id": payment_intent_id,
                "amount_cents": amount_cents,
            }
            self._charges[idempotency_key] = charge
        return charge


class BalanceInput(BaseModel):
    invoice_id: str = Field(pattern=r"^\d+$", description='The invoice number, e.g. "42"')


class ChargeInput(BaseModel):
    invoice_id: str = Field(pattern=r"^\d+$", description='The invoice number, e.g. "42"')
    amount_cents: int = Field(gt=0, description="The amount due on the invoice, in cents")


class AmountMismatch(ValueError):
    """The proposed amount is not what the invoice says is due: nothing is charged."""


def build_agent(
    payments: FakePayments,
    interpreter: Interpreter | None = None,
    invoices: Mapping[str, Invoice] = INVOICES,
) -> Agent:
    """The agent; ``interpreter`` defaults to :func:`rules`."""

    def customer(invoice_id: str) -> str:
        invoice = invoices.get(invoice_id)
        return invoice.customer if invoice else "an unknown customer"

    @capability("billing.balance", description="Look up the amount due on an invoice")
    async def balance(input: BalanceInput, ctx: CapabilityContext) -> CapabilityResult:
        invoice = invoices.get(input.invoice_id)
        if invoice is None:
            return CapabilityResult(reply=f"There is no invoice {input.invoice_id}.")
        payment = ctx.facts.get(f"invoice.{invoice.invoice_id}.payment")
        if payment is not None:
            charge_id = payment.value["charge_id"]
            return CapabilityResult(
                value={"invoice_id": invoice.invoice_id, "amount_due_cents": 0},
                reply=f"Invoice {invoice.invoice_id} is paid (charge {charge_id}).",
            )
        due = invoice.amount_due_cents
        return CapabilityResult(
            value={"invoice_id": invoice.invoice_id, "amount_due_cents": due},
            facts=[Fact(f"invoice.{invoice.invoice_id}.amount_due_cents", due)],
            reply=f"Invoice {invoice.invoice_id} ({invoice.customer}): {money(due)} due.",
        )

    @capability(
        "payments.charge",
        effect="write",
        confirmation="required",
        description="Charge the amount due on an invoice",
        prompt=lambda input: (
            f"Charge {money(input.amount_cents)} to {customer(input.invoice_id)} for invoice "
            f"{input.invoice_id}? Reply yes or no."
        ),
    )
    async def charge(input: ChargeInput, ctx: CapabilityContext) -> CapabilityResult:
        invoice = invoices.get(input.invoice_id)
        if invoice is None:
            raise LookupError(f"there is no invoice {input.invoice_id}; nothing was charged")
        if input.amount_cents != invoice.amount_due_cents:
            raise AmountMismatch(
                f"invoice {invoice.invoice_id} has {money(invoice.amount_due_cents)} due, "
                f"not {money(input.amount_cents)}; nothing was charged"
            )

        async def send(authority: EffectAuthority) -> dict[str, Any]:
            # The kernel's key is stable for this payment intent: the provider sees the
            # same idempotency key on every retry of this charge.
            return await payments.create_charge(
                invoice.payment_intent_id, input.amount_cents, authority.idempotency_key
            )

        effect = await ctx.run_effect(f"charge:{invoice.payment_intent_id}", send)
        paid = effect.value
        if effect.receipt.turn_id == ctx.turn_id:
            reply = f"Charged {money(paid['amount_cents'])} for invoice {invoice.invoice_id} "
            reply += f"(charge {paid['charge_id']})."
        else:
            reply = (
                f"Invoice {invoice.invoice_id} was already charged in {effect.receipt.turn_id} "
                f"(charge {paid['charge_id']}); no new charge was made."
            )
        return CapabilityResult(
            value=paid, facts=[Fact(f"invoice.{invoice.invoice_id}.payment", paid)], reply=reply
        )

    return Agent(
        name="billing-example",
        version="1",
        capabilities=[balance, charge],
        interpreter=interpreter or rules(invoices),
    )


def rules(invoices: Mapping[str, Invoice] = INVOICES) -> RuleInterpreter:
    """Regular expressions standing in for a language model (``--llm`` uses one)."""
    known = "|".join(sorted(invoices, key=len, reverse=True)) or "(?!)"
    return RuleInterpreter(
        [
            Rule(r"^\s*(yes|y|ok|okay|go ahead|confirm)\b", answer="accept"),
            Rule(r"^\s*(no|n|cancel|stop)\b", answer="reject"),
            Rule(
                rf"\bpay\b.*\binvoice\s*#?\s*(?P<invoice_id>{known})\b",
                capability_id="payments.charge",
                input=lambda match: {
                    "invoice_id": match["invoice_id"],
                    "amount_cents": invoices[match["invoice_id"]].amount_due_cents,
                },
            ),
            Rule(r"\binvoice\s*#?\s*(?P<invoice_id>\d+)", capability_id="billing.balance"),
        ],
        fallback_reply="Ask 'what do I owe on invoice 42?' or 'pay invoice 42'.",
    )
