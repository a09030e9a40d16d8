"""ScriptedInterpreter: deterministic interpretations for tests and examples."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from intention_kernel.interpretation import Interpretation, InterpretationRequest

__all__ = ["ScriptedInterpreter"]


class ScriptedInterpreter:
    """Interprets by lookup (``{message: Interpretation}``) or by a callable.

    An unknown message gives an interpretation with no intents. ``calls``
    records every request, so a test can assert that a replay interpreted
    nothing.
    """

    def __init__(
        self,
        script: Mapping[str, Interpretation] | Callable[[InterpretationRequest], Interpretation],
    ) -> None:
        self._script = script
        self.calls: list[InterpretationRequest] = []

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        self.calls.append(request)
        if callable(self._script):
            return self._script(request)
        return self._script.get(request.message, Interpretation())
