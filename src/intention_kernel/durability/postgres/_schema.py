"""The PostgreSQL schema: its migrations, and the turn-start function one of them creates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from intention_kernel.durability._rows import stored_thread
from intention_kernel.durability.abc import StoredTurn, ThreadOwner, TurnStart

__all__ = [
    "BEGIN_TURN",
    "CHECKPOINT_ROWS",
    "MIGRATIONS",
    "START_TURN",
    "turn_start",
]

# A thread's checkpoint rows: messages oldest first, facts as [key, body] pairs in
# recording order (``ordinal`` survives an upsert). Scalar subqueries in a CASE run
# only when the branch is taken.
CHECKPOINT_ROWS = """
    CASE WHEN {ship} THEN (SELECT array_agg(body ORDER BY seq) FROM ik_messages
                           WHERE thread_id = {thread_id}) END,
    CASE WHEN {ship} THEN (SELECT array_agg(ARRAY[key, body] ORDER BY ordinal) FROM ik_facts
                           WHERE thread_id = {thread_id}) END
"""
# A turn's start in one round trip, as schema versions 6 to 12 had it (migration 13
# replaces it by ``ik_start_turn_leased``, below): ``ik_start_turn(lock, thread, turn, known)``.
#
# First the committed turn: found, it is returned as it is, without the lock (a
# replay writes nothing, and a committed turn never changes but for its pruning).
# Else ``pg_try_advisory_lock``: not granted, no row (the caller waits and calls
# again). Granted, a second query reads, in one snapshot taken after the lock was
# granted (a VOLATILE function takes one per query, under READ COMMITTED), what the
# lock's previous holder committed: the committed turn if it came meanwhile, else the
# thread row and its checkpoint rows (not shipped for a replay, which never decodes
# them, nor when the caller holds this version already, ``known``). For a new turn
# on a thread with no committed turn, also the tenant of its first receipt, as a
# one-element array (NULL: no receipt), which claimed the thread
# (``TurnStart.claimed_by``): a probe of the receipts' primary key that the first turn
# of each thread pays, and no other. ``locked`` says whether the lock was taken. With
# ``lock`` NULL, only the second query runs (``begin_turn``, under a lock already held).
#
# One statement instead of a lock and a read costs the client one round trip less,
# and the CPU psycopg's asyncio driver spends on it. The two IFs stay apart: SQL
# does not promise to evaluate ``FOUND OR NOT pg_try_advisory_lock(...)`` left to
# right, and a lock taken for a replay would never be released.
_RECEIPT_CLAIM = """(SELECT ARRAY[r.tenant_id] FROM ik_receipts r
                                       WHERE r.thread_id = p_thread
                                       ORDER BY r.ordinal LIMIT 1)"""
# The claim since migration 12: the first receipt's tenant or, with no receipt, the
# first journal entry's (a turn that recorded rounds and never committed). Each probe
# walks its table's primary key on ``thread_id``; an ARRAY[NULL] (no tenant) is not
# NULL, so COALESCE moves on only when the thread has no receipt at all.
_RECEIPT_OR_JOURNAL_CLAIM = """COALESCE(
                   (SELECT ARRAY[r.tenant_id] FROM ik_receipts r
                    WHERE r.thread_id = p_thread ORDER BY r.ordinal LIMIT 1),
                   (SELECT ARRAY[j.tenant_id] FROM ik_journal j
                    WHERE j.thread_id = p_thread ORDER BY j.ordinal LIMIT 1))"""


def _start_turn_function(claim: str) -> str:
    """``ik_start_turn``'s definition, with ``claim`` as the expression of the tenant
    that claimed a thread with no committed turn (a one-element array, or NULL)."""
    return (
        """
CREATE OR REPLACE FUNCTION ik_start_turn(p_lock bigint, p_thread text, p_turn text,
                                         p_known bigint)
