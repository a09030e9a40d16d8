"""Firing timers: claim the due ones, run each as a turn, settle it with that turn.

The protocol, for any number of workers in any number of processes:

1. **Claim.** One transaction sets ``claimed_until = now + claim_for`` on up to
   ``limit`` pending timers due at ``now`` whose claim is absent or over
   (``TimerRecorder.claim_timers``). A claim takes no thread lock: it only keeps
   other workers off the timer while this one fires it.
2. **Fire.** For each claimed occurrence, ``with_turn`` under the turn ID
   ``timer:<key>@<due time>`` (:func:`~intention_kernel._timers.timer_turn_id`). That
   waits for the thread's lock like any turn. An agent with an inbox queues it there
   instead while the thread is busy, and a drain runs it in acceptance order. A
   committed turn ID is replayed, and nothing runs. Otherwise, under the lock, the
   timer's row is read again: a timer moved, cancelled or settled since the claim
   runs nothing (``stale``). A guard that finds the thread past
   ``unless_version_after`` settles the row ``void``, under the lock, and commits no
   turn. A cancel recorded before it starts settles the row and commits no turn.
   Else the agent's turn runs, as a person's would: in rounds, journaled, stoppable
   by ``Kernel.cancel``.
3. **Settle.** The turn's commit carries three things, atomically. They are the
   row's settlement (``fired``, or the next occurrence of a recurring timer),
   ``timer.fired``, and the turn's own timer writes. A replayed turn settles the row
   under the lock. (A second claim after a commit whose settlement was lost cannot
   happen. But a key set again at a due time already fired can replay.)

A worker killed after its claim leaves the row pending and claimed. Once the claim
is over, another worker claims it and runs the same turn ID. A worker killed after
the commit left the row settled. Two workers may fire one occurrence at once, when a
claim lapsed while its turn ran. They run one turn ID: the turn commits once, the
second replays. So each occurrence commits exactly one turn, and none is lost while some
worker runs. Two passes of one kernel fire one occurrence once between them: the
second waits for the first one's outcome (``_fire_shared``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, cast

from intention_kernel import _tracing
from intention_kernel._deadlines import read_clock
from intention_kernel._ids import check_id
from intention_kernel._inbox import Queued
from intention_kernel._interpretation import FiredTimer
from intention_kernel._runtime import TurnRequest, run_turn
from intention_kernel._timers import (
    EXPIRY_TIMER_PREFIX,
    KERNEL_TIMER_PREFIX,
    REMINDER_TIMER_PREFIX,
    cancelled_event,
    check_key,
    fired_event,
    fired_timer,
    merge_writes,
    plan_timer,
    same_occurrence,
    set_event,
    settled,
    skipped,
    timer_digest,
    timer_turn_id,
)
from intention_kernel._turns import TIMER_TURN_PREFIX, TurnCommit, TurnResult, TurnScope
from intention_kernel.durability import TurnTransaction
from intention_kernel.durability._contract.recorders import TimerRecorder, TurnRecorder
from intention_kernel.durability._contract.records import Timer, TimerWrite
from intention_kernel.errors import (
    InvalidRequestError,
    KernelError,
    TenantMismatchError,
    TurnCancelledError,
    TurnConflictError,
    TurnExpiredError,
)

if TYPE_CHECKING:
    from intention_kernel._kernel import Kernel

__all__ = [
    "TimerOutcome",
    "background_timers",
    "cancel_timer",
    "fire_due",
    "list_timers",
    "run_timers",
    "schedule",
]

logger = logging.getLogger("intention_kernel.timers")

#: What became of one claimed occurrence (see :class:`TimerOutcome`).
Outcome = Literal[
    "fired", "replayed", "queued", "void", "stale", "cancelled", "interrupted", "failed"
]


@dataclass(frozen=True, slots=True)
class TimerOutcome:
    """What a worker did with one due timer it claimed.

    ``outcome`` says what happened:

    - ``"fired"``: its turn ran to its end and committed now.
    - ``"replayed"``: its turn had committed already.
    - ``"queued"``: its thread was busy, so it waits in the thread's inbox.
    - ``"void"``: its guard found the thread moved on, or its turn can never run.
    - ``"stale"``: it was moved or cancelled since the claim; nothing ran.
    - ``"cancelled"``: ``Kernel.cancel`` stopped its turn. Cancelled before it
      started, it ran nothing, and ``result`` is ``None``. Cancelled while it ran,
      it committed what it did: ``result`` is that turn, its reply saying so.
    - ``"interrupted"``: a person's message stopped its running turn
      (``on_busy="interrupt"``). It committed what it did, as for a cancel.
    - ``"failed"``: ``error`` says why; it is tried again once the claim is over.

    A cancelled or interrupted timer is settled as a fired one is: no worker fires
    that occurrence again, and a recurring timer keeps its next occurrence.

    Two passes of one kernel that claimed one occurrence report the same outcome.
    The second waits for the first one's. A pass of another kernel, maybe in another
    process, replays the committed turn. It reads how the turn stopped from the
    turn's ``turn.cancelled`` event, and reports ``"cancelled"`` or ``"interrupted"``
    as the first pass did. It tells the two apart by the event's line: an interrupt's
    is the agent's ``Replies.turn_interrupted()``. A replay reports ``"replayed"``
    only for a turn that ran to its end. It does so too once its events were pruned.
    """

    thread_id: str
    key: str
    due_at: datetime
    turn_id: str
    outcome: Outcome
    result: TurnResult | None = None
    error: str | None = None


class _Stale(Exception):
    """Raised in a timer's turn to commit nothing: the row is no longer the claim's."""


class _Void(Exception):
    """Raised in a timer's turn after settling the row void: the thread moved on."""


