"""Kernel: one agent, one durability adapter, one durable turn at a time per thread.

``Kernel(agent, durability)`` compiles the agent (raising ``CompilationError``).
``await kernel.turn(...)`` runs one turn inside ``durability.with_turn``. A committed
turn ID returns its stored result (``replayed=True``) and runs nothing. A new one
interprets, answers, plans and executes. It then commits result, checkpoint and
outbox events together.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from intention_kernel import _timer_runner, _tracing
from intention_kernel import _turnstream as streams
from intention_kernel._agent import Agent, CompiledAgent, compile_agent
from intention_kernel._authority import Principal, same_principal
from intention_kernel._checkpoint import KernelCheckpoint
from intention_kernel._deadlines import Clock, system_clock
from intention_kernel._effects import utcnow
from intention_kernel._inbox import (
    Cancellation,
    Inbox,
    InboxStore,
    Queued,
    Steered,
    decode_entry,
    encode_request,
)
from intention_kernel._interpretation import MAX_ANSWER_TEXT, Answer
from intention_kernel._json import normalize
from intention_kernel._runtime import TurnRequest, run_turn
from intention_kernel._streaming import StopKind, TurnEvent, TurnSink
from intention_kernel._timer_runner import TimerOutcome
from intention_kernel._turns import (
    EXPIRY_TURN_PREFIX,
    TIMER_TURN_PREFIX,
    TurnResult,
    TurnScope,
    check_client_turn_id,
    request_digest,
)
from intention_kernel.durability import Durability, TurnOperation, _check_seconds
from intention_kernel.durability._contract.ownership import ANY_TENANT, cancel_scope
from intention_kernel.durability._contract.records import InboxEntry, ThreadOwner, Timer
from intention_kernel.errors import (
    CompilationError,
    InvalidRequestError,
    ShuttingDownError,
    TenantMismatchError,
    ThreadBusyError,
)

__all__ = ["Kernel"]

logger = logging.getLogger("intention_kernel.turn")


class Kernel:
    """Runs an agent's turns durably.

    ``max_message_chars`` bounds a user message; longer ones are refused with
    ``InvalidRequestError`` before anything is read or written.

    ``cancel_check_after``: when a turn starts reading the store for a stop request
    (:meth:`cancel`). It reads at its safe points only once it has run this many
    seconds. A quicker turn would finish before anyone could stop it, and need not pay
    the read. A turn queued in the inbox reads it at its first safe point. A stop this
    kernel requested is seen at once.

    ``clock`` is where turns get the time (see the guide *Approvals*). Each turn reads
    it once, holding the thread's lock. It opens and judges confirmation deadlines by it.
    It must return a timezone-aware ``datetime``; tests pass one they move.

    ``stream_buffer``: the most events a streamed turn's reader may fall behind. A
    slower reader is dropped from the live queue and goes on from the store. So it
    neither slows the turn nor fills memory. This needs a store that keeps turn streams.
    """

    def __init__(
        self,
        agent: Agent,
        durability: Durability,
        *,
        max_message_chars: int = 32_000,
        clock: Clock = system_clock,
        cancel_check_after: float = 0.05,
        stream_buffer: int = 1024,
    ) -> None:
        self._compiled: CompiledAgent = compile_agent(agent)
        self.agent = agent
        self.durability = durability
        self.max_message_chars = max_message_chars
        self.clock = clock
        self.cancel_check_after = _check_seconds("cancel_check_after", cancel_check_after)
        # Cancels this kernel requested, by (thread, turn): its turns see them at once.
        # Each by its scope (``ownership.cancel_scope``): a turn sees its tenant's only.
        self._cancels: dict[tuple[str, str], dict[str, str | None]] = {}
        # Timer turns this kernel's ``fire_due_timers`` fires now, by (thread, turn):
        # one note per pass waiting under that turn ID, of how the turn stopped. Two
        # passes share a turn ID for two occurrences of one due time (a timer set
        # again at it). One note each, so that neither pass removes the other's.
        self._timer_stops: dict[tuple[str, str], list[_StopNote]] = {}
        # The occurrences this kernel's fire passes fire now: a second pass that claims
        # one waits for the first one's outcome (``_timer_runner._fire_shared``).
        self._firing: dict[_timer_runner.Occurrence, asyncio.Future[TimerOutcome]] = {}
        # The deliveries this kernel runs or waits to run, by (thread, turn, queued).
        self._delivering: dict[tuple[str, str, bool], int] = {}
        # Whether the store keeps stop requests (``Kernel.cancel``).
        self._stoppable = isinstance(durability, InboxStore) and (
            getattr(durability, "has_inbox", True) is not False
        )
        # ``begin_shutdown`` was called: no new turn, running ones stop at a safe point.
        self._shutting_down = False
        # The tasks of streamed turns still running (see ``stream_turn``).
        self._streaming: set[asyncio.Task[BaseException | None]] = set()
        if not isinstance(stream_buffer, int) or stream_buffer < 1:
            raise InvalidRequestError(
                f"stream_buffer must be a positive int, got {stream_buffer!r}"
            )
        self.stream_buffer = stream_buffer
        # The store, if it keeps turn streams; the sinks of turns this process runs.
        self._streams = streams.stream_store(durability)
        self._live: dict[tuple[str, str], TurnSink] = {}
        self._inbox: Inbox | None = None
        self._detached: Inbox | None = None  # drains detached turns (``detach_turn``)
        if agent.on_busy in ("queue", "steer", "interrupt"):
            has_inbox = getattr(durability, "has_inbox", None)
            if not isinstance(durability, InboxStore) or has_inbox is False:
                raise CompilationError(
                    [
                        f"on_busy={agent.on_busy!r} needs a store that keeps a thread inbox; "
                        f"{type(durability).__name__} keeps none"
                    ]
                )
            self._inbox = Inbox(
                durability,
                self._run_waiting,
                interrupt=agent.on_busy == "interrupt",
                steer=self._committed if agent.on_busy == "steer" else None,
            )

    def begin_shutdown(self) -> None:
        """Drain this kernel for shutdown, as a host does on SIGTERM.

        It takes no new turn. A running one stops at its next safe point: before a step
        or a round.

        Both raise :class:`~intention_kernel.ShuttingDownError`, and commit nothing. A
        turn that reaches its commit before a safe point commits, as always. What a
        stopped turn did stays durable: its journal keeps its rounds, its receipts its
        writes. Its client delivers it again to another process, which goes on from
        there. A queued message stays in the inbox for another process to drain. A
        host gives running turns a grace period, then cancels what still runs (it
        fails closed the same way). There is no way back: build a new ``Kernel``."""
        self._shutting_down = True

    @property
    def shutting_down(self) -> bool:
        """Whether :meth:`begin_shutdown` was called."""
        return self._shutting_down

    @property
    def fingerprint(self) -> str:
        """Stable hash of the agent's name, version and capability definitions."""
        return self._compiled.fingerprint

    async def turn(
        self,
        thread_id: str,
        turn_id: str,
        message: str | None = None,
        answer: Answer | str | None = None,
        *,
        tenant_id: str | None = None,
        principal: Principal | None = None,
    ) -> TurnResult:
        """Run (or replay) one turn.

        ``turn_id`` must identify the user's delivery and stay the same across
        transport retries. A committed ``turn_id`` returns the stored result. A new
        one is a new turn. One that begins with a prefix the kernel keeps for
        its own turns (``expire:``) is refused with ``ReservedTurnIdError``.
        ``answer`` (an ``Answer``, ``"accept"`` or ``"reject"``) answers the active
        interaction without interpretation.

        ``principal`` is who sent the turn. Its tenant is the turn's tenant (a
        different ``tenant_id`` is refused with ``InvalidRequestError``). Its name is
        the actor of any answer in the turn, structured or read from the message. An
        ``Answer`` naming another actor is refused. The capabilities' approver
        policies judge it (see the guide *Who may approve*).
        """
        scope, request = self._request(thread_id, turn_id, message, answer, tenant_id, principal)
        if self._inbox is not None:
            result = await self._inbox.submit(scope, request, wait=True)
            assert isinstance(result, TurnResult)
            return result
        return await self._run(scope, request)

    async def submit(
        self,
        thread_id: str,
        turn_id: str,
        message: str | None = None,
        answer: Answer | str | None = None,
        *,
        tenant_id: str | None = None,
        principal: Principal | None = None,
    ) -> TurnResult | Queued:
        """Deliver one turn and answer at once, as :meth:`turn` takes it.

        With ``Agent(on_busy="queue")``, a turn whose thread is busy (or has queued
        turns) goes to the thread's inbox. It is committed there before this returns.
        The answer is a :class:`~intention_kernel.Queued` naming its position. It runs
        later as its own turn, in the order of acceptance. The worker holding the thread
        drains the inbox after its commit. A queued turn ID delivered again answers its
        position while it waits. It answers its result (``replayed=True``) once it ran.
        With any other ``on_busy`` this is :meth:`turn`.
        """
        scope, request = self._request(thread_id, turn_id, message, answer, tenant_id, principal)
        if self._inbox is not None:
            return await self._inbox.submit(scope, request, wait=False)
        return await self._run(scope, request)

    async def cancel(
        self,
        thread_id: str,
        turn_id: str,
        *,
        reason: str | None = None,
        owner: ThreadOwner | None = None,
    ) -> Cancellation:
        """Stop turn ``turn_id`` of the thread, in any process.

        A committed turn is left as it is (``status="committed"``). A turn waiting in
        the inbox, not started, is removed from it (``"dequeued"``): it will not run.
        Otherwise the request is recorded (``"requested"``). So is a queued turn
        already running, or one whose delivery holds the thread in any process.
        The running turn stops at its next safe point, before its next step or
        round. It commits what it did, and its reply says it was cancelled.
        An effect call already sent settles by its receipt, as always.
        A confirmation the turn opened stays open: stopping is not a refusal. A turn
        ID not yet delivered stops at its first safe point when it comes. A turn that
        accepts a confirmation reads the request before the write starts. A caller
        waiting for a dequeued turn gets ``TurnCancelledError`` at once.

        ``owner``: cancel only as a caller of that tenant (``ThreadOwner(None)``: a
        caller without one), as a host does for its principal. A thread or queued turn
        of another tenant raises ``TenantMismatchError`` and records nothing. The
        request then stops only a turn of the caller's tenant."""
        if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_ANSWER_TEXT):
            raise InvalidRequestError(
                f"a cancel's reason must be a string of at most {MAX_ANSWER_TEXT} characters"
            )
        if not self._stoppable:
            raise InvalidRequestError(
                f"{type(self.durability).__name__} keeps no stop requests; cancel needs one"
            )
        store: Any = self.durability
        if owner is None:
            status = await store.request_cancel(thread_id, turn_id, reason)
        else:
            status = await store.request_cancel(thread_id, turn_id, reason, owner=owner)
            if status == "not-found":
                raise TenantMismatchError(
                    f"thread {thread_id!r} or its turn {turn_id!r} belongs to another tenant"
                )
        if status == "dequeued" and (thread_id, turn_id, False) in self._delivering:
            status = "requested"  # a delivery of it runs here: only its queued copy went
        if status == "dequeued":  # a timer's queued turn: settled, so it fires no more
            await _timer_runner.settle_cancelled(self, thread_id, turn_id)
        if status != "committed":
            scope = ANY_TENANT if owner is None else cancel_scope(owner.tenant_id)
            self._cancels.setdefault((thread_id, turn_id), {}).setdefault(scope, reason)
            if self._inbox is not None:
                self._inbox.dequeued(thread_id, turn_id)
        return Cancellation(thread_id, turn_id, status, reason)

    def _stop(self, scope: TurnScope, request: TurnRequest) -> TurnRequest:
        """``request`` with its ``stop``: what each safe point of the turn asks."""
        if not self._stoppable:
            return request
        key, store, replies = (scope.thread_id, scope.turn_id), self.durability, self.agent.replies
        # A queued turn, or a timer's, reads the store at each safe point. A caller may
        # cancel it while it waits, so the stop may be there before it starts.
        timer = request.timer is not None
        after = 0.0 if request.queued or timer else self.cancel_check_after
        started = time.monotonic()

        inbox = self._inbox if request.queued else None
        own = cancel_scope(scope.tenant_id)
        # A timer's turn takes no steers: a person's message gets a turn of its own.
        steering = self._compiled.agent.on_busy == "steer" and not timer
        starting = request.queued and steering
        # A queued turn reads only cancels at its start: an interrupt stops it later.
        first = request.queued

        async def stop(base_version: int, at_once: bool) -> str | None:
            nonlocal starting, first
            at_start, first = first, False
            if self._shutting_down:
                raise _shutting_down(scope, "stopped at a safe point, before its commit")
            if inbox is not None:
                inbox.started(*key)  # under the lock: its waiting caller now waits for it
            if starting:  # a queued steer a running turn took since: it runs no more
                starting = False
                taken_by = await store.taker(*key)  # type: ignore[attr-defined]
                if taken_by is not None:
                    raise Steered(taken_by)
            # Started before? Ask the store. Most turns meet no cancel: no lookup then.
            cancels = self._cancels
            asked = cancels.get(key) if cancels and not at_start else None
            if asked is not None:
                for mine in (ANY_TENANT, own):
                    if mine in asked:
                        return stopping("cancelled", replies.turn_cancelled(asked[mine]))
            if not at_once and time.monotonic() - started < after:
                return None
            # A queued turn's start marks its entry: a cancel now answers "requested".
            read = store.start_queued if at_start else store.read_cancel  # type: ignore[attr-defined]
            found, reason = await read(*key, base_version, scope.tenant_id)
            if found == "interrupt":
                return None if at_start else stopping("interrupted", replies.turn_interrupted())
            return stopping("cancelled", replies.turn_cancelled(reason)) if found else None

        def stopping(kind: StopKind, line: str) -> str:
            if request.sink is not None:  # a streamed turn says so as it stops
                request.sink.stopped(kind, line)
            if timer and (notes := self._timer_stops.get(key)):  # its pass's outcome names it
                for note in notes:  # only the pass that commits the turn reports it
                    note.kind = kind
            return line

        if not steering:
            return request.with_stop(stop)

        async def steers() -> list[dict[str, str]]:
            taken = await store.take_steers(*key)  # type: ignore[attr-defined]
            return [
                {"turn_id": entry.turn_id, "message": message}
                for entry in taken
                if (message := decode_entry(entry)[1].message) is not None
            ]

        return request.with_stop(stop, steers)

    async def _committed(
        self,
        scope: TurnScope,
        wait: bool,
        free: Callable[[], Awaitable[None]] | None = None,
    ) -> TurnResult | None:
        """The committed turn's result, replayed; ``None`` while it is not committed
        (or, with ``wait=False``, while another turn holds the thread). ``free`` runs
        under the thread's lock when the turn is not committed: it is not running."""

        async def not_committed(tx: Any) -> Any:
            if free is not None:
                await free()
            raise _NotCommitted

        try:
            if wait:
                return await self.durability.with_turn(scope, not_committed)
            return await self.durability.with_turn(scope, not_committed, wait=False)
        except (_NotCommitted, ThreadBusyError):
            return None

    async def drain(self, thread_id: str) -> list[TurnResult]:
        """Run the thread's queued turns now, in order, waiting for its lock; their
        results. For a thread whose worker crashed after accepting a message: the next
        turn on the thread drains it too. Needs ``Agent(on_busy="queue")``."""
        if self._inbox is None:
            if self._detached is None and (self._streams is None or not self._stoppable):
                raise InvalidRequestError("drain needs an agent with on_busy='queue'")
            return await self._detacher().drain(thread_id)  # detached turns
        return await self._inbox.drain(thread_id)

    async def drained(self) -> None:
        """Wait until this kernel's background drains (after a commit) have ended."""
        if self._inbox is not None:
            await self._inbox.idle()
        if self._detached is not None:
            await self._detached.idle()

    def _run_waiting(
        self, scope: TurnScope, request: TurnRequest, wait: bool
    ) -> Awaitable[TurnResult]:
        unread = request.queued or request.timer is not None
        if unread and self._streams is not None and request.sink is None:
            # A turn drained from the inbox (a detached one, say), or a timer's: watchable.
            return self._run_recorded(scope, request, wait)
        if request.timer is not None:
            return self._run_timer(scope, request, wait=wait)
        return self._run(scope, request, wait=wait)

    async def _run_recorded(self, scope: TurnScope, request: TurnRequest, wait: bool) -> TurnResult:
        """Run a queued turn with its stream recorded, for watchers: nobody reads it live."""
        key = (scope.thread_id, scope.turn_id)
        sink = TurnSink(streams.Recording(streams.loader(self._streams, *key)))
        sink.detach()
        self._live[key] = sink
        request = dataclasses.replace(request, sink=sink)
        try:
            if request.timer is not None:
                return await self._run_timer(scope, request, wait=wait)
            return await self._run(scope, request, wait=wait)
        finally:
            if self._live.get(key) is sink:
                del self._live[key]
            sink.wake()

    async def _fire_timer(
        self, scope: TurnScope, request: TurnRequest
    ) -> tuple[TurnResult | Queued, StopKind | None]:
        """Fire an application timer's occurrence as a turn of the agent; what it
        answered, and how its turn stopped (``None``: it ran to its end).

        Take an agent with an inbox: ``on_busy`` ``"queue"``, ``"steer"`` or
        ``"interrupt"``. A timer that finds its thread busy goes in the inbox, as a
        message. It runs after
        the turns accepted before it, in order: :class:`Queued` says so. It neither
        steers nor interrupts the running turn: no person sent it. Any other agent waits
        for the thread's lock."""
        key = (scope.thread_id, scope.turn_id)
        # Noted while this call waits: a stop of the turn is then written on its note.
        # A turn drained later, when nobody waits for its outcome, leaves nothing behind.
        note = _StopNote()
        notes = self._timer_stops.setdefault(key, [])
        notes.append(note)
        try:
            if self._inbox is not None:
                done = await self._inbox.submit(scope, request, wait=False)
            else:
                done = await self._run_waiting(scope, request, True)
        finally:
            notes.remove(note)
            if not notes:
                del self._timer_stops[key]
        return done, note.kind

    async def _run_timer(self, scope: TurnScope, request: TurnRequest, *, wait: bool) -> TurnResult:
        """Run a timer's turn as :meth:`_run` runs a person's: stoppable by :meth:`cancel`,
        and by :meth:`begin_shutdown`."""
        if self._shutting_down:
            raise _shutting_down(scope, "not taken")
        result = await _timer_runner.run_agent_timer(self, scope, self._stop(scope, request), wait)
        if self._cancels:
            self._cancels.pop((scope.thread_id, scope.turn_id), None)
        return result

    async def _cancelled_before(self, scope: TurnScope, base_version: int) -> bool:
        """Whether a cancel of turn ``scope`` was recorded before it started.

        The turn is a timer's, under the thread's lock. This kernel is asked first,
        then the store."""
        asked = self._cancels.get((scope.thread_id, scope.turn_id))
        if asked is not None and (ANY_TENANT in asked or cancel_scope(scope.tenant_id) in asked):
            return True
        if not self._stoppable:
            return False
        store: Any = self.durability
        # With an inbox, an entry of this turn ID may wait: a worker whose claim lapsed
        # queued it. Once it is marked started, a cancel no longer dequeues a turn
        # that runs. Without one, no entry exists, and a read is enough.
        read = store.start_queued if self._inbox is not None else store.read_cancel
        found, _ = await read(scope.thread_id, scope.turn_id, base_version, scope.tenant_id)
        return bool(found == "cancel")

    async def stream_turn(
        self,
        thread_id: str,
        turn_id: str,
        message: str | None = None,
        answer: Answer | str | None = None,
        *,
        tenant_id: str | None = None,
        principal: Principal | None = None,
        after: str | None = None,
    ) -> AsyncGenerator[TurnEvent, None]:
        """Run (or replay) one turn as :meth:`turn` does, yielding its events as they
        happen (:class:`~intention_kernel.TurnEvent`); the last is ``result``.

        Each event has an ``id``. ``after`` (an event's ID) resumes the stream of a
        retried delivery: only later events are yielded. Rounds that an earlier
        delivery recorded are streamed as recorded, never run again for the stream
        (:meth:`watch_turn` has the rules).

        A replayed turn yields only its ``result``. Every event before ``result`` is
        provisional. If the turn fails, the iterator raises what :meth:`turn` would
        raise. Nothing is committed then, and the same delivery can be retried.
        The turn runs in a task of its own that the iterator only watches.
        A consumer that stops iterating (or is cancelled) does not abort it.
        The turn runs to its commit; a retry with its turn ID gets the result.
        """
        scope, request = self._request(thread_id, turn_id, message, answer, tenant_id, principal)
        position = streams.parse_after(after) if after is not None else None
        store, key = self._streams, (thread_id, turn_id)
        if position is not None and store is None:
            raise InvalidRequestError(f"{type(self.durability).__name__} keeps no turn streams")
        record = streams.Recording(streams.loader(store, *key)) if store is not None else None
        sink = TurnSink(record, limit=self.stream_buffer if store is not None else 0)
        request = dataclasses.replace(request, sink=sink)
        task = asyncio.create_task(self._streamed(scope, request, sink))
        # The loop keeps only a weak reference to a task. A turn whose reader left
        # would otherwise be collected before its commit.
        self._streaming.add(task)
        task.add_done_callback(self._streaming.discard)
        self._live[key] = sink  # until ``_streamed`` ends
        last: str | None = None
        try:
            while True:
                event = await sink.next()
                if event is None:  # the reader fell behind: on from the store
                    if last is not None:
                        position = streams.parse_after(last)
                    async for event in self._watch(scope, position, failed=task):
                        yield event
                    return
                if isinstance(event, BaseException):
                    raise event
                if position is None or position.before(event):
                    yield event
                    last = event.id
                if event.type == "result":
                    return
        finally:
            sink.detach()

    def watch_turn(
        self,
        thread_id: str,
        turn_id: str,
        *,
        after: str | None = None,
        tenant_id: str | None = None,
        principal: Principal | None = None,
        poll: float = 0.1,
    ) -> AsyncIterator[TurnEvent]:
        """The events of turn ``turn_id`` after event ``after``, as the store records them.

        They come from any process. The last is ``result``, once the turn committed.

        It runs nothing. It reads the turn's recorded rounds while the turn runs: every
        ``poll`` seconds, or at once in the process running it. It reads the result
        after the commit. Events are recorded by round, with the round's journal entry.
        A watcher sees each round's events once its next round is recorded. It never
        sees a version that was not recorded. What follows the last recorded round comes as the
        ``result`` alone. A turn that never commits is watched until the caller stops.
        ``InvalidRequestError`` for an ID that names no event, or a store that keeps
        no turn streams; ``TenantMismatchError`` for another tenant's thread. A
        timer's turn (``timer:<key>@<due time>``) can be watched too: it runs nothing.
        So can an expiry's (``expire:<interaction id>``): it records its result alone.
        """
        _check_read_turn_id(turn_id)
        position = streams.parse_after(after)
        if principal is not None:
            tenant_id, _ = _as_principal(principal, tenant_id, None)
        poll = _check_seconds("poll", poll)
        if self._streams is None:
            raise InvalidRequestError(f"{type(self.durability).__name__} keeps no turn streams")
        scope = TurnScope(thread_id, turn_id, tenant_id)
        return self._watch(scope, position, poll=poll)

    async def _watch(
        self,
        scope: TurnScope,
        position: streams.After | None,
        *,
        poll: float = 0.1,
        failed: asyncio.Task[BaseException | None] | None = None,
    ) -> AsyncIterator[TurnEvent]:
        key = (scope.thread_id, scope.turn_id)

        def wake() -> asyncio.Event | None:
            if failed is not None and failed.done() and (error := failed.result()) is not None:
                raise error  # the turn this stream ran failed: no result will come
            sink = self._live.get(key)
            return sink.changed() if sink is not None else None

        async for event in streams.watch_store(
            self._streams, *key, position, tenant_id=scope.tenant_id, poll=poll, wake=wake
        ):
            yield event

    async def turn_status(
        self,
        thread_id: str,
        turn_id: str,
        *,
        tenant_id: str | None = None,
        principal: Principal | None = None,
    ) -> streams.TurnStatus:
        """Where turn ``turn_id`` is: queued, running, committed (with its result), or
        unknown (:class:`~intention_kernel.TurnStatus`). A queued turn whose thread
        nobody drains (its accepting process died) is drained by this process now.
        A timer's turn (``timer:<key>@<due time>``) can be read too, by its thread's
        tenant, as :meth:`watch_turn` reads it. So can an expiry's turn
        (``expire:<interaction id>``)."""
        _check_read_turn_id(turn_id)
        if principal is not None:
            tenant_id, _ = _as_principal(principal, tenant_id, None)
        if self._streams is None:
            raise InvalidRequestError(f"{type(self.durability).__name__} keeps no turn streams")
        key = (thread_id, turn_id)
        found, queued = await streams.status_of(
            self._streams, *key, tenant_id=tenant_id, live=key in self._live
        )
        if queued and key not in self._live:
            # Perhaps nobody drains it: its accepting process died. This one does now
            # (it waits for the thread's lock; a live holder's commit is replayed).
            self._detacher().watch(thread_id)
        return found

    async def detach_turn(
        self,
        thread_id: str,
        turn_id: str,
        message: str | None = None,
        answer: Answer | str | None = None,
        *,
        tenant_id: str | None = None,
        principal: Principal | None = None,
    ) -> streams.TurnStatus:
        """Accept one turn and answer at once.

        The turn runs to its commit in the background, whether or not anybody watches
        it (:meth:`watch_turn`).

        The turn is first committed to its thread's inbox, so it survives this
        process. If the process dies, the next process that drains the thread runs it.
        That drain is its next turn with ``on_busy="queue"``, :meth:`drain`, or a
        :meth:`turn_status` of it. The answer is ``"queued"``, or ``"committed"``
        with the stored result when the turn ID was already committed."""
        scope, request = self._request(thread_id, turn_id, message, answer, tenant_id, principal)
        store = self._streams
        if store is None or not isinstance(self.durability, InboxStore) or not self._stoppable:
            raise InvalidRequestError(
                f"{type(self.durability).__name__} keeps no thread inbox and turn streams; "
                "a detached turn needs both"
            )
        await streams.check_owner(store, thread_id, turn_id, scope.tenant_id)
        entry = InboxEntry(
            thread_id,
            turn_id,
            scope.tenant_id,
            scope.request_digest,
            encode_request(request),
            utcnow(),
        )
        if await self.durability.enqueue(entry) is None:  # committed: its result
            return streams.TurnStatus(
                thread_id, turn_id, "committed", await self._run(scope, request)
            )
        self._detacher().watch(thread_id)
        return streams.TurnStatus(thread_id, turn_id, "queued")

    def _detacher(self) -> Inbox:
        """The inbox that drains detached turns: the agent's own, if it has one."""
        if self._inbox is not None:
            return self._inbox
        if self._detached is None:
            assert isinstance(self.durability, InboxStore)
            self._detached = Inbox(self.durability, self._run_waiting)
        return self._detached

    async def _drain(self) -> None:
        """Wait until every streamed turn has ended, its reader gone or not.

        ``SyncKernel.close`` awaits this before it closes the store. Closed first, the
        store would fail a turn whose reader left before its commit."""
        while self._streaming:
            await asyncio.gather(*self._streaming, return_exceptions=True)

    async def _streamed(
        self, scope: TurnScope, request: TurnRequest, sink: TurnSink
    ) -> BaseException | None:
        """Run the streamed turn and hand its end to the sink: the result, or its error.

        The error is also returned, for a reader that went on from the store. An agent with an
        inbox queues it as :meth:`turn` does (a ``queued`` event)."""
        try:
            try:
                if self._inbox is not None:
                    ran = await self._inbox.submit(scope, request, wait=True)
                    assert isinstance(ran, TurnResult)
                    result = ran
                else:
                    result = await self._run(scope, request)
            except asyncio.CancelledError as cancelled:
                sink.fail(cancelled)  # the reader must not wait for a result that never comes
                raise
            except Exception as error:
                sink.fail(error)
                logger.debug(
                    "streamed turn %r of thread %r failed: %s: %s",
                    scope.turn_id,
                    scope.thread_id,
                    type(error).__name__,
                    error,
                    extra={"thread_id": scope.thread_id, "turn_id": scope.turn_id},
                )
                return error
            sink.result(result.to_dict())
            return None
        finally:
            key = (scope.thread_id, scope.turn_id)
            if self._live.get(key) is sink:
                del self._live[key]

    def _request(
        self,
        thread_id: str,
        turn_id: str,
        message: str | None,
        answer: Answer | str | None,
        tenant_id: str | None,
        principal: Principal | None = None,
    ) -> tuple[TurnScope, TurnRequest]:
        """The turn's scope and request, or ``InvalidRequestError`` before anything ran."""
        # The IDs are checked once, by the adapter's ``with_turn``, before it reads.
        # Only the reserved prefixes are the kernel's: the sweep calls ``with_turn`` itself.
        check_client_turn_id(turn_id)
        resolved = None if answer is None else _answer(answer)
        if principal is not None:
            tenant_id, resolved = _as_principal(principal, tenant_id, resolved)
        if message is None and resolved is None:
            raise InvalidRequestError("a turn needs a message, an answer, or both")
        if message is not None:
            if not isinstance(message, str):
                raise InvalidRequestError(f"message must be a string, got {type(message).__name__}")
            if len(message) > self.max_message_chars:
                raise InvalidRequestError(
                    f"message is {len(message)} characters long; the limit is "
                    f"{self.max_message_chars}"
                )
            if not message.isascii() and not _encodable(message):
                raise InvalidRequestError("message is not valid Unicode text (a lone surrogate)")
        scope = TurnScope(
            thread_id,
            turn_id,
            tenant_id,
            request_digest(message, resolved.to_dict() if resolved else None),
        )
        return scope, TurnRequest(message, resolved, principal=principal)

    async def _run(
        self, scope: TurnScope, request: TurnRequest, *, wait: bool | None = None
    ) -> TurnResult:
        if self._shutting_down:
            raise _shutting_down(scope, "not taken")
        compiled = self._compiled
        thread_id, turn_id = scope.thread_id, scope.turn_id
        # The turn's operation, ``run_turn`` with all but ``tx`` bound: a partial, which
        # adds no frame of Python to the call.
        operation: TurnOperation = functools.partial(
            run_turn, compiled, request=self._stop(scope, request), clock=self.clock
        )
        durability = self.durability
        reject = compiled.agent.on_busy == "reject" if wait is None else not wait

        def with_turn() -> Awaitable[TurnResult]:
            # ``wait=False``: one attempt at the thread's lock, ThreadBusyError at once
            # while another turn holds it. Passed only then, so that a durability
            # written before the keyword existed still serves agents that wait.
            if reject:
                return durability.with_turn(scope, operation, wait=False)
            return durability.with_turn(scope, operation)

        # While a delivery runs here, a cancel dequeuing a queued copy of it answers
        # "requested". A queued one is marked in its entry as it starts instead.
        delivering, key = self._delivering, (thread_id, turn_id, request.queued)
        delivering[key] = delivering.get(key, 0) + 1
        try:
            if not _tracing.enabled():  # ``with_turn()``, without its frame
                result = await (
                    durability.with_turn(scope, operation, wait=False)
                    if reject
                    else durability.with_turn(scope, operation)
                )
            else:
                with _tracing.span(
                    "intention_kernel.turn",
                    thread_id=thread_id,
                    turn_id=turn_id,
                    tenant_id=scope.tenant_id,
                ) as span:
                    result = await with_turn()
                    _tracing.annotate(
                        span, replayed=result.replayed, checkpoint_version=result.checkpoint_version
                    )
        finally:
            if left := delivering.pop(key) - 1:
                delivering[key] = left
        if self._cancels:
            self._cancels.pop((thread_id, turn_id), None)  # committed: no stop is left to see
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "turn %r of thread %r %s (version %d)",
                turn_id,
                thread_id,
                "replayed" if result.replayed else "committed",
                result.checkpoint_version,
                extra={"thread_id": thread_id, "turn_id": turn_id, "replayed": result.replayed},
            )
        return result

    # -- timers (see ``_timers`` and ``_timer_runner``) --------------------------------------

    async def schedule(
        self,
        thread_id: str,
        key: str,
        *,
        at: datetime | None = None,
        after: timedelta | None = None,
        message: str | None = None,
        data: Any = None,
        unless_version_after: int | None = None,
        every: timedelta | None = None,
        cron: str | None = None,
        tenant_id: str | None = None,
    ) -> Timer:
        """Set timer ``key`` of the thread from application code, as
        :meth:`CapabilityContext.schedule <intention_kernel.CapabilityContext.schedule>`
        does in a turn; ``after`` counts from the kernel's clock. It is written at once,
        under the thread's lock (so after a running turn commits), with ``timer.set``.
        Bad input raises ``InvalidRequestError`` and changes nothing."""
        return await _timer_runner.schedule(
            self,
            thread_id,
            key,
            tenant_id=tenant_id,
            at=at,
            after=after,
            message=message,
            data=data,
            unless_version_after=unless_version_after,
            every=every,
            cron=cron,
        )

    async def cancel_timer(self, thread_id: str, key: str) -> bool:
        """Cancel the thread's pending timer ``key``, under its lock, with
        ``timer.cancelled``; whether there was one."""
        return await _timer_runner.cancel_timer(self, thread_id, key)

    async def timers(
        self, thread_id: str | None = None, *, status: str | None = None, limit: int = 100
    ) -> list[Timer]:
        """Up to ``limit`` timers (of one thread, of one status if given), by thread and key."""
        return await _timer_runner.list_timers(self, thread_id, status=status, limit=limit)

    async def fire_due_timers(
        self, *, limit: int = 100, claim_for: float = 60.0
    ) -> list[TimerOutcome]:
        """Claim up to ``limit`` due timers and run each as its turn, once.

        Return what became of each. Any number of processes may call it at once: see
        :mod:`intention_kernel._timer_runner` for the protocol. ``claim_for``: how long
        other workers leave a claimed timer alone. A worker killed after its claim is
        taken over once the claim ends."""
        return await _timer_runner.fire_due(self, limit=limit, claim_for=claim_for)

    async def run_timers(
        self,
        *,
        poll_interval: float = 0.25,
        limit: int = 100,
        claim_for: float = 60.0,
        stop: asyncio.Event | None = None,
    ) -> None:
        """Fire due timers until ``stop`` is set or the task is cancelled, polling every
        ``poll_interval`` seconds (:meth:`fire_due_timers` in a loop)."""
        await _timer_runner.run_timers(
            self, poll_interval=poll_interval, limit=limit, claim_for=claim_for, stop=stop
        )

    async def checkpoint(self, thread_id: str) -> KernelCheckpoint | None:
        """The thread's latest committed checkpoint (a convenience over the adapter)."""
        return await self.durability.load_checkpoint(thread_id)


