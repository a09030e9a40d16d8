"""The storage contract, in small parts, documented here and nowhere else.

A **recorder** is the I/O an adapter provides to the engine
(:class:`~intention_kernel.durability._engine.recorded.RecordedDurability`), in five parts:

- :class:`TurnRecorder`: open the store, lock a thread, read a turn's start, commit it.
- :class:`EffectRecorder`: claim an effect, settle its receipt, list and resolve receipts.
- :class:`JournalRecorder`: the journal, what a turn recorded before its commit (each
  model round's response), read and written under the thread's lock.
- :class:`OutboxRecorder`: read the outbox, claim a thread for a relay, mark events.
- :class:`MaintenanceRecorder`: scan and rewrite checkpoints, prune old rows.

:class:`Recorder` is all five, and what the engine takes. Every method is one short
transaction (or none). Conflicts are errors: ``write_receipt``, ``commit_turn`` and
``rewrite_checkpoint`` compare-and-set and raise rather than silently skip. A turn costs:

- one read: the prior result and the thread row.
- one write per effect state change: ``prepared`` before the provider call, the
  outcome after it.
- one commit: result, checkpoint and events.

A turn that records values adds one read of its journal. It adds one write per value
it records. (That is ``tx.recorded``: an interpreter that works in rounds.) A turn that
records none touches the journal not at all.

The **outer ring** takes the durability-level Protocols at the end of this module.
That ring is the outbox relay, :mod:`intention_kernel.operations`, the HTTP host and
the CLI. Each Protocol names only what its user needs. Every ``RecordedDurability``
satisfies them all. So does a third-party durability that offers the same methods.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, TypeVar, runtime_checkable

from intention_kernel._checkpoint import KernelCheckpoint
from intention_kernel._effects import EffectPlan, Receipt, ReceiptStatus
from intention_kernel._turns import EventDraft, OutboxEvent
from intention_kernel.durability import Durability
from intention_kernel.durability._contract.records import (
    CheckpointRewrite,
    InboxEntry,
    JournalEntry,
    OutboxBacklog,
    OutboxDelivery,
    PendingInteraction,
    StoredStream,
    StoredThread,
    ThreadOwner,
    Timer,
    TimerWrite,
    TurnRecord,
    TurnStart,
)
from intention_kernel.errors import ThreadBusyError

__all__ = [
    "EffectRecorder",
    "InboxRecorder",
    "Expirable",
    "InteractionQueue",
    "JournalRecorder",
    "MaintenanceRecorder",
    "Migratable",
    "MigrationRecorder",
    "Operable",
    "OutboxRecorder",
    "PlanFn",
    "Recorded",
    "Recorder",
    "RecorderOptions",
    "ResolutionFn",
    "StreamRecorder",
    "TenantStore",
    "TimerRecorder",
    "TurnLock",
    "TurnRecorder",
    "lock_and_begin",
    "replay_or_lock_and_begin",
]

#: Decides a resolution from the current receipt: the new receipt and its event.
ResolutionFn = Callable[[Receipt | None], tuple[Receipt, EventDraft]]
#: Decides what an effect call does from the receipt stored under its key.
PlanFn = Callable[[Receipt | None], EffectPlan]
#: A store's thread lock for one turn, ``(thread_id, turn_id, wait)``, as ``lock`` waits.
#: It marks the turn as the thread's holder while held (``_deliveries``).
TurnLock = Callable[[str, str, bool], AbstractAsyncContextManager[object]]


def lock_and_begin(
    recorder: TurnRecorder,
    thread_id: str,
    turn_id: str,
    known_version: int | None,
    *,
    wait: bool = True,
) -> AbstractAsyncContextManager[TurnStart]:
    """A turn's start as ``TurnRecorder.start_turn`` does it by default: the lock, then
    ``begin_turn``, and the lock held for the block. ``wait=False`` is passed on to
    ``lock`` only when given, so that a recorder written before it existed still serves
    every turn that waits."""
    return _LockAndBegin(recorder, thread_id, turn_id, known_version, wait)


def replay_or_lock_and_begin(
    recorder: TurnRecorder,
    committed: Callable[[], Awaitable[TurnStart | None]],
    thread_id: str,
    turn_id: str,
    known_version: int | None,
    *,
    wait: bool = True,
    lock: TurnLock | None = None,
) -> AbstractAsyncContextManager[TurnStart]:
    """A turn's start that answers a committed turn without the thread's lock.

    It is a ``start_turn`` for a recorder whose ``lock`` takes ``wait``. It matters
    when another turn holds the lock.

    It first tries the lock without waiting, then ``begin_turn``: a free thread costs
    nothing more than :func:`lock_and_begin`. On a busy thread it awaits ``committed()``,
    the turn's ``TurnStart`` if it was committed (read in one snapshot), else ``None``.
    A committed turn is yielded with no lock held. A replay writes nothing. So it need
    not wait for the running turn, nor be refused with ``wait=False``. Otherwise it
    waits for the lock as :func:`lock_and_begin` does, or raises ``ThreadBusyError``
    with ``wait=False``. ``begin_turn`` reads the turn again under the lock: the turn
    may commit while this one waits, and is then replayed, not run twice.

    ``lock``, when given, takes the thread's lock in place of ``recorder.lock``. A
    local store passes one that also marks which turn holds the thread
    (``_deliveries``). One context manager then does both, at the cost of one."""
    return _LockAndBegin(recorder, thread_id, turn_id, known_version, wait, committed, lock)


class _LockAndBegin:
    """The context manager of :func:`lock_and_begin` and :func:`replay_or_lock_and_begin`.

    It is a class, not a generator, because every turn enters one. An
    ``asynccontextmanager`` costs several frames more per turn. ``committed`` is
    ``None`` for ``lock_and_begin``: the first attempt then waits if ``wait`` says so.
    Given, the first attempt never waits, and a busy thread asks ``committed`` first."""

    __slots__ = (
        "_committed",
        "_held",
        "_known_version",
        "_recorder",
        "_thread_id",
        "_turn_id",
        "_turn_lock",
        "_wait",
    )

    def __init__(
        self,
        recorder: TurnRecorder,
        thread_id: str,
        turn_id: str,
        known_version: int | None,
        wait: bool,
        committed: Callable[[], Awaitable[TurnStart | None]] | None = None,
        turn_lock: TurnLock | None = None,
    ) -> None:
        self._recorder = recorder
        self._turn_lock = turn_lock
        self._thread_id = thread_id
        self._turn_id = turn_id
        self._known_version = known_version
        self._wait = wait
        self._committed = committed
        # The thread's lock while the block runs; ``None`` for a replay without it.
        self._held: AbstractAsyncContextManager[object] | None = None

    async def __aenter__(self) -> TurnStart:
        recorder, thread_id, committed = self._recorder, self._thread_id, self._committed
        turn_lock = self._turn_lock
        # ``wait`` is passed to ``lock`` only as ``False``. A recorder written before
        # it existed then still serves every turn that waits.
        if turn_lock is not None:
            lock = turn_lock(thread_id, self._turn_id, self._wait and committed is None)
        elif self._wait and committed is None:
            lock = recorder.lock(thread_id)
        else:
            lock = recorder.lock(thread_id, wait=False)
        busy: ThreadBusyError | None = None
        try:
            await lock.__aenter__()
        except ThreadBusyError as exc:
            if committed is None:
                raise
            busy = exc
        if busy is not None:
            # Out of the ``except`` block: a later error does not chain onto the refusal.
            assert committed is not None
            replay = await committed()
            if replay is not None:
                return replay  # no lock held: ``__aexit__`` has nothing to release
            if not self._wait:
                raise busy
            if turn_lock is not None:
                lock = turn_lock(thread_id, self._turn_id, True)
            else:
                lock = recorder.lock(thread_id)
            await lock.__aenter__()
        try:
            start = await recorder.begin_turn(thread_id, self._turn_id, self._known_version)
        except BaseException as exc:
            # The read failed: the lock is let go with its error, as the block's end would.
            if await lock.__aexit__(type(exc), exc, exc.__traceback__):
                raise RuntimeError("the thread's lock swallowed begin_turn's error") from exc
            raise
        self._held = lock
        return start

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        held, self._held = self._held, None
        if held is None:  # a replay, answered without the lock
            assert self._committed is not None, "lock_and_begin exited without being entered"
            return None
        return await held.__aexit__(exc_type, exc, tb)


@dataclass(frozen=True, slots=True)
class RecorderOptions:
    """What a :class:`Recorder` declares about itself, in its ``options`` attribute.

    ``finishes_writes_when_cancelled``: ``write_receipt`` always runs to its end, even
    when the calling task is cancelled. It never suspends, or it waits for its own hop
    before letting the cancellation through. Without it, each outcome write runs in a
    task of its own. So a cancelled turn cannot leave a receipt ``prepared``.

    ``attempts_outlive_lock``: the thread lock can be lost while the process that took
    it lives on. An example is a database session that dies while the turn's provider
    call still runs. A ``prepared`` receipt found under the lock may then belong to a live
    attempt, and is not resolvable as not applied
    (:func:`~intention_kernel._effects.resolve`). A recorder for which this is true and
    that does not say so lets an operator mark a running write as not applied.

    ``receipt_index_rows``: the store keeps each entry of a checkpoint's receipt index
    in a row of its own, as it keeps messages and facts. Its cores then leave the index
    out (``TurnRecord.receipt_index``). So a turn rewrites one small thread row and an
    entry or two, not the whole index. ``begin_turn`` and ``read_thread`` return the
    rows in ``StoredThread.receipt_index``.
    """

    finishes_writes_when_cancelled: bool = False
    attempts_outlive_lock: bool = False
    receipt_index_rows: bool = False


class TurnRecorder(Protocol):
    """Turns: the store's lifecycle, the thread lock, a turn's start and its commit.

    ``start_turn`` has a default: it takes ``lock`` and then calls ``begin_turn``
    (:func:`replay_or_lock_and_begin`). A recorder that subclasses this Protocol
    inherits it. One that does not must declare it. A recorder may override it to do both in fewer
    round trips. Either way, a committed turn must be answered without waiting for the
    lock while another turn holds the thread (a replay writes nothing).
    """

    def start_turn(
        self, thread_id: str, turn_id: str, known_version: int | None, *, wait: bool = True
    ) -> AbstractAsyncContextManager[TurnStart]:
        """Hold the thread's lock for the block and yield what ``begin_turn`` reads;
        ``wait`` as for ``lock``. A committed turn may come without the lock, and must
        when another turn holds the thread.

        The default reads a busy thread's committed turn with ``begin_turn``, without
        the lock, and uses that read only if it found the turn."""

        async def committed() -> TurnStart | None:
            start = await self.begin_turn(thread_id, turn_id, known_version)
            return start if start.turn is not None else None

        return replay_or_lock_and_begin(
            self, committed, thread_id, turn_id, known_version, wait=wait
        )

    async def open(self) -> None:
        """Connect and create or migrate the schema. Called once, before anything else."""

    async def close(self) -> None:
        """Close the recorder's connections. Called once, after everything else."""
        ...

    async def exists(self) -> bool:
        """Whether the store already holds this recorder's schema, without creating
        anything; callable before ``open``. Raises ``StoreError`` when the store cannot
        be reached."""
        ...

    def lock(self, thread_id: str, *, wait: bool = True) -> AbstractAsyncContextManager[object]:
        """Hold the thread's exclusive lock for the duration of the block.

        It must exclude every other holder in every process sharing the store. It
        must be released if the holder dies. It must not hold a database write
        transaction open while held. Raises ``ThreadBusyError`` after the
        adapter's configured wait; with ``wait=False``, after one attempt (at once,
        when another holder has it: ``Agent(on_busy="reject")``). The default
        ``start_turn`` first tries it with ``wait=False``, to answer a replay on a
        busy thread.
        """
        ...

    async def begin_turn(
        self, thread_id: str, turn_id: str, known_version: int | None
    ) -> TurnStart:
        """Read the committed turn ``(thread_id, turn_id)``; only if absent, the thread row
        with its message and fact rows (one consistent snapshot).

        When the thread's version equals ``known_version``, the caller already holds
        that checkpoint. The recorder should then leave ``StoredThread.checkpoint`` as
        ``None``, and read no message or fact rows.
        """
        ...

    async def commit_turn(self, record: TurnRecord) -> None:
        """Insert the turn, compare-and-set the thread version, apply the checkpoint's
        difference (a :class:`TurnRecord`) and append the events, atomically. Raise
        ``FencedCommitError`` if the version moved."""
        ...

    async def read_thread(self, thread_id: str) -> StoredThread | None:
        """The thread row with its message and fact rows, from one consistent snapshot."""
        ...


