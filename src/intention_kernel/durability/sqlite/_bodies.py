"""The SQLite recorder's writes, as data: one module-level body per kind of write.

A body is ``body(conn, *args)``. Its arguments are plain values: text, numbers,
``None``, and tuples, lists and dicts of those. The recorder builds them before the
write is queued. So the same body runs alike inline on the event loop and on the
worker thread. No write closes over a record or runs a callback. A body never begins,
commits or rolls back. It runs in the transaction its runner opened (see
:mod:`._group`). A body that is not atomic writes with one statement, or with
statements that may commit one by one.

A body's refusal is :class:`Refusal`. Examples are a fenced turn commit, a journal
conflict, or a receipt whose compare-and-set missed. The recorder turns it into its
typed error, where the record it names is known (``fenced(record, reason)``,
``journal_conflict(entry)``...). Each caller knows which body it ran, so the refusal
needs no kind.

The turn protocol's fault point inside a commit (``DURING_COMMIT``) is reached where
the body runs, in the thread that runs it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from intention_kernel import _faults
from intention_kernel.durability._contract.records import ThreadOwner
from intention_kernel.durability.sqlite._statements import (
    BUMP_THREAD_SEQ,
    CLAIM_TIMERS,
    DELETE_FACT,
    DELETE_FACTS,
    DELETE_INBOX,
    DELETE_INDEX,
    DELETE_INDEX_KEY,
    DELETE_JOURNAL,
    DELETE_MESSAGES,
    DELETE_STREAM,
    DELETE_TIMER,
    DEQUEUE_UNSTARTED,
    INBOX_POSITION,
    INSERT_CANCEL,
    INSERT_EVENT,
    INSERT_INBOX,
    INSERT_INDEX,
    INSERT_INTERRUPT,
    INSERT_JOURNAL,
    INSERT_JOURNAL_STREAMED,
    INSERT_MESSAGE,
    INSERT_RECEIPT,
    INSERT_RECEIPT_IF_NEW,
    INSERT_THREAD,
    INSERT_TURN,
    MARK_ANNOUNCED,
    MARK_FAILED,
    MARK_PUBLISHED,
    PRUNE_CANCELS,
    PRUNE_EVENTS,
    PRUNE_INTERRUPTS,
    PRUNE_JOURNAL,
    PRUNE_TIMERS,
    PRUNE_TURNS,
    REWRITE_THREAD,
    SELECT_CANCEL,
    SELECT_CLAIM,
    SELECT_COMMITTED_TENANT,
    SELECT_INBOX_ENTRY,
    SELECT_INBOX_TENANT,
    SELECT_STARTED,
    SELECT_TURN_EXISTS,
    SETTLE_RECEIPT,
    START_QUEUED,
    TRIM_INDEX,
    TRIM_MESSAGES,
    UPDATE_RECEIPT,
    UPDATE_THREAD,
    UPSERT_FACT,
    UPSERT_TIMER,
)

__all__ = ["Refusal"]


class Refusal(Exception):
    """A body refused its write; ``reason`` says why, for the error the caller raises."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


