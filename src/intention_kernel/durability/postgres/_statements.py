"""The PostgreSQL adapter's statements, as named constants.

The schema is in ``_schema``. So are the functions that start a turn, prepare a
receipt and commit a turn. A statement SQLite sends alike is written once, in
:mod:`intention_kernel.durability._layout.sql`. It is rendered here with psycopg's
placeholders (``postgres``)."""

from __future__ import annotations

from typing import Any

from intention_kernel._effects import ReceiptStatus
from intention_kernel.durability._layout import sql as _sql
from intention_kernel.durability._layout.rows import (
    OUTBOX_COLUMNS,
    RECEIPT_COLUMNS,
)
from intention_kernel.durability._layout.sql import postgres
from intention_kernel.durability._layout.timer_rows import TIMER_COLUMNS
from intention_kernel.durability.postgres._schema import CHECKPOINT_ROWS

LOCK_XACT = "SELECT pg_advisory_xact_lock(%s)"
# After waiting for LOCK_XACT, this session's caches lack the catalog changes that
# the lock's previous holder committed. PostgreSQL takes them in at a transaction's
# start. It also does when the session locks a relation it had not locked in this
# transaction. An advisory lock does neither. Take a session warm from earlier work,
# as a pooler's server sessions are. It answers ``CREATE SCHEMA IF NOT EXISTS`` from
# its cache ("no such schema"). Its insert of the schema then meets the committed
# one: UniqueViolation. Locking a catalog takes the changes in, if nothing before it
# in the transaction touched it. The security labels catalog is such a one. Anyone
# may read it, and the lock blocks nothing.
ABSORB_CATALOG_CHANGES = "LOCK TABLE pg_catalog.pg_seclabel IN ACCESS SHARE MODE"

# -- leases (see LEASES in ``_schema``) --
# The fence every write of a lease holder carries, in the same statement. It is the
# row of its lease, still at its epoch and alive on the server's clock. The row is
# locked FOR SHARE until the statement's transaction ends. Taking the lease over
# updates that row, so the two conflict. Either the write locked it first: the taker
# waits for the write's commit. The write then happened before the takeover, which
# reads it. Or the taker locked it first: the write waits and re-reads the row (READ
# COMMITTED). It finds another epoch and writes nothing. A write can therefore never
# land after another holder took the thread. MATERIALIZED keeps the planner from folding it away.
FENCE = """lease AS MATERIALIZED (
        SELECT epoch FROM ik_leases
        WHERE thread_id = %(thread_id)s AND kind = %(lease_kind)s AND epoch = %(lease_epoch)s
          AND owner = %(lease_owner)s AND expires_at > clock_timestamp()
        FOR SHARE)"""
# A lease still alive is extended from now, by the server's clock. One that lapsed or
# moved on is not: no row comes back, and the holder lost it.
RENEW_LEASE = """
    UPDATE ik_leases SET expires_at = clock_timestamp() + %(expiry)s
    WHERE thread_id = %(thread_id)s AND kind = %(lease_kind)s AND epoch = %(lease_epoch)s
      AND owner = %(lease_owner)s AND expires_at > clock_timestamp()
    RETURNING true
"""
# Let go at the end of a turn that did not commit (a commit releases its own lease).
# The owner names one acquisition (see ``_new_owner``), so it also releases a lease
# whose grant was interrupted before its epoch came back.
RELEASE_LEASE = """
    UPDATE ik_leases SET expires_at = 'epoch'
    WHERE thread_id = %(thread_id)s AND kind = %(lease_kind)s AND owner = %(lease_owner)s
      AND expires_at > clock_timestamp()
"""
# A lease taken without a turn (``lock``: operator actions, relay claims). It names
# no turn (migration 23).
TAKE_LEASE = """
    INSERT INTO ik_leases AS l (thread_id, kind, owner, epoch, expires_at)
    VALUES (%(thread_id)s, %(lease_kind)s, %(lease_owner)s, 1, clock_timestamp() + %(expiry)s)
    ON CONFLICT (thread_id, kind) DO UPDATE
        SET owner = excluded.owner, epoch = l.epoch + 1, turn_id = NULL,
            expires_at = clock_timestamp() + %(expiry)s
        WHERE l.expires_at <= clock_timestamp()
    RETURNING l.epoch
"""
# The portability probe's row, and its attempt at a takeover (see ``_probe``).
LEASE_PROBE_ROW = """
    INSERT INTO ik_leases (thread_id, kind, owner, epoch, expires_at)
    VALUES (%(thread_id)s, %(lease_kind)s, %(lease_owner)s, %(lease_epoch)s,
            clock_timestamp() + interval '1 minute')
"""
TRY_LEASE_UPDATE = """
    UPDATE ik_leases SET epoch = epoch + 1
    WHERE thread_id = %(thread_id)s AND kind = %(lease_kind)s
"""
# Inside a transaction: the fence alone, its row lock held to the transaction's end.
HOLD_LEASE = "WITH " + FENCE + " SELECT count(*) FROM lease"
# Whether a lease is still held, read without a lock: asked after a refused settle
# (see ``write_receipt``). A lease once lost never comes back, so the answer holds.
LEASE_HELD = """
    SELECT EXISTS (
        SELECT 1 FROM ik_leases
        WHERE thread_id = %(thread_id)s AND kind = %(lease_kind)s AND epoch = %(lease_epoch)s
          AND owner = %(lease_owner)s AND expires_at > clock_timestamp())
"""

