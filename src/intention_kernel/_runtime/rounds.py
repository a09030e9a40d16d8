"""Rounds: an interpreter that works in rounds is asked again within the turn.

After the steps a round asked for have run, the interpreter is asked again. It sees
the turn's earlier rounds: what each returned and each step's outcome. This repeats
until a round asks for nothing more or the agent's ``max_rounds`` is reached.
Every round runs inside the same durable turn. Its steps, facts and events commit
together, once. Each round is recorded in the turn's journal before its steps run
(:mod:`~intention_kernel._runtime.journal`). A delivery after a crash thus goes on
from the rounds already answered.

Answers are taken from the first round only. A later round's answer would be the
interpreter's own decision, not the person's. The request it answers may even be one
proposed earlier in this very turn, which the person has not seen yet. So such an
answer is refused, and the interpreter is told why.
"""

from __future__ import annotations

from dataclasses import replace

from intention_kernel._interpretation import Interpretation, Round
from intention_kernel._runtime.journal import interpret_recorded
from intention_kernel._runtime.plan import plan_intent
from intention_kernel._runtime.reply import finish, stopped
from intention_kernel._runtime.state import TurnState
from intention_kernel._turns import StepResult, TurnCommit

__all__ = ["LATER_ANSWER_REFUSED", "continue_rounds", "stopped_reply"]

LATER_ANSWER_REFUSED = (
    "not applied: only the person's message answers a pending request, and it is read in "
    "the turn's first round"
)


async def continue_rounds(
    state: TurnState, first: Interpretation, answer_step: StepResult | None
) -> TurnCommit:
    """Go on from the turn's first round (already run) until it is the last one."""
    max_rounds = state.agent.max_rounds
    rounds = [
        Round(first, tuple(state.steps[len(state.steps) - len(first.intents) :]), answer_step)
    ]
    current = first
    # The first round goes on when it asked for steps. It also goes on when the
    # interpreter's own answer ran the pending operation. It has outcomes to read
    # either way.
    asked = bool(first.intents) or (first.answer is not None and answer_step is not None)
    if state.resumed is not None:
        # The later rounds read the resumed operation's outcome and go on with it. (A
        # bridge's run asks its next approval so.) Their requests are its proposer's.
        # Else its approver would become the proposer, and the real one could approve.
        state.proposer = state.resumed.proposed_by
    while asked:
        if len(rounds) >= max_rounds:
            return finish(state, current, reply=stopped_reply(state, current, len(rounds)))
        if (stop := await stopped(state, current)) is not None:
            return stop
        if state.request.steers is not None:
            rounds[-1] = await take_steers(state, rounds[-1], len(rounds))
        current = await interpret_recorded(state, tuple(rounds))
        start = len(state.steps)
        state.round = len(rounds) + 1
        for intent in current.intents:
            if (stop := await stopped(state, current)) is not None:
                return stop
            await plan_intent(state, intent)
        rounds.append(
            Round(
                current,
                tuple(state.steps[start:]),
                answer_refused=LATER_ANSWER_REFUSED if current.answer is not None else None,
            )
        )
        asked = bool(current.intents)
    if len(rounds) == 1:
        return finish(state, current)
    return finish(state, current, reply=_final_reply(state, current))


#: The journal key of the steers handed over after round N (from 1).
STEER_KEY = "kernel.steer.{}"


async def take_steers(state: TurnState, last: Round, number: int) -> Round:
    """``last`` with the messages that steer the turn after it.

    This turn ID's journal records them under ``STEER_KEY``. So a redelivery hands
    over the same ones, at the same boundary. The entries are taken in the store
    (``taken_by``) before the journal entry is written. So none runs as a turn of its
    own meanwhile."""
    steers = state.request.steers
    assert steers is not None
    handed = state.steered

    async def take() -> list[dict[str, str]]:
        return [s for s in await steers() if s["turn_id"] not in handed]

    value = await state.tx.recorded(STEER_KEY.format(number), take)
    messages = []
    for steer in value:
        handed.add(steer["turn_id"])
        messages.append(steer["message"])
        state.emit("turn.steered", {"turn_id": steer["turn_id"], "round": number + 1})
        if state.sink is not None:
            state.sink.steered(steer["turn_id"], number + 1)
    return replace(last, steered=tuple(messages)) if messages else last


def _final_reply(state: TurnState, last: Interpretation) -> str | None:
    """The last round's text is the reply.

    A request opened in this turn may still be pending. Its prompt then follows the
    text, so the person reads exactly what they are asked to confirm. Without text, the
    kernel's own account of the steps is the reply (``None``)."""
    if not last.reply:
        return None
    lines = [last.reply]
    active = state.interaction
    if (
        active is not None
        and active.turn_id == state.scope.turn_id
        and active.prompt not in last.reply
    ):
        lines.append(active.prompt)
    return "\n".join(lines)


def stopped_reply(state: TurnState, last: Interpretation, rounds: int) -> str:
    """The reply of a turn that reached ``max_rounds``: the kernel's account of every
    step, and that it stopped (:meth:`~intention_kernel.Replies.stopped_after_rounds`)."""
    lines = [line for line in (last.reply, *state.replies) if line]
    lines.append(state.agent.agent.replies.stopped_after_rounds(rounds))
    return "\n".join(lines)
