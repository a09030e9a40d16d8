"""The SQLite recorder: the storage contract's reads and writes, as statements.

Transactions per turn:

- one read.
- one commit per effect state change: ``prepared``, then the outcome.
- one commit for result + checkpoint + events.

When turns overlap, the writes of different turns share transactions (see
:mod:`._group`). A turn that records model rounds adds one read of its journal. It
adds one write per round recorded.

Each write is a body of :mod:`._bodies` and its arguments, plain values. The body
never begins, commits or rolls back: it runs in the transaction its runner opened.
Its refusals are a plain ``Refusal``. This module turns them into the typed error
naming the record. The callbacks of a write run here, never inside a body. They are
``claim_effect``'s plan and ``resolve_receipt``'s resolution. The body is the fast
path (a new key's first receipt), or the compare-and-set the callback decided on
after a read. Under the thread lock nobody else writes the thread's receipts. So the
read and the write need not share a transaction.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any

from intention_kernel._effects import EffectPlan, Receipt, ReceiptStatus, utcnow
from intention_kernel._json import dump_value
from intention_kernel._turns import EventDraft, OutboxEvent
from intention_kernel.durability._contract.ownership import ANY_TENANT, cancel_scope
from intention_kernel.durability._contract.recorders import replay_or_lock_and_begin
from intention_kernel.durability._layout.rows import (
    OUTBOX_COLUMNS,
    decode_delivery_row,
    decode_event_row,
    decode_inbox_rows,
    decode_receipt_row,
    fenced,
    inbox_conflict,
    journal_conflict,
    receipt_moved,
    receipt_params,
    receipt_write,
    stored_thread,
)
from intention_kernel.durability._layout.timer_rows import decode_timer, split_writes, timer_filters
from intention_kernel.durability.abc import (
    INTERACTION_MARKER,
    CheckpointRewrite,
    InboxEntry,
    InboxRecorder,
    JournalEntry,
    OutboxBacklog,
    OutboxDelivery,
    PlanFn,
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
from intention_kernel.durability.sqlite import _bodies as bodies
from intention_kernel.durability.sqlite._bodies import Refusal
from intention_kernel.durability.sqlite._connection import SQLiteConnections
from intention_kernel.durability.sqlite._statements import (
    PENDING_THREADS,
    READ_RECEIPTS,
    RELEASE_STEER,
    SCAN_THREADS,
    SELECT_BACKLOG,
    SELECT_CANCEL,
    SELECT_CLAIM,
    SELECT_FACTS,
    SELECT_FAILING,
    SELECT_INBOX,
    SELECT_INDEX,
    SELECT_INTERACTIONS,
    SELECT_JOURNAL,
    SELECT_MESSAGES,
    SELECT_RECEIPT,
    SELECT_STREAM,
    SELECT_TAKEN,
    SELECT_TAKER,
    SELECT_THREAD,
    SELECT_THREAD_UNLESS_KNOWN,
    SELECT_TIMER,
    SELECT_TIMERS,
    SELECT_TURN,
    SELECT_UNPUBLISHED,
    SELECT_VERSION,
    STALE_JOURNALS,
    TAKE_STEERS,
)
from intention_kernel.errors import FencedCommitError

__all__ = ["SQLiteRecorder"]


class SQLiteRecorder(SQLiteConnections, Recorder, InboxRecorder, StreamRecorder, TimerRecorder):
    #: ``_run`` never lets a cancellation through before its hop ends.
    options = RecorderOptions(
        finishes_writes_when_cancelled=True, attempts_outlive_lock=False, receipt_index_rows=True
    )

    # -- turns ---------------------------------------------------------------------------------

    def start_turn(
        self, thread_id: str, turn_id: str, known_version: int | None, *, wait: bool = True
    ) -> AbstractAsyncContextManager[TurnStart]:
        """The lock and ``begin_turn``; on a busy thread, a committed turn is answered
        without the lock, as PostgreSQL's ``start_turn`` answers it. Without this, a
        replay waited for whatever turn held the thread (or was refused at once with
        ``wait=False``), although it writes nothing."""

        async def committed() -> TurnStart | None:
            return await self._read(lambda conn: _committed(conn, thread_id, turn_id), thread_id)

        return replay_or_lock_and_begin(
            self, committed, thread_id, turn_id, known_version, wait=wait, lock=self.turn_lock
        )

    async def begin_turn(
        self, thread_id: str, turn_id: str, known_version: int | None
    ) -> TurnStart:
        def read(conn: sqlite3.Connection) -> TurnStart:
            replay = _committed(conn, thread_id, turn_id)
            if replay is not None:
                return replay
            thread = conn.execute(SELECT_THREAD_UNLESS_KNOWN, (known_version, thread_id))
            found = _thread(thread.fetchone())
            if found is None or not found.version:
                claim = conn.execute(SELECT_CLAIM, (thread_id,)).fetchone()
                owner = None if claim is None else ThreadOwner(claim[0])
                return TurnStart(None, found, claimed_by=owner)
            if found.checkpoint is None:
                return TurnStart(None, found)
            # Not cached: read the rows too. Under the thread lock nobody writes them,
            # so no snapshot is needed (read_thread takes one: it runs without the lock).
            return TurnStart(None, _with_rows(conn, thread_id, found))

        return await self._read(read, thread_id)

    async def read_thread(self, thread_id: str) -> StoredThread | None:
        def read(conn: sqlite3.Connection) -> StoredThread | None:
            conn.execute("BEGIN")  # one snapshot for the thread row and its rows
            found = _thread(conn.execute(SELECT_THREAD, (thread_id,)).fetchone())
            found = found if found is None else _with_rows(conn, thread_id, found)
            conn.execute("COMMIT")
            return found

        return await self._read(read, thread_id)

    async def commit_turn(self, record: TurnRecord) -> None:
        now, rows = record.created_at.isoformat(), record.rows
        params = {
            "thread_id": record.thread_id,
            "tenant_id": record.tenant_id,
            "version": record.version,
            "expected": record.expected_version,
            "schema_revision": record.schema_revision,
            "fingerprint": record.fingerprint,
            "checkpoint": rows.core,
            "events": len(record.events),
            "messages": len(rows.messages),
            "index": len(rows.receipt_index),
            "now": now,
        }
        turn = (
            record.thread_id,
            record.turn_id,
            record.request_digest,
            record.version,
            record.result,
            now,
            dump_value(list(record.announced)) if record.announced else None,
        )
        trim = (rows.trim_messages, rows.keep_messages) if rows.trim_messages else None
        index = (
            (rows.receipt_index, rows.moved_index_keys, rows.trim_index)
            if rows.receipt_index or rows.moved_index_keys or rows.trim_index
            else None
        )
        args = (
            turn,
            params,
            rows.messages,
            trim,
            rows.facts,
            rows.removed_facts,
            record.mark_announced,
            bool(record.journaled),
            bool(rows.rewrite),
            _event_rows(record.events, record.thread_id, record.turn_id, now),
            index,
            split_writes(record.timers, _stamp) if record.timers else None,
        )
        try:
            await self._write(bodies.commit_turn, args, record.thread_id, atomic=True)
        except Refusal as refused:
            raise fenced(record, refused.reason) from refused

    # -- timers --------------------------------------------------------------------------------

    async def write_timers(
        self, thread_id: str, writes: Sequence[TimerWrite], events: Sequence[EventDraft]
    ) -> None:
        now = utcnow().isoformat()
        rows = _event_rows(events, thread_id, None, now)
        args = (split_writes(writes, _stamp), thread_id, now, rows)
        await self._write(bodies.write_timers, args, thread_id, atomic=True)

    async def read_timer(self, thread_id: str, key: str) -> Timer | None:
        def read(conn: sqlite3.Connection) -> Timer | None:
            row = conn.execute(SELECT_TIMER, (thread_id, key)).fetchone()
            return None if row is None else decode_timer(row, _parse_time)

        return await self._read(read, thread_id)

    async def read_timers(
        self, thread_id: str | None, status: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[Timer]:
        params = timer_filters(thread_id, status, after, limit)

        def read(conn: sqlite3.Connection) -> list[Timer]:
            rows = conn.execute(SELECT_TIMERS, params).fetchall()
            return [decode_timer(row, _parse_time) for row in rows]

        return await self._read(read, thread_id)

    async def claim_timers(self, now: datetime, until: datetime, limit: int) -> list[Timer]:
        params: dict[str, Any] = {
            "now": _stamp(now.astimezone(UTC)),
            "until": _stamp(until.astimezone(UTC)),
            "limit": limit,
        }
        rows = await self._write(bodies.claim_timers, (params,))
        return [decode_timer(row, _parse_time) for row in rows]

    async def prune_timers(self, before: datetime, limit: int) -> int:
        args = (_stamp(before.astimezone(UTC)), limit)
        deleted: int = await self._write(bodies.prune_timers, (args,))
        return deleted

    # -- the journal -------------------------------------------------------------------------

    async def read_journal(self, thread_id: str, turn_id: str) -> list[JournalEntry]:
        def read(conn: sqlite3.Connection) -> list[JournalEntry]:
            rows = conn.execute(SELECT_JOURNAL, (thread_id, turn_id)).fetchall()
            return [
                JournalEntry(
                    thread_id, turn_id, r[0], r[1], r[2], datetime.fromisoformat(r[3]), r[4]
                )
                for r in rows
            ]

        return await self._read(read, thread_id)

    async def write_journal(self, entry: JournalEntry) -> None:
        row = (
            entry.thread_id,
            entry.turn_id,
            entry.key,
            entry.request_digest,
            entry.value,
            _stamp(entry.created_at),
            entry.tenant_id,
        )

        try:
            if entry.stream is None:
                await self._write(bodies.write_journal, (row,), entry.thread_id)
            else:
                streamed = (*row, *entry.stream)
                await self._write(bodies.write_streamed, (streamed,), entry.thread_id)
        except Refusal as refused:
            raise journal_conflict(entry) from refused

    async def read_stream(self, thread_id: str, turn_id: str) -> StoredStream:
        def read(conn: sqlite3.Connection) -> StoredStream:
            # The turn first: once it is committed, no segment is written after it.
            found = conn.execute(SELECT_TURN, (thread_id, turn_id)).fetchone()
            turn = None if found is None else StoredTurn(found[0], found[1], found[3] is not None)
            segments = conn.execute(SELECT_STREAM, (thread_id, turn_id)).fetchall()
            return StoredStream(turn, tuple((int(n), str(e)) for n, e in segments))

        return await self._read(read, thread_id)

    # -- the inbox -----------------------------------------------------------------------------

    async def enqueue(self, entry: InboxEntry) -> int | None:
        row = (
            entry.thread_id,
            entry.turn_id,
            entry.tenant_id,
            entry.request_digest,
            entry.request,
            _stamp(entry.created_at),
            1 if entry.steer else 0,
        )
        try:
            # Atomic: the committed-turn check, the insert and the count see one state.
            position: int | None = await self._write(
                bodies.enqueue, (row,), entry.thread_id, atomic=True
            )
        except Refusal as refused:
            raise inbox_conflict(entry) from refused
        return position

    async def read_inbox(self, thread_id: str) -> list[InboxEntry]:
        def read(conn: sqlite3.Connection) -> list[InboxEntry]:
            rows = conn.execute(SELECT_INBOX, (thread_id,)).fetchall()
            return decode_inbox_rows(thread_id, rows, datetime.fromisoformat)

        return await self._read(read, thread_id)

    async def taker(self, thread_id: str, turn_id: str) -> str | None:
        def read(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(SELECT_TAKER, (thread_id, turn_id)).fetchone()
            return None if row is None else str(row[0])

        return await self._read(read, thread_id)

    async def take_steers(self, thread_id: str, turn_id: str) -> list[InboxEntry]:
        def take(conn: sqlite3.Connection) -> list[InboxEntry]:
            conn.execute(TAKE_STEERS, (thread_id, turn_id))
            rows = conn.execute(SELECT_TAKEN, (thread_id, turn_id)).fetchall()
            return decode_inbox_rows(thread_id, rows, datetime.fromisoformat)

        taken: list[InboxEntry] = await self._write(take, (), thread_id, atomic=True)
        return taken

    async def release_steer(self, thread_id: str, turn_id: str, taken_by: str) -> bool:
        def release(conn: sqlite3.Connection) -> int:
            return conn.execute(RELEASE_STEER, (thread_id, turn_id, taken_by)).rowcount

        released: int = await self._write(release, (), thread_id)
        return released == 1

    async def remove_inbox(self, thread_id: str, turn_id: str) -> bool:
        removed: int = await self._write(bodies.remove_inbox, (thread_id, turn_id), thread_id)
        return removed == 1

    async def request_cancel(
        self,
        thread_id: str,
        turn_id: str,
        reason: str | None,
        at: datetime,
        owner: ThreadOwner | None = None,
    ) -> str:
        scope = ANY_TENANT if owner is None else cancel_scope(owner.tenant_id)
        row = (thread_id, turn_id, reason, _stamp(at), scope)
        running = functools.partial(self.running, thread_id, turn_id)
        found: str = await self._write(
            bodies.request_cancel, (row, owner, running), thread_id, atomic=True
        )
        return found

    async def thread_version(self, thread_id: str) -> int:
        def read(conn: sqlite3.Connection) -> int:
            row = conn.execute(SELECT_VERSION, (thread_id,)).fetchone()
            return int(row[0]) if row is not None else 0

        return await self._read(read, thread_id)

    async def request_interrupt(
        self, thread_id: str, base_version: int, at: datetime, turn_id: str, tenant_id: str | None
    ) -> None:
        row = (thread_id, base_version, turn_id, cancel_scope(tenant_id), _stamp(at))
        await self._write(bodies.request_interrupt, (row,), thread_id)

    async def start_queued(
        self, thread_id: str, turn_id: str, base_version: int, tenant_id: str | None = None
    ) -> tuple[str | None, str | None]:
        params = (thread_id, turn_id, cancel_scope(tenant_id), base_version)
        row = await self._write(bodies.start_queued, (params,), thread_id, atomic=True)
        if row is None:
            return None, None
        return ("cancel", row[1]) if row[0] == 0 else ("interrupt", None)

    async def read_cancel(
        self, thread_id: str, turn_id: str, base_version: int, tenant_id: str | None = None
    ) -> tuple[str | None, str | None]:
        def read(conn: sqlite3.Connection) -> tuple[str | None, str | None]:
            params = (thread_id, turn_id, cancel_scope(tenant_id), base_version)
            row = conn.execute(SELECT_CANCEL, params).fetchone()
            if row is None:
                return None, None
            return ("cancel", row[1]) if row[0] == 0 else ("interrupt", None)

        return await self._read(read, thread_id)

    # -- effects -------------------------------------------------------------------------------

    async def claim_effect(self, thread_id: str, key: str, plan: PlanFn) -> EffectPlan:
        # Most keys are new: try what a first call writes, and read only if a receipt
        # was there already.
        first = plan(None)
        if first.write is not None:
            row = _receipt_params(first.write)
            if await self._write(bodies.claim_receipt, (row,), thread_id) == 1:
                return first
        # Under the thread lock nobody else writes this receipt, so the read may run
        # apart from the write that follows, and the plan between them.
        existing = await self._read(lambda c: _select_receipt(c, thread_id, key), thread_id)
        decided = plan(existing)
        if decided.write is not None:
            if existing is None:
                await self._write(
                    bodies.insert_receipt, (_receipt_params(decided.write),), thread_id
                )
            else:
                await self._update_receipt(decided.write, existing)
        return decided

    async def write_receipt(self, receipt: Receipt, expected: Receipt) -> None:
        await self._update_receipt(receipt, expected)

    async def _update_receipt(self, new: Receipt, expected: Receipt) -> None:
        write = receipt_write(new, expected, datetime.isoformat)
        try:
            await self._write(bodies.update_receipt, (write.settles, write.params), new.thread_id)
        except Refusal as refused:
            raise receipt_moved(new) from refused

    async def read_receipts(
        self, thread_id: str | None, status: ReceiptStatus | None, tenant_id: str | None = None
    ) -> list[Receipt]:
        clauses, args = [], []
        if thread_id is not None:
            clauses.append("r.thread_id = ?")
            args.append(thread_id)
        if status is not None:
            clauses.append("r.status = ?")
            args.append(str(status))
        if tenant_id is not None:
            clauses.append("r.tenant_id = ?")
            args.append(tenant_id)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"{READ_RECEIPTS} {where} ORDER BY r.created_at, r.rowid"

        def read(conn: sqlite3.Connection) -> list[Receipt]:
            return [_require(_receipt(row)) for row in conn.execute(sql, args)]

        return await self._read(read, thread_id)

    async def resolve_receipt(self, thread_id: str, key: str, resolution: ResolutionFn) -> Receipt:
        # Under the thread lock nobody else writes this receipt: the read, the
        # resolution's decision and the compare-and-set that writes it may run apart.
        existing = await self._read(lambda c: _select_receipt(c, thread_id, key), thread_id)
        resolved, event = resolution(existing)
        assert existing is not None
        write = receipt_write(resolved, existing, datetime.isoformat)
        now = utcnow().isoformat()
        row = _event_rows([event], thread_id, None, now)[0]
        args = (write.settles, write.params, thread_id, now, row)
        try:
            await self._write(bodies.resolve_receipt, args, thread_id, atomic=True)
        except Refusal as refused:
            raise receipt_moved(resolved) from refused
        return resolved

    # -- outbox --------------------------------------------------------------------------------

    async def read_outbox(
        self, thread_id: str | None, after: int | None, limit: int
    ) -> list[OutboxEvent]:
        sql = f"SELECT {OUTBOX_COLUMNS} FROM ik_outbox WHERE position > ?"
        args: list[Any] = [after or 0]
        if thread_id is not None:
            sql += " AND thread_id = ?"
            args.append(thread_id)
        sql += " ORDER BY position LIMIT ?"
        args.append(limit)

        def read(conn: sqlite3.Connection) -> list[OutboxEvent]:
            return [_event(r) for r in conn.execute(sql, args)]

        return await self._read(read)

    # -- the outbox relay ----------------------------------------------------------------------

    async def pending_threads(self, now: datetime, limit: int) -> list[str]:
        args = (_stamp(now), limit)
        return await self._read(lambda c: [r[0] for r in c.execute(PENDING_THREADS, args)])

    async def read_unpublished(self, thread_id: str, limit: int) -> list[OutboxDelivery]:
        args = (thread_id, limit)
        return await self._read(
            lambda c: [_delivery(r) for r in c.execute(SELECT_UNPUBLISHED, args)], thread_id
        )

    async def mark_published(self, thread_id: str, seqs: Sequence[int], at: datetime) -> None:
        rows = [(_stamp(at), thread_id, seq) for seq in seqs]
        await self._write(bodies.mark_published, (rows,), atomic=True)

    async def mark_failed(
        self, thread_id: str, seq: int, attempts: int, error: str, retry_at: datetime
    ) -> None:
        args = (attempts, error, _stamp(retry_at), thread_id, seq)
        await self._write(bodies.mark_failed, (args,))

    async def outbox_backlog(self, failing_limit: int) -> OutboxBacklog:
        def read(conn: sqlite3.Connection) -> OutboxBacklog:
            conn.execute("BEGIN")  # one snapshot for the count and the failing events
            count, oldest = conn.execute(SELECT_BACKLOG).fetchone()
            failing = [_delivery(r) for r in conn.execute(SELECT_FAILING, (failing_limit,))]
            conn.execute("COMMIT")
            return OutboxBacklog(count, _parse_time(oldest), failing)

        return await self._read(read)

    # -- deploy check, migration, retention ----------------------------------------------------

    async def scan_threads(
        self, after: str | None, limit: int, below_revision: int | None
    ) -> list[tuple[str, StoredThread]]:
        args = (after or "", below_revision, below_revision, limit)

        def read(conn: sqlite3.Connection) -> list[tuple[str, StoredThread]]:
            conn.execute("BEGIN")  # each thread and its rows from one snapshot
            rows = conn.execute(SCAN_THREADS, args).fetchall()
            found = [
                (row[0], _with_rows(conn, row[0], stored_thread(row[1], row[2], row[3])))
                for row in rows
            ]
            conn.execute("COMMIT")
            return found

        return await self._read(read)

    async def read_interactions(
        self, after: str | None, limit: int, owner: ThreadOwner | None
    ) -> list[tuple[str, StoredThread]]:
        args = (
            after or "",
            INTERACTION_MARKER,
            owner is not None,
            owner.tenant_id if owner else None,
            limit,
        )

        def read(conn: sqlite3.Connection) -> list[tuple[str, StoredThread]]:
            rows = conn.execute(SELECT_INTERACTIONS, args).fetchall()
            return [(row[0], stored_thread(row[1], row[2], row[3])) for row in rows]

        return await self._read(read)

    async def rewrite_checkpoint(self, rewrite: CheckpointRewrite) -> None:
        thread_id, rows = rewrite.thread_id, rewrite.rows
        thread = (
            rows.core,
            rewrite.schema_revision,
            rewrite.fingerprint,
            len(rows.messages),
            len(rows.receipt_index),
            thread_id,
            rewrite.version,
        )
        args = (thread, rows.messages, rows.facts, rows.receipt_index)
        try:
            await self._write(bodies.rewrite_checkpoint, args, thread_id, atomic=True)
        except Refusal as refused:
            raise FencedCommitError(
                f"thread {thread_id!r} moved on while its checkpoint was migrated",
                thread_id=thread_id,
            ) from refused

    async def prune_events(self, before: datetime, limit: int) -> int:
        args = (_stamp(before), limit)
        return int(await self._write(bodies.prune_events, (args,)))

    async def stale_journals(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> list[tuple[str, str]]:
        args = (*(after or ("", "")), _stamp(before), limit)

        def read(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            return [(row[0], row[1]) for row in conn.execute(STALE_JOURNALS, args)]

        return await self._read(read)

    async def prune_journal(self, thread_id: str, turn_id: str, before: datetime) -> int:
        args = (thread_id, turn_id, _stamp(before))
        return int(await self._write(bodies.prune_journal, (args,), thread_id, atomic=True))

    async def prune_turns(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> tuple[int, tuple[str, str] | None]:
        start = after or ("", "")
        cutoff, now = _stamp(before), _stamp(utcnow())

        args = (now, *start, cutoff, limit)
        pruned: tuple[int, tuple[str, str] | None] = await self._write(
            bodies.prune_turns, (args, limit), atomic=True
        )
        return pruned


def _committed(conn: sqlite3.Connection, thread_id: str, turn_id: str) -> TurnStart | None:
    """The committed turn and its thread's owner, in one statement (one snapshot), or
    ``None``. A committed turn never changes but for its pruning, which one statement
    sees whole: no lock is needed to read it."""
    row = conn.execute(SELECT_TURN, (thread_id, turn_id)).fetchone()
    if row is None:
        return None
    return TurnStart(StoredTurn(row[0], row[1], row[3] is not None), None, row[2])


def _thread(row: Sequence[Any] | None) -> StoredThread | None:
    return None if row is None else stored_thread(row[0], row[1], row[2])


def _with_rows(conn: sqlite3.Connection, thread_id: str, thread: StoredThread) -> StoredThread:
    messages = [row[0] for row in conn.execute(SELECT_MESSAGES, (thread_id,))]
    facts = conn.execute(SELECT_FACTS, (thread_id,)).fetchall()
    index = [row[0] for row in conn.execute(SELECT_INDEX, (thread_id,))]
    return stored_thread(
        thread.version, thread.tenant_id, thread.checkpoint, messages, facts, index
    )


def _receipt_params(r: Receipt) -> dict[str, Any]:
    """The receipt's columns as stored here: times as ``datetime.isoformat`` text."""
    return receipt_params(r, datetime.isoformat)


def _select_receipt(conn: sqlite3.Connection, thread_id: str, key: str) -> Receipt | None:
    return _receipt(conn.execute(SELECT_RECEIPT, (thread_id, key)).fetchone())


def _receipt(row: Sequence[Any] | None) -> Receipt | None:
    return decode_receipt_row(row, datetime.fromisoformat)


def _stamp(moment: datetime) -> str:
    """A timestamp as stored: ISO 8601 text, always with microseconds, so that text
    order is time order."""
    return moment.isoformat(timespec="microseconds")


def _parse_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _event(r: Sequence[Any]) -> OutboxEvent:
    return decode_event_row(r, datetime.fromisoformat)


def _delivery(r: Sequence[Any]) -> OutboxDelivery:
    return decode_delivery_row(r, datetime.fromisoformat)


def _require(receipt: Receipt | None) -> Receipt:
    assert receipt is not None
    return receipt


def _event_rows(
    events: Sequence[EventDraft], thread_id: str, turn_id: str | None, now: str
) -> list[tuple[Any, ...]]:
    return [(e.id, thread_id, turn_id, e.type, dump_value(e.payload), now) for e in events]