class EffectRecorder(Protocol):
    """Effects: a receipt per ``(thread_id, key)``, claimed before the provider call and
    settled after it; listed and resolved by an operator."""

    async def claim_effect(self, thread_id: str, key: str, plan: PlanFn) -> EffectPlan:
        """In one transaction: read the receipt, ``plan`` it, persist ``plan.write`` if any.

        ``plan`` is pure. So a recorder may first try ``plan(None).write`` as an insert
        that does nothing if a receipt exists. It reads and plans only then.
        """
        ...

    async def write_receipt(self, receipt: Receipt, expected: Receipt) -> None:
        """Replace ``expected`` by ``receipt`` if the stored one is still ``expected``
        (same status and attempt); otherwise raise ``FencedCommitError``."""
        ...

    async def read_receipts(
        self, thread_id: str | None, status: ReceiptStatus | None, tenant_id: str | None = None
    ) -> list[Receipt]:
        """The current receipts, oldest first, filtered by each argument that is not
        ``None`` (``tenant_id`` on the receipt's own tenant column)."""
        ...

    async def resolve_receipt(self, thread_id: str, key: str, resolution: ResolutionFn) -> Receipt:
        """In one transaction: read the receipt, apply ``resolution`` (which raises for
        a bad state), write the receipt and append the returned event."""
        ...