RETURNS TABLE (locked boolean, request_digest text, result text, expired boolean,
               version bigint, tenant_id text, claimed_by text[], checkpoint text,
               messages text[], facts text[])
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    IF p_lock IS NOT NULL THEN
        RETURN QUERY
            SELECT false, t.request_digest, t.result, t.pruned_at IS NOT NULL, th.version,
                   th.tenant_id, NULL::text[], NULL::text, NULL::text[], NULL::text[]
            FROM ik_turns t LEFT JOIN ik_threads th ON th.thread_id = p_thread
            WHERE t.thread_id = p_thread AND t.turn_id = p_turn;
        IF FOUND THEN
            RETURN;
        END IF;
        IF NOT pg_try_advisory_lock(p_lock) THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
        WITH found AS (
            SELECT t.request_digest, t.result, t.pruned_at IS NOT NULL AS expired,
                   th.version, th.tenant_id, th.checkpoint,
                   t.turn_id IS NULL AND th.version IS DISTINCT FROM p_known AS ship,
                   t.turn_id IS NULL AND COALESCE(th.version, 0) = 0 AS unowned
            FROM (SELECT 1) AS one
            LEFT JOIN ik_threads th ON th.thread_id = p_thread
            LEFT JOIN ik_turns t ON t.thread_id = p_thread AND t.turn_id = p_turn
        )
        SELECT p_lock IS NOT NULL, request_digest, result, expired, version, tenant_id,
               CASE WHEN unowned THEN """
        + claim
        + """ END,
               CASE WHEN ship THEN checkpoint END,
"""
        + CHECKPOINT_ROWS.format(ship="ship", thread_id="p_thread")
        + """
        FROM found;
END
$$;
"""
    )


START_TURN_FUNCTION = _start_turn_function(_RECEIPT_CLAIM)


def _start_turn_leased_function(create: str, take: str = "") -> str:
    """``ik_start_turn_leased``'s definition, made by ``create`` (``CREATE FUNCTION`` or
    ``CREATE OR REPLACE FUNCTION``), with ``take`` run just before the lease is taken."""
    return (
        create
        + """ ik_start_turn_leased(p_take boolean, p_thread text, p_turn text,
                                     p_known bigint, p_owner text, p_expiry interval)
RETURNS TABLE (epoch bigint, request_digest text, result text, expired boolean,
               version bigint, tenant_id text, claimed_by text[], checkpoint text,
               messages text[], facts text[])
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_epoch bigint;
BEGIN
    IF p_take THEN
        RETURN QUERY
            SELECT NULL::bigint, t.request_digest, t.result, t.pruned_at IS NOT NULL,
                   th.version, th.tenant_id, NULL::text[], NULL::text, NULL::text[],
                   NULL::text[]
            FROM ik_turns t LEFT JOIN ik_threads th ON th.thread_id = p_thread
            WHERE t.thread_id = p_thread AND t.turn_id = p_turn;
        IF FOUND THEN
            RETURN;
        END IF;
"""
        + take
        + """        INSERT INTO ik_leases AS l (thread_id, kind, owner, epoch, expires_at)
        VALUES (p_thread, 'turn', p_owner, 1, clock_timestamp() + p_expiry)
        ON CONFLICT (thread_id, kind) DO UPDATE
            SET owner = p_owner, epoch = l.epoch + 1,
                expires_at = clock_timestamp() + p_expiry
            WHERE l.expires_at <= clock_timestamp()
        RETURNING l.epoch INTO v_epoch;
        IF v_epoch IS NULL THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
        WITH found AS (
            SELECT t.request_digest, t.result, t.pruned_at IS NOT NULL AS expired,
                   th.version, th.tenant_id, th.checkpoint,
                   t.turn_id IS NULL AND th.version IS DISTINCT FROM p_known AS ship,
                   t.turn_id IS NULL AND COALESCE(th.version, 0) = 0 AS unowned
            FROM (SELECT 1) AS one
            LEFT JOIN ik_threads th ON th.thread_id = p_thread
            LEFT JOIN ik_turns t ON t.thread_id = p_thread AND t.turn_id = p_turn
        )
        SELECT v_epoch, request_digest, result, expired, version, tenant_id,
               CASE WHEN unowned THEN """
        + _RECEIPT_OR_JOURNAL_CLAIM
        + """ END,
               CASE WHEN ship THEN checkpoint END,