def _answer(answer: Any) -> Answer | None:
    if answer is None:
        return None
    if isinstance(answer, Answer):
        if answer.decision not in ("accept", "reject"):
            raise InvalidRequestError(
                f"an answer's decision must be 'accept' or 'reject', got {answer.decision!r}"
            )
        if answer.input is not None:
            if not isinstance(answer.input, dict):
                raise InvalidRequestError(
                    f"an answer's input must be an object, got {type(answer.input).__name__}"
                )
            if answer.decision != "accept":
                raise InvalidRequestError(
                    "an answer's input edits the operation it approves: it goes with an "
                    "accept, not a reject"
                )
        for name in ("reason", "actor", "digest"):
            text = getattr(answer, name)
            if text is None:
                continue
            if not isinstance(text, str):
                raise InvalidRequestError(
                    f"an answer's {name} must be a string, got {type(text).__name__}"
                )
            if len(text) > MAX_ANSWER_TEXT:
                raise InvalidRequestError(
                    f"an answer's {name} is {len(text)} characters long; the limit is "
                    f"{MAX_ANSWER_TEXT}"
                )
            if not text.isascii() and not _encodable(text):
                raise InvalidRequestError(
                    f"an answer's {name} is not valid Unicode text (a lone surrogate)"
                )
        try:
            normalize(answer.to_dict())  # what no store can hold or read back
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"an answer must be JSON-serializable: {exc}") from exc
        return answer
    if answer in ("accept", "reject"):
        return Answer(None, answer)
    raise InvalidRequestError(f"answer must be 'accept', 'reject' or an Answer, got {answer!r}")