SELECT_THREAD = (
    "SELECT version, tenant_id, checkpoint,"
    + CHECKPOINT_ROWS.format(ship="true", thread_id="%(thread_id)s")
    + "FROM ik_threads WHERE thread_id = %(thread_id)s"
)


READ_RECEIPTS = postgres(_sql.READ_RECEIPTS)
SELECT_RECEIPT = postgres(_sql.SELECT_RECEIPT)
_RECEIPT_VALUES = """%(id)s, %(thread_id)s, %(key)s, %(status)s, %(turn_id)s, %(step_id)s,
            %(attempt)s, %(value)s, %(error)s, %(created_at)s, %(updated_at)s, %(resolution)s,
            %(announced)s, %(tenant_id)s, %(actor)s, %(capability_id)s, %(input)s,
            %(approved_by)s"""
# Receipt writes of a lease holder: each answers whether the lease held (``leased``)
# and how many rows it wrote. The write reads the fence, so it writes nothing without it.
INSERT_RECEIPT = f"""
    WITH {FENCE}, written AS (
        INSERT INTO ik_receipts ({RECEIPT_COLUMNS})
        SELECT {_RECEIPT_VALUES} FROM lease
        RETURNING 1)
    SELECT (SELECT count(*) FROM lease), (SELECT count(*) FROM written)
"""
# The previous library's prepare (schema versions up to 20): the adapter now calls
# ``ik_prepare_receipt``, which does the same. Kept to test that a worker of that
# library still prepares on an upgraded schema.
# The first call of an effect key, in one round trip: insert the planned receipt
# unless one exists. Not a conflict hidden: no row inserted means the caller reads the
# existing receipt and plans from it (``claim_effect``).
INSERT_RECEIPT_IF_NEW = f"""
    WITH {FENCE}, written AS (
        INSERT INTO ik_receipts ({RECEIPT_COLUMNS})
        SELECT {_RECEIPT_VALUES} FROM lease
        ON CONFLICT (thread_id, key) DO NOTHING
        RETURNING 1)
    SELECT (SELECT count(*) FROM lease), (SELECT count(*) FROM written)
"""
# Compare-and-set: the receipt must still be in the state the caller last saw, and
# the caller must hold the thread's lease.
UPDATE_RECEIPT = f"""
    WITH {FENCE}, written AS (
        UPDATE ik_receipts
        SET status = %(status)s, turn_id = %(turn_id)s, step_id = %(step_id)s,
            attempt = %(attempt)s, value = %(value)s, error = %(error)s,
            resolution = %(resolution)s, updated_at = %(updated_at)s,
            announced = %(announced)s, actor = %(actor)s,
            capability_id = %(capability_id)s, input = %(input)s, approved_by = %(approved_by)s
        FROM lease
        WHERE thread_id = %(thread_id)s AND key = %(key)s
          AND status = %(expected_status)s AND attempt = %(expected_attempt)s
        RETURNING 1)
    SELECT (SELECT count(*) FROM lease), (SELECT count(*) FROM written)
"""
# The outcome of an attempt (see ``is_settlement``). It is a compare-and-set on the
# attempt that prepared it. It writes (and sends) only what an outcome changes. It is
# not fenced by the lease: the outcome is a fact about that one attempt. ``prepared``
# with its attempt number names that attempt exactly. (A later attempt has another
# number.) So an outcome known after the lease was lost is still recorded. The
# exception: the next holder already made the receipt uncertain, or an operator
# resolved it. This write never undoes either.
SETTLE_RECEIPT = postgres(_sql.SETTLE_RECEIPT)


