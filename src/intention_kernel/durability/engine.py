"""The engine: the whole :class:`~intention_kernel.durability.Durability` contract,
applied once over a :class:`~intention_kernel.durability.contract.Recorder`.

:class:`RecordedDurability` holds the locking order, replay, request digests, the
receipt state machine (from :mod:`intention_kernel.effects`), fencing and validation of
what is committed. An adapter subclasses it over a recorder that only moves rows in and
out of its store, each method one short transaction. A turn with one write effect
therefore costs three commits and no more.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, Self

from intention_kernel import _faults, _tracing
from intention_kernel._calls import is_async_callable
from intention_kernel._ids import check_id
from intention_kernel._json import describe_error, normalize
from intention_kernel._timers import cancelled_keys, founded_cancels, set_keys
from intention_kernel.checkpoint import KernelCheckpoint, delta_between
from intention_kernel.durability import TurnOperation
from intention_kernel.durability._checkpoints import CheckpointCache, decode
from intention_kernel.durability._diff import Base, checkpoint_rows, delta_problems
from intention_kernel.durability._effect_calls import awaited, call_in_thread, shielded
from intention_kernel.durability._resolution import (
    check_resolution,
    missing_receipt,
    receipt_status,
    resolution_of,
    suggest_keys,
)
from intention_kernel.durability._transaction import Transaction
from intention_kernel.durability.contract import (
    InboxRecorder,
    Recorder,
    StreamRecorder,
    TimerRecorder,
)
from intention_kernel.durability.ownership import owner_of, owns
from intention_kernel.durability.records import (
    InboxEntry,
    PendingInteraction,
    StoredStream,
    StoredTurn,
    ThreadOwner,
    TurnRecord,
)
from intention_kernel.effects import (
    EffectAuthority,
    EffectFn,
    EffectOrigin,
    EffectPlan,
    EffectResult,
    Receipt,
    ReceiptStatus,
    plan_effect,
    settle,
    utcnow,
)
from intention_kernel.errors import (
    EffectNotAppliedError,
    EffectUncertainError,
    EffectValueError,
    InvalidRequestError,
    KernelError,
    ReceiptNotFoundError,
    TenantMismatchError,
    TurnConflictError,
    TurnExpiredError,
)
from intention_kernel.turns import (
    OutboxEvent,
    TurnCommit,
    TurnResult,
    TurnScope,
    decode_result,
    encode_result,
)

__all__ = ["RecordedDurability"]


async def _founded_cancels(recorder: Recorder, thread_id: str, commit: TurnCommit) -> TurnCommit:
    """``commit`` without a ``timer.cancelled`` of a key that had no pending timer: a
    cancel of nothing announces nothing, and leaves a fired timer's row alone. Read
    under the thread's lock, which every write of a thread's timers holds, so the
    answer stands until the commit."""
    keys = cancelled_keys(commit.events) if isinstance(commit, TurnCommit) else set()
    if not keys or not isinstance(recorder, TimerRecorder):
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
        # A receipt's outcome is written even if the turn is cancelled meanwhile: by a
        # task of its own, unless the recorder's writes run to their end anyway (then
        # the task, a round of the event loop, would only cost time per effect).
        finishes = recorder.options.finishes_writes_when_cancelled
        self._settle: Callable[[Any], Awaitable[None]] = awaited if finishes else shielded
        self._index_rows = recorder.options.receipt_index_rows
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
        """Drop this adapter's decoded copy of the thread's checkpoint: an operation
        rewrote it in place at the same version, so the version no longer tells."""
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

        Opening an adapter creates its schema, so a tool that must not create a store
        (the operations commands) asks this first, and a mistyped URL is refused
        instead of shown as an empty store. Raises ``StoreError`` when the store cannot
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
        # The version of the checkpoint held here, read before the lock: if another turn
        # of this process commits meanwhile, the recorder ships the newer checkpoint.
        cached = self._checkpoints.get(scope.thread_id)
        known = cached.checkpoint.version if cached and cached.checkpoint else None
        # ``wait`` goes to the recorder only when it is False: a recorder written before
        # it existed serves every turn that waits, and refuses (TypeError) one that won't.
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
            tx = Transaction(self._run_effect, scope, checkpoint, recorder)
            try:
                commit = await operation(tx)
            except BaseException:
                await tx.settle(cancel=True)
                raise
            await tx.settle(cancel=False)
            commit = await _founded_cancels(recorder, scope.thread_id, commit)
            if tx.refused is not None:
                raise TenantMismatchError(
                    f"turn {scope.turn_id!r} met a receipt of another tenant on thread "
                    f"{scope.thread_id!r}; nothing was committed",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                    key=tx.refused.key,
                ) from tx.refused
            try:
                record, receipts = self._record(scope, expected, commit, base, tx)
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
            self._checkpoints.remember(scope.thread_id, commit.checkpoint, receipts)
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

    def _record(
        self,
        scope: TurnScope,
        expected: int,
        commit: TurnCommit,
        base: Base,
        tx: Transaction,
    ) -> tuple[TurnRecord, Sequence[str] | None]:
        """The record of ``commit``, and the JSON of its core's receipt index entries."""
        if not isinstance(commit, TurnCommit):
            raise KernelError(f"operation must return a TurnCommit, got {type(commit).__name__}")
        result, checkpoint = commit.result, commit.checkpoint
        problems = []
        if (result.thread_id, result.turn_id) != (scope.thread_id, scope.turn_id):
            problems.append("the result names another thread or turn")
        if checkpoint.version != expected + 1:
            problems.append(f"checkpoint version {checkpoint.version} is not {expected + 1}")
        if result.checkpoint_version != checkpoint.version:
            problems.append("result.checkpoint_version differs from the checkpoint's version")
        if result.replayed:
            problems.append("a new result cannot be marked replayed")
        if any(w.thread_id != scope.thread_id for w in commit.timers):
            problems.append("a timer write names another thread")
        delta = commit.delta
        if delta is None:
            delta = delta_between(base.checkpoint, checkpoint)
            if delta_problems(base.checkpoint, checkpoint, delta):
                # A checkpoint whose facts are not keyed by their own key: rows anew.
                base = replace(base, exact=False)
        elif not problems:
            problems.extend(delta_problems(base.checkpoint, checkpoint, delta))
        if problems:
            raise KernelError(
                "refusing to commit an inconsistent turn: " + "; ".join(problems),
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        rows = checkpoint_rows(base, checkpoint, delta, index_rows=self._index_rows)
        announced = tuple(commit.announced)
        # A key this transaction did not meet through run_effect is marked too: only a
        # receipt known to carry this turn ID may rely on the turn row.
        turns, turn_id = tx.receipt_turns, scope.turn_id
        marks = tuple(k for k in announced if turns.get(k) != turn_id) if announced else ()
        record = TurnRecord(
            thread_id=scope.thread_id,
            turn_id=scope.turn_id,
            tenant_id=scope.tenant_id,
            request_digest=scope.request_digest,
            expected_version=expected,
            version=checkpoint.version,
            result=encode_result(result),
            checkpoint=rows.core,
            schema_revision=checkpoint.schema_revision,
            fingerprint=checkpoint.agent_fingerprint,
            events=tuple(commit.events),
            created_at=utcnow(),
            messages=rows.messages,
            keep_messages=rows.keep_messages,
            trim_messages=rows.trim_messages,
            facts=rows.facts,
            removed_facts=rows.removed_facts,
            rewrite=rows.rewrite,
            announced=announced,
            mark_announced=marks,
            journaled=tx.journaled,
            receipt_index=rows.receipt_index,
            moved_index_keys=rows.moved_index_keys,
            trim_index=rows.trim_index,
            timers=tuple(commit.timers),
        )
        return record, rows.receipts

    # -- effects -----------------------------------------------------------------------------

    async def _run_effect(
        self,
        scope: TurnScope,
        key: str,
        fn: EffectFn,
        step_id: str,
        actor: str | None,
        origin: EffectOrigin | None = None,
    ) -> EffectResult[Any]:
        recorder = self._recorder
        now = utcnow()

        def plan(existing: Receipt | None) -> EffectPlan:
            return plan_effect(
                existing,
                thread_id=scope.thread_id,
                key=key,
                turn_id=scope.turn_id,
                step_id=step_id,
                now=now,
                tenant_id=scope.tenant_id,
                actor=actor,
                origin=origin,
            )

        decided = await recorder.claim_effect(scope.thread_id, key, plan)
        if decided.outcome == "replay":
            assert decided.existing is not None
            return EffectResult(decided.existing.value, decided.existing, replayed=True)
        if decided.outcome == "fail_closed":
            receipt = decided.write or decided.existing
            assert receipt is not None
            raise EffectUncertainError(
                f"effect {key!r} on thread {scope.thread_id!r} may already have been applied "
                f"(receipt {receipt.id} is uncertain); it will not be retried until an operator "
                "resolves it",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
                key=key,
                receipt=receipt,
            )
        prepared = decided.write
        assert prepared is not None
        if _faults.armed:
            _faults.reach(_faults.AFTER_RECEIPT_PREPARED)
        authority = EffectAuthority(key, key, prepared.id, prepared.attempt)
        cancelled_after_return = False
        try:
            if is_async_callable(fn):
                value = await fn(authority)
            else:
                value, cancelled_after_return = await call_in_thread(fn, authority)
                if inspect.isawaitable(value):  # a sync function (a lambda) wrapping a coroutine
                    value = await value
        except EffectNotAppliedError as exc:
            failed = settle(prepared, "failed", now=utcnow(), error=describe_error(exc))
            await self._settle(recorder.write_receipt(failed, prepared))
            exc.thread_id, exc.turn_id, exc.key, exc.receipt = (
                scope.thread_id,
                scope.turn_id,
                key,
                failed,
            )
            raise
        except (Exception, asyncio.CancelledError) as exc:
            raise await self._fail_closed(
                scope,
                prepared,
                EffectUncertainError,
                describe_error(exc),
                f"effect {key!r} on thread {scope.thread_id!r} failed with {describe_error(exc)}; "
                "it may have been applied, so it is recorded as uncertain",
            ) from exc
        try:
            stored = normalize(value)
        except (TypeError, ValueError) as exc:
            # The write happened but its value cannot be recorded; replaying it later
            # could not return the same value, so fail closed for an operator.
            raise await self._fail_closed(
                scope,
                prepared,
                EffectValueError,
                f"the provider returned a value that is not JSON-serializable: {exc}",
                f"effect {key!r} returned a value that cannot be stored ({exc}); recorded as "
                "uncertain",
            ) from exc
        completed = settle(prepared, "completed", now=utcnow(), value=stored)
        await self._settle(recorder.write_receipt(completed, prepared))
        if cancelled_after_return:
            raise asyncio.CancelledError  # delivered now that the outcome is recorded
        if _faults.armed:
            _faults.reach(_faults.AFTER_RECEIPT_COMPLETED)
        return EffectResult(stored, completed)

    async def _fail_closed(
        self,
        scope: TurnScope,
        prepared: Receipt,
        kind: type[EffectUncertainError],
        error: str,
        message: str,
    ) -> EffectUncertainError:
        """Settle ``prepared`` as ``uncertain`` with ``error``, then return the ``kind`` of
        error to raise. The write may have happened: the receipt is written before the
        error leaves, so that no later call with the key runs it again."""
        uncertain = settle(prepared, "uncertain", now=utcnow(), error=error)
        await self._settle(self._recorder.write_receipt(uncertain, prepared))
        return kind(
            message,
            thread_id=scope.thread_id,
            turn_id=scope.turn_id,
            key=prepared.key,
            receipt=uncertain,
        )

    # -- the inbox -----------------------------------------------------------------------------

    @property
    def has_inbox(self) -> bool:
        """Whether this adapter's recorder keeps a thread inbox (:class:`InboxRecorder`)."""
        return isinstance(self._recorder, InboxRecorder)

    async def _inbox(self, thread_id: str) -> InboxRecorder:
        recorder = await self._ready()
        check_id("thread_id", thread_id)
        if not isinstance(recorder, InboxRecorder):
            raise InvalidRequestError(
                f"this store's recorder ({type(recorder).__name__}) keeps no thread inbox"
            )
        return recorder

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

        With ``owner``, only for a caller of that tenant: on a thread or a queued turn
        of another tenant it answers ``"not-found"`` and writes nothing, and the
        request stops only a turn of the caller's tenant."""
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
        return isinstance(self._recorder, StreamRecorder)

    async def read_stream(self, thread_id: str, turn_id: str) -> StoredStream:
        """The turn's committed result, if any, and its recorded stream segments."""
        recorder = await self._ready()
        check_id("thread_id", thread_id)
        check_id("turn_id", turn_id)
        if not isinstance(recorder, StreamRecorder):
            raise InvalidRequestError(
                f"this store's recorder ({type(recorder).__name__}) keeps no turn streams"
            )
        return await recorder.read_stream(thread_id, turn_id)

    # -- inspection and operations -----------------------------------------------------------

    async def load_checkpoint(
        self, thread_id: str, *, owner: ThreadOwner | None = None
    ) -> KernelCheckpoint | None:
        """The latest committed checkpoint of a thread, or ``None``.

        With ``owner``, only for a caller of that tenant (``ThreadOwner(None)``: a caller
        without one): a thread it may not see (:func:`owns`) reads as ``None``, exactly
        like a missing one. The owner is judged on the snapshot the checkpoint comes
        from; judged on an earlier read, a first turn of another tenant committing in
        between would be shown to the caller."""
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

        Two reads, so the answer may be older than the caller's next read: a caller
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
        """Up to ``limit`` threads whose latest checkpoint has an active interaction (a
        pending confirmation), in ``thread_id`` order after ``after`` (pass the last one
        to read on). Only the threads of ``owner`` if given: ``ThreadOwner("acme")``,
        or ``ThreadOwner(None)`` for threads without a tenant; ``None`` sees every
        tenant, like every operations method.

        The store selects candidates by text (:data:`INTERACTION_MARKER`) and each is
        decoded here, so the answer is exactly the decoded checkpoints' interactions; a
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

        Like every inspection and operations method, this is operator-level: it sees
        every tenant's receipts unless ``tenant_id`` filters them (on the tenant stored
        with each receipt; ``None`` does not filter).
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
        """Reconcile an uncertain receipt: the write was ``applied`` (later calls return
        ``value``) or not (a later call may retry). Emits ``receipt.resolved``.

        With ``owner``, only for a caller of that tenant (``ThreadOwner(None)``: a caller
        without one): a receipt on a thread it may not act on (:func:`owns`) raises
        ``ReceiptNotFoundError``, exactly like a missing one. The thread's owner is
        judged under the thread's lock, which every turn holds from before its first
        write to its commit, and the receipt's own tenant in the transaction that
        resolves it; judged before the lock, a first turn of another tenant still
        running could make the receipt afterwards and have it resolved.

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
                # Still under the lock, on a thread the caller may act on: only receipts
                # it may see are offered (a receipt's own tenant is the thread's).
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