class _Recorder(TimerRecorder, TurnRecorder):
    """A recorder with timers and the thread lock (every bundled one)."""


async def timer_store(kernel: Kernel) -> _Recorder:
    """The kernel's recorder, if it keeps timers; ``InvalidRequestError`` if not."""
    recorder_of = getattr(kernel.durability, "recorder", None)
    recorder = await recorder_of() if recorder_of is not None else None
    if not isinstance(recorder, TimerRecorder):
        raise InvalidRequestError(
            f"{type(kernel.durability).__name__} keeps no timers; timers need a store "
            "that does (every bundled one)"
        )
    return cast(_Recorder, recorder)


async def schedule(
    kernel: Kernel,
    thread_id: str,
    key: str,
    *,
    tenant_id: str | None,
    **when: Any,
) -> Timer:
    """``Kernel.schedule``: validate, then write the timer under the thread's lock."""
    if tenant_id is not None:
        check_id("tenant_id", tenant_id)
    timer = plan_timer(thread_id, key, now=read_clock(kernel.clock), tenant_id=tenant_id, **when)
    recorder = await timer_store(kernel)
    # Under the lock. A turn of the thread settles or moves its timers in its commit.
    # It must not overwrite a write made while it ran, nor this write its settlement.
    async with recorder.lock(thread_id):
        write = TimerWrite(thread_id, timer.key, timer)
        await recorder.write_timers(thread_id, (write,), (set_event(timer),))
    return timer


async def cancel_timer(kernel: Kernel, thread_id: str, key: str) -> bool:
    """``Kernel.cancel_timer``: delete a pending timer under the thread's lock."""
    check_id("thread_id", thread_id)
    key = check_key(key)
    recorder = await timer_store(kernel)
    async with recorder.lock(thread_id):
        current = await recorder.read_timer(thread_id, key)
        if current is None or current.status != "pending":
            return False
        write = TimerWrite(thread_id, key, None)
        await recorder.write_timers(thread_id, (write,), (cancelled_event(key),))
    return True


async def list_timers(
    kernel_or_recorder: Kernel | TimerRecorder,
    thread_id: str | None = None,
    *,
    status: str | None = None,
    limit: int = 100,
) -> list[Timer]:
    """Up to ``limit`` timers, in ``(thread_id, key)`` order."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidRequestError(f"limit must be a positive integer, got {limit!r}")
    if status not in (None, "pending", "fired", "void"):
        raise InvalidRequestError(f"status must be pending, fired or void, got {status!r}")
    if thread_id is not None:
        check_id("thread_id", thread_id)
    if isinstance(kernel_or_recorder, TimerRecorder):
        recorder: TimerRecorder = kernel_or_recorder
    else:
        recorder = await timer_store(kernel_or_recorder)
    return await recorder.read_timers(thread_id, status, None, limit)


async def fire_due(
    kernel: Kernel,
    *,
    limit: int = 100,
    claim_for: float = 60.0,
    concurrency: int = 16,
) -> list[TimerOutcome]:
    """One pass: claim up to ``limit`` due timers and fire each (see the module)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidRequestError(f"limit must be a positive integer, got {limit!r}")
    if not isinstance(claim_for, int | float) or not claim_for > 0:
        raise InvalidRequestError(f"claim_for must be a positive number, got {claim_for!r}")
    recorder = await timer_store(kernel)
    now = read_clock(kernel.clock)
    claimed = await recorder.claim_timers(now, now + timedelta(seconds=claim_for), limit)
    if not claimed:
        return []
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(timer: Timer) -> TimerOutcome:
        async with gate:
            return await _fire_shared(kernel, recorder, timer)

    return list(await asyncio.gather(*(one(t) for t in claimed)))


