"""Detached turns and resumable streams on the host.

- ``POST /v1/threads/{id}/turns`` may send ``Prefer: respond-async`` (RFC 7240).
  The host then accepts the turn into its thread's inbox and answers ``202`` at once.
  The answer has the turn's URL in ``Location``, and ``Preference-Applied: respond-async``.
  The turn runs to its commit whether or not anybody watches it.
  :meth:`~intention_kernel.Kernel.detach_turn` does this.
- ``GET .../turns/{turn_id}`` answers its :class:`~intention_kernel.TurnStatus`.
- ``GET .../turns/{turn_id}/events`` streams its events as server-sent events.
  It works from any process (:meth:`~intention_kernel.Kernel.watch_turn`).
  Each event has its ``id:``.
  The stream resumes after the ``Last-Event-ID`` header, or the ``after`` query parameter.

While a stream waits, it sends a comment (``: ping``) every ``keep_alive`` seconds.
:func:`keep_alive` does that, so a proxy does not close an idle watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from intention_kernel._ids import check_id
from intention_kernel._kernel import Kernel
from intention_kernel._streaming import TurnEvent
from intention_kernel.errors import KernelError
from intention_kernel.host._access import Principal
from intention_kernel.host._problems import HostProblem, problem_for, thread_not_found
from intention_kernel.host._stream import EVENT_STREAM, stream_events
from intention_kernel.host._wire import TurnBody

__all__ = [
    "KEEP_ALIVE",
    "check_access",
    "check_keep_alive",
    "detach_turn",
    "keep_alive",
    "prefers_async",
    "turn_events",
    "turn_status",
    "turn_url",
]


#: The seconds a waiting stream goes without a byte before it sends ``: ping``.
KEEP_ALIVE = 15.0

#: The comment a waiting stream sends: clients ignore it, proxies see traffic.
PING = ": ping\n\n"


def check_keep_alive(seconds: float, name: str = "keep_alive") -> float:
    """``seconds`` as a keep-alive interval; ``ValueError`` unless positive and finite.

    ``name`` is what the caller calls it in the message: the CLI says ``--keep-alive``.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"{name} must be a number of seconds, got {seconds!r}")
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{name} must be positive and finite, got {seconds!r}")
    return float(seconds)


async def keep_alive(chunks: AsyncIterator[str], every: float) -> AsyncIterator[str]:
    """``chunks``, and :data:`PING` whenever ``every`` seconds pass without one.

    The next chunk is awaited in a task of its own, so a ping never cancels it."""
    pending: asyncio.Task[str] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(chunks))
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield PING
                continue
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield chunk
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        closing = getattr(chunks, "aclose", None)
        if closing is not None:
            await closing()


def prefers_async(prefer: str) -> bool:
    """Whether a ``Prefer`` header (RFC 7240) asks for ``respond-async``."""
    for preference in prefer.split(","):
        token = preference.split(";", 1)[0].split("=", 1)[0].strip().lower()
        if token == "respond-async":
            return True
    return False


def turn_url(thread_id: str, turn_id: str) -> str:
    """The path of a turn on the host."""
    return f"/v1/threads/{quote(thread_id, safe='/')}/turns/{quote(turn_id, safe='')}"


async def detach_turn(
    kernel: Kernel,
    thread_id: str,
    turn_id: str,
    body: TurnBody,
    principal: Principal,
    replayed_header: str,
) -> Response:
    """``202`` and the turn's URL once the turn is accepted.

    A committed turn ID answers its stored result (``200``), as without the preference.
    """
    try:
        status = await kernel.detach_turn(
            thread_id,
            turn_id,
            body.message,
            body.resolved_answer(principal.actor),
            principal=principal,
        )
    except KernelError as error:
        raise problem_for(error, thread_id=thread_id, turn_id=turn_id) from error
    if status.result is not None:
        return JSONResponse(status.result.to_dict(), headers={replayed_header: "true"})
    url = turn_url(thread_id, turn_id)
    return JSONResponse(
        {**status.to_dict(), "url": url, "events": f"{url}/events"},
        status_code=202,
        headers={"Location": url, "Preference-Applied": "respond-async"},
    )


async def turn_status(kernel: Kernel, request: Request, principal: Principal) -> Response:
    """The turn's status and, once committed, its result."""
    thread_id, turn_id = _ids(request)
    try:
        status = await kernel.turn_status(thread_id, turn_id, principal=principal)
    except KernelError as error:
        raise problem_for(error, thread_id=thread_id, turn_id=turn_id) from error
    if status.status == "unknown":
        raise HostProblem(
            "not-found", f"no turn {turn_id!r} on thread {thread_id!r}", thread_id=thread_id
        )
    return JSONResponse(status.to_dict())


async def turn_events(
    kernel: Kernel, request: Request, principal: Principal, every: float = KEEP_ALIVE
) -> Response:
    """The turn's stream, after ``Last-Event-ID`` or ``?after=``.

    It sends a ping every ``every`` seconds while it waits.
    """
    thread_id, turn_id = _ids(request)
    after = request.headers.get("last-event-id") or request.query_params.get("after")
    try:
        status = await kernel.turn_status(thread_id, turn_id, principal=principal)
        if status.status == "unknown":
            raise HostProblem(
                "not-found", f"no turn {turn_id!r} on thread {thread_id!r}", thread_id=thread_id
            )
        events = kernel.watch_turn(thread_id, turn_id, after=after, principal=principal)
    except KernelError as error:
        raise problem_for(error, thread_id=thread_id, turn_id=turn_id) from error
    if after == "result":  # resumed after the last event: nothing is left
        return Response(status_code=204)  # an EventSource stops reconnecting on 204
    return StreamingResponse(
        keep_alive(_watched(events, thread_id=thread_id, turn_id=turn_id), every),
        media_type=EVENT_STREAM,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _watched(
    events: AsyncIterator[TurnEvent], *, thread_id: str, turn_id: str
) -> AsyncIterator[str]:
    # A comment first, so the response starts at once, even for a queued turn.
    yield ": watching\n\n"
    first = await anext(events)
    async for chunk in stream_events(first, events, thread_id=thread_id, turn_id=turn_id):
        yield chunk


def _ids(request: Request) -> tuple[str, str]:
    thread_id = check_id("thread_id", request.path_params["thread_id"])
    turn_id = check_id("turn_id", request.path_params["turn_id"])
    return thread_id, turn_id


async def check_access(access: object, principal: Principal, thread_id: str) -> None:
    """Another tenant's thread answers as an unknown one."""
    if not await access.may_act(principal, thread_id):  # type: ignore[attr-defined]
        raise thread_not_found(thread_id)
