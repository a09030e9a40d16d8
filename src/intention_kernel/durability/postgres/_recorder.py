"""The PostgreSQL recorder: the storage contract's reads and writes, as statements.

Transactions per turn:

- one to take the lease and read.
- one statement per effect state change.
- one commit for result + checkpoint + events, which also releases the lease.

A turn that records model rounds adds one read of its journal. It adds one statement
per round recorded. A turn longer than a third of the lease's expiry adds a renewal
per third. Each borrows a pooled session for one statement. No session is held while
the model or a provider call runs.

Every write a turn makes under its lease is fenced by it (``FENCE``), but one. The
outcome of a provider call is fenced by the attempt that prepared it
(``SETTLE_RECEIPT``). So it is recorded even after the lease was lost.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Coroutine, Sequence
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

from psycopg.errors import UniqueViolation

from intention_kernel import _faults
from intention_kernel._effects import EffectPlan, Receipt, ReceiptStatus, utcnow
from intention_kernel._json import dump_value
from intention_kernel._turns import EventDraft, OutboxEvent
from intention_kernel.durability._contract.ownership import ANY_TENANT, cancel_scope
from intention_kernel.durability._engine.effect_calls import shielded
from intention_kernel.durability._layout.rows import (
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
from intention_kernel.durability._layout.timer_rows import (
    decode_timer,
    split_writes,
    timer_filters,
    timer_json,
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
from intention_kernel.durability.postgres._leases import AHEAD, NO_LEASE, PostgresLeases
from intention_kernel.durability.postgres._schema import (
    BEGIN_TURN,
    COMMIT_TURN,
    PREPARE_RECEIPT,
    turn_start,
)
from intention_kernel.durability.postgres._sessions import (
    Connection,
    TextArray,
    execute,
    fetch_value,
    present,
)
from intention_kernel.durability.postgres._statements import (
    BUMP_THREAD_SEQ,
    CLAIM_TIMERS,
    DELETE_FACTS,
    DELETE_INBOX,
    DELETE_MESSAGES,
    DELETE_TIMER,
    DEQUEUE_UNSTARTED,
    HAS_UNSEQUENCED,
    HOLD_LEASE,
    INBOX_POSITION,
    INSERT_CANCEL,
    INSERT_EVENT,
    INSERT_FACTS,
    INSERT_INBOX,
    INSERT_INTERRUPT,
    INSERT_JOURNAL,
    INSERT_JOURNAL_STREAMED,
    INSERT_MESSAGES,
    INSERT_RECEIPT,
    LEASE_HELD,
    LOCK_OUTBOX_HEAD,
    MARK_FAILED,
    MARK_PUBLISHED,
    PENDING_THREADS,
    PRUNE_CANCELS,
    PRUNE_EVENTS,
    PRUNE_INTERRUPTS,
    PRUNE_JOURNAL,
    PRUNE_TIMERS,
    PRUNE_TURNS,
    RELEASE_STEER,
    REWRITE_THREAD,
    SCAN_THREADS,
    SELECT_BACKLOG,
    SELECT_CANCEL_OWNER,
    SELECT_CANCELS,
    SELECT_FAILING,
    SELECT_INBOX,
    SELECT_INBOX_ENTRY,
    SELECT_INBOX_TENANT,
    SELECT_INTERACTIONS,
    SELECT_JOURNAL,
    SELECT_JOURNAL_ENTRY,
    SELECT_OUTBOX,
    SELECT_RECEIPT,
    SELECT_STARTED,
    SELECT_STREAM,
    SELECT_STREAM_TURN,
    SELECT_TAKEN,
    SELECT_TAKER,
    SELECT_THREAD,
    SELECT_TIMER,
    SELECT_TIMERS,
    SELECT_TURN_EXISTS,
    SELECT_UNPUBLISHED,
    SELECT_VERSION,
    SEQUENCE_OUTBOX,
    SETTLE_RECEIPT,
    STALE_JOURNALS,
    START_QUEUED,
    TAKE_STEERS,
    UPDATE_RECEIPT,
    UPSERT_TIMER,
    receipts_query,
)
from intention_kernel.errors import FencedCommitError, LeaseLostError

__all__ = ["PostgresRecorder"]


#: A ``TurnRecord``'s field names, and a getter of their values in that order: the
#: commit's parameters start from them. Walking ``fields(record)`` at each commit cost
#: about fifty calls a turn (a generator step and a ``getattr`` per field).
_RECORD_FIELDS = tuple(f.name for f in fields(TurnRecord))
_record_values = operator.attrgetter(*_RECORD_FIELDS)
#: How often one claim reads and plans again after its receipt moved.
#: Under a held lease only a late settlement moves it, once per stopped attempt.
CLAIM_MOVES = 3


#: A stop check: thread, turn, the asker's cancel scope, the turn's base version.
_CancelAsk = tuple[str, str, str, int]
#: What it finds: ``("cancel", reason)``, ``("interrupt", None)`` or ``(None, None)``.
_CancelAnswer = asyncio.Future[tuple[str | None, str | None]]


class PostgresRecorder(PostgresLeases, Recorder, InboxRecorder, StreamRecorder, TimerRecorder):
    # A lease can be lost while its worker's provider call still runs. It lapsed while
    # its worker was paused, or the worker lost the server. So a ``prepared`` receipt
    # under a lease may be a live attempt's. ``write_receipt`` finishes its write when
    # cancelled: it writes again, in a task of its own (see there).
    options = RecorderOptions(finishes_writes_when_cancelled=True, attempts_outlive_lock=True)
    # Stop checks that came while one was read, to read together next (``None``: no
    # read in flight). See ``read_cancel``.
    _cancel_reads: list[tuple[_CancelAsk, _CancelAnswer]] | None = None

    # -- turns ---------------------------------------------------------------------------------

    async def begin_turn(
        self, thread_id: str, turn_id: str, known_version: int | None
    ) -> TurnStart:
        params = {"thread_id": thread_id, "turn_id": turn_id, "known_version": known_version}

        async def read(conn: Connection) -> TurnStart:
            cur = await execute(conn, self._q(BEGIN_TURN), params)
            return turn_start(present(await cur.fetchone())[1:])

        return await self._run(read)

    async def read_thread(self, thread_id: str) -> StoredThread | None:
        async def read(conn: Connection) -> StoredThread | None:
            cur = await conn.execute(self._q(SELECT_THREAD), {"thread_id": thread_id})
            row = await cur.fetchone()
            return None if row is None else _thread(*row)

        return await self._run(read)

    def commit_turn(self, record: TurnRecord) -> Coroutine[Any, Any, None]:
        # Not a coroutine function: it returns ``_run``'s coroutine. Its caller awaits
        # it at once, and no frame of ours is resumed when the statement's answer comes.
        rows = record.rows
        # Every part's input, an empty array as NULL (see COMMIT_TURN).
        params = dict(zip(_RECORD_FIELDS, _record_values(record), strict=True))
        params.update(
            first=record.expected_version == 0,
            checkpoint=rows.core,
            keep_messages=rows.keep_messages,
            trim_messages=rows.trim_messages,
            rewrite=rows.rewrite,
            event_ids=TextArray([e.id for e in record.events]) or None,
            event_types=TextArray([e.type for e in record.events]) or None,
            event_payloads=TextArray([dump_value(e.payload) for e in record.events]) or None,
            messages=TextArray(rows.messages) or None,
            fact_keys=TextArray([key for key, _ in rows.facts]) or None,
            fact_bodies=TextArray([body for _, body in rows.facts]) or None,
            removed_facts=TextArray(rows.removed_facts) or None,
            announced=TextArray(record.announced) or None,
            mark_announced=TextArray(record.mark_announced) or None,
            timer_rows=(
                timer_json(record.timers)
                if any(w.timer is not None for w in record.timers)
                else None
            ),
            timer_deletes=[w.key for w in record.timers if w.timer is None] or None,
        )
        del params["rows"], params["events"], params["timers"]
        statement = self._sql[COMMIT_TURN]
        lease = self.turn_lease(record.thread_id)
        # ``lease_params``, from the lease just read.
        params.update(
            lease.params if lease is not None else {"thread_id": record.thread_id, **NO_LEASE}
        )

        async def commit(conn: Connection) -> None:
            if _faults.armed:  # as the one-statement commit transaction is sent
                _faults.reach(_faults.DURING_COMMIT)
            try:
                row = await (await execute(conn, statement, params)).fetchone()
            except UniqueViolation as exc:
                if exc.diag.constraint_name == "ik_turns_pkey":
                    raise fenced(record, "the turn ID was committed by another worker") from exc
                raise
            next_seq, leased = present(row)
            if not leased:
                raise lease_lost(record)
            if next_seq is None:
                raise fenced(record, "the thread version moved")
            if lease is not None:
                lease.committed = True  # the statement released it

        # Not repeated on another session if this one breaks: the commit may have
        # landed, and the turn then raises StoreError. Its redelivery finds the turn
        # row and replays it, or runs the turn again if nothing landed.
        return self._run(commit, repeat=False)

    # -- timers --------------------------------------------------------------------------------

    async def write_timers(
        self, thread_id: str, writes: Sequence[TimerWrite], events: Sequence[EventDraft]
    ) -> None:
        lease = self.lease_params(thread_id)
        upserts, deletes = split_writes(writes, _same)

        async def write(conn: Connection) -> None:
            async with conn.transaction():
                # The lease first, its row locked to the end of the transaction. A
                # caller whose lease lapsed writes nothing: a turn may hold the thread.
                if not await fetch_value(conn, self._q(HOLD_LEASE), lease):
                    raise LeaseLostError(
                        f"the timers of thread {thread_id!r} were not written: the "
                        "thread's lease was lost",
                        thread_id=thread_id,
                    )
                async with conn.cursor() as cur:
                    if upserts:
                        await cur.executemany(self._q(UPSERT_TIMER), upserts)
                    if deletes:
                        await cur.executemany(self._q(DELETE_TIMER), deletes)
                now = utcnow()
                for event in events:
                    next_seq = await fetch_value(conn, self._q(BUMP_THREAD_SEQ), thread_id, now)
                    await self._insert_events(conn, thread_id, None, [event], next_seq, now)

        await self._run(write, repeat=False)

    async def read_timer(self, thread_id: str, key: str) -> Timer | None:
        async def read(conn: Connection) -> Timer | None:
            cur = await conn.execute(self._q(SELECT_TIMER), (thread_id, key))
            row = await cur.fetchone()
            return None if row is None else decode_timer(row, _same)

        return await self._run(read)

    async def read_timers(
        self, thread_id: str | None, status: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[Timer]:
        params = timer_filters(thread_id, status, after, limit)

        async def read(conn: Connection) -> list[Timer]:
            rows = await (await conn.execute(self._q(SELECT_TIMERS), params)).fetchall()
            return [decode_timer(row, _same) for row in rows]

        return await self._run(read)

    async def claim_timers(self, now: datetime, until: datetime, limit: int) -> list[Timer]:
        params = {"now": now, "until": until, "limit": limit}

        async def claim(conn: Connection) -> list[Timer]:
            rows = await (await conn.execute(self._q(CLAIM_TIMERS), params)).fetchall()
            return [decode_timer(row, _same) for row in rows]

        # Not repeated on another session. A claim that landed is not claimed again
        # until it ends. So a repeat would return nothing for those rows.
        return await self._run(claim, repeat=False)

    async def prune_timers(self, before: datetime, limit: int) -> int:
        async def prune(conn: Connection) -> int:
            return (await conn.execute(self._q(PRUNE_TIMERS), (before, limit))).rowcount

        return await self._run(prune)

    # -- the journal -------------------------------------------------------------------------

    async def read_journal(self, thread_id: str, turn_id: str) -> list[JournalEntry]:
        async def read(conn: Connection) -> list[JournalEntry]:
            cur = await execute(conn, self._q(SELECT_JOURNAL), (thread_id, turn_id))
            return [
                JournalEntry(thread_id, turn_id, key, digest, value, _utc(created_at), tenant)
                for key, digest, value, created_at, tenant in await cur.fetchall()
            ]

        return await self._run(read)

    async def write_journal(self, entry: JournalEntry) -> None:
        params = {
            **self.lease_params(entry.thread_id),
            "turn_id": entry.turn_id,
            "key": entry.key,
            "request_digest": entry.request_digest,
            "value": entry.value,
            "created_at": entry.created_at,
            "tenant_id": entry.tenant_id,
        }
        statement = INSERT_JOURNAL
        if entry.stream is not None:
            statement = INSERT_JOURNAL_STREAMED
            params["segment"], params["events"] = entry.stream
        tries = 0

        async def write(conn: Connection) -> None:
            # One statement, fenced by the lease: no entry is written without it.
            nonlocal tries
            tries += 1
            try:
                leased, _ = present(
                    await (await execute(conn, self._q(statement), params)).fetchone()
                )
            except UniqueViolation as exc:
                if exc.diag.constraint_name != "ik_journal_pkey":
                    raise
                if tries > 1 and await self._journaled(conn, entry):
                    return  # this very write, applied before its session broke
                raise journal_conflict(entry) from exc
            if not leased:
                raise LeaseLostError(
                    f"journal entry {entry.key!r} of turn {entry.turn_id!r} on thread "
                    f"{entry.thread_id!r} was not recorded: the turn's lease was lost",
                    thread_id=entry.thread_id,
                    turn_id=entry.turn_id,
                    key=entry.key,
                )

        await self._run(write)

    async def read_stream(self, thread_id: str, turn_id: str) -> StoredStream:
        async def read(conn: Connection) -> StoredStream:
            # The turn first: once it is committed, no segment is written after it.
            cur = await execute(conn, self._q(SELECT_STREAM_TURN), (thread_id, turn_id))
            found = await cur.fetchone()
            turn = None if found is None else StoredTurn(found[0], found[1], bool(found[2]))
            cur = await execute(conn, self._q(SELECT_STREAM), (thread_id, turn_id))
            segments = tuple((int(n), str(e)) for n, e in await cur.fetchall())
            return StoredStream(turn, segments)

        return await self._run(read)

    async def _journaled(self, conn: Connection, entry: JournalEntry) -> bool:
        cur = await conn.execute(
            self._q(SELECT_JOURNAL_ENTRY), (entry.thread_id, entry.turn_id, entry.key)
        )
        row = await cur.fetchone()
        return row is not None and (row[0], row[1], row[2], row[3]) == (
            entry.request_digest,
            entry.value,
            entry.created_at,
            entry.tenant_id,
        )

    # -- the inbox -----------------------------------------------------------------------------

    # Pooled sessions, one statement or transaction at a time. A message is accepted
    # while another turn, maybe of this process, holds the thread's lease.

    async def enqueue(self, entry: InboxEntry) -> int | None:
        row = (
            entry.thread_id,
            entry.turn_id,
            entry.tenant_id,
            entry.request_digest,
            entry.request,
            entry.created_at,
            entry.steer,
        )
        key = (entry.thread_id, entry.turn_id)

        async def write(conn: Connection) -> int | None:
            # One transaction: the committed-turn check, the insert and the count.
            # Repeated after a lost acknowledgement, it finds its own entry.
            async with conn.transaction():
                if await (await execute(conn, self._q(SELECT_TURN_EXISTS), key)).fetchone():
                    return None
                inserted = await (await execute(conn, self._q(INSERT_INBOX), row)).fetchone()
                if inserted is None:
                    seq, digest = present(
                        await (await execute(conn, self._q(SELECT_INBOX_ENTRY), key)).fetchone()
                    )
                    if (
                        entry.request_digest is not None
                        and digest is not None
                        and digest != entry.request_digest
                    ):
                        raise inbox_conflict(entry)
                else:
                    seq = inserted[0]
                position: int = await fetch_value(
                    conn, self._q(INBOX_POSITION), entry.thread_id, seq
                )
                return position

        return await self._run(write)

    async def read_inbox(self, thread_id: str) -> list[InboxEntry]:
        async def read(conn: Connection) -> list[InboxEntry]:
            cur = await execute(conn, self._q(SELECT_INBOX), (thread_id,))
            return decode_inbox_rows(thread_id, await cur.fetchall(), _utc)

        return await self._run(read)

    async def taker(self, thread_id: str, turn_id: str) -> str | None:
        async def read(conn: Connection) -> str | None:
            cur = await execute(conn, self._q(SELECT_TAKER), (thread_id, turn_id))
            row = await cur.fetchone()
            return None if row is None else str(row[0])

        return await self._run(read)

    async def take_steers(self, thread_id: str, turn_id: str) -> list[InboxEntry]:
        async def take(conn: Connection) -> list[InboxEntry]:
            # One transaction: a repeat after a lost acknowledgement reads the same.
            async with conn.transaction():
                params = {"thread": thread_id, "turn": turn_id}
                await execute(conn, self._q(TAKE_STEERS), params)
                cur = await execute(conn, self._q(SELECT_TAKEN), (thread_id, turn_id))
                return decode_inbox_rows(thread_id, await cur.fetchall(), _utc)

        return await self._run(take)

    async def release_steer(self, thread_id: str, turn_id: str, taken_by: str) -> bool:
        params = {"thread": thread_id, "turn": turn_id, "taker": taken_by}
        params.update(self.lease_params(thread_id))

        async def write(conn: Connection) -> bool:
            cur = await execute(conn, self._q(RELEASE_STEER), params)
            return cur.rowcount == 1

        return await self._run(write)

    async def remove_inbox(self, thread_id: str, turn_id: str) -> bool:
        async def write(conn: Connection) -> bool:
            cur = await execute(conn, self._q(DELETE_INBOX), (thread_id, turn_id))
            return cur.rowcount == 1

        return await self._run(write)

    async def request_cancel(
        self,
        thread_id: str,
        turn_id: str,
        reason: str | None,
        at: datetime,
        owner: ThreadOwner | None = None,
    ) -> str:
        key = (thread_id, turn_id)
        scope = ANY_TENANT if owner is None else cancel_scope(owner.tenant_id)

        async def write(conn: Connection) -> str:
            # One transaction: the owner and committed-turn checks, the request and the
            # dequeue.
            async with conn.transaction():
                if owner is not None:
                    found = await fetch_value(conn, self._q(SELECT_CANCEL_OWNER), {"t": thread_id})
                    if found is not None and found[0] != owner.tenant_id:
                        return "not-found"
                if await (await execute(conn, self._q(SELECT_TURN_EXISTS), key)).fetchone():
                    return "committed"
                if owner is not None:
                    cur = await execute(conn, self._q(SELECT_INBOX_TENANT), key)
                    queued = await cur.fetchone()
                    if queued is not None and queued[0] != owner.tenant_id:
                        return "not-found"
                row = (thread_id, turn_id, reason, at, scope)
                await execute(conn, self._q(INSERT_CANCEL), row)
                params = {"thread": thread_id, "turn": turn_id}
                removed = (await execute(conn, self._q(DEQUEUE_UNSTARTED), params)).rowcount
                return "dequeued" if removed else "requested"

        return await self._run(write)

    async def thread_version(self, thread_id: str) -> int:
        async def read(conn: Connection) -> int:
            row = await (await execute(conn, self._q(SELECT_VERSION), (thread_id,))).fetchone()
            return int(row[0]) if row is not None else 0

        return await self._run(read)

    async def request_interrupt(
        self, thread_id: str, base_version: int, at: datetime, turn_id: str, tenant_id: str | None
    ) -> None:
        params = {
            "thread": thread_id,
            "base": base_version,
            "turn": turn_id,
            "scope": cancel_scope(tenant_id),
            "at": at,
        }

        async def write(conn: Connection) -> None:
            await execute(conn, self._q(INSERT_INTERRUPT), params)

        await self._run(write)

    async def start_queued(
        self, thread_id: str, turn_id: str, base_version: int, tenant_id: str | None = None
    ) -> tuple[str | None, str | None]:
        params = {"thread": thread_id, "turn": turn_id}
        ask = (thread_id, turn_id, cancel_scope(tenant_id), base_version)

        async def write(conn: Connection) -> tuple[str | None, str | None]:
            async with conn.transaction():  # the mark, then the read: one transaction
                started = await (await execute(conn, self._q(SELECT_STARTED), params)).fetchone()
                if started is not None and started[0]:  # started before; its process died
                    return None, None
                await execute(conn, self._q(START_QUEUED), params)
                return (await self._found_cancels(conn, [ask]))[0]

        return await self._run(write)

    async def read_cancel(
        self, thread_id: str, turn_id: str, base_version: int, tenant_id: str | None = None
    ) -> tuple[str | None, str | None]:
        """Each safe point of a turn past ``cancel_check_after`` asks this.

        Asks that come while a read is in flight go out together, in one statement,
        once it ends. A batch is sent after each of its asks came, so it sees every
        cancel recorded before. With many turns in flight this spares the pool most
        of these statements: two of a turn's six, with a model of a second."""
        ask = (thread_id, turn_id, cancel_scope(tenant_id), base_version)
        if self._cancel_reads is None:  # no read in flight: this one, alone
            self._cancel_reads = []
            try:
                return (await self._read_cancels([ask]))[0]
            finally:
                self._next_cancel_reads()
        answer: _CancelAnswer = asyncio.get_running_loop().create_future()
        self._cancel_reads.append((ask, answer))
        return await answer

    def _next_cancel_reads(self) -> None:
        """The read in flight ended: send the asks that came meanwhile, in one."""
        waiting, self._cancel_reads = self._cancel_reads or [], None
        waiting = [(ask, answer) for ask, answer in waiting if not answer.done()]
        if waiting:
            self._cancel_reads = []
            self._in_background(self._answer_cancel_reads(waiting))

    async def _answer_cancel_reads(self, waiting: list[tuple[_CancelAsk, _CancelAnswer]]) -> None:
        AHEAD.set(True)  # one short read that lets many turns go on: ahead, as a start
        try:
            found = await self._read_cancels([ask for ask, _ in waiting])
        except BaseException as exc:
            for _, answer in waiting:
                if answer.done():
                    continue
                if isinstance(exc, Exception):
                    answer.set_exception(exc)
                else:  # cancelled: the adapter closes; the askers are cancelled too
                    answer.cancel()
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, answer), one in zip(waiting, found, strict=True):
                if not answer.done():
                    answer.set_result(one)
        finally:
            self._next_cancel_reads()

    async def _read_cancels(self, asks: list[_CancelAsk]) -> list[tuple[str | None, str | None]]:
        async def read(conn: Connection) -> list[tuple[str | None, str | None]]:
            return await self._found_cancels(conn, asks)

        return await self._run(read)

    async def _found_cancels(
        self, conn: Connection, asks: list[_CancelAsk]
    ) -> list[tuple[str | None, str | None]]:
        """What each ask's turn should stop for, in one statement: a cancel and its
        reason, an interrupt, or nothing."""
        threads, turns, scopes, bases = zip(*asks, strict=True)
        params = {
            "threads": TextArray(threads),
            "turns": TextArray(turns),
            "scopes": TextArray(scopes),
            "bases": list(bases),
        }
        rows = await (await execute(conn, self._q(SELECT_CANCELS), params)).fetchall()
        found: list[tuple[str | None, str | None]] = [(None, None)] * len(asks)
        for i, kind, reason in rows:
            found[i - 1] = ("cancel", reason) if kind == 0 else ("interrupt", None)
        return found

    # -- effects -------------------------------------------------------------------------------

    def claim_effect(
        self, thread_id: str, key: str, plan: PlanFn
    ) -> Coroutine[Any, Any, EffectPlan]:
        # Returns ``_run``'s coroutine, as ``commit_turn`` does.
        lease = self.lease_params(thread_id)
        # Planned once, outside the hop. A hop repeated after its session broke then
        # recognizes its own receipt (same ID). It does not take it for another's.
        first = plan(None)
        tries = 0

        async def claim(conn: Connection) -> EffectPlan:
            nonlocal tries
            tries += 1
            # Most keys are new: try what a first call writes, and read only if a
            # receipt was there already.
            if first.write is not None:
                params = {**_receipt_params(first.write), **lease}
                row = await (await execute(conn, self._sql[PREPARE_RECEIPT], params)).fetchone()
                leased, written = present(row)
                if not leased:
                    raise receipt_lease_lost(thread_id, key)
                if written:
                    return first
            # No wrapping transaction: the write is one statement. Its primary key
            # (insert) or compare-and-set (update) refuses it if anyone wrote the
            # receipt since the read. Under the lease, one writer still may: a worker
            # stopped past its lease wakes and settles its own attempt (unfenced).
            # Its outcome is a fact, so the claim reads it and plans again.
            # The claim then takes effect at its last read or at its write.
            moves, own = 0, first.write
            while True:
                cur = await execute(conn, self._q(SELECT_RECEIPT), (thread_id, key))
                existing = _receipt(await cur.fetchone())
                if tries > 1 and own is not None and existing is not None and existing.id == own.id:
                    return first  # this hop's own insert, applied before its session broke
                # A new receipt keeps ``first``'s ID, so a repeated hop knows its insert.
                decided = first if existing is None else plan(existing)
                if decided.write is None:
                    return decided
                try:
                    await self._write_planned(conn, decided.write, existing, lease)
                except LeaseLostError:
                    raise
                except FencedCommitError:
                    # A repeated hop may find its own write applied: not a move.
                    if tries > 1 and await self._stored(conn, decided.write):
                        return decided
                    moves += 1
                    if moves > CLAIM_MOVES:
                        raise
                    continue
                return decided

        return self._run(claim)

    async def _write_planned(
        self, conn: Connection, new: Receipt, existing: Receipt | None, lease: dict[str, Any]
    ) -> None:
        """Write a claim's planned receipt over ``existing``, or as a new row.

        Both are fenced by ``lease``.
        Both raise ``FencedCommitError`` if the receipt moved since it was read.
        """
        if existing is not None:
            await self._fenced_update(conn, new, existing, lease)
            return
        try:
            row = await (
                await execute(conn, self._q(INSERT_RECEIPT), {**_receipt_params(new), **lease})
            ).fetchone()
        except UniqueViolation as exc:
            if exc.diag.constraint_name == "ik_receipts_pkey":
                raise receipt_moved(new) from exc
            raise
        if not present(row)[0]:
            raise receipt_lease_lost(new.thread_id, new.key)

    async def _fenced_update(
        self, conn: Connection, new: Receipt, expected: Receipt, lease: dict[str, Any]
    ) -> None:
        """Write every column of ``new`` over ``expected``, fenced by ``lease``."""
        params = {
            **receipt_params(new, _same),
            "expected_status": expected.status.value,
            "expected_attempt": expected.attempt,
            **lease,
        }
        leased, written = present(
            await (await execute(conn, self._q(UPDATE_RECEIPT), params)).fetchone()
        )
        if not leased:
            raise receipt_lease_lost(new.thread_id, new.key)
        if written != 1:
            raise receipt_moved(new)

    async def _stored(self, conn: Connection, receipt: Receipt) -> bool:
        """Whether the stored receipt is ``receipt`` (its ID, status, attempt and time)."""
        cur = await execute(conn, self._q(SELECT_RECEIPT), (receipt.thread_id, receipt.key))
        stored = _receipt(await cur.fetchone())
        return stored is not None and (
            stored.id,
            stored.status,
            stored.attempt,
            stored.updated_at,
        ) == (receipt.id, receipt.status, receipt.attempt, receipt.updated_at)

    async def write_receipt(self, receipt: Receipt, expected: Receipt) -> None:
        write = receipt_write(receipt, expected, _same)
        if not write.settles:
            lease = self.lease_params(receipt.thread_id)

            async def rewrite(conn: Connection) -> None:
                await self._fenced_update(conn, receipt, expected, lease)

            # Not repeatable: a task of its own, which a cancellation does not stop.
            await shielded(self._run(rewrite, repeat=False))
            return
        # The lease this turn holds now: a refusal is judged against it, not a later one.
        lease = self.lease_params(receipt.thread_id)
        tries = 0

        async def settle(conn: Connection) -> None:
            # The outcome of this attempt, fenced by the attempt and not by the lease
            # (see SETTLE_RECEIPT). A provider call that returns after the lease was
            # lost is still recorded. The exception: the next holder made the receipt
            # uncertain first. Then the write is refused, and the receipt stays as the
            # next holder left it. The turn cannot commit, its lease being gone.
            nonlocal tries
            tries += 1
            try:
                write.check((await execute(conn, self._sql[SETTLE_RECEIPT], write.params)).rowcount)
            except FencedCommitError as refused:
                # A repeat of a write whose acknowledgement was lost with its session
                # finds it applied: not a conflict.
                if tries > 1 and await self._stored(conn, receipt):
                    return
                # Only a holder that lost its lease can find its receipt moved. The
                # next holder (or an operator) took the thread first. Under a live
                # lease the refusal is a real conflict, and stays one.
                if not await fetch_value(conn, self._q(LEASE_HELD), lease):
                    raise settle_lease_lost(receipt) from refused
                raise

        # In the caller's task: a task of its own for every outcome cost a turn about
        # fifty calls. psycopg cancels a statement whose caller is cancelled, so the
        # write may or may not have landed then. It is written again in a task of its
        # own, which a cancellation does not stop. A repeat finds its own write applied
        # (``tries``). Then the cancellation goes on.
        try:
            await self._run(settle)
        except asyncio.CancelledError:
            await shielded(self._run(settle))
            raise

    async def read_receipts(
        self, thread_id: str | None, status: ReceiptStatus | None, tenant_id: str | None = None
    ) -> list[Receipt]:
        query, filters = receipts_query(thread_id, status, tenant_id)

        async def read(conn: Connection) -> list[Receipt]:
            rows = await (await conn.execute(self._q(query), filters)).fetchall()
            return [present(_receipt(row)) for row in rows]

        return await self._run(read)

    async def resolve_receipt(self, thread_id: str, key: str, resolution: ResolutionFn) -> Receipt:
        lease = self.lease_params(thread_id)

        async def apply(conn: Connection) -> Receipt:
            async with conn.transaction():
                # The lease first, its row locked to the end of the transaction: an
                # operator whose lease lapsed resolves nothing.
                if not await fetch_value(conn, self._q(HOLD_LEASE), lease):
                    raise LeaseLostError(
                        f"receipt {key!r} on thread {thread_id!r} was not resolved: the "
                        "thread's lease was lost",
                        thread_id=thread_id,
                        key=key,
                    )
                cur = await conn.execute(self._q(SELECT_RECEIPT), (thread_id, key))
                existing = _receipt(await cur.fetchone())
                resolved, event = resolution(existing)
                await self._fenced_update(conn, resolved, present(existing), lease)
                now = utcnow()
                next_seq = await fetch_value(conn, self._q(BUMP_THREAD_SEQ), thread_id, now)
                await self._insert_events(conn, thread_id, None, [event], next_seq, now)
                return resolved

        return await self._run(apply, repeat=False)

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
            if await fetch_value(conn, self._q(HAS_UNSEQUENCED)):
                async with conn.transaction():
                    head = await fetch_value(conn, self._q(LOCK_OUTBOX_HEAD))
                    await conn.execute(self._q(SEQUENCE_OUTBOX), {"head": head})
            return [
                _event(row) for row in await (await conn.execute(self._q(query), args)).fetchall()
            ]

        return await self._run(read)

    async def _sequence(self, conn: Connection) -> None:
        """Number every committed, unnumbered event (see SEQUENCE_OUTBOX)."""
        if await fetch_value(conn, self._q(HAS_UNSEQUENCED)):
            async with conn.transaction():
                head = await fetch_value(conn, self._q(LOCK_OUTBOX_HEAD))
                await conn.execute(self._q(SEQUENCE_OUTBOX), {"head": head})

    async def pending_threads(self, now: datetime, limit: int) -> list[str]:
        async def read(conn: Connection) -> list[str]:
            await self._sequence(conn)
            cur = await conn.execute(self._q(PENDING_THREADS), {"now": now, "limit": limit})
            return [row[0] for row in await cur.fetchall()]

        return await self._run(read)

    async def read_unpublished(self, thread_id: str, limit: int) -> list[OutboxDelivery]:
        async def read(conn: Connection) -> list[OutboxDelivery]:
            cur = await conn.execute(self._q(SELECT_UNPUBLISHED), (thread_id, limit))
            return [_delivery(row) for row in await cur.fetchall()]

        return await self._run(read)

    async def mark_published(self, thread_id: str, seqs: Sequence[int], at: datetime) -> None:
        params = {**self.claim_params(thread_id), "at": at, "seqs": list(seqs)}

        async def mark(conn: Connection) -> None:
            await conn.execute(self._q(MARK_PUBLISHED), params)

        await self._run(mark)

    async def mark_failed(
        self, thread_id: str, seq: int, attempts: int, error: str, retry_at: datetime
    ) -> None:
        async def mark(conn: Connection) -> None:
            params = {
                **self.claim_params(thread_id),
                "attempts": attempts,
                "error": error,
                "retry_at": retry_at,
                "seq": seq,
            }
            await conn.execute(self._q(MARK_FAILED), params)

        await self._run(mark)

    async def outbox_backlog(self, failing_limit: int) -> OutboxBacklog:
        async def read(conn: Connection) -> OutboxBacklog:
            async with conn.transaction():  # one snapshot for the count and the failures
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                count, oldest = present(
                    await (await conn.execute(self._q(SELECT_BACKLOG))).fetchone()
                )
                cur = await conn.execute(self._q(SELECT_FAILING), (failing_limit,))
                failing = [_delivery(row) for row in await cur.fetchall()]
            return OutboxBacklog(count, None if oldest is None else _utc(oldest), failing)

        return await self._run(read)

    # -- deploy check, migration, retention ----------------------------------------------------

    async def scan_threads(
        self, after: str | None, limit: int, below_revision: int | None
    ) -> list[tuple[str, StoredThread]]:
        params = {"after": after or "", "below": below_revision, "limit": limit}

        async def read(conn: Connection) -> list[tuple[str, StoredThread]]:
            rows = await (await conn.execute(self._q(SCAN_THREADS), params)).fetchall()
            return [(row[0], _thread(*row[1:])) for row in rows]

        return await self._run(read)

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
            rows = await (await conn.execute(self._q(SELECT_INTERACTIONS), params)).fetchall()
            return [(row[0], StoredThread(row[1], row[2], row[3])) for row in rows]

        return await self._run(read)

    async def rewrite_checkpoint(self, rewrite: CheckpointRewrite) -> None:
        thread_id, rows = rewrite.thread_id, rewrite.rows
        messages = list(rows.messages)

        lease = self.turn_lease(thread_id)

        async def write(conn: Connection) -> None:
            async with conn.transaction():
                # Under a lease (a migration holds one), fenced by it as well.
                if lease is not None and not await fetch_value(
                    conn, self._q(HOLD_LEASE), lease.params
                ):
                    raise LeaseLostError(
                        f"thread {thread_id!r} was not migrated: its lease was lost",
                        thread_id=thread_id,
                    )
                cur = await conn.execute(
                    self._q(REWRITE_THREAD),
                    (
                        rows.core,
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
                await conn.execute(self._q(DELETE_MESSAGES), (thread_id,))
                first = returned[0] - len(messages) + 1
                await conn.execute(self._q(INSERT_MESSAGES), (thread_id, first, messages))
                await conn.execute(self._q(DELETE_FACTS), (thread_id,))
                keys = [key for key, _ in rows.facts]
                bodies = [body for _, body in rows.facts]
                await conn.execute(self._q(INSERT_FACTS), (thread_id, keys, bodies))

        await self._run(write)

    async def prune_events(self, before: datetime, limit: int) -> int:
        async def prune(conn: Connection) -> int:
            await self._sequence(conn)  # only numbered events are deleted: number them
            return (await conn.execute(self._q(PRUNE_EVENTS), (before, limit))).rowcount

        return await self._run(prune)

    async def stale_journals(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> list[tuple[str, str]]:
        args = (*(after or ("", "")), before, limit)

        async def read(conn: Connection) -> list[tuple[str, str]]:
            cur = await conn.execute(self._q(STALE_JOURNALS), args)
            return [(row[0], row[1]) for row in await cur.fetchall()]

        return await self._run(read)

    async def prune_journal(self, thread_id: str, turn_id: str, before: datetime) -> int:
        # Fenced by the lease the caller took (``operations.prune``).
        params = {**self.lease_params(thread_id), "turn_id": turn_id, "before": before}

        async def prune(conn: Connection) -> int:
            cur = await conn.execute(self._q(PRUNE_JOURNAL), params)
            return int(present(await cur.fetchone())[0])

        return await self._run(prune)

    async def prune_turns(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> tuple[int, tuple[str, str] | None]:
        start = after or ("", "")

        async def prune(conn: Connection) -> tuple[int, tuple[str, str] | None]:
            # One transaction: a pruned turn's stop requests, and its thread's spent
            # interrupts, go with its result.
            async with conn.transaction():
                cur = await conn.execute(self._q(PRUNE_TURNS), (*start, before, limit))
                keys = [(row[0], row[1]) for row in await cur.fetchall()]
                async with conn.cursor() as many:
                    if keys:
                        await many.executemany(self._q(PRUNE_CANCELS), keys)
                        threads = [{"thread": t, "before": before} for t in {k[0] for k in keys}]
                        await many.executemany(self._q(PRUNE_INTERRUPTS), threads)
            return len(keys), (max(keys) if len(keys) == limit else None)

        return await self._run(prune)

    async def _insert_events(
        self,
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
            await cur.executemany(self._q(INSERT_EVENT), rows)


def _thread(
    version: int,
    tenant_id: str | None,
    checkpoint: str | None,
    messages: list[str] | None,
    facts: list[list[str]] | None,
) -> StoredThread:
    return stored_thread(version, tenant_id, checkpoint, messages, facts)


def _receipt_params(r: Receipt) -> dict[str, Any]:
    """The receipt's columns as stored here: times as ``timestamptz``."""
    return receipt_params(r, _same)


def _same(moment: datetime) -> datetime:
    return moment


def receipt_lease_lost(thread_id: str, key: str) -> LeaseLostError:
    return LeaseLostError(
        f"receipt {key!r} on thread {thread_id!r} was not written: the turn's lease was lost",
        thread_id=thread_id,
        key=key,
    )


def settle_lease_lost(receipt: Receipt) -> LeaseLostError:
    return LeaseLostError(
        f"the outcome of receipt {receipt.key!r} on thread {receipt.thread_id!r} was not "
        "recorded: the turn's lease was lost, and the receipt was settled by the thread's "
        "next holder first",
        thread_id=receipt.thread_id,
        key=receipt.key,
    )


def lease_lost(record: TurnRecord) -> LeaseLostError:
    return LeaseLostError(
        f"turn {record.turn_id!r} of thread {record.thread_id!r} was not committed: its "
        "lease on the thread lapsed or was taken over while it ran",
        thread_id=record.thread_id,
        turn_id=record.turn_id,
    )


def _receipt(row: Sequence[Any] | None) -> Receipt | None:
    return decode_receipt_row(row, _utc)


def _event(row: Sequence[Any]) -> OutboxEvent:
    return decode_event_row(row, _utc)


def _delivery(row: Sequence[Any]) -> OutboxDelivery:
    return decode_delivery_row(row, _utc)


def _utc(value: datetime) -> datetime:
    # timestamptz comes back in the session's time zone; normalize as utcnow() does.
    return value.astimezone(UTC)