BUMP_THREAD_SEQ = postgres(_sql.BUMP_THREAD_SEQ)
# Events are born without a position; see SEQUENCE_OUTBOX.
INSERT_EVENT = postgres(_sql.INSERT_EVENT)
HAS_UNSEQUENCED = "SELECT EXISTS (SELECT 1 FROM ik_outbox WHERE position IS NULL)"
# The row lock on the counter makes numbering one transaction at a time. Each
# later statement of a READ COMMITTED transaction takes a fresh snapshot. So it
# sees every event committed before the previous numbering committed. Positions
# are handed out in blocks, each block after all earlier ones. A reader's snapshot
# therefore always sees a prefix of the blocks. (REPEATABLE READ would break this:
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
# No ON CONFLICT: an entry already there is a conflict (the lease was lost), refused by
# ``ik_journal_pkey``. Fenced: no entry is written without the lease.
INSERT_JOURNAL = f"""
    WITH {FENCE}, written AS (
        INSERT INTO ik_journal (thread_id, turn_id, key, request_digest, value, created_at,
                                tenant_id)
        SELECT %(thread_id)s, %(turn_id)s, %(key)s, %(request_digest)s, %(value)s,
               %(created_at)s, %(tenant_id)s
        FROM lease
        RETURNING 1)
    SELECT (SELECT count(*) FROM lease), (SELECT count(*) FROM written)
"""
# The same with a streamed turn's segment (``StreamRecorder``), in one statement.
INSERT_JOURNAL_STREAMED = f"""
    WITH {FENCE}, written AS (
        INSERT INTO ik_journal (thread_id, turn_id, key, request_digest, value, created_at,
                                tenant_id)
        SELECT %(thread_id)s, %(turn_id)s, %(key)s, %(request_digest)s, %(value)s,
               %(created_at)s, %(tenant_id)s
        FROM lease
        RETURNING 1), streamed AS (
        INSERT INTO ik_streams (thread_id, turn_id, segment, events, created_at)
        SELECT %(thread_id)s, %(turn_id)s, %(segment)s, %(events)s, %(created_at)s
        FROM lease
        RETURNING 1)
    SELECT (SELECT count(*) FROM lease), (SELECT count(*) FROM written)
"""
SELECT_STREAM_TURN = """
    SELECT request_digest, result, pruned_at IS NOT NULL FROM ik_turns
    WHERE thread_id = %s AND turn_id = %s
"""
SELECT_STREAM = postgres(_sql.SELECT_STREAM)
SELECT_JOURNAL_ENTRY = """
    SELECT request_digest, value, created_at, tenant_id FROM ik_journal
    WHERE thread_id = %s AND turn_id = %s AND key = %s
"""

