"""Step 2: apply an answer to the active interaction, before any new intent.

``"confirmation"`` interactions: ``accept`` runs exactly the stored agenda item (the
input the person saw). ``reject`` cancels it. ``"capability"`` interactions: the
capability is called again with ``ctx.answer`` and decides for itself. An answer with
nothing pending, or naming another interaction, runs nothing. The reply says why.

An accept may edit a ``"confirmation"``'s held input (``Answer(input=...)``). The edit
is validated against the capability's input model. What runs is the edited input. An
invalid edit runs nothing and leaves the interaction open.

An answer to an interaction that expired runs nothing: the reply says it expired.
This turn closed that interaction before it interpreted anything (see
:mod:`intention_kernel._deadlines`).

A quorum (``@capability(..., approvals=N)``, N > 1) holds the operation until accepts
from N distinct actors are recorded, in one turn or several:

- each accept before the last is a committed turn of its own that runs nothing. The
  actor joins ``Interaction.approved_by``. ``interaction.approved`` is emitted with
  the actor and the approvers so far.
- the final accept resolves the interaction as today and runs the operation once.
  ``interaction.resolved`` names every approver.
- an accept from an actor already in ``approved_by`` counts once. It is refused, and
  the interaction stays as it was. Names are compared as principals, so ``"ana"`` and
  ``"Ana "`` are one approver.
- each approver must be allowed by the capability's approver policy (below).
- an accept without an actor is refused. An anonymous accept cannot be told apart
  from another, so it cannot be one of N distinct ones. The host always sets the
  actor.
- one reject, from anyone, closes the interaction and nothing runs.
- an edit (``Answer(input=...)``) is refused: every approver must approve the same
  operation, so a change is a reject and a new request.
- the digest binding and the deadline hold for every accept, the partial ones too.

Who may answer is the capability's policy (``approvers``, ``self_approval``; see
:mod:`intention_kernel._authority`), checked before anything else of the answer is used.
An answer it refuses runs, edits and counts nothing; the interaction stays open, and
the reply says who may answer.

The number required is the larger of two: the interaction's ``approvals`` as it
opened, and the capability's current one. So a redeploy may raise a pending quorum,
never lower it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from intention_kernel._authority import Principal, approver_problem, same_principal
from intention_kernel._capabilities import Capability
from intention_kernel._checkpoint import AgendaItem, Interaction
from intention_kernel._interpretation import Answer
from intention_kernel._runtime.execute import execute
from intention_kernel._runtime.state import TurnState
from intention_kernel._turns import StepResult, StepStatus
from intention_kernel.errors import CapabilityError, CorruptRecordError, InvalidRequestError

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
    if cap is not None and not _allowed(state, cap, active, answer):
        return False  # refused: nothing ran, and the interaction stays open
    required = max(active.approvals, cap.approvals if cap is not None else 1)
    if answer.input is not None and cap is not None:  # a vanished one cannot resume anyway
        edited = _edit(state, cap, active, answer, required)
        if edited is None:
            return False  # refused: nothing ran, and the interaction stays open
    approved_by = active.approved_by
    if answer.decision == "accept" and required > 1 and cap is not None:
        counted = _count_approval(state, active, answer, required)
        if counted is None:
            return False  # refused: nothing ran, and the interaction is as it was
        if len(counted) < required:
            return True  # recorded: the operation waits for the remaining approvers
        approved_by = counted
    resolution = "accepted" if answer.decision == "accept" else "rejected"
    item = state.close_interaction(
        resolution,
        actor=answer.actor,
        reason=answer.reason,
        approved_input=edited[1] if edited is not None else None,
        approved_by=approved_by,
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
    state.approved_by = approved_by if approved_by else (answer.actor,) if answer.actor else ()
    # A question the resumed operation asks again is still its proposer's request.
    # An answerer who became its proposer could approve the next question of their own.
    proposer, state.proposer = state.proposer, active.proposed_by
    state.resumed = active
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
        state.approved_by = ()
        state.proposer = proposer
    return True


def _allowed(state: TurnState, cap: Capability, active: Interaction, answer: Answer) -> bool:
    """Whether the capability's approver policy lets this answer's sender answer ``active``.

    If not, a step still ``awaiting_confirmation`` says why afterwards. The reply says
    who may answer.

    Checked before anything else of the answer is used: a refused answer edits, counts
    and runs nothing."""
    principal = state.request.principal
    if principal is None and answer.actor and answer is state.request.answer:
        # A caller without a principal vouches for its own answer's actor, as before
        # principals existed; it gets no role beyond a user's. An actor the interpreter
        # wrote is vouched for by no one: a model must never name its approver.
        try:
            principal = Principal(answer.actor, state.scope.tenant_id)
        except InvalidRequestError:
            principal = None
    problem = approver_problem(
        approvers=cap.approvers,
        self_approval=cap.self_approval,
        principal=principal,
        interaction=active,
        accept=answer.decision == "accept",
    )
    if problem is None:
        return True
    step = StepResult(
        active.step_id,
        active.capability_id,
        StepStatus.AWAITING_CONFIRMATION,
        None,
        f"answer refused: {problem}; it may be answered by {cap.who_may_answer}",
    )
    state.add_step(step)
    state.replies.append(state.agent.agent.replies.answer_not_allowed(active, cap, step))
    return False


def _count_approval(
    state: TurnState, active: Interaction, answer: Answer, required: int
) -> tuple[str, ...] | None:
    """Count ``answer``'s accept toward ``active``'s quorum of ``required``.

    Return the approvers with it. Return ``None`` when it does not count: no actor, or
    one who already approved. A step still ``awaiting_confirmation`` then says why.

    An accept that leaves the quorum short is recorded here: the interaction, still
    active, names its approvers so far, and ``interaction.approved`` is emitted."""
    replies = state.agent.agent.replies
    actor = answer.actor
    if not actor:
        problem = (
            f"{active.capability_id} needs accepts from {required} different people; an "
            "accept that names no actor cannot be told apart from another, so it was not "
            "counted"
        )
    elif any(same_principal(actor, approver) for approver in active.approved_by):
        problem = (
            f"{actor!r} has already approved this request; it needs accepts from "
            f"{required} different people, and each counts once"
        )
    else:
        approvers = (*active.approved_by, actor)
        if len(approvers) >= required:
            return approvers
        recorded = dataclasses.replace(active, approvals=required, approved_by=approvers)
        state.interaction = recorded
        state.emit(
            "interaction.approved",
            {
                "interaction_id": active.id,
                "capability_id": active.capability_id,
                "step_id": active.step_id,
                "actor": actor,
                "approved_by": list(approvers),
                "approvals": required,
            },
        )
        step = StepResult(active.step_id, active.capability_id, StepStatus.AWAITING_CONFIRMATION)
        state.add_step(step)
        state.replies.append(replies.approval_recorded(recorded))
        return approvers
    step = StepResult(
        active.step_id, active.capability_id, StepStatus.AWAITING_CONFIRMATION, None, problem
    )
    state.add_step(step)
    state.replies.append(replies.approval_refused(active, step))
    return None


def _edit(
    state: TurnState, cap: Capability, active: Interaction, answer: Answer, required: int
) -> tuple[Any, dict[str, Any]] | None:
    """The edited input of an accept, validated against the capability's input model.

    It is ``(handler argument, canonical input)``. It is ``None`` when the edit is
    refused. A step still ``awaiting_confirmation`` then says why, and the reply asks
    again.

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
    elif required > 1:
        problem = (
            f"{cap.id} needs accepts from {required} different people, and each must "
            "approve the same input: it cannot be edited in an answer; reject it and ask "
            "for the changed request"
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