class JournalRecorder(Protocol):
    """The journal: values a turn records before it commits.

    There is one :class:`JournalEntry` per ``(thread_id, turn_id, key)``. A delivery of
    the same turn ID after a crash reads them instead of computing them again. The runtime
    records each model round's response in it before any step of that round runs.

    Both methods are called under the thread's lock, by the turn that owns the entries.
    Each entry keeps its ``tenant_id``. On a thread with no committed turn, a recorder
    reports the tenant of the earliest entry as ``TurnStart.claimed_by`` when the thread
    has no receipt.
    An entry lives until the turn commits. ``commit_turn`` deletes the turn's entries in
    its own transaction when ``TurnRecord.journaled`` is set. For a turn that never
    commits, it lives until retention deletes all of the turn's entries at once
    (``prune_journal``).
    """

    async def read_journal(self, thread_id: str, turn_id: str) -> list[JournalEntry]:
        """Every entry of the turn, in the order they were written (one read, no
        transaction needed: under the lock nobody else writes them)."""
        ...

    async def write_journal(self, entry: JournalEntry) -> None:
        """Insert ``entry`` in its own short transaction, durable when this returns.
        An entry with the same ``(thread_id, turn_id, key)`` is a conflict. Raise
        ``FencedCommitError`` then, and keep the stored entry. Under the lock nobody
        else writes entries, so one being there means the lock was lost."""
        ...


