"""The API endpoints: turns, threads, receipts, health.

Each endpoint authenticates first, then validates, then calls the kernel or the store.
Errors leave as :class:`HostProblem`.
:func:`guarded` turns them into problem responses.
It maps any kernel error by class too.
So no endpoint answers with a bare 500.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from intention_kernel._checkpoint import check_compatible
from intention_kernel._effects import ReceiptStatus
from intention_kernel._ids import check_id
from intention_kernel._inbox import InboxStore, Queued, decode_entry
from intention_kernel._kernel import Kernel
from intention_kernel._timer_runner import timer_store
from intention_kernel.durability._contract.recorders import InteractionQueue
from intention_kernel.durability._contract.records import PendingInteraction, ThreadOwner
from intention_kernel.errors import CheckpointCompatibilityError, KernelError, TenantMismatchError
from intention_kernel.host import _turnstreams as turnstreams
from intention_kernel.host._access import Access, Principal
from intention_kernel.host._problems import (
    HostProblem,
    problem_for,
    problem_response,
    thread_not_found,
)
from intention_kernel.host._stream import accepts_event_stream, event_stream_response
from intention_kernel.host._wire import (
    Health,
    InteractionList,
    QueuedView,
    ReceiptList,
    ResolveBody,
    ThreadView,
    TimerList,
    TimerView,
    TurnBody,
    dump,
    read_body,
)

__all__ = ["REPLAYED_HEADER", "Endpoints", "guarded"]

#: Set on every turn response.
#: It is ``true`` when the stored result of a committed turn was returned and nothing ran.
REPLAYED_HEADER = "Idempotency-Replayed"

log = logging.getLogger("intention_kernel.host")

Endpoint = Callable[[Request], Awaitable[Response]]

_STATUSES = tuple(status.value for status in ReceiptStatus)

#: How many pending interactions one ``GET /v1/interactions`` answers at most.
MAX_INTERACTIONS = 500
#: How many timers one ``GET /v1/threads/{thread_id}/timers`` answers at most.
MAX_TIMERS = 500
_TIMER_STATUSES = ("pending", "fired", "void")


def _limit(request: Request, most: int) -> int:
    """The ``limit`` query parameter (100 if absent), or a 422 problem."""
    text = request.query_params.get("limit", "100")
    if not text.isdigit() or not 1 <= int(text) <= most:
        raise HostProblem("invalid-request", f"limit must be an integer from 1 to {most}")
    return int(text)


def guarded(endpoint: Endpoint) -> Endpoint:
    """Answer every failure of ``endpoint`` with problem details."""

    @functools.wraps(endpoint)
    async def run(request: Request) -> Response:
        try:
            return await endpoint(request)
        except HostProblem as raised:
            _log(request, raised)
            return problem_response(raised)
        except KernelError as error:
            mapped = problem_for(error, thread_id=request.path_params.get("thread_id"))
            mapped.__cause__ = error
            _log(request, mapped)
            return problem_response(mapped)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            detail = "an unexpected error occurred; see the server log"
            thread_id = request.path_params.get("thread_id")
            return problem_response(HostProblem("internal-error", detail, thread_id=thread_id))

    return run


def _log(request: Request, problem: HostProblem) -> None:
    status = problem.type.status
    if status in (502, 503):
        # Handled failures: busy threads and store hiccups are expected under load.
        # A failing interpreter is its own service's fault.
        # Clients retry.
        # One line each, since a traceback would only show the host's own mapping code.
        log.warning("%s %s: %s", request.method, request.url.path, problem.detail)
    elif status >= 500:
        cause = problem.__cause__ or problem
        log.error("%s %s: %s", request.method, request.url.path, problem.detail, exc_info=cause)


class Endpoints:
    """The API of one kernel, behind one :class:`Access` policy."""

    def __init__(self, kernel: Kernel, access: Access) -> None:
        self.kernel = kernel
        self.access = access
        #: Seconds between the pings of a waiting event stream (``create_app``).
        self.keep_alive = turnstreams.KEEP_ALIVE
        # Computed once: a capability's schema is fixed when the kernel compiles it.
        self._input_schemas = {c.id: c.input_schema for c in kernel.agent.capabilities}
        self._capabilities = {c.id: c for c in kernel.agent.capabilities}

    async def post_turn(self, request: Request) -> Response:
        principal = self.access.authenticate(request)
        thread_id: str = request.path_params["thread_id"]
        body = await read_body(request, TurnBody)
        turn_id = body.turn_id
        header = request.headers.get("idempotency-key")
        if header is not None:
            if turn_id is not None and turn_id != header:
                raise HostProblem(
                    "malformed-request",
                    "the body's turn_id differs from the Idempotency-Key header",
                    thread_id=thread_id,
                )
            turn_id = header
        if turn_id is None:
            raise HostProblem(
                "invalid-request",
                "a turn needs a turn ID: the body's turn_id or an Idempotency-Key header "
                "(keep it the same when retrying the delivery)",
                thread_id=thread_id,
            )
        if accepts_event_stream(request.headers.get("accept", "")):
            return await self._stream_turn(request, thread_id, turn_id, body, principal)
        if turnstreams.prefers_async(request.headers.get("prefer", "")):
            return await turnstreams.detach_turn(
                self.kernel, thread_id, turn_id, body, principal, REPLAYED_HEADER
            )
        try:
            # Kernel.turn for an agent without an inbox.
            # An agent with one ("queue", "steer", "interrupt") answers at once when busy.
            # An HTTP client should not hold a connection open while earlier turns run.
            result = await self.kernel.submit(
                thread_id,
                turn_id,
                body.message,
                body.resolved_answer(principal.actor),
                principal=principal,
            )
        except KernelError as error:
            raise problem_for(error, thread_id=thread_id, turn_id=turn_id) from error
        if isinstance(result, Queued):
            # Accepted, durably.
            # The same turn ID sent again answers its place while it waits.
            # Once it ran, it answers its result.
            return JSONResponse(result.to_dict(), status_code=202)
        return JSONResponse(
            result.to_dict(), headers={REPLAYED_HEADER: "true" if result.replayed else "false"}
        )

    async def _stream_turn(
        self, request: Request, thread_id: str, turn_id: str, body: TurnBody, principal: Principal
    ) -> Response:
        """The turn as server-sent events (:mod:`~intention_kernel.host._stream`)."""
        events = self.kernel.stream_turn(
            thread_id,
            turn_id,
            body.message,
            body.resolved_answer(principal.actor),
            principal=principal,
            after=request.headers.get("last-event-id") or None,
        )
        try:
            # Wait for the first event.
            # A turn refused before it ran anything answers problem details with its status.
            # It does not open a stream that only says so.
            first = await anext(events)
        except KernelError as error:
            raise problem_for(error, thread_id=thread_id, turn_id=turn_id) from error
        replayed = first.type == "result" and first.data.get("replayed") is True
        return event_stream_response(
            first,
            events,
            {REPLAYED_HEADER: "true" if replayed else "false"},
            thread_id=thread_id,
            turn_id=turn_id,
        )

    async def cancel_turn(self, request: Request) -> Response:
        """``Kernel.cancel``, answered as the :class:`Cancellation` it returns."""
        principal = self.access.authenticate(request)
        thread_id = check_id("thread_id", request.path_params["thread_id"])
        turn_id = check_id("turn_id", request.path_params["turn_id"])
        reason = request.query_params.get("reason")
        # Another tenant's thread answers as an unknown one, with no stop recorded.
        if not await self.access.may_act(principal, thread_id):
            raise thread_not_found(thread_id, turn_id)
        owner = ThreadOwner(principal.tenant_id) if self.access.enabled else None
        try:
            cancellation = await self.kernel.cancel(thread_id, turn_id, reason=reason, owner=owner)
        except TenantMismatchError as error:  # judged again in the store's transaction
            raise thread_not_found(thread_id, turn_id) from error
        except KernelError as error:
            raise problem_for(error, thread_id=thread_id, turn_id=turn_id) from error
        return JSONResponse(dump(cancellation))

    async def get_turn(self, request: Request) -> Response:
        """A turn's status, and its result once committed (a detached turn's URL)."""
        principal = self.access.authenticate(request)
        await turnstreams.check_access(self.access, principal, request.path_params["thread_id"])
        return await turnstreams.turn_status(self.kernel, request, principal)

    async def get_turn_events(self, request: Request) -> Response:
        """A turn's events as server-sent events, resumable (``Last-Event-ID``)."""
        principal = self.access.authenticate(request)
        await turnstreams.check_access(self.access, principal, request.path_params["thread_id"])
        return await turnstreams.turn_events(self.kernel, request, principal, self.keep_alive)

    async def get_thread(self, request: Request) -> Response:
        principal = self.access.authenticate(request)
        thread_id = check_id("thread_id", request.path_params["thread_id"])
        checkpoint = await self.access.load_checkpoint(principal, thread_id)
        if checkpoint is None:
            raise thread_not_found(thread_id)
        try:
            check_compatible(
                checkpoint,
                fingerprint=self.kernel.fingerprint,
                compatible=self.kernel.agent.compatible_fingerprints,
            )
            compatible = True
        except CheckpointCompatibilityError:
            compatible = False
        view = ThreadView.of(
            thread_id, checkpoint, compatible=compatible, input_schemas=self._input_schemas
        )
        store = self.kernel.durability
        if isinstance(store, InboxStore) and getattr(store, "has_inbox", True) is not False:
            # Only what the caller's tenant queued: another's would never run here.
            waiting = [
                entry
                for entry in await store.read_inbox(thread_id)
                if not self.access.enabled or entry.tenant_id == principal.tenant_id
            ]
            view = dataclasses.replace(
                view,
                inbox=tuple(
                    QueuedView(
                        entry.turn_id,
                        position,
                        decode_entry(entry)[1].message,
                        entry.steer,
                        entry.created_at,
                    )
                    for position, entry in enumerate(waiting, 1)
                ),
            )
        return JSONResponse(dump(view))

    async def get_timers(self, request: Request) -> Response:
        """A thread's timers, read as the thread is; another tenant's thread is 404."""
        principal = self.access.authenticate(request)
        thread_id = check_id("thread_id", request.path_params["thread_id"])
        status = request.query_params.get("status")
        if status is not None and status not in _TIMER_STATUSES:
            raise HostProblem(
                "invalid-request",
                f"status must be one of {', '.join(_TIMER_STATUSES)}",
                thread_id=thread_id,
            )
        limit = _limit(request, MAX_TIMERS)
        if not await self.access.may_act(principal, thread_id):
            raise thread_not_found(thread_id)  # another tenant's: as an unknown thread
        try:
            recorder = await timer_store(self.kernel)
        except KernelError:  # a store without timers: the thread has none
            recorder = None
        shown: list[TimerView] = []
        after: tuple[str, str] | None = None
        while recorder is not None and len(shown) < limit:
            page = await recorder.read_timers(thread_id, status, after, limit)
            for timer in page:
                # Only the caller's tenant's: another's would never fire on this thread.
                if not self.access.enabled or timer.tenant_id == principal.tenant_id:
                    shown.append(TimerView.of(timer))
            if len(page) < limit:
                break
            after = (thread_id, page[-1].key)
        if not shown and await self.access.load_checkpoint(principal, thread_id) is None:
            raise thread_not_found(thread_id)  # no turn and no timer: unknown
        return JSONResponse(dump(TimerList(thread_id, tuple(shown[:limit]))))

    async def list_receipts(self, request: Request) -> Response:
        principal = self.access.authenticate(request)
        self.access.require_operator(principal, "listing receipts")
        thread_id = request.query_params.get("thread_id")
        if thread_id is not None:
            check_id("thread_id", thread_id)
        status = request.query_params.get("status")
        if status is not None and status not in _STATUSES:
            raise HostProblem("invalid-request", f"status must be one of {', '.join(_STATUSES)}")
        tenant = principal.tenant_id
        receipts = await self.kernel.durability.list_receipts(
            thread_id=thread_id, status=status, tenant_id=tenant
        )
        if tenant is None:  # the filter cannot say "no tenant": ask for each thread's owner
            seen: dict[str, bool] = {}
            receipts = [r for r in receipts if await self.access.sees(principal, r.thread_id, seen)]
        return JSONResponse(dump(ReceiptList(tuple(receipts))))

    async def list_interactions(self, request: Request) -> Response:
        principal = self.access.authenticate(request)
        # The queue across threads is an operator's view, as the receipts are.
        self.access.require_operator(principal, "listing interactions across threads")
        limit = _limit(request, MAX_INTERACTIONS)
        after = request.query_params.get("after")
        if after is not None:
            check_id("after", after)
        store = self.kernel.durability
        if not isinstance(store, InteractionQueue):
            raise HostProblem(
                "not-found", f"{type(store).__name__} cannot list interactions across threads"
            )
        # The caller's tenant only, the same rule as for reading a thread (Access.sees).
        found = await store.pending_interactions(
            owner=ThreadOwner(principal.tenant_id), after=after, limit=limit
        )
        following = found[-1].thread_id if len(found) == limit else None
        return JSONResponse(dump(InteractionList(tuple(map(self._current, found)), following)))

    def _current(self, pending: PendingInteraction) -> PendingInteraction:
        """``pending``, saying who may answer it under this kernel's policy.

        That is the policy its answers meet.
        A redeploy may have changed it since the interaction opened.
        """
        cap = self._capabilities.get(pending.interaction.capability_id)
        if cap is None or pending.interaction.who_may_answer == cap.who_may_answer:
            return pending
        shown = dataclasses.replace(pending.interaction, who_may_answer=cap.who_may_answer)
        return dataclasses.replace(pending, interaction=shown)

    async def resolve_receipt(self, request: Request) -> Response:
        principal = self.access.authenticate(request)
        self.access.require_operator(principal, "resolving a receipt")
        body = await read_body(request, ResolveBody)
        receipt = await self.access.resolve_receipt(
            principal,
            body.thread_id,
            body.key,
            applied=body.applied,
            value=body.value,
            note=body.note,
        )
        return JSONResponse(dump(receipt))

    async def health(self, request: Request) -> Response:
        agent = self.kernel.agent
        return JSONResponse(
            dump(Health("ok", agent.name, agent.version, self.kernel.fingerprint)),
            headers={"Cache-Control": "no-store"},
        )
