"""The SQLite recorder: the storage contract's reads and writes, as statements.

Transactions per turn: one read, one commit per effect state change (``prepared``,
then the outcome), and one commit for result + checkpoint + events; when turns
overlap, the writes of different turns share transactions (see :mod:`._group`). A
turn that records model rounds adds one read of its journal and one write per round
recorded.

Each write is a body that never begins, commits or rolls back: it runs in the
transaction its runner opened (``_run(..., atomic=True)`` gives it one when it is
alone), and raises to have its statements rolled back. A body that is not atomic
writes with one statement, which SQLite undoes by itself when it fails: in a group it
then needs no savepoint of its own (see :mod:`._group`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from intention_kernel import _faults
from intention_kernel._json import dump_value
from intention_kernel.durability._rows import (
    OUTBOX_COLUMNS,
    decode_delivery_row,
    decode_event_row,
    decode_receipt_row,
    fenced,
    journal_conflict,
    receipt_params,
    receipt_write,
    stored_thread,
)
from intention_kernel.durability.abc import (
    INTERACTION_MARKER,
    CheckpointRewrite,
    JournalEntry,
    OutboxBacklog,
    OutboxDelivery,
    PlanFn,
    Recorder,
    RecorderOptions,
    ResolutionFn,
    StoredThread,
    StoredTurn,
    ThreadOwner,
    TurnRecord,
    TurnStart,
)
from intention_kernel.durability.sqlite._connection import SQLiteConnections
from intention_kernel.durability.sqlite._statements import (
    BUMP_THREAD_SEQ,
    DELETE_FACT,
    DELETE_FACTS,
    DELETE_JOURNAL,
    DELETE_MESSAGES,
    INSERT_EVENT,
    INSERT_JOURNAL,
    INSERT_MESSAGE,
    INSERT_RECEIPT,
    INSERT_RECEIPT_IF_NEW,
    INSERT_THREAD,
    INSERT_TURN,
    MARK_ANNOUNCED,
    MARK_FAILED,
    MARK_PUBLISHED,
    PENDING_THREADS,
    PRUNE_EVENTS,
    PRUNE_JOURNAL,
    PRUNE_TURNS,
    READ_RECEIPTS,
    REWRITE_THREAD,
    SCAN_THREADS,
    SELECT_BACKLOG,
    SELECT_CLAIM,
    SELECT_FACTS,
    SELECT_FAILING,
    SELECT_INTERACTIONS,
    SELECT_JOURNAL,
    SELECT_MESSAGES,
    SELECT_RECEIPT,
    SELECT_THREAD,
    SELECT_THREAD_UNLESS_KNOWN,
    SELECT_TURN,
    SELECT_UNPUBLISHED,
    SETTLE_RECEIPT,
    TRIM_MESSAGES,
    UPDATE_RECEIPT,
    UPDATE_THREAD,
    UPSERT_FACT,
)
from intention_kernel.effects import EffectPlan, Receipt, ReceiptStatus, utcnow
from intention_kernel.errors import FencedCommitError
from intention_kernel.turns import EventDraft, OutboxEvent

__all__ = ["SQLiteRecorder"]


class SQLiteRecorder(SQLiteConnections, Recorder):
    #: ``_run`` never lets a cancellation through before its hop ends.
    options = RecorderOptions(finishes_writes_when_cancelled=True, attempts_outlive_lock=False)

    # -- turns ---------------------------------------------------------------------------------

    async def begin_turn(
        self, thread_id: str, turn_id: str, known_version: int | None
    ) -> TurnStart:
        def read(conn: sqlite3.Connection) -> TurnStart:
            row = conn.execute(SELECT_TURN, (thread_id, turn_id)).fetchone()
            if row is not None:
                return TurnStart(StoredTurn(row[0], row[1], row[3] is not None), None, row[2])
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
        now = record.created_at.isoformat()
        params = {
            "thread_id": record.thread_id,
            "tenant_id": record.tenant_id,
            "version": record.version,
            "expected": record.expected_version,
            "schema_revision": record.schema_revision,
            "fingerprint": record.fingerprint,
            "checkpoint": record.checkpoint,
            "events": len(record.events),
            "messages": len(record.messages),
            "now": now,
        }
        rows = _event_rows(record.events, record.thread_id, record.turn_id, now)
        thread_id = record.thread_id
        announced = dump_value(list(record.announced)) if record.announced else None

        def commit(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(
                    INSERT_TURN,
                    (
                        record.thread_id,
                        record.turn_id,
                        record.request_digest,
                        record.version,
                        record.result,
                        now,
                        announced,
                    ),
                )
            except sqlite3.IntegrityError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
                    raise
                raise fenced(record, "the turn ID was committed by another worker") from exc
            statement = INSERT_THREAD if record.expected_version == 0 else UPDATE_THREAD
            returned = conn.execute(statement, params).fetchone()
            if returned is None:
                raise fenced(record, "the thread version moved")
            next_seq, message_seq = returned
            if record.rewrite:
                conn.execute(DELETE_MESSAGES, (thread_id,))
                conn.execute(DELETE_FACTS, (thread_id,))
            # Each executemany only when it has rows: an empty one still looks up and
            # resets its statement.
            if record.messages:
                first = message_seq - len(record.messages) + 1
                conn.executemany(
                    INSERT_MESSAGE,
                    [(thread_id, first + i, body) for i, body in enumerate(record.messages)],
                )
            if record.trim_messages:
                last_trimmed = message_seq - record.keep_messages
                first_kept = last_trimmed - record.trim_messages
                conn.execute(TRIM_MESSAGES, (thread_id, first_kept, last_trimmed))
            if record.facts:
                conn.executemany(UPSERT_FACT, [(thread_id, k, body) for k, body in record.facts])
            if record.removed_facts:
                conn.executemany(DELETE_FACT, [(thread_id, k) for k in record.removed_facts])
            if record.mark_announced:
                conn.executemany(MARK_ANNOUNCED, [(thread_id, k) for k in record.mark_announced])
            if record.journaled:
                conn.execute(DELETE_JOURNAL, (thread_id, record.turn_id))
            if rows:
                first_seq = next_seq - len(rows)
                conn.executemany(
                    INSERT_EVENT,
                    [
                        (r[0], r[1], r[2], first_seq + i, r[3], r[4], r[5])
                        for i, r in enumerate(rows)
                    ],
                )
            if _faults.armed:  # every row written, the transaction still open
                _faults.reach(_faults.DURING_COMMIT)

        await self._run(commit, thread_id, atomic=True)

    # -- the journal -------------------------------------------------------------------------

    async def read_journal(self, thread_id: str, turn_id: str) -> list[JournalEntry]:
        def read(conn: sqlite3.Connection) -> list[JournalEntry]:
            rows = conn.execute(SELECT_JOURNAL, (thread_id, turn_id)).fetchall()
            return [
                JournalEntry(thread_id, turn_id, r[0], r[1], r[2], datetime.fromisoformat(r[3]))
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
        )

        def write(conn: sqlite3.Connection) -> None:
            # One autocommitted statement: durable when it returns (synchronous=FULL).
            try:
                conn.execute(INSERT_JOURNAL, row)
            except sqlite3.IntegrityError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
                    raise
                raise journal_conflict(entry) from exc

        await self._run(write, entry.thread_id)

    # -- effects -------------------------------------------------------------------------------

    async def claim_effect(self, thread_id: str, key: str, plan: PlanFn) -> EffectPlan:
        def claim(conn: sqlite3.Connection) -> EffectPlan:
            # Most keys are new: try what a first call writes, and read only if a
            # receipt was there already.
            first = plan(None)
            if first.write is not None:
                row = _receipt_params(first.write)
                if conn.execute(INSERT_RECEIPT_IF_NEW, row).rowcount == 1:
                    return first
            # Under the thread lock nobody else writes this receipt, so the read needs
            # no transaction and the write is one autocommitted statement.
            existing = _receipt(conn.execute(SELECT_RECEIPT, (thread_id, key)).fetchone())
            decided = plan(existing)
            if decided.write is not None:
                if existing is None:
                    conn.execute(INSERT_RECEIPT, _receipt_params(decided.write))
                else:
                    _update_receipt(conn, decided.write, existing)
            return decided

        return await self._run(claim, thread_id)

    async def write_receipt(self, receipt: Receipt, expected: Receipt) -> None:
        await self._run(lambda c: _update_receipt(c, receipt, expected), receipt.thread_id)

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
        def apply(conn: sqlite3.Connection) -> Receipt:
            existing = _receipt(conn.execute(SELECT_RECEIPT, (thread_id, key)).fetchone())
            resolved, event = resolution(existing)
            assert existing is not None
            _update_receipt(conn, resolved, existing)
            now = utcnow().isoformat()
            seq = conn.execute(BUMP_THREAD_SEQ, (thread_id, now)).fetchone()[0] - 1
            row = _event_rows([event], thread_id, None, now)[0]
            conn.execute(INSERT_EVENT, (row[0], row[1], row[2], seq, row[3], row[4], row[5]))
            return resolved

        return await self._run(apply, thread_id, atomic=True)

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

        def mark(conn: sqlite3.Connection) -> None:
            # Not the cursor: a body returns plain values (the writer closes a cursor
            # it is handed, see _group).
            conn.executemany(MARK_PUBLISHED, rows)

        await self._run(mark, atomic=True)

    async def mark_failed(
        self, thread_id: str, seq: int, attempts: int, error: str, retry_at: datetime
    ) -> None:
        args = (attempts, error, _stamp(retry_at), thread_id, seq)

        def mark(conn: sqlite3.Connection) -> None:
            conn.execute(MARK_FAILED, args)

        await self._run(mark)

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
        thread_id = rewrite.thread_id

        def write(conn: sqlite3.Connection) -> None:
            returned = conn.execute(
                REWRITE_THREAD,
                (
                    rewrite.checkpoint,
                    rewrite.schema_revision,
                    rewrite.fingerprint,
                    len(rewrite.messages),
                    thread_id,
                    rewrite.version,
                ),
            ).fetchone()
            if returned is None:
                raise FencedCommitError(
                    f"thread {thread_id!r} moved on while its checkpoint was migrated",
                    thread_id=thread_id,
                )
            first = returned[0] - len(rewrite.messages) + 1
            conn.execute(DELETE_MESSAGES, (thread_id,))
            conn.executemany(
                INSERT_MESSAGE,
                [(thread_id, first + i, body) for i, body in enumerate(rewrite.messages)],
            )
            conn.execute(DELETE_FACTS, (thread_id,))
            conn.executemany(UPSERT_FACT, [(thread_id, k, body) for k, body in rewrite.facts])

        await self._run(write, thread_id, atomic=True)

    async def prune_events(self, before: datetime, limit: int) -> int:
        args = (_stamp(before), limit)
        return int(await self._run(lambda conn: conn.execute(PRUNE_EVENTS, args).rowcount))

    async def prune_journal(self, before: datetime, limit: int) -> int:
        args = (_stamp(before), limit)
        return int(await self._run(lambda conn: conn.execute(PRUNE_JOURNAL, args).rowcount))

    async def prune_turns(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> tuple[int, tuple[str, str] | None]:
        start = after or ("", "")
        cutoff, now = _stamp(before), _stamp(utcnow())

        def prune(conn: sqlite3.Connection) -> tuple[int, tuple[str, str] | None]:
            rows = conn.execute(PRUNE_TURNS, (now, *start, cutoff, limit)).fetchall()
            keys = [(row[0], row[1]) for row in rows]
            return len(keys), (max(keys) if len(keys) == limit else None)

        return await self._run(prune)


def _thread(row: Sequence[Any] | None) -> StoredThread | None:
    return None if row is None else stored_thread(row[0], row[1], row[2])


def _with_rows(conn: sqlite3.Connection, thread_id: str, thread: StoredThread) -> StoredThread:
    messages = [row[0] for row in conn.execute(SELECT_MESSAGES, (thread_id,))]
    facts = conn.execute(SELECT_FACTS, (thread_id,)).fetchall()
    return stored_thread(thread.version, thread.tenant_id, thread.checkpoint, messages, facts)


def _receipt_params(r: Receipt) -> dict[str, Any]:
    """The receipt's columns as stored here: times as ``datetime.isoformat`` text."""
    return receipt_params(r, datetime.isoformat)


def _update_receipt(conn: sqlite3.Connection, new: Receipt, expected: Receipt) -> None:
    write = receipt_write(new, expected, datetime.isoformat)
    statement = SETTLE_RECEIPT if write.settles else UPDATE_RECEIPT
    write.check(conn.execute(statement, write.params).rowcount)


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
