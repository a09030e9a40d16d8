"""Streaming a turn: the events :meth:`Kernel.stream_turn` yields while the turn runs.

A streamed turn is an ordinary durable turn that also reports what it does as it does
it. It reports through a :class:`TurnSink` handed to the runtime on the turn's request.
Without a sink (``kernel.turn``) the runtime reports nothing. It pays for nothing but
one ``is None`` test at each place that would report.

Every event before ``result`` is provisional. A turn that fails before its commit has
streamed steps that never happened, as far as the store knows. Its retry with the
same turn ID runs again. Only ``result`` is what committed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from intention_kernel._adapters import LazyAdapter
from intention_kernel._checkpoint import Interaction
from intention_kernel._turns import StepResult

__all__ = ["StopKind", "TurnEvent", "TurnEventType", "TurnSink"]

TurnEventType = Literal[
    "delta", "step", "interaction", "queued", "steered", "interrupted", "cancelled", "result"
]

#: What stopped a turn at a safe point: a person's message, or ``Kernel.cancel``.
StopKind = Literal["interrupted", "cancelled"]

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
      It adds ``input``: the capability input that ran, as its receipt records it
      (after edits and ``redact``). ``input`` is ``None`` for a step that ran nothing (refused,
      held for a confirmation, rejected). A step may be reported again with a later
      status (a request superseded later in the same turn is reported ``rejected``).
    - ``interaction``: an interaction opened by the turn, as in ``TurnResult.to_dict()``.
    - ``queued``: the turn's message waits in its thread's inbox (an agent with
      ``on_busy`` ``"queue"``, ``"steer"`` or ``"interrupt"``), as
      ``Queued.to_dict()``. The stream goes on once the turn runs.
    - ``steered``: ``{"turn_id", "round"}``, a message sent to steer this turn was
      handed to it, before round ``round``.
    - ``interrupted`` / ``cancelled``: ``{"reply": ...}``, the turn stops at a safe
      point (a new message, ``Kernel.cancel``); it commits what it did.
    - ``result``: the last event, ``TurnResult.to_dict()`` of the committed turn.

    ``id`` orders the turn's events: ``"<round>.<sequence>.<delivery>"``, and
    ``"result"`` for the last. A stream resumes after any of them
    (:meth:`Kernel.watch_turn <intention_kernel.Kernel.watch_turn>`).
    """

    type: TurnEventType
    data: Any
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON values: ``{"type": ..., "data": ...}``."""
        return {"type": self.type, "data": self.data}


class TurnSink:
    """Where the runtime reports a streamed turn's events: a queue the stream reads.

    The runtime calls it from the turn's own task. Each event gets its ID here, and is
    kept until the journal entry of the next round records it
    (:mod:`intention_kernel._turnstream`). Once the stream's reader is gone
    (:meth:`detach`), events are still kept for the record, and the turn runs on to its
    commit. A reader that falls ``limit`` events behind is dropped: its stream goes on
    from the store (``lagging``).
    """

    __slots__ = ("_changed", "_queue", "_unread", "lagging", "limit", "record")

    def __init__(self, record: Any = None, *, limit: int = 0) -> None:
        self._queue: asyncio.Queue[TurnEvent | BaseException | None] | None = asyncio.Queue()
        #: The turn's recording (``_turnstream.Recording``), or ``None``.
        self.record = record
        #: The most events a reader may fall behind (0: no bound).
        self.limit = limit
        #: Whether the reader fell ``limit`` events behind, and was dropped.
        self.lagging = False
        self._unread = 0  # events in the queue: ``qsize()`` without its two calls
        # Set at the next recorded round or the turn's end; made when a watcher asks.
        self._changed: asyncio.Event | None = None

    def delta(self, text: str) -> None:
        """A piece of the model's text (``InterpretationRequest.stream``)."""
        if text:
            self._put("delta", {"text": text})

    def step(self, step: StepResult, input: Any = None) -> None:
        """A finished step, and the input it ran with (``None``: it ran nothing)."""
        data = _STEP().dump_python(step, mode="json")
        data["input"] = input
        self._put("step", data)

    def interaction(self, interaction: Interaction) -> None:
        self._put("interaction", _INTERACTION().dump_python(interaction, mode="json"))

    def queued(self, data: dict[str, Any]) -> None:
        """The turn waits in its thread's inbox (``Queued.to_dict()``)."""
        self._put("queued", data)

    def steered(self, turn_id: str, round: int) -> None:
        """The message of ``turn_id`` was handed to this turn, before ``round``."""
        self._put("steered", {"turn_id": turn_id, "round": round})

    def stopped(self, kind: StopKind, reply: str) -> None:
        """The turn stops at a safe point; ``reply`` is the line it ends with."""
        self._put(kind, {"reply": reply})

    def result(self, data: dict[str, Any]) -> None:
        self.offer(TurnEvent("result", data, "result"))
        self.wake()

    def fail(self, error: BaseException) -> None:
        """The turn raised ``error``: the reader raises it in turn."""
        if self._queue is not None and not self.lagging:
            self._queue.put_nowait(error)
        self.wake()

    def detach(self) -> None:
        """The reader is gone: drop whatever comes next."""
        self._queue = None

    def changed(self) -> asyncio.Event:
        """An event set at the next recorded round or the turn's end (for watchers)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def wake(self) -> None:
        """Wake the turn's watchers: a round was recorded, or the turn ended."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def next(self) -> TurnEvent | BaseException | None:
        """The next event, the turn's error, or ``None`` once the reader lags."""
        assert self._queue is not None, "a detached sink has no reader"
        self._unread -= 1
        return await self._queue.get()

    def offer(self, event: TurnEvent) -> None:
        """Hand ``event`` to the reader, unless it is gone or lags."""
        queue = self._queue
        if queue is None or self.lagging:
            return
        if self.limit and self._unread >= self.limit:
            self.lagging = True
            queue.put_nowait(None)  # the reader goes on from the store
            return
        self._unread += 1
        queue.put_nowait(event)

    def _put(self, type: TurnEventType, data: Any) -> None:
        record = self.record
        if record is None:
            self.offer(TurnEvent(type, data))
        else:
            event = record.stamp(type, data)
            if event is not None:
                self.offer(event)
