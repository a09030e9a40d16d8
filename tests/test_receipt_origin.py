"""A receipt says what its write was (issue 31, section 2): the capability, the input
that ran (after approval and edits, redacted) and its approvers, stored with the
prepare on every store."""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic

from intention_kernel import (
    Agent,
    Answer,
    CapabilityContext,
    CapabilityResult,
    Kernel,
    Principal,
    ReceiptStatus,
    capability,
)
from intention_kernel.durability import Durability
from intention_kernel.testing import ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent

CHARGE = "charge pi_1 500"
OPS = Principal("ops", "acme", "operator")


async def test_a_confirmed_write_records_capability_input_and_approver(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    await kernel.turn("t", "1", CHARGE, principal=Principal("ana", "acme"))
    await kernel.turn("t", "2", "yes", principal=OPS)
    [receipt] = await store.list_receipts(thread_id="t")
    assert receipt.capability_id == "payments.charge"
    assert receipt.input == {"payment_intent_id": "pi_1", "amount": 500}
    assert receipt.approved_by == ("ops",)


async def test_the_receipt_records_the_edited_input_that_ran(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    await kernel.turn("t", "1", CHARGE)
    edited = {"payment_intent_id": "pi_1", "amount": 450}
    await kernel.turn("t", "2", answer=Answer(input=edited, actor="ana"))
    [receipt] = await store.list_receipts(thread_id="t")
    assert (receipt.input, receipt.approved_by) == (edited, ("ana",))


async def test_a_quorums_receipt_names_every_approver(store: Durability) -> None:
    kernel = Kernel(billing_agent(FakeProvider(), approvals=2), store)
    await kernel.turn("t", "1", CHARGE)
    await kernel.turn("t", "2", answer=Answer(actor="ana"))
    await kernel.turn("t", "3", answer=Answer(actor="bob"))
    [receipt] = await store.list_receipts(thread_id="t")
    assert receipt.approved_by == ("ana", "bob")
    assert receipt.actor == "bob"


class Payout(pydantic.BaseModel):
    account: str
    amount: int
    card_number: str


def payout_agent(calls: list[str], redact: Any, confirmation: str = "required") -> Agent:
    @capability(
        "payouts.send",
        effect="write",
        confirmation=confirmation,  # type: ignore[arg-type]
        redact=redact,
    )
    async def send(input: Payout, ctx: CapabilityContext) -> CapabilityResult:
        """Send a payout."""

        def pay(authority: Any) -> str:
            calls.append(input.card_number)
            return "paid"

        effect = await ctx.run_effect(f"payout:{input.account}", pay)
        return CapabilityResult(value=effect.value)

    def interpret(request: Any) -> Any:
        from intention_kernel import Intent, Interpretation

        if request.message == "yes":
            return Interpretation(answer="accept")
        return Interpretation(
            intents=[
                Intent(
                    "payouts.send",
                    {"account": "acc_1", "amount": 70, "card_number": "4242424242424242"},
                )
            ]
        )

    return Agent("payouts", "1", [send], ScriptedInterpreter(interpret))


def mask(input: dict[str, Any]) -> dict[str, Any]:
    return {**input, "card_number": "****" + input["card_number"][-4:]}


async def test_redact_maps_the_input_before_the_receipt_stores_it(store: Durability) -> None:
    calls: list[str] = []
    kernel = Kernel(payout_agent(calls, mask), store)
    proposed = await kernel.turn("t", "1", "pay")
    assert proposed.interaction is not None
    assert proposed.interaction.input["card_number"] == "4242424242424242"  # what was shown
    done = await kernel.turn("t", "2", "yes")
    assert done.steps[0].status == "completed"
    assert calls == ["4242424242424242"]  # the write itself got the real input
    [receipt] = await store.list_receipts(thread_id="t")
    assert receipt.input == {"account": "acc_1", "amount": 70, "card_number": "****4242"}


async def test_a_redact_that_fails_runs_no_write(store: Durability) -> None:
    def broken(input: dict[str, Any]) -> Any:
        raise KeyError("vault")

    def not_json(input: dict[str, Any]) -> Any:
        return {"when": object()}

    for n, redact in enumerate((broken, not_json)):
        calls: list[str] = []
        kernel = Kernel(payout_agent(calls, redact), store)
        await kernel.turn(f"t{n}", "1", "pay")
        failed = await kernel.turn(f"t{n}", "2", "yes")
        [step] = failed.steps
        assert step.status == "failed" and "redact failed" in (step.error or "")
        assert calls == []
        assert await store.list_receipts(thread_id=f"t{n}") == []


async def test_a_write_that_needs_no_confirmation_names_no_approver(store: Durability) -> None:
    calls: list[str] = []
    kernel = Kernel(payout_agent(calls, None, confirmation="capability"), store)
    # A "capability" write that runs without asking: its receipt has no approvers.
    await kernel.turn("t", "1", "pay")
    [receipt] = await store.list_receipts(thread_id="t")
    assert receipt.capability_id == "payouts.send" and receipt.approved_by == ()
    assert receipt.input is not None and receipt.input["amount"] == 70


async def test_an_uncertain_receipt_keeps_what_its_write_was(store: Durability) -> None:
    provider = FakeProvider(behaviour={"pi_1": "lost_response"})
    kernel = Kernel(billing_agent(provider), store)
    await kernel.turn("t", "1", CHARGE)
    await kernel.turn("t", "2", answer=Answer(actor="ana"))
    [receipt] = await store.list_receipts(thread_id="t", status="uncertain")
    assert (receipt.capability_id, receipt.input, receipt.approved_by) == (
        "payments.charge",
        {"payment_intent_id": "pi_1", "amount": 500},
        ("ana",),
    )


async def test_resolving_not_applied_replaces_the_may_have_been_applied_error(
    store: Durability,
) -> None:
    provider = FakeProvider(behaviour={"pi_1": "lost_response"})
    kernel = Kernel(billing_agent(provider), store)
    await kernel.turn("t", "1", CHARGE)
    await kernel.turn("t", "2", "yes")
    [receipt] = await store.list_receipts(thread_id="t")
    assert receipt.status == ReceiptStatus.UNCERTAIN
    resolved = await store.resolve_receipt(
        "t", receipt.key, applied=False, note="no charge at the provider", actor="oscar"
    )
    for shown in (resolved, *(await store.list_receipts(thread_id="t"))):
        assert shown.status == ReceiptStatus.FAILED
        assert shown.error is not None and "may have been applied" not in shown.error
        assert "as not applied" in shown.error and "oscar" in shown.error
        assert shown.input == receipt.input


async def test_racing_accepts_store_one_receipt_with_its_approver(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    await kernel.turn("t", "1", CHARGE)
    await asyncio.gather(
        *(kernel.turn("t", f"a{n}", answer=Answer(actor=f"op{n}")) for n in range(6)),
        return_exceptions=True,
    )
    [receipt] = await store.list_receipts(thread_id="t")
    assert provider.calls() == 1
    assert receipt.approved_by == (receipt.actor,)