class OutboxRecorder(Protocol):
    """The outbox: committed events read in order, and their publication by a relay.

    Publication state lives on each event row: ``published_at``, ``attempts``,
    ``last_error``, ``retry_at``. A thread's events are published in ``seq`` order by one
    relay at a time; a thread's first unpublished event blocks the ones after it.
    """

    async def read_outbox(
        self, thread_id: str | None, after: int | None, limit: int
    ) -> list[OutboxEvent]:
        """Events in ``seq`` order after ``after``, at most ``limit``.

        ``thread_id`` keeps one thread's events; ``None`` reads them all.
        """
        ...

    def claim_outbox(self, thread_id: str) -> AbstractAsyncContextManager[bool]:
        """Try, without waiting, to become the only relay publishing ``thread_id``; the
        block receives whether it did. Excludes relays in every process sharing the
        store (never turns), and is released if the holder dies."""
        ...

    async def pending_threads(self, now: datetime, limit: int) -> list[str]:
        """Up to ``limit`` threads whose first unpublished event is due (its ``retry_at``
        unset or not after ``now``), the oldest such event first."""
        ...

    async def read_unpublished(self, thread_id: str, limit: int) -> list[OutboxDelivery]:
        """The thread's first ``limit`` unpublished events, in ``seq`` order.

        They are a prefix of what is left to publish. An event is listed only after
        every earlier one."""
        ...

    async def mark_published(self, thread_id: str, seqs: Sequence[int], at: datetime) -> None:
        """Record that the sink acknowledged these events of the thread."""
        ...

    async def mark_failed(
        self, thread_id: str, seq: int, attempts: int, error: str, retry_at: datetime
    ) -> None:
        """Record a failed attempt: set ``attempts`` (an absolute count, so that a repeated
        write is harmless), ``last_error`` and ``retry_at``."""
        ...

    async def outbox_backlog(self, failing_limit: int) -> OutboxBacklog:
        """What is left to publish, with up to ``failing_limit`` failing threads."""
        ...


