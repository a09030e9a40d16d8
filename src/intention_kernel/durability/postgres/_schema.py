"""The PostgreSQL schema: its migrations, and the turn-start function one of them creates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from intention_kernel.durability._layout.rows import stored_thread
from intention_kernel.durability.abc import StoredTurn, ThreadOwner, TurnStart

__all__ = [
    "BEGIN_TURN",
    "CHECKPOINT_ROWS",
    "COMMIT_TURN",
    "MIGRATIONS",
    "PREPARE_RECEIPT",
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
# A turn's start in one round trip, as schema versions 6 to 12 had it:
# ``ik_start_turn(lock, thread, turn, known)``. Migration 13 replaces it by
# ``ik_start_turn_leased``, below.
#
# First the committed turn: found, it is returned as it is, without the lock. A
# replay writes nothing, and a committed turn never changes but for its pruning.
# Else ``pg_try_advisory_lock``: not granted, no row (the caller waits and calls
# again). Granted, a second query reads what the lock's previous holder committed.
# It reads in one snapshot taken after the lock was granted: a VOLATILE function
# takes one per query, under READ COMMITTED. It returns the committed turn if it came
# meanwhile. Else it returns the thread row and its checkpoint rows. Those rows are
# not shipped for a replay, which never decodes them. Nor are they shipped when the
# caller holds this version already (``known``). A new turn on a thread with no
# committed turn also gets the tenant of its first receipt. That tenant claimed the
# thread (``TurnStart.claimed_by``); it comes as a one-element array, NULL for no
# receipt. Only the first turn of each thread pays this probe of the receipts'
# primary key. ``locked`` says whether the lock was taken. With ``lock`` NULL, only
# the second query runs (``begin_turn``, under a lock already held).
#
# One statement instead of a lock and a read saves the client one round trip. It
# also saves the CPU psycopg's asyncio driver spends on that trip. The two IFs stay
# apart: SQL does not promise to evaluate ``FOUND OR NOT pg_try_advisory_lock(...)``
# left to right. A lock taken for a replay would never be released.
_RECEIPT_CLAIM = """(SELECT ARRAY[r.tenant_id] FROM ik_receipts r
                                       WHERE r.thread_id = p_thread
                                       ORDER BY r.ordinal LIMIT 1)"""
# The claim since migration 12: the first receipt's tenant. With no receipt, it is
# the first journal entry's tenant (a turn that recorded rounds and never committed).
# Each probe walks its table's primary key on ``thread_id``. An ARRAY[NULL] (no
# tenant) is not NULL. So COALESCE moves on only when the thread has no receipt at all.
_RECEIPT_OR_JOURNAL_CLAIM = """COALESCE(
                   (SELECT ARRAY[r.tenant_id] FROM ik_receipts r
                    WHERE r.thread_id = p_thread ORDER BY r.ordinal LIMIT 1),
                   (SELECT ARRAY[j.tenant_id] FROM ik_journal j
                    WHERE j.thread_id = p_thread ORDER BY j.ordinal LIMIT 1))"""


def _start_turn_function(claim: str) -> str:
    """``ik_start_turn``'s definition, with ``claim`` as the claim's expression.

    The claim is the tenant that claimed a thread with no committed turn. It is a
    one-element array, or NULL."""
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


_LEASE_COLUMNS = "thread_id, kind, owner, epoch, expires_at"


def _start_turn_leased_function(create: str, take: str = "", turn: bool = False) -> str:
    """``ik_start_turn_leased``'s definition, made by ``create`` (``CREATE FUNCTION`` or
    ``CREATE OR REPLACE FUNCTION``), with ``take`` run just before the lease is taken.
    ``turn``: the take writes the turn's ID on the lease row (migration 23)."""
    columns, values, update = "", "", ""
    if turn:
        columns, values, update = ", turn_id", ", p_turn", " turn_id = p_turn,"
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
        + f"""        INSERT INTO ik_leases AS l ({_LEASE_COLUMNS}{columns})
        VALUES (p_thread, 'turn', p_owner, 1, clock_timestamp() + p_expiry{values})
        ON CONFLICT (thread_id, kind) DO UPDATE
            SET owner = p_owner, epoch = l.epoch + 1,{update}
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


# Thread leases (migration 13). There is a lease row per thread and kind: 'turn' for
# turns and operator actions, 'relay' for the outbox relay. It says who holds it,
# its fencing ``epoch``, and when it lapses on the server's clock. Taking a lease
# bumps the epoch, so every holder has an epoch of its own. Its writes name that
# epoch and fail once it moved.
# Rows are never deleted. A deleted row would restart its epoch at 1. A holder of an
# earlier epoch 1 could then write again. A released lease lapses at once (its expiry
# goes back to 1970).
#
# ``ik_start_turn_leased(take, thread, turn, known, owner, expiry)`` returns the
# committed turn if there is one, without a lease: a replay writes nothing. Else it
# takes the lease, only if the lease lapsed, and then reads. The read's snapshot is
# taken after the lease was granted: a VOLATILE function takes one per query, under
# READ COMMITTED. The upsert waits for the row lock of a commit that releases the
# lease. So the read that follows sees that commit. A thread with no committed turn
# is claimed by its first receipt's tenant. With no receipt, its first journal
# entry's tenant claims it (see migration 12). ``epoch`` is
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
# Migration 14: a lease's take commits without waiting for its WAL to reach the disk.
# ``synchronous_commit`` is off for that one transaction (``set_config(..., true)``).
# Before, a turn waited for four flushes: the take, the receipt's prepare and
# settlement, and the commit. The take's commit is still visible to every session at
# once. Only its durability waits for the WAL writer, a fraction of a second. Safe:
# - A take happens only on a lapsed lease. A crash that forgets it leaves the row
#   lapsed (or absent) again, never alive for an earlier holder.
# - Every write of the holder is fenced by its epoch and its owner (a grant's own).
#   After a forgotten take the row names neither, so each write is refused. (The
#   next take may hand out the forgotten epoch again, to another owner.)
# - A write that commits flushes the WAL up to its own commit record. That record
#   follows the take's. So whatever a holder wrote durably, its lease was durable first.
# A poll of a busy thread locks the lease row: it waited for a flush too, now it does not.
ASYNC_LEASE_TAKE = _start_turn_leased_function(
    "CREATE OR REPLACE FUNCTION",
    "        PERFORM set_config('synchronous_commit', 'off', true);\n",
)
# Migration 23: the take writes the turn's ID on the lease row, in the same statement.
# A cancel then sees which turn holds the thread, in any process (``DEQUEUE_UNSTARTED``).
# Same signature and answers: a worker of the previous library calls it unchanged,
# and its turns are marked too. Its ``lock`` leaves an earlier turn's ID on the row.
# That costs only a cancel answering ``"requested"`` while the row is alive.
TURN_ON_LEASE = (
    "ALTER TABLE ik_leases ADD COLUMN IF NOT EXISTS turn_id text;\n"
    + _start_turn_leased_function(
        "CREATE OR REPLACE FUNCTION",
        "        PERFORM set_config('synchronous_commit', 'off', true);\n",
        turn=True,
    )
)
# Migration 21: a receipt's prepare as a function, ``ik_prepare_receipt``. The same
# fence and insert as INSERT_RECEIPT_IF_NEW, but a function's statements are planned
# once per server session and kept. A statement sent as text is parsed and planned at
# every call. No statement is prepared on the server, for transaction poolers' sake.
# For the prepare's CTE that cost about 0.2 ms of server time, every write effect.
# The lease row is locked FOR SHARE first, to the end of the call's transaction, as
# FENCE does. ``leased``: the lease held; ``written``: the receipt was new. Nothing is
# written without the lease. A worker of the previous library keeps its CTE, which
# needs no function.
PREPARE_RECEIPT_FUNCTION = """
CREATE OR REPLACE FUNCTION ik_prepare_receipt(
    p_thread text, p_kind text, p_epoch bigint, p_owner text, p_id text, p_key text,
    p_status text, p_turn text, p_step text, p_attempt integer, p_value text, p_error text,
    p_created timestamptz, p_updated timestamptz, p_resolution text, p_announced boolean,
    p_tenant text, p_actor text, p_capability text, p_input text, p_approved text,
    OUT leased boolean, OUT written boolean)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM 1 FROM ik_leases
    WHERE thread_id = p_thread AND kind = p_kind AND epoch = p_epoch AND owner = p_owner
      AND expires_at > clock_timestamp()
    FOR SHARE;
    leased := FOUND;
    written := false;
    IF leased THEN
        INSERT INTO ik_receipts (id, thread_id, key, status, turn_id, step_id, attempt, value,
                                 error, created_at, updated_at, resolution, announced,
                                 tenant_id, actor, capability_id, input, approved_by)
        VALUES (p_id, p_thread, p_key, p_status, p_turn, p_step, p_attempt, p_value, p_error,
                p_created, p_updated, p_resolution, p_announced, p_tenant, p_actor,
                p_capability, p_input, p_approved)
        ON CONFLICT (thread_id, key) DO NOTHING;
        written := FOUND;
    END IF;
