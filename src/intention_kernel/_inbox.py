"""A thread's inbox: messages that arrive while a turn runs on the thread.

With ``Agent(on_busy="queue")`` a message that finds its thread busy is queued. It is
committed to the thread's durable inbox under its own turn ID. It runs later as its
own turn, in the order of acceptance. :meth:`Kernel.submit
<intention_kernel.Kernel.submit>` answers at once. It answers with the turn's result
when it could run, else with a :class:`Queued` naming its position.
:meth:`Kernel.turn <intention_kernel.Kernel.turn>` waits for the result.

Nothing here decides what runs twice. A queued turn runs through ``with_turn`` under
its own turn ID, whose commit is unique. So an entry whose turn committed is replayed
and then removed, never run again. The inbox only keeps and orders the messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from intention_kernel._authority import Principal
from intention_kernel._effects import utcnow
from intention_kernel._interpretation import Answer, FiredTimer
from intention_kernel._json import dump_value, load_value
from intention_kernel._runtime import TurnRequest
from intention_kernel._runtime.rounds import STEER_KEY
from intention_kernel._streaming import TurnSink
from intention_kernel._turns import TurnResult, TurnScope
from intention_kernel.durability._contract.records import InboxEntry
from intention_kernel.errors import (
    SteerOrphanedError,
    TenantMismatchError,
    ThreadBusyError,
    TurnCancelledError,
    TurnConflictError,
)

__all__ = ["Cancellation", "Queued"]

logger = logging.getLogger("intention_kernel._inbox")

#: How long a background drain pauses after the thread's lock timed out on it.
RETRY_SECONDS = 0.1
#: How often a caller waiting for a queued turn asks the store whether it was dequeued.
DEQUEUE_POLL_SECONDS = 0.25
#: The journal keys of the steers a turn took at its round boundaries.
STEER_PREFIX = STEER_KEY.split("{", 1)[0]


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

    ``status`` is one of:

    - ``"committed"``: the turn had committed, and nothing changed.
    - ``"dequeued"``: it waited in the inbox, not started, and was removed. It will
      not run.
    - ``"requested"``: it may be running. It stops at its next safe point and commits
      what it did. Its reply says it was cancelled.
    """

    thread_id: str
    turn_id: str
    status: Literal["committed", "dequeued", "requested"]
    reason: str | None = None


#: Runs one turn: ``(scope, request, wait)``; ``wait=False`` raises ThreadBusyError at once.
RunTurn = Callable[[TurnScope, TurnRequest, bool], Awaitable[TurnResult]]
#: A committed turn's result (replayed), or ``None`` while it is not committed. The
#: callable, if any, runs under the thread's lock when the turn is not committed.
Committed = Callable[
    [TurnScope, bool, Callable[[], Awaitable[None]] | None], Awaitable[TurnResult | None]
]


