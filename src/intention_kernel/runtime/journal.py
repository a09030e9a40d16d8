"""Recorded rounds: each model round's interpretation, in the turn's journal before any
step of that round runs.

A turn of an interpreter that works in rounds asks for each round through
``tx.recorded``: a delivery of the same turn ID after a crash finds the rounds already
answered in the journal and takes them from there, so the interpreter (a model) is not
asked again for a round it answered, and the steps run again from the same decisions.
Writes among those steps are settled by their receipts (a completed one returns its
stored value and is not run again); reads run again and return what they return now.

A round is recorded only if a step can run after it in this turn: one with intents,
or with an answer to apply (the interpreter's or, in the first round, the request's).
A round that asks for nothing is the turn's last, and the commit that follows it at
once is its record: a separate write would only move the window in which a crash
loses it, not close it. A one-round interpreter never records anything.

Every round goes on from the value as the store reads it back (``tx.recorded`` returns
it), in the first delivery too, so that a redelivery makes exactly the same decisions.
A streamed redelivery streams the text of each round it takes from the journal as one
``delta``, so that its stream carries the turn's text as a live delivery's does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from intention_kernel.errors import CorruptRecordError, InterpretationError, JournalError
from intention_kernel.interpretation import Answer, Intent, Interpretation, Round
from intention_kernel.runtime.interpret import interpret
from intention_kernel.runtime.state import TurnState

__all__ = ["ROUND_KEY", "decode_round", "encode_round", "interpret_recorded"]

#: The journal key of round N (from 1); the runtime's keys start with ``kernel.``.
ROUND_KEY = "kernel.round.{}"


async def interpret_recorded(state: TurnState, rounds: tuple[Round, ...] = ()) -> Interpretation:
    """The interpretation of the round after ``rounds``: from the journal if this turn ID
    recorded it, else asked of the interpreter and recorded before it is returned."""
    number = len(rounds) + 1
    key = ROUND_KEY.format(number)
    answer_pending = number == 1 and state.request.answer is not None
    asked = False

    async def ask() -> dict[str, Any]:
        nonlocal asked
        asked = True
        return encode_round(await interpret(state, rounds))

    def asks_for_steps(value: Any) -> bool:
        return bool(value["intents"]) or value["answer"] is not None or answer_pending

    try:
        value = await state.tx.recorded(key, ask, keep=asks_for_steps)
    except JournalError as exc:
        raise InterpretationError(
            f"the interpreter returned an interpretation that cannot be recorded: {exc}",
            thread_id=state.scope.thread_id,
            turn_id=state.scope.turn_id,
        ) from exc
    interpretation = decode_round(value, state, key)
    if not asked and state.sink is not None and interpretation.reply:
        # A streamed redelivery shows the text of a round it took from the journal, as
        # the model's stream showed it live: one delta, where the model sent pieces.
        state.sink.delta(interpretation.reply)
    return interpretation


def encode_round(interpretation: Interpretation) -> dict[str, Any]:
    """A checked interpretation as a JSON document (not yet normalized: intent inputs
    and the response as the interpreter gave them)."""
    answer = interpretation.answer
    return {
        "intents": [
            {
                "capability_id": intent.capability_id,
                "input": dict(intent.input) if isinstance(intent.input, Mapping) else intent.input,
                "error": intent.error,
            }
            for intent in interpretation.intents
        ],
        "answer": answer.to_dict() if isinstance(answer, Answer) else answer,
        "reply": interpretation.reply,
        "response": interpretation.response,
    }


def decode_round(value: Any, state: TurnState, key: str) -> Interpretation:
    """The interpretation a recorded document holds; ``CorruptRecordError`` if it holds
    none."""
    try:
        intents = [
            Intent(intent["capability_id"], intent["input"], intent["error"])
            for intent in value["intents"]
        ]
        answer = value["answer"]
        if isinstance(answer, dict):
            answer = Answer(**answer)
        elif answer not in (None, "accept", "reject"):
            raise ValueError(f"answer {answer!r}")
        reply = value["reply"]
        if reply is not None and not isinstance(reply, str):
            raise ValueError("the reply is not text")
        return Interpretation(intents, answer, reply, value["response"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptRecordError(
            f"the recorded round {key!r} of turn {state.scope.turn_id!r} cannot be decoded: "
            f"{type(exc).__name__}: {exc}",
            thread_id=state.scope.thread_id,
            turn_id=state.scope.turn_id,
            key=key,
        ) from exc