async def run_timers(
    kernel: Kernel,
    *,
    poll_interval: float = 0.25,
    limit: int = 100,
    claim_for: float = 60.0,
    stop: asyncio.Event | None = None,
) -> None:
    """Fire due timers until ``stop`` is set, or the task is cancelled.

    It polls every ``poll_interval`` seconds while nothing is due. A pass that failed is
    logged and the loop goes on. A store that is down for a while must not end it."""
    if not isinstance(poll_interval, int | float) or not poll_interval > 0:
        raise InvalidRequestError(f"poll_interval must be positive, got {poll_interval!r}")
    while stop is None or not stop.is_set():
        try:
            fired = await fire_due(kernel, limit=limit, claim_for=claim_for)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            logger.warning("firing timers failed: %s: %s", type(error).__name__, error)
            fired = []
        if len(fired) >= limit:
            continue  # more may be due at once: no pause
        if stop is None:
            await asyncio.sleep(poll_interval)
        else:
            with contextlib.suppress(TimeoutError):  # the poll: nothing to stop yet
                await asyncio.wait_for(stop.wait(), poll_interval)


def background_timers(
    kernel: Kernel, *, poll_interval: float = 0.25
) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """An ASGI lifespan running :func:`run_timers` for the app's life.

    It runs only if the kernel's store keeps timers. It stops, after its pass, when the
    app shuts down."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        try:
            await timer_store(kernel)
        except InvalidRequestError:
            yield  # a store without timers: nothing to fire
            return
        stop = asyncio.Event()
        task = asyncio.create_task(run_timers(kernel, poll_interval=poll_interval, stop=stop))
        try:
            yield
        finally:
            stop.set()
            await task

    return lifespan


#: Makes a kernel timer's commit under the thread's lock: ``(tx, the row, now)`` → the
#: commit. It is ``None`` when the occurrence is void; the row is then settled so.
_Make = Callable[[TurnTransaction, Timer, datetime], Awaitable[TurnCommit | None]]


class TimerSkipped(TurnCancelledError):
    """Raised in a timer's turn that commits nothing: ``outcome`` says why.

    ``"stale"``: the row is no longer the occurrence (moved, cancelled or settled).
    ``"void"``: its guard found the thread moved on. ``"cancelled"``: its turn was
    cancelled before it started. The row is settled for the last two. A
    ``TurnCancelledError``, so that an inbox drain removes the timer's entry."""

    def __init__(self, outcome: Outcome, scope: TurnScope) -> None:
        super().__init__(
            f"timer turn {scope.turn_id!r} of thread {scope.thread_id!r} ran nothing: {outcome}",
            thread_id=scope.thread_id,
            turn_id=scope.turn_id,
        )
        self.outcome = outcome


def agent_timer_scope(timer: Timer) -> tuple[TurnScope, TurnRequest]:
    """The scope and request of an application timer's occurrence: a turn of the agent."""
    turn_id = timer_turn_id(timer.key, timer.due_at)
    scope = TurnScope(timer.thread_id, turn_id, timer.tenant_id, timer_digest(timer))
    return scope, TurnRequest(None, None, timer=fired_timer(timer))


def _is_occurrence(stored: Timer | None, scope: TurnScope, fired: FiredTimer) -> bool:
    """Whether ``stored`` is still the pending occurrence the turn ``scope`` fires.

    It must be due then. It must carry what the turn was made from: its request digest."""
    return (
        stored is not None
        and stored.status == "pending"
        and stored.due_at == fired.due_at
        and timer_digest(stored) == scope.request_digest
    )


