"""The PostgreSQL adapter's statements, as named constants (the schema and the
turn-start function are in ``_schema``, the commit statement in ``_commit``)."""

from __future__ import annotations

from typing import Any

from intention_kernel.durability._rows import OUTBOX_COLUMNS, RECEIPT_COLUMNS, select_receipts
from intention_kernel.durability.postgres._schema import CHECKPOINT_ROWS
from intention_kernel.effects import ReceiptStatus

# Per session, once: our schema only (no surprise from a "$user" or public table),
# and keepalives so that the server notices a vanished host (and drops its
# advisory locks) within idle + interval * count = 25 s instead of hours. Keepalives
# probe only a connection with nothing in flight: if the host vanished while the
# server was sending (a result, a notice), the kernel retransmits instead, for about
# 15 minutes by default (tcp_retries2). ``tcp_user_timeout`` (PostgreSQL 12+, where
# the server's platform has TCP_USER_TIMEOUT) bounds that to the same 25 s, and with
# keepalives on it also closes an idle connection once 25 s of probes went unanswered.
# (All four are ignored on a Unix socket, which has no remote host.) And lz4,
# where the server has it (PostgreSQL 14+ built with it), to compress what the
# session writes out of line: a long thread's core (its receipt index, up to
# ``max_receipts`` entries) is rewritten every turn, and the default pglz compresses
# it more slowly. Values already stored keep their method, and any server with lz4
# reads both. And generic plans only: in the default mode the server kept planning
# the commit statement anew at every execution (custom plans look cheaper when its
# gated parts fold away); every statement here is written for a generic plan, and a
# partial index an operator's query needs is matched by a literal (read_receipts).
CONFIGURE_SESSION = """
    SELECT set_config('search_path', %s, false),
           set_config('tcp_keepalives_idle', '10', false),
           set_config('tcp_keepalives_interval', '5', false),
           set_config('tcp_keepalives_count', '3', false),
           set_config('plan_cache_mode', 'force_generic_plan', false),
           (SELECT set_config(name, '25000', false) FROM pg_settings
            WHERE name = 'tcp_user_timeout'),
           (SELECT set_config(name, 'lz4', false) FROM pg_settings
            WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals))
"""

TRY_LOCK = "SELECT pg_try_advisory_lock(%s)"
UNLOCK = "SELECT pg_advisory_unlock(%s)"
LOCK_XACT = "SELECT pg_advisory_xact_lock(%s)"

SELECT_THREAD = (
    "SELECT version, tenant_id, checkpoint,"
    + CHECKPOINT_ROWS.format(ship="true", thread_id="%(thread_id)s")
    + "FROM ik_threads WHERE thread_id = %(thread_id)s"
)


READ_RECEIPTS = select_receipts(RECEIPT_COLUMNS)
SELECT_RECEIPT = f"{READ_RECEIPTS} WHERE r.thread_id = %s AND r.key = %s"
INSERT_RECEIPT = f"""
    INSERT INTO ik_receipts ({RECEIPT_COLUMNS})
    VALUES (%(id)s, %(thread_id)s, %(key)s, %(status)s, %(turn_id)s, %(step_id)s,
            %(attempt)s, %(value)s, %(error)s, %(created_at)s, %(updated_at)s, %(resolution)s,
            %(announced)s, %(tenant_id)s, %(actor)s, %(capability_id)s, %(input)s,
            %(approved_by)s)
"""
# The first call of an effect key, in one round trip: insert the planned receipt
# unless one exists. Not a conflict hidden: no row inserted means the caller reads the
# existing receipt and plans from it (``claim_effect``).
INSERT_RECEIPT_IF_NEW = INSERT_RECEIPT + " ON CONFLICT (thread_id, key) DO NOTHING"
# Compare-and-set: the receipt must still be in the state the caller last saw.
UPDATE_RECEIPT = """
    UPDATE ik_receipts
    SET status = %(status)s, turn_id = %(turn_id)s, step_id = %(step_id)s,
        attempt = %(attempt)s, value = %(value)s, error = %(error)s,
        resolution = %(resolution)s, updated_at = %(updated_at)s, announced = %(announced)s,
        actor = %(actor)s,
        capability_id = %(capability_id)s, input = %(input)s, approved_by = %(approved_by)s
    WHERE thread_id = %(thread_id)s AND key = %(key)s
      AND status = %(expected_status)s AND attempt = %(expected_attempt)s
"""
# The outcome of an attempt (see ``is_settlement``): the same compare-and-set, writing
# (and sending) only what an outcome changes.
SETTLE_RECEIPT = """
    UPDATE ik_receipts
    SET status = %(status)s, value = %(value)s, error = %(error)s, updated_at = %(updated_at)s
    WHERE thread_id = %(thread_id)s AND key = %(key)s
      AND status = %(expected_status)s AND attempt = %(expected_attempt)s
"""


