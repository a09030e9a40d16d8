"""A streamed turn as server-sent events.

The client sends ``POST /v1/threads/{id}/turns`` with ``Accept: text/event-stream``.

Each :class:`~intention_kernel.TurnEvent` is one event.
It has ``event: <type>``, ``data: <JSON>`` and ``id: <event ID>``.
The last is ``result``, the same document the JSON answer carries.
A retry that sends ``Last-Event-ID`` resumes after that event.

The response starts only once the turn's first event is there.
So a turn refused before it ran anything answers problem details with its status.
A conflict, a busy thread or a failing model is such a refusal.
This is the same as without streaming.
A failure after that arrives as an ``error`` event carrying problem details.
It ends the stream.
Nothing was committed, and the client retries with the same turn ID.

A client that disconnects does not abort the turn.
The response stops reading it, and the turn runs on to its commit.
:meth:`~intention_kernel.Kernel.stream_turn` says more.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse

from intention_kernel._streaming import TurnEvent
from intention_kernel.errors import KernelError
from intention_kernel.host._problems import HostProblem, problem_body, problem_for

__all__ = ["EVENT_STREAM", "accepts_event_stream", "event_stream_response", "stream_events"]

EVENT_STREAM = "text/event-stream"

log = logging.getLogger("intention_kernel.host")


def accepts_event_stream(accept: str) -> bool:
    """Whether an ``Accept`` header asks for ``text/event-stream`` (with a non-zero q)."""
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if media.lower() != EVENT_STREAM:
            continue
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def event_stream_response(
    first: TurnEvent,
    rest: AsyncIterator[TurnEvent],
    headers: dict[str, str],
    *,
    thread_id: str,
    turn_id: str,
) -> StreamingResponse:
    """The response streaming ``first`` and then ``rest``."""
    return StreamingResponse(
        stream_events(first, rest, thread_id=thread_id, turn_id=turn_id),
        media_type=EVENT_STREAM,
        headers={
            **headers,
            "Cache-Control": "no-store",
            # A buffering proxy (nginx) would hold the events until the turn ends.
            "X-Accel-Buffering": "no",
        },
    )


async def stream_events(
    first: TurnEvent, rest: AsyncIterator[TurnEvent], *, thread_id: str, turn_id: str
) -> AsyncIterator[str]:
    """``first`` and then ``rest`` as server-sent events; a failure as ``error``."""
    yield _event(first.type, first.data, first.id)
    try:
        async for event in rest:
            yield _event(event.type, event.data, event.id)
    except KernelError as error:
        problem = problem_for(error, thread_id=thread_id, turn_id=turn_id)
        log.warning("streamed turn %r of thread %r failed: %s", turn_id, thread_id, problem.detail)
        yield _event("error", problem_body(problem))
    except Exception:
        log.exception("streamed turn %r of thread %r failed", turn_id, thread_id)
        detail = "an unexpected error occurred; see the server log"
        problem = HostProblem("internal-error", detail, thread_id=thread_id, turn_id=turn_id)
        yield _event("error", problem_body(problem))


def _event(type: str, data: Any, id: str | None = None) -> str:
    # ``json.dumps`` escapes every newline, so the data is always one ``data:`` line.
    # An event ID holds only digits, dots and letters (``_turnstream``), so it is one line.
    event = f"event: {type}\ndata: {json.dumps(data, ensure_ascii=False)}\n"
    return f"{event}id: {id}\n\n" if id is not None else event + "\n"