"""
        + CHECKPOINT_ROWS.format(ship="ship", thread_id="p_thread")
        + """
        FROM found;
END
$$;
"""
    )


# Thread leases (migration 13). A lease row per thread and kind ('turn' for turns and
# operator actions, 'relay' for the outbox relay): who holds it, a fencing ``epoch``
# and when it lapses, on the server's clock. Taking a lease bumps the epoch, so every
# holder has an epoch of its own; its writes name that epoch and fail once it moved.
# Rows are never deleted: a deleted row would restart its epoch at 1, and a holder of
# an earlier epoch 1 could write again. A released lease lapses at once (its expiry
# goes back to 1970).
#
# ``ik_start_turn_leased(take, thread, turn, known, owner, expiry)``: the committed turn
# if there is one, answered without a lease (a replay writes nothing); else the lease,
# taken only if it lapsed, and then the read, in a snapshot taken after the lease was
# granted (a VOLATILE function takes one per query, under READ COMMITTED). The upsert
# waits for the row lock of a commit that releases the lease, so the read that follows
# sees that commit. A thread with no committed turn is claimed by its first receipt's
# tenant or, with none, its first journal entry's (see migration 12). ``epoch`` is
# NULL for a replay; no row means another holder's lease is alive. With ``take``
# false only the read runs (``begin_turn``).
# ``SET search_path FROM CURRENT`` pins the function to its schema: behind a transaction
# pooler no session setting can be relied on.
LEASES = """
CREATE TABLE ik_leases (
    thread_id text NOT NULL, kind text NOT NULL, owner text NOT NULL,
    epoch bigint NOT NULL, expires_at timestamptz NOT NULL,
    CONSTRAINT ik_leases_pkey PRIMARY KEY (thread_id, kind)
);
DO $$
BEGIN
    -- lz4 for the long text columns, where the server has it: a session setting
    -- (default_toast_compression) did this before, and sessions carry no settings now.
    IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression'
               AND 'lz4' = ANY(enumvals)) THEN
        EXECUTE 'ALTER TABLE ik_threads ALTER COLUMN checkpoint SET COMPRESSION lz4';
        EXECUTE 'ALTER TABLE ik_turns ALTER COLUMN result SET COMPRESSION lz4';
        EXECUTE 'ALTER TABLE ik_journal ALTER COLUMN value SET COMPRESSION lz4';
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION ik_start_turn(p_lock bigint, p_thread text, p_turn text,
                                         p_known bigint)
RETURNS TABLE (locked boolean, request_digest text, result text, expired boolean,
               version bigint, tenant_id text, claimed_by text[], checkpoint text,
               messages text[], facts text[])
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'this intention-kernel schema uses thread leases (schema version 13); '
        'a worker of an older library shares it: upgrade every worker'
        USING ERRCODE = 'object_not_in_prerequisite_state';
