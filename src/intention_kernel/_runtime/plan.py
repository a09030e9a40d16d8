"""Step 3: plan each intent onto the agenda, and run what needs no confirmation.

A capability with ``confirmation="required"`` is never run in the turn that
proposes it. It is stored on the agenda, exactly as validated. A confirmation
interaction opens, superseding one that was pending. That is the default for
writes. A read may be declared ``"required"`` too, when the application wants
consent for it (say, to disclose personal data). It is held and asked the same way.
Everything else runs now.
"""

from __future__ import annotations

from intention_kernel._checkpoint import AgendaItem, Interaction
from intention_kernel._deadlines import deadline
from intention_kernel._interpretation import Intent
from intention_kernel._runtime.execute import execute
from intention_kernel._runtime.state import TurnState
from intention_kernel._turns import StepResult, StepStatus
from intention_kernel.errors import CapabilityError, InvalidInputError, UnknownCapabilityError

__all__ = ["plan_intent"]


async def plan_intent(state: TurnState, intent: Intent) -> None:
    step_id = state.next_step_id()
    cap = state.agent.capabilities.get(intent.capability_id)
    try:
        if cap is None:
            known = ", ".join(sorted(state.agent.capabilities)) or "none"
            # An interpreter may not even tell which capability was meant (a tool call
            # naming no function). It leaves the ID empty and says why in ``error``.
            what = f"unknown capability {intent.capability_id!r}"
            if not intent.capability_id and intent.error is not None:
                what = intent.error
            raise UnknownCapabilityError(
                f"{what} (this agent has: {known})", capability_id=intent.capability_id
            )
        if intent.error is not None:
            raise InvalidInputError(
                f"invalid input for {cap.id}: {intent.error}", capability_id=cap.id
            )
        parsed, canonical = cap.parse_input(intent.input)
    except CapabilityError as exc:
        step = StepResult(step_id, str(intent.capability_id), StepStatus.FAILED, None, str(exc))
        state.add_step(step)
        state.replies.append(state.agent.agent.replies.not_understood(cap, step))
        return
    item = AgendaItem(step_id, cap.id, canonical, state.scope.turn_id)
    if cap.confirmation == "required":  # a read too: the application asked for consent
        interaction = Interaction(
            id=state.new_interaction_id(),
            kind="confirmation",
            capability_id=cap.id,
            input=canonical,
            prompt=cap.render_prompt(parsed, canonical),
            step_id=step_id,
            turn_id=state.scope.turn_id,
            expires_at=deadline(state.now, cap.confirm_within),
            approvals=cap.approvals,
            proposed_by=state.proposer,
            who_may_answer=cap.answer_policy,
        )
        state.open_interaction(
            AgendaItem(step_id, cap.id, canonical, state.scope.turn_id, interaction.id),
            interaction,
        )
        held = StepResult(step_id, cap.id, StepStatus.AWAITING_CONFIRMATION)
        state.add_step(held)
        return
    await execute(state, cap, item, parsed)
