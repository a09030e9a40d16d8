"""What a relay publishes to: the ``Sink`` protocol, the wire form of an event, and the
sink that calls a Python function."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from intention_kernel._calls import is_async_callable
from intention_kernel._json import dump_value
from intention_kernel._turns import OutboxEvent

__all__ = ["CallableSink", "Sink", "event_body", "event_document"]


@runtime_checkable
class Sink(Protocol):
    """A destination for outbox events.

    ``publish`` returns once the destination acknowledged the event (a JetStream
    ack, a 2xx answer, a function that returned) and raises otherwise. It may see an
    event again after a crash (delivery is at least once): destinations dedupe on
    ``event.id``.
    """

    async def publish(self, event: OutboxEvent) -> None:
        """Deliver one event; return once acknowledged, raise otherwise."""
        ...

    async def aclose(self) -> None:
        """Release the connection or client, if the sink holds one."""
        ...


def event_document(event: OutboxEvent) -> dict[str, Any]:
    """An event as a JSON object: every field, ``created_at`` in ISO 8601."""
    return {
        "id": event.id,
        "position": event.position,
        "thread_id": event.thread_id,
        "turn_id": event.turn_id,
        "seq": event.seq,
        "type": event.type,
        "payload": event.payload,
        "created_at": event.created_at.isoformat(),
    }


def event_body(event: OutboxEvent) -> bytes:
    """The bytes every bundled sink sends: :func:`event_document` as compact UTF-8 JSON."""
    return dump_value(event_document(event)).encode()


class CallableSink:
    """Calls ``fn(event)`` for each event; ``fn`` may be sync or async.

    ``fn`` acknowledges by returning; an exception is a failed attempt.
    A sync ``fn`` runs in a worker thread (``asyncio.to_thread``).
    A blocking client would otherwise stall every other task of the process.
    Most queue and HTTP SDKs are blocking clients.
    The tasks stalled would include the relay's other threads and any turns.
    """

    def __init__(self, fn: Callable[[OutboxEvent], Awaitable[Any] | Any]) -> None:
        if not callable(fn):
            raise TypeError(f"a callable sink needs a callable, got {type(fn).__name__}")
        self.fn = fn

    async def publish(self, event: OutboxEvent) -> None:
        """Call the function; a sync one runs in a worker thread."""
        if is_async_callable(self.fn):
            result = self.fn(event)
        else:
            result = await asyncio.to_thread(self.fn, event)
        if inspect.isawaitable(result):  # a sync function returning an awaitable
            await result

    async def aclose(self) -> None:
        """Nothing to release: the function owns its resources."""