END
$$;
""" + _start_turn_leased_function("CREATE FUNCTION")
# Migration 14: a lease's take commits without waiting for its WAL to reach the disk
# (``synchronous_commit`` off for that one transaction, ``set_config(..., true)``).
# Before, a turn waited for four flushes: the take, the receipt's prepare and
# settlement, and the commit. The take's commit is still visible to every session at
# once; only its durability waits for the WAL writer (a fraction of a second). Safe:
# - A take happens only on a lapsed lease, so a crash that forgets it leaves the row
#   lapsed (or absent) again, never alive for an earlier holder.
# - Every write of the holder is fenced by its epoch and its owner (a grant's own):
#   after a forgotten take the row names neither, so each write is refused. (The
#   next take may hand out the forgotten epoch again, to another owner.)
# - A write that commits flushes the WAL up to its own commit record, which follows
#   the take's: whatever a holder wrote durably, its lease was durable first.
# A poll of a busy thread locks the lease row: it waited for a flush too, now it does not.
ASYNC_LEASE_TAKE = _start_turn_leased_function(
    "CREATE OR REPLACE FUNCTION",
    "        PERFORM set_config('synchronous_commit', 'off', true);\n",
)
START_TURN = (
    "SELECT * FROM ik_start_turn_leased(true, %(thread_id)s, %(turn_id)s, %(known_version)s,"
    " %(owner)s, %(expiry)s)"
)
BEGIN_TURN = (
    "SELECT * FROM ik_start_turn_leased(false, %(thread_id)s, %(turn_id)s, %(known_version)s,"
    " NULL, NULL)"
)


#: Ordered schema migrations, run inside the adapter's schema (``search_path``);
#: the list index + 1 is the version recorded in ``ik_schema``. Append, never edit.
#: JSON is stored as ``text``, not ``jsonb``: the codecs produce and parse text,
#: so ``jsonb`` would only add a parse on write and a re-serialization on read
#: (and reorder keys), for queries this adapter never makes.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE ik_threads (
        thread_id text PRIMARY KEY, tenant_id text, version bigint NOT NULL,
        schema_revision integer, fingerprint text, checkpoint text,
        next_seq bigint NOT NULL, updated_at timestamptz NOT NULL
    );
    CREATE TABLE ik_turns (
        thread_id text NOT NULL, turn_id text NOT NULL, request_digest text,
        version bigint NOT NULL, result text NOT NULL, created_at timestamptz NOT NULL,
        CONSTRAINT ik_turns_pkey PRIMARY KEY (thread_id, turn_id)
    );
    CREATE TABLE ik_receipts (
        thread_id text NOT NULL, key text NOT NULL, id text NOT NULL UNIQUE,
        status text NOT NULL CONSTRAINT ik_receipts_status_check
            CHECK (status IN ('prepared', 'completed', 'failed', 'uncertain')),
        turn_id text NOT NULL, step_id text NOT NULL, attempt integer NOT NULL,
        value text, error text, resolution text,
        created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL,
        ordinal bigint GENERATED ALWAYS AS IDENTITY,
        CONSTRAINT ik_receipts_pkey PRIMARY KEY (thread_id, key)
    );
    CREATE INDEX ik_receipts_status ON ik_receipts (status);
    CREATE TABLE ik_outbox (
        ord bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        position bigint UNIQUE,
        id text NOT NULL UNIQUE, thread_id text NOT NULL, turn_id text,
        seq bigint NOT NULL, type text NOT NULL, payload text,
        created_at timestamptz NOT NULL,
        UNIQUE (thread_id, seq)
    );
    CREATE INDEX ik_outbox_unsequenced ON ik_outbox (ord) WHERE position IS NULL;
    CREATE TABLE ik_outbox_head (
        singleton boolean PRIMARY KEY CHECK (singleton), position bigint NOT NULL
    );
    INSERT INTO ik_outbox_head VALUES (true, 0);
    """,
    # 2: checkpoints in pieces, as in SQLite's migration 2: the thread row
    # keeps the core document, messages and facts get rows of their own. A checkpoint
    # still stored whole is read as it is and split on its thread's next commit.
    """
    ALTER TABLE ik_threads ADD COLUMN message_seq bigint NOT NULL DEFAULT 0;
    CREATE TABLE ik_messages (
        thread_id text NOT NULL, seq bigint NOT NULL, body text NOT NULL,
        CONSTRAINT ik_messages_pkey PRIMARY KEY (thread_id, seq)
    );
    CREATE TABLE ik_facts (
        thread_id text NOT NULL, key text NOT NULL, body text NOT NULL,
        ordinal bigint GENERATED ALWAYS AS IDENTITY,
        CONSTRAINT ik_facts_pkey PRIMARY KEY (thread_id, key)
    );
    """,
    # 3: operations, as in SQLite's migration 3: each event's publication
    # state for the relay, with a partial index of what is left to publish; whether a
    # completed receipt's write was announced (set for existing ones whose turn
    # committed or that an operator resolved); turns whose result retention pruned.
    """
    ALTER TABLE ik_outbox ADD COLUMN published_at timestamptz,
        ADD COLUMN attempts integer NOT NULL DEFAULT 0, ADD COLUMN last_error text,
        ADD COLUMN retry_at timestamptz;
    CREATE INDEX ik_outbox_unpublished ON ik_outbox (thread_id, seq)
        WHERE published_at IS NULL;
    ALTER TABLE ik_receipts ADD COLUMN announced boolean NOT NULL DEFAULT false;
    UPDATE ik_receipts r SET announced = true
    WHERE status = 'completed' AND (resolution IS NOT NULL OR EXISTS (
        SELECT 1 FROM ik_turns t WHERE t.thread_id = r.thread_id AND t.turn_id = r.turn_id));
    ALTER TABLE ik_turns ADD COLUMN pruned_at timestamptz;
    """,
    # 4: each receipt records its tenant, as in SQLite's migration 4: a thread
    # with no committed turn belongs to the tenant of its first receipt. Existing
    # receipts of a committed thread take its owner; the others keep NULL, which
    # refuses every tenant's turn on their thread (unknown fails closed). No index:
    # ``list_receipts(tenant_id=...)`` is an operator's query, and every receipt write
    # of the hot path would pay for one.
    """
    ALTER TABLE ik_receipts ADD COLUMN tenant_id text;
    UPDATE ik_receipts r SET tenant_id = th.tenant_id FROM ik_threads th
    WHERE th.thread_id = r.thread_id AND th.version > 0;
    """,
    # 5: the index on every receipt's status becomes one of the unsettled receipts only
    # (what an operator lists: uncertain ones, and prepared ones a dead attempt left).
    # The full index cost a new entry at every status change, grew with every receipt
    # ever written, and the generic plan of UPDATE_RECEIPT walked it (all the prepared
    # receipts) instead of the primary key; a partial index cannot serve ``status = $n``
    # in a generic plan, so the compare-and-set always probes the primary key.
    """
    DROP INDEX ik_receipts_status;
    CREATE INDEX ik_receipts_unsettled ON ik_receipts (status)
        WHERE status IN ('prepared', 'uncertain');
    """,
    # 6: a turn starts in one round trip (see START_TURN).
    START_TURN_FUNCTION,
    # 7: a turn row lists the receipts its effect.completed events announced, as in
    # SQLite's migration 5: a receipt that the turn named by its ``turn_id``
    # completed and announced needs no mark of its own, one UPDATE fewer per commit.
    """
    ALTER TABLE ik_turns ADD COLUMN announced text[];
    """,
    # 8: the journal, as in SQLite's migration 6: what a turn recorded before its
    # commit, one row per (thread, turn, key), read back in ``ordinal`` (write) order.
    # Only turns in flight and turns that never committed have rows (a commit deletes
    # its own), so retention's scan by ``created_at`` needs no index.
    """
    CREATE TABLE ik_journal (
        thread_id text NOT NULL, turn_id text NOT NULL, key text NOT NULL,
        request_digest text, value text NOT NULL, created_at timestamptz NOT NULL,
        ordinal bigint GENERATED ALWAYS AS IDENTITY,
        CONSTRAINT ik_journal_pkey PRIMARY KEY (thread_id, turn_id, key)
    );
    """,
    # 9: each receipt names who approved its write, as in SQLite's migration 7; older
    # receipts read NULL, no actor. Adding a nullable column without a default rewrites
    # no rows.
    """
    ALTER TABLE ik_receipts ADD COLUMN actor text;
    """,
    # 10: each receipt says what its write was, as in SQLite's migration 9; older
    # receipts read NULL. Nullable columns without defaults rewrite no rows.
    """
    ALTER TABLE ik_receipts ADD COLUMN capability_id text, ADD COLUMN input text,
        ADD COLUMN approved_by text;
    """,
    # 11: each thread's inbox, as in SQLite's migration 10: messages accepted while a
    # turn ran (``on_busy="queue"``), ordered by ``seq``, the order of acceptance; and
    # the requests to stop a turn (``Kernel.cancel``).
    """
    CREATE TABLE ik_inbox (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        thread_id text NOT NULL, turn_id text NOT NULL, tenant_id text,
        request_digest text, request text NOT NULL, created_at timestamptz NOT NULL,
        CONSTRAINT ik_inbox_turn UNIQUE (thread_id, turn_id)
    );
    CREATE INDEX ik_inbox_order ON ik_inbox (thread_id, seq);
    CREATE TABLE ik_cancels (
        thread_id text NOT NULL, turn_id text NOT NULL, reason text,
        created_at timestamptz NOT NULL,
        CONSTRAINT ik_cancels_pkey PRIMARY KEY (thread_id, turn_id)
    );
    CREATE TABLE ik_interrupts (
        thread_id text NOT NULL, base_version bigint NOT NULL,
        created_at timestamptz NOT NULL,
        CONSTRAINT ik_interrupts_pkey PRIMARY KEY (thread_id, base_version)
    );
    """,
    # 12: each journal entry records its tenant, as in SQLite's migration 11: an entry
    # claims a thread with no committed turn, as a receipt does, and only its tenant's
    # turn may read it. Existing entries on a committed thread take its owner; the
    # others keep NULL (no tenant), as migration 4 left receipts: unknown fails closed.
    # ``ik_start_turn`` reads the journal's claim after the receipts'.
    """
    ALTER TABLE ik_journal ADD COLUMN tenant_id text;
    UPDATE ik_journal j SET tenant_id = th.tenant_id FROM ik_threads th
    WHERE th.thread_id = j.thread_id AND th.version > 0;
    """
    + _start_turn_function(_RECEIPT_OR_JOURNAL_CLAIM),
    # 13: thread leases replace session advisory locks (see LEASES). The old turn-start
    # function now refuses: a worker of an older library, still running, fails its next
    # turn with this message instead of locking threads that leases do not see.
    LEASES,
    # 14: LangGraph's checkpoints, for ``KernelSaver``, as in SQLite's migration 12: a
    # checkpoint row, a row per pending write, and each namespace's latest checkpoint,
    # which a put moves only from the parent it names (compare-and-set).
    """
    CREATE TABLE ik_lg_checkpoints (
        thread_id text NOT NULL, checkpoint_ns text NOT NULL, checkpoint_id text NOT NULL,
        parent_id text, type text NOT NULL, checkpoint bytea NOT NULL,
        metadata_type text NOT NULL, metadata bytea NOT NULL, run_id text,
        CONSTRAINT ik_lg_checkpoints_pkey PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
    );
    CREATE INDEX ik_lg_checkpoints_run ON ik_lg_checkpoints (run_id) WHERE run_id IS NOT NULL;
    CREATE TABLE ik_lg_writes (
        thread_id text NOT NULL, checkpoint_ns text NOT NULL, checkpoint_id text NOT NULL,
        task_id text NOT NULL, idx integer NOT NULL, channel text NOT NULL,
        type text NOT NULL, value bytea NOT NULL, task_path text NOT NULL,
        CONSTRAINT ik_lg_writes_pkey
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    );
    CREATE TABLE ik_lg_heads (
        thread_id text NOT NULL, checkpoint_ns text NOT NULL, checkpoint_id text NOT NULL,
        CONSTRAINT ik_lg_heads_pkey PRIMARY KEY (thread_id, checkpoint_ns)
    );
    """,
    # 15: a streamed turn's events, by segment (``StreamRecorder``): written with the
    # journal entry of each round, kept after the commit deletes the entry, read by
    # the turn's watchers in any process.
    """
    CREATE TABLE IF NOT EXISTS ik_streams (
        thread_id text NOT NULL, turn_id text NOT NULL, segment integer NOT NULL,
        events text NOT NULL, created_at timestamptz NOT NULL,
        CONSTRAINT ik_streams_pkey PRIMARY KEY (thread_id, turn_id, segment)
    );
    """,
    # 16: each thread's timers, as in SQLite's migration 14: one row per key; workers
    # claim the due ones through ``ik_timers_due``, pending rows only, earliest first.
    """
    CREATE TABLE ik_timers (
        thread_id text NOT NULL, key text NOT NULL, tenant_id text,
        due_at timestamptz NOT NULL, message text, data text,
        unless_version_after bigint, every_us bigint, status text NOT NULL,
        set_at timestamptz, settled_at timestamptz, turn_id text,
        claimed_until timestamptz, cron text,
        CONSTRAINT ik_timers_pkey PRIMARY KEY (thread_id, key)
    );
    CREATE INDEX ik_timers_due ON ik_timers (due_at) WHERE status = 'pending';
    """,
    # 17: the lease's take commits without a flush of its own (see ASYNC_LEASE_TAKE).
    # Same signature and answers: a worker of the previous library, still running, goes
    # on calling it.
    ASYNC_LEASE_TAKE,
    # 18: each stop request records its caller's scope, as in SQLite's migration 15:
    # ``'*'`` for any tenant, else the tenant it stops; a turn reads only its own
    # tenant's and those for any. Requests stored before were made for any tenant.
    # The key gains the scope: one tenant's request never keeps another's out.
    """
    ALTER TABLE ik_cancels ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT '*';
    ALTER TABLE ik_cancels ALTER COLUMN scope DROP DEFAULT;
    ALTER TABLE ik_cancels DROP CONSTRAINT ik_cancels_pkey;
    ALTER TABLE ik_cancels
        ADD CONSTRAINT ik_cancels_pkey PRIMARY KEY (thread_id, turn_id, scope);
    """,
    # 19: steering, as in SQLite's migration 16: ``steer`` marks a message for the
    # running turn, ``taken_by`` names the turn whose round boundary took it.
    """
    ALTER TABLE ik_inbox ADD COLUMN IF NOT EXISTS steer boolean NOT NULL DEFAULT false;
    ALTER TABLE ik_inbox ADD COLUMN IF NOT EXISTS taken_by text;
    """,
    # 20: an interrupt names its sender, as in SQLite's migration 17: one row per
    # sender's turn ID and tenant scope, with the seq of its inbox entry. Rows stored
    # before (and rows a worker of the previous library still writes) take the
    # defaults: any sender, any tenant, the largest seq, their meaning until now.
    # ``ik_inbox.started`` marks an entry whose turn began: a cancel no longer
    # dequeues it (it answers ``"requested"``), as the turn runs on.
    """
    ALTER TABLE ik_inbox ADD COLUMN IF NOT EXISTS started boolean NOT NULL DEFAULT false;
    ALTER TABLE ik_interrupts ADD COLUMN IF NOT EXISTS turn_id text NOT NULL DEFAULT '';
    ALTER TABLE ik_interrupts ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT '*';
    ALTER TABLE ik_interrupts
        ADD COLUMN IF NOT EXISTS seq bigint NOT NULL DEFAULT 9223372036854775807;
    ALTER TABLE ik_interrupts DROP CONSTRAINT ik_interrupts_pkey;
    ALTER TABLE ik_interrupts ADD CONSTRAINT ik_interrupts_pkey
        PRIMARY KEY (thread_id, base_version, turn_id, scope);
    """,
)


