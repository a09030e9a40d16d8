"""Approvals as execution permits (issue 21), on every adapter.

It covers deadlines, the expiry sweep, edits, reasons and busy threads.
It also covers confirmations that a release before these features stored.

Quorums, actors, digests and the approver on the receipt are tested in
:class:`~intention_kernel.testing.conformance.ConfirmationConformance`.
Time comes from a clock the tests move (``Kernel(..., clock=...)``); nothing sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from intention_kernel._agent import Agent
from intention_kernel._checkpoint import operation_digest
from intention_kernel._interpretation import (
    Answer,
    Intent,
    Interpretation,
    InterpretationRequest,
    Round,
)
from intention_kernel._kernel import Kernel
from intention_kernel._turns import StepStatus
from intention_kernel.durability import Durability
from intention_kernel.durability._layout.codec import encode_checkpoint_core
from intention_kernel.errors import ThreadBusyError, ThreadLockTimeoutError
from intention_kernel.testing._agents import FakeProvider, billing_agent
from intention_kernel.testing._scripted import ScriptedInterpreter
from intention_kernel.testing.conformance._support import (
    ConformanceCase,
    Tamper,
    as_operable,
    payloads,
)

__all__ = ["ApprovalConformance"]

START = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
WITHIN = timedelta(minutes=15)


class MovingClock:
    """A clock that stands still until a test moves it."""

    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, by: timedelta) -> None:
        self.now += by


class ApprovalConformance(ConformanceCase):
    """Subclass and provide ``make_durability``; see :mod:`intention_kernel.testing.conformance`."""

    # -- deadlines ----------------------------------------------------------------------------

    async def test_an_accept_after_the_deadline_runs_nothing_and_emits_interaction_expired(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        clock = MovingClock()
        kernel = Kernel(billing_agent(provider, confirm_within=WITHIN), durability, clock=clock)
        proposed = await kernel.turn("t", "1", "charge pi_1 500")
        shown = proposed.interaction
        assert shown is not None and shown.expires_at == START + WITHIN
        clock.advance(WITHIN)  # the deadline itself is too late
        late = await kernel.turn("t", "2", answer=Answer(shown.id, "accept", actor="ana"))
        assert provider.calls() == 0 and await durability.list_receipts() == []
        assert late.interaction is None
        assert [(s.step_id, s.status) for s in late.steps] == [
            (proposed.steps[0].step_id, StepStatus.REJECTED)
        ]
        [expired] = await payloads(durability, "t", "interaction.expired")
        assert (expired["interaction_id"], expired["resolution"]) == (shown.id, "expired")
        assert await payloads(durability, "t", "interaction.resolved") == []
        stored = await durability.load_checkpoint("t")
        assert stored is not None and stored.interaction is None and stored.agenda == ()
        again = await kernel.turn("t", "3", "yes")
        assert again.steps == () and provider.calls() == 0

    async def test_an_accept_before_the_deadline_runs_the_operation_once(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        clock = MovingClock()
        kernel = Kernel(billing_agent(provider, confirm_within=WITHIN), durability, clock=clock)
        await kernel.turn("t", "1", "charge pi_1 500")
        clock.advance(WITHIN - timedelta(seconds=1))
        accepted = await kernel.turn("t", "2", "yes")
        assert [s.status for s in accepted.steps] == [StepStatus.COMPLETED]
        assert provider.calls() == 1
        assert await payloads(durability, "t", "interaction.expired") == []

    async def test_the_sweep_closes_every_overdue_interaction_once(
        self, durability: Durability, operable: bool, provider: FakeProvider
    ) -> None:
        """``interactions expire`` closes the overdue interactions and leaves the others open.

        The command runs :func:`~intention_kernel.operations.expire_interactions`.
        Run again, it closes nothing more.
        """
        from intention_kernel.operations import expire_interactions

        store = as_operable(durability, operable)  # the sweep reads the recorder's scan
        clock = MovingClock()
        kernel = Kernel(billing_agent(provider, confirm_within=WITHIN), durability, clock=clock)
        await kernel.turn("old", "1", "charge pi_1 500")
        clock.advance(timedelta(minutes=10))
        await kernel.turn("fresh", "1", "charge pi_2 500")
        clock.advance(timedelta(minutes=6))  # "old" is overdue, "fresh" has 9 minutes left
        report = await expire_interactions(store, clock=clock)
        assert (report.expired, report.failed) == (1, ())
        old = await durability.load_checkpoint("old")
        assert old is not None and (old.interaction, old.agenda, old.version) == (None, (), 2)
        fresh = await durability.load_checkpoint("fresh")
        assert fresh is not None and fresh.interaction is not None
        again = await expire_interactions(store, clock=clock)
        assert again.expired == 0
        assert len(await payloads(durability, "old", "interaction.expired")) == 1
        late = await kernel.turn("old", "2", "yes")
        assert late.steps == () and provider.calls() == 0

    # -- edits --------------------------------------------------------------------------------

    async def test_an_edited_accept_runs_the_edited_input_once(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        proposed = await kernel.turn("t", "1", "charge pi_1 500")
        shown = proposed.interaction
        assert shown is not None
        edited = {"payment_intent_id": "pi_1", "amount": 300}
        answer = Answer(shown.id, "accept", input=edited, digest=shown.digest)
        accepted = await kernel.turn("t", "2", answer=answer)
        [step] = accepted.steps
        assert step.status == StepStatus.COMPLETED and step.value["amount"] == 300
        assert (step.proposed_input, step.approved_input) == (shown.input, edited)
        [resolved] = await payloads(durability, "t", "interaction.resolved")
        assert (resolved["proposed_input"], resolved["approved_input"]) == (shown.input, edited)
        assert (await kernel.turn("t", "2", answer=answer)).replayed
        assert provider.ledger == ["payments.charge:charge:pi_1"]

    async def test_an_invalid_edit_runs_nothing_and_leaves_the_question_open(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        proposed = await kernel.turn("t", "1", "charge pi_1 500")
        before = await durability.load_checkpoint("t")
        assert before is not None
        bad = Answer(None, "accept", input={"payment_intent_id": "pi_1", "amount": -5})
        refused = await kernel.turn("t", "2", answer=bad)
        [step] = refused.steps
        assert step.status == StepStatus.AWAITING_CONFIRMATION
        assert step.error is not None and "amount" in step.error
        assert refused.interaction == proposed.interaction and provider.calls() == 0
        after = await durability.load_checkpoint("t")
        assert after is not None
        assert (after.interaction, after.agenda) == (before.interaction, before.agenda)
        assert await payloads(durability, "t", "interaction.resolved") == []
        accepted = await kernel.turn("t", "3", "yes")  # what was shown, once
        assert accepted.steps[0].value["amount"] == 500 and provider.calls() == 1

    # -- reasons ------------------------------------------------------------------------------

    async def test_a_rejections_reason_reaches_the_models_next_round(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        """In the agent loop, the next round sees the rejected step with the reason.

        It may propose something else in the same turn.
        """
        seen: list[Round] = []

        def charge(amount: int) -> Interpretation:
            return Interpretation(
                [Intent("payments.charge", {"payment_intent_id": "pi_1", "amount": amount})]
            )

        def script(request: InterpretationRequest) -> Interpretation:
            if request.rounds and (request.message != "no" or len(request.rounds) > 1):
                return Interpretation(reply="Shall I charge 300 instead?")
            if request.message != "no":
                return charge(500)
            if not request.rounds:
                return Interpretation(answer=Answer(None, "reject", reason="the amount is wrong"))
            seen.append(request.rounds[0])
            return charge(300)

        agent = billing_agent(provider, interpreter=ScriptedInterpreter(script, multi_round=True))
        kernel = Kernel(agent, durability)
        await kernel.turn("t", "1", "charge pi_1 500")
        result = await kernel.turn("t", "2", "no")
        [first] = seen
        assert first.answer_step is not None
        assert (first.answer_step.status, first.answer_step.error) == (
            StepStatus.REJECTED,
            "rejected by the person: the amount is wrong",
        )
        assert [s.status for s in result.steps] == [
            StepStatus.REJECTED,
            StepStatus.AWAITING_CONFIRMATION,
        ]
        assert result.interaction is not None and result.interaction.input["amount"] == 300
        [resolved] = await payloads(durability, "t", "interaction.resolved")
        assert (resolved["resolution"], resolved["reason"]) == ("rejected", "the amount is wrong")
        assert provider.calls() == 0

    # -- busy threads -------------------------------------------------------------------------

    async def test_on_busy_reject_answers_at_once_while_a_turn_runs(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        agent: Agent = dataclasses.replace(billing_agent(provider), on_busy="reject")
        kernel = Kernel(agent, durability)
        await kernel.turn("t", "1", "charge pi_1 500")
        provider.behaviour["pi_1"] = "block"
        running = asyncio.create_task(kernel.turn("t", "2", "yes"))
        try:
            await asyncio.wait_for(provider.entered.wait(), 10)
            before = await durability.load_checkpoint("t")
            with pytest.raises(ThreadBusyError) as busy:
                # Well below any lock timeout: a refusal after a wait would miss it.
                await asyncio.wait_for(kernel.turn("t", "3", "balance 7"), 2)
            assert not isinstance(busy.value, ThreadLockTimeoutError)
            assert busy.value.thread_id == "t" and not running.done()
            assert await durability.load_checkpoint("t") == before
        finally:
            provider.released.set()
            accepted = await asyncio.wait_for(running, 10)
        assert accepted.steps[0].status == StepStatus.COMPLETED and provider.calls() == 1
        again = await kernel.turn("t", "3", "balance 7")
        assert (again.replayed, again.checkpoint_version) == (False, 3)

    async def test_on_busy_reject_replays_a_committed_turn_while_a_turn_runs(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        """A redelivery of a committed turn is answered while another turn runs.

        The other turn is held inside its provider call while the redelivery arrives.
        The redelivery writes nothing, so it is not refused as busy.
        """
        agent: Agent = dataclasses.replace(billing_agent(provider), on_busy="reject")
        kernel = Kernel(agent, durability)
        first = await kernel.turn("t", "1", "charge pi_1 500")
        provider.behaviour["pi_1"] = "block"
        running = asyncio.create_task(kernel.turn("t", "2", "yes"))
        try:
            await asyncio.wait_for(provider.entered.wait(), 10)
            # Well below any lock timeout: a replay after a wait would miss it.
            again = await asyncio.wait_for(kernel.turn("t", "1", "charge pi_1 500"), 2)
            assert again == dataclasses.replace(first, replayed=True)
            with pytest.raises(ThreadBusyError):
                await asyncio.wait_for(kernel.turn("t", "3", "balance 7"), 2)
            assert not running.done()
        finally:
            provider.released.set()
            accepted = await asyncio.wait_for(running, 10)
        assert accepted.steps[0].status == StepStatus.COMPLETED and provider.calls() == 1

    # -- older stored confirmations -----------------------------------------------------------

    async def test_a_confirmation_stored_before_deadlines_quorums_and_actors_reads_as_none(
        self,
        durability: Durability,
        make_durability: Callable[[], Durability],
        tamper: Tamper | None,
        provider: FakeProvider,
    ) -> None:
        """A pending confirmation stored by an older release still works.

        Its stored row has no ``expires_at``, ``approvals``, ``approved_by`` or ``digest``.
        A release before those fields wrote it so.
        It reads as no deadline, one approval and no approvers.
        Its digest is the digest of its operation.
        An accept runs it once, long after the deadline the capability now has.
        """
        if tamper is None:
            pytest.skip("this adapter provides no tamper fixture")
        clock = MovingClock()
        agent = billing_agent(provider, confirm_within=WITHIN)
        proposed = await Kernel(agent, durability, clock=clock).turn("t", "1", "charge pi_1 500")
        current = await durability.load_checkpoint("t")
        assert current is not None and current.interaction is not None
        core = json.loads(encode_checkpoint_core(current))
        for name in ("expires_at", "approvals", "approved_by", "digest"):
            del core["interaction"][name]
        await tamper.write_checkpoint_text("t", json.dumps(core))
        reopening = make_durability() if self.persistent else contextlib.nullcontext(durability)
        async with reopening as reopened:
            stored = await reopened.load_checkpoint("t")
            assert stored is not None and stored.interaction is not None
            old = stored.interaction
            assert (old.expires_at, old.approvals, old.approved_by) == (None, 1, ())
            assert old.digest == operation_digest("confirmation", "payments.charge", old.input)
            assert old.digest == current.interaction.digest
            assert proposed.steps[0].step_id == stored.agenda[0].step_id
            clock.advance(timedelta(days=1))
            kernel = Kernel(agent, reopened, clock=clock)
            accepted = await kernel.turn(
                "t", "2", answer=Answer(old.id, "accept", actor="ana", digest=old.digest)
            )
            assert [(s.status, s.actor) for s in accepted.steps] == [(StepStatus.COMPLETED, "ana")]
            [receipt] = await reopened.list_receipts(thread_id="t")
            assert receipt.actor == "ana"
            assert await payloads(reopened, "t", "interaction.expired") == []
        assert provider.calls() == 1
