"""In-memory durability: a real adapter whose state lives only in this process.

For application tests, evaluations and examples. It enforces the same invariants
and raises the same errors as the SQL adapters. It stores results and checkpoints as
the same JSON text, so a test exercises the same codecs. But nothing survives the
process: production needs a durable adapter.

Serialization is one :class:`asyncio.Lock` per thread, which is enough because
the state is not shared with any other process.
"""

from __future__ import annotations

import bisect
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime

from intention_kernel._effects import EffectPlan, Receipt, ReceiptStatus, utcnow
from intention_kernel._turns import EventDraft, OutboxEvent
from intention_kernel.durability import _check_seconds
from intention_kernel.durability._contract.ownership import ANY_TENANT, cancel_scope, owns
from intention_kernel.durability._contract.recorders import replay_or_lock_and_begin
from intention_kernel.durability._engine.deliveries import Deliveries
from intention_kernel.durability._engine.looplocks import LoopLocks
from intention_kernel.durability._layout.rows import inbox_conflict, journal_conflict
from intention_kernel.durability.abc import (
    INTERACTION_MARKER,
    CheckpointRewrite,
    InboxEntry,
    InboxRecorder,
    JournalEntry,
    OutboxBacklog,
    OutboxDelivery,
    PlanFn,
    RecordedDurability,
    Recorder,
    RecorderOptions,
    ResolutionFn,
    StoredStream,
    StoredThread,
    StoredTurn,
    StreamRecorder,
    ThreadOwner,
    Timer,
    TimerRecorder,
    TimerWrite,
    TurnRecord,
    TurnStart,
)
from intention_kernel.errors import FencedCommitError

__all__ = ["InMemoryDurability", "MemoryTamper"]


@dataclass
class _Thread:
    version: int = 0
    tenant_id: str | None = None
    checkpoint: str | None = None
    next_seq: int = 1
    messages: list[str] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)
    schema_revision: int | None = None


@dataclass
class _Delivery:
    """An event's publication state (see ``Recorder.claim_outbox``)."""

    published_at: datetime | None = None
    attempts: int = 0
    last_error: str | None = None
    retry_at: datetime | None = None


@dataclass
class _State:
    threads: dict[str, _Thread] = field(default_factory=dict)
    turns: dict[tuple[str, str], StoredTurn] = field(default_factory=dict)
    turn_times: dict[tuple[str, str], datetime] = field(default_factory=dict)
    receipts: dict[tuple[str, str], Receipt] = field(default_factory=dict)
    # The tenant of each thread's first receipt (``TurnStart.claimed_by``), so that a
    # turn's start need not scan every receipt.
    claims: dict[str, ThreadOwner] = field(default_factory=dict)
    outbox: list[OutboxEvent] = field(default_factory=list)  # in position order
    # By event ID, once the relay recorded something about it (absent: never tried).
    deliveries: dict[str, _Delivery] = field(default_factory=dict)
    last_position: int = 0
    locks: LoopLocks = field(default_factory=LoopLocks)
    relayed: set[str] = field(default_factory=set)  # threads claimed by a relay
    # The journal, per (thread, turn), by key in write order.
    journal: dict[tuple[str, str], dict[str, JournalEntry]] = field(default_factory=dict)
    # Streamed turns' events by (thread, turn), by segment (``StreamRecorder``).
    streams: dict[tuple[str, str], dict[int, str]] = field(default_factory=dict)
    # Each thread's inbox, in acceptance order, and the last number given to an entry.
    inbox: dict[str, list[InboxEntry]] = field(default_factory=dict)
    inbox_seq: int = 0
    started: set[tuple[str, str]] = field(default_factory=set)  # entries whose turn began
    # The stop requests (``Kernel.cancel``), by (thread, turn, scope): the reason given.
    cancels: dict[tuple[str, str, str], str | None] = field(default_factory=dict)
    # The interrupts, by (thread, base version, asker's turn, scope): the asker's entry seq.
    interrupts: dict[tuple[str, int, str, str], int] = field(default_factory=dict)
    # The timers, by (thread, key).
    timers: dict[tuple[str, str], Timer] = field(default_factory=dict)
    # The turns whose delivery holds the thread (``_deliveries``), by (thread, turn).
    holders: Deliveries = field(default_factory=Deliveries)


