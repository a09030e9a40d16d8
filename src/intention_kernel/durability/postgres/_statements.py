"""The PostgreSQL adapter's statements, as named constants (the schema and the
turn-start function are in ``_schema``, the commit statement in ``_commit``)."""

from __future__ import annotations

from typing import Any

from intention_kernel.durability._rows import OUTBOX_COLUMNS, RECEIPT_COLUMNS, select_receipts
from intention_kernel.durability._timer_rows import TIMER_COLUMNS
from intention_kernel.durability.postgres._schema import CHECKPOINT_ROWS
from intention_kernel.effects import ReceiptStatus

LOCK_XACT = "SELECT pg_advisory_xact_lock(%s)"
# After waiting for LOCK_XACT, the catalog changes its previous holder committed are
# not yet in this session's caches. PostgreSQL takes them in at a transaction's start,
# or when the session locks a relation it had not locked in this transaction; an
# advisory lock does neither. A session warm from earlier work (as a pooler's server
# sessions are) then answers ``CREATE SCHEMA IF NOT EXISTS`` from its cache ("no such
# schema"), and its insert of the schema meets the committed one: UniqueViolation.
# Locking a catalog that nothing before it in the transaction touches (security
# labels) takes the changes in; anyone may read it, and the lock blocks nothing.
ABSORB_CATALOG_CHANGES = "LOCK TABLE pg_catalog.pg_seclabel IN ACCESS SHARE MODE"

# -- leases (see LEASES in ``_schema``) --
# The fence every write of a lease holder carries, in the same statement: the row of
# its lease, still at its epoch and alive on the server's clock, locked FOR SHARE
# until the statement's transaction ends. Taking the lease over updates that row, so
# the two conflict: either the write locked it first, and the taker waits for the
# write's commit (the write then happened before the takeover, which reads it), or
# the taker did, and the write waits, re-reads the row (READ COMMITTED) and finds
# another epoch: it writes nothing. A write can therefore never land after another
# holder took the thread. MATERIALIZED keeps the planner from folding it away.
FENCE = """lease AS MATERIALIZED (
        SELECT epoch FROM ik_leases
        WHERE thread_id = %(thread_id)s AND kind = %(lease_kind)s AND epoch = %(lease_epoch)s
          AND owner = %(lease_owner)s AND expires_at > clock_timestamp()
        FOR SHARE)"""
# A lease still alive is extended from now, by the server's clock; one that lapsed or
# moved on is not (no row: the holder lost it).
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
# A lease taken without a turn (``lock``: operator actions, relay claims).
TAKE_LEASE = """
    INSERT INTO ik_leases AS l (thread_id, kind, owner, epoch, expires_at)
    VALUES (%(thread_id)s, %(lease_kind)s, %(lease_owner)s, 1, clock_timestamp() + %(expiry)s)
    ON CONFLICT (thread_id, kind) DO UPDATE
        SET owner = excluded.owner, epoch = l.epoch + 1,
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

SELECT_THREAD = (
    "SELECT version, tenant_id, checkpoint,"
    + CHECKPOINT_ROWS.format(ship="true", thread_id="%(thread_id)s")
    + "FROM ik_threads WHERE thread_id = %(thread_id)s"
)


READ_RECEIPTS = select_receipts(RECEIPT_COLUMNS)
SELECT_RECEIPT = f"{READ_RECEIPTS} WHERE r.thread_id = %s AND r.key = %s"
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
# The outcome of an attempt (see ``is_settlement``): a compare-and-set on the attempt
# that prepared it, writing (and sending) only what an outcome changes. Not fenced by
# the lease: the outcome is a fact about that one attempt, and ``prepared`` with its
# attempt number names it exactly (a later attempt has another number). So an outcome
# known after the lease was lost is still recorded, unless the next holder already made
# the receipt uncertain (or an operator resolved it), which this write never undoes.
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
SELECT_STREAM = """
    SELECT segment, events FROM ik_streams WHERE thread_id = %s AND turn_id = %s
    ORDER BY segment
"""
SELECT_JOURNAL_ENTRY = """
    SELECT request_digest, value, created_at, tenant_id FROM ik_journal
    WHERE thread_id = %s AND turn_id = %s AND key = %s
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
# Marks of a relay that claimed the thread, fenced by its claim (a lease of kind
# 'relay'), so that a relay whose claim lapsed never marks what another relay owns.
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

