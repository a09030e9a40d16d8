"""Step 2: apply an answer to the active interaction, before any new intent.

``"confirmation"`` interactions: ``accept`` runs exactly the stored agenda item
(the input the person saw), ``reject`` cancels it. ``"capability"``
interactions: the capability is called again with ``ctx.answer`` and decides
for itself. An answer with nothing pending, or naming another interaction,
runs nothing and the reply says why. An answer to an interaction that expired
(closed by this turn before it interpreted anything, see
:mod:`intention_kernel.deadlines`) runs nothing: the reply says it expired.
"""

from __future__ import annotations

from intention_kernel.checkpoint import AgendaItem
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
    resolution = "accepted" if answer.decision == "accept" else "rejected"
    item = state.close_interaction(resolution, actor=answer.actor, reason=answer.reason)
    if item is None:
        raise CorruptRecordError(
            f"thread {state.scope.thread_id!r} has interaction {active.id} but no agenda item "
            "for it",
            thread_id=state.scope.thread_id,
        )
    cap = state.agent.capabilities.get(item.capability_id)
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
    try:
        parsed, _ = cap.parse_input(item.input)
    except CapabilityError as exc:
        step = _record(state, item, StepStatus.FAILED, str(exc))
        state.replies.append(replies.cannot_resume(active, step))
        return True
    # "capability" mode hands the answer, accept or reject, to the capability to judge.
    state.actor = answer.actor
    try:
        await execute(state, cap, item, parsed, answer if active.kind == "capability" else None)
    finally:
        state.actor = None  # the turn's later intents were approved by no one
    return True


def _record(
    state: TurnState, item: AgendaItem, status: StepStatus, error: str | None
) -> StepResult:
    step = StepResult(item.step_id, item.capability_id, status, None, error)
    state.add_step(step)
    return step
