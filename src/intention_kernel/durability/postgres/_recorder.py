"""The PostgreSQL recorder: the storage contract's reads and writes, as statements.

Transactions per turn: one read, one statement per effect state change, and one commit
for result + checkpoint + events; a turn that records model rounds adds one read of its
journal and one statement per round recorded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

from psycopg.errors import UniqueViolation

from intention_kernel import _faults
from intention_kernel._json import dump_value
from intention_kernel.durability._rows import (
    decode_delivery_row,
    decode_event_row,
    decode_receipt_row,
    fenced,
    inbox_conflict,
    journal_conflict,
    receipt_moved,
    receipt_params,
    receipt_write,
    stored_thread,
)
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
    StoredThread,
    ThreadOwner,
    TurnRecord,
    TurnStart,
)
from intention_kernel.durability.postgres._commit import commit_parts, commit_statement
from intention_kernel.durability.postgres._locks import PostgresLocks
from intention_kernel.durability.postgres._schema import BEGIN_TURN, turn_start
from intention_kernel.durability.postgres._sessions import Connection, execute, fetch_value, present
from intention_kernel.durability.postgres._statements import (
    BUMP_THREAD_SEQ,
    DELETE_FACTS,
    DELETE_INBOX,
    DELETE_MESSAGES,
    HAS_UNSEQUENCED,
    INBOX_POSITION,
    INSERT_CANCEL,
    INSERT_EVENT,
    INSERT_FACTS,
    INSERT_INBOX,
    INSERT_INTERRUPT,
    INSERT_JOURNAL,
    INSERT_MESSAGES,
    INSERT_RECEIPT,
    INSERT_RECEIPT_IF_NEW,
    LOCK_OUTBOX_HEAD,
    MARK_FAILED,
    MARK_PUBLISHED,
    PENDING_THREADS,
    PRUNE_EVENTS,
    PRUNE_JOURNAL,
    PRUNE_TURNS,
    REWRITE_THREAD,
    SCAN_THREADS,
    SELECT_BACKLOG,
    SELECT_CANCEL,
    SELECT_FAILING,
    SELECT_INBOX,
    SELECT_INBOX_ENTRY,
    SELECT_INTERACTIONS,
    SELECT_JOURNAL,
    SELECT_OUTBOX,
    SELECT_RECEIPT,
    SELECT_THREAD,
    SELECT_TURN_EXISTS,
    SELECT_UNPUBLISHED,
    SELECT_VERSION,
    SEQUENCE_OUTBOX,
    SETTLE_RECEIPT,
    STALE_JOURNALS,
    UPDATE_RECEIPT,
    receipts_query,
)
from intention_kernel.effects import EffectPlan, Receipt, ReceiptStatus, utcnow
from intention_kernel.errors import FencedCommitError, StoreError
from intention_kernel.turns import EventDraft, OutboxEvent

__all__ = ["PostgresRecorder"]


class PostgresRecorder(PostgresLocks, Recorder, InboxRecorder):
    # The thread lock dies with its session, and a session can die (killed by an
    # administrator, cut by the network) while its worker's provider call still runs:
    # a ``prepared`` receipt under the lock may be a live attempt's. A write awaits the
    # pool and the server, so a cancellation can interrupt it.
    options = RecorderOptions(finishes_writes_when_cancelled=False, attempts_outlive_lock=True)

    # -- turns ---------------------------------------------------------------------------------

    async def begin_turn(
        self, thread_id: str, turn_id: str, known_version: int | None
    ) -> TurnStart:
        async def read(conn: Connection) -> TurnStart:
            params = {"thread_id": thread_id, "turn_id": turn_id, "known_version": known_version}
            cur = await execute(conn, BEGIN_TURN, params)
            return turn_start(present(await cur.fetchone())[1:])

        return await self._run(thread_id, read)

    async def read_thread(self, thread_id: str) -> StoredThread | None:
        async def read(conn: Connection) -> StoredThread | None:
            cur = await conn.execute(SELECT_THREAD, {"thread_id": thread_id})
            row = await cur.fetchone()
            return None if row is None else _thread(*row)

        return await self._run(None, read)

    async def commit_turn(self, record: TurnRecord) -> None:
        params = {f.name: getattr(record, f.name) for f in fields(record)}
        params.update(
            events=len(record.events),
            event_ids=[e.id for e in record.events],
            event_types=[e.type for e in record.events],
            event_payloads=[dump_value(e.payload) for e in record.events],
            appended=len(record.messages),
            messages=list(record.messages),
            fact_keys=[key for key, _ in record.facts],
            fact_bodies=[body for _, body in record.facts],
            removed_facts=list(record.removed_facts),
            announced=list(record.announced) or None,
            mark_announced=list(record.mark_announced),
        )
        del params["facts"]
        statement = commit_statement(record.expected_version == 0, commit_parts(record))
        held = self._held.get(record.thread_id)
        params["lock"] = held.key if held else self._thread_key(record.thread_id)

        async def commit(conn: Connection) -> None:
            if _faults.armed:  # as the one-statement commit transaction is sent
                _faults.reach(_faults.DURING_COMMIT)
            try:
                committed = await (await execute(conn, statement, params)).fetchone()
            except UniqueViolation as exc:
                if exc.diag.constraint_name == "ik_turns_pkey":
                    raise fenced(record, "the turn ID was committed by another worker") from exc
                raise
            if committed is None:
                raise fenced(record, "the thread version moved")
            if held is not None and held.conn is conn and committed[1]:
                held.committed = True

        await self._run(record.thread_id, commit)

    # -- the journal -------------------------------------------------------------------------

    async def read_journal(self, thread_id: str, turn_id: str) -> list[JournalEntry]:
        async def read(conn: Connection) -> list[JournalEntry]:
            cur = await execute(conn, SELECT_JOURNAL, (thread_id, turn_id))
            return [
                JournalEntry(thread_id, turn_id, key, digest, value, _utc(created_at), tenant)
                for key, digest, value, created_at, tenant in await cur.fetchall()
            ]

        return await self._run(thread_id, read)

    async def write_journal(self, entry: JournalEntry) -> None:
        row = (
            entry.thread_id,
            entry.turn_id,
            entry.key,
            entry.request_digest,
            entry.value,
            entry.created_at,
            entry.tenant_id,
        )

        async def write(conn: Connection) -> None:
            # One autocommitted statement on the lock's session: a session that died
            # with the lock fails it, so no entry is written without the lock.
            try:
                await execute(conn, INSERT_JOURNAL, row)
            except UniqueViolation as exc:
                if exc.diag.constraint_name == "ik_journal_pkey":
                    raise journal_conflict(entry) from exc
                raise

        await self._run(entry.thread_id, write)

    # -- the inbox -----------------------------------------------------------------------------

    # Pooled sessions (``_run(None, ...)``): a message is accepted while another turn,
    # maybe of this process, holds the thread's lock and its session.

    async def enqueue(self, entry: InboxEntry) -> int | None:
        row = (
            entry.thread_id,
            entry.turn_id,
            entry.tenant_id,
            entry.request_digest,
            entry.request,
            entry.created_at,
        )
        key = (entry.thread_id, entry.turn_id)

        async def write(conn: Connection) -> int | None:
            # One transaction: the committed-turn check, the insert and the count.
            # Repeated after a lost acknowledgement, it finds its own entry.
            async with conn.transaction():
                if await (await execute(conn, SELECT_TURN_EXISTS, key)).fetchone():
                    return None
                inserted = await (await execute(conn, INSERT_INBOX, row)).fetchone()
                if inserted is None:
                    seq, digest = present(
                        await (await execute(conn, SELECT_INBOX_ENTRY, key)).fetchone()
                    )
                    if (
                        entry.request_digest is not None
                        and digest is not None
                        and digest != entry.request_digest
                    ):
                        raise inbox_conflict(entry)
                else:
                    seq = inserted[0]
                position: int = await fetch_value(conn, INBOX_POSITION, entry.thread_id, seq)
                return position

        return await self._run(None, write)

    async def read_inbox(self, thread_id: str) -> list[InboxEntry]:
        async def read(conn: Connection) -> list[InboxEntry]:
            cur = await execute(conn, SELECT_INBOX, (thread_id,))
            return [
                InboxEntry(thread_id, turn_id, tenant_id, digest, request, _utc(at), seq)
                for turn_id, tenant_id, digest, request, at, seq in await cur.fetchall()
            ]

        return await self._run(None, read)

    async def remove_inbox(self, thread_id: str, turn_id: str) -> bool:
        async def write(conn: Connection) -> bool:
            cur = await execute(conn, DELETE_INBOX, (thread_id, turn_id))
            return cur.rowcount == 1

        return await self._run(None, write)

    async def request_cancel(
        self, thread_id: str, turn_id: str, reason: str | None, at: datetime
    ) -> str:
        key = (thread_id, turn_id)

        async def write(conn: Connection) -> str:
            # One transaction: the committed-turn check, the request and the dequeue.
            async with conn.transaction():
                if await (await execute(conn, SELECT_TURN_EXISTS, key)).fetchone():
                    return "committed"
                await execute(conn, INSERT_CANCEL, (thread_id, turn_id, reason, at))
                removed = (await execute(conn, DELETE_INBOX, key)).rowcount
                return "dequeued" if removed else "requested"

        return await self._run(None, write)

    async def thread_version(self, thread_id: str) -> int:
        async def read(conn: Connection) -> int:
            row = await (await execute(conn, SELECT_VERSION, (thread_id,))).fetchone()
            return int(row[0]) if row is not None else 0

        return await self._run(None, read)

    async def request_interrupt(self, thread_id: str, base_version: int, at: datetime) -> None:
        async def write(conn: Connection) -> None:
            await execute(conn, INSERT_INTERRUPT, (thread_id, base_version, at))

        await self._run(None, write)

    async def read_cancel(
        self, thread_id: str, turn_id: str, base_version: int
    ) -> tuple[str | None, str | None]:
        async def read(conn: Connection) -> tuple[str | None, str | None]:
            params = (thread_id, turn_id, thread_id, base_version)
            row = await (await execute(conn, SELECT_CANCEL, params)).fetchone()
            if row is None:
                return None, None
            return ("cancel", row[1]) if row[0] == 0 else ("interrupt", None)

        return await self._run(None, read)

    # -- effects -------------------------------------------------------------------------------

    async def claim_effect(self, thread_id: str, key: str, plan: PlanFn) -> EffectPlan:
        async def claim(conn: Connection) -> EffectPlan:
            # Most keys are new: try what a first call writes, and read only if a
            # receipt was there already.
            first = plan(None)
            if first.write is not None:
                params = _receipt_params(first.write)
                if (await execute(conn, INSERT_RECEIPT_IF_NEW, params)).rowcount == 1:
                    return first
            # No wrapping transaction: the write is one statement whose primary key
            # (insert) or compare-and-set (update) refuses it if anyone wrote the
            # receipt since the read, which under the thread lock nobody should.
            existing = _receipt(
                await (await execute(conn, SELECT_RECEIPT, (thread_id, key))).fetchone()
            )
            decided = plan(existing)
            if decided.write is None:
                return decided
            if existing is not None:
                await _update_receipt(conn, decided.write, existing)
                return decided
            try:
                await execute(conn, INSERT_RECEIPT, _receipt_params(decided.write))
            except UniqueViolation as exc:
                if exc.diag.constraint_name == "ik_receipts_pkey":
                    raise receipt_moved(decided.write) from exc
                raise
            return decided

        return await self._run(thread_id, claim)

    async def write_receipt(self, receipt: Receipt, expected: Receipt) -> None:
        async def write(conn: Connection) -> None:
            await _update_receipt(conn, receipt, expected)

        thread_id = receipt.thread_id
        try:
            await self._run(thread_id, write)
        except StoreError:
            held = self._held.get(thread_id)
            if held is None or not await self._give_back_dead(held):
                raise
            # The turn's session (and its lock) died, here typically during the provider
            # call, so the outcome is known but was not recorded: left ``prepared``, the
            # receipt would turn uncertain and a completed write would wait for an
            # operator. Record it once more on another session. Without the lock this is
            # still safe: the write compares-and-sets the status and attempt that this
            # call prepared, so if a turn that locked the thread since found the receipt
            # prepared and made it uncertain (or an operator resolved it), the write is
            # refused (FencedCommitError) and the receipt stays as they left it. The turn
            # itself cannot commit: its next statement fails on the dead session.
            await self._run(None, _settle_again(receipt, expected))

    async def read_receipts(
        self, thread_id: str | None, status: ReceiptStatus | None, tenant_id: str | None = None
    ) -> list[Receipt]:
        query, filters = receipts_query(thread_id, status, tenant_id)

        async def read(conn: Connection) -> list[Receipt]:
            rows = await (await conn.execute(query, filters)).fetchall()
            return [present(_receipt(row)) for row in rows]

        return await self._run(None, read)

    async def resolve_receipt(self, thread_id: str, key: str, resolution: ResolutionFn) -> Receipt:
        async def apply(conn: Connection) -> Receipt:
            async with conn.transaction():
                cur = await conn.execute(SELECT_RECEIPT, (thread_id, key))
                existing = _receipt(await cur.fetchone())
                resolved, event = resolution(existing)
                await _update_receipt(conn, resolved, present(existing))
                now = utcnow()
                next_seq = await fetch_value(conn, BUMP_THREAD_SEQ, thread_id, now)
                await _insert_events(conn, thread_id, None, [event], next_seq, now)
                return resolved

        return await self._run(thread_id, apply)

    # -- outbox --------------------------------------------------------------------------------

    async def read_outbox(
        self, thread_id: str | None, after: int | None, limit: int
    ) -> list[OutboxEvent]:
        query = SELECT_OUTBOX + (" AND thread_id = %(thread_id)s" if thread_id is not None else "")
        query += " ORDER BY position LIMIT %(limit)s"
        args = {"after": after or 0, "thread_id": thread_id, "limit": limit}

        async def read(conn: Connection) -> list[OutboxEvent]:
            # Number every event committed so far before reading, so that a caller
            # sees its own committed turns. Repeating it after a lost ack is harmless.
            if await fetch_value(conn, HAS_UNSEQUENCED):
                async with conn.transaction():
                    head = await fetch_value(conn, LOCK_OUTBOX_HEAD)
                    await conn.execute(SEQUENCE_OUTBOX, {"head": head})
            return [_event(row) for row in await (await conn.execute(query, args)).fetchall()]

        return await self._run(None, read)

    async def _sequence(self, conn: Connection) -> None:
        """Number every committed, unnumbered event (see SEQUENCE_OUTBOX)."""
        if await fetch_value(conn, HAS_UNSEQUENCED):
            async with conn.transaction():
                head = await fetch_value(conn, LOCK_OUTBOX_HEAD)
                await conn.execute(SEQUENCE_OUTBOX, {"head": head})

    async def pending_threads(self, now: datetime, limit: int) -> list[str]:
        async def read(conn: Connection) -> list[str]:
            await self._sequence(conn)
            cur = await conn.execute(PENDING_THREADS, {"now": now, "limit": limit})
            return [row[0] for row in await cur.fetchall()]

        return await self._run(None, read)

    async def read_unpublished(self, thread_id: str, limit: int) -> list[OutboxDelivery]:
        async def read(conn: Connection) -> list[OutboxDelivery]:
            cur = await conn.execute(SELECT_UNPUBLISHED, (thread_id, limit))
            return [_delivery(row) for row in await cur.fetchall()]

        return await self._on_claim(thread_id, read)

    async def mark_published(self, thread_id: str, seqs: Sequence[int], at: datetime) -> None:
        params = {"at": at, "thread_id": thread_id, "seqs": list(seqs)}

        async def mark(conn: Connection) -> None:
            await conn.execute(MARK_PUBLISHED, params)

        await self._on_claim(thread_id, mark)

    async def mark_failed(
        self, thread_id: str, seq: int, attempts: int, error: str, retry_at: datetime
    ) -> None:
        async def mark(conn: Connection) -> None:
            await conn.execute(MARK_FAILED, (attempts, error, retry_at, thread_id, seq))

        await self._on_claim(thread_id, mark)

    async def outbox_backlog(self, failing_limit: int) -> OutboxBacklog:
        async def read(conn: Connection) -> OutboxBacklog:
            async with conn.transaction():  # one snapshot for the count and the failures
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                count, oldest = present(await (await conn.execute(SELECT_BACKLOG)).fetchone())
                cur = await conn.execute(SELECT_FAILING, (failing_limit,))
                failing = [_delivery(row) for row in await cur.fetchall()]
            return OutboxBacklog(count, None if oldest is None else _utc(oldest), failing)

        return await self._run(None, read)

    # -- deploy check, migration, retention ----------------------------------------------------

    async def scan_threads(
        self, after: str | None, limit: int, below_revision: int | None
    ) -> list[tuple[str, StoredThread]]:
        params = {"after": after or "", "below": below_revision, "limit": limit}

        async def read(conn: Connection) -> list[tuple[str, StoredThread]]:
            rows = await (await conn.execute(SCAN_THREADS, params)).fetchall()
            return [(row[0], _thread(*row[1:])) for row in rows]

        return await self._run(None, read)

    async def read_interactions(
        self, after: str | None, limit: int, owner: ThreadOwner | None
    ) -> list[tuple[str, StoredThread]]:
        params = {
            "after": after or "",
            "marker": INTERACTION_MARKER,
            "owned": owner is not None,
            "tenant": owner.tenant_id if owner else None,
            "limit": limit,
        }

        async def read(conn: Connection) -> list[tuple[str, StoredThread]]:
            rows = await (await conn.execute(SELECT_INTERACTIONS, params)).fetchall()
            return [(row[0], StoredThread(row[1], row[2], row[3])) for row in rows]

        return await self._run(None, read)

    async def rewrite_checkpoint(self, rewrite: CheckpointRewrite) -> None:
        thread_id, messages = rewrite.thread_id, list(rewrite.messages)

        async def write(conn: Connection) -> None:
            async with conn.transaction():
                cur = await conn.execute(
                    REWRITE_THREAD,
                    (
                        rewrite.checkpoint,
                        rewrite.schema_revision,
                        rewrite.fingerprint,
                        len(messages),
                        thread_id,
                        rewrite.version,
                    ),
                )
                returned = await cur.fetchone()
                if returned is None:
                    raise FencedCommitError(
                        f"thread {thread_id!r} moved on while its checkpoint was migrated",
                        thread_id=thread_id,
                    )
                await conn.execute(DELETE_MESSAGES, (thread_id,))
                first = returned[0] - len(messages) + 1
                await conn.execute(INSERT_MESSAGES, (thread_id, first, messages))
                await conn.execute(DELETE_FACTS, (thread_id,))
                keys = [key for key, _ in rewrite.facts]
                bodies = [body for _, body in rewrite.facts]
                await conn.execute(INSERT_FACTS, (thread_id, keys, bodies))

        await self._run(thread_id, write)

    async def prune_events(self, before: datetime, limit: int) -> int:
        async def prune(conn: Connection) -> int:
            await self._sequence(conn)  # only numbered events are deleted: number them
            return (await conn.execute(PRUNE_EVENTS, (before, limit))).rowcount

        return await self._run(None, prune)

    async def stale_journals(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> list[tuple[str, str]]:
        args = (*(after or ("", "")), before, limit)

        async def read(conn: Connection) -> list[tuple[str, str]]:
            cur = await conn.execute(STALE_JOURNALS, args)
            return [(row[0], row[1]) for row in await cur.fetchall()]

        return await self._run(None, read)

    async def prune_journal(self, thread_id: str, turn_id: str, before: datetime) -> int:
        params = {"thread_id": thread_id, "turn_id": turn_id, "before": before}

        async def prune(conn: Connection) -> int:
            return (await conn.execute(PRUNE_JOURNAL, params)).rowcount

        return await self._run(thread_id, prune)

    async def prune_turns(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> tuple[int, tuple[str, str] | None]:
        start = after or ("", "")

        async def prune(conn: Connection) -> tuple[int, tuple[str, str] | None]:
            cur = await conn.execute(PRUNE_TURNS, (*start, before, limit))
            keys = [(row[0], row[1]) for row in await cur.fetchall()]
            return len(keys), (max(keys) if len(keys) == limit else None)

        return await self._run(None, prune)


def _thread(
    version: int,
    tenant_id: str | None,
    checkpoint: str | None,
    messages: list[str] | None,
    facts: list[list[str]] | None,
) -> StoredThread:
    return stored_thread(version, tenant_id, checkpoint, messages, facts)


async def _insert_events(
    conn: Connection,
    thread_id: str,
    turn_id: str | None,
    events: Sequence[EventDraft],
    next_seq: int,
    now: datetime,
) -> None:
    """Append ``events``, numbered to end just before the thread's new ``next_seq``."""
    first = next_seq - len(events)
    rows = [
        (e.id, thread_id, turn_id, first + i, e.type, dump_value(e.payload), now)
        for i, e in enumerate(events)
    ]
    async with conn.cursor() as cur:
        await cur.executemany(INSERT_EVENT, rows)