async def run_agent_timer(
    kernel: Kernel, scope: TurnScope, request: TurnRequest, wait: bool
) -> TurnResult:
    """Run an application timer's turn as any turn of the agent runs: every round,
    journaled, stoppable (``request.stop``), streamed to ``request.sink``. Its commit
    settles the timer. ``wait=False`` raises ``ThreadBusyError`` while the thread is
    busy. ``TimerSkipped`` when it runs nothing (see there).

    Called directly by a worker. It is also called by an inbox drain, for a timer
    queued behind a busy thread's turns (``on_busy="queue"`` and the others)."""
    fired = request.timer
    assert fired is not None
    recorder = await timer_store(kernel)
    thread_id, key, turn_id = scope.thread_id, fired.key, scope.turn_id
    compiled, clock = kernel._compiled, kernel.clock

    async def operation(tx: TurnTransaction) -> TurnCommit:
        # Under the thread's lock: every other write of the thread's timers waits for it.
        current = await recorder.read_timer(thread_id, key)
        if current is None or not _is_occurrence(current, scope, fired):
            raise TimerSkipped("stale", scope)
        now = read_clock(clock)
        version = tx.checkpoint.version if tx.checkpoint is not None else 0
        guard = current.unless_version_after
        if guard is not None and version > guard:
            void = settled(current, turn_id, now, void=True)
            moved_on = cancelled_event(key, "the thread moved on")
            await recorder.write_timers(thread_id, (void,), (moved_on,))
            raise TimerSkipped("void", scope)
        try:
            if await kernel._cancelled_before(scope, version):
                raise TurnCancelledError("cancelled before it started")
            commit = await run_turn(compiled, tx, request, clock)
        except TurnCancelledError:
            # Cancelled before it started (``Kernel.cancel``): it runs nothing, and is
            # settled so that no worker fires it again. A recurring timer goes on.
            write, event = skipped(current, turn_id, now)
            await recorder.write_timers(thread_id, (write,), (event,))
            raise TimerSkipped("cancelled", scope) from None
        writes = merge_writes((settled(current, turn_id, now), *commit.timers))
        events = (fired_event(current, turn_id), *commit.events)
        return dataclasses.replace(commit, events=events, timers=writes)

    if wait:
        return await kernel.durability.with_turn(scope, operation)
    return await kernel.durability.with_turn(scope, operation, wait=False)


def _kernel_turn(kernel: Kernel, timer: Timer) -> tuple[TurnScope, _Make]:
    """One of the kernel's timers: a confirmation's expiry, or its reminder.

    The expiry is the sweep's turn, under the sweep's turn ID. So the two expire it
    once between them."""
    # Imported here: the operations module (deploy checks, migrations, retention) is
    # a few ms of a plain import, and only a confirmation's timer needs it.
    from intention_kernel.operations import expiry_commit, expiry_scope, reminder_commit

    data = timer.data if isinstance(timer.data, dict) else {}
    interaction_id = str(data.get("interaction_id", ""))
    replies, clock = kernel.agent.replies, kernel.clock
    expiry = timer.key.startswith(EXPIRY_TIMER_PREFIX)
    if expiry:
        scope = expiry_scope(timer.thread_id, timer.tenant_id, interaction_id)
    else:
        turn_id = timer_turn_id(timer.key, timer.due_at)
        scope = TurnScope(timer.thread_id, turn_id, timer.tenant_id, timer_digest(timer))

    async def make(tx: TurnTransaction, current: Timer, now: datetime) -> TurnCommit | None:
        if expiry:
            commit = expiry_commit(tx, interaction_id, clock, replies)
        else:
            commit = reminder_commit(tx, interaction_id, now, replies)
        if commit is None:
            return None  # answered, replaced or expired meanwhile
        writes = [settled(current, scope.turn_id, now)]
        if expiry:  # its reminder, if still pending, has nothing left to remind of
            writes.append(TimerWrite(timer.thread_id, REMINDER_TIMER_PREFIX + interaction_id, None))
        return dataclasses.replace(commit, timers=tuple(writes))

    return scope, make


#: What names one occurrence of a timer, as a worker claimed it: see ``_fire_shared``.
Occurrence = tuple[str, str, datetime, datetime | None, str]


