"""Recorded rounds: each model round's interpretation, in the turn's journal before any
step of that round runs.

A turn of an interpreter that works in rounds asks for each round through
``tx.recorded``. A delivery of the same turn ID after a crash finds the answered rounds
in the journal and takes them from there. So the interpreter (a model) is not asked
again for a round it answered. The steps run again from the same decisions. Writes
among those steps are settled by their receipts: a completed one returns its stored
value and is not run again. Reads run again and return what they return now.

A round is recorded only if a step can run after it in this turn. That is a round
with intents, or with an answer to apply. The answer is the interpreter's or, in the
first round, the request's. A round that asks for nothing is the turn's last. The
commit that follows it at once is its record. A separate write would only move the
window in which a crash loses it, not close it. A one-round interpreter never records
anything.

Every round goes on from the value as the store reads it back (``tx.recorded`` returns
it), in the first delivery too. So a redelivery makes exactly the same decisions. A
streamed redelivery streams each round it takes from the journal as it was recorded
(:mod:`intention_kernel._turnstream`). It sends the same events, with the same IDs. A round
recorded without its events was not streamed in its delivery. It is streamed as its
text, one ``delta``, so the stream carries the turn's text as a live delivery's does.

A model's arguments may hold what no store can (NaN, infinity, a lone surrogate). A
one-round turn fails that step; a round must too, not the whole turn. So a round is
recorded with what can be kept. Such an intent keeps its capability and says why its
input was not kept (``error``, a failed step). The model's response is kept with those
values spelled out as text (:func:`~intention_kernel._json.storable_copy`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from intention_kernel._interpretation import Answer, Intent, Interpretation, Round
from intention_kernel._json import MAX_NESTING, describe_error, normalize, storable_copy, too_deep
from intention_kernel._runtime.interpret import interpret
from intention_kernel._runtime.state import TurnState
from intention_kernel.durability._engine.transaction import Transaction
from intention_kernel.errors import CorruptRecordError, InterpretationError, JournalError

__all__ = ["ROUND_KEY", "decode_round", "encode_round", "interpret_recorded"]

#: The journal key of round N (from 1); the runtime's keys start with ``kernel.``.
ROUND_KEY = "kernel.round.{}"


async def interpret_recorded(state: TurnState, rounds: tuple[Round, ...] = ()) -> Interpretation:
    """The interpretation of the round after ``rounds``.

    It comes from the journal if this turn ID recorded it. Else it is asked of the
    interpreter, and recorded before it is returned."""
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

    sink = state.sink
    record = sink.record if sink is not None else None
    try:
        if record is not None and type(state.tx) is Transaction:
            # The events since the last round go with this round's entry.
            value = await state.tx.recorded(
                key, ask, keep=asks_for_steps, stream=record.segment_text
            )
        else:
            value = await state.tx.recorded(key, ask, keep=asks_for_steps)
    except JournalError as exc:
        raise InterpretationError(
            f"the interpreter returned an interpretation that cannot be recorded: {exc}",
            thread_id=state.scope.thread_id,
            turn_id=state.scope.turn_id,
        ) from exc
    interpretation = decode_round(value, state, key)
    if sink is None:
        return interpretation
    if record is not None:
        if not asked:  # the round's events as recorded, with their IDs
            await record.replay(sink, interpretation.reply)
        elif value["intents"] or value["answer"] is not None or answer_pending:  # recorded
            record.advance()
            sink.wake()
    elif not asked and interpretation.reply:
        # A streamed redelivery shows the text of a round it took from the journal. It
        # shows it as one delta, where the model's live stream sent pieces.
        sink.delta(interpretation.reply)
    return interpretation


def encode_round(interpretation: Interpretation) -> dict[str, Any]:
    """A checked interpretation as a JSON document that every store can hold.

    An intent whose input cannot be stored is kept as a failed one. The response is
    kept with its unstorable values spelled out. Anything else that is not JSON is left
    for ``tx.recorded`` to refuse: the interpreter itself returned garbage."""
    answer = interpretation.answer
    return {
        "intents": [_encode_intent(intent) for intent in interpretation.intents],
        "answer": answer.to_dict() if isinstance(answer, Answer) else answer,
        "reply": interpretation.reply,
        "response": _storable_response(interpretation.response),
    }


def _encode_intent(intent: Intent) -> dict[str, Any]:
    raw = dict(intent.input) if isinstance(intent.input, Mapping) else intent.input
    try:
        kept = normalize(raw)
    except (TypeError, ValueError) as exc:
        # No store holds the input, so no delivery could run it. It is a failed step, as
        # in a one-round turn. Recorded so, every delivery fails the same step the same way.
        why = f"the arguments hold a value no store can hold ({describe_error(exc)})"
        return {"capability_id": intent.capability_id, "input": {}, "error": intent.error or why}
    return {"capability_id": intent.capability_id, "input": kept, "error": intent.error}


def _storable_response(response: Any) -> Any:
    """The interpreter's response, with NaN, infinities and lone surrogates spelled out
    if it holds any. It is only shown to the interpreter again, never run."""
    try:
        return normalize(response)
    except (TypeError, ValueError):
        if too_deep(response, MAX_NESTING):
            return response  # refused by ``tx.recorded``, with its reason
        return storable_copy(response)


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