class Steered(Exception):
    """Raised under the thread's lock as a queued turn starts.

    A running turn took its message at a round boundary (``taken_by``). So it does not
    run on its own."""

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
    data: dict[str, Any] = {
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
    timer = request.timer
    if timer is not None:  # a due timer queued behind a busy thread's turns
        data["timer"] = {
            "key": timer.key,
            "due_at": timer.due_at.isoformat(),
            "message": timer.message,
            "data": timer.data,
        }
    return dump_value(data)


def decode_entry(entry: InboxEntry) -> tuple[TurnScope, TurnRequest]:
    """The scope and request of a queued turn, as its entry keeps them."""
    data = load_value(entry.request)
    answer = Answer(**data["answer"]) if data["answer"] is not None else None
    principal = Principal(**data["principal"]) if data["principal"] is not None else None
    scope = TurnScope(entry.thread_id, entry.turn_id, entry.tenant_id, entry.request_digest)
    kept = data.get("timer")
    timer = None
    if kept is not None:
        due_at = datetime.fromisoformat(kept["due_at"])
        timer = FiredTimer(kept["key"], due_at, kept["message"], kept["data"])
    return scope, TurnRequest(
        data["message"], answer, principal=principal, queued=True, timer=timer
    )


class Inbox:
    """The kernel's side of the inbox: accept, then drain in order of acceptance.

    One rule keeps a message from waiting forever. The process that queued it waits
    for the thread's lock in the background. It drains the inbox once it has the lock.
    The holder need not read the inbox after its commit, which would cost every turn
    a statement. A message is never left for the holder to notice: the holder
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
        # The turns a caller of this kernel waits for, by (thread, turn). A drain of
        # this kernel that runs one hands its result over; that is not a replay.
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
                return await self._steered(scope, request, taken_by, wait)
        base = None
        if self._interrupt and request.timer is None:  # a timer interrupts no one
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
                return await self._steered(scope, request, taken_by, wait)
        if wait:  # another worker ran it (its stored result), or it was cancelled
            try:
                return await self._run(scope, replace(request, queued=True), True)
            except Steered as steered:  # taken just before it could start
                return await self._steered(scope, request, steered.taken_by, True)
        return Queued(thread_id, scope.turn_id, position)

    async def _steered(
        self, scope: TurnScope, request: TurnRequest, taken_by: str, wait: bool
    ) -> TurnResult | Queued:
        """The answer for a message that turn ``taken_by`` took at a round boundary:
        that turn's result once committed. Until then, :class:`Queued` with its taker
        (``wait=False``) while the taker holds the thread.

        Once this call holds the thread's lock, an uncommitted taker is not running.
        It failed or died, and maybe nobody delivers it again. If its journal did not
        record the message, its model never saw it. The message then goes back to the
        inbox, in its place, and runs as its own turn. A recorded one stays with the
        taker: its later rounds may have acted on it, and only the taker going on
        from its journal is exact. A queued taker's inbox entry keeps its request:
        this call drains the inbox up to it, then answers with its result. A direct
        taker's request is its client's alone: ``SteerOrphanedError`` names it."""
        assert self._committed is not None
        thread_id = scope.thread_id
        release = getattr(self._store, "release_steer", None)
        released = dead = False

        async def free() -> None:  # under the thread's lock: the taker is not running
            nonlocal released, dead
            dead = True
            if release is not None and not await self._recorded(scope, taken_by):
                released = await release(thread_id, scope.turn_id, taken_by)

        taker = TurnScope(thread_id, taken_by, scope.tenant_id, None)
        result = await self._committed(taker, wait, free)
        if result is not None:
            return result
        if released:
            return await self.submit(scope, request, wait=wait)
        if dead:
            queued = await self._store.read_inbox(thread_id)
            if all(entry.turn_id != taken_by for entry in queued):
                raise SteerOrphanedError(
                    f"turn {scope.turn_id!r} was handed to turn {taken_by!r} of thread "
                    f"{thread_id!r}, which recorded it and then stopped uncommitted; "
                    f"deliver {taken_by!r} again (this message is part of it)",
                    thread_id=thread_id,
                    turn_id=scope.turn_id,
                    taken_by=taken_by,
                )
            # Queued: run it from its journal, as the next turn on the thread would.
            # Its rounds replay, and its receipts keep each write to one call.
            await self._drain(thread_id, wait=wait, until=taken_by)
            result = await self._committed(taker, wait, None)
            if result is not None:
                return result
            if not wait:  # another worker holds the thread now: drain after it
                self.watch(thread_id)
        if not wait:
            return Queued(thread_id, scope.turn_id, 0, taken_by)
        raise ThreadBusyError(
            f"turn {scope.turn_id!r} was handed to turn {taken_by!r} of thread "
            f"{thread_id!r}, which still holds the thread; retry once it commits",
            thread_id=thread_id,
            turn_id=scope.turn_id,
        )

    async def _recorded(self, scope: TurnScope, taken_by: str) -> bool:
        """Whether turn ``taken_by``'s journal records the steer of ``scope``, read
        under the thread's lock. A store whose journal this cannot read answers yes:
        the steer then stays with its taker."""
        recorder = getattr(self._store, "recorder", None)
        if recorder is None:
            return True
        entries = await (await recorder()).read_journal(scope.thread_id, taken_by)
        for entry in entries:
            if entry.key.startswith(STEER_PREFIX):
                steers = load_value(entry.value)
                if any(steer["turn_id"] == scope.turn_id for steer in steers):
                    return True
        return False

    async def _drain_or_dequeued(self, scope: TurnScope) -> dict[str, TurnResult]:
        """Drain up to the caller's queued turn, or raise ``TurnCancelledError`` as soon
        as a cancel removed it from the inbox before it started.

        The drain may be waiting for the lock behind a long turn. The caller is told at
        once, and the drain runs on in the background. A cancel through this kernel
        is seen at once; one from another process within ``DEQUEUE_POLL_SECONDS``."""
        thread_id, turn_id = scope.thread_id, scope.turn_id
        drain = asyncio.ensure_future(self._drain(thread_id, wait=True, until=turn_id))
        watch = asyncio.ensure_future(self._until_dequeued(scope))
        try:
            await asyncio.wait({drain, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if drain.done() or not watch.done() or watch.cancelled():
            results = await drain
            # A drain that found the turn gone returns at once. Without this check
            # the caller would wait for the lock behind the turn that runs.
            if turn_id in results or not await self._was_dequeued(scope):
                return results
        else:
            self._left.add(drain)
            drain.add_done_callback(self._drain_left)
        raise TurnCancelledError(
            f"turn {turn_id!r} of thread {thread_id!r} was cancelled before it ran",
            thread_id=thread_id,
            turn_id=turn_id,
        )

    async def _until_dequeued(self, scope: TurnScope) -> None:
        """Return once the turn was cancelled out of the inbox, not yet run here."""
        event = self._dequeued.setdefault((scope.thread_id, scope.turn_id), asyncio.Event())
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), DEQUEUE_POLL_SECONDS)
            event.clear()
            if await self._was_dequeued(scope):
                return

    async def _was_dequeued(self, scope: TurnScope) -> bool:
        """Whether a cancel removed the turn from the inbox before it ran here."""
        key = (scope.thread_id, scope.turn_id)
        read_cancel = getattr(self._store, "read_cancel", None)
        if key in self._running or read_cancel is None:
            return False  # running here: its own stop check ends it
        found, _ = await read_cancel(scope.thread_id, scope.turn_id, -1, scope.tenant_id)
        if found != "cancel":
            return False
        queued = await self._store.read_inbox(scope.thread_id)
        return all(e.turn_id != scope.turn_id for e in queued) and key not in self._running

    def started(self, thread_id: str, turn_id: str) -> None:
        """A queued turn of this kernel holds the lock and starts.

        A cancel now stops it at its safe points. Its caller waits for what it commits."""
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
        """Run the thread's queued turns in order, each removed once committed.

        Stop when the inbox is empty, or after ``until`` ran. Without ``wait``, also
        stop when another worker holds the lock: that worker drains after its release."""
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
            # Removed only after the commit. A crash before this line leaves the entry.
            # The next drain then replays the committed turn instead of running it.
            await store.remove_inbox(thread_id, head.turn_id)
            results[head.turn_id] = result
            waiting = self._waiting.get((thread_id, head.turn_id))
            if waiting is not None and not waiting.done() and not result.replayed:
                waiting.set_result(result)
            if head.turn_id == until:
                return results