# Operator events on a thread that may have no committed turn yet.
BUMP_THREAD_SEQ = """
    INSERT INTO ik_threads (thread_id, version, next_seq, updated_at) VALUES (%s, 0, 2, %s)
    ON CONFLICT (thread_id) DO UPDATE SET next_seq = ik_threads.next_seq + 1
    RETURNING next_seq
"""
# Events are born without a position; see SEQUENCE_OUTBOX.
INSERT_EVENT = """
    INSERT INTO ik_outbox (id, thread_id, turn_id, seq, type, payload, created_at)
    VALUES (%s, %s, %s, %s, %s, %s, %s)
"""
HAS_UNSEQUENCED = "SELECT EXISTS (SELECT 1 FROM ik_outbox WHERE position IS NULL)"
# The row lock on the counter makes numbering one transaction at a time. Each
# later statement of a READ COMMITTED transaction takes a fresh snapshot, so it
# sees every event committed before the previous numbering committed: positions
# are handed out in blocks, each block after all earlier ones, and a reader's
# snapshot always sees a prefix of the blocks. (REPEATABLE READ would break this:
# its snapshot predates the wait for the lock.) Within a block, ``ord`` (insert
# order) keeps each thread's events in ``seq`` order, since a thread's turns
# commit one after another.
LOCK_OUTBOX_HEAD = "SELECT position FROM ik_outbox_head FOR UPDATE"
SEQUENCE_OUTBOX = """
    WITH pending AS (
        SELECT ord, row_number() OVER (ORDER BY ord) AS n
        FROM ik_outbox WHERE position IS NULL ORDER BY ord LIMIT 10000
    ), numbered AS (
        UPDATE ik_outbox o SET position = %(head)s + pending.n
        FROM pending WHERE o.ord = pending.ord
        RETURNING o.position
    )
    UPDATE ik_outbox_head SET position = (SELECT max(position) FROM numbered)
    WHERE EXISTS (SELECT 1 FROM numbered)
"""
SELECT_OUTBOX = f"SELECT {OUTBOX_COLUMNS} FROM ik_outbox WHERE position > %(after)s"

# -- the journal (see ``JournalRecorder``) --
SELECT_JOURNAL = """
    SELECT key, request_digest, value, created_at, tenant_id FROM ik_journal
    WHERE thread_id = %s AND turn_id = %s ORDER BY ordinal
"""
# No ON CONFLICT: an entry already there is a conflict (the lock was lost), refused by
# ``ik_journal_pkey``.
INSERT_JOURNAL = """
    INSERT INTO ik_journal (thread_id, turn_id, key, request_digest, value, created_at,
                            tenant_id)
    VALUES (%s, %s, %s, %s, %s, %s, %s)
"""