def _receipt_params(r: Receipt) -> dict[str, Any]:
    """The receipt's columns as stored here: times as ``timestamptz``."""
    return receipt_params(r, _same)


def _same(moment: datetime) -> datetime:
    return moment


def _settle_again(new: Receipt, expected: Receipt) -> Callable[[Connection], Awaitable[None]]:
    """The receipt write ``new`` over ``expected``, safe to repeat: a write found applied
    already (its acknowledgement lost with a session) is not refused as a conflict."""

    async def write(conn: Connection) -> None:
        try:
            await _update_receipt(conn, new, expected)
        except FencedCommitError:
            cur = await execute(conn, SELECT_RECEIPT, (new.thread_id, new.key))
            stored = _receipt(await cur.fetchone())
            if stored is None or (stored.status, stored.attempt, stored.updated_at) != (
                new.status,
                new.attempt,
                new.updated_at,
            ):
                raise

    return write


async def _update_receipt(conn: Connection, new: Receipt, expected: Receipt) -> None:
    write = receipt_write(new, expected, _same)
    statement = SETTLE_RECEIPT if write.settles else UPDATE_RECEIPT
    write.check((await execute(conn, statement, write.params)).rowcount)


def _receipt(row: Sequence[Any] | None) -> Receipt | None:
    return decode_receipt_row(row, _utc)


def _event(row: Sequence[Any]) -> OutboxEvent:
    return decode_event_row(row, _utc)


def _delivery(row: Sequence[Any]) -> OutboxDelivery:
    return decode_delivery_row(row, _utc)


def _utc(value: datetime) -> datetime:
    # timestamptz comes back in the session's time zone; normalize as utcnow() does.
    return value.astimezone(UTC)
