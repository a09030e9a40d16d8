"""Step 2: apply an answer to the active interaction, before any new intent.

``"confirmation"`` interactions: ``accept`` runs exactly the stored agenda item
(the input the person saw), ``reject`` cancels it. ``"capability"``
interactions: the capability is called again with ``ctx.answer`` and decides
for itself. An answer with nothing pending, or naming another interaction,
runs nothing and the reply says why. An accept may edit a ``"confirmation"``'s held
input (``Answer(input=...)``): the edit is validated against the capability's input
model, and what runs is the edited input; an invalid edit runs nothing and leaves the
interaction open. An answer to an interaction that expired
(closed by this turn before it interpreted anything, see
:mod:`intention_kernel.deadlines`) runs nothing: the reply says it expired.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from intention_kernel.capabilities import Capability
from intention_kernel.checkpoint import AgendaItem, Interaction
from intention_kernel.errors import CapabilityError, CorruptRecordError
from intention_kernel.interpretation import Answer
from intention_kernel.runtime.execute import execute
from intention_kernel.runtime.state import TurnState
from intention_kernel.turns import StepResult, StepStatus

__all__ = ["handle_answer"]


async def handle_answer(state: TurnState, answer: Answer) -> bool:
    """Apply ``answer``; return ``False`` when it was refused (the turn runs nothing else)."""
    active = state.interaction
    replies = state.agent.agent.replies
    if active is None:
        expired = state.expired
        if expired is not None and answer.interaction_id in (None, expired.id):
            return False  # too late: the reply already says the request expired
        state.replies.append(replies.nothing_pending())
        return False
    if answer.interaction_id is not None and answer.interaction_id != active.id:
        state.replies.append(replies.not_the_pending_question(active))
        return False
    if answer.digest is not None and answer.digest != active.digest:
        # An approval given for one operation never runs another: nothing runs, and the
        # interaction stays open for an answer to the operation it holds.
        state.replies.append(replies.request_changed(active))
        return False
    edited: tuple[Any, dict[str, Any]] | None = None
    cap = state.agent.capabilities.get(active.capability_id)
    if answer.input is not None and cap is not None:  # a vanished one cannot resume anyway
        edited = _edit(state, cap, active, answer)
        if edited is None:
            return False  # refused: nothing ran, and the interaction stays open
    resolution = "accepted" if answer.decision == "accept" else "rejected"
    item = state.close_interaction(
        resolution,
        actor=answer.actor,
        reason=answer.reason,
        approved_input=edited[1] if edited is not None else None,
    )
    if item is None:
        raise CorruptRecordError(
            f"thread {state.scope.thread_id!r} has interaction {active.id} but no agenda item "
            "for it",
            thread_id=state.scope.thread_id,
        )
    if cap is None:
        step = _record(
            state, item, StepStatus.FAILED, f"capability {item.capability_id!r} no longer exists"
        )
        state.replies.append(replies.cannot_resume(active, step))
        return True
    if active.kind == "confirmation" and answer.decision != "accept":  # consent is never assumed
        why = f"rejected by the person: {answer.reason}" if answer.reason is not None else None
        _record(state, item, StepStatus.REJECTED, why)
        state.replies.append(replies.cancelled(active))
        return True
    proposed: dict[str, Any] | None = None
    if edited is not None:
        # What runs is the approved input; the step records the proposed one beside it.
        parsed, proposed = edited[0], item.input
        item = dataclasses.replace(item, input=edited[1])
    else:
        try:
            parsed, _ = cap.parse_input(item.input)
        except CapabilityError as exc:
            step = _record(state, item, StepStatus.FAILED, str(exc))
            state.replies.append(replies.cannot_resume(active, step))
            return True
    # "capability" mode hands the answer, accept or reject, to the capability to judge.
    state.actor = answer.actor
    try:
        await execute(
            state,
            cap,
            item,
            parsed,
            answer if active.kind == "capability" else None,
            proposed=proposed,
        )
    finally:
        state.actor = None  # the turn's later intents were approved by no one
    return True


def _edit(
    state: TurnState, cap: Capability, active: Interaction, answer: Answer
) -> tuple[Any, dict[str, Any]] | None:
    """The edited input of an accept, validated against the capability's input model:
    ``(handler argument, canonical input)``; ``None`` when it is refused, after a step
    still ``awaiting_confirmation`` says why and the reply asks again.

    Only a ``"required"`` confirmation is edited here: the kernel holds its input. A
    capability that confirms on its own validates its answer itself (``ctx.answer``,
    whose ``value`` carries what the person changed)."""
    if answer.decision != "accept":  # Kernel.turn refuses it; an interpreter's may not
        problem = "an edited input goes with an accept, not a reject"
    elif active.kind != "confirmation":
        problem = (
            f"{cap.id} confirms on its own (confirmation='capability'): its input cannot be "
            "edited in an answer; send the change in the answer's value"
        )
    else:
        try:
            return cap.parse_input(answer.input)
        except CapabilityError as exc:
            problem = f"edited input refused: {exc}"
    step = StepResult(
        active.step_id, active.capability_id, StepStatus.AWAITING_CONFIRMATION, None, problem
    )
    state.add_step(step)
    state.replies.append(state.agent.agent.replies.edit_refused(active, step))
    return None


def _record(
    state: TurnState, item: AgendaItem, status: StepStatus, error: str | None
) -> StepResult:
    step = StepResult(item.step_id, item.capability_id, status, None, error)
    state.add_step(step)
    return step
