"""The SQLite adapter's statements, as named constants (the schema is in ``_schema``).

A statement PostgreSQL sends alike is written once, in
:mod:`intention_kernel.durability._layout.sql`, and named here.
"""

from __future__ import annotations

from intention_kernel.durability._layout import sql as _sql
from intention_kernel.durability._layout.rows import (
    OUTBOX_COLUMNS,
    RECEIPT_COLUMNS,
)
from intention_kernel.durability._layout.timer_rows import TIMER_COLUMNS

SELECT_TURN = """
    SELECT t.request_digest, t.result, th.tenant_id, t.pruned_at
    FROM ik_turns t LEFT JOIN ik_threads th ON th.thread_id = t.thread_id
    WHERE t.thread_id = ? AND t.turn_id = ?
"""
SELECT_THREAD = "SELECT version, tenant_id, checkpoint FROM ik_threads WHERE thread_id = ?"
SELECT_MESSAGES = "SELECT body FROM ik_messages WHERE thread_id = ? ORDER BY seq"
SELECT_FACTS = "SELECT key, body FROM ik_facts WHERE thread_id = ? ORDER BY rowid"
SELECT_INDEX = "SELECT body FROM ik_receipt_index WHERE thread_id = ? ORDER BY seq"
# The checkpoint document only when the caller does not already hold this version.
SELECT_THREAD_UNLESS_KNOWN = """
    SELECT version, tenant_id, CASE WHEN version IS ? THEN NULL ELSE checkpoint END
    FROM ik_threads WHERE thread_id = ?
"""

READ_RECEIPTS = _sql.READ_RECEIPTS
SELECT_RECEIPT = _sql.SELECT_RECEIPT
# Named parameters: the values are ``receipt_params``, shared with PostgreSQL.
INSERT_RECEIPT = f"""
    INSERT INTO ik_receipts ({RECEIPT_COLUMNS})
    VALUES (:id, :thread_id, :key, :status, :turn_id, :step_id, :attempt, :value, :error,
            :created_at, :updated_at, :resolution, :announced, :tenant_id, :actor,
            :capability_id, :input, :approved_by)
"""
# The tenant that claimed a thread with no committed turn: its first receipt's. With no
# receipt, it is its first journal entry's (a turn that recorded rounds and never
# committed). Each probe walks its table's primary key on ``thread_id``.
SELECT_CLAIM = """
    SELECT tenant_id FROM (
        SELECT 0 AS source, tenant_id FROM (
            SELECT tenant_id FROM ik_receipts WHERE thread_id = ?1 ORDER BY rowid LIMIT 1)
        UNION ALL
        SELECT 1 AS source, tenant_id FROM (
            SELECT tenant_id FROM ik_journal WHERE thread_id = ?1 ORDER BY rowid LIMIT 1))
    ORDER BY source LIMIT 1
"""
# The first call of an effect key in one statement: insert the planned receipt unless
# one exists. Not a conflict hidden: no row inserted means the caller reads the
# existing receipt and plans from it (``claim_effect``).
INSERT_RECEIPT_IF_NEW = INSERT_RECEIPT + " ON CONFLICT (thread_id, key) DO NOTHING"
# Compare-and-set: the receipt must still be in the state the caller last saw.
UPDATE_RECEIPT = """
    UPDATE ik_receipts
    SET status = :status, turn_id = :turn_id, step_id = :step_id, attempt = :attempt,
        value = :value, error = :error, resolution = :resolution, updated_at = :updated_at,
        announced = :announced, actor = :actor,
        capability_id = :capability_id, input = :input, approved_by = :approved_by
    WHERE thread_id = :thread_id AND key = :key
      AND status = :expected_status AND attempt = :expected_attempt
"""
SETTLE_RECEIPT = _sql.SETTLE_RECEIPT
# In the turn's commit: the effect.completed events it carries announce these receipts,
# completed under another turn ID (see ``TurnRecord.mark_announced``).
MARK_ANNOUNCED = """
    UPDATE ik_receipts SET announced = 1
    WHERE thread_id = ? AND key = ? AND status = 'completed'
"""

