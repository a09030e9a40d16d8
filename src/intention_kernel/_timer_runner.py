"""Firing timers: claim the due ones, run each as a turn, settle it with that turn.

The protocol, for any number of workers in any number of processes:

1. **Claim.** One transaction sets ``claimed_until = now + claim_for`` on up to
   ``limit`` pending timers due at ``now`` whose claim is absent or over
   (``TimerRecorder.claim_timers``). A claim takes no thread lock: it only keeps
   other workers off the timer while this one fires it.
2. **Fire.** For each claimed occurrence, ``with_turn`` under the turn ID
   ``timer:<key>@<due time>`` (:func:`~intention_kernel._timers.timer_turn_id`). That
   waits for the thread's lock like any turn. A committed turn ID is replayed, and
   nothing runs. Otherwise, under the lock, the timer's row is read again: a timer
   moved, cancelled or settled since the claim runs nothing (``stale``). A guard that
   finds the thread past ``unless_version_after`` settles the row ``void``, under the
   lock, and commits no turn. Else the agent's turn runs.
3. **Settle.** The turn's commit carries the row's settlement (``fired``, or the next
   occurrence of a recurring timer), ``timer.fired`` and the turn's own timer writes,
   atomically. A replayed turn (a second claim after a commit whose settlement was
   lost cannot happen, but a key set again at a due time already fired can) settles
   the row under the lock.

A worker killed after its claim leaves the row pending and claimed: once the claim
is over, another worker claims it and runs the same turn ID. A worker killed after
the commit left the row settled. Two workers firing one occurrence at once (a claim
that lapsed while its turn ran) run one turn ID: the turn commits once, the second
replays. So each occurrence commits exactly one turn, and none is lost while some
worker runs.
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
from intention_kernel._ids import check_id
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
    timer_digest,
    timer_turn_id,
)
from intention_kernel.deadlines import read_clock
from intention_kernel.durability import TurnTransaction
from intention_kernel.durability.contract import TimerRecorder, TurnRecorder
from intention_kernel.durability.records import Timer, TimerWrite
from intention_kernel.errors import (
    InvalidRequestError,
    KernelError,
    TenantMismatchError,
    TurnConflictError,
    TurnExpiredError,
)
from intention_kernel.operations import expiry_commit, expiry_scope, reminder_commit
from intention_kernel.runtime import TurnRequest, run_turn
from intention_kernel.turns import TurnCommit, TurnResult, TurnScope

if TYPE_CHECKING:
    from intention_kernel.kernel import Kernel

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
Outcome = Literal["fired", "replayed", "void", "stale", "failed"]


@dataclass(frozen=True, slots=True)
class TimerOutcome:
    """What a worker did with one due timer it claimed.

    ``outcome`` is ``"fired"`` (its turn committed now), ``"replayed"`` (its turn had
    committed already), ``"void"`` (its guard found the thread moved on, or its turn
    can never run), ``"stale"`` (moved or cancelled since the claim: nothing ran) or
    ``"failed"`` (``error`` says why; it is tried again once the claim is over).
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
    # Under the lock: a turn of the thread settles or moves its timers in its commit,
    # and must not overwrite a write made while it ran (nor this one its settlement).
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
            return await _fire(kernel, recorder, timer)

    return list(await asyncio.gather(*(one(t) for t in claimed)))


async def run_timers(
    kernel: Kernel,
    *,
    poll_interval: float = 0.25,
    limit: int = 100,
    claim_for: float = 60.0,
    stop: asyncio.Event | None = None,
) -> None:
    """Fire due timers until ``stop`` is set (or the task is cancelled), polling every
    ``poll_interval`` seconds while nothing is due. A pass that failed is logged and the
    loop goes on: a store that is down for a while must not end it."""
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
    """An ASGI lifespan running :func:`run_timers` for the app's life, if the kernel's
    store keeps timers; stopped (after its pass) when the app shuts down."""

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


#: Makes a timer's commit under the thread's lock: ``(tx, the row, now)`` → the commit,
#: or ``None`` when the occurrence is void (the row is then settled so).
_Make = Callable[[TurnTransaction, Timer, datetime], Awaitable[TurnCommit | None]]


def _agent_turn(kernel: Kernel, timer: Timer) -> tuple[TurnScope, _Make]:
    """An application's timer: a turn of the agent, under its interpreter."""
    turn_id = timer_turn_id(timer.key, timer.due_at)
    scope = TurnScope(timer.thread_id, turn_id, timer.tenant_id, timer_digest(timer))
    request = TurnRequest(None, None, timer=fired_timer(timer))
    compiled, clock = kernel._compiled, kernel.clock

    async def make(tx: TurnTransaction, current: Timer, now: datetime) -> TurnCommit | None:
        version = tx.checkpoint.version if tx.checkpoint is not None else 0
        guard = current.unless_version_after
        if guard is not None and version > guard:
            return None
        commit = await run_turn(compiled, tx, request, clock)
        writes = merge_writes((settled(current, turn_id, now), *commit.timers))
        events = (fired_event(current, turn_id), *commit.events)
        return dataclasses.replace(commit, events=events, timers=writes)

    return scope, make


def _kernel_turn(kernel: Kernel, timer: Timer) -> tuple[TurnScope, _Make]:
    """One of the kernel's timers: a confirmation's expiry (the sweep's turn, under the
    sweep's turn ID, so that the two expire it once between them) or its reminder."""
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
    thread_id, key = timer.thread_id, timer.key
    own = key.startswith(KERNEL_TIMER_PREFIX)
    scope, make = (_kernel_turn if own else _agent_turn)(kernel, timer)
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
            events = () if own else (cancelled_event(key, "the thread moved on"),)
            await recorder.write_timers(thread_id, (void,), events)
            raise _Void
        return commit

    try:
        result = await kernel.durability.with_turn(scope, operation)
    except _Stale:
        return outcome("stale")
    except _Void:
        return outcome("void")
    except (TurnConflictError, TurnExpiredError, TenantMismatchError) as error:
        # The occurrence can never run: its turn ID is another request's, or the
        # thread is another tenant's. Settled void, so that it is not claimed forever.
        await _settle(recorder, timer, turn_id, kernel, void=True)
        return outcome("void", error=f"{type(error).__name__}: {error}")
    except KernelError as error:
        logger.warning(
            "timer %r of thread %r failed: %s: %s",
            key,
            thread_id,
            type(error).__name__,
            error,
            extra={"thread_id": thread_id, "turn_id": turn_id},
        )
        return outcome("failed", error=f"{type(error).__name__}: {error}")
    if result.replayed:
        await _settle(recorder, timer, turn_id, kernel)
        return outcome("replayed", result)
    return outcome("fired", result)


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