async def _fire_shared(kernel: Kernel, recorder: _Recorder, timer: Timer) -> TimerOutcome:
    """Fire the occurrence ``timer``, or wait for the pass of this kernel firing it now.

    Two passes of one kernel may claim one occurrence: the first one's claim lapsed
    while its turn ran. The second then reports the first one's outcome, the same
    object. Run apart, the second would wait for the lock and replay the turn, or
    queue a copy of it behind it. Its report would then miss how the turn stopped.
    A cancel of the running turn would also find the queued copy and answer
    ``"dequeued"``, as if the turn had never started.

    A pass that was cancelled hands the occurrence on: a pass waiting for it fires it
    itself."""
    occurrence: Occurrence = (
        timer.thread_id,
        timer.key,
        timer.due_at,
        timer.set_at,
        timer_digest(timer),
    )
    firing = kernel._firing
    while (running := firing.get(occurrence)) is not None:
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            if not running.cancelled():
                raise  # this pass was cancelled, not the one it waited for
    future: asyncio.Future[TimerOutcome] = asyncio.get_running_loop().create_future()
    firing[occurrence] = future
    try:
        done = await _fire(kernel, recorder, timer)
    except BaseException:
        future.cancel()  # a pass waiting for it fires it itself
        raise
    finally:
        del firing[occurrence]
    future.set_result(done)
    return done


async def _fire(kernel: Kernel, recorder: _Recorder, timer: Timer) -> TimerOutcome:
    """Run the occurrence ``timer`` as its turn, in an ``intention_kernel.turn`` span as
    :meth:`Kernel.turn` has, naming the timer and what became of it."""
    if not _tracing.enabled():
        return await _fire_once(kernel, recorder, timer)
    with _tracing.span(
        "intention_kernel.turn",
        thread_id=timer.thread_id,
        tenant_id=timer.tenant_id,
        timer_key=timer.key,
        timer_due_at=timer.due_at.isoformat(),
    ) as span:
        done = await _fire_once(kernel, recorder, timer)
        result = done.result
        _tracing.annotate(
            span,
            turn_id=done.turn_id,
            timer_outcome=done.outcome,
            replayed=result.replayed if result is not None else None,
            checkpoint_version=result.checkpoint_version if result is not None else None,
            error=done.error,
        )
    return done


async def _fire_once(kernel: Kernel, recorder: _Recorder, timer: Timer) -> TimerOutcome:
    """Run the occurrence ``timer`` as its turn, settled in that turn's commit."""
    if timer.key.startswith(KERNEL_TIMER_PREFIX):
        return await _fire_kernel_timer(kernel, recorder, timer)
    scope, request = agent_timer_scope(timer)
    thread_id, key, turn_id = timer.thread_id, timer.key, scope.turn_id

    def outcome(
        kind: Outcome, result: TurnResult | None = None, error: str | None = None
    ) -> TimerOutcome:
        return TimerOutcome(thread_id, key, timer.due_at, turn_id, kind, result, error)

    try:
        done, stopped = await kernel._fire_timer(scope, request)
    except TimerSkipped as skip:
        return outcome(skip.outcome)
    except (TurnConflictError, TurnExpiredError, TenantMismatchError) as error:
        # The occurrence can never run: its turn ID is another request's, or the
        # thread is another tenant's. Settled void, so that it is not claimed forever.
        await _settle(recorder, timer, turn_id, kernel, void=True)
        return outcome("void", error=f"{type(error).__name__}: {error}")
    except KernelError as error:
        return _failed(outcome, error)
    if isinstance(done, Queued):
        return outcome("queued")
    if done.replayed:
        await _settle(recorder, timer, turn_id, kernel)
        return outcome(await _stop_of(kernel, thread_id, turn_id) or "replayed", done)
    # Stopped at a safe point, it committed what it did: the outcome says what stopped it.
    return outcome(stopped or "fired", done)


#: Outbox events read at a time while looking for a replayed turn's stop.
_STOP_PAGE = 200


async def _stop_of(kernel: Kernel, thread_id: str, turn_id: str) -> Outcome | None:
    """How the committed turn ``turn_id`` stopped, read from the outbox; ``None`` if it
    ran to its end, or if its events are gone.

    A stopped turn's commit holds one ``turn.cancelled`` event. Its ``reply`` is the
    stop's line, from the agent's replies. An interrupt's line is fixed, a cancel's
    names its reason. So the line tells the two apart. The scan ends at the turn's
    ``turn.committed``: only the thread's earlier events are read. Only a replay
    pays for it, which is rare: a claim that lapsed while the turn ran."""
    read = getattr(kernel.durability, "read_outbox", None)
    if read is None:
        return None
    interrupted = kernel.agent.replies.turn_interrupted()
    after: int | None = None
    while page := await read(thread_id, after, _STOP_PAGE):
        for event in page:
            if event.turn_id != turn_id:
                continue
            if event.type == "turn.committed":
                return None
            if event.type == "turn.cancelled":
                line = event.payload.get("reply") if isinstance(event.payload, dict) else None
                return "interrupted" if line == interrupted else "cancelled"
        if len(page) < _STOP_PAGE:
            return None
        after = page[-1].position
    return None