INSERT_TURN = """
    INSERT INTO ik_turns (thread_id, turn_id, request_digest, version, result, created_at,
                          announced)
    VALUES (?, ?, ?, ?, ?, ?, ?)
"""
# First commit of a thread. A row may already exist at version 0 (operator events
# only). Anything above 0 means another turn committed first, so the WHERE refuses.
INSERT_THREAD = """
    INSERT INTO ik_threads (thread_id, tenant_id, version, schema_revision, fingerprint,
                            checkpoint, next_seq, updated_at, message_seq, receipt_seq)
    VALUES (:thread_id, :tenant_id, :version, :schema_revision, :fingerprint, :checkpoint,
            1 + :events, :now, :messages, :index)
    ON CONFLICT (thread_id) DO UPDATE SET
        tenant_id = excluded.tenant_id, version = excluded.version,
        schema_revision = excluded.schema_revision, fingerprint = excluded.fingerprint,
        checkpoint = excluded.checkpoint, next_seq = ik_threads.next_seq + :events,
        updated_at = excluded.updated_at, message_seq = ik_threads.message_seq + :messages,
        receipt_seq = ik_threads.receipt_seq + :index
    WHERE ik_threads.version = 0
    RETURNING next_seq, message_seq, receipt_seq
"""
# Later commits: fenced on the version and the owner this turn loaded, as PostgreSQL's
# commit is. ``IS`` matches NULL (no tenant) too. The thread lock keeps other turns
# out, but not another program writing the file. Say the fence lacked the owner. A
# turn that started as one tenant would then commit over a thread another tenant now
# owns.
UPDATE_THREAD = """
    UPDATE ik_threads
    SET version = :version, schema_revision = :schema_revision, fingerprint = :fingerprint,
        checkpoint = :checkpoint, next_seq = next_seq + :events, updated_at = :now,
        message_seq = message_seq + :messages, receipt_seq = receipt_seq + :index
    WHERE thread_id = :thread_id AND version = :expected AND tenant_id IS :tenant_id
    RETURNING next_seq, message_seq, receipt_seq
"""
# The checkpoint's rows (see ``TurnRecord``): messages numbered on from message_seq.
INSERT_MESSAGE = "INSERT INTO ik_messages (thread_id, seq, body) VALUES (?, ?, ?)"
TRIM_MESSAGES = "DELETE FROM ik_messages WHERE thread_id = ? AND seq > ? AND seq <= ?"
DELETE_MESSAGES = _sql.DELETE_MESSAGES
# A replaced fact keeps its row (and rowid, hence its place in the order).
UPSERT_FACT = """
    INSERT INTO ik_facts (thread_id, key, body) VALUES (?, ?, ?)
    ON CONFLICT (thread_id, key) DO UPDATE SET body = excluded.body
"""
DELETE_FACT = "DELETE FROM ik_facts WHERE thread_id = ? AND key = ?"
DELETE_FACTS = _sql.DELETE_FACTS
# The receipt index's rows, numbered on from receipt_seq. A moved key's row is found
# among the thread's few rows: at most ``Agent.max_receipts`` of them.
INSERT_INDEX = "INSERT INTO ik_receipt_index (thread_id, seq, key, body) VALUES (?, ?, ?, ?)"
DELETE_INDEX_KEY = "DELETE FROM ik_receipt_index WHERE thread_id = ? AND key = ?"
TRIM_INDEX = """
    DELETE FROM ik_receipt_index WHERE thread_id = ?1 AND seq IN (
        SELECT seq FROM ik_receipt_index WHERE thread_id = ?1 ORDER BY seq LIMIT ?2
    )
"""
DELETE_INDEX = "DELETE FROM ik_receipt_index WHERE thread_id = ?"
BUMP_THREAD_SEQ = _sql.BUMP_THREAD_SEQ
INSERT_EVENT = _sql.INSERT_EVENT

# -- the journal (see ``JournalRecorder``) --
SELECT_JOURNAL = """
    SELECT key, request_digest, value, created_at, tenant_id FROM ik_journal
    WHERE thread_id = ? AND turn_id = ? ORDER BY rowid
"""
# No ON CONFLICT: an entry already there is a conflict (the lock was lost), refused by
# the primary key.
INSERT_JOURNAL = """
    INSERT INTO ik_journal (thread_id, turn_id, key, request_digest, value, created_at,
                            tenant_id)
    VALUES (?, ?, ?, ?, ?, ?, ?)
"""
# A streamed turn's segment, with its round's journal entry (``StreamRecorder``): the
# trigger ``ik_journal_streams`` copies it into ``ik_streams``, in the same statement.
INSERT_JOURNAL_STREAMED = """
    INSERT INTO ik_journal (thread_id, turn_id, key, request_digest, value, created_at,
                            tenant_id, segment, events)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
# Retention: a turn's stream goes with its result. If the turn never committed, it
# goes with its journal; a redelivery then records its segments again.
DELETE_STREAM = "DELETE FROM ik_streams WHERE thread_id = ? AND turn_id = ?"
SELECT_STREAM = _sql.SELECT_STREAM
# In the turn's commit, when the turn used the journal (``TurnRecord.journaled``).
DELETE_JOURNAL = "DELETE FROM ik_journal WHERE thread_id = ? AND turn_id = ?"

# -- the inbox (see ``InboxRecorder``) --
SELECT_TURN_EXISTS = _sql.SELECT_TURN_EXISTS
SELECT_INBOX_ENTRY = _sql.SELECT_INBOX_ENTRY
INSERT_INBOX = """
    INSERT INTO ik_inbox
        (thread_id, turn_id, tenant_id, request_digest, request, created_at, steer)
    VALUES (?, ?, ?, ?, ?, ?, ?)