# The stop requests of a pruned turn go with its result: it can never run again.
PRUNE_CANCELS = "DELETE FROM ik_cancels WHERE thread_id = %s AND turn_id = %s"
# An interrupt older than the cutoff on a base the thread has moved past stops nothing.
PRUNE_INTERRUPTS = """
    DELETE FROM ik_interrupts i USING ik_threads th
    WHERE i.thread_id = %(thread)s AND th.thread_id = i.thread_id
    AND i.created_at < %(before)s AND i.base_version < th.version
"""
# A turn's journal is pruned whole (see ``operations.prune``): the turns whose newest
# entry is older than the cutoff, in key order (``ik_journal_pkey``'s), after the cursor.
STALE_JOURNALS = """
    SELECT thread_id, turn_id FROM ik_journal
    WHERE (thread_id, turn_id) > (%s, %s)
    GROUP BY thread_id, turn_id HAVING max(created_at) < %s
    ORDER BY thread_id, turn_id LIMIT %s
"""
# Then each turn's entries, all or none, under its thread's lease: an entry written
# since the scan (a redelivery that ran meanwhile) keeps them all. Fenced, so a
# pruner whose lease lapsed deletes nothing.
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
    INSERT INTO ik_inbox
        (thread_id, turn_id, tenant_id, request_digest, request, created_at, steer)
    VALUES (%s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT ON CONSTRAINT ik_inbox_turn DO NOTHING RETURNING seq
"""
SELECT_INBOX_ENTRY = (
    "SELECT seq, request_digest FROM ik_inbox WHERE thread_id = %s AND turn_id = %s"
)
INBOX_POSITION = """
    SELECT COUNT(*) FROM ik_inbox WHERE thread_id = %s AND seq <= %s AND taken_by IS NULL
"""
SELECT_INBOX = """
    SELECT turn_id, tenant_id, request_digest, request, created_at, seq, steer, taken_by
    FROM ik_inbox WHERE thread_id = %s AND taken_by IS NULL ORDER BY seq
"""
# The turn that took a steer: its turn ID replays that turn's result.
SELECT_TAKER = """
    SELECT taken_by FROM ik_inbox
    WHERE thread_id = %s AND turn_id = %s AND taken_by IS NOT NULL
"""
# A round boundary of a turn takes the steers nobody took, and reads all it took.
TAKE_STEERS = """
    UPDATE ik_inbox SET taken_by = %(turn)s
    WHERE thread_id = %(thread)s AND steer AND taken_by IS NULL AND turn_id <> %(turn)s
"""
SELECT_TAKEN = """
    SELECT turn_id, tenant_id, request_digest, request, created_at, seq, steer, taken_by
    FROM ik_inbox WHERE thread_id = %s AND taken_by = %s ORDER BY seq
"""
DELETE_INBOX = "DELETE FROM ik_inbox WHERE thread_id = %s AND turn_id = %s"
# A cancel dequeues only an entry whose turn has not started; a started one runs on.
DEQUEUE_UNSTARTED = "DELETE FROM ik_inbox WHERE thread_id = %s AND turn_id = %s AND NOT started"
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
# The owner of a thread, for a scoped stop request: the tenant of its committed turns,
# else of its first receipt, else of its first journal entry (a one-element array).
SELECT_CANCEL_OWNER = """
    SELECT COALESCE(
        (SELECT ARRAY[th.tenant_id] FROM ik_threads th
         WHERE th.thread_id = %(t)s AND th.version > 0),
        (SELECT ARRAY[r.tenant_id] FROM ik_receipts r
         WHERE r.thread_id = %(t)s ORDER BY r.ordinal LIMIT 1),
        (SELECT ARRAY[j.tenant_id] FROM ik_journal j
         WHERE j.thread_id = %(t)s ORDER BY j.ordinal LIMIT 1))
"""
SELECT_INBOX_TENANT = "SELECT tenant_id FROM ik_inbox WHERE thread_id = %s AND turn_id = %s"
# One row per sender, with the seq of its entry (none left: it ran, nothing to stop).
# The same sender asking twice asks one thing: the second request changes nothing.
INSERT_INTERRUPT = """
    INSERT INTO ik_interrupts (thread_id, base_version, turn_id, scope, seq, created_at)
    SELECT thread_id, %(base)s, turn_id, %(scope)s, seq, %(at)s FROM ik_inbox
    WHERE thread_id = %(thread)s AND turn_id = %(turn)s
    ON CONFLICT ON CONSTRAINT ik_interrupts_pkey DO NOTHING
"""
SELECT_VERSION = "SELECT version FROM ik_threads WHERE thread_id = %s"
# A cancel (kind 0) sorts before an interrupt (kind 1). An interrupt stops the turn
# if another sender of its tenant asked it, accepted after the turn's own entry.
SELECT_CANCEL = """
    SELECT 0 AS kind, reason FROM ik_cancels
    WHERE thread_id = %(thread)s AND turn_id = %(turn)s AND scope IN ('*', %(scope)s)
    UNION ALL
    SELECT 1, NULL FROM ik_interrupts
    WHERE thread_id = %(thread)s AND base_version = %(base)s AND turn_id <> %(turn)s
    AND scope IN ('*', %(scope)s)
    AND seq > COALESCE(
        (SELECT seq FROM ik_inbox WHERE thread_id = %(thread)s AND turn_id = %(turn)s), 0)
    ORDER BY kind LIMIT 1
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
DELETE_TIMER = "DELETE FROM ik_timers WHERE thread_id = %s AND key = %s"
SELECT_TIMER = f"SELECT {TIMER_COLUMNS} FROM ik_timers WHERE thread_id = %s AND key = %s"
SELECT_TIMERS = f"""
    SELECT {TIMER_COLUMNS} FROM ik_timers
    WHERE (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s)
      AND (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(after_thread)s::text IS NULL
           OR (thread_id, key) > (%(after_thread)s, %(after_key)s))
    ORDER BY thread_id, key LIMIT %(limit)s
"""
# SKIP LOCKED: a worker claiming at the same time takes other rows instead of waiting,
# and a row it locked is claimed by one of them only (the update re-checks the claim).
CLAIM_TIMERS = f"""
    UPDATE ik_timers t SET claimed_until = %(until)s
    FROM (SELECT thread_id, key FROM ik_timers
          WHERE status = 'pending' AND due_at <= %(now)s
            AND (claimed_until IS NULL OR claimed_until <= %(now)s)
          ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
    WHERE t.thread_id = c.thread_id AND t.key = c.key
    RETURNING {", ".join("t." + c for c in TIMER_COLUMNS.replace(" ", "").split(","))}
"""
PRUNE_TIMERS = """
    DELETE FROM ik_timers WHERE (thread_id, key) IN (
        SELECT thread_id, key FROM ik_timers
        WHERE status <> 'pending' AND settled_at < %s LIMIT %s)
"""