def commit_turn(
    conn: sqlite3.Connection,
    turn: tuple[Any, ...],
    params: dict[str, Any],
    messages: Sequence[str],
    trim: tuple[int, int] | None,
    facts: Sequence[tuple[str, str]],
    removed_facts: Sequence[str],
    mark_announced: Sequence[str],
    journaled: bool,
    rewrite: bool,
    events: Sequence[tuple[Any, ...]],
    index: tuple[Sequence[tuple[str, str]], Sequence[str], int] | None,
    timers: TimerRows | None = None,
) -> None:
    """A turn's commit: its row, the thread's row, its checkpoint's rows and its events.

    The thread's row is a compare-and-set of its version.

    - ``turn``: the ``ik_turns`` row.
    - ``trim``: ``(trim_messages, keep_messages)``.
    - ``events``: rows without their ``seq``.
    - ``index``: ``(receipt_index, moved_index_keys, trim_index)``, ``None`` when the
      turn left the receipt index as it was.
    - ``timers``: the timer rows the turn writes.
    """
    thread_id, turn_id = turn[0], turn[1]
    try:
        conn.execute(INSERT_TURN, turn)
    except sqlite3.IntegrityError as exc:
        if exc.sqlite_errorcode != sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
            raise
        raise Refusal("the turn ID was committed by another worker") from exc
    statement = INSERT_THREAD if params["expected"] == 0 else UPDATE_THREAD
    returned = conn.execute(statement, params).fetchone()
    if returned is None:
        raise Refusal("the thread version moved")
    next_seq, message_seq, receipt_seq = returned
    if rewrite:
        conn.execute(DELETE_MESSAGES, (thread_id,))
        conn.execute(DELETE_FACTS, (thread_id,))
        conn.execute(DELETE_INDEX, (thread_id,))
    # Each executemany only when it has rows: an empty one still looks up and resets
    # its statement.
    if messages:
        first = message_seq - len(messages) + 1
        conn.executemany(
            INSERT_MESSAGE, [(thread_id, first + i, body) for i, body in enumerate(messages)]
        )
    if trim is not None:
        trim_messages, keep_messages = trim
        last_trimmed = message_seq - keep_messages
        first_kept = last_trimmed - trim_messages
        conn.execute(TRIM_MESSAGES, (thread_id, first_kept, last_trimmed))
    if facts:
        conn.executemany(UPSERT_FACT, [(thread_id, k, body) for k, body in facts])
    if removed_facts:
        conn.executemany(DELETE_FACT, [(thread_id, k) for k in removed_facts])
    if index is not None:
        write_index(conn, thread_id, receipt_seq, *index)
    if mark_announced:
        conn.executemany(MARK_ANNOUNCED, [(thread_id, k) for k in mark_announced])
    if journaled:
        conn.execute(DELETE_JOURNAL, (thread_id, turn_id))
    if events:
        first_seq = next_seq - len(events)
        conn.executemany(
            INSERT_EVENT,
            [(r[0], r[1], r[2], first_seq + i, r[3], r[4], r[5]) for i, r in enumerate(events)],
        )
    if timers is not None:
        write_timer_rows(conn, timers)
    if _faults.armed:  # every row written, the transaction still open
        _faults.reach(_faults.DURING_COMMIT)


#: A commit's timer writes: the rows to insert or replace, and the keys to delete.
TimerRows = tuple[Sequence[tuple[Any, ...]], Sequence[tuple[str, str]]]


def write_timer_rows(conn: sqlite3.Connection, timers: TimerRows) -> None:
    """Replace or delete the timer rows (at most one write per row)."""
    upserts, deletes = timers
    if upserts:
        conn.executemany(UPSERT_TIMER, upserts)
    if deletes:
        conn.executemany(DELETE_TIMER, deletes)


def write_timers(
    conn: sqlite3.Connection,
    timers: TimerRows,
    thread_id: str,
    now: str,
    events: Sequence[tuple[Any, ...]],
) -> None:
    """Timer writes outside a turn (under the thread's lock) and their events.

    Each event takes the thread's next sequence number. ``events`` are rows without it."""
    write_timer_rows(conn, timers)
    for event in events:
        seq = conn.execute(BUMP_THREAD_SEQ, (thread_id, now)).fetchone()[0] - 1
        conn.execute(
            INSERT_EVENT, (event[0], event[1], event[2], seq, event[3], event[4], event[5])
        )