# -- the relay (see ``Recorder.claim_outbox``) --
# The relay publishes numbered events only; it numbers what is committed first. A
# thread's numbered events are a prefix of its events by ``seq``. That is because
# numbering follows ``ord``, and a thread's turns commit one after another. So every
# published event has a position, and a consumer reading ``read_outbox`` sees it.
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
# Marks of a relay that claimed the thread. They are fenced by its claim, a lease of
# kind 'relay'. So a relay whose claim lapsed never marks what another relay owns.
MARK_PUBLISHED = f"""
    WITH {FENCE}
    UPDATE ik_outbox SET published_at = %(at)s FROM lease
    WHERE thread_id = %(thread_id)s AND seq = ANY(%(seqs)s) AND published_at IS NULL
"""
MARK_FAILED = f"""
    WITH {FENCE}
    UPDATE ik_outbox SET attempts = %(attempts)s, last_error = %(error)s,
        retry_at = %(retry_at)s
    FROM lease
    WHERE thread_id = %(thread_id)s AND seq = %(seq)s AND published_at IS NULL
"""
SELECT_BACKLOG = postgres(_sql.SELECT_BACKLOG)
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
# Candidates for the threads with an active interaction (see INTERACTION_MARKER). It
# is a text search of each core, with no JSON parsed. A ``::json`` cast would parse
# every core. One corrupt core would then fail the whole query without naming its
# thread.
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
DELETE_MESSAGES = postgres(_sql.DELETE_MESSAGES)
INSERT_MESSAGES = """
    INSERT INTO ik_messages (thread_id, seq, body)
    SELECT %s, %s + m.n - 1, m.body FROM unnest(%s::text[]) WITH ORDINALITY AS m(body, n)
"""
DELETE_FACTS = postgres(_sql.DELETE_FACTS)
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
# Only turns that still hold a result are selected, after the cursor. So a run never
# reads (nor ships) the keys of turns pruned before. An index on the unpruned turns
# would spare the server its walk of the key index too. Its price is one more index
# write per committed turn. Retention runs from cron; turns run all day. ``t.pruned_at IS NULL``
# again in the UPDATE: a concurrent prune that took the row first is not counted twice.
PRUNE_TURNS = """
    WITH pruned AS (
        UPDATE ik_turns t SET result = '', pruned_at = now()
        FROM (SELECT thread_id, turn_id FROM ik_turns
              WHERE (thread_id, turn_id) > (%s, %s) AND pruned_at IS NULL AND created_at < %s
              ORDER BY thread_id, turn_id LIMIT %s) k
        WHERE t.thread_id = k.thread_id AND t.turn_id = k.turn_id AND t.pruned_at IS NULL
        RETURNING t.thread_id, t.turn_id), streams AS (
        DELETE FROM ik_streams s USING pruned p
        WHERE s.thread_id = p.thread_id AND s.turn_id = p.turn_id)
    SELECT thread_id, turn_id FROM pruned
"""

PRUNE_CANCELS = postgres(_sql.PRUNE_CANCELS)
# An interrupt older than the cutoff on a base the thread has moved past stops nothing.
PRUNE_INTERRUPTS = """
    DELETE FROM ik_interrupts i USING ik_threads th
    WHERE i.thread_id = %(thread)s AND th.thread_id = i.thread_id
    AND i.created_at < %(before)s AND i.base_version < th.version
"""
STALE_JOURNALS = postgres(_sql.STALE_JOURNALS)
# Then each turn's entries go, all or none, under its thread's lease. An entry written
# since the scan keeps them all: a redelivery ran meanwhile. Fenced, so a pruner
# whose lease lapsed deletes nothing.
PRUNE_JOURNAL = f"""
    WITH {FENCE}, gone AS (
        DELETE FROM ik_journal USING lease
        WHERE thread_id = %(thread_id)s AND turn_id = %(turn_id)s
        AND NOT EXISTS (
            SELECT 1 FROM ik_journal WHERE thread_id = %(thread_id)s AND turn_id = %(turn_id)s
            AND created_at >= %(before)s)
        RETURNING 1), streams AS (
        DELETE FROM ik_streams
        WHERE thread_id = %(thread_id)s AND turn_id = %(turn_id)s AND EXISTS (SELECT 1 FROM gone))
    SELECT count(*) FROM gone
"""


def receipts_query(
    thread_id: str | None, status: ReceiptStatus | None, tenant_id: str | None
) -> tuple[str, dict[str, Any]]:
    """The query of ``read_receipts`` and its parameters.

    The status goes in as a literal, one of the four. So the generic plan can use the
    partial index of unsettled receipts. That is what operators list most."""
    filters = {"thread_id": thread_id, "tenant_id": tenant_id}
    conditions = [f"r.{k} = %({k})s" for k, v in filters.items() if v is not None]
    if status is not None:
        conditions.append(f"r.status = '{ReceiptStatus(status).value}'")
    where = " AND ".join(conditions)
    query = f"{READ_RECEIPTS} {where and 'WHERE ' + where} "
    return query + "ORDER BY r.created_at, r.ordinal", filters