class MaintenanceRecorder(Protocol):
    """Maintenance: the deploy check and migrations scan and rewrite stored checkpoints,
    the host lists pending interactions, retention prunes old rows."""

    async def scan_threads(
        self, after: str | None, limit: int, below_revision: int | None
    ) -> list[tuple[str, StoredThread]]:
        """Up to ``limit`` threads with a checkpoint, in ``thread_id`` order after
        ``after``, with their rows.

        Given ``below_revision``, only those whose stored schema revision is below it.
        Each thread is one consistent snapshot."""
        ...

    async def read_interactions(
        self, after: str | None, limit: int, owner: ThreadOwner | None
    ) -> list[tuple[str, StoredThread]]:
        """Up to ``limit`` threads whose committed checkpoint's core contains
        ``INTERACTION_MARKER``.

        They come in ``thread_id`` order after ``after``. Given ``owner``, only threads
        it owns (``ThreadOwner(None)``: threads without a tenant). Each comes with its
        core only, no message or fact rows. Every thread with an active interaction
        is among them; a few without may be too (the caller decodes each)."""
        ...

    async def rewrite_checkpoint(self, rewrite: CheckpointRewrite) -> None:
        """Replace the thread's checkpoint and all its rows if its version is still
        ``rewrite.version``; otherwise raise ``FencedCommitError``. Called under the
        thread's lock, in one short transaction."""
        ...

    async def prune_events(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` published events created before ``before`` (on a store
        that numbers positions late, only numbered ones); return how many."""
        ...

    async def prune_turns(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> tuple[int, tuple[str, str] | None]:
        """Drop the result of up to ``limit`` turns created before ``before``.

        The turns are the first after ``after`` in key order that still hold a result.
        Each turn keeps its key and request digest. Return how many were dropped, and
        the last key dropped (``None`` when fewer than ``limit`` were left). Turns
        pruned before are not read again."""
        ...

    async def stale_journals(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> list[tuple[str, str]]:
        """Up to ``limit`` turns whose journal entries were all written before ``before``.

        Each is a ``(thread_id, turn_id)``, in key order after ``after``. These are
        turns that never committed: a commit deletes its own entries."""
        ...

    async def prune_journal(self, thread_id: str, turn_id: str, before: datetime) -> int:
        """Delete every journal entry of the turn, in one statement, if each was written
        before ``before``; otherwise delete none. Return how many were deleted. Called
        under the thread's lock, so no turn writes the journal meanwhile."""
        ...


class Recorder(
    TurnRecorder, EffectRecorder, JournalRecorder, OutboxRecorder, MaintenanceRecorder, Protocol
):
    """Every part of a recorder: what the engine takes.

    Two members have defaults, inherited by a recorder that subclasses this Protocol
    (``class MyRecorder(Recorder): ...``), and declared by one that does not:

    - ``options``, a :class:`RecorderOptions` (the default declares nothing).
    - ``start_turn``, documented on :class:`TurnRecorder`.
    """

    #: The recorder's declared options, read once by the engine.
    options: RecorderOptions = RecorderOptions()


@runtime_checkable
class InboxRecorder(Protocol):
    """A thread's inbox: messages accepted while a turn ran, to run after it.

    Each method is one short transaction, taken without the thread's lock: a message
    is accepted while another turn holds it. The inbox only orders and keeps the
    messages. What keeps a queued turn from running twice is the turn's own unique
    ``(thread_id, turn_id)``: an entry whose turn committed is replayed, never rerun.
    """

    async def enqueue(self, entry: InboxEntry) -> int | None:
        """Accept ``entry`` and return its 1-based position among the thread's entries.

        ``None``: its turn is already committed, and nothing was written. An entry
        already there under the turn ID keeps its place, and its position is returned;
        with another ``request_digest`` it raises ``TurnConflictError`` instead."""
        ...

    async def read_inbox(self, thread_id: str) -> list[InboxEntry]:
        """The thread's entries that wait to run, in the order they were accepted
        (a steer a turn took is not one: see :meth:`taker`)."""
        ...

    async def taker(self, thread_id: str, turn_id: str) -> str | None:
        """The turn that took the steer entry of ``turn_id``, or ``None``."""
        ...

    async def remove_inbox(self, thread_id: str, turn_id: str) -> bool:
        """Delete the entry of ``turn_id``; whether there was one."""
        ...

    async def take_steers(self, thread_id: str, turn_id: str) -> list[InboxEntry]:
        """Take the thread's untaken steer entries for ``turn_id``, in one transaction.

        Every steer entry of the thread that no turn took is marked as taken by
        ``turn_id``. ``turn_id``'s own entry is left out: a redelivery queued behind a
        dead worker's lease. Return all that ``turn_id`` took, in order of acceptance.
        It is called at a round boundary of that turn, under the thread's lock. So a
        repeat after a crash returns those taken before and any new ones."""
        ...

    async def release_steer(self, thread_id: str, turn_id: str, taken_by: str) -> bool:
        """Put the steer entry of ``turn_id``, taken by ``taken_by``, back in the inbox
        (untaken), unless ``taken_by`` committed; whether it did. Called under the
        thread's lock, so ``taken_by`` is not running. The caller read the journal of
        ``taken_by`` first: it did not record the steer, so its model never saw it.
        A store with leases does it only while the caller's lease holds."""
        ...

    async def request_cancel(
        self,
        thread_id: str,
        turn_id: str,
        reason: str | None,
        at: datetime,
        owner: ThreadOwner | None = None,
    ) -> str:
        """Ask turn ``turn_id`` to stop, in one transaction; what was found:

        - ``"committed"``: the turn is committed, and nothing was written.
        - ``"dequeued"``: its inbox entry, not started (:meth:`start_queued`), was
          deleted, and the request recorded: it will not run. Never while another
          delivery of the turn holds the thread, in any process: its entry then
          stays, and the answer is ``"requested"`` (``_deliveries``).
        - ``"requested"``: the request is recorded, for the turn to read at its next
          safe point. A request already recorded keeps its first reason.
        - ``"not-found"`` (only with ``owner``): the thread's committed turns or the
          turn's inbox entry are another tenant's, and nothing was written.

        With ``owner``, the request is stored under its tenant
        (:func:`~intention_kernel.durability._contract.ownership.cancel_scope`). It stops only a
        turn of that tenant. Without, it stops the turn whatever its tenant."""
        ...

    async def thread_version(self, thread_id: str) -> int:
        """The thread's committed version (0 for a thread with no committed turn)."""
        ...

    async def request_interrupt(
        self, thread_id: str, base_version: int, at: datetime, turn_id: str, tenant_id: str | None
    ) -> None:
        """Ask the turn that commits on top of checkpoint ``base_version`` to stop: the
        message of ``turn_id``, just queued, interrupts it (``on_busy="interrupt"``).

        One row per sender, keyed by its turn ID and its tenant's scope
        (:func:`~intention_kernel.durability._contract.ownership.cancel_scope`). It keeps the
        seq of the sender's inbox entry; with no entry (it ran already) nothing is
        written. The request never stops the sender's own turn, nor a queued turn
        accepted after it, nor a turn of another tenant."""
        ...

    async def start_queued(
        self, thread_id: str, turn_id: str, base_version: int, tenant_id: str | None = None
    ) -> tuple[str | None, str | None]:
        """A queued turn starts, under the thread's lock. In one transaction: mark its
        inbox entry started, then answer as :meth:`read_cancel`. A cancel after this
        keeps the entry and answers ``"requested"``: the turn runs and stops.

        An entry started before, by a process that died, answers ``(None, None)``. The
        turn runs again, reads its stop at its next safe point, and commits."""
        ...

    async def read_cancel(
        self, thread_id: str, turn_id: str, base_version: int, tenant_id: str | None = None
    ) -> tuple[str | None, str | None]:
        """Whether the turn was asked to stop, in one read.

        - ``("cancel", reason)``: a request names ``turn_id``. It was stored for any
          tenant or for ``tenant_id``, the turn's.
        - ``("interrupt", None)``: an interrupt on its ``base_version`` from another
          sender of its tenant. It was accepted after the turn's own inbox entry, if it
          has one.
        - ``(None, None)``: neither.

        A cancel wins over an interrupt."""
        ...


@runtime_checkable
class StreamRecorder(Protocol):
    """Turn streams: the events of a streamed turn, kept by round for its watchers.

    ``write_journal`` stores an entry's ``stream`` in the same transaction as the entry,
    and keeps it after the turn's commit deletes the entry. Any process reads it
    without the thread's lock (:mod:`intention_kernel.turn_streams`).
    """

    async def read_stream(self, thread_id: str, turn_id: str) -> StoredStream:
        """The committed turn, if it is, then the turn's stream segments in order.

        The turn is read first: once it is committed, no segment is written after."""
        ...


@runtime_checkable
class TimerRecorder(Protocol):
    """A thread's timers: turns the kernel runs later (:mod:`intention_kernel._timers`).

    One row per ``(thread_id, key)`` (a :class:`Timer`). A turn writes its thread's rows
    in its commit (``TurnRecord.timers``); outside a turn they are written only under
    the thread's lock (``write_timers``). Workers claim due rows without the lock: a
    claim only sets ``claimed_until``, so that one worker at a time fires a timer. What
    keeps a timer from firing twice is its turn's unique ``(thread_id, turn_id)``, and
    the commit of that turn settling the row.
    """

    async def write_timers(
        self, thread_id: str, writes: Sequence[TimerWrite], events: Sequence[EventDraft]
    ) -> None:
        """Apply ``writes`` and append ``events`` (no turn) in one transaction. Called
        under the thread's lock; a store with leases refuses it without the lease."""
        ...

    async def read_timer(self, thread_id: str, key: str) -> Timer | None:
        """The thread's timer ``key``, whatever its status, or ``None``."""
        ...

    async def read_timers(
        self, thread_id: str | None, status: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[Timer]:
        """Up to ``limit`` timers in ``(thread_id, key)`` order after ``after``, of one
        thread and one status when given."""
        ...

    async def claim_timers(self, now: datetime, until: datetime, limit: int) -> list[Timer]:
        """Claim up to ``limit`` pending timers due at ``now``, earliest due first.

        A timer's earlier claim, if any, must have ended by ``now``. All are claimed in
        one transaction: each gets ``claimed_until = until``. Two workers claiming at
        once never get the same row."""
        ...

    async def prune_timers(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` timers fired or void that were settled before
        ``before``; return how many."""
        ...


class MigrationRecorder(TurnRecorder, MaintenanceRecorder, Protocol):
    """What a checkpoint migration uses.

    - the turns' lock and ``read_thread``.
    - maintenance's scan and rewrite.
    - ``options``: whether the receipt index is rows.
    """

    options: RecorderOptions


# -- what the outer ring takes ------------------------------------------------------------

_R_co = TypeVar("_R_co", covariant=True)


class Recorded(Protocol[_R_co]):
    """A durability that hands out its opened recorder, typed by the part a caller uses.

    The relay uses ``Recorded[OutboxRecorder]``. The deploy check and retention use
    ``Recorded[MaintenanceRecorder]``."""

    async def recorder(self) -> _R_co:
        """The recorder, opened; the same one the durability's turns use."""
        ...


class Migratable(Protocol):
    """What a checkpoint migration needs from a durability."""

    async def recorder(self) -> MigrationRecorder:
        """The opened recorder, typed for the migration's reads and rewrites."""
        ...

    def forget_checkpoint(self, thread_id: str) -> None:
        """Drop any decoded copy of the thread's checkpoint held in memory.

        A migration rewrote it in place at the same version. So the version no longer
        tells the copy is stale."""
        ...


class Expirable(Durability, Protocol):
    """What the expiry sweep needs from a durability: turns, and the interaction scan."""

    async def recorder(self) -> MaintenanceRecorder:
        """The opened recorder, typed for the sweep's interaction scan."""
        ...


@runtime_checkable
class TenantStore(Protocol):
    """What tenant isolation (the HTTP host with tokens) needs from a durability.

    It needs the owner of a thread. It needs reads and resolutions judged for an owner
    by the store. With ``owner``, a thread the owner may not act on (``owns``) reads as
    missing. ``load_checkpoint`` answers ``None``, and ``resolve_receipt`` raises
    ``ReceiptNotFoundError``. Each is judged on the snapshot it reads or under the
    thread's lock, never on an earlier read.
    """

    async def thread_owner(self, thread_id: str) -> ThreadOwner | None:
        """Who owns the thread, or ``None`` while nobody has claimed it."""
        ...

    async def load_checkpoint(
        self, thread_id: str, *, owner: ThreadOwner | None = None
    ) -> KernelCheckpoint | None:
        """The thread's checkpoint; ``None`` when missing or not ``owner``'s."""
        ...

    async def resolve_receipt(
        self,
        thread_id: str,
        key: str,
        *,
        applied: bool,
        value: Any = None,
        note: str | None = None,
        actor: str | None = None,
        owner: ThreadOwner | None = None,
    ) -> Receipt:
        """Settle an ``uncertain`` receipt, judged for ``owner`` under the lock.

        A receipt on a thread ``owner`` may not act on is not found.
        """
        ...


@runtime_checkable
class InteractionQueue(Protocol):
    """What the queue of pending interactions (``GET /v1/interactions``) needs from a
    durability."""

    async def pending_interactions(
        self, *, owner: ThreadOwner | None = None, after: str | None = None, limit: int = 100
    ) -> list[PendingInteraction]:
        """Open interactions, oldest first, after the cursor ``after``.

        With ``owner``, only those on threads the owner may act on.
        """
        ...


@runtime_checkable
class Operable(Durability, Migratable, Protocol):
    """What the operations commands need from a durability: its whole recorder, and
    whether its store exists before anything is created."""

    async def exists(self) -> bool:
        """Whether the store already holds the adapter's schema; creates nothing."""
        ...

    def missing_store_reason(self) -> str:
        """Why :meth:`exists` said no, naming where the adapter looked."""
        ...

    async def recorder(self) -> Recorder:
        """The whole opened recorder, for the operations commands."""
        ...