"""
INBOX_POSITION = _sql.INBOX_POSITION
SELECT_INBOX = _sql.SELECT_INBOX
SELECT_TAKER = _sql.SELECT_TAKER
# A round boundary of turn ?2 takes the steers nobody took (and those it took before).
TAKE_STEERS = """
    UPDATE ik_inbox SET taken_by = ?2
    WHERE thread_id = ?1 AND steer = 1 AND taken_by IS NULL AND turn_id <> ?2
"""
# The steer ?2 back in the inbox, unless its taker ?3 committed. The caller holds the
# lock and read ?3's journal: ?3 did not record it.
RELEASE_STEER = """
    UPDATE ik_inbox SET taken_by = NULL
    WHERE thread_id = ?1 AND turn_id = ?2 AND taken_by = ?3
      AND NOT EXISTS (SELECT 1 FROM ik_turns t WHERE t.thread_id = ?1 AND t.turn_id = ?3)
"""
SELECT_TAKEN = _sql.SELECT_TAKEN
DELETE_INBOX = _sql.DELETE_INBOX
DEQUEUE_UNSTARTED = _sql.DEQUEUE_UNSTARTED
START_QUEUED = "UPDATE ik_inbox SET started = 1 WHERE thread_id = ? AND turn_id = ?"
SELECT_STARTED = "SELECT started FROM ik_inbox WHERE thread_id = ? AND turn_id = ?"
# A request already there keeps its first reason: asking again changes nothing. Each
# request is stored under its caller's scope (``ownership.cancel_scope``).
INSERT_CANCEL = """
    INSERT INTO ik_cancels (thread_id, turn_id, reason, created_at, scope)
    VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (thread_id, turn_id, scope) DO NOTHING
"""
# The tenant of a thread's committed turns, for a scoped stop request.
SELECT_COMMITTED_TENANT = "SELECT tenant_id FROM ik_threads WHERE thread_id = ? AND version > 0"
SELECT_INBOX_TENANT = _sql.SELECT_INBOX_TENANT
# One row per sender, with the seq of its entry (none left: it ran, nothing to stop).
# The same sender asking twice asks one thing: the second request changes nothing.
INSERT_INTERRUPT = """
    INSERT INTO ik_interrupts (thread_id, base_version, turn_id, scope, seq, created_at)
    SELECT ?1, ?2, ?3, ?4, seq, ?5 FROM ik_inbox WHERE thread_id = ?1 AND turn_id = ?3
    ON CONFLICT (thread_id, base_version, turn_id, scope) DO NOTHING
"""
SELECT_VERSION = _sql.SELECT_VERSION
# A cancel (kind 0) sorts before an interrupt (kind 1). An interrupt stops the turn
# if another sender of its tenant asked it, accepted after the turn's own entry.
SELECT_CANCEL = """
    SELECT 0, reason FROM ik_cancels
    WHERE thread_id = ?1 AND turn_id = ?2 AND scope IN ('*', ?3)
    UNION ALL
    SELECT 1, NULL FROM ik_interrupts
    WHERE thread_id = ?1 AND base_version = ?4 AND turn_id <> ?2 AND scope IN ('*', ?3)
    AND seq > COALESCE((SELECT seq FROM ik_inbox WHERE thread_id = ?1 AND turn_id = ?2), 0)
    ORDER BY 1 LIMIT 1
"""

# -- the relay (see ``Recorder.claim_outbox``) --
# Threads whose first unpublished event is due, oldest first. The inner query walks
# ik_outbox_unpublished only; the join finds each head by the (thread_id, seq) key.
PENDING_THREADS = """
    SELECT o.thread_id FROM ik_outbox o
    JOIN (SELECT thread_id, min(seq) AS seq FROM ik_outbox
          WHERE published_at IS NULL GROUP BY thread_id) h
      ON o.thread_id = h.thread_id AND o.seq = h.seq
    WHERE o.retry_at IS NULL OR o.retry_at <= ?
    ORDER BY o.position LIMIT ?
"""
SELECT_UNPUBLISHED = f"""
    SELECT {OUTBOX_COLUMNS}, attempts, last_error, retry_at FROM ik_outbox
    WHERE thread_id = ? AND published_at IS NULL ORDER BY seq LIMIT ?
"""
MARK_PUBLISHED = """
    UPDATE ik_outbox SET published_at = ?
    WHERE thread_id = ? AND seq = ? AND published_at IS NULL