class _MemoryRecorder(Recorder, InboxRecorder, StreamRecorder, TimerRecorder):
    #: ``write_receipt`` never suspends, so no cancellation can interrupt it.
    options = RecorderOptions(finishes_writes_when_cancelled=True, attempts_outlive_lock=False)

    def __init__(self, lock_timeout: float) -> None:
        self._state = _State()
        self._lock_timeout = lock_timeout

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def exists(self) -> bool:
        return True  # the store is this object: it exists once built

    def start_turn(
        self, thread_id: str, turn_id: str, known_version: int | None, *, wait: bool = True
    ) -> AbstractAsyncContextManager[TurnStart]:
        """The default start, with the turn marked for a cancel (``_deliveries``)."""

        async def committed() -> TurnStart | None:
            start = await self.begin_turn(thread_id, turn_id, known_version)
            return start if start.turn is not None else None

        return replay_or_lock_and_begin(
            self, committed, thread_id, turn_id, known_version, wait=wait, lock=self._turn_lock
        )

    @asynccontextmanager
    async def lock(self, thread_id: str, *, wait: bool = True) -> AsyncIterator[object]:
        async with self._state.locks.hold(thread_id, self._lock_timeout, wait=wait) as lock:
            yield lock

    @asynccontextmanager
    async def _turn_lock(self, thread_id: str, turn_id: str, wait: bool) -> AsyncIterator[object]:
        """The thread's lock, with the turn counted as its holder while held."""
        key, marks = (thread_id, turn_id), self._state.holders
        async with self._state.locks.hold(thread_id, self._lock_timeout, wait=wait) as lock:
            marks.take(key)
            try:
                yield lock
            finally:
                marks.give(key)

    async def begin_turn(
        self, thread_id: str, turn_id: str, known_version: int | None
    ) -> TurnStart:
        thread = self._state.threads.get(thread_id)
        stored = self._state.turns.get((thread_id, turn_id))
        if stored is not None:
            return TurnStart(stored, None, thread.tenant_id if thread else None)
        if thread is not None and thread.version == known_version:
            return TurnStart(None, StoredThread(thread.version, thread.tenant_id, None))
        claimed = None if thread and thread.version else self._claim(thread_id)
        return TurnStart(None, self._snapshot(thread), claimed_by=claimed)

    def _claim(self, thread_id: str) -> ThreadOwner | None:
        """The tenant of the thread's first receipt or, if none, of its first journal
        entry still stored (the SQL stores read the same from their rows)."""
        state = self._state
        claimed = state.claims.get(thread_id)
        if claimed is not None:
            return claimed
        for (thread, _), entries in state.journal.items():  # only turns never committed
            if thread == thread_id and entries:
                first = next(iter(entries.values()))
                return ThreadOwner(first.tenant_id)
        return None

    async def read_thread(self, thread_id: str) -> StoredThread | None:
        return self._snapshot(self._state.threads.get(thread_id))

    @staticmethod
    def _snapshot(thread: _Thread | None) -> StoredThread | None:
        if thread is None:
            return None
        return StoredThread(
            thread.version,
            thread.tenant_id,
            thread.checkpoint,
            tuple(thread.messages),
            tuple(thread.facts.items()),
        )

    async def claim_effect(self, thread_id: str, key: str, plan: PlanFn) -> EffectPlan:
        decided = plan(self._state.receipts.get((thread_id, key)))
        if decided.write is not None:
            self._state.receipts[(thread_id, key)] = decided.write
            self._state.claims.setdefault(thread_id, ThreadOwner(decided.write.tenant_id))
        return decided

    async def write_receipt(self, receipt: Receipt, expected: Receipt) -> None:
        current = self._state.receipts.get((receipt.thread_id, receipt.key))
        if current is None or (current.status, current.attempt) != (
            expected.status,
            expected.attempt,
        ):
            raise FencedCommitError(
                f"receipt {receipt.key!r} changed while its effect ran",
                thread_id=receipt.thread_id,
                key=receipt.key,
                receipt=current,
            )
        self._state.receipts[(receipt.thread_id, receipt.key)] = receipt

    async def read_journal(self, thread_id: str, turn_id: str) -> list[JournalEntry]:
        return list(self._state.journal.get((thread_id, turn_id), {}).values())

    async def write_journal(self, entry: JournalEntry) -> None:
        entries = self._state.journal.setdefault((entry.thread_id, entry.turn_id), {})
        if entry.key in entries:
            raise journal_conflict(entry)
        entries[entry.key] = entry
        if entry.stream is not None:
            segments = self._state.streams.setdefault((entry.thread_id, entry.turn_id), {})
            segments[entry.stream[0]] = entry.stream[1]

    async def read_stream(self, thread_id: str, turn_id: str) -> StoredStream:
        turn = self._state.turns.get((thread_id, turn_id))
        segments = self._state.streams.get((thread_id, turn_id), {})
        return StoredStream(turn, tuple(sorted(segments.items())))

    # -- the inbox -----------------------------------------------------------------------------

    async def enqueue(self, entry: InboxEntry) -> int | None:
        state = self._state
        if (entry.thread_id, entry.turn_id) in state.turns:
            return None
        entries = state.inbox.setdefault(entry.thread_id, [])
        waiting = [e for e in entries if e.taken_by is None]
        for queued in entries:
            if queued.turn_id == entry.turn_id:
                if (
                    entry.request_digest is not None
                    and queued.request_digest is not None
                    and entry.request_digest != queued.request_digest
                ):
                    raise inbox_conflict(entry)
                return sum(1 for e in waiting if e.seq <= queued.seq)
        state.inbox_seq += 1
        entries.append(replace(entry, seq=state.inbox_seq))
        return len(waiting) + 1

    async def read_inbox(self, thread_id: str) -> list[InboxEntry]:
        return [e for e in self._state.inbox.get(thread_id, ()) if e.taken_by is None]

    async def taker(self, thread_id: str, turn_id: str) -> str | None:
        for entry in self._state.inbox.get(thread_id, ()):
            if entry.turn_id == turn_id:
                return entry.taken_by
        return None

    async def take_steers(self, thread_id: str, turn_id: str) -> list[InboxEntry]:
        entries = self._state.inbox.get(thread_id, [])
        entries[:] = [
            replace(e, taken_by=turn_id)
            if e.steer and e.taken_by is None and e.turn_id != turn_id
            else e
            for e in entries
        ]
        return [e for e in entries if e.taken_by == turn_id]

    async def release_steer(self, thread_id: str, turn_id: str, taken_by: str) -> bool:
        entries = self._state.inbox.get(thread_id, [])
        for index, entry in enumerate(entries):
            if entry.turn_id == turn_id and entry.taken_by == taken_by:
                if (thread_id, taken_by) in self._state.turns:
                    return False  # committed: the steer is that turn's
                entries[index] = replace(entry, taken_by=None)
                return True
        return False

    async def remove_inbox(self, thread_id: str, turn_id: str) -> bool:
        entries = self._state.inbox.get(thread_id, [])
        kept = [e for e in entries if e.turn_id != turn_id]
        if kept:
            self._state.inbox[thread_id] = kept
        else:
            self._state.inbox.pop(thread_id, None)
        self._state.started.discard((thread_id, turn_id))
        return len(kept) != len(entries)

    async def request_cancel(
        self,
        thread_id: str,
        turn_id: str,
        reason: str | None,
        at: datetime,
        owner: ThreadOwner | None = None,
    ) -> str:
        state = self._state
        if owner is not None:
            thread = state.threads.get(thread_id)
            found = ThreadOwner(thread.tenant_id) if thread and thread.version else None
            if not owns(found or self._claim(thread_id), owner.tenant_id):
                return "not-found"
        if (thread_id, turn_id) in state.turns:
            return "committed"
        if owner is not None:
            for queued in state.inbox.get(thread_id, ()):
                if queued.turn_id == turn_id and queued.tenant_id != owner.tenant_id:
                    return "not-found"
        scope = ANY_TENANT if owner is None else cancel_scope(owner.tenant_id)
        state.cancels.setdefault((thread_id, turn_id, scope), reason)
        if (thread_id, turn_id) in state.started:  # running from the inbox: it stops
            return "requested"
        if (thread_id, turn_id) in state.holders:  # its queued copy replays its commit
            return "requested"
        return "dequeued" if await self.remove_inbox(thread_id, turn_id) else "requested"

    async def start_queued(
        self, thread_id: str, turn_id: str, base_version: int, tenant_id: str | None = None
    ) -> tuple[str | None, str | None]:
        key = (thread_id, turn_id)
        if key in self._state.started:  # started before, by a process that died
            return None, None
        if any(e.turn_id == turn_id for e in self._state.inbox.get(thread_id, ())):
            self._state.started.add(key)
        return await self.read_cancel(thread_id, turn_id, base_version, tenant_id)

    async def thread_version(self, thread_id: str) -> int:
        thread = self._state.threads.get(thread_id)
        return thread.version if thread is not None else 0

    async def request_interrupt(
        self,
        thread_id: str,
        base_version: int,
        at: datetime,
        turn_id: str,
        tenant_id: str | None,
    ) -> None:
        state = self._state
        for entry in state.inbox.get(thread_id, ()):
            if entry.turn_id == turn_id:  # no entry: the asker ran already, nothing to stop
                key = (thread_id, base_version, turn_id, cancel_scope(tenant_id))
                state.interrupts.setdefault(key, entry.seq)

    async def read_cancel(
        self, thread_id: str, turn_id: str, base_version: int, tenant_id: str | None = None
    ) -> tuple[str | None, str | None]:
        state = self._state
        for scope in (ANY_TENANT, cancel_scope(tenant_id)):
            if (thread_id, turn_id, scope) in state.cancels:
                return "cancel", state.cancels[(thread_id, turn_id, scope)]
        # A turn is stopped by another sender's message, accepted after its own entry.
        mine = next((e.seq for e in state.inbox.get(thread_id, ()) if e.turn_id == turn_id), 0)
        scopes = (ANY_TENANT, cancel_scope(tenant_id))
        for (thread, base, asker, scope), seq in state.interrupts.items():
            here = (thread, base) == (thread_id, base_version)
            if here and asker != turn_id and scope in scopes and seq > mine:
                return "interrupt", None
        return None, None

    async def commit_turn(self, record: TurnRecord) -> None:
        state = self._state
        thread = state.threads.get(record.thread_id)
        current = thread.version if thread else 0
        if current != record.expected_version or (record.thread_id, record.turn_id) in state.turns:
            raise FencedCommitError(
                f"thread {record.thread_id!r} moved to version {current} while turn "
                f"{record.turn_id!r} ran; nothing was committed",
                thread_id=record.thread_id,
                turn_id=record.turn_id,
            )
        if thread is None:
            thread = state.threads[record.thread_id] = _Thread(tenant_id=record.tenant_id)
        # Everything below is plain assignment with no await: atomic for this process.
        state.turns[(record.thread_id, record.turn_id)] = StoredTurn(
            record.request_digest, record.result
        )
        state.turn_times[(record.thread_id, record.turn_id)] = record.created_at
        thread.version = record.version
        rows = record.rows
        thread.checkpoint = rows.core
        thread.schema_revision = record.schema_revision
        thread.tenant_id = record.tenant_id
        if rows.rewrite:
            thread.messages.clear()
            thread.facts.clear()
        thread.messages.extend(rows.messages)
        if rows.trim_messages or rows.rewrite:
            del thread.messages[: max(len(thread.messages) - rows.keep_messages, 0)]
        thread.facts.update(rows.facts)
        for key in rows.removed_facts:
            thread.facts.pop(key, None)
        for key in record.announced:
            receipt = state.receipts.get((record.thread_id, key))
            if receipt is not None and receipt.status is ReceiptStatus.COMPLETED:
                state.receipts[(record.thread_id, key)] = replace(receipt, announced=True)
        self._append(record.thread_id, record.turn_id, record.events)
        if record.journaled:
            state.journal.pop((record.thread_id, record.turn_id), None)
        self._write_timers(record.timers)

    # -- timers --------------------------------------------------------------------------------

    def _write_timers(self, writes: Sequence[TimerWrite]) -> None:
        timers = self._state.timers
        for write in writes:
            if write.timer is None:
                timers.pop((write.thread_id, write.key), None)
            else:
                timers[(write.thread_id, write.key)] = replace(write.timer, claimed_until=None)

    async def write_timers(
        self, thread_id: str, writes: Sequence[TimerWrite], events: Sequence[EventDraft]
    ) -> None:
        self._write_timers(writes)
        if events:
            self._append(thread_id, None, events)

    async def read_timer(self, thread_id: str, key: str) -> Timer | None:
        return self._state.timers.get((thread_id, key))

    async def read_timers(
        self, thread_id: str | None, status: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[Timer]:
        keys = sorted(
            k
            for k, t in self._state.timers.items()
            if (thread_id is None or k[0] == thread_id)
            and (status is None or t.status == status)
            and (after is None or k > after)
        )
        return [self._state.timers[k] for k in keys[:limit]]

    async def claim_timers(self, now: datetime, until: datetime, limit: int) -> list[Timer]:
        timers = self._state.timers
        due = sorted(
            (t for t in timers.values() if t.status == "pending" and t.due_at <= now),
            key=lambda t: (t.due_at, t.thread_id, t.key),
        )
        claimed: list[Timer] = []
        for timer in due:
            if timer.claimed_until is not None and timer.claimed_until > now:
                continue
            timer = timers[(timer.thread_id, timer.key)] = replace(timer, claimed_until=until)
            claimed.append(timer)
            if len(claimed) >= limit:
                break
        return claimed

    async def prune_timers(self, before: datetime, limit: int) -> int:
        timers = self._state.timers
        doomed = [
            k
            for k, t in timers.items()
            if t.status != "pending" and t.settled_at is not None and t.settled_at < before
        ][:limit]
        for key in doomed:
            del timers[key]
        return len(doomed)

    def _append(self, thread_id: str, turn_id: str | None, events: Sequence[EventDraft]) -> None:
        state = self._state
        thread = state.threads.setdefault(thread_id, _Thread())
        now = utcnow()
        for draft in events:
            state.last_position += 1
            state.outbox.append(
                OutboxEvent(
                    id=draft.id,
                    position=state.last_position,
                    thread_id=thread_id,
                    turn_id=turn_id,
                    seq=thread.next_seq,
                    type=draft.type,
                    payload=draft.payload,
                    created_at=now,
                )
            )
            thread.next_seq += 1

    async def read_receipts(
        self, thread_id: str | None, status: ReceiptStatus | None, tenant_id: str | None = None
    ) -> list[Receipt]:
        found = [
            r
            for r in self._state.receipts.values()
            if (thread_id is None or r.thread_id == thread_id)
            and (status is None or r.status is status)
            and (tenant_id is None or r.tenant_id == tenant_id)
        ]
        return sorted(found, key=lambda r: (r.created_at or utcnow(), r.id))

    async def resolve_receipt(self, thread_id: str, key: str, resolution: ResolutionFn) -> Receipt:
        resolved, event = resolution(self._state.receipts.get((thread_id, key)))
        self._state.receipts[(thread_id, key)] = resolved
        self._append(thread_id, None, [event])
        return resolved

    async def read_outbox(
        self, thread_id: str | None, after: int | None, limit: int
    ) -> list[OutboxEvent]:
        outbox = self._state.outbox
        start = bisect.bisect_right(outbox, after or 0, key=lambda e: e.position)
        selected = (e for e in outbox[start:] if thread_id is None or e.thread_id == thread_id)
        out: list[OutboxEvent] = []
        for event in selected:
            out.append(replace(event))
            if len(out) >= limit:
                break
        return out

    # -- the outbox relay ----------------------------------------------------------------------

    @asynccontextmanager
    async def claim_outbox(self, thread_id: str) -> AsyncIterator[bool]:
        relayed = self._state.relayed
        if thread_id in relayed:
            yield False
            return
        relayed.add(thread_id)
        try:
            yield True
        finally:
            relayed.discard(thread_id)

    def _unpublished(self) -> list[tuple[OutboxEvent, _Delivery]]:
        deliveries, untried = self._state.deliveries, _Delivery()
        pairs = [(e, deliveries.get(e.id, untried)) for e in self._state.outbox]
        return [(e, d) for e, d in pairs if d.published_at is None]

    async def pending_threads(self, now: datetime, limit: int) -> list[str]:
        heads: dict[str, _Delivery] = {}
        for event, delivery in self._unpublished():
            heads.setdefault(event.thread_id, delivery)
        due = [t for t, d in heads.items() if d.retry_at is None or d.retry_at <= now]
        return due[:limit]

    async def read_unpublished(self, thread_id: str, limit: int) -> list[OutboxDelivery]:
        found = [
            OutboxDelivery(replace(e), d.attempts, d.last_error, d.retry_at)
            for e, d in self._unpublished()
            if e.thread_id == thread_id
        ]
        return sorted(found, key=lambda d: d.event.seq)[:limit]

    async def mark_published(self, thread_id: str, seqs: Sequence[int], at: datetime) -> None:
        wanted = set(seqs)
        for event in self._state.outbox:
            if event.thread_id == thread_id and event.seq in wanted:
                delivery = self._state.deliveries.setdefault(event.id, _Delivery())
                if delivery.published_at is None:
                    delivery.published_at = at

    async def mark_failed(
        self, thread_id: str, seq: int, attempts: int, error: str, retry_at: datetime
    ) -> None:
        for event in self._state.outbox:
            if event.thread_id == thread_id and event.seq == seq:
                delivery = self._state.deliveries.setdefault(event.id, _Delivery())
                delivery.attempts, delivery.last_error = attempts, error
                delivery.retry_at = retry_at

    async def outbox_backlog(self, failing_limit: int) -> OutboxBacklog:
        unpublished = self._unpublished()
        failing = [
            OutboxDelivery(replace(e), d.attempts, d.last_error, d.retry_at)
            for e, d in unpublished
            if d.attempts
        ]
        return OutboxBacklog(
            len(unpublished),
            min((e.created_at for e, _ in unpublished), default=None),
            failing[:failing_limit],
        )

    # -- deploy check, migration, retention ----------------------------------------------------

    async def scan_threads(
        self, after: str | None, limit: int, below_revision: int | None
    ) -> list[tuple[str, StoredThread]]:
        found: list[tuple[str, StoredThread]] = []
        for thread_id in sorted(self._state.threads):
            thread = self._state.threads[thread_id]
            if (after is not None and thread_id <= after) or thread.checkpoint is None:
                continue
            revision = thread.schema_revision
            if below_revision is not None and (revision is None or revision >= below_revision):
                continue
            snapshot = self._snapshot(thread)
            assert snapshot is not None
            found.append((thread_id, snapshot))
            if len(found) >= limit:
                break
        return found

    async def read_interactions(
        self, after: str | None, limit: int, owner: ThreadOwner | None
    ) -> list[tuple[str, StoredThread]]:
        found: list[tuple[str, StoredThread]] = []
        for thread_id in sorted(self._state.threads):
            thread = self._state.threads[thread_id]
            if (
                (after is not None and thread_id <= after)
                or not thread.version
                or thread.checkpoint is None
                or INTERACTION_MARKER not in thread.checkpoint
                or (owner is not None and thread.tenant_id != owner.tenant_id)
            ):
                continue
            found.append(
                (thread_id, StoredThread(thread.version, thread.tenant_id, thread.checkpoint))
            )
            if len(found) >= limit:
                break
        return found

    async def rewrite_checkpoint(self, rewrite: CheckpointRewrite) -> None:
        thread = self._state.threads.get(rewrite.thread_id)
        if thread is None or thread.version != rewrite.version:
            raise FencedCommitError(
                f"thread {rewrite.thread_id!r} moved on while its checkpoint was migrated",
                thread_id=rewrite.thread_id,
            )
        thread.checkpoint = rewrite.rows.core
        thread.schema_revision = rewrite.schema_revision
        thread.messages = list(rewrite.rows.messages)
        thread.facts = dict(rewrite.rows.facts)

    async def prune_events(self, before: datetime, limit: int) -> int:
        state = self._state
        doomed: set[str] = set()
        for event in state.outbox:
            if len(doomed) >= limit:
                break
            delivery = state.deliveries.get(event.id)
            if (
                delivery is not None
                and delivery.published_at is not None
                and event.created_at < before
            ):
                doomed.add(event.id)
        state.outbox = [e for e in state.outbox if e.id not in doomed]
        for event_id in doomed:
            state.deliveries.pop(event_id, None)
        return len(doomed)

    async def prune_turns(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> tuple[int, tuple[str, str] | None]:
        state = self._state
        keys = sorted(
            k
            for k, stored in state.turns.items()
            if (after is None or k > after) and not stored.expired and state.turn_times[k] < before
        )[:limit]
        for key in keys:
            state.turns[key] = StoredTurn(state.turns[key].request_digest, "", expired=True)
            state.streams.pop(key, None)  # a pruned turn's stream goes with its result
        # A pruned turn's stop requests go with it, and so do its thread's interrupts on
        # a base the thread has moved past (kept without a time here: none is needed).
        pruned = set(keys)
        state.cancels = {k: v for k, v in state.cancels.items() if k[:2] not in pruned}
        threads = {k[0] for k in keys}
        state.interrupts = {
            key: seq
            for key, seq in state.interrupts.items()
            if key[0] not in threads or key[1] >= state.threads[key[0]].version
        }
        return len(keys), (keys[-1] if len(keys) == limit else None)

    async def stale_journals(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> list[tuple[str, str]]:
        return sorted(
            turn
            for turn, entries in self._state.journal.items()
            if (after is None or turn > after)
            and all(entry.created_at < before for entry in entries.values())
        )[:limit]

    async def prune_journal(self, thread_id: str, turn_id: str, before: datetime) -> int:
        journal = self._state.journal
        entries = journal.get((thread_id, turn_id), {})
        if not entries or any(entry.created_at >= before for entry in entries.values()):
            return 0
        del journal[(thread_id, turn_id)]
        self._state.streams.pop((thread_id, turn_id), None)  # the stream goes with it
        return len(entries)


class InMemoryDurability(RecordedDurability):
    """Durability for tests and examples; state lives only in this process.

    ``lock_timeout`` bounds how long a turn waits for a busy thread before
    ``ThreadBusyError``: finite, non-negative seconds (``ValueError`` otherwise).
    """

    def __init__(self, *, lock_timeout: float = 30.0) -> None:
        self._memory = _MemoryRecorder(_check_seconds("lock_timeout", lock_timeout))
        super().__init__(self._memory)

    def tamper(self) -> MemoryTamper:
        """Raw writes to this store that bypass every rule, for tests of corrupted rows."""
        return MemoryTamper(self, self._memory._state)


class MemoryTamper:
    """Raw writes to an :class:`InMemoryDurability`'s rows, bypassing every check: a
    :class:`~intention_kernel.testing.conformance.Tamper`, for tests of how the kernel
    meets a record it did not write. Made by :meth:`InMemoryDurability.tamper`."""

    def __init__(self, durability: InMemoryDurability, state: _State) -> None:
        self._durability, self._state = durability, state

    async def write_checkpoint_text(self, thread_id: str, text: str) -> None:
        """Overwrite the stored checkpoint document of an existing thread; the adapter
        forgets its decoded copy (the version alone no longer tells it changed)."""
        self._state.threads[thread_id].checkpoint = text
        self._durability.forget_checkpoint(thread_id)

    async def write_receipt_status(self, thread_id: str, key: str, status: str) -> None:
        """Overwrite the status of an existing receipt. The store holds typed receipts,
        so a status that is no :class:`~intention_kernel._effects.ReceiptStatus` cannot be
        held: ``ValueError``, and nothing changes."""
        receipt = self._state.receipts[(thread_id, key)]
        self._state.receipts[(thread_id, key)] = replace(receipt, status=ReceiptStatus(status))
