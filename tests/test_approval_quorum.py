"""Quorums (issue 21): ``@capability(..., approvals=N)`` runs its operation once accepts
from N distinct actors are recorded, on every store."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from intention_kernel import (
    Agent,
    Answer,
    CapabilityContext,
    CompilationError,
    Kernel,
    TurnResult,
    capability,
)
from intention_kernel._checkpoint import decode_checkpoint, encode_checkpoint
from intention_kernel._replies import Replies
from intention_kernel.durability import Durability
from intention_kernel.testing import InMemoryDurability, ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import read_all_events

CHARGE = "charge pi_1 500"


async def events_of(store: Durability, thread_id: str, type: str) -> list[dict[str, Any]]:
    return [e.payload for e in await read_all_events(store, thread_id=thread_id) if e.type == type]


def accept(actor: str | None, **fields: Any) -> Answer:
    return Answer(None, "accept", actor=actor, **fields)


async def test_two_distinct_actors_run_the_operation_once(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvals=2), store)
    proposed = await kernel.turn("t", "1", CHARGE)
    shown = proposed.interaction
    assert shown is not None and (shown.approvals, shown.approved_by) == (2, ())

    first = await kernel.turn("t", "2", answer=accept("ana", digest=shown.digest))
    assert provider.calls() == 0
    assert first.interaction is not None
    assert (first.interaction.id, first.interaction.approved_by) == (shown.id, ("ana",))
    [held] = first.steps
    assert (held.step_id, held.status, held.error) == (
        proposed.steps[0].step_id,
        "awaiting_confirmation",
        None,
    )
    assert first.reply == Replies().approval_recorded(first.interaction)
    assert "ana" in first.reply and "1 more approval" in first.reply
    assert TurnResult.from_dict(first.to_dict()) == first
    assert first.to_dict()["interaction"]["approved_by"] == ["ana"]
    stored = await kernel.checkpoint("t")
    assert stored is not None and stored.interaction == first.interaction
    assert len(stored.agenda) == 1
    assert await events_of(store, "t", "interaction.approved") == [
        {
            "interaction_id": shown.id,
            "capability_id": "payments.charge",
            "step_id": held.step_id,
            "actor": "ana",
            "approved_by": ["ana"],
            "approvals": 2,
        }
    ]
    assert await events_of(store, "t", "interaction.resolved") == []

    second = await kernel.turn("t", "3", answer=accept("bob", digest=shown.digest))
    assert provider.calls() == 1
    [ran] = second.steps
    assert ran.status == "completed" and ran.step_id == held.step_id
    assert second.interaction is None
    [resolved] = await events_of(store, "t", "interaction.resolved")
    assert resolved["resolution"] == "accepted"
    assert (resolved["actor"], resolved["approved_by"]) == ("bob", ["ana", "bob"])
    # Delivered again, each accept is a replay: nothing counts or runs twice.
    assert await kernel.turn("t", "3", answer=accept("bob", digest=shown.digest)) == (
        dataclasses.replace(second, replayed=True)
    )
    assert await kernel.turn("t", "2", answer=accept("ana", digest=shown.digest)) == (
        dataclasses.replace(first, replayed=True)
    )
    assert provider.calls() == 1
    after = await kernel.checkpoint("t")
    assert after is not None and after.interaction is None and after.agenda == ()


async def test_the_same_actor_twice_counts_once(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvals=2), store)
    await kernel.turn("t", "1", CHARGE)
    first = await kernel.turn("t", "2", answer=accept("ana"))
    again = await kernel.turn("t", "3", answer=accept("ana"))
    assert provider.calls() == 0
    assert again.interaction == first.interaction
    [step] = again.steps
    assert step.status == "awaiting_confirmation"
    assert step.error is not None and "'ana' has already approved" in step.error
    assert first.interaction is not None
    assert again.reply == Replies().approval_refused(first.interaction, step)
    assert len(await events_of(store, "t", "interaction.approved")) == 1
    stored = await kernel.checkpoint("t")
    assert stored is not None and stored.interaction == first.interaction
    # Another person completes it.
    await kernel.turn("t", "4", answer=accept("bob"))
    assert provider.calls() == 1


async def test_an_accept_without_an_actor_does_not_count(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvals=2), store)
    proposed = await kernel.turn("t", "1", CHARGE)
    # An interpreter's "yes" names no one; nor does a bare structured accept.
    for turn_id, message, answer in (("2", "yes", None), ("3", None, "accept")):
        refused = await kernel.turn("t", turn_id, message, answer)
        [step] = refused.steps
        assert step.status == "awaiting_confirmation"
        assert step.error is not None and "names no actor" in step.error
        assert refused.interaction == proposed.interaction
    assert provider.calls() == 0
    assert await events_of(store, "t", "interaction.approved") == []
    await kernel.turn("t", "4", answer=accept("ana"))
    await kernel.turn("t", "5", answer=accept("bob"))
    assert provider.calls() == 1


async def test_one_reject_after_an_accept_closes_it_and_runs_nothing(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvals=2), store)
    await kernel.turn("t", "1", CHARGE)
    await kernel.turn("t", "2", answer=accept("ana"))
    rejected = await kernel.turn(
        "t", "3", answer=Answer(None, "reject", actor="bob", reason="too much")
    )
    assert rejected.interaction is None and rejected.steps[0].status == "rejected"
    [resolved] = await events_of(store, "t", "interaction.resolved")
    assert resolved["resolution"] == "rejected"
    assert (resolved["actor"], resolved["approved_by"]) == ("bob", ["ana"])
    late = await kernel.turn("t", "4", answer=accept("carol"))
    assert late.reply == Replies().nothing_pending()
    assert provider.calls() == 0
    stored = await kernel.checkpoint("t")
    assert stored is not None and stored.interaction is None and stored.agenda == ()


async def test_an_edit_is_refused_on_a_quorum(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvals=2), store)
    await kernel.turn("t", "1", CHARGE)
    first = await kernel.turn("t", "2", answer=accept("ana"))
    edited = {"payment_intent_id": "pi_1", "amount": 300}
    refused = await kernel.turn("t", "3", answer=accept("bob", input=edited))
    [step] = refused.steps
    assert step.status == "awaiting_confirmation"
    assert step.error is not None and "cannot be edited" in step.error
    assert refused.interaction == first.interaction  # bob was not counted
    done = await kernel.turn("t", "4", answer=accept("bob"))
    assert provider.calls() == 1 and done.steps[0].value["amount"] == 500


async def test_every_accept_of_a_quorum_is_bound_to_the_digest(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvals=2), store)
    proposed = await kernel.turn("t", "1", CHARGE)
    assert proposed.interaction is not None
    first = await kernel.turn("t", "2", answer=accept("ana", digest=proposed.interaction.digest))
    assert first.interaction is not None
    wrong = await kernel.turn("t", "3", answer=accept("bob", digest="0" * 64))
    assert wrong.reply == Replies().request_changed(first.interaction)
    assert wrong.interaction == first.interaction and provider.calls() == 0
    wrong_first = await kernel.turn("u", "1", CHARGE)
    assert wrong_first.interaction is not None
    refused = await kernel.turn("u", "2", answer=accept("ana", digest="0" * 64))
    assert refused.interaction == wrong_first.interaction  # not counted
    assert provider.calls() == 0


async def test_the_deadline_holds_for_the_second_accept(store: Durability) -> None:
    now = [datetime(2026, 12, 2, 9, 0, tzinfo=UTC)]
    provider = FakeProvider()
    kernel = Kernel(
        billing_agent(provider, approvals=2, confirm_within=timedelta(minutes=15)),
        store,
        clock=lambda: now[0],
    )
    await kernel.turn("t", "1", CHARGE)
    first = await kernel.turn("t", "2", answer=accept("ana"))
    assert first.interaction is not None
    now[0] += timedelta(minutes=15)
    late = await kernel.turn("t", "3", answer=accept("bob"))
    assert provider.calls() == 0 and late.interaction is None
    assert late.reply == Replies().expired(first.interaction)
    assert late.steps[0].status == "rejected"
    assert len(await events_of(store, "t", "interaction.expired")) == 1
    assert await events_of(store, "t", "interaction.resolved") == []


async def test_a_redeploy_raises_a_pending_quorum_but_never_lowers_it(store: Durability) -> None:
    provider = FakeProvider()
    asked_for_one = await Kernel(billing_agent(provider), store).turn("t", "1", CHARGE)
    assert asked_for_one.interaction is not None and asked_for_one.interaction.approvals == 1
    raised = Kernel(billing_agent(provider, approvals=2), store)
    first = await raised.turn("t", "2", answer=accept("ana"))
    assert provider.calls() == 0
    assert first.interaction is not None and first.interaction.approvals == 2
    # Back to one approval: the pending interaction still needs two.
    lowered = Kernel(billing_agent(provider), store)
    again = await lowered.turn("t", "3", answer=accept("ana"))
    assert provider.calls() == 0 and again.interaction == first.interaction
    await lowered.turn("t", "4", answer=accept("bob"))
    assert provider.calls() == 1


async def test_one_approval_is_unchanged(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    await kernel.turn("t", "1", CHARGE)
    await kernel.turn("t", "2", "yes")  # no actor needed
    assert provider.calls() == 1
    [resolved] = await events_of(store, "t", "interaction.resolved")
    assert "approved_by" not in resolved
    assert await events_of(store, "t", "interaction.approved") == []


def test_an_older_checkpoint_reads_as_one_approval_and_no_approvers() -> None:
    from intention_kernel import Interaction, KernelCheckpoint

    interaction = Interaction("ix_1", "confirmation", "payments.charge", {"amount": 5}, "?")
    document = json.loads(encode_checkpoint(KernelCheckpoint(1, "fp", 1, interaction=interaction)))
    del document["interaction"]["approvals"], document["interaction"]["approved_by"]
    decoded = decode_checkpoint(json.dumps(document))
    assert decoded.interaction is not None
    assert (decoded.interaction.approvals, decoded.interaction.approved_by) == (1, ())
    assert decoded.interaction == interaction


@pytest.mark.parametrize("approvals", [0, -1, True, 2.0, "2"])
def test_a_bad_approvals_is_refused_at_compilation(approvals: Any) -> None:
    @capability("a.write", effect="write", approvals=approvals)
    async def write(input: dict[str, Any], ctx: CapabilityContext) -> None:
        return None

    with pytest.raises(CompilationError, match="approvals must be a positive int"):
        Kernel(Agent("a", "1", [write], ScriptedInterpreter({})), InMemoryDurability())


@pytest.mark.parametrize("confirmation", ["capability", "none"])
def test_a_quorum_needs_a_held_operation(confirmation: Any) -> None:
    @capability("a.read", confirmation=confirmation, approvals=2)
    async def read(input: dict[str, Any], ctx: CapabilityContext) -> None:
        return None

    with pytest.raises(CompilationError, match="approvals=2 needs confirmation='required'"):
        Kernel(Agent("a", "1", [read], ScriptedInterpreter({})), InMemoryDurability())