def _failed(make: Callable[..., TimerOutcome], error: KernelError) -> TimerOutcome:
    failed = make("failed", error=f"{type(error).__name__}: {error}")
    logger.warning(
        "timer %r of thread %r failed: %s: %s",
        failed.key,
        failed.thread_id,
        type(error).__name__,
        error,
        extra={"thread_id": failed.thread_id, "turn_id": failed.turn_id},
    )
    return failed


async def _fire_kernel_timer(kernel: Kernel, recorder: _Recorder, timer: Timer) -> TimerOutcome:
    """Run one of the kernel's own timers: an expiry, a reminder.

    It is a small commit of the kernel. It waits for the thread's lock and never enters
    the inbox."""
    thread_id, key = timer.thread_id, timer.key
    scope, make = _kernel_turn(kernel, timer)
    turn_id, clock = scope.turn_id, kernel.clock

    def outcome(
        kind: Outcome, result: TurnResult | None = None, error: str | None = None
    ) -> TimerOutcome:
        return TimerOutcome(thread_id, key, timer.due_at, turn_id, kind, result, error)

    async def operation(tx: TurnTransaction) -> TurnCommit:
        # Under the thread's lock: every other write of the thread's timers waits for it.
        current = await recorder.read_timer(thread_id, key)
        if current is None or not same_occurrence(current, timer):
            raise _Stale
        now = read_clock(clock)
        commit = await make(tx, current, now)
        if commit is None:
            void = settled(current, turn_id, now, void=True)
            await recorder.write_timers(thread_id, (void,), ())
            raise _Void
        return commit

    try:
        result = await kernel.durability.with_turn(scope, operation)
    except _Stale:
        return outcome("stale")
    except _Void:
        return outcome("void")
    except (TurnConflictError, TurnExpiredError, TenantMismatchError) as error:
        await _settle(recorder, timer, turn_id, kernel, void=True)
        return outcome("void", error=f"{type(error).__name__}: {error}")
    except KernelError as error:
        return _failed(outcome, error)
    if result.replayed:
        await _settle(recorder, timer, turn_id, kernel)
        return outcome("replayed", result)
    return outcome("fired", result)


async def settle_cancelled(kernel: Kernel, thread_id: str, turn_id: str) -> None:
    """Settle the pending timer whose turn ``turn_id`` a cancel took out of the inbox.

    The cancel came before the turn started. No worker fires the timer again. A
    recurring one goes on."""
    if not turn_id.startswith(TIMER_TURN_PREFIX):
        return
    key = turn_id[len(TIMER_TURN_PREFIX) :].rpartition("@")[0]
    recorder = await timer_store(kernel)
    async with recorder.lock(thread_id):
        current = await recorder.read_timer(thread_id, key)
        if current is None or current.status != "pending":
            return
        if timer_turn_id(current.key, current.due_at) != turn_id:
            return  # moved since: the cancelled occurrence is gone already
        write, event = skipped(current, turn_id, read_clock(kernel.clock))
        await recorder.write_timers(thread_id, (write,), (event,))


async def _settle(
    recorder: _Recorder, timer: Timer, turn_id: str, kernel: Kernel, *, void: bool = False
) -> None:
    """Settle the occurrence whose turn committed before (or never can), under the lock,
    if the row still is that occurrence."""
    async with recorder.lock(timer.thread_id):
        current = await recorder.read_timer(timer.thread_id, timer.key)
        if current is None or not same_occurrence(current, timer):
            return
        write = settled(current, turn_id, read_clock(kernel.clock), void=void)
        own = timer.key.startswith(KERNEL_TIMER_PREFIX)
        events: Sequence[Any] = (
            (cancelled_event(timer.key, "its turn cannot run"),) if void and not own else ()
        )
        await recorder.write_timers(timer.thread_id, (write,), events)