# -- the relay (see ``Recorder.claim_outbox``) --
# The relay publishes numbered events only (it numbers what is committed first): a
# thread's numbered events are a prefix of its events by ``seq``, since numbering
# follows ``ord`` and a thread's turns commit one after another. So every published
# event has a position, and a consumer reading ``read_outbox`` sees it.
PENDING_THREADS = """
    SELECT o.thread_id FROM ik_outbox o
    JOIN (SELECT thread_id, min(seq) AS seq FROM ik_outbox
          WHERE published_at IS NULL AND position IS NOT NULL GROUP BY thread_id) h
      ON o.thread_id = h.thread_id AND o.seq = h.seq
    WHERE o.retry_at IS NULL OR o.retry_at <= %(now)s
    ORDER BY o.position LIMIT %(limit)s
"""
SELECT_UNPUBLISHED = f"""
    SELECT {OUTBOX_COLUMNS}, attempts, last_error, retry_at FROM ik_outbox
    WHERE thread_id = %s AND published_at IS NULL AND position IS NOT NULL
    ORDER BY seq LIMIT %s
"""
MARK_PUBLISHED = """
    UPDATE ik_outbox SET published_at = %(at)s
    WHERE thread_id = %(thread_id)s AND seq = ANY(%(seqs)s) AND published_at IS NULL
"""
MARK_FAILED = """
    UPDATE ik_outbox SET attempts = %s, last_error = %s, retry_at = %s
    WHERE thread_id = %s AND seq = %s AND published_at IS NULL
"""
SELECT_BACKLOG = "SELECT count(*), min(created_at) FROM ik_outbox WHERE published_at IS NULL"
SELECT_FAILING = f"""
    SELECT {OUTBOX_COLUMNS}, attempts, last_error, retry_at FROM ik_outbox
    WHERE published_at IS NULL AND attempts > 0 ORDER BY ord LIMIT %s
"""

# -- deploy check, migration, retention --
SCAN_THREADS = (
    "SELECT th.thread_id, version, tenant_id, checkpoint,"
    + CHECKPOINT_ROWS.format(ship="true", thread_id="th.thread_id")
    + """FROM ik_threads th
    WHERE th.thread_id > %(after)s AND version > 0 AND checkpoint IS NOT NULL
      AND (%(below)s::integer IS NULL OR schema_revision < %(below)s::integer)
    ORDER BY th.thread_id LIMIT %(limit)s"""
)
# Candidates for the threads with an active interaction (see INTERACTION_MARKER): a
# text search of each core, no JSON parsed (a ``::json`` cast would parse every core,
# and one corrupt core would fail the whole query without naming its thread).
SELECT_INTERACTIONS = """
    SELECT thread_id, version, tenant_id, checkpoint FROM ik_threads
    WHERE thread_id > %(after)s AND version > 0 AND strpos(checkpoint, %(marker)s) > 0
      AND (NOT %(owned)s::boolean OR tenant_id IS NOT DISTINCT FROM %(tenant)s::text)
    ORDER BY thread_id LIMIT %(limit)s
"""
# Fenced on the version: a turn committed since the migration read the thread.
REWRITE_THREAD = """
    UPDATE ik_threads
    SET checkpoint = %s, schema_revision = %s, fingerprint = %s, message_seq = message_seq + %s
    WHERE thread_id = %s AND version = %s
    RETURNING message_seq
"""
DELETE_MESSAGES = "DELETE FROM ik_messages WHERE thread_id = %s"
INSERT_MESSAGES = """
    INSERT INTO ik_messages (thread_id, seq, body)
    SELECT %s, %s + m.n - 1, m.body FROM unnest(%s::text[]) WITH ORDINALITY AS m(body, n)
"""
DELETE_FACTS = "DELETE FROM ik_facts WHERE thread_id = %s"
INSERT_FACTS = """
    INSERT INTO ik_facts (thread_id, key, body)
    SELECT %s, f.key, f.body FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS f(key, body, n)
    ORDER BY f.n
"""
PRUNE_EVENTS = """
    DELETE FROM ik_outbox WHERE ord IN (
        SELECT ord FROM ik_outbox
        WHERE published_at IS NOT NULL AND position IS NOT NULL AND created_at < %s
        ORDER BY ord LIMIT %s)
"""
# The turn row stays, so that a late delivery is refused (TurnExpiredError), not re-run.
# Only turns that still hold a result are selected, after the cursor: a run never reads
# (nor ships) the keys of turns pruned before. (An index on the unpruned turns would
# spare the server its walk of the key index too, at the price of one more index write
# per committed turn; retention runs from cron, turns all day.) ``t.pruned_at IS NULL``
# again in the UPDATE: a concurrent prune that took the row first is not counted twice.
PRUNE_TURNS = """
    UPDATE ik_turns t SET result = '', pruned_at = now()
    FROM (SELECT thread_id, turn_id FROM ik_turns
          WHERE (thread_id, turn_id) > (%s, %s) AND pruned_at IS NULL AND created_at < %s
          ORDER BY thread_id, turn_id LIMIT %s) k
    WHERE t.thread_id = k.thread_id AND t.turn_id = k.turn_id AND t.pruned_at IS NULL
    RETURNING t.thread_id, t.turn_id
"""