"""
MARK_FAILED = """
    UPDATE ik_outbox SET attempts = ?, last_error = ?, retry_at = ?
    WHERE thread_id = ? AND seq = ? AND published_at IS NULL
"""
SELECT_BACKLOG = _sql.SELECT_BACKLOG
SELECT_FAILING = f"""
    SELECT {OUTBOX_COLUMNS}, attempts, last_error, retry_at FROM ik_outbox
    WHERE published_at IS NULL AND attempts > 0 ORDER BY position LIMIT ?
"""

# -- deploy check, migration, retention --
SCAN_THREADS = """
    SELECT thread_id, version, tenant_id, checkpoint FROM ik_threads
    WHERE thread_id > ? AND version > 0 AND checkpoint IS NOT NULL
      AND (? IS NULL OR schema_revision < ?)
    ORDER BY thread_id LIMIT ?
"""
# Candidates for the threads with an active interaction (see INTERACTION_MARKER): a
# text search of each core, no JSON parsed; ``tenant_id IS ?`` matches NULL too.
SELECT_INTERACTIONS = """
    SELECT thread_id, version, tenant_id, checkpoint FROM ik_threads
    WHERE thread_id > ? AND version > 0 AND instr(checkpoint, ?) > 0
      AND (NOT ? OR tenant_id IS ?)
    ORDER BY thread_id LIMIT ?
"""
# Fenced on the version: a turn committed since the migration read the thread.
REWRITE_THREAD = """
    UPDATE ik_threads
    SET checkpoint = ?, schema_revision = ?, fingerprint = ?, message_seq = message_seq + ?,
        receipt_seq = receipt_seq + ?
    WHERE thread_id = ? AND version = ?
    RETURNING message_seq, receipt_seq
"""
PRUNE_EVENTS = """
    DELETE FROM ik_outbox WHERE position IN (
        SELECT position FROM ik_outbox
        WHERE published_at IS NOT NULL AND created_at < ? ORDER BY position LIMIT ?)
"""
# The turn row stays, so that a late delivery is refused (TurnExpiredError), not re-run.
# Only turns that still hold a result are selected, after the cursor. So a run never
# reads the keys of turns pruned before. No index on the unpruned turns: it would cost one
# more index write per committed turn, and retention runs rarely.
PRUNE_TURNS = """
    UPDATE ik_turns SET result = '', pruned_at = ?
    WHERE rowid IN (
        SELECT rowid FROM ik_turns
        WHERE (thread_id, turn_id) > (?, ?) AND pruned_at IS NULL AND created_at < ?
        ORDER BY thread_id, turn_id LIMIT ?)
    RETURNING thread_id, turn_id
"""
PRUNE_CANCELS = _sql.PRUNE_CANCELS
# An interrupt older than the cutoff on a base the thread has moved past stops nothing.
PRUNE_INTERRUPTS = """
    DELETE FROM ik_interrupts WHERE thread_id = ?1 AND created_at < ?2
    AND base_version < (SELECT version FROM ik_threads WHERE thread_id = ?1)
"""
STALE_JOURNALS = _sql.STALE_JOURNALS
# Then each turn's entries go, all or none, under its thread's lock. An entry written
# since the scan keeps them all: a redelivery ran meanwhile.
PRUNE_JOURNAL = """
    DELETE FROM ik_journal WHERE thread_id = ?1 AND turn_id = ?2 AND NOT EXISTS (
        SELECT 1 FROM ik_journal WHERE thread_id = ?1 AND turn_id = ?2 AND created_at >= ?3)
"""


# -- timers ---------------------------------------------------------------------------------

UPSERT_TIMER = f"""
    INSERT OR REPLACE INTO ik_timers ({TIMER_COLUMNS})
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
DELETE_TIMER = _sql.DELETE_TIMER
SELECT_TIMER = _sql.SELECT_TIMER
# Keyset pages in (thread_id, key) order; each filter off when its parameter is NULL.
SELECT_TIMERS = f"""
    SELECT {TIMER_COLUMNS} FROM ik_timers
    WHERE (:thread_id IS NULL OR thread_id = :thread_id)
      AND (:status IS NULL OR status = :status)
      AND (:after_thread IS NULL OR (thread_id, key) > (:after_thread, :after_key))
    ORDER BY thread_id, key LIMIT :limit
"""
# One statement, so one write transaction: two workers never claim the same row.
CLAIM_TIMERS = f"""
    UPDATE ik_timers SET claimed_until = :until
    WHERE (thread_id, key) IN (
        SELECT thread_id, key FROM ik_timers
        WHERE status = 'pending' AND due_at <= :now
          AND (claimed_until IS NULL OR claimed_until <= :now)
        ORDER BY due_at LIMIT :limit)
    RETURNING {TIMER_COLUMNS}
"""
PRUNE_TIMERS = _sql.PRUNE_TIMERS
