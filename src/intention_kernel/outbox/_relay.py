"""The outbox relay: committed events out to a sink, in each thread's order, at least once.

How it works, and why:

- **Publication state lives on the event rows.**
  Those are ``published_at``, ``attempts``, ``last_error`` and ``retry_at``.
  The relay writes them in its own short transactions.
  A relay keeps nothing in memory that a restart would lose.
  It starts again from the first unpublished event of each thread.
- **One relay per thread at a time.** The relay claims a thread before publishing its events.
  The claim is ``OutboxRecorder.claim_outbox``.
  It is an advisory lock on PostgreSQL, and a byte of the lock file on SQLite.
  It never blocks turns, and it is released when the relay dies.
  The claim keeps two relays from interleaving one thread.
  It also keeps a relay from publishing event N+1 before N is acknowledged.
  Relays on one database share the threads between them.
- **In order, acknowledged first.** A claimed thread's unpublished events are read in ``seq`` order.
  They are published one after the other.
  Each is marked published only after the sink acknowledged it.
  The marks of one batch are written in one transaction, before the claim is released.
  A crash between the acknowledgement and the mark republishes the event.
  So delivery is at least once, and sinks dedupe on the event ID.
- **A failing event blocks its thread, not the others.** Its attempts are recorded.
  So are its last error and its next try (exponential backoff with jitter).
  The thread's later events wait behind it, and other threads go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, Self

from intention_kernel import _tracing
from intention_kernel._effects import utcnow
from intention_kernel._json import storable_text
from intention_kernel._turns import OutboxEvent
from intention_kernel.durability._contract.recorders import OutboxRecorder, Recorded
from intention_kernel.durability._contract.records import OutboxBacklog
from intention_kernel.durability._engine.effect_calls import shielded
from intention_kernel.errors import StoreError
from intention_kernel.outbox._sinks import CallableSink, Sink

__all__ = ["OutboxRelay", "RelayReport"]

logger = logging.getLogger("intention_kernel.outbox")

MAX_ERROR_CHARS = 2000
#: The shortest pause of :meth:`OutboxRelay.run` after a store error.
#: ``retry_base`` may be 0 in tests.
#: With this floor, a store that stays down is never polled in a busy loop.
_MIN_STORE_PAUSE = 0.05


@dataclass(frozen=True, slots=True)
class RelayReport:
    """What one pass of the relay did: events acknowledged, attempts that failed."""

    published: int = 0
    failed: int = 0

    def __add__(self, other: RelayReport) -> RelayReport:
        return RelayReport(self.published + other.published, self.failed + other.failed)


class OutboxRelay:
    """Publishes a store's committed outbox events to ``sink``.

    - ``store``: any durability that hands out an
      :class:`~intention_kernel.durability.abc.OutboxRecorder` (every bundled adapter).
    - ``sink``: a :class:`~intention_kernel.outbox.Sink` (``NatsSink``, ``WebhookSink``)
      or a function of the event, sync or async.
    - ``batch_size``: events of one thread read and published per claim.
    - ``threads_per_poll``: due threads looked up at a time.
    - ``concurrency``: threads published at the same time.
      Each holds a claim while it publishes; on PostgreSQL, also a pooled session.
      Claims beyond ``max_pool_size - 1`` wait for a session.
      So any concurrency works with any pool.
    - ``poll_interval``: how long :meth:`run` sleeps when there is nothing to publish.
    - ``retry_base`` / ``retry_max``: backoff of a failing event, in seconds.
      The n-th failure waits ``retry_base * 2**(n-1)``, capped at ``retry_max``.
      A jitter is applied.
      :meth:`run` waits the same way after a store error.

    ``await relay.run_once()`` publishes everything due now; ``await relay.run()``
    keeps doing so until cancelled or ``stop`` is set. The relay closes its sink on
    :meth:`aclose` (it does not close the store).
    """

    def __init__(
        self,
        store: Recorded[OutboxRecorder],
        sink: Sink | Callable[[OutboxEvent], Awaitable[Any] | Any],
        *,
        batch_size: int = 100,
        threads_per_poll: int = 50,
        concurrency: int = 4,
        poll_interval: float = 1.0,
        retry_base: float = 1.0,
        retry_max: float = 300.0,
    ) -> None:
        if min(batch_size, threads_per_poll, concurrency) < 1:
            raise ValueError("batch_size, threads_per_poll and concurrency must be at least 1")
        if poll_interval < 0 or retry_base < 0 or retry_max < 0:
            raise ValueError("poll_interval, retry_base and retry_max must not be negative")
        self.store = store
        self.sink: Sink = sink if isinstance(sink, Sink) else CallableSink(sink)
        self.batch_size = batch_size
        self.threads_per_poll = threads_per_poll
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.retry_base = retry_base
        self.retry_max = retry_max

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the sink; the store stays open (it is the caller's)."""
        await self.sink.aclose()

    async def status(self, failing_limit: int = 20) -> OutboxBacklog:
        """The lag: unpublished events, the oldest one's time, and failing events."""
        recorder = await self.store.recorder()
        return await recorder.outbox_backlog(failing_limit)

    async def run(
        self,
        stop: asyncio.Event | None = None,
        *,
        on_pass: Callable[[RelayReport], object] | None = None,
    ) -> RelayReport:
        """Publish until cancelled or ``stop`` is set, polling when idle; return the total.

        A store error does not end it: the database restarting, say.
        No pooled session in time is another.
        The error is logged at ERROR on ``intention_kernel.outbox``.
        The pass is tried again after the relay's backoff, until a pass succeeds.
        That backoff is ``retry_base``, doubling, capped at ``retry_max``.
        ``on_pass`` is called with the report of each pass that published or failed something.
        """
        stop = stop or asyncio.Event()
        total = RelayReport()
        errors = 0
        while not stop.is_set():
            try:
                report = await self.run_once()
            except StoreError as exc:
                errors += 1
                pause = max(_MIN_STORE_PAUSE, self._backoff(errors))
                logger.error(
                    "outbox relay pass failed (%d in a row); retrying in %.1fs: %s",
                    errors,
                    pause,
                    _describe(exc),
                    extra={"attempts": errors, "retry_in": pause},
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause)
                continue
            if errors:
                logger.warning(
                    "outbox relay recovered after %d failed pass(es)",
                    errors,
                    extra={"attempts": errors},
                )
                errors = 0
            total += report
            if on_pass is not None and (report.published or report.failed):
                on_pass(report)
            if report.published == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_interval)
        return total

    async def run_once(self) -> RelayReport:
        """Publish every event that is due now; return what was published and what failed.

        Threads claimed by another relay are left to it; a thread whose event failed
        waits for its next try.
        """
        recorder = await self.store.recorder()
        total = RelayReport()
        passed: set[str] = set()  # claimed elsewhere, failed, or drained in this pass
        gate = asyncio.Semaphore(self.concurrency)

        async def one(thread_id: str) -> tuple[str, RelayReport, bool]:
            async with gate:
                return thread_id, *await self._relay_thread(recorder, thread_id)

        while True:
            due = await recorder.pending_threads(utcnow(), self.threads_per_poll + len(passed))
            todo = [t for t in due if t not in passed][: self.threads_per_poll]
            if not todo:
                return total
            # A task group, so that a store error in one thread cancels the others.
            # Each of them first marks what its sink acknowledged.
            # Then the pass ends with the error.
            # With gather they would go on publishing behind the caller's back.
            errors: list[BaseException] = []
            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [group.create_task(one(t)) for t in todo]
            except BaseExceptionGroup as failed:
                errors = list(failed.exceptions)
            if errors:
                raise errors[0]  # as itself, with its cause: callers catch StoreError
            for task in tasks:
                thread_id, report, more = task.result()
                total += report
                if not more:
                    passed.add(thread_id)

    async def _relay_thread(
        self, recorder: OutboxRecorder, thread_id: str
    ) -> tuple[RelayReport, bool]:
        """Publish the thread's next batch; return the outcome and whether more may be due."""
        async with recorder.claim_outbox(thread_id) as claimed:
            if not claimed:
                return RelayReport(), False
            pending = await recorder.read_unpublished(thread_id, self.batch_size)
            if not pending or (pending[0].retry_at is not None and pending[0].retry_at > utcnow()):
                return RelayReport(), False  # published or failed by another relay meanwhile
            acked: list[int] = []
            try:
                for delivery in pending:
                    event = delivery.event
                    try:
                        with _tracing.span(
                            "intention_kernel.outbox.publish",
                            thread_id=event.thread_id,
                            event_id=event.id,
                            event_type=event.type,
                            seq=event.seq,
                        ):
                            await self.sink.publish(event)
                    except Exception as exc:
                        await self._failed(recorder, delivery.attempts + 1, event, exc)
                        return RelayReport(len(acked), 1), False
                    acked.append(event.seq)
            finally:
                if acked:
                    # Even if cancelled: these were acknowledged.
                    # The claim is kept until the mark is written.
                    # Released earlier, another relay would read them as unpublished.
                    # It would then publish them again.
                    await shielded(recorder.mark_published(thread_id, acked, utcnow()))
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "published %d event(s) of thread %r",
                    len(acked),
                    thread_id,
                    extra={"thread_id": thread_id},
                )
            return RelayReport(len(acked)), len(pending) == self.batch_size

    def _backoff(self, failures: int) -> float:
        """Seconds before the next try after ``failures`` failures in a row."""
        return min(self.retry_max, self.retry_base * 2.0 ** min(failures - 1, 32))

    async def _failed(
        self, recorder: OutboxRecorder, attempts: int, event: OutboxEvent, exc: Exception
    ) -> None:
        error = _describe(exc)[:MAX_ERROR_CHARS]
        retry_at = utcnow() + timedelta(seconds=self._backoff(attempts) * random.uniform(0.5, 1.0))
        await recorder.mark_failed(event.thread_id, event.seq, attempts, error, retry_at)
        logger.warning(
            "outbox event %s (%s, seq %d of thread %r) failed, attempt %d; next try at %s: %s",
            event.id,
            event.type,
            event.seq,
            event.thread_id,
            attempts,
            retry_at.isoformat(timespec="seconds"),
            error,
            extra={
                "thread_id": event.thread_id,
                "turn_id": event.turn_id,
                "event_id": event.id,
                "event_type": event.type,
                "seq": event.seq,
                "attempts": attempts,
                "retry_at": retry_at,
                "error": error,
            },
        )


def _describe(exc: BaseException) -> str:
    """``Type: message``, storable as text on every store (NUL and lone surrogates
    escaped)."""
    return storable_text(f"{type(exc).__name__}: {exc}")