END
$$;
"""
# Its call: short, so cheap to parse; the casts pick the function without a doubt.
PREPARE_RECEIPT = (
    "SELECT * FROM ik_prepare_receipt(%(thread_id)s, %(lease_kind)s, %(lease_epoch)s::bigint,"
    " %(lease_owner)s, %(id)s, %(key)s, %(status)s, %(turn_id)s, %(step_id)s,"
    " %(attempt)s::integer, %(value)s, %(error)s, %(created_at)s, %(updated_at)s,"
    " %(resolution)s, %(announced)s, %(tenant_id)s, %(actor)s, %(capability_id)s,"
    " %(input)s, %(approved_by)s)"
)
# Migration 22: a turn's commit as a function, ``ik_commit_turn``. The reason is the
# prepare's: it is planned once per server session, not at every call. It writes
# what the previous library's one-statement commit (a CTE) wrote, in one transaction.
# Its parts run one after another; a part with nothing to do is skipped. In order:
# - the lease: still at the turn's epoch and owner, and alive, it lapses at once (the
#   release commits with the turn). Not held: nothing is written, ``lease_held`` false;
# - the thread's compare-and-set. The first commit inserts the row, or takes one
#   left at version 0 by operator events. A later one updates the version the turn
#   loaded.
#   Refused: ``new_next_seq`` is NULL, and only the release commits;
# - the turn row and its events, numbered from the thread's new ``next_seq``;
# - the checkpoint's rows. Deletes go before inserts, so a delete never meets a row
#   this commit wrote. The CTE's parts shared one snapshot for that reason;
# - the journal of the turn, and the thread's timers.
# Keys are probed one at a time (``LATERAL ... LIMIT 1``), as the CTE did: a generic
# plan of ``key = ANY(...)`` read every row of the thread. A turn ID committed
# meanwhile violates ``ik_turns_pkey`` and rolls the whole call back, release included.
COMMIT_TURN_FUNCTION = """
CREATE OR REPLACE FUNCTION ik_commit_turn(
    p_first boolean, p_thread text, p_epoch bigint, p_owner text, p_turn text,
    p_tenant text, p_digest text, p_expected bigint, p_version bigint, p_result text,
    p_checkpoint text, p_revision integer, p_fingerprint text, p_created timestamptz,
    p_announced text[], p_event_ids text[], p_event_types text[], p_event_payloads text[],
    p_messages text[], p_keep bigint, p_trim bigint, p_rewrite boolean, p_fact_keys text[],
    p_fact_bodies text[], p_removed_facts text[], p_mark_announced text[],
    p_journaled boolean, p_timer_rows jsonb, p_timer_deletes text[],
    OUT new_next_seq bigint, OUT lease_held boolean)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    v_events integer := COALESCE(cardinality(p_event_ids), 0);
    v_appended integer := COALESCE(cardinality(p_messages), 0);
    v_message_seq bigint;