# A turn's journal is pruned whole (see ``operations.prune``): the turns whose newest
# entry is older than the cutoff, in key order (``ik_journal_pkey``'s), after the cursor.
STALE_JOURNALS = """
    SELECT thread_id, turn_id FROM ik_journal
    WHERE (thread_id, turn_id) > (%s, %s)
    GROUP BY thread_id, turn_id HAVING max(created_at) < %s
    ORDER BY thread_id, turn_id LIMIT %s
"""
# Then each turn's entries, all or none, under its thread's lock: an entry written
# since the scan (a redelivery that ran meanwhile) keeps them all.
PRUNE_JOURNAL = """
    DELETE FROM ik_journal WHERE thread_id = %(thread_id)s AND turn_id = %(turn_id)s
    AND NOT EXISTS (
        SELECT 1 FROM ik_journal WHERE thread_id = %(thread_id)s AND turn_id = %(turn_id)s
        AND created_at >= %(before)s)
"""


def receipts_query(
    thread_id: str | None, status: ReceiptStatus | None, tenant_id: str | None
) -> tuple[str, dict[str, Any]]:
    """The query of ``read_receipts`` and its parameters. The status goes in as a
    literal (one of the four), so that the generic plan can use the partial index of
    unsettled receipts for what operators list most."""
    filters = {"thread_id": thread_id, "tenant_id": tenant_id}
    conditions = [f"r.{k} = %({k})s" for k, v in filters.items() if v is not None]
    if status is not None:
        conditions.append(f"r.status = '{ReceiptStatus(status).value}'")
    where = " AND ".join(conditions)
    query = f"{READ_RECEIPTS} {where and 'WHERE ' + where} "
    return query + "ORDER BY r.created_at, r.ordinal", filters


# -- the inbox (see ``InboxRecorder``) --
SELECT_TURN_EXISTS = "SELECT 1 FROM ik_turns WHERE thread_id = %s AND turn_id = %s"
# An entry already there keeps its seq: the statement inserts nothing and the caller
# reads the entry's own seq and digest, to compare them (a conflict is an error).
INSERT_INBOX = """
    INSERT INTO ik_inbox (thread_id, turn_id, tenant_id, request_digest, request, created_at)
    VALUES (%s, %s, %s, %s, %s, %s)
    ON CONFLICT ON CONSTRAINT ik_inbox_turn DO NOTHING RETURNING seq
"""
SELECT_INBOX_ENTRY = (
    "SELECT seq, request_digest FROM ik_inbox WHERE thread_id = %s AND turn_id = %s"
)
INBOX_POSITION = "SELECT COUNT(*) FROM ik_inbox WHERE thread_id = %s AND seq <= %s"
SELECT_INBOX = """
    SELECT turn_id, tenant_id, request_digest, request, created_at, seq FROM ik_inbox
    WHERE thread_id = %s ORDER BY seq
"""
DELETE_INBOX = "DELETE FROM ik_inbox WHERE thread_id = %s AND turn_id = %s"
# A request already there keeps its first reason: asking again changes nothing.
INSERT_CANCEL = """
    INSERT INTO ik_cancels (thread_id, turn_id, reason, created_at) VALUES (%s, %s, %s, %s)
    ON CONFLICT ON CONSTRAINT ik_cancels_pkey DO NOTHING
"""
# Interrupting the same turn twice asks one thing: the second request changes nothing.
INSERT_INTERRUPT = """
    INSERT INTO ik_interrupts (thread_id, base_version, created_at) VALUES (%s, %s, %s)
    ON CONFLICT ON CONSTRAINT ik_interrupts_pkey DO NOTHING
"""
SELECT_VERSION = "SELECT version FROM ik_threads WHERE thread_id = %s"
# A cancel (kind 0) sorts before an interrupt (kind 1).
SELECT_CANCEL = """
    SELECT 0 AS kind, reason FROM ik_cancels WHERE thread_id = %s AND turn_id = %s
    UNION ALL
    SELECT 1, NULL FROM ik_interrupts WHERE thread_id = %s AND base_version = %s
    ORDER BY kind LIMIT 1
"""
