"""The mutable state of one turn while its steps run.

A ``TurnState`` starts from the loaded checkpoint, copied and never mutated. It
accumulates what the turn produces: steps, recorded facts, outbox events, reply
lines, the agenda and the active interaction. ``finish`` turns it into
the next checkpoint and the result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from intention_kernel import _tracing
from intention_kernel._agent import CompiledAgent
from intention_kernel._authority import Principal
from intention_kernel._capabilities import CancellationSignal
from intention_kernel._checkpoint import (
    AgendaItem,
    Interaction,
    KernelCheckpoint,
    ReceiptRef,
    check_compatible,
)
from intention_kernel._deadlines import expired_event, expired_step
from intention_kernel._facts import FactLedger, FactRecord, FactTable
from intention_kernel._interpretation import Answer, FiredTimer
from intention_kernel._streaming import TurnSink
from intention_kernel._turns import EventDraft, StepResult, StepStatus, TurnScope
from intention_kernel.durability import TurnTransaction
from intention_kernel.durability._contract.records import TimerWrite

__all__ = ["TurnRequest", "TurnState", "in_round"]


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """What the caller asked in this turn: a message, a structured answer, or both.

    ``sink`` receives the turn's events as they happen when the turn is streamed
    (:meth:`~intention_kernel.Kernel.stream_turn`); ``None`` otherwise. ``principal``
    is who sent the turn (``None``: the caller named no one). ``stop(base_version,
    at_once)`` is asked at each safe point: before each step, before each later
    round, before an accept runs. ``base_version`` is the version of the checkpoint
    the turn started from. ``None`` goes on. A line of text stops the turn, which
    commits with that line in its reply. ``at_once``: read the store now, however young
    the turn is (an accept is about to run a write).
    ``queued``: the turn comes from its thread's inbox. ``steers()`` takes the
    messages sent to steer this turn (``on_busy="steer"``) that wait in its inbox,
    as ``{"turn_id", "message"}`` dicts: asked at each round boundary.
    ``timer``: the turn is a timer's, which no person sent (``message`` and
    ``answer`` are then ``None``).
    """

    message: str | None
    answer: Answer | None
    sink: TurnSink | None = None
    principal: Principal | None = None
    stop: Callable[[int, bool], Awaitable[str | None]] | None = None
    queued: bool = False
    timer: FiredTimer | None = None
    steers: Callable[[], Awaitable[list[dict[str, str]]]] | None = None

    def with_stop(
        self,
        stop: Callable[[int, bool], Awaitable[str | None]],
        steers: Callable[[], Awaitable[list[dict[str, str]]]] | None = None,
    ) -> TurnRequest:
        """This request with ``stop`` (and ``steers``, when given), every other field
        kept. Built field by field: ``dataclasses.replace`` costs a dozen calls, and
        every turn makes one. A new field must be passed on here too (a test checks)."""
        return TurnRequest(
            self.message,
            self.answer,
            self.sink,
            self.principal,
            stop,
            self.queued,
            self.timer,
            self.steers if steers is None else steers,
        )


class TurnState:
    """Accumulates one turn's work; see the module docstring.

    ``now`` is the turn's time. It is read once from the kernel's clock while the turn
    holds the thread's lock. Every deadline the turn opens or judges is measured from it.
    """

    def __init__(
        self, agent: CompiledAgent, tx: TurnTransaction, request: TurnRequest, now: datetime
    ) -> None:
        scope = tx.scope
        previous = tx.checkpoint
        # The same fingerprint, most turns, is compatible without the call.
        if previous is not None and previous.agent_fingerprint != agent.fingerprint:
            check_compatible(
                previous,
                fingerprint=agent.fingerprint,
                compatible=agent.compatible,
                thread_id=scope.thread_id,
            )
        self.agent = agent
        self.tx = tx
        self.scope: TurnScope = scope
        self.request = request
        self.now = now
        #: The name of the principal who sent this turn: the proposer of what it holds.
        self.proposer: str | None = request.principal.name if request.principal else None
        # Tested for ``None`` where an event would be reported: nothing else when unstreamed.
        self.sink = request.sink
        self.previous: KernelCheckpoint | None = previous
        # Overlaid, not copied: a long thread's facts cost nothing per turn until stored.
        self.fact_ledger = FactLedger(previous.facts if previous else {})
        #: What interpreters and capabilities read; only ``fact_ledger`` records.
        self.facts: FactTable = self.fact_ledger.table
        self.agenda: list[AgendaItem] = list(previous.agenda) if previous else []
        self.interaction: Interaction | None = previous.interaction if previous else None
        #: The interaction this turn found overdue and closed (see :meth:`expire_interaction`).
        self.expired: Interaction | None = None
        # The receipt index: the loaded one, and the entries noted in this turn. Those
        # move to its end. ``finish`` merges them, so an untouched index is not copied.
        self.receipts: tuple[ReceiptRef, ...] = previous.receipts if previous else ()
        self.noted_receipts: dict[str, ReceiptRef] = {}
        self.noted_known_receipt = False  # a noted key may already be in ``receipts``
        self.steps: list[StepResult] = []
        #: The round whose steps run now (set by ``continue_rounds``); steps carry it.
        self.round = 1
        #: The turn IDs of the steers handed to this turn so far (``rounds.take_steers``).
        self.steered: set[str] = set()
        #: ``(step ID, actor)`` of the interaction an answer resolved in this turn: that
        #: step, when it is recorded, names who answered (see :meth:`close_interaction`).
        self.answered: tuple[str, str] | None = None
        self.recorded: list[FactRecord] = []
        self.events: list[EventDraft] = []
        #: Timer writes staged by the completed steps (``ctx.schedule``), in order.
        self.timers: list[TimerWrite] = []
        # Keys of completed receipts whose effect.completed is among ``events``.
        self.announced: dict[str, None] = {}
        self.replies: list[str] = []
        #: The approver of the operation running now: set while an accepted answer's
        #: operation runs, so its effect events name who approved it.
        self.actor: str | None = None
        #: Every approver of the operation running now (the quorum's, else the actor).
        self.approved_by: tuple[str, ...] = ()
        #: The interaction whose accepted operation this turn ran, if any: the later
        #: rounds continue it, so what they ask is still its proposer's request.
        self.resumed: Interaction | None = None
        # Where the prompt of each interaction opened in this turn is among ``replies``.
        self._prompts: dict[str, int] = {}
        self.signal = CancellationSignal()
        self.traced = _tracing.enabled()  # decided once per turn: spans cost nothing untraced
        #: The task running the turn: its steps run in it, one after another.
        self.task = asyncio.current_task()
        self._step_count = 0

    def add_step(self, step: StepResult, input: Any = None) -> None:
        """Record a step of this turn, in the current round.

        When the turn is streamed, report it with the ``input`` it ran with (``None``:
        it ran nothing)."""
        if self.round != 1:  # a one-round turn's steps already say round 1: no copy
            step = in_round(step, self.round)
        if self.answered is not None and step.step_id == self.answered[0]:
            step = replace(step, actor=self.answered[1])
        self.steps.append(step)
        if self.sink is not None:
            self.sink.step(step, input)

    def next_step_id(self) -> str:
        """A step ID unique in the thread: the turn ID and the step's number in it."""
        self._step_count += 1
        return f"{self.scope.turn_id}#{self._step_count}"

    def emit(self, type: str, payload: Any) -> None:
        self.events.append(EventDraft(type, payload))

    def open_interaction(self, item: AgendaItem, interaction: Interaction) -> None:
        """Make ``interaction`` the active one and ask its prompt; a pending one is
        superseded (see :meth:`_supersede`)."""
        if self.interaction is not None:
            self._supersede(self.interaction, item)
        self.agenda.append(item)
        self.interaction = interaction
        self._prompts[interaction.id] = len(self.replies)
        self.replies.append(interaction.prompt)
        if self.sink is not None:
            self.sink.interaction(interaction)
        self.emit(
            "interaction.opened",
            {
                "interaction_id": interaction.id,
                "kind": interaction.kind,
                "capability_id": interaction.capability_id,
                "step_id": interaction.step_id,
                "prompt": interaction.prompt,
                **(
                    {"expires_at": interaction.expires_at.isoformat()}
                    if interaction.expires_at is not None
                    else {}
                ),
            },
        )

    def _supersede(self, active: Interaction, by: AgendaItem) -> None:
        """Resolve ``active`` as superseded by the operation ``by``.

        Say an earlier step of this same turn opened it. That step will never be
        answered. So it is reported ``rejected`` rather than ``awaiting_confirmation``.
        Its prompt is not left in the reply as if it were still asked."""
        self.close_interaction("superseded")
        for index, step in enumerate(self.steps):
            if step.step_id == active.step_id and step.status is StepStatus.AWAITING_CONFIRMATION:
                self.steps[index] = replace(
                    step,
                    status=StepStatus.REJECTED,
                    error=f"superseded by step {by.step_id} ({by.capability_id}), proposed "
                    "later in the same turn; only the latest request waits for an answer",
                )
                if self.sink is not None:
                    self.sink.step(self.steps[index])
                break
        line = self._prompts.pop(active.id, None)
        if line is not None:
            self.replies[line] = self.agent.agent.replies.superseded(active)

    def close_interaction(
        self,
        resolution: str,
        *,
        actor: str | None = None,
        reason: str | None = None,
        approved_input: dict[str, Any] | None = None,
        approved_by: tuple[str, ...] = (),
    ) -> AgendaItem | None:
        """Resolve the active interaction and take its planned operation off the agenda.

        The event's payload holds:

        - ``actor`` and ``reason`` (the answer's), when given. ``actor`` is on the
          interaction's step too, when this turn records it.
        - ``proposed_input`` and ``approved_input``, when the approver edited the held
          input into ``approved_input``.
        - ``approved_by``, when a quorum's approvers were recorded. All of them are on
          its final accept, those so far on a reject."""
        active = self.interaction
        if active is None:
            return None
        item = next((a for a in self.agenda if a.interaction_id == active.id), None)
        self.agenda = [a for a in self.agenda if a.interaction_id != active.id]
        self.interaction = None
        payload: dict[str, Any] = {
            "interaction_id": active.id,
            "capability_id": active.capability_id,
            "step_id": active.step_id,
            "resolution": resolution,
        }
        if actor is not None:
            payload["actor"] = actor
            self.answered = (active.step_id, actor)
        if reason is not None:
            payload["reason"] = reason
        if approved_by:
            payload["approved_by"] = list(approved_by)
        if approved_input is not None:
            payload["proposed_input"] = active.input
            payload["approved_input"] = approved_input
        self.emit("interaction.resolved", payload)
        return item

    def expire_interaction(self) -> None:
        """Close the active interaction as expired: it is overdue at ``now``.

        Its held operation leaves the agenda unrun. Its step is ``rejected``, and the
        reply says so. ``interaction.expired`` is emitted, not ``interaction.resolved``."""
        active = self.interaction
        assert active is not None
        self.agenda = [a for a in self.agenda if a.interaction_id != active.id]
        self.interaction = None
        self.expired = active
        self.events.append(expired_event(active))
        self.add_step(expired_step(active))
        self.replies.append(self.agent.agent.replies.expired(active))

    @staticmethod
    def new_interaction_id() -> str:
        # Imported here: ``uuid`` loads ``platform``, and most turns open no interaction.
        import uuid

        return "ix_" + uuid.uuid4().hex


def in_round(step: StepResult, round: int) -> StepResult:
    """``step`` as run in ``round``, every other field kept.

    Built field by field: ``dataclasses.replace`` costs a dozen calls. Each step of
    a later round makes one. A new field must be passed on here too (a test checks).
    """
    return StepResult(
        step.step_id,
        step.capability_id,
        step.status,
        step.value,
        step.error,
        step.receipt_ids,
        step.proposed_input,
        step.approved_input,
        round,
        step.actor,
    )