BEGIN
    UPDATE ik_leases SET expires_at = 'epoch'
    WHERE thread_id = p_thread AND kind = 'turn' AND epoch = p_epoch AND owner = p_owner
      AND expires_at > clock_timestamp();
    lease_held := FOUND;
    IF NOT lease_held THEN
        RETURN;
    END IF;
    IF p_first THEN
        INSERT INTO ik_threads AS th (thread_id, tenant_id, version, schema_revision,
                                      fingerprint, checkpoint, next_seq, updated_at,
                                      message_seq)
        VALUES (p_thread, p_tenant, p_version, p_revision, p_fingerprint, p_checkpoint,
                1 + v_events, p_created, v_appended)
        ON CONFLICT (thread_id) DO UPDATE SET
            tenant_id = excluded.tenant_id, version = excluded.version,
            schema_revision = excluded.schema_revision, fingerprint = excluded.fingerprint,
            checkpoint = excluded.checkpoint, next_seq = th.next_seq + v_events,
            updated_at = excluded.updated_at, message_seq = th.message_seq + v_appended
        WHERE th.version = 0
        RETURNING th.next_seq, th.message_seq INTO new_next_seq, v_message_seq;
    ELSE
        UPDATE ik_threads th
        SET version = p_version, schema_revision = p_revision, fingerprint = p_fingerprint,
            checkpoint = p_checkpoint, next_seq = th.next_seq + v_events,
            updated_at = p_created, message_seq = th.message_seq + v_appended
        WHERE th.thread_id = p_thread AND th.version = p_expected
          AND th.tenant_id IS NOT DISTINCT FROM p_tenant
        RETURNING th.next_seq, th.message_seq INTO new_next_seq, v_message_seq;
    END IF;
    IF new_next_seq IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO ik_turns (thread_id, turn_id, request_digest, version, result, created_at,
                          announced)
    VALUES (p_thread, p_turn, p_digest, p_version, p_result, p_created, p_announced);
    IF v_events > 0 THEN
        INSERT INTO ik_outbox (id, thread_id, turn_id, seq, type, payload, created_at)
        SELECT e.id, p_thread, p_turn, new_next_seq - v_events + e.n - 1, e.type, e.payload,
               p_created
        FROM unnest(p_event_ids, p_event_types, p_event_payloads)
             WITH ORDINALITY AS e(id, type, payload, n)
        ORDER BY e.n;  -- so that ``ord`` follows ``seq`` (see SEQUENCE_OUTBOX)
    END IF;
    IF p_trim > 0 THEN
        DELETE FROM ik_messages m
        WHERE m.thread_id = p_thread AND m.seq > v_message_seq - p_keep - p_trim
          AND m.seq <= v_message_seq - p_keep;
    END IF;
    IF p_rewrite THEN
        DELETE FROM ik_messages m WHERE m.thread_id = p_thread;
        DELETE FROM ik_facts f
        WHERE f.thread_id = p_thread AND NOT f.key = ANY(COALESCE(p_fact_keys, '{}'));
    END IF;
    IF v_appended > 0 THEN
        INSERT INTO ik_messages (thread_id, seq, body)
        SELECT p_thread, v_message_seq - v_appended + m.n, m.body
        FROM unnest(p_messages) WITH ORDINALITY AS m(body, n);
    END IF;
    IF cardinality(p_removed_facts) > 0 THEN
        DELETE FROM ik_facts f
        USING unnest(p_removed_facts) AS gone(key), LATERAL (
            SELECT ctid FROM ik_facts WHERE thread_id = p_thread AND key = gone.key
            LIMIT 1) AS found
        WHERE f.ctid = found.ctid;
    END IF;
    IF cardinality(p_fact_keys) > 0 THEN
        INSERT INTO ik_facts AS f (thread_id, key, body)
        SELECT p_thread, n.key, n.body
        FROM unnest(p_fact_keys, p_fact_bodies) WITH ORDINALITY AS n(key, body, n)
        ORDER BY n.n  -- so that ``ordinal`` follows the checkpoint's order
        ON CONFLICT (thread_id, key) DO UPDATE SET body = excluded.body;
    END IF;
    IF cardinality(p_mark_announced) > 0 THEN
        UPDATE ik_receipts r SET announced = r.status = 'completed'
        FROM unnest(p_mark_announced) AS said(key), LATERAL (
            SELECT ctid FROM ik_receipts WHERE thread_id = p_thread AND key = said.key
            LIMIT 1) AS found
        WHERE r.ctid = found.ctid;
    END IF;
    IF p_journaled THEN
        DELETE FROM ik_journal j WHERE j.thread_id = p_thread AND j.turn_id = p_turn;
    END IF;
    IF p_timer_rows IS NOT NULL THEN
        INSERT INTO ik_timers AS t (thread_id, key, tenant_id, due_at, message, data,
                                    unless_version_after, every_us, status, set_at,
                                    settled_at, turn_id, claimed_until, cron)
        SELECT p_thread, r.key, r.tenant_id, r.due_at, r.message, r.data,
               r.unless_version_after, r.every_us, r.status, r.set_at, r.settled_at,
               r.turn_id, NULL, r.cron
        FROM jsonb_to_recordset(p_timer_rows) AS r(
            key text, tenant_id text, due_at timestamptz, message text, data text,
            unless_version_after bigint, every_us bigint, status text,
            set_at timestamptz, settled_at timestamptz, turn_id text, cron text)
        ON CONFLICT (thread_id, key) DO UPDATE SET
            tenant_id = excluded.tenant_id, due_at = excluded.due_at,
            message = excluded.message, data = excluded.data,
            unless_version_after = excluded.unless_version_after,
            every_us = excluded.every_us, status = excluded.status,
            set_at = excluded.set_at, settled_at = excluded.settled_at,
            turn_id = excluded.turn_id, claimed_until = NULL, cron = excluded.cron;
    END IF;
    IF cardinality(p_timer_deletes) > 0 THEN
        DELETE FROM ik_timers t WHERE t.thread_id = p_thread AND t.key = ANY(p_timer_deletes);
    END IF;