CREATE_SCHEMA_TABLE = """
    CREATE TABLE IF NOT EXISTS ik_schema (
        version integer PRIMARY KEY, applied_at timestamptz NOT NULL
    )
"""
HAS_SCHEMA_TABLE = "SELECT to_regclass('ik_schema') IS NOT NULL"
# The same from a session whose search_path was not set (``exists``).
HAS_STORE = "SELECT to_regclass(format('%%I.ik_schema', %s::text)) IS NOT NULL"
SELECT_SCHEMA_VERSION = "SELECT COALESCE(MAX(version), 0) FROM ik_schema"
INSERT_SCHEMA_VERSION = "INSERT INTO ik_schema (version, applied_at) VALUES (%s, now())"


def turn_start(row: Sequence[Any]) -> TurnStart:
    """A row of ``ik_start_turn_leased`` without its ``epoch`` column."""
    digest, result, expired, version, tenant_id, claim, *stored = row
    if result is not None:
        return TurnStart(StoredTurn(digest, result, bool(expired)), None, tenant_id)
    claimed_by = None if claim is None else ThreadOwner(claim[0])
    if version is None:
        return TurnStart(None, None, claimed_by=claimed_by)
    return TurnStart(None, stored_thread(version, tenant_id, *stored), claimed_by=claimed_by)
