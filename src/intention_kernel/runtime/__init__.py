"""The turn graph: interpret → answer → plan → execute → reply.

Each step is a function over one :class:`~intention_kernel.runtime.state.TurnState`;
:func:`run_turn` wires them in that fixed order. The runtime never imports an
adapter: it sees only the ``TurnTransaction`` handed to it by ``with_turn``.
"""

from __future__ import annotations

from intention_kernel.agent import CompiledAgent
from intention_kernel.durability import TurnTransaction
from intention_kernel.interpretation import Answer
from intention_kernel.runtime.answer import handle_answer
from intention_kernel.runtime.interpret import interpret
from intention_kernel.runtime.plan import plan_intent
from intention_kernel.runtime.reply import finish
from intention_kernel.runtime.state import TurnRequest, TurnState
from intention_kernel.turns import TurnCommit

__all__ = ["TurnRequest", "run_turn"]


async def run_turn(agent: CompiledAgent, tx: TurnTransaction, request: TurnRequest) -> TurnCommit:
    state = TurnState(agent, tx, request)
    interpretation = await interpret(state)
    answer = request.answer
    if answer is None and interpretation.answer is not None:
        answer = (
            interpretation.answer
            if isinstance(interpretation.answer, Answer)
            else Answer(None, interpretation.answer)
        )
    proceed = True
    if answer is not None:
        proceed = await handle_answer(state, answer)
    if proceed:
        for intent in interpretation.intents:
            await plan_intent(state, intent)
    return finish(state, interpretation)
