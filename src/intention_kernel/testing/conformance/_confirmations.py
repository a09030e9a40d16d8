"""Confirmations and interactions, as every adapter must store them.

A required write waits for its answer, across restarts of the adapter.
Open interactions are listed by owner, so a host can show each its queue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from intention_kernel import _checkpoint as checkpoint_codec
from intention_kernel._agent import Agent
from intention_kernel._capabilities import CapabilityContext, CapabilityResult, capability
from intention_kernel._interpretation import (
    Answer,
    Intent,
    Interpretation,
    InterpretationRequest,
)
from intention_kernel._kernel import Kernel
from intention_kernel._turns import StepStatus, TurnCommit, TurnScope
from intention_kernel.durability import Durability, TurnTransaction
from intention_kernel.durability.abc import InteractionQueue, ThreadOwner
from intention_kernel.errors import (
    CorruptRecordError,
    InterpretationError,
    InvalidRequestError,
)
from intention_kernel.testing._agents import FakeProvider, billing_agent
from intention_kernel.testing._scripted import ScriptedInterpreter
from intention_kernel.testing.conformance._support import (
    ConformanceCase,
    Tamper,
    commit_for,
    payloads,
)

__all__ = ["ConfirmationConformance"]


class ConfirmationConformance(ConformanceCase):
    """Subclass and provide ``make_durability``; see :mod:`intention_kernel.testing.conformance`."""

    # =========================================================================================
    # Confirmation
    # =========================================================================================

    async def test_a_required_write_is_not_executed_in_the_proposing_turn(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        result = await kernel.turn("t", "1", "charge pi_1 500")
        assert provider.calls() == 0
        assert result.steps[0].status == StepStatus.AWAITING_CONFIRMATION
        interaction = result.interaction
        assert interaction is not None and interaction.kind == "confirmation"
        assert interaction.capability_id == "payments.charge"
        assert interaction.input == {"payment_intent_id": "pi_1", "amount": 500}
        assert interaction.prompt == "Charge 500 to pi_1?" and interaction.prompt in result.reply
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.interaction == interaction
        [item] = checkpoint.agenda
        assert item.interaction_id == interaction.id and item.input == interaction.input
        assert await durability.list_receipts() == []

    async def test_an_accepted_answer_runs_exactly_the_stored_operation(
        self, kernel: Kernel, provider: FakeProvider
    ) -> None:
        proposed = await kernel.turn("t", "1", "charge pi_1 500")
        assert proposed.interaction is not None
        accepted = await kernel.turn("t", "2", answer=Answer(proposed.interaction.id, "accept"))
        [step] = accepted.steps
        assert step.status == StepStatus.COMPLETED
        assert step.step_id == proposed.steps[0].step_id
        assert step.value["amount"] == 500
        assert accepted.interaction is None and provider.calls() == 1

    async def test_a_rejected_answer_cancels_the_operation(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        await kernel.turn("t", "1", "charge pi_1 500")
        rejected = await kernel.turn("t", "2", "no")
        assert rejected.steps[0].status == "rejected"
        assert rejected.interaction is None and provider.calls() == 0
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.agenda == () and checkpoint.interaction is None
        again = await kernel.turn("t", "3", "yes")
        assert again.steps == () and provider.calls() == 0

    async def test_an_unrelated_question_is_answered_while_confirmation_is_pending(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        proposed = await kernel.turn("t", "1", "charge pi_1 500")
        question = await kernel.turn("t", "2", "balance 99")
        assert question.steps[0].status == StepStatus.COMPLETED
        assert question.interaction == proposed.interaction
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None
        assert checkpoint.interaction == proposed.interaction and len(checkpoint.agenda) == 1
        assert checkpoint.facts["balance"].value == 99
        accepted = await kernel.turn("t", "3", "yes")
        assert accepted.steps[0].status == StepStatus.COMPLETED and provider.calls() == 1

    async def test_an_answer_naming_another_interaction_runs_nothing(
        self, kernel: Kernel, provider: FakeProvider
    ) -> None:
        proposed = await kernel.turn("t", "1", "charge pi_1 500")
        refused = await kernel.turn("t", "2", answer=Answer("ix_other", "accept"))
        assert refused.steps == () and provider.calls() == 0
        # The person is shown the question still waiting, not interaction IDs.
        assert "nothing was done" in refused.reply and "ix_other" not in refused.reply
        assert proposed.interaction is not None
        assert proposed.interaction.prompt in refused.reply
        assert refused.interaction == proposed.interaction

    async def test_an_answer_with_nothing_pending_runs_nothing(
        self, kernel: Kernel, provider: FakeProvider
    ) -> None:
        result = await kernel.turn("t", "1", "yes and balance")
        assert result.steps == () and "nothing" in result.reply.lower()
        assert provider.calls() == 0

    async def test_a_new_required_write_supersedes_the_pending_one(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        first = await kernel.turn("t", "1", "charge pi_1 500")
        second = await kernel.turn("t", "2", "charge pi_2 700")
        assert first.interaction is not None and second.interaction is not None
        assert second.interaction.id != first.interaction.id
        resolved = await payloads(durability, "t", "interaction.resolved")
        assert resolved == [
            {
                "interaction_id": first.interaction.id,
                "capability_id": "payments.charge",
                "step_id": first.steps[0].step_id,
                "resolution": "superseded",
            }
        ]
        await kernel.turn("t", "3", "yes")
        assert provider.ledger == ["payments.charge:charge:pi_2"]

    async def test_a_rejection_records_its_reason_and_actor_and_runs_nothing(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        first = await kernel.turn("t", "1", "charge pi_1 500")
        assert first.interaction is not None
        answer = Answer(None, "reject", reason="the amount is wrong", actor="ana")
        result = await kernel.turn("t", "2", answer=answer)
        assert provider.calls() == 0
        assert [(s.status, s.error) for s in result.steps] == [
            (StepStatus.REJECTED, "rejected by the person: the amount is wrong")
        ]
        resolved = await payloads(durability, "t", "interaction.resolved")
        assert resolved == [
            {
                "interaction_id": first.interaction.id,
                "capability_id": "payments.charge",
                "step_id": first.steps[0].step_id,
                "resolution": "rejected",
                "actor": "ana",
                "reason": "the amount is wrong",
            }
        ]

    async def test_an_accepting_actor_is_on_the_resolution_and_the_effect_events(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", answer=Answer(None, "accept", actor="ana"))
        await kernel.turn("t", "3", "charge pi_2 300")
        await kernel.turn("t", "4", "yes")
        assert provider.ledger == ["payments.charge:charge:pi_1", "payments.charge:charge:pi_2"]
        events = await durability.read_outbox(thread_id="t")
        resolved = [e.payload.get("actor") for e in events if e.type == "interaction.resolved"]
        effects = [
            (e.payload["key"], e.payload.get("actor"))
            for e in events
            if e.type.startswith("effect.")
        ]
        assert resolved == ["ana", None]
        assert effects == [
            ("payments.charge:charge:pi_1", "ana"),
            ("payments.charge:charge:pi_2", None),
        ]

    async def test_the_accepting_actor_is_recorded_on_the_receipt_of_the_write(
        self, make_durability: Callable[[], Durability], provider: FakeProvider
    ) -> None:
        """``Receipt.actor`` is who approved the write; one approved by no one named has none.

        The stored receipt reads back the same through a new adapter.
        """
        async with make_durability() as durability:
            kernel = Kernel(billing_agent(provider), durability)
            await kernel.turn("t", "1", "charge pi_1 500")
            await kernel.turn("t", "2", answer=Answer(None, "accept", actor="ana"))
            await kernel.turn("t", "3", "charge pi_2 300")
            await kernel.turn("t", "4", "yes")
            receipts = await durability.list_receipts(thread_id="t")
            assert [(r.key, r.actor) for r in receipts] == [
                ("payments.charge:charge:pi_1", "ana"),
                ("payments.charge:charge:pi_2", None),
            ]
            if not self.persistent:
                return
        async with make_durability() as reopened:
            assert await reopened.list_receipts(thread_id="t") == receipts

    async def test_a_retried_write_names_the_approver_of_its_new_attempt(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        """A failed write approved again by someone else runs again on the same receipt.

        The write failed without being applied, so it may run again.
        The receipt then names the second approver, who let it run.
        """
        provider.behaviour["pi_1"] = "not_applied"
        await kernel.turn("t", "1", "charge pi_1 500")
        failed = await kernel.turn("t", "2", answer=Answer(None, "accept", actor="ana"))
        assert [s.status for s in failed.steps] == [StepStatus.FAILED]
        [first] = await durability.list_receipts(thread_id="t")
        assert (first.status, first.attempt, first.actor) == ("failed", 1, "ana")
        del provider.behaviour["pi_1"]
        await kernel.turn("t", "3", "charge pi_1 500")
        await kernel.turn("t", "4", answer=Answer(None, "accept", actor="bob"))
        [second] = await durability.list_receipts(thread_id="t")
        assert (second.status, second.attempt, second.actor) == ("completed", 2, "bob")
        assert second.id == first.id and provider.ledger == ["payments.charge:charge:pi_1"]

    async def test_an_answer_with_another_operations_digest_runs_nothing(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        from intention_kernel._checkpoint import operation_digest

        first = await kernel.turn("t", "1", "charge pi_1 500")
        shown = first.interaction
        assert shown is not None
        assert shown.digest == operation_digest("confirmation", "payments.charge", shown.input)
        other = operation_digest("confirmation", "payments.charge", {**shown.input, "amount": 9})
        refused = await kernel.turn("t", "2", answer=Answer(shown.id, "accept", digest=other))
        assert provider.calls() == 0 and refused.steps == ()
        assert "changed since it was shown" in refused.reply
        assert refused.interaction == shown
        stored = await durability.load_checkpoint("t")
        assert stored is not None and stored.interaction == shown
        accepted = await kernel.turn(
            "t", "3", answer=Answer(shown.id, "accept", digest=shown.digest)
        )
        assert [s.status for s in accepted.steps] == [StepStatus.COMPLETED]
        assert provider.ledger == ["payments.charge:charge:pi_1"]
        replayed = await kernel.turn(
            "t", "3", answer=Answer(shown.id, "accept", digest=shown.digest)
        )
        assert replayed.replayed and provider.ledger == ["payments.charge:charge:pi_1"]

    async def test_replaying_the_accepting_turn_runs_nothing_again(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", "yes")
        events = await durability.read_outbox()
        for _ in range(3):
            assert (await kernel.turn("t", "2", "yes")).replayed
        assert provider.calls() == 1 and await durability.read_outbox() == events

    async def test_a_pending_confirmation_survives_a_restart(
        self, make_durability: Callable[[], Durability], provider: FakeProvider
    ) -> None:
        if not self.persistent:
            pytest.skip("this adapter keeps no state across instances")
        async with make_durability() as before:
            proposed = await Kernel(billing_agent(provider), before).turn(
                "t", "1", "charge pi_1 500"
            )
        async with make_durability() as after:
            kernel = Kernel(billing_agent(provider), after)
            accepted = await kernel.turn("t", "2", "yes")
            assert accepted.steps[0].step_id == proposed.steps[0].step_id
            assert accepted.steps[0].status == StepStatus.COMPLETED
            assert (await kernel.turn("t", "2", "yes")).replayed
        assert provider.calls() == 1

    async def test_a_quorums_approvals_survive_a_restart_and_count_distinct_actors(
        self, make_durability: Callable[[], Durability], provider: FakeProvider
    ) -> None:
        """``approvals=2`` needs two different actors before the operation runs.

        The first accept is stored with the interaction (``approved_by``).
        The same actor accepting again does not count.
        A second actor runs the operation once.
        When the store persists, that goes through a new adapter.
        """
        agent = billing_agent(provider, approvals=2)
        async with make_durability() as before:
            kernel = Kernel(agent, before)
            await kernel.turn("t", "1", "charge pi_1 500")
            first = await kernel.turn("t", "2", answer=Answer(actor="ana"))
            assert first.interaction is not None
            assert first.interaction.approved_by == ("ana",)
        async with make_durability() as after:
            kernel = Kernel(agent, after)
            stored = await after.load_checkpoint("t")
            assert stored is not None and stored.interaction == first.interaction
            again = await kernel.turn("t", "3", answer=Answer(actor="ana"))
            assert again.interaction == first.interaction and provider.calls() == 0
            done = await kernel.turn("t", "4", answer=Answer(actor="bob"))
            assert done.steps[0].status == StepStatus.COMPLETED and done.interaction is None
            [resolved] = await payloads(after, "t", "interaction.resolved")
            assert resolved["approved_by"] == ["ana", "bob"]
            [receipt] = await after.list_receipts(thread_id="t")
            assert receipt.actor == "bob"  # the accept that completed the quorum ran it
        assert provider.calls() == 1

    async def test_a_capability_mode_confirmation_survives_a_restart(
        self, make_durability: Callable[[], Durability], provider: FakeProvider
    ) -> None:
        """The interaction and its agenda item outlive the adapter.

        The answering turn runs on a new instance.
        It calls the capability again with ``ctx.answer`` set.
        """
        if not self.persistent:
            pytest.skip("this adapter keeps no state across instances")
        answers: list[Answer | None] = []

        @capability("payments.refund", effect="write", confirmation="capability")
        async def refund(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            answers.append(ctx.answer)
            if ctx.answer is None:
                return CapabilityResult.needs_confirmation("Refund 100?", {"amount": 100})
            if ctx.answer.decision != "accept" or ctx.answer.value != {"quote": "q1"}:
                return CapabilityResult(reply="Refund cancelled.")
            effect = await ctx.run_effect(
                "refund:pi_1", lambda authority: provider.charge("pi_1", -100, authority)
            )
            return CapabilityResult(value=effect.value, reply="Refunded 100.")

        def agent() -> Agent:
            script = {"refund": Interpretation(intents=[Intent("payments.refund", {})])}
            return Agent("refunds", "1", [refund], ScriptedInterpreter(script))

        async with make_durability() as before:
            proposed = await Kernel(agent(), before).turn("t", "1", "refund")
        assert proposed.interaction is not None and proposed.interaction.kind == "capability"
        async with make_durability() as after:
            kernel = Kernel(agent(), after)
            answer = Answer(proposed.interaction.id, "accept", {"quote": "q1"})
            accepted = await kernel.turn("t", "2", answer=answer)
            assert [(s.step_id, s.status) for s in accepted.steps] == [
                (proposed.steps[0].step_id, StepStatus.COMPLETED)
            ]
            assert accepted.reply == "Refunded 100." and accepted.interaction is None
            assert (await kernel.turn("t", "2", answer=answer)).replayed
        assert answers == [None, answer]
        assert provider.ledger == ["payments.refund:refund:pi_1"]

    async def test_capability_mode_runs_then_validates_the_answer_before_writing(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        proposed = await kernel.turn("t", "1", "refund pi_1 100")
        assert proposed.steps[0].status == StepStatus.AWAITING_CONFIRMATION
        assert proposed.interaction is not None and proposed.interaction.kind == "capability"
        assert proposed.interaction.details == {"amount": 100}
        assert provider.calls() == 0
        accepted = await kernel.turn("t", "2", "yes")
        assert accepted.steps[0].status == StepStatus.COMPLETED
        assert accepted.reply == "Refunded 100."
        assert provider.ledger == ["payments.refund:refund:pi_1"]
        await kernel.turn("t", "3", "refund pi_2 50")
        declined = await kernel.turn("t", "4", "no")
        assert declined.steps[0].status == StepStatus.COMPLETED
        assert declined.reply == "Refund cancelled." and provider.calls() == 1

    async def test_an_unknown_decision_from_an_interpreter_is_refused_and_never_runs_the_write(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        """Consent is never assumed: only ``"accept"`` runs a confirmed write."""

        def interpret(request: InterpretationRequest) -> Interpretation:
            if request.message == "no thanks":
                return Interpretation(answer=Answer(decision="decline"))  # type: ignore[arg-type]
            return Interpretation()

        await Kernel(billing_agent(provider), durability).turn("t", "1", "charge pi_1 500")
        events = await durability.read_outbox()
        kernel = Kernel(
            billing_agent(provider, interpreter=ScriptedInterpreter(interpret)), durability
        )
        with pytest.raises(InterpretationError, match="decision"):
            await kernel.turn("t", "2", "no thanks")
        assert await durability.read_outbox() == events
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.interaction is not None  # still pending
        assert provider.calls() == 0

    async def test_pending_interactions_lists_open_confirmations_across_threads_by_owner(
        self, kernel: Kernel, durability: Durability, interaction_queue: InteractionQueue | None
    ) -> None:
        if interaction_queue is None:
            pytest.skip(
                "this adapter declares no interaction queue (the interaction_queue fixture)"
            )
        for thread, tenant, pi in (
            ("a", "acme", "pi_1"),
            ("b", "globex", "pi_2"),
            ("c", None, "pi_3"),
            ("d", "acme", "pi_4"),
            ("f", "acme", "pi_6"),
        ):
            await kernel.turn(thread, "1", f"charge {pi} 500", tenant_id=tenant)
        await kernel.turn("d", "2", "yes", tenant_id="acme")  # answered: nothing pending
        await kernel.turn("e", "1", "balance", tenant_id="acme")  # never asked

        async def decoy(tx: TurnTransaction) -> TurnCommit:
            # A core holding an "interaction" object deeper down, and no interaction.
            commit = commit_for(tx)
            held = checkpoint_codec.AgendaItem("s1", "x.y", {"interaction": {"id": "i"}}, "1")
            return replace(commit, checkpoint=replace(commit.checkpoint, agenda=(held,)))

        for thread in ("a0", "b0", "c0"):
            await durability.with_turn(TurnScope(thread, "1", tenant_id="acme"), decoy)

        every = await interaction_queue.pending_interactions()
        assert [(p.thread_id, p.tenant_id, p.version) for p in every] == [
            ("a", "acme", 1),
            ("b", "globex", 1),
            ("c", None, 1),
            ("f", "acme", 1),
        ]
        [first, *_] = every
        checkpoint = await durability.load_checkpoint("a")
        assert checkpoint is not None and first.interaction == checkpoint.interaction
        assert first.interaction.kind == "confirmation"
        assert first.interaction.capability_id == "payments.charge"

        acme = await interaction_queue.pending_interactions(owner=ThreadOwner("acme"))
        assert [p.thread_id for p in acme] == ["a", "f"]
        untenanted = await interaction_queue.pending_interactions(owner=ThreadOwner(None))
        assert [p.thread_id for p in untenanted] == ["c"]
        # Bounded, and paged on by thread ID; the decoys never take a place in a page.
        assert [p.thread_id for p in await interaction_queue.pending_interactions(limit=1)] == ["a"]
        page = await interaction_queue.pending_interactions(owner=ThreadOwner("acme"), limit=1)
        assert [p.thread_id for p in page] == ["a"]
        rest = await interaction_queue.pending_interactions(
            owner=ThreadOwner("acme"), after=page[-1].thread_id, limit=1
        )
        assert [p.thread_id for p in rest] == ["f"]
        assert await interaction_queue.pending_interactions(after="f") == []
        for bad in (0, -1, True):
            with pytest.raises(InvalidRequestError):
                await interaction_queue.pending_interactions(limit=bad)
        with pytest.raises(InvalidRequestError):
            await interaction_queue.pending_interactions(after="")

    async def test_pending_interactions_names_a_corrupt_candidate(
        self,
        kernel: Kernel,
        tamper: Tamper | None,
        interaction_queue: InteractionQueue | None,
        make_durability: Callable[[], Durability],
    ) -> None:
        if tamper is None:
            pytest.skip("this adapter provides no tamper fixture")
        if interaction_queue is None:
            pytest.skip(
                "this adapter declares no interaction queue (the interaction_queue fixture)"
            )
        await kernel.turn("t", "1", "charge pi_1 500")
        await tamper.write_checkpoint_text("t", '{"interaction":{"id": 1')
        async with make_durability() as reopened:
            assert isinstance(reopened, InteractionQueue)  # as declared for ``durability``
            with pytest.raises(CorruptRecordError) as caught:
                await reopened.pending_interactions()
        assert caught.value.thread_id == "t"
