"""The engine: the whole :class:`~intention_kernel.durability.Durability` contract,
applied once over a :class:`~intention_kernel.durability._contract.recorders.Recorder`.

:class:`RecordedDurability` holds the locking order, replay, request digests and
fencing. Each turn's effect calls and the validation of its commit are its
``Transaction``'s (``durability/_engine/transaction.py``), one object per turn. An adapter
subclasses it over a recorder that only moves rows in and out of its store, each method
one short transaction. A turn with one write effect therefore costs three commits and no
more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from types import TracebackType
from typing import Any, Self, cast

from intention_kernel import _faults, _tracing
from intention_kernel._checkpoint import KernelCheckpoint
from intention_kernel._effects import (
    Receipt,
    ReceiptStatus,
    utcnow,
)
from intention_kernel._ids import check_id
from intention_kernel._json import describe_error
from intention_kernel._timers import cancelled_keys, founded_cancels, set_keys
from intention_kernel._turns import (
    OutboxEvent,
    TurnCommit,
    TurnResult,
    TurnScope,
    decode_result,
)
from intention_kernel.durability import TurnOperation
from intention_kernel.durability._contract.ownership import owner_of, owns
from intention_kernel.durability._contract.recorders import (
    InboxRecorder,
    Recorder,
    StreamRecorder,
    TimerRecorder,
)
from intention_kernel.durability._contract.records import (
    InboxEntry,
    PendingInteraction,
    StoredStream,
    StoredTurn,
    ThreadOwner,
)
from intention_kernel.durability._engine.checkpoints import CheckpointCache
from intention_kernel.durability._engine.effect_calls import awaited, shielded
from intention_kernel.durability._engine.resolution import (
    check_resolution,
    missing_receipt,
    receipt_status,
    resolution_of,
    suggest_keys,
)
from intention_kernel.durability._engine.transaction import Transaction
from intention_kernel.durability._layout.codec import decode
from intention_kernel.errors import (
    InvalidRequestError,
    KernelError,
    ReceiptNotFoundError,
    TenantMismatchError,
    TurnConflictError,
    TurnExpiredError,
)

__all__ = ["RecordedDurability"]


async def _founded_cancels(recorder: Recorder, thread_id: str, commit: TurnCommit) -> TurnCommit:
    """``commit`` without a ``timer.cancelled`` of a key that had no pending timer.

    A cancel of nothing announces nothing, and leaves a fired timer's row alone. Read
    under the thread's lock, which every write of a thread's timers holds, so the
    answer stands until the commit."""
    if not isinstance(commit, TurnCommit):
        return commit
    for event in commit.events:  # a loop, not a call: most commits cancel no timer
        if event.type == "timer.cancelled":
            break
    else:
        return commit
    keys = cancelled_keys(commit.events)
    # After the loop: ``isinstance`` on a runtime-checkable protocol runs Python.
    if not isinstance(recorder, TimerRecorder):
        return commit
    pending: set[str] = set()
    for key in sorted(keys):
        timer = await recorder.read_timer(thread_id, key)
        if timer is not None and timer.status == "pending":
            pending.add(key)
    events = founded_cancels(commit.events, pending)
    if len(events) == len(commit.events):
        return commit
    # A key the turn neither set nor found pending: its delete would only erase history.
    idle = keys - pending - set_keys(commit.events)
    timers = tuple(w for w in commit.timers if w.timer is not None or w.key not in idle)
    return replace(commit, events=events, timers=timers)


class RecordedDurability:
    """A complete durability adapter over a :class:`Recorder`. Subclassed by each adapter."""

    #: How many threads' latest checkpoints each adapter keeps decoded in memory.
    CHECKPOINT_CACHE_SIZE = 1024

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        # Judged once: an ``isinstance`` against a runtime protocol costs about 30 µs.
        # The inbox's check ran twice a turn, about 6% of a PostgreSQL turn's CPU.
        self._keeps_inbox = isinstance(recorder, InboxRecorder)
        self._keeps_streams = isinstance(recorder, StreamRecorder)
        # A receipt's outcome is written even if the turn is cancelled meanwhile. A task
        # of its own writes it. The exception is a recorder whose writes run to their
        # end anyway. There the task, a round of the event loop, would only cost time
        # per effect.
        finishes = recorder.options.finishes_writes_when_cancelled
        self._settle: Callable[[Any], Awaitable[None]] = awaited if finishes else shielded
        self._options = recorder.options
        self._opened = False
        self._open_lock = asyncio.Lock()
        self._checkpoints = CheckpointCache(self.CHECKPOINT_CACHE_SIZE)

    # -- lifecycle ---------------------------------------------------------------------------

    async def _ready(self) -> Recorder:
        if not self._opened:
            async with self._open_lock:
                if not self._opened:
                    await self._recorder.open()
                    self._opened = True
        return self._recorder

    async def recorder(self) -> Recorder:
        """The opened recorder, for operations that work below the ``Durability`` contract
        (the outbox relay, the deploy check, migrations, retention)."""
        return await self._ready()

    def forget_checkpoint(self, thread_id: str) -> None:
        """Drop this adapter's decoded copy of the thread's checkpoint.

        An operation rewrote it in place at the same version. So the version no longer
        tells the copy is stale."""
        self._checkpoints.forget(thread_id)

    async def __aenter__(self) -> Self:
        await self._ready()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def exists(self) -> bool:
        """Whether the store already holds this adapter's schema; creates nothing.

        Opening an adapter creates its schema. So a tool that must not create a store
        asks this first, as the operations commands do. A mistyped URL is then refused,
        not shown as an empty store. Raises ``StoreError`` when the store cannot
        be reached, ``CorruptStoreError`` when it is damaged."""
        if self._opened:
            return True
        return await self._recorder.exists()

    def missing_store_reason(self) -> str:
        """Why :meth:`exists` said no, in words an operator can act on; adapters say
        where they looked."""
        return "no intention-kernel store at this location"

    async def aclose(self) -> None:
        """Close the recorder once; later calls do nothing."""
        if self._opened:
            self._opened = False
            await self._recorder.close()

    # -- turns -------------------------------------------------------------------------------

    async def with_turn(
        self, scope: TurnScope, operation: TurnOperation, *, wait: bool = True
    ) -> TurnResult:
        """Run the turn under the thread's lock, or replay its commit.

        IDs are checked before the store is touched.
        """
        check_id("thread_id", scope.thread_id)
        check_id("turn_id", scope.turn_id)
        if scope.tenant_id is not None:
            check_id("tenant_id", scope.tenant_id)
        recorder = await self._ready()
        # The version of the checkpoint held here, read before the lock. If another turn
        # of this process commits meanwhile, the recorder ships the newer checkpoint.
        cached = self._checkpoints.get(scope.thread_id)
        known = cached.checkpoint.version if cached and cached.checkpoint else None
        # ``wait`` goes to the recorder only when it is False. A recorder written before
        # it existed serves every turn that waits. It refuses one that won't (TypeError).
        starting = (
            self._recorder.start_turn(scope.thread_id, scope.turn_id, known)
            if wait
            else self._recorder.start_turn(scope.thread_id, scope.turn_id, known, wait=False)
        )
        async with starting as start:
            if _faults.armed:
                _faults.reach(_faults.AFTER_LOCK)
            # A thread belongs to the tenant of its first committed turn, or before that
            # to the tenant of its first receipt. A version-0 row with no receipt only
            # carries operator events and has no owner yet.
            if start.turn is not None:
                owner: ThreadOwner | None = ThreadOwner(
                    start.thread.tenant_id if start.thread else start.thread_tenant_id
                )
            else:
                owner = owner_of(start.thread, start.claimed_by)
            if not owns(owner, scope.tenant_id):
                raise TenantMismatchError(
                    f"thread {scope.thread_id!r} does not belong to tenant {scope.tenant_id!r}",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                )
            if start.turn is not None:
                return self._replay(scope, start.turn)
            thread = start.thread
            base = self._checkpoints.current(scope.thread_id, thread, cached)
            checkpoint = base.checkpoint
            if _faults.armed:
                _faults.reach(_faults.AFTER_CHECKPOINT_LOAD)
            expected = thread.version if thread is not None else 0
            tx = Transaction(scope, checkpoint, recorder, self._settle)
            try:
                commit = await operation(tx)
            except BaseException:
                await tx.settle(cancel=True)
                raise
            await tx.settle(cancel=False)
            commit = await _founded_cancels(recorder, scope.thread_id, commit)
            # The transaction's private fields, read directly: this engine made it, and
            # each of its properties would cost a frame of Python a turn.
            refused = tx._refused
            if refused is not None:
                raise TenantMismatchError(
                    f"turn {scope.turn_id!r} met a receipt of another tenant on thread "
                    f"{scope.thread_id!r}; nothing was committed",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                    key=refused.key,
                ) from refused
            try:
                record = tx.record(commit, expected, base, self._options)
            except ValueError as exc:  # pydantic's serialization errors included
                raise KernelError(
                    f"refusing to commit turn {scope.turn_id!r}: its result or checkpoint "
                    f"cannot be stored: {describe_error(exc)}",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                ) from exc
            if _faults.armed:
                _faults.reach(_faults.BEFORE_COMMIT)
            if not _tracing.enabled():
                await recorder.commit_turn(record)
            else:
                with _tracing.span(
                    "intention_kernel.commit",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                    version=record.version,
                    events=len(record.events),
                ):
                    await recorder.commit_turn(record)
            if _faults.armed:
                _faults.reach(_faults.AFTER_COMMIT)
            self._checkpoints.remember(scope.thread_id, commit.checkpoint, record.rows)
            return commit.result

    def _replay(self, scope: TurnScope, stored: StoredTurn) -> TurnResult:
        if (
            scope.request_digest is not None
            and stored.request_digest is not None
            and scope.request_digest != stored.request_digest
        ):
            raise TurnConflictError(
                f"turn {scope.turn_id!r} of thread {scope.thread_id!r} was already committed "
                "for a different request; use a new turn ID for a new request",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        if stored.expired:
            raise TurnExpiredError(
                f"turn {scope.turn_id!r} of thread {scope.thread_id!r} was committed, and its "
                "result has since been pruned; it is not run again",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        return decode_result(stored.result, replayed=True, thread_id=scope.thread_id)

    # -- the inbox -----------------------------------------------------------------------------

    @property
    def has_inbox(self) -> bool:
        """Whether this adapter's recorder keeps a thread inbox (:class:`InboxRecorder`)."""
        return self._keeps_inbox

    async def _inbox(self, thread_id: str) -> InboxRecorder:
        recorder = await self._ready()
        check_id("thread_id", thread_id)
        if not self._keeps_inbox:
            raise InvalidRequestError(
                f"this store's recorder ({type(recorder).__name__}) keeps no thread inbox"
            )
        return cast(InboxRecorder, recorder)

    async def enqueue(self, entry: InboxEntry) -> int | None:
        """Accept ``entry`` into its thread's inbox: its 1-based position, or ``None``
        when its turn is already committed (see :meth:`InboxRecorder.enqueue`)."""
        inbox = await self._inbox(entry.thread_id)
        check_id("turn_id", entry.turn_id)
        if entry.tenant_id is not None:
            check_id("tenant_id", entry.tenant_id)
        return await inbox.enqueue(entry)

    async def read_inbox(self, thread_id: str) -> list[InboxEntry]:
        """The thread's inbox, in the order its entries were accepted."""
        return await (await self._inbox(thread_id)).read_inbox(thread_id)

    async def taker(self, thread_id: str, turn_id: str) -> str | None:
        """The turn that took the steer of ``turn_id``, whose result it replays."""
        inbox = await self._inbox(thread_id)
        return await inbox.taker(thread_id, check_id("turn_id", turn_id))

    async def take_steers(self, thread_id: str, turn_id: str) -> list[InboxEntry]:
        """Take the thread's untaken steers for ``turn_id``; all it took
        (see :meth:`InboxRecorder.take_steers`)."""
        inbox = await self._inbox(thread_id)
        return await inbox.take_steers(thread_id, check_id("turn_id", turn_id))

    async def release_steer(self, thread_id: str, turn_id: str, taken_by: str) -> bool:
        """Put the steer of ``turn_id`` back in the inbox, unless ``taken_by`` committed
        (see :meth:`InboxRecorder.release_steer`)."""
        inbox = await self._inbox(thread_id)
        return await inbox.release_steer(
            thread_id, check_id("turn_id", turn_id), check_id("turn_id", taken_by)
        )

    async def remove_inbox(self, thread_id: str, turn_id: str) -> bool:
        """Delete the inbox entry of ``turn_id``; whether there was one."""
        inbox = await self._inbox(thread_id)
        return await inbox.remove_inbox(thread_id, check_id("turn_id", turn_id))

    async def request_cancel(
        self,
        thread_id: str,
        turn_id: str,
        reason: str | None,
        *,
        owner: ThreadOwner | None = None,
    ) -> str:
        """Ask turn ``turn_id`` to stop (see :meth:`InboxRecorder.request_cancel`).

        With ``owner``, only for a caller of that tenant. On a thread or a queued turn
        of another tenant it answers ``"not-found"`` and writes nothing. The request
        stops only a turn of the caller's tenant."""
        inbox = await self._inbox(thread_id)
        check_id("turn_id", turn_id)
        if owner is not None and owner.tenant_id is not None:
            check_id("tenant_id", owner.tenant_id)
        if owner is None:  # a recorder written before ``owner`` existed still serves
            return await inbox.request_cancel(thread_id, turn_id, reason, utcnow())
        return await inbox.request_cancel(thread_id, turn_id, reason, utcnow(), owner)

    async def thread_version(self, thread_id: str) -> int:
        """The thread's committed version (0 before its first committed turn)."""
        return await (await self._inbox(thread_id)).thread_version(thread_id)

    async def request_interrupt(
        self, thread_id: str, base_version: int, turn_id: str, tenant_id: str | None
    ) -> None:
        """Ask the turn that commits on top of ``base_version`` to stop, for the
        queued message ``turn_id`` of ``tenant_id``
        (see :meth:`InboxRecorder.request_interrupt`)."""
        inbox = await self._inbox(thread_id)
        await inbox.request_interrupt(thread_id, base_version, utcnow(), turn_id, tenant_id)

    async def start_queued(
        self, thread_id: str, turn_id: str, base_version: int, tenant_id: str | None = None
    ) -> tuple[str | None, str | None]:
        """A queued turn starts: its entry is marked, and its stop read
        (see :meth:`InboxRecorder.start_queued`)."""
        inbox = await self._inbox(thread_id)
        return await inbox.start_queued(thread_id, turn_id, base_version, tenant_id)

    async def read_cancel(
        self, thread_id: str, turn_id: str, base_version: int, tenant_id: str | None = None
    ) -> tuple[str | None, str | None]:
        """Whether the turn of ``tenant_id`` was asked to stop
        (see :meth:`InboxRecorder.read_cancel`)."""
        inbox = await self._inbox(thread_id)
        return await inbox.read_cancel(thread_id, turn_id, base_version, tenant_id)

    # -- turn streams ------------------------------------------------------------------------

    @property
    def has_streams(self) -> bool:
        """Whether this adapter's recorder keeps turn streams (:class:`StreamRecorder`)."""
        return self._keeps_streams

    async def read_stream(self, thread_id: str, turn_id: str) -> StoredStream:
        """The turn's committed result, if any, and its recorded stream segments."""
        recorder = await self._ready()
        check_id("thread_id", thread_id)
        check_id("turn_id", turn_id)
        if not self._keeps_streams:
            raise InvalidRequestError(
                f"this store's recorder ({type(recorder).__name__}) keeps no turn streams"
            )
        return await cast(StreamRecorder, recorder).read_stream(thread_id, turn_id)

    # -- inspection and operations -----------------------------------------------------------

    async def load_checkpoint(
        self, thread_id: str, *, owner: ThreadOwner | None = None
    ) -> KernelCheckpoint | None:
        """The latest committed checkpoint of a thread, or ``None``.

        With ``owner``, only for a caller of that tenant (``ThreadOwner(None)``: a caller
        without one). A thread it may not see (:func:`owns`) reads as ``None``, exactly
        like a missing one. The owner is judged on the snapshot the checkpoint comes
        from. Judged on an earlier read, it could miss a first turn of another tenant
        committing in between. That turn would be shown to the caller."""
        recorder = await self._ready()
        thread = await recorder.read_thread(check_id("thread_id", thread_id))
        if thread is None or thread.checkpoint is None:
            return None
        if owner is not None and not owns(owner_of(thread, None), owner.tenant_id):
            return None
        return decode(thread_id, thread)[0]

    async def thread_owner(self, thread_id: str) -> ThreadOwner | None:
        """The owner of a thread (a :class:`ThreadOwner`), or ``None`` while nothing
        durable was written on it (the first turn of any tenant claims it).

        Two reads, so the answer may be older than the caller's next read. A caller
        that then reads or acts on the thread decides with ``owner=`` instead
        (:meth:`load_checkpoint`, :meth:`resolve_receipt`)."""
        recorder = await self._ready()
        return await self._owner(recorder, check_id("thread_id", thread_id))

    @staticmethod
    async def _owner(recorder: Recorder, thread_id: str) -> ThreadOwner | None:
        thread = await recorder.read_thread(thread_id)
        if thread is not None and thread.version:
            return owner_of(thread, None)
        # No committed turn: the thread's earliest receipt, if any, claimed it.
        receipts = await recorder.read_receipts(thread_id, None)
        return owner_of(thread, ThreadOwner(receipts[0].tenant_id) if receipts else None)

    async def pending_interactions(
        self, *, owner: ThreadOwner | None = None, after: str | None = None, limit: int = 100
    ) -> list[PendingInteraction]:
        """Up to ``limit`` threads whose latest checkpoint has an active interaction.

        An active interaction is a pending confirmation. Threads come in ``thread_id``
        order after ``after``; pass the last one to read on. Given ``owner``, only its
        threads: ``ThreadOwner("acme")``, or ``ThreadOwner(None)`` for threads without a
        tenant. ``None`` sees every tenant, like every operations method.

        The store selects candidates by text (:data:`INTERACTION_MARKER`). Each is
        decoded here. So the answer is exactly the decoded checkpoints' interactions. A
        candidate that is corrupt raises ``CorruptRecordError`` naming its thread. The
        cost grows with the number of threads (each core is searched, none parsed): an
        operator's query, not a turn's."""
        recorder = await self._ready()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidRequestError(f"limit must be a positive integer, got {limit!r}")
        if after is not None:
            check_id("thread_id", after)
        if owner is not None and owner.tenant_id is not None:
            check_id("tenant_id", owner.tenant_id)
        found: list[PendingInteraction] = []
        cursor = after
        while len(found) < limit:
            wanted = limit - len(found)
            page = await recorder.read_interactions(cursor, wanted, owner)
            for thread_id, thread in page:
                checkpoint = decode(thread_id, thread)[0]
                if checkpoint.interaction is not None:  # not a nested "interaction" key
                    found.append(
                        PendingInteraction(
                            thread_id, thread.tenant_id, checkpoint.version, checkpoint.interaction
                        )
                    )
            if len(page) < wanted:
                break
            cursor = page[-1][0]
        return found

    async def list_receipts(
        self,
        thread_id: str | None = None,
        status: ReceiptStatus | str | None = None,
        *,
        tenant_id: str | None = None,
    ) -> list[Receipt]:
        """The current receipt per ``(thread_id, key)``, oldest first.

        Like every inspection and operations method, this is operator-level. It sees
        every tenant's receipts unless ``tenant_id`` filters them. The filter reads the
        tenant stored with each receipt; ``None`` does not filter.
        """
        recorder = await self._ready()
        if thread_id is not None:
            check_id("thread_id", thread_id)
        wanted = receipt_status(status) if status is not None else None
        if tenant_id is None:
            return await recorder.read_receipts(thread_id, wanted)
        return await recorder.read_receipts(thread_id, wanted, check_id("tenant_id", tenant_id))

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
        """Reconcile an uncertain receipt. Emits ``receipt.resolved``.

        Either the write was ``applied``: later calls return ``value``. Or it was not: a
        later call may retry.

        With ``owner``, only for a caller of that tenant (``ThreadOwner(None)``: a caller
        without one). A receipt on a thread it may not act on (:func:`owns`) raises
        ``ReceiptNotFoundError``, exactly like a missing one. The thread's owner is
        judged under the thread's lock. Every turn holds that lock from before its first
        write to its commit. The receipt's own tenant is judged in the transaction that
        resolves it. Judged before the lock, the check could miss a first turn of another
        tenant still running. That turn could make the receipt afterwards and have it
        resolved.

        A malformed request (a ``value`` that is not JSON, such as NaN or infinity) is
        refused with ``InvalidRequestError`` before anything is read or written."""
        recorder = await self._ready()
        check_id("thread_id", thread_id)
        stored_value = check_resolution(key, applied, value, note, actor)
        if owner is not None and owner.tenant_id is not None:
            check_id("tenant_id", owner.tenant_id)

        resolution = resolution_of(
            thread_id,
            key,
            applied=applied,
            value=stored_value,
            note=note,
            actor=actor,
            owner=owner,
            attempt_may_run=recorder.options.attempts_outlive_lock,
        )
        async with recorder.lock(thread_id):
            if owner is not None and not owns(
                await self._owner(recorder, thread_id), owner.tenant_id
            ):
                raise missing_receipt(thread_id, key)
            try:
                return await recorder.resolve_receipt(thread_id, key, resolution)
            except ReceiptNotFoundError:
                # Still under the lock, on a thread the caller may act on. Only receipts
                # it may see are offered: a receipt's own tenant is the thread's.
                receipts = await recorder.read_receipts(thread_id, None)
                visible = [
                    r.key
                    for r in receipts
                    if owner is None or owns(ThreadOwner(r.tenant_id), owner.tenant_id)
                ]
                raise missing_receipt(thread_id, key, suggest_keys(key, visible)) from None

    async def read_outbox(
        self, thread_id: str | None = None, after: int | None = None, limit: int = 100
    ) -> list[OutboxEvent]:
        """Committed events in ``position`` order, after the given position."""
        recorder = await self._ready()
        if limit < 1:
            raise InvalidRequestError(f"limit must be at least 1, got {limit!r}")
        return await recorder.read_outbox(thread_id, after, limit)
