"""ScriptedInterpreter: deterministic interpretations for tests and examples."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from intention_kernel._interpretation import Interpretation, InterpretationRequest

__all__ = ["ScriptedInterpreter"]


class ScriptedInterpreter:
    """Interprets by lookup (``{message: Interpretation}``) or by a callable.

    An unknown message gives an interpretation with no intents.
    ``calls`` records every request.
    So a test can assert that a replay interpreted nothing.
    With ``multi_round=True`` it works in rounds.
    A callable script is then asked again after each round's steps ran.
    ``request.rounds`` says what they did.
    A lookup script answers a later round with no intents.
    """

    def __init__(
        self,
        script: Mapping[str, Interpretation] | Callable[[InterpretationRequest], Interpretation],
        *,
        multi_round: bool = False,
    ) -> None:
        self._script = script
        self.multi_round = multi_round
        self.calls: list[InterpretationRequest] = []

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        """The script's interpretation of the request, which ``calls`` records."""
        self.calls.append(request)
        if callable(self._script):
            return self._script(request)
        if request.rounds:
            return Interpretation()
        return self._script.get(request.message, Interpretation())
