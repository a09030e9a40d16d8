"""The agent loop, runnable: ``python examples/agent_loop.py [STORE_URL]``.

One turn, three rounds: the interpreter looks up what an invoice owes, sees the
result, proposes a charge because the amount is under the limit, sees that the charge
waits for the person's confirmation, and writes the reply. The next turn's "yes"
charges exactly what was shown, once. A scripted interpreter stands in for the model
(``multi_round=True`` opts it in to rounds, as ``OpenAIInterpreter`` is by default).
"""

import asyncio
import sys

from pydantic import BaseModel

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    Intent,
    Interpretation,
    InterpretationRequest,
    Kernel,
    capability,
)
from intention_kernel.durability import open_durability
from intention_kernel.testing import ScriptedInterpreter

INVOICES = {"42": 12_500}
provider_calls = 0


class InvoiceInput(BaseModel):
    invoice_id: str


class ChargeInput(BaseModel):
    invoice_id: str
    amount_cents: int


@capability("billing.balance", description="Look up what an invoice owes")
async def balance(input: InvoiceInput, ctx: CapabilityContext) -> CapabilityResult:
    return CapabilityResult(value={"amount_cents": INVOICES[input.invoice_id]})


@capability(
    "payments.charge",
    effect="write",
    description="Charge an invoice",
    prompt="Charge {amount_cents} cents for invoice {invoice_id}? Reply yes or no.",
)
async def charge(input: ChargeInput, ctx: CapabilityContext) -> CapabilityResult:
    def create_charge(authority: EffectAuthority) -> dict[str, str]:
        global provider_calls
        provider_calls += 1
        return {"charge_id": f"ch_{input.invoice_id}"}

    effect = await ctx.run_effect(f"invoice:{input.invoice_id}", create_charge)
    return CapabilityResult(value=effect.value, reply=f"Paid invoice {input.invoice_id}.")


def model(request: InterpretationRequest) -> Interpretation:
    """What a model would do, round by round, from what the earlier rounds produced."""
    if not request.rounds:
        return Interpretation(intents=[Intent("billing.balance", {"invoice_id": "42"})])
    last = request.rounds[-1].steps[-1]
    if last.capability_id == "billing.balance":
        due = last.value["amount_cents"]
        if due < 20_000:
            return Interpretation(
                intents=[Intent("payments.charge", {"invoice_id": "42", "amount_cents": due})]
            )
        return Interpretation(reply=f"Invoice 42 owes {due} cents; that is over your limit.")
    return Interpretation(
        reply="Invoice 42 owes 12500 cents, under $200: I will pay it once you confirm."
    )


agent = Agent(
    name="billing",
    version="1",
    capabilities=[balance, charge],
    interpreter=ScriptedInterpreter(model, multi_round=True),
    max_rounds=8,
)


async def main(url: str) -> None:
    async with open_durability(url) as store:
        kernel = Kernel(agent, store)
        asked = await kernel.turn(
            "acct-1", "delivery-1", "what do I owe on invoice 42, and pay it if under $200"
        )
        print(f"{asked.turn_id}: {asked.reply}")
        for step in asked.steps:
            print(f"  step {step.capability_id}: {step.status}")
        done = await kernel.turn("acct-1", "delivery-2", answer="accept")
        print(f"{done.turn_id}: {done.reply} (replayed={done.replayed})")
    print(f"provider calls in this run: {provider_calls}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:///agent_loop.db"))
