"""Step 1: ask the interpreter what the message means, and check what it says."""

from __future__ import annotations

from collections.abc import Sequence

from intention_kernel import _tracing
from intention_kernel._interpretation import (
    Answer,
    Intent,
    Interpretation,
    InterpretationRequest,
    Round,
)
from intention_kernel._runtime.state import TurnState
from intention_kernel.errors import InterpretationError

__all__ = ["interpret"]


async def interpret(state: TurnState, rounds: tuple[Round, ...] = ()) -> Interpretation:
    """The interpretation of this turn's message (none when only an answer was sent),
    in the round that follows ``rounds``.

    An interpreter may raise, or return something that is not an ``Interpretation``.
    That fails the turn with :class:`InterpretationError` before anything ran or was
    written. So the same delivery can be retried.
    """
    message, timer = state.request.message, state.request.timer
    if message is None:
        if timer is None:
            return Interpretation()
        message = timer.message or ""  # a timer's turn: see ``FiredTimer``
    request = InterpretationRequest(
        thread_id=state.scope.thread_id,
        turn_id=state.scope.turn_id,
        message=message,
        messages=state.previous.messages if state.previous else (),
        facts=state.facts,
        interaction=state.interaction,
        catalog=state.agent.catalog,
        rounds=rounds,
        stream=state.sink.delta if state.sink is not None else None,
        timer=timer,
    )
    interpreter = state.agent.agent.interpreter
    try:
        if not state.traced:  # no span, not even the no-op one: a turn's common case
            result = await interpreter.interpret(request)
        else:
            with _tracing.span(
                "intention_kernel.interpret",
                thread_id=state.scope.thread_id,
                turn_id=state.scope.turn_id,
                round=len(rounds) + 1 if rounds else None,  # a later round only
            ):
                result = await interpreter.interpret(request)
    except Exception as exc:
        raise InterpretationError(
            f"the interpreter failed: {type(exc).__name__}: {exc}",
            thread_id=state.scope.thread_id,
            turn_id=state.scope.turn_id,
        ) from exc
    return _checked(result, state)


def _checked(result: object, state: TurnState) -> Interpretation:
    def bad(why: str) -> InterpretationError:
        return InterpretationError(
            f"the interpreter returned an invalid interpretation: {why}",
            thread_id=state.scope.thread_id,
            turn_id=state.scope.turn_id,
        )

    if not isinstance(result, Interpretation):
        raise bad(f"expected an Interpretation, got {type(result).__name__}")
    intents = result.intents
    # Exact types first: ``isinstance`` against ``Sequence`` runs the ABC machinery.
    if (
        type(intents) is not list
        and type(intents) is not tuple
        and (isinstance(intents, (str, bytes)) or not isinstance(intents, Sequence))
    ):
        raise bad("intents must be a sequence of Intent")
    for intent in intents:
        if type(intent) is not Intent and not isinstance(intent, Intent):
            raise bad(f"intents must be Intent objects, got {type(intent).__name__}")
        # An input that is not a mapping is the capability's problem: it becomes a
        # failed step (``Capability.parse_input``), not a failed turn.
    answer = result.answer
    if answer is not None:
        if isinstance(answer, Answer):
            if answer.decision not in ("accept", "reject"):
                raise bad(
                    f"an answer's decision must be 'accept' or 'reject', not {answer.decision!r}"
                )
        elif answer not in ("accept", "reject"):
            raise bad(f"answer must be 'accept', 'reject' or an Answer, got {answer!r}")
    if result.reply is not None and not isinstance(result.reply, str):
        raise bad("reply must be a string")
    if result.reply is not None and not result.reply.isascii():
        try:
            result.reply.encode("utf-8")
        except UnicodeEncodeError:
            raise bad("the reply is not valid Unicode text (a lone surrogate)") from None
    return result
