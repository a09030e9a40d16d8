"""A thread's inbox: messages that arrive while a turn runs on the thread.

With ``Agent(on_busy="queue")`` a message that finds its thread busy is committed to
the thread's durable inbox under its own turn ID, and runs later as its own turn, in
the order of acceptance. :meth:`Kernel.submit <intention_kernel.Kernel.submit>` answers
at once, with the turn's result when it could run or a :class:`Queued` naming its
position; :meth:`Kernel.turn <intention_kernel.Kernel.turn>` waits for the result.

Nothing here decides what runs twice. A queued turn runs through ``with_turn`` under
its own turn ID, whose commit is unique: an entry whose turn committed is replayed and
then removed, never run again. The inbox only keeps and orders the messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, runtime_checkable

from intention_kernel._json import dump_value, load_value
from intention_kernel.authority import Principal
from intention_kernel.durability.records import InboxEntry
from intention_kernel.effects import utcnow
from intention_kernel.errors import (
    TenantMismatchError,
    ThreadBusyError,
    TurnCancelledError,
    TurnConflictError,
)
from intention_kernel.interpretation import Answer
from intention_kernel.runtime import TurnRequest
from intention_kernel.streaming import TurnSink
from intention_kernel.turns import TurnResult, TurnScope

__all__ = ["Cancellation", "Queued"]

logger = logging.getLogger("intention_kernel._inbox")

#: How long a background drain pauses after the thread's lock timed out on it.
RETRY_SECONDS = 0.1
#: How often a caller waiting for a queued turn asks the store whether it was dequeued.
DEQUEUE_POLL_SECONDS = 0.25


@dataclass(frozen=True, slots=True)
class Queued:
    """The acknowledgement of a message accepted into its thread's inbox.

    ``position`` is its 1-based place among the thread's queued messages when it was
    accepted (or redelivered). The message runs as turn ``turn_id`` after the turns
    before it. Delivering the same turn ID again answers its position while it waits,
    and its result (``replayed=True``) once it ran.
    """

    thread_id: str
    turn_id: str
    position: int
    #: The running turn this message was handed to (``on_busy="steer"``); its
    #: ``position`` is then 0, and its result will be that turn's.
    taken_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict (``taken_by`` only when the message was handed over)."""
        data: dict[str, Any] = {
            "thread_id": self.thread_id,
            "turn_id": self.turn_id,
            "position": self.position,
        }
        if self.taken_by is not None:
            data["taken_by"] = self.taken_by
        return data


@dataclass(frozen=True, slots=True)
class Cancellation:
    """What :meth:`Kernel.cancel <intention_kernel.Kernel.cancel>` found and did.

    ``status`` is ``"committed"`` (the turn had committed: nothing changed),
    ``"dequeued"`` (it waited in the inbox, not started, and was removed: it will
    not run) or
    ``"requested"`` (it may be running: it stops at its next safe point and commits
    what it did, its reply saying it was cancelled).
    """

    thread_id: str
    turn_id: str
    status: Literal["committed", "dequeued", "requested"]
    reason: str | None = None


#: Runs one turn: ``(scope, request, wait)``; ``wait=False`` raises ThreadBusyError at once.
RunTurn = Callable[[TurnScope, TurnRequest, bool], Awaitable[TurnResult]]
#: A committed turn's result (replayed), or ``None`` while it is not committed.
Committed = Callable[[TurnScope, bool], Awaitable[TurnResult | None]]


class Steered(Exception):
    """Raised under the thread's lock as a queued turn starts: a running turn took its
    message at a round boundary (``taken_by``), so it does not run on its own."""

    def __init__(self, taken_by: str) -> None:
        super().__init__(taken_by)
        self.taken_by = taken_by


@runtime_checkable
class InboxStore(Protocol):
    """What the inbox needs of a durability (every bundled adapter has it)."""

    async def enqueue(self, entry: InboxEntry) -> int | None: ...
    async def read_inbox(self, thread_id: str) -> list[InboxEntry]: ...
    async def remove_inbox(self, thread_id: str, turn_id: str) -> bool: ...
    async def taker(self, thread_id: str, turn_id: str) -> str | None: ...
    async def request_interrupt(
        self, thread_id: str, base_version: int, turn_id: str, tenant_id: str | None
    ) -> None: ...
    async def thread_version(self, thread_id: str) -> int: ...


