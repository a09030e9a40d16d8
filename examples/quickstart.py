"""The quick start of the README and the site, runnable: ``python examples/quickstart.py [URL]``.

A write capability that charges a payment intent at most once, rules standing in for
a language model, and a SQLite store (default ``sqlite:///quickstart.db``). Run it
twice: the second run replays both deliveries and charges nothing.
"""

import asyncio
import sys

from pydantic import BaseModel

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    Fact,
    Kernel,
    Rule,
    RuleInterpreter,
    capability,
)
from intention_kernel.durability import open_durability


class ChargeInput(BaseModel):
    payment_intent_id: str
    amount_cents: int


class Payments:
    """Stands in for your payment provider's SDK."""

    def __init__(self) -> None:
        self.calls = 0

    async def create_charge(self, input: ChargeInput, idempotency_key: str) -> dict[str, str]:
        self.calls += 1
        return {"charge_id": f"ch_{input.payment_intent_id}", "idempotency_key": idempotency_key}


payments = Payments()


@capability(
    "payments.charge",
    effect="write",  # so the kernel asks first: confirmation="required" is the default
    description="Charge a payment intent",
    prompt="Charge {amount_cents} cents to {payment_intent_id}? Reply yes or no.",
)
async def charge(input: ChargeInput, ctx: CapabilityContext) -> CapabilityResult:
    async def call(authority: EffectAuthority) -> dict[str, str]:
        return await payments.create_charge(input, idempotency_key=authority.idempotency_key)

    effect = await ctx.run_effect(f"charge:{input.payment_intent_id}", call)
    return CapabilityResult(
        value=effect.value,
        facts=[Fact("charge", effect.value)],
        reply=f"Charged {input.amount_cents / 100:.2f} (charge {effect.value['charge_id']}).",
    )


rules = RuleInterpreter(
    [
        Rule(r"^(yes|ok)\b", answer="accept"),
        Rule(r"^(no|cancel)\b", answer="reject"),
        Rule(
            r"pay invoice (?P<invoice>\d+)",
            capability_id="payments.charge",
            input=lambda m: {"payment_intent_id": f"pi_{m['invoice']}", "amount_cents": 12500},
        ),
    ]
)
agent = Agent(name="billing", version="1", capabilities=[charge], interpreter=rules)


async def main(url: str) -> None:
    async with open_durability(url) as store:
        kernel = Kernel(agent, store)
        # turn_id identifies the user's delivery: keep it stable across retries.
        asked = await kernel.turn(
            thread_id="acct-1", turn_id="delivery-1", message="pay invoice 42"
        )
        print(f"{asked.turn_id}: {asked.reply} (replayed={asked.replayed})")
        done = await kernel.turn(thread_id="acct-1", turn_id="delivery-2", message="yes")
        print(f"{done.turn_id}: {done.reply} (replayed={done.replayed})")
    print(f"provider calls in this run: {payments.calls}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:///quickstart.db"))
