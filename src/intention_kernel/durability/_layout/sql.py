"""The statements both SQL adapters send alike, written once.

A statement here is spelled as SQLite takes it: ``?`` for a positional parameter,
``:name`` for a named one. Each adapter's ``_statements`` module renders it through
its dialect hook. SQLite takes it as it is. PostgreSQL's hook spells the same
parameters as psycopg does (:func:`postgres`). A statement whose text differs by
dialect stays in its adapter's module: locks, fences, array parameters, ``RETURNING``
shapes and boolean writes differ. What both adapters read and write in one table
layout is stated here once, so the two cannot drift apart.
"""

from __future__ import annotations

import re

from intention_kernel.durability._layout.rows import RECEIPT_COLUMNS, select_receipts
from intention_kernel.durability._layout.timer_rows import TIMER_COLUMNS

_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def postgres(statement: str) -> str:
    """``statement`` with psycopg's placeholders: ``%s`` and ``%(name)s``.

    A statement here holds no ``%`` and no ``::`` cast, so the rewrite is exact."""
    if "%" in statement or "::" in statement:
        raise ValueError(f"a shared statement holds '%' or '::': {statement!r}")
    return _NAMED.sub(r"%(\1)s", statement.replace("?", "%s"))


READ_RECEIPTS = select_receipts(RECEIPT_COLUMNS)
SELECT_RECEIPT = f"{READ_RECEIPTS} WHERE r.thread_id = ? AND r.key = ?"
# The outcome of an attempt (see ``is_settlement``): the same compare-and-set, writing
# only what an outcome changes.
SETTLE_RECEIPT = """
    UPDATE ik_receipts
    SET status = :status, value = :value, error = :error, updated_at = :updated_at
    WHERE thread_id = :thread_id AND key = :key
      AND status = :expected_status AND attempt = :expected_attempt
"""
# Operator events on a thread that may have no committed turn yet.
BUMP_THREAD_SEQ = """
    INSERT INTO ik_threads (thread_id, version, next_seq, updated_at) VALUES (?, 0, 2, ?)
    ON CONFLICT (thread_id) DO UPDATE SET next_seq = ik_threads.next_seq + 1
    RETURNING next_seq
"""
INSERT_EVENT = """
    INSERT INTO ik_outbox (id, thread_id, turn_id, seq, type, payload, created_at)
    VALUES (?, ?, ?, ?, ?, ?, ?)
"""
SELECT_STREAM = """
    SELECT segment, events FROM ik_streams WHERE thread_id = ? AND turn_id = ?
    ORDER BY segment
"""
SELECT_TURN_EXISTS = "SELECT 1 FROM ik_turns WHERE thread_id = ? AND turn_id = ?"
SELECT_INBOX_ENTRY = "SELECT seq, request_digest FROM ik_inbox WHERE thread_id = ? AND turn_id = ?"
INBOX_POSITION = """
    SELECT COUNT(*) FROM ik_inbox WHERE thread_id = ? AND seq <= ? AND taken_by IS NULL
"""
SELECT_INBOX = """
    SELECT turn_id, tenant_id, request_digest, request, created_at, seq, steer, taken_by
    FROM ik_inbox WHERE thread_id = ? AND taken_by IS NULL ORDER BY seq
"""
# The turn that took a steer: its turn ID replays that turn's result.
SELECT_TAKER = """
    SELECT taken_by FROM ik_inbox
    WHERE thread_id = ? AND turn_id = ? AND taken_by IS NOT NULL
"""
SELECT_TAKEN = """
    SELECT turn_id, tenant_id, request_digest, request, created_at, seq, steer, taken_by
    FROM ik_inbox WHERE thread_id = ? AND taken_by = ? ORDER BY seq
"""
DELETE_INBOX = "DELETE FROM ik_inbox WHERE thread_id = ? AND turn_id = ?"
# A cancel dequeues only an entry whose turn has not started; a started one runs on.
# SQLite only: PostgreSQL also checks the lease row, in its own statement.
DEQUEUE_UNSTARTED = "DELETE FROM ik_inbox WHERE thread_id = ? AND turn_id = ? AND NOT started"
SELECT_INBOX_TENANT = "SELECT tenant_id FROM ik_inbox WHERE thread_id = ? AND turn_id = ?"
SELECT_VERSION = "SELECT version FROM ik_threads WHERE thread_id = ?"
SELECT_BACKLOG = "SELECT count(*), min(created_at) FROM ik_outbox WHERE published_at IS NULL"
DELETE_MESSAGES = "DELETE FROM ik_messages WHERE thread_id = ?"
DELETE_FACTS = "DELETE FROM ik_facts WHERE thread_id = ?"
# The stop requests of a pruned turn go with its result: it can never run again.
PRUNE_CANCELS = "DELETE FROM ik_cancels WHERE thread_id = ? AND turn_id = ?"
# A turn's journal is pruned whole (see ``operations.prune``). This selects the turns
# whose newest entry is older than the cutoff. They come after the cursor, in the
# primary key's order.
STALE_JOURNALS = """
    SELECT thread_id, turn_id FROM ik_journal
    WHERE (thread_id, turn_id) > (?, ?)
    GROUP BY thread_id, turn_id HAVING max(created_at) < ?
    ORDER BY thread_id, turn_id LIMIT ?
"""
DELETE_TIMER = "DELETE FROM ik_timers WHERE thread_id = ? AND key = ?"
SELECT_TIMER = f"SELECT {TIMER_COLUMNS} FROM ik_timers WHERE thread_id = ? AND key = ?"
PRUNE_TIMERS = """
    DELETE FROM ik_timers WHERE (thread_id, key) IN (
        SELECT thread_id, key FROM ik_timers
        WHERE status <> 'pending' AND settled_at < ? LIMIT ?)
"""