# -- the inbox (see ``InboxRecorder``) --
SELECT_TURN_EXISTS = postgres(_sql.SELECT_TURN_EXISTS)
# An entry already there keeps its seq: the statement inserts nothing. The caller
# reads the entry's own seq and digest, to compare them. A conflict is an error.
INSERT_INBOX = """
    INSERT INTO ik_inbox
        (thread_id, turn_id, tenant_id, request_digest, request, created_at, steer)
    VALUES (%s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT ON CONSTRAINT ik_inbox_turn DO NOTHING RETURNING seq
"""
SELECT_INBOX_ENTRY = postgres(_sql.SELECT_INBOX_ENTRY)
INBOX_POSITION = postgres(_sql.INBOX_POSITION)
SELECT_INBOX = postgres(_sql.SELECT_INBOX)
SELECT_TAKER = postgres(_sql.SELECT_TAKER)
# A round boundary of a turn takes the steers nobody took, and reads all it took.
TAKE_STEERS = """
    UPDATE ik_inbox SET taken_by = %(turn)s
    WHERE thread_id = %(thread)s AND steer AND taken_by IS NULL AND turn_id <> %(turn)s
"""
# The steer back in the inbox, unless its taker committed. It is fenced by the lease.
# The lease row stays shared-locked to the end, so a takeover waits for it.
RELEASE_STEER = (
    "WITH "
    + FENCE
    + """
    UPDATE ik_inbox i SET taken_by = NULL
    WHERE i.thread_id = %(thread)s AND i.turn_id = %(turn)s AND i.taken_by = %(taker)s
      AND EXISTS (SELECT 1 FROM lease)
      AND NOT EXISTS (
          SELECT 1 FROM ik_turns t WHERE t.thread_id = i.thread_id AND t.turn_id = i.taken_by)
"""
)
SELECT_TAKEN = postgres(_sql.SELECT_TAKEN)
DELETE_INBOX = postgres(_sql.DELETE_INBOX)
# A cancel dequeues only an entry whose turn has not started; a started one runs on.
# A queued copy of a turn that holds the thread's lease stays: the turn runs, in any
# process, and stops at its next safe point. The copy then replays its commit. Without
# the lease check, the cancel answered "dequeued" for a turn that still ran.
DEQUEUE_UNSTARTED = """
    DELETE FROM ik_inbox WHERE thread_id = %(thread)s AND turn_id = %(turn)s AND NOT started
    AND NOT EXISTS (
        SELECT 1 FROM ik_leases
        WHERE thread_id = %(thread)s AND kind = 'turn' AND turn_id = %(turn)s
          AND expires_at > clock_timestamp())
"""
START_QUEUED = (
    "UPDATE ik_inbox SET started = true WHERE thread_id = %(thread)s AND turn_id = %(turn)s"
)
SELECT_STARTED = "SELECT started FROM ik_inbox WHERE thread_id = %(thread)s AND turn_id = %(turn)s"
# A request already there keeps its first reason: asking again changes nothing. Each
# request is stored under its caller's scope (``ownership.cancel_scope``).
INSERT_CANCEL = """
    INSERT INTO ik_cancels (thread_id, turn_id, reason, created_at, scope)
    VALUES (%s, %s, %s, %s, %s)
    ON CONFLICT ON CONSTRAINT ik_cancels_pkey DO NOTHING
"""
# The owner of a thread, for a scoped stop request, as a one-element array. It is the
# tenant of its committed turns. Else it is that of its first receipt. Else it is
# that of its first journal entry.
SELECT_CANCEL_OWNER = """
    SELECT COALESCE(
        (SELECT ARRAY[th.tenant_id] FROM ik_threads th
         WHERE th.thread_id = %(t)s AND th.version > 0),
        (SELECT ARRAY[r.tenant_id] FROM ik_receipts r
         WHERE r.thread_id = %(t)s ORDER BY r.ordinal LIMIT 1),
        (SELECT ARRAY[j.tenant_id] FROM ik_journal j
         WHERE j.thread_id = %(t)s ORDER BY j.ordinal LIMIT 1))
"""
SELECT_INBOX_TENANT = postgres(_sql.SELECT_INBOX_TENANT)
# One row per sender, with the seq of its entry (none left: it ran, nothing to stop).
# The same sender asking twice asks one thing: the second request changes nothing.
INSERT_INTERRUPT = """
    INSERT INTO ik_interrupts (thread_id, base_version, turn_id, scope, seq, created_at)
    SELECT thread_id, %(base)s, turn_id, %(scope)s, seq, %(at)s FROM ik_inbox
    WHERE thread_id = %(thread)s AND turn_id = %(turn)s
    ON CONFLICT ON CONSTRAINT ik_interrupts_pkey DO NOTHING
"""
SELECT_VERSION = postgres(_sql.SELECT_VERSION)
# What each turn should stop for, one turn or many at once: the i-th answer by
# ``i``. A cancel (kind 0) sorts before an interrupt (kind 1). An interrupt stops the
# turn if another sender of its tenant asked it, accepted after the turn's own entry.
SELECT_CANCELS = """
    SELECT k.i, c.kind, c.reason
    FROM unnest(%(threads)s::text[], %(turns)s::text[], %(scopes)s::text[], %(bases)s::bigint[])
        WITH ORDINALITY AS k(thread, turn, scope, base, i)
    CROSS JOIN LATERAL (
        SELECT 0 AS kind, reason FROM ik_cancels
        WHERE thread_id = k.thread AND turn_id = k.turn AND scope IN ('*', k.scope)
        UNION ALL
        SELECT 1, NULL FROM ik_interrupts
        WHERE thread_id = k.thread AND base_version = k.base AND turn_id <> k.turn
        AND scope IN ('*', k.scope)
        AND seq > COALESCE(
            (SELECT seq FROM ik_inbox WHERE thread_id = k.thread AND turn_id = k.turn), 0)
        ORDER BY kind LIMIT 1
    ) AS c
"""