def claim_timers(conn: sqlite3.Connection, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Claim due timers in one statement; the claimed rows."""
    return [tuple(row) for row in conn.execute(CLAIM_TIMERS, params).fetchall()]


def prune_timers(conn: sqlite3.Connection, args: tuple[Any, ...]) -> int:
    return conn.execute(PRUNE_TIMERS, args).rowcount


def write_index(
    conn: sqlite3.Connection,
    thread_id: str,
    receipt_seq: int,
    appended: Sequence[tuple[str, str]],
    moved: Sequence[str] = (),
    trim: int = 0,
) -> None:
    """The receipt index's rows.

    The ``moved`` keys' rows are deleted. ``appended`` are numbered up to
    ``receipt_seq``, the thread's number after this write. The ``trim`` oldest are
    deleted. The order is the delta's: trimming after appending may drop new rows too."""
    if moved:
        conn.executemany(DELETE_INDEX_KEY, [(thread_id, key) for key in moved])
    if appended:
        first = receipt_seq - len(appended) + 1
        conn.executemany(
            INSERT_INDEX,
            [(thread_id, first + i, key, body) for i, (key, body) in enumerate(appended)],
        )
    if trim:
        conn.execute(TRIM_INDEX, (thread_id, trim))


def write_journal(conn: sqlite3.Connection, row: tuple[Any, ...]) -> None:
    """One journal entry: one autocommitted statement, durable when it returns
    (``synchronous=FULL``)."""
    try:
        conn.execute(INSERT_JOURNAL, row)
    except sqlite3.IntegrityError as exc:
        if exc.sqlite_errorcode != sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
            raise
        raise Refusal() from exc


def write_streamed(conn: sqlite3.Connection, row: tuple[Any, ...]) -> None:
    """A journal entry and its stream segment: one autocommitted statement, whose
    trigger copies the segment into ``ik_streams``."""
    try:
        conn.execute(INSERT_JOURNAL_STREAMED, row)
    except sqlite3.IntegrityError as exc:
        if exc.sqlite_errorcode != sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
            raise
        raise Refusal() from exc


def enqueue(conn: sqlite3.Connection, row: tuple[Any, ...]) -> int | None:
    """An inbox entry, atomic: its position, or ``None`` when its turn is committed.
    An entry already there under the turn ID keeps its place; one for another request
    digest is refused (:class:`Refusal`)."""
    thread_id, turn_id, _, digest = row[:4]
    if conn.execute(SELECT_TURN_EXISTS, (thread_id, turn_id)).fetchone() is not None:
        return None
    found = conn.execute(SELECT_INBOX_ENTRY, (thread_id, turn_id)).fetchone()
    if found is None:
        seq = conn.execute(INSERT_INBOX, row).lastrowid
    elif digest is not None and found[1] is not None and digest != found[1]:
        raise Refusal("queued for another request")
    else:
        seq = found[0]
    position: int = conn.execute(INBOX_POSITION, (thread_id, seq)).fetchone()[0]
    return position


def remove_inbox(conn: sqlite3.Connection, thread_id: str, turn_id: str) -> int:
    """Delete a thread's inbox entry: 1 if there was one, else 0."""
    return conn.execute(DELETE_INBOX, (thread_id, turn_id)).rowcount


def request_cancel(
    conn: sqlite3.Connection,
    row: tuple[Any, ...],
    owner: ThreadOwner | None,
    running: Callable[[], bool],
) -> str:
    """A stop request, atomic: ``"committed"`` (nothing written), ``"dequeued"``,
    ``"requested"`` or ``"not-found"`` (see ``InboxRecorder.request_cancel``).

    ``running``: whether a delivery of the turn runs in any process. Its queued copy
    then stays: the turn answers ``"requested"``, and the copy replays its commit."""
    thread_id, turn_id = row[:2]
    if owner is not None:
        found = conn.execute(SELECT_COMMITTED_TENANT, (thread_id,)).fetchone()
        if found is None:
            found = conn.execute(SELECT_CLAIM, (thread_id,)).fetchone()
        if found is not None and found[0] != owner.tenant_id:
            return "not-found"
    if conn.execute(SELECT_TURN_EXISTS, (thread_id, turn_id)).fetchone() is not None:
        return "committed"
    if owner is not None:
        queued = conn.execute(SELECT_INBOX_TENANT, (thread_id, turn_id)).fetchone()
        if queued is not None and queued[0] != owner.tenant_id:
            return "not-found"
    conn.execute(INSERT_CANCEL, row)
    if running():
        return "requested"
    removed = conn.execute(DEQUEUE_UNSTARTED, (thread_id, turn_id)).rowcount
    return "dequeued" if removed else "requested"


def start_queued(conn: sqlite3.Connection, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """A queued turn starts, atomic: its entry marked, then its stop read. An entry
    started before (its process died): ``None``, its stop is read at a safe point."""
    started = conn.execute(SELECT_STARTED, params[:2]).fetchone()
    if started is not None and started[0]:
        return None
    conn.execute(START_QUEUED, params[:2])
    row: tuple[Any, ...] | None = conn.execute(SELECT_CANCEL, params).fetchone()
    return row


def request_interrupt(conn: sqlite3.Connection, row: tuple[Any, ...]) -> None:
    """An interrupt request: one autocommitted statement."""
    conn.execute(INSERT_INTERRUPT, row)


def claim_receipt(conn: sqlite3.Connection, params: dict[str, Any]) -> int:
    """A new key's first receipt, unless one is there: 1 if it was written, else 0."""
    return conn.execute(INSERT_RECEIPT_IF_NEW, params).rowcount


def insert_receipt(conn: sqlite3.Connection, params: dict[str, Any]) -> None:
    conn.execute(INSERT_RECEIPT, params)


def update_receipt(conn: sqlite3.Connection, settles: bool, params: dict[str, Any]) -> None:
    """A receipt's compare-and-set (see ``ReceiptWrite``): refused unless it changed
    exactly the one row."""
    statement = SETTLE_RECEIPT if settles else UPDATE_RECEIPT
    if conn.execute(statement, params).rowcount != 1:
        raise Refusal()


def resolve_receipt(
    conn: sqlite3.Connection,
    settles: bool,
    params: dict[str, Any],
    thread_id: str,
    now: str,
    event: tuple[Any, ...],
) -> None:
    """An operator's resolution: the receipt's compare-and-set and the event that says so.

    The event takes the thread's next sequence number. ``event`` is a row without it."""
    update_receipt(conn, settles, params)
    seq = conn.execute(BUMP_THREAD_SEQ, (thread_id, now)).fetchone()[0] - 1
    conn.execute(INSERT_EVENT, (event[0], event[1], event[2], seq, event[3], event[4], event[5]))


def mark_published(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    # Not the cursor: a body returns plain values.
    conn.executemany(MARK_PUBLISHED, rows)


def mark_failed(conn: sqlite3.Connection, args: tuple[Any, ...]) -> None:
    conn.execute(MARK_FAILED, args)


def rewrite_checkpoint(
    conn: sqlite3.Connection,
    thread: tuple[Any, ...],
    messages: Sequence[str],
    facts: Sequence[tuple[str, str]],
    index: Sequence[tuple[str, str]],
) -> None:
    """A migrated checkpoint over the same version (``thread``: ``REWRITE_THREAD``'s
    arguments, the thread ID and the version last)."""
    returned = conn.execute(REWRITE_THREAD, thread).fetchone()
    if returned is None:
        raise Refusal()
    thread_id = thread[-2]
    conn.execute(DELETE_INDEX, (thread_id,))
    write_index(conn, thread_id, returned[1], index)
    first = returned[0] - len(messages) + 1
    conn.execute(DELETE_MESSAGES, (thread_id,))
    conn.executemany(
        INSERT_MESSAGE, [(thread_id, first + i, body) for i, body in enumerate(messages)]
    )
    conn.execute(DELETE_FACTS, (thread_id,))
    conn.executemany(UPSERT_FACT, [(thread_id, k, body) for k, body in facts])


def prune_events(conn: sqlite3.Connection, args: tuple[Any, ...]) -> int:
    return conn.execute(PRUNE_EVENTS, args).rowcount


def prune_journal(conn: sqlite3.Connection, args: tuple[Any, ...]) -> int:
    """Atomic: the turn's journal and its stream go together."""
    pruned: int = conn.execute(PRUNE_JOURNAL, args).rowcount
    if pruned:
        conn.execute(DELETE_STREAM, args[:2])
    return pruned


def prune_turns(
    conn: sqlite3.Connection, args: tuple[Any, ...], limit: int
) -> tuple[int, tuple[str, str] | None]:
    """Atomic: each pruned turn's stream goes with its result."""
    rows = conn.execute(PRUNE_TURNS, args).fetchall()
    keys = [(row[0], row[1]) for row in rows]
    conn.executemany(DELETE_STREAM, keys)
    # In the same transaction: a pruned turn's stop requests, and its thread's spent
    # interrupts, go with it.
    conn.executemany(PRUNE_CANCELS, keys)
    cutoff = args[3]
    conn.executemany(PRUNE_INTERRUPTS, [(thread, cutoff) for thread in {k[0] for k in keys}])
    return len(keys), (max(keys) if len(keys) == limit else None)