def encode_request(request: TurnRequest) -> str:
    """What a queued turn will run, as the JSON text its inbox entry keeps."""
    principal = request.principal
    return dump_value(
        {
            "message": request.message,
            "answer": request.answer.to_dict() if request.answer is not None else None,
            "principal": (
                None
                if principal is None
                else {
                    "name": principal.name,
                    "tenant_id": principal.tenant_id,
                    "role": principal.role,
                }
            ),
        }
    )


def decode_entry(entry: InboxEntry) -> tuple[TurnScope, TurnRequest]:
    """The scope and request of a queued turn, as its entry keeps them."""
    data = load_value(entry.request)
    answer = Answer(**data["answer"]) if data["answer"] is not None else None
    principal = Principal(**data["principal"]) if data["principal"] is not None else None
    scope = TurnScope(entry.thread_id, entry.turn_id, entry.tenant_id, entry.request_digest)
    return scope, TurnRequest(data["message"], answer, principal=principal, queued=True)


class Inbox:
    """The kernel's side of the inbox: accept, then drain in order of acceptance.

    The rule that keeps a message from waiting forever: the process that queued it
    waits for the thread's lock in the background, and drains the inbox once it has
    it. The holder need not read the inbox after its commit, which would cost every
    turn a statement. A message is never left for the holder to notice: the holder
    may have read the inbox just before the message arrived. A process that queued a
    message and then crashed drains nothing. The next turn on the thread, in any
    process, then drains first (as does :meth:`drain`, called explicitly).
    """

    def __init__(
        self,
        store: InboxStore,
        run: RunTurn,
        *,
        interrupt: bool = False,
        steer: Committed | None = None,
    ) -> None:
        self._store = store
        self._run = run
        # ``on_busy="interrupt"``: a message that finds the thread busy stops its turn.
        self._interrupt = interrupt
        # ``on_busy="steer"``: how to read the result of the turn that took a message.
        self._committed = steer
        # The background drain of each thread, and threads to drain once more after it.
        self._drains: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        # The turns a caller of this kernel waits for, by (thread, turn): a drain of
        # this kernel that runs one hands its result over, which is not a replay.
        self._waiting: dict[tuple[str, str], asyncio.Future[TurnResult]] = {}
        self._waiters: dict[tuple[str, str], int] = {}
        # The queued turns this kernel started (under the thread's lock), by (thread, turn).
        self._running: set[tuple[str, str]] = set()
        # Set by a cancel through this kernel: its waiting callers look at once.
        self._dequeued: dict[tuple[str, str], asyncio.Event] = {}
        # The sinks of streamed turns queued by this kernel: a drain here streams to them.
        self._sinks: dict[tuple[str, str], TurnSink] = {}
        # Drains whose caller was told its turn was dequeued: they run on to their end.
        self._left: set[asyncio.Task[dict[str, TurnResult]]] = set()

    async def submit(
        self, scope: TurnScope, request: TurnRequest, *, wait: bool
    ) -> TurnResult | Queued:
        """Run the turn now if its thread is free and its inbox empty, else queue it.

        ``wait``: queue it, then drain the thread (waiting for its lock) up to this
        turn, and return its result. Without ``wait``, answer :class:`Queued` when the
        thread is busy."""
        store, thread_id = self._store, scope.thread_id
        if self._committed is not None:
            taken_by = await store.taker(thread_id, scope.turn_id)
            if taken_by is not None:  # handed to a turn: its result is this one's
                return await self._steered(scope, taken_by, wait)
        base = None
        if self._interrupt:
            # Read before the attempt at the lock: a turn running at the attempt started
            # from this version or a later one. Read after a refusal, it could already
            # be the base of the turn that runs next, this message's own.
            base = await store.thread_version(thread_id)
        if not await store.read_inbox(thread_id):
            try:
                result = await self._run(scope, request, False)
            except ThreadBusyError:
                pass
            else:
                return result
        entry = InboxEntry(
            thread_id,
            scope.turn_id,
            scope.tenant_id,
            scope.request_digest,
            encode_request(request),
            utcnow(),
            steer=(
                self._committed is not None
                and request.message is not None
                and request.answer is None
            ),
        )
        position = await store.enqueue(entry)
        if position is None:  # committed already: the replay (or its conflict)
            return await self._run(scope, request, True)
        key = (thread_id, scope.turn_id)
        if request.sink is not None:  # a streamed turn: it says so, then streams its run
            request.sink.queued(Queued(thread_id, scope.turn_id, position).to_dict())
            self._sinks[key] = request.sink
        if base is not None:
            # Accepted first, then the stop: a crash between leaves a queued message.
            # A turn on that base that already committed is stopped by nothing.
            await store.request_interrupt(thread_id, base, scope.turn_id, scope.tenant_id)
        # A redelivery waiting beside this call shares its future; the last one out
        # removes it.
        ran = self._waiting.setdefault(key, asyncio.get_running_loop().create_future())
        self._waiters[key] = self._waiters.get(key, 0) + 1
        try:
            if wait:
                results = await self._drain_or_dequeued(scope)
            else:
                results = await self._drain(thread_id, wait=False, until=scope.turn_id)
        finally:
            self._waiters[key] -= 1
            if not self._waiters[key]:
                del self._waiters[key], self._waiting[key]
                self._dequeued.pop(key, None)
                self._running.discard(key)
                self._sinks.pop(key, None)
        if not wait or scope.turn_id in results:
            self.watch(thread_id)  # this turn, or those queued behind it
        if ran.done():  # run by this call's drain, or by another drain of this kernel
            return ran.result()
        if scope.turn_id in results:  # another worker ran it first: the replay
            return results[scope.turn_id]
        if self._committed is not None and entry.steer:
            taken_by = await store.taker(thread_id, scope.turn_id)
            if taken_by is not None:
                return await self._steered(scope, taken_by, wait)
        if wait:  # another worker ran it (its stored result), or it was cancelled
            try:
                return await self._run(scope, replace(request, queued=True), True)
            except Steered as steered:  # taken just before it could start
                return await self._steered(scope, steered.taken_by, True)
        return Queued(thread_id, scope.turn_id, position)

    async def _steered(self, scope: TurnScope, taken_by: str, wait: bool) -> TurnResult | Queued:
        """The answer for a message that turn ``taken_by`` took at a round boundary:
        that turn's result once committed. Until then, :class:`Queued` with its taker
        (``wait=False``), or ``ThreadBusyError`` after waiting for the thread's lock:
        the taker failed before its commit, and its redelivery commits both."""
        assert self._committed is not None
        taker = TurnScope(scope.thread_id, taken_by, scope.tenant_id, None)
        result = await self._committed(taker, wait)
        if result is not None:
            return result
        if not wait:
            return Queued(scope.thread_id, scope.turn_id, 0, taken_by)
        raise ThreadBusyError(
            f"turn {scope.turn_id!r} was handed to turn {taken_by!r} of thread "
            f"{scope.thread_id!r}, which has not committed; deliver {taken_by!r} again",
            thread_id=scope.thread_id,
            turn_id=scope.turn_id,
        )

    async def _drain_or_dequeued(self, scope: TurnScope) -> dict[str, TurnResult]:
        """Drain up to the caller's queued turn, or raise ``TurnCancelledError`` as soon
        as a cancel removed it from the inbox before it started.

        The drain may be waiting for the lock behind a long turn: the caller is told
        at once, and the drain runs on in the background. A cancel through this kernel
        is seen at once; one from another process within ``DEQUEUE_POLL_SECONDS``."""
        thread_id, turn_id = scope.thread_id, scope.turn_id
        drain = asyncio.ensure_future(self._drain(thread_id, wait=True, until=turn_id))
        watch = asyncio.ensure_future(self._until_dequeued(thread_id, turn_id, scope.tenant_id))
        try:
            await asyncio.wait({drain, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if drain.done() or not watch.done() or watch.cancelled():
            return await drain
        self._left.add(drain)
        drain.add_done_callback(self._drain_left)
        raise TurnCancelledError(
            f"turn {turn_id!r} of thread {thread_id!r} was cancelled before it ran",
            thread_id=thread_id,
            turn_id=turn_id,
        )

    async def _until_dequeued(self, thread_id: str, turn_id: str, tenant_id: str | None) -> None:
        """Return once the turn was cancelled out of the inbox, not yet run here."""
        key = (thread_id, turn_id)
        event = self._dequeued.setdefault(key, asyncio.Event())
        read_cancel = getattr(self._store, "read_cancel", None)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), DEQUEUE_POLL_SECONDS)
            event.clear()
            if key in self._running or read_cancel is None:
                continue  # running here: its own stop check ends it
            found, _ = await read_cancel(thread_id, turn_id, -1, tenant_id)
            if found != "cancel":
                continue
            queued = await self._store.read_inbox(thread_id)
            if all(e.turn_id != turn_id for e in queued) and key not in self._running:
                return

    def started(self, thread_id: str, turn_id: str) -> None:
        """A queued turn of this kernel holds the lock and starts: a cancel now stops it
        at its safe points, and its caller waits for what it commits."""
        self._running.add((thread_id, turn_id))

    def dequeued(self, thread_id: str, turn_id: str) -> None:
        """A cancel through this kernel asked the turn to stop: wake its waiting callers."""
        event = self._dequeued.get((thread_id, turn_id))
        if event is not None:
            event.set()

    def _drain_left(self, drain: asyncio.Task[dict[str, TurnResult]]) -> None:
        self._left.discard(drain)
        if not drain.cancelled() and drain.exception() is not None:
            logger.warning(
                "a drain whose caller left failed: %s", drain.exception(), exc_info=False
            )

    async def drain(self, thread_id: str) -> list[TurnResult]:
        """Run every queued turn of the thread, waiting for its lock; their results."""
        running = self._drains.get(thread_id)
        if running is not None:
            await asyncio.shield(running)
        return list((await self._drain(thread_id, wait=True, until=None)).values())

    async def idle(self) -> None:
        """Wait until no background drain of this kernel runs."""
        while self._drains:
            await asyncio.gather(*self._drains.values(), return_exceptions=True)

    def watch(self, thread_id: str) -> None:
        """Drain the thread in the background, waiting for its lock: this process
        queued a message on it."""
        running = self._drains.get(thread_id)
        if running is not None and not running.done():
            self._again.add(thread_id)  # it may have read the inbox before the message
            return
        self._drains[thread_id] = asyncio.create_task(self._background(thread_id))

    async def _background(self, thread_id: str) -> None:
        try:
            while True:
                self._again.discard(thread_id)
                try:
                    await self._drain(thread_id, wait=True, until=None)
                except ThreadBusyError:  # the lock timed out: a long turn; wait again
                    self._again.add(thread_id)
                    await asyncio.sleep(RETRY_SECONDS)  # a store whose lock timeout is 0
                except Exception as error:  # the entry stays: the next turn retries it
                    logger.warning(
                        "draining the inbox of thread %r failed: %s: %s",
                        thread_id,
                        type(error).__name__,
                        error,
                        extra={"thread_id": thread_id},
                    )
                    return
                if thread_id not in self._again:
                    return
        finally:
            self._drains.pop(thread_id, None)

    async def _drain(
        self, thread_id: str, *, wait: bool, until: str | None
    ) -> dict[str, TurnResult]:
        """Run the thread's queued turns in order, each removed once committed; stop
        when the inbox is empty, after ``until`` ran, or (without ``wait``) when
        another worker holds the lock: that worker drains after its release."""
        store = self._store
        results: dict[str, TurnResult] = {}
        while True:
            entries = await store.read_inbox(thread_id)
            if not entries:
                return results
            if until is not None and all(e.turn_id != until for e in entries):
                return results  # another worker ran it meanwhile
            head = entries[0]
            scope, request = decode_entry(head)
            key = (thread_id, head.turn_id)
            if key in self._sinks:
                request = replace(request, sink=self._sinks[key])
            try:
                result = await self._run(scope, request, wait)
            except ThreadBusyError:
                if wait:
                    raise
                return results
            except Steered:  # a round boundary took it: no longer waiting to run
                continue
            except (TurnConflictError, TurnCancelledError, TenantMismatchError):
                # Committed for another request, cancelled, or sent by another tenant
                # than the thread's: it can never run, and would block those behind it.
                await store.remove_inbox(thread_id, head.turn_id)
                continue
            finally:
                self._running.discard(key)
            # Removed only after the commit: a crash before this line leaves the entry,
            # and the next drain replays the committed turn instead of running it.
            await store.remove_inbox(thread_id, head.turn_id)
            results[head.turn_id] = result
            waiting = self._waiting.get((thread_id, head.turn_id))
            if waiting is not None and not waiting.done() and not result.replayed:
                waiting.set_result(result)
            if head.turn_id == until:
                return results