# -- timers ---------------------------------------------------------------------------------

_TIMER_VALUES = ", ".join(["%s"] * 14)
_TIMER_UPDATE = ", ".join(
    f"{c} = excluded.{c}" for c in TIMER_COLUMNS.replace(" ", "").split(",")[2:]
)
# A write replaces the timer: setting a key again moves it (not a conflict hidden).
UPSERT_TIMER = f"""
    INSERT INTO ik_timers ({TIMER_COLUMNS}) VALUES ({_TIMER_VALUES})
    ON CONFLICT (thread_id, key) DO UPDATE SET {_TIMER_UPDATE}
"""
DELETE_TIMER = postgres(_sql.DELETE_TIMER)
SELECT_TIMER = postgres(_sql.SELECT_TIMER)
SELECT_TIMERS = f"""
    SELECT {TIMER_COLUMNS} FROM ik_timers
    WHERE (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s)
      AND (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(after_thread)s::text IS NULL
           OR (thread_id, key) > (%(after_thread)s, %(after_key)s))
    ORDER BY thread_id, key LIMIT %(limit)s
"""
# SKIP LOCKED: a worker claiming at the same time takes other rows instead of waiting.
# A row it locked is claimed by one of them only: the update re-checks the claim.
CLAIM_TIMERS = f"""
    UPDATE ik_timers t SET claimed_until = %(until)s
    FROM (SELECT thread_id, key FROM ik_timers
          WHERE status = 'pending' AND due_at <= %(now)s
            AND (claimed_until IS NULL OR claimed_until <= %(now)s)
          ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
    WHERE t.thread_id = c.thread_id AND t.key = c.key
    RETURNING {", ".join("t." + c for c in TIMER_COLUMNS.replace(" ", "").split(","))}
"""
PRUNE_TIMERS = postgres(_sql.PRUNE_TIMERS)