END
$$;
"""
# Its call. Arrays go in binary (``%(...)b``), as the CTE's did. The text format
# escapes every quote of every JSON element. That cost more than the round trip. An
# empty array goes as NULL, which every part reads as nothing to do.
COMMIT_TURN = (
    "SELECT * FROM ik_commit_turn(%(first)s, %(thread_id)s, %(lease_epoch)s::bigint,"
    " %(lease_owner)s, %(turn_id)s, %(tenant_id)s, %(request_digest)s,"
    " %(expected_version)s::bigint, %(version)s::bigint, %(result)s, %(checkpoint)s,"
    " %(schema_revision)s::integer, %(fingerprint)s, %(created_at)s,"
    " %(announced)b::text[], %(event_ids)b::text[], %(event_types)b::text[],"
    " %(event_payloads)b::text[], %(messages)b::text[], %(keep_messages)s::bigint,"
    " %(trim_messages)s::bigint, %(rewrite)s, %(fact_keys)b::text[], %(fact_bodies)b::text[],"
    " %(removed_facts)b::text[], %(mark_announced)b::text[], %(journaled)s,"
    " %(timer_rows)s::jsonb, %(timer_deletes)s::text[])"
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
#: JSON is stored as ``text``, not ``jsonb``: the codecs produce and parse text.
#: ``jsonb`` would only add a parse on write and a re-serialization on read. It
#: would also reorder keys, for queries this adapter never makes.
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
    # 2: checkpoints in pieces, as in SQLite's migration 2. The thread row keeps the
    # core document. Messages and facts get rows of their own. A checkpoint
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
    # 3: operations, as in SQLite's migration 3.
    # - Each event's publication state for the relay, with a partial index of what is
    #   left to publish.
    # - Whether a completed receipt's write was announced. It is set for existing ones
    #   whose turn committed or that an operator resolved.
    # - Turns whose result retention pruned.
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
    # 4: each receipt records its tenant, as in SQLite's migration 4. A thread with no
    # committed turn belongs to the tenant of its first receipt. Existing receipts of a
    # committed thread take its owner. The others keep NULL. NULL refuses every
    # tenant's turn on their thread: unknown fails closed. No index:
    # ``list_receipts(tenant_id=...)`` is an operator's query. Every receipt write of
    # the hot path would pay for an index.
    """
    ALTER TABLE ik_receipts ADD COLUMN tenant_id text;
    UPDATE ik_receipts r SET tenant_id = th.tenant_id FROM ik_threads th
    WHERE th.thread_id = r.thread_id AND th.version > 0;
    """,
    # 5: the index on every receipt's status becomes one of the unsettled receipts only.
    # Those are what an operator lists: uncertain ones, and prepared ones a dead
    # attempt left.
    # The full index cost a new entry at every status change. It grew with every
    # receipt ever written. The generic plan of UPDATE_RECEIPT walked it (all the
    # prepared receipts) instead of the primary key. A partial index cannot serve
    # ``status = $n`` in a generic plan. So the compare-and-set always probes the
    # primary key.
    """
    DROP INDEX ik_receipts_status;
    CREATE INDEX ik_receipts_unsettled ON ik_receipts (status)
        WHERE status IN ('prepared', 'uncertain');
    """,
    # 6: a turn starts in one round trip (see START_TURN).
    START_TURN_FUNCTION,
    # 7: a turn row lists the receipts its effect.completed events announced, as in
    # SQLite's migration 5. Take a receipt that the turn named by its ``turn_id``
    # completed and announced. It needs no mark of its own: one UPDATE fewer per commit.
    """
    ALTER TABLE ik_turns ADD COLUMN announced text[];
    """,
    # 8: the journal, as in SQLite's migration 6: what a turn recorded before its
    # commit. It has one row per (thread, turn, key), read back in ``ordinal`` (write)
    # order. Only turns in flight and turns that never committed have rows. (A commit
    # deletes its own.) So retention's scan by ``created_at`` needs no index.
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
    # 11: each thread's inbox, as in SQLite's migration 10. It holds the messages
    # accepted while a turn ran (``on_busy="queue"``). They are ordered by ``seq``, the
    # order of acceptance. A second table holds requests to stop a turn
    # (``Kernel.cancel``).
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
    # 12: each journal entry records its tenant, as in SQLite's migration 11. An entry
    # claims a thread with no committed turn, as a receipt does. Only its tenant's turn
    # may read it. Existing entries on a committed thread take its owner. The others
    # keep NULL (no tenant), as migration 4 left receipts: unknown fails closed.
    # ``ik_start_turn`` reads the journal's claim after the receipts'.
    """
    ALTER TABLE ik_journal ADD COLUMN tenant_id text;
    UPDATE ik_journal j SET tenant_id = th.tenant_id FROM ik_threads th
    WHERE th.thread_id = j.thread_id AND th.version > 0;
    """
    + _start_turn_function(_RECEIPT_OR_JOURNAL_CLAIM),
    # 13: thread leases replace session advisory locks (see LEASES). The old turn-start
    # function now refuses. A worker of an older library may still be running. It
    # fails its next turn with this message. Otherwise it would lock threads that
    # leases do not see.
    LEASES,
    # 14: LangGraph's checkpoints, for ``KernelSaver``, as in SQLite's migration 12.
    # There is a checkpoint row and a row per pending write. Each namespace's latest
    # checkpoint has a row too. A put moves it only from the parent it names
    # (compare-and-set).
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
    # 15: a streamed turn's events, by segment (``StreamRecorder``). They are written
    # with the journal entry of each round. They are kept after the commit deletes the
    # entry. The turn's watchers read them in any process.
    """
    CREATE TABLE IF NOT EXISTS ik_streams (
        thread_id text NOT NULL, turn_id text NOT NULL, segment integer NOT NULL,
        events text NOT NULL, created_at timestamptz NOT NULL,
        CONSTRAINT ik_streams_pkey PRIMARY KEY (thread_id, turn_id, segment)
    );
    """,
    # 16: each thread's timers, as in SQLite's migration 14: one row per key. Workers
    # claim the due ones through ``ik_timers_due``: pending rows only, earliest first.
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
    # 18: each stop request records its caller's scope, as in SQLite's migration 15.
    # The scope is ``'*'`` for any tenant, else the tenant it stops. A turn reads only
    # its own tenant's requests and those for any. Requests stored before were made for any tenant.
    # The key gains the scope: one tenant's request never keeps another's out.
    """
    ALTER TABLE ik_cancels ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT '*';
    ALTER TABLE ik_cancels ALTER COLUMN scope DROP DEFAULT;
    ALTER TABLE ik_cancels DROP CONSTRAINT ik_cancels_pkey;
    ALTER TABLE ik_cancels
        ADD CONSTRAINT ik_cancels_pkey PRIMARY KEY (thread_id, turn_id, scope);
    """,
    # 19: steering, as in SQLite's migration 16. ``steer`` marks a message for the
    # running turn. ``taken_by`` names the turn whose round boundary took it.
    """
    ALTER TABLE ik_inbox ADD COLUMN IF NOT EXISTS steer boolean NOT NULL DEFAULT false;
    ALTER TABLE ik_inbox ADD COLUMN IF NOT EXISTS taken_by text;
    """,
    # 20: an interrupt names its sender, as in SQLite's migration 17. There is one row
    # per sender's turn ID and tenant scope, with the seq of its inbox entry. Rows
    # stored before take the defaults, and so do rows a worker of the previous library
    # still writes. The defaults are any sender, any tenant, the largest seq: their
    # meaning until now.
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
    # 21: a receipt's prepare as a function, planned once per server session (see
    # PREPARE_RECEIPT_FUNCTION).
    PREPARE_RECEIPT_FUNCTION,
    # 22: a turn's commit as a function, planned once per server session (see
    # COMMIT_TURN_FUNCTION).
    COMMIT_TURN_FUNCTION,
    # 23: the lease row names the turn that took it (see TURN_ON_LEASE).
    TURN_ON_LEASE,
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
