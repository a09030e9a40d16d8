"""Who may approve (issue 31, section 1): a turn's principal answers as itself, and a
capability's approver policy decides whose answers count, on every store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from intention_kernel import (
    Answer,
    CompilationError,
    InvalidRequestError,
    Kernel,
    Principal,
    StepStatus,
)
from intention_kernel._checkpoint import Interaction
from intention_kernel._replies import Replies
from intention_kernel.durability import Durability
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import read_all_events

CHARGE = "charge pi_1 500"
ANA = Principal("ana@acme.example", "acme")
BOB = Principal("bob@acme.example", "acme", "operator")
OPS = Principal("ops@acme.example", "acme", "operator")


async def events_of(store: Durability, thread_id: str, type: str) -> list[dict[str, Any]]:
    return [e.payload for e in await read_all_events(store, thread_id=thread_id) if e.type == type]


def test_principal_is_the_hosts_class_and_checks_its_fields() -> None:
    from intention_kernel.host import Principal as HostPrincipal

    assert HostPrincipal is Principal
    assert Principal("ana") == Principal("ana", None, "user")
    with pytest.raises(InvalidRequestError, match="needs a name"):
        Principal(" ")
    with pytest.raises(InvalidRequestError, match="'user' or 'operator'"):
        Principal("ana", "acme", "root")  # type: ignore[arg-type]


async def test_a_yes_read_from_a_message_names_the_principal_everywhere(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    await kernel.turn("t", "1", CHARGE, principal=ANA)
    done = await kernel.turn("t", "2", "yes", principal=BOB)
    [step] = done.steps
    assert step.status == "completed" and provider.calls() == 1
    assert step.actor == BOB.name
    [receipt] = await store.list_receipts(thread_id="t")
    assert receipt.actor == BOB.name and receipt.tenant_id == "acme"
    [resolved] = await events_of(store, "t", "interaction.resolved")
    assert resolved["actor"] == BOB.name
    [completed] = await events_of(store, "t", "effect.completed")
    assert completed["actor"] == BOB.name


async def test_the_principal_overrides_an_actor_the_interpreter_wrote(
    store: Durability,
) -> None:
    from intention_kernel import Intent, Interpretation
    from intention_kernel.testing import ScriptedInterpreter

    provider = FakeProvider()

    def interpret(request: Any) -> Interpretation:
        if request.message == "yes":
            return Interpretation(answer=Answer(None, "accept", actor="the model"))
        return Interpretation(
            intents=[Intent("payments.charge", {"payment_intent_id": "pi_1", "amount": 5})]
        )

    kernel = Kernel(billing_agent(provider, interpreter=ScriptedInterpreter(interpret)), store)
    await kernel.turn("t", "1", CHARGE, principal=ANA)
    done = await kernel.turn("t", "2", "yes", principal=BOB)
    assert done.steps[0].actor == BOB.name
    [receipt] = await store.list_receipts(thread_id="t")
    assert receipt.actor == BOB.name


async def test_the_principals_tenant_is_the_turns_and_a_conflict_is_refused(
    store: Durability,
) -> None:
    kernel = Kernel(billing_agent(FakeProvider()), store)
    with pytest.raises(InvalidRequestError, match="differs from the principal's tenant"):
        await kernel.turn("t", "1", "balance", tenant_id="globex", principal=ANA)
    with pytest.raises(InvalidRequestError, match="differs from the principal's tenant"):
        await kernel.turn("t", "1", "balance", principal=Principal("ana"), tenant_id="acme")
    with pytest.raises(InvalidRequestError, match="must be a Principal"):
        await kernel.turn("t", "1", "balance", principal="ana")  # type: ignore[arg-type]
    assert await store.load_checkpoint("t") is None
    assert await store.list_receipts(thread_id="t") == []
    await kernel.turn("t", "1", "balance", principal=ANA)
    [committed] = await events_of(store, "t", "turn.committed")
    owner = await store.thread_owner("t")  # type: ignore[attr-defined]
    assert owner is not None and owner.tenant_id == "acme"
    assert committed is not None


async def test_a_principal_answers_only_as_itself(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    await kernel.turn("t", "1", CHARGE, principal=ANA)
    with pytest.raises(InvalidRequestError, match="answers only as itself"):
        await kernel.turn("t", "2", answer=Answer(actor="mallory"), principal=BOB)
    assert provider.calls() == 0
    done = await kernel.turn("t", "2", answer="accept", principal=BOB)
    assert done.steps[0].actor == BOB.name and provider.calls() == 1


async def test_an_operator_only_write_refuses_a_users_yes_and_stays_open(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvers="operator"), store)
    proposed = await kernel.turn("t", "1", CHARGE, principal=ANA)
    shown = proposed.interaction
    assert shown is not None
    assert shown.who_may_answer == "a principal with the role 'operator'"
    for turn_id, message in (("2", "yes"), ("3", "no")):
        refused = await kernel.turn("t", turn_id, message, principal=ANA)
        assert provider.calls() == 0
        assert refused.interaction == shown
        [held] = refused.steps
        assert held.status == StepStatus.AWAITING_CONFIRMATION
        assert held.error is not None and "is not an approver" in held.error
        cap = kernel.agent.capabilities[1]
        assert refused.reply == Replies().answer_not_allowed(shown, cap, held)
        assert "role 'operator'" in refused.reply
    assert await events_of(store, "t", "interaction.resolved") == []
    done = await kernel.turn("t", "4", "yes", principal=OPS)
    assert done.steps[0].status == "completed" and provider.calls() == 1


async def test_an_answer_naming_no_one_is_refused_by_any_policy(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvers="user"), store)
    await kernel.turn("t", "1", CHARGE)
    refused = await kernel.turn("t", "2", "yes")
    assert provider.calls() == 0 and refused.interaction is not None
    assert "names no one" in (refused.steps[0].error or "")
    # An actor without a principal is a user of the turn's tenant, as before principals.
    done = await kernel.turn("t", "3", answer=Answer(actor="ana"))
    assert done.steps[0].status == "completed" and provider.calls() == 1


async def test_a_callable_policy_decides_and_one_that_raises_refuses(store: Durability) -> None:
    seen: list[tuple[str, str]] = []

    def on_call(principal: Principal, interaction: Interaction) -> bool:
        """The on-call engineer."""
        seen.append((principal.name, interaction.capability_id))
        if principal.name == "broken":
            raise RuntimeError("directory down")
        return principal.name == "oncall"

    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvers=on_call), store)
    opened = await kernel.turn("t", "1", CHARGE, principal=ANA)
    assert opened.interaction is not None
    assert opened.interaction.who_may_answer == "The on-call engineer"
    refused = await kernel.turn("t", "2", "yes", principal=Principal("broken", "acme"))
    assert "RuntimeError: directory down" in (refused.steps[0].error or "")
    refused = await kernel.turn("t", "3", "yes", principal=Principal("ana", "acme", "operator"))
    assert "is not an approver" in (refused.steps[0].error or "")
    assert provider.calls() == 0
    await kernel.turn("t", "4", "yes", principal=Principal("oncall", "acme"))
    assert provider.calls() == 1
    assert seen == [
        ("broken", "payments.charge"),
        ("ana", "payments.charge"),
        ("oncall", "payments.charge"),
    ]


async def test_self_approval_false_refuses_the_proposers_accept_as_a_principal(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, self_approval=False), store)
    proposed = await kernel.turn("t", "1", CHARGE, principal=ANA)
    assert proposed.interaction is not None
    assert proposed.interaction.proposed_by == ANA.name
    # The same person under another spelling is the same principal.
    for turn_id, who in (("2", ANA), ("3", Principal(" ANA@acme.example", "acme"))):
        refused = await kernel.turn("t", turn_id, "yes", principal=who)
        assert provider.calls() == 0 and refused.interaction == proposed.interaction
        assert "may not approve it" in (refused.steps[0].error or "")
        assert "other than the person who proposed it" in refused.reply
    done = await kernel.turn("t", "4", "yes", principal=BOB)
    assert done.steps[0].status == "completed" and provider.calls() == 1


async def test_the_proposer_may_still_withdraw_their_request(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, self_approval=False), store)
    await kernel.turn("t", "1", CHARGE, principal=ANA)
    withdrawn = await kernel.turn("t", "2", "no", principal=ANA)
    assert withdrawn.steps[0].status == "rejected" and withdrawn.interaction is None
    assert provider.calls() == 0


async def test_self_approval_false_refuses_an_accept_of_an_unnamed_proposal(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, self_approval=False), store)
    await kernel.turn("t", "1", CHARGE)  # no principal: the proposer is unknown
    refused = await kernel.turn("t", "2", "yes", principal=Principal("bob", None, "operator"))
    assert provider.calls() == 0 and refused.interaction is not None
    assert "proposed by no named principal" in (refused.steps[0].error or "")


async def test_a_capability_that_confirms_on_its_own_takes_the_policy(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvers="operator"), store)
    await kernel.turn("t", "1", "charge pi_1 500 and yes", principal=OPS)
    asked = await kernel.turn("t", "2", "refund pi_1 100", principal=ANA)
    assert asked.interaction is not None and asked.interaction.kind == "capability"
    refused = await kernel.turn("t", "3", "yes", principal=ANA)
    assert refused.interaction is not None and provider.calls() == 0
    done = await kernel.turn("t", "4", "yes", principal=OPS)
    assert done.reply == "Refunded 100." and provider.calls() == 1


async def test_quorum_approvers_are_compared_as_principals(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvals=2), store)
    await kernel.turn("t", "1", CHARGE)
    first = await kernel.turn("t", "2", answer=Answer(actor="ana"))
    assert first.interaction is not None and first.interaction.approved_by == ("ana",)
    for turn_id, spelling in (("3", "ana "), ("4", "Ana"), ("5", "\uff41\uff4e\uff41")):
        again = await kernel.turn("t", turn_id, answer=Answer(actor=spelling))
        assert again.interaction is not None
        assert again.interaction.approved_by == ("ana",), spelling
        assert "already approved" in (again.steps[0].error or "")
    assert provider.calls() == 0
    await kernel.turn("t", "6", answer=Answer(actor="bob"))
    assert provider.calls() == 1


async def test_each_quorum_approver_must_be_allowed(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvals=2, approvers="operator"), store)
    await kernel.turn("t", "1", CHARGE, principal=ANA)
    await kernel.turn("t", "2", "yes", principal=OPS)
    refused = await kernel.turn("t", "3", "yes", principal=ANA)
    assert refused.interaction is not None
    assert refused.interaction.approved_by == (OPS.name,)
    assert provider.calls() == 0
    done = await kernel.turn("t", "4", "yes", principal=BOB)
    assert done.steps[0].status == "completed" and provider.calls() == 1
    [resolved] = await events_of(store, "t", "interaction.resolved")
    assert resolved["approved_by"] == [OPS.name, BOB.name]


async def test_racing_final_approvals_run_once_and_only_allowed_ones_count(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = Kernel(
        billing_agent(provider, approvals=2, approvers="operator", self_approval=False), store
    )
    proposer = Principal("carol", "acme", "operator")
    await kernel.turn("t", "1", CHARGE, principal=proposer)
    await kernel.turn("t", "2", "yes", principal=OPS)
    racers = [
        Principal("ana", "acme"),  # a user: not an approver
        proposer,  # the proposer: may not approve
        Principal("ops@acme.example ", "acme", "operator"),  # counted already
        *(Principal(f"op{n}", "acme", "operator") for n in range(5)),
    ]
    results = await asyncio.gather(
        *(kernel.turn("t", f"race-{n}", "yes", principal=who) for n, who in enumerate(racers))
    )
    assert provider.calls() == 1
    ran = [r for r in results if r.steps and r.steps[0].status == "completed"]
    assert len(ran) == 1 and ran[0].steps[0].actor in {f"op{n}" for n in range(5)}
    [resolved] = await events_of(store, "t", "interaction.resolved")
    assert resolved["approved_by"][0] == OPS.name
    assert resolved["approved_by"][1] == ran[0].steps[0].actor


async def test_stream_turn_takes_the_principal(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvers="operator"), store)
    await kernel.turn("t", "1", CHARGE, principal=ANA)
    events = [e async for e in kernel.stream_turn("t", "2", "yes", principal=ANA)]
    assert events[-1].type == "result" and provider.calls() == 0
    events = [e async for e in kernel.stream_turn("t", "3", "yes", principal=OPS)]
    assert events[-1].data["steps"][0]["actor"] == OPS.name and provider.calls() == 1


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"approvers": "admin"}, "unknown roles"),
        ({"approvers": {"operator", "root"}}, "unknown roles"),
        ({"approvers": 7}, "approvers must be None"),
        ({"approvers": []}, "approvers must be None"),
        ({"self_approval": "no"}, "self_approval must be True or False"),
    ],
)
def test_a_bad_policy_is_refused_at_compilation(fields: dict[str, Any], problem: str) -> None:
    from intention_kernel import CapabilityContext, capability
    from intention_kernel.testing import InMemoryDurability

    @capability("payments.charge", effect="write", **fields)
    async def charge(input: dict[str, Any], ctx: CapabilityContext) -> None:
        return None

    agent = billing_agent(FakeProvider())
    bad = type(agent)(
        name="billing", version="1", capabilities=[charge], interpreter=agent.interpreter
    )
    with pytest.raises(CompilationError, match=problem):
        Kernel(bad, InMemoryDurability())


def test_a_policy_on_a_capability_that_never_asks_is_refused() -> None:
    from intention_kernel import CapabilityContext, capability
    from intention_kernel.testing import InMemoryDurability

    @capability("billing.lookup", approvers="operator")
    async def lookup(input: dict[str, Any], ctx: CapabilityContext) -> None:
        return None

    agent = billing_agent(FakeProvider())
    bad = type(agent)(
        name="billing", version="1", capabilities=[lookup], interpreter=agent.interpreter
    )
    with pytest.raises(CompilationError, match="needs a confirmation to answer"):
        Kernel(bad, InMemoryDurability())


async def test_a_request_a_resumed_operation_asks_next_is_still_its_proposers(
    store: Durability,
) -> None:
    """A later round of an answering turn continues the operation it resumed (a
    bridge's run asks its next approval so): the approver does not become the
    proposer, so the customer cannot approve the follow-up of their own request."""
    from intention_kernel import Agent, Intent, Interpretation
    from intention_kernel.testing import ScriptedInterpreter

    provider = FakeProvider()

    def interpret(request: Any) -> Interpretation:
        if request.rounds:
            last = request.rounds[-1]
            if last.answer_step is not None and last.answer_step.status == "completed":
                follow = {"payment_intent_id": "pi_2", "amount": 7}
                return Interpretation(intents=[Intent("payments.charge", follow)])
            return Interpretation()
        if request.message == "yes":
            return Interpretation(answer="accept")
        return Interpretation(
            intents=[Intent("payments.charge", {"payment_intent_id": "pi_1", "amount": 5})]
        )

    scripted = ScriptedInterpreter(interpret)
    scripted.multi_round = True
    base = billing_agent(provider, self_approval=False)
    agent = Agent(
        name="billing",
        version="1",
        capabilities=base.capabilities,
        interpreter=scripted,
        max_rounds=3,
    )
    kernel = Kernel(agent, store)
    await kernel.turn("t", "1", "charge", principal=ANA)
    resumed = await kernel.turn("t", "2", "yes", principal=BOB)
    assert provider.calls() == 1
    follow_up = resumed.interaction
    assert follow_up is not None and follow_up.input["payment_intent_id"] == "pi_2"
    assert follow_up.proposed_by == ANA.name
    refused = await kernel.turn("t", "3", "yes", principal=ANA)
    assert refused.interaction == follow_up and provider.calls() == 1


async def test_an_actor_the_interpreter_wrote_never_passes_a_policy(store: Durability) -> None:
    """Without a principal, only the caller's own answer names its actor: a model
    that writes ``Answer(actor="oncall")`` (a prompt injection, say) is no one."""
    from intention_kernel import Intent, Interpretation
    from intention_kernel.testing import ScriptedInterpreter

    def interpret(request: Any) -> Interpretation:
        if request.message == "yes":
            return Interpretation(answer=Answer(None, "accept", actor="oncall"))
        return Interpretation(
            intents=[Intent("payments.charge", {"payment_intent_id": "pi_1", "amount": 5})]
        )

    def on_call(principal: Principal, interaction: Interaction) -> bool:
        return principal.name == "oncall"

    provider = FakeProvider()
    agent = billing_agent(provider, approvers=on_call, interpreter=ScriptedInterpreter(interpret))
    kernel = Kernel(agent, store)
    await kernel.turn("t", "1", "charge")
    refused = await kernel.turn("t", "2", "yes")
    assert provider.calls() == 0 and refused.interaction is not None
    assert "names no one" in (refused.steps[0].error or "")
    await kernel.turn("t", "3", answer=Answer(actor="oncall"))
    assert provider.calls() == 1


async def test_a_quorum_never_counts_actors_the_interpreter_wrote(store: Durability) -> None:
    from intention_kernel import Intent, Interpretation
    from intention_kernel.testing import ScriptedInterpreter

    def interpret(request: Any) -> Interpretation:
        if request.message.startswith("yes from "):
            actor = request.message.removeprefix("yes from ")
            return Interpretation(answer=Answer(None, "accept", actor=actor))
        return Interpretation(
            intents=[Intent("payments.charge", {"payment_intent_id": "pi_1", "amount": 5})]
        )

    provider = FakeProvider()
    agent = billing_agent(provider, approvals=2, interpreter=ScriptedInterpreter(interpret))
    kernel = Kernel(agent, store)
    await kernel.turn("t", "1", "charge")
    for turn_id, who in (("2", "ana"), ("3", "bob")):
        refused = await kernel.turn("t", turn_id, f"yes from {who}")
        assert refused.interaction is not None and refused.interaction.approved_by == ()
        assert "names no actor" in (refused.steps[0].error or "")
    assert provider.calls() == 0
