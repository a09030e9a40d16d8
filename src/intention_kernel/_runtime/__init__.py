"""The turn graph: interpret → answer → plan → execute → reply.

Each step is a function over one :class:`~intention_kernel._runtime.state.TurnState`.
:func:`run_turn` wires them in that fixed order. An interpreter that works in rounds
is asked again after the steps it asked for ran (:mod:`~intention_kernel._runtime.rounds`).
Each of its rounds is recorded before its steps run (:mod:`~intention_kernel._runtime.journal`).
The runtime never imports an adapter. It sees only the ``TurnTransaction`` handed to
it by ``with_turn``.
"""

from __future__ import annotations

from dataclasses import replace

from intention_kernel._agent import CompiledAgent
from intention_kernel._deadlines import Clock, overdue, read_clock
from intention_kernel._interpretation import Answer, Interpretation
from intention_kernel._runtime.answer import handle_answer
from intention_kernel._runtime.interpret import interpret
from intention_kernel._runtime.journal import interpret_recorded
from intention_kernel._runtime.plan import plan_intent
from intention_kernel._runtime.reply import finish, stopped
from intention_kernel._runtime.rounds import continue_rounds
from intention_kernel._runtime.state import TurnRequest, TurnState
from intention_kernel._turns import StepResult, TurnCommit
from intention_kernel.durability import TurnTransaction
from intention_kernel.errors import TurnCancelledError

__all__ = ["TurnRequest", "run_turn"]


async def run_turn(
    agent: CompiledAgent, tx: TurnTransaction, request: TurnRequest, clock: Clock
) -> TurnCommit:
    # Read under the thread's lock: ``with_turn`` calls the operation holding it. So
    # no other turn or sweep decides this thread's deadlines meanwhile.
    if request.queued and request.stop is not None:
        base = tx.checkpoint.version if tx.checkpoint is not None else 0
        cancelled = await request.stop(base, True)
    else:
        cancelled = None
    if cancelled is not None:
        # A queued turn cancelled after a drain read it: nothing runs or commits.
        raise TurnCancelledError(
            f"turn {tx.scope.turn_id!r} of thread {tx.scope.thread_id!r} was cancelled "
            "before it ran",
            thread_id=tx.scope.thread_id,
            turn_id=tx.scope.turn_id,
        )
    state = TurnState(agent, tx, request, read_clock(clock))
    if state.interaction is not None and overdue(state.interaction, state.now):
        # Before interpretation: the interpreter never sees an expired question as
        # pending, and a late accept finds it closed (``handle_answer``).
        state.expire_interaction()
    # A timer's turn is asked in rounds as a person's message is (its message may be None).
    in_rounds = agent.max_rounds > 1 and (request.message is not None or request.timer is not None)
    # A turn in rounds records each round before its steps run (``journal``). A
    # one-round turn asks once and records nothing, at exactly its former cost.
    interpretation = await (interpret_recorded(state) if in_rounds else interpret(state))
    if (
        state.interaction is not None  # (``_accepts``' first test, without its frame)
        and _accepts(state, interpretation)
        and (stop := await stopped(state, interpretation, at_once=True)) is not None
    ):
        # A safe point before the accept runs its write. A cancel recorded before the
        # turn came stops it there. The confirmation stays open.
        return stop
    if request.answer is None and interpretation.answer is None:
        answer_step, proceed = None, True  # no answer: ``_answer`` would do nothing
    else:
        answer_step, proceed = await _answer(state, interpretation)
    if proceed:
        for intent in interpretation.intents:
            if (stop := await stopped(state, interpretation)) is not None:
                return stop
            await plan_intent(state, intent)
    if in_rounds and proceed:
        return await continue_rounds(state, interpretation, answer_step)
    return finish(state, interpretation)


def _accepts(state: TurnState, interpretation: Interpretation) -> bool:
    """Whether the turn accepts the thread's open confirmation (and may run its write)."""
    if state.interaction is None or state.request.stop is None:
        return False
    answer = state.request.answer or interpretation.answer
    if answer is None:
        return False
    return (answer.decision if isinstance(answer, Answer) else answer) == "accept"


async def _answer(
    state: TurnState, interpretation: Interpretation
) -> tuple[StepResult | None, bool]:
    """Apply the turn's answer before any intent.

    The answer is the request's, else the interpretation's. Return the step it ran,
    and whether the turn goes on (``False``: refused)."""
    answer = state.request.answer
    if answer is None and interpretation.answer is not None:
        answer = (
            interpretation.answer
            if isinstance(interpretation.answer, Answer)
            else Answer(None, interpretation.answer)
        )
    if answer is None:
        return None, True
    principal = state.request.principal
    if principal is not None and answer.actor != principal.name:
        # The turn's sender answers, whatever the interpreter wrote: a model never names
        # the approver. ``Kernel.turn`` already set it on the request's own answer.
        answer = replace(answer, actor=principal.name)
    elif principal is None and answer.actor is not None and answer is not state.request.answer:
        # No one vouches for an actor the interpreter wrote. Kept, it would pass a policy
        # on a model's say-so, or an injected prompt's. It could also count as one of a
        # quorum's distinct approvers.
        answer = replace(answer, actor=None)
    before = len(state.steps)
    proceed = await handle_answer(state, answer)
    return (state.steps[before] if len(state.steps) > before else None), proceed