def _as_principal(
    principal: Principal, tenant_id: str | None, answer: Answer | None
) -> tuple[str | None, Answer | None]:
    """The turn's tenant and answer when ``principal`` sends it, or
    ``InvalidRequestError``: a principal answers as itself, in its own tenant."""
    if not isinstance(principal, Principal):
        raise InvalidRequestError(f"principal must be a Principal, got {type(principal).__name__}")
    if tenant_id is not None and tenant_id != principal.tenant_id:
        raise InvalidRequestError(
            f"tenant_id {tenant_id!r} differs from the principal's tenant "
            f"{principal.tenant_id!r}; a principal's turns run in its own tenant"
        )
    if answer is not None:
        if answer.actor is not None and not same_principal(answer.actor, principal.name):
            raise InvalidRequestError(
                f"the answer names actor {answer.actor!r}, but the turn is sent by "
                f"{principal.name!r}; a principal answers only as itself"
            )
        if answer.actor != principal.name:
            answer = dataclasses.replace(answer, actor=principal.name)
    return principal.tenant_id, answer


def _encodable(text: str) -> bool:
    """Whether a store can hold ``text``: UTF-8 cannot encode a lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: The reserved prefixes whose turns a reader may read: a timer's, and an expiry's.
#: A new kind of kernel turn stays unreadable until it is added here.
_READABLE_PREFIXES = (TIMER_TURN_PREFIX, EXPIRY_TURN_PREFIX)


def _check_read_turn_id(turn_id: str) -> None:
    """Refuse a reserved turn ID to a reader, except a timer's or an expiry's turn.

    A person watching a thread may read those turns' status and events. Reading
    delivers nothing, and the reservation guards only deliveries."""
    if not (isinstance(turn_id, str) and turn_id.startswith(_READABLE_PREFIXES)):
        check_client_turn_id(turn_id)


class _StopNote:
    """How a timer's turn stopped, for one fire pass waiting for it (``None``: not)."""

    __slots__ = ("kind",)

    def __init__(self) -> None:
        self.kind: StopKind | None = None


class _NotCommitted(Exception):
    """A probe for a committed turn found none (``Kernel._committed``)."""


def _shutting_down(scope: TurnScope, what: str) -> ShuttingDownError:
    return ShuttingDownError(
        f"this kernel drains for shutdown: turn {scope.turn_id!r} of thread "
        f"{scope.thread_id!r} was {what}; nothing was committed, deliver it again",
        thread_id=scope.thread_id,
        turn_id=scope.turn_id,
    )
