"""Approvals as execution permits: a deadline, an edit, a reason, a quorum and a busy
thread, on a fresh SQLite store. Run it: ``python examples/approvals.py``."""

import asyncio
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, Field

from intention_kernel import (
    Agent,
    Answer,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    Kernel,
    Rule,
    RuleInterpreter,
    ThreadBusyError,
    TurnResult,
    capability,
)
from intention_kernel.durability.sqlite import SQLiteDurability


class Refund(BaseModel):
    order_id: str
    amount_cents: int = Field(gt=0)


class Payout(BaseModel):
    vendor: str
    amount_cents: int = Field(gt=0)


class Bank:
    """Stands in for the payment provider; ``hold`` keeps a payout's call running."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.paying = asyncio.Event()
        self.hold = asyncio.Event()
        self.hold.set()

    async def send(self, what: str) -> str:
        self.calls.append(what)
        self.paying.set()
        await self.hold.wait()
        return f"tx_{len(self.calls)}"


bank = Bank()


@capability(
    "shop.refund",
    effect="write",
    description="Refund an order",
    prompt="Refund {amount_cents} cents on order {order_id}?",
    confirm_within=timedelta(minutes=15),  # unanswered for 15 minutes: expired, nothing runs
)
async def refund(input: Refund, ctx: CapabilityContext) -> CapabilityResult:
    async def call(authority: EffectAuthority) -> str:
        return await bank.send(f"refund {input.order_id} {input.amount_cents}")

    effect = await ctx.run_effect(f"refund:{input.order_id}", call)
    return CapabilityResult(value=effect.value, reply=f"Refunded {input.amount_cents} cents.")


@capability(
    "shop.payout",
    effect="write",
    description="Pay a vendor",
    prompt="Pay {amount_cents} cents to {vendor}?",
    approvals=2,  # two distinct people must accept before it runs
)
async def payout(input: Payout, ctx: CapabilityContext) -> CapabilityResult:
    async def call(authority: EffectAuthority) -> str:
        return await bank.send(f"payout {input.vendor} {input.amount_cents}")

    effect = await ctx.run_effect(f"payout:{input.vendor}", call)
    return CapabilityResult(value=effect.value, reply=f"Paid {input.amount_cents} cents.")


rules = RuleInterpreter(
    [
        Rule(r"refund order (?P<order_id>\w+) for (?P<amount_cents>\d+)", "shop.refund"),
        Rule(r"pay (?P<amount_cents>\d+) to (?P<vendor>\w+)", "shop.payout"),
    ]
)
agent = Agent(
    name="shop",
    version="1",
    capabilities=[refund, payout],
    interpreter=rules,
    on_busy="reject",  # a turn while another runs on the thread: ThreadBusyError at once
)


def show(label: str, result: TurnResult) -> None:
    print(f"{label}: {result.reply}")


async def main(store_path: Path) -> None:
    now = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    async with SQLiteDurability(store_path) as store:
        kernel = Kernel(agent, store, clock=lambda: now)  # the clock deadlines are read from

        # A reason: the reject says why (in interaction.resolved and the model's next round).
        show("ask", await kernel.turn("acct", "t1", "refund order 7 for 5000"))
        no = Answer(decision="reject", reason="only the lid was broken", actor="ana")
        rejected = await kernel.turn("acct", "t2", answer=no)
        show("reject", rejected)
        print(f"  the step says: {rejected.steps[0].error}")

        # An edit: the approver corrects the held input; it is validated, then it runs.
        asked = await kernel.turn("acct", "t3", "refund order 7 for 5000")
        assert asked.interaction is not None
        edit = Answer(
            decision="accept",
            input={"order_id": "7", "amount_cents": 1200},
            actor="ana",
            digest=asked.interaction.digest,  # binds the answer to the operation shown
        )
        show("edit", await kernel.turn("acct", "t4", answer=edit))

        # A deadline: an accept after expires_at runs nothing.
        asked = await kernel.turn("acct", "t5", "refund order 8 for 900")
        assert asked.interaction is not None
        print(f"answer by {asked.interaction.expires_at}")
        now += timedelta(minutes=20)
        show("late", await kernel.turn("acct", "t6", answer=Answer(actor="ana")))

        # A quorum: two distinct actors; the same one twice counts once.
        show("ask", await kernel.turn("acct", "t7", "pay 30000 to acme"))
        show("ana", await kernel.turn("acct", "t8", answer=Answer(actor="ana")))
        show("ana again", await kernel.turn("acct", "t9", answer=Answer(actor="ana")))

        # A busy thread: while bob's accept runs the payout, another turn is refused.
        bank.hold.clear()
        bank.paying.clear()
        running = asyncio.create_task(kernel.turn("acct", "t10", answer=Answer(actor="bob")))
        await bank.paying.wait()
        try:
            await kernel.turn("acct", "t11", "refund order 9 for 100")
        except ThreadBusyError:
            print("busy: the thread is running a turn; asked to wait (HTTP 409 thread-busy)")
        bank.hold.set()
        show("bob", await running)
    print(f"provider calls: {bank.calls}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(main(Path(folder) / "approvals.db"))
