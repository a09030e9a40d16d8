"""Streaming a turn: the events :meth:`Kernel.stream_turn` yields while the turn runs.

A streamed turn is an ordinary durable turn that also reports what it does as it does
it, through a :class:`TurnSink` handed to the runtime on the turn's request. Without a
sink (``kernel.turn``) the runtime reports nothing and pays for nothing but one
``is None`` test at each place that would report.

Every event before ``result`` is provisional: a turn that fails before its commit has
streamed steps that never happened as far as the store knows, and its retry with the
same turn ID runs again. Only ``result`` is what committed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from intention_kernel._adapters import LazyAdapter
from intention_kernel.checkpoint import Interaction
from intention_kernel.turns import StepResult

__all__ = ["TurnEvent", "TurnEventType", "TurnSink"]

TurnEventType = Literal[
    "delta", "step", "interaction", "queued", "steered", "interrupted", "cancelled", "result"
]

# The same serializations as inside ``TurnResult.to_dict()``.
# Built at their first use (see ``_adapters``).
_STEP = LazyAdapter(StepResult)
_INTERACTION = LazyAdapter(Interaction)


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """One event of a streamed turn; ``data`` is a JSON value.

    - ``delta``: ``{"text": ...}``, a piece of the model's text as it arrives (only from
      an interpreter that streams, such as ``OpenAIInterpreter``).
    - ``step``: a step's result as it finished, as in ``TurnResult.to_dict()["steps"]``.
      A step may be reported again with a later status (a request superseded later in
      the same turn is reported ``rejected``).
    - ``interaction``: an interaction opened by the turn, as in ``TurnResult.to_dict()``.
    - ``queued``: the turn's message waits in its thread's inbox (an agent with
      ``on_busy`` ``"queue"``, ``"steer"`` or ``"interrupt"``), as
      ``Queued.to_dict()``. The stream goes on once the turn runs.
    - ``steered``: ``{"turn_id", "round"}``, a message sent to steer this turn was
      handed to it, before round ``round``.
    - ``interrupted`` / ``cancelled``: ``{"reply": ...}``, the turn stops at a safe
      point (a new message, ``Kernel.cancel``); it commits what it did.
    - ``result``: the last event, ``TurnResult.to_dict()`` of the committed turn.
    """

    type: TurnEventType
    data: Any

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON values: ``{"type": ..., "data": ...}``."""
        return {"type": self.type, "data": self.data}


class TurnSink:
    """Where the runtime reports a streamed turn's events: a queue the stream reads.

    The runtime calls it from the turn's own task. Once the stream's reader is gone
    (:meth:`detach`), events are dropped, and the turn runs on to its commit.
    """

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: asyncio.Queue[TurnEvent | BaseException] | None = asyncio.Queue()

    def delta(self, text: str) -> None:
        """A piece of the model's text (``InterpretationRequest.stream``)."""
        if text:
            self._put(TurnEvent("delta", {"text": text}))

    def step(self, step: StepResult) -> None:
        self._put(TurnEvent("step", _STEP().dump_python(step, mode="json")))

    def interaction(self, interaction: Interaction) -> None:
        self._put(TurnEvent("interaction", _INTERACTION().dump_python(interaction, mode="json")))

    def queued(self, data: dict[str, Any]) -> None:
        """The turn waits in its thread's inbox (``Queued.to_dict()``)."""
        self._put(TurnEvent("queued", data))

    def steered(self, turn_id: str, round: int) -> None:
        """The message of ``turn_id`` was handed to this turn, before ``round``."""
        self._put(TurnEvent("steered", {"turn_id": turn_id, "round": round}))

    def stopped(self, kind: Literal["interrupted", "cancelled"], reply: str) -> None:
        """The turn stops at a safe point; ``reply`` is the line it ends with."""
        self._put(TurnEvent(kind, {"reply": reply}))

    def result(self, data: dict[str, Any]) -> None:
        self._put(TurnEvent("result", data))

    def fail(self, error: BaseException) -> None:
        """The turn raised ``error``: the reader raises it in turn."""
        if self._queue is not None:
            self._queue.put_nowait(error)

    def detach(self) -> None:
        """The reader is gone: drop whatever comes next."""
        self._queue = None

    async def next(self) -> TurnEvent | BaseException:
        assert self._queue is not None, "a detached sink has no reader"
        return await self._queue.get()

    def _put(self, event: TurnEvent) -> None:
        if self._queue is not None:
            self._queue.put_nowait(event)
