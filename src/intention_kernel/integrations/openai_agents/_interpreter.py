"""The bridge's interpreter: each message to the agent's capability, in rounds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from intention_kernel.integrations.openai_agents._held import Conversation, dump
from intention_kernel.interpretation import (
    Answer,
    Decision,
    Intent,
    Interpretation,
    InterpretationRequest,
)
from intention_kernel.turns import StepStatus

__all__ = ["BridgeInterpreter"]


class BridgeInterpreter:
    """Routes each message to the agent's capability, in rounds: the run; the approval
    it asked for, if any; then nothing more (the run's output is the reply)."""

    multi_round = True

    def __init__(
        self,
        capability_id: str,
        fact_key: str,
        read_answer: Callable[[str], Answer | Decision | None] | None,
    ) -> None:
        self._capability_id = capability_id
        self._fact_key = fact_key
        self._read_answer = read_answer

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        if not request.rounds:
            active = request.interaction
            if active is not None and active.capability_id == self._capability_id:
                answer = self._read_answer(request.message) if self._read_answer else None
                if answer is not None:
                    # The person's own words answer the question they were shown; the
                    # kernel calls the capability again, which resumes the run.
                    return Interpretation(answer=answer)
                return Interpretation(reply=f"Answer this first: {active.prompt}")
            raw = request.facts.get(self._fact_key)
            try:
                conversation = Conversation.load(raw.value if raw is not None else None)
            except ValueError:
                conversation = Conversation()  # the capability reports it, as a failed step
            if conversation.pending and not conversation.asked:
                # A resumed run paused on another approval, in a turn with no rounds
                # left to ask it: it is asked now, before the agent reads anything new.
                return Interpretation(
                    intents=[self._approval(dump(conversation.pending))],
                    reply="Before anything else, the agent needs an approval.",
                )
            return Interpretation(
                intents=[Intent(self._capability_id, {"prompt": request.message})]
            )
        last = request.rounds[-1]
        # After the person's answer resumed the run, its step is the round's answer step.
        step = last.steps[-1] if last.steps else last.answer_step
        if step is None:
            return Interpretation()
        if step.status == StepStatus.AWAITING_CONFIRMATION:
            return Interpretation(reply="The agent asks for your approval.")
        value = step.value
        if step.status == StepStatus.COMPLETED and isinstance(value, dict) and "approvals" in value:
            return Interpretation(intents=[self._approval(value["approvals"])])
        return Interpretation()

    def _approval(self, calls: Any) -> Intent:
        return Intent(self._capability_id, {"approvals": calls})
