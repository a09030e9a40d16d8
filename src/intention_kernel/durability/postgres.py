"""PostgreSQL durability: many workers on many hosts sharing one database.

Design, and why:

- **Per-thread serialization with a session-level advisory lock** held on one
  pooled connection for the whole turn. No transaction is open while the
  interpreter or a capability runs (the session sits idle, holding only the
  lock), and the server drops the lock the moment the session ends: a killed
  worker frees its threads at once, a vanished host within about 25 seconds
  (server-side TCP keepalives and ``tcp_user_timeout``, set on every session).
- **Every statement of a turn runs on that same connection.** A commit that
  succeeds was therefore made by a session that still held the lock; if the
  session died, the lock died with it and so does every later statement of
  the turn, which then commits nothing. It also means one connection per
  in-flight turn: a turn never waits for a second connection while holding
  the first, so a full pool cannot deadlock.
- **Fenced commit.** Result, checkpoint and events are one transaction that
  inserts the ``(thread_id, turn_id)`` primary key and compares-and-sets the
  thread version, exactly as the SQLite adapter does. A lost commit
  acknowledgement is resolved by the retry, which finds the turn row and replays.
- **Outbox positions in commit order.** A sequence is not commit-ordered in
  PostgreSQL (position 5 can commit after 6, and a relay that saw 6 would skip
  5 forever), so turns insert their events unnumbered and ``read_outbox``
  first numbers every committed, unnumbered event from a counter row, one
  numbering transaction at a time. Turn commits take no global lock.

Transactions per turn: one read, one statement per effect state change, and
one commit for result + checkpoint + events.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import random
import re
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, TypeVar

try:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.errors import UniqueViolation
    from psycopg.pq import TransactionStatus
    from psycopg.rows import TupleRow
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "PostgresDurability needs psycopg 3 and psycopg-pool: "
        "pip install 'intention-kernel[postgres]'"
    ) from exc

from intention_kernel import _faults
from intention_kernel._json import dump_value
from intention_kernel.durability import _check_seconds, _take_url_options
from intention_kernel.durability._rows import (
    decode_event,
    decode_receipt,
    dump_optional,
    dump_resolution,
    select_receipts,
)
from intention_kernel.durability.abc import (
    INTERACTION_MARKER,
    CheckpointRewrite,
    OutboxBacklog,
    OutboxDelivery,
    PlanFn,
    RecordedDurability,
    Recorder,
    RecorderOptions,
    ResolutionFn,
    StoredThread,
    StoredTurn,
    ThreadOwner,
    TurnRecord,
    TurnStart,
)
from intention_kernel.effects import EffectPlan, Receipt, ReceiptStatus, is_settlement, utcnow
from intention_kernel.errors import (
    FencedCommitError,
    KernelError,
    StoreError,
    ThreadBusyError,
)
from intention_kernel.turns import EventDraft, OutboxEvent

__all__ = ["PostgresDurability"]

DEFAULT_SCHEMA = "intention_kernel"
DEFAULT_LOCK_TIMEOUT = 30.0
#: Query parameters of a ``postgresql://`` URL that ``open_durability`` takes for the
#: adapter (they are not libpq's, which refuses unknown ones).
URL_OPTIONS = ("schema", "lock_timeout")

T = TypeVar("T")
Connection = psycopg.AsyncConnection[TupleRow]

# A thread's checkpoint rows: messages oldest first, facts as [key, body] pairs in
# recording order (``ordinal`` survives an upsert). Scalar subqueries in a CASE run
# only when the branch is taken.
_ROWS = """
    CASE WHEN {ship} THEN (SELECT array_agg(body ORDER BY seq) FROM ik_messages
                           WHERE thread_id = {thread_id}) END,
    CASE WHEN {ship} THEN (SELECT array_agg(ARRAY[key, body] ORDER BY ordinal) FROM ik_facts
                           WHERE thread_id = {thread_id}) END
"""
# A turn's start in one round trip: ``ik_start_turn(lock, thread, turn, known)``.
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
# One statement instead of a lock and a read costs the client one round trip less, a
# tenth of its CPU per turn with psycopg's asyncio driver. The two IFs stay apart: SQL
# does not promise to evaluate ``FOUND OR NOT pg_try_advisory_lock(...)`` left to
# right, and a lock taken for a replay would never be released.
START_TURN_FUNCTION = (
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
               CASE WHEN unowned THEN (SELECT ARRAY[r.tenant_id] FROM ik_receipts r
                                       WHERE r.thread_id = p_thread
                                       ORDER BY r.ordinal LIMIT 1) END,
               CASE WHEN ship THEN checkpoint END,
"""
    + _ROWS.format(ship="ship", thread_id="p_thread")
    + """
        FROM found;
END
$$;
"""
)
START_TURN = "SELECT * FROM ik_start_turn(%(lock)s, %(thread_id)s, %(turn_id)s, %(known_version)s)"
BEGIN_TURN = "SELECT * FROM ik_start_turn(NULL, %(thread_id)s, %(turn_id)s, %(known_version)s)"


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
    # 2: checkpoints in pieces (see the SQLite adapter's migration 2): the thread row
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
    # 3: operations (see the SQLite adapter's migration 3): each event's publication
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
    # 4: each receipt records its tenant (see the SQLite adapter's migration 4): a thread
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
    # 7: a turn row lists the receipts its effect.completed events announced (see the
    # SQLite adapter's migration 5): a receipt that the turn named by its ``turn_id``
    # completed and announced needs no mark of its own, one UPDATE fewer per commit.
    """
    ALTER TABLE ik_turns ADD COLUMN announced text[];
    """,
)


def _compact(statement: str) -> str:
    """``statement`` without its ``--`` comments and runs of whitespace.

    psycopg caches the conversion of a query (placeholders to ``$n``, a regex pass)
    only for queries of at most 4,096 characters; a longer one is converted again
    at every execution, which cost the commit statement almost a millisecond of CPU.
    So the comments that explain a statement must not make it slower. (None of our
    statements has ``--`` inside a string literal.)
    """
    without_comments = re.sub(r"--[^\n]*", "", statement)
    return " ".join(without_comments.split())


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
# ``max_receipts`` entries) is rewritten every turn, and the default pglz made that
# update cost about ten times a short thread's. Values already stored keep their
# method, and any server with lz4 reads both. And generic plans only: in the default
# mode the server kept planning the commit statement anew at every execution (custom
# plans look cheaper when its gated parts fold away), which cost about a quarter of its
# CPU per turn; every statement here is written for a generic plan,
# and a partial index an operator's query needs is matched by a literal (read_receipts).
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
    + _ROWS.format(ship="true", thread_id="%(thread_id)s")
    + "FROM ik_threads WHERE thread_id = %(thread_id)s"
)

# In ``Receipt`` field order, so that a row maps onto the dataclass positionally.
RECEIPT_COLUMNS = (
    "id, thread_id, key, status, turn_id, step_id, attempt, value, error, "
    "created_at, updated_at, resolution, announced, tenant_id"
)
READ_RECEIPTS = select_receipts(RECEIPT_COLUMNS)
SELECT_RECEIPT = f"{READ_RECEIPTS} WHERE r.thread_id = %s AND r.key = %s"
INSERT_RECEIPT = f"""
    INSERT INTO ik_receipts ({RECEIPT_COLUMNS})
    VALUES (%(id)s, %(thread_id)s, %(key)s, %(status)s, %(turn_id)s, %(step_id)s,
            %(attempt)s, %(value)s, %(error)s, %(created_at)s, %(updated_at)s, %(resolution)s,
            %(announced)s, %(tenant_id)s)
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
        resolution = %(resolution)s, updated_at = %(updated_at)s, announced = %(announced)s
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

# First commit of a thread. A row may already exist at version 0 (operator events
# only); anything above 0 means another turn committed first, so the WHERE refuses
# (under READ COMMITTED a concurrent first commit is waited for, then re-checked).
UPSERT_THREAD = """
    INSERT INTO ik_threads (thread_id, tenant_id, version, schema_revision, fingerprint,
                            checkpoint, next_seq, updated_at, message_seq)
    VALUES (%(thread_id)s, %(tenant_id)s, %(version)s, %(schema_revision)s, %(fingerprint)s,
            %(checkpoint)s, 1 + %(events)s, %(created_at)s, %(appended)s)
    ON CONFLICT (thread_id) DO UPDATE SET
        tenant_id = excluded.tenant_id, version = excluded.version,
        schema_revision = excluded.schema_revision, fingerprint = excluded.fingerprint,
        checkpoint = excluded.checkpoint, next_seq = ik_threads.next_seq + %(events)s,
        updated_at = excluded.updated_at,
        message_seq = ik_threads.message_seq + %(appended)s
    WHERE ik_threads.version = 0
    RETURNING next_seq, message_seq
"""
# Later commits: fenced on the version (and owner) this turn loaded.
UPDATE_THREAD = """
    UPDATE ik_threads
    SET version = %(version)s, schema_revision = %(schema_revision)s,
        fingerprint = %(fingerprint)s, checkpoint = %(checkpoint)s,
        next_seq = next_seq + %(events)s, updated_at = %(created_at)s,
        message_seq = message_seq + %(appended)s
    WHERE thread_id = %(thread_id)s AND version = %(expected_version)s
      AND tenant_id IS NOT DISTINCT FROM %(tenant_id)s
    RETURNING next_seq, message_seq
"""
# A whole commit in one statement, hence one transaction and one round trip. The
# turn and its events are inserted only from the thread row the compare-and-set
# returned: a fenced commit writes nothing and returns no row; a turn ID committed
# meanwhile violates ``ik_turns_pkey`` and aborts the statement.
#
# The commit also hands the thread lock over to its own transaction, which saves
# the turn a separate UNLOCK round trip: it takes the same advisory key at
# transaction level (granted at once, the session holding it already), then drops
# the session-level hold. The server releases a transaction's locks only after its
# commit is durable and visible to new snapshots (or after its rollback), so the
# next holder of the thread always reads this turn. Dropping the session hold
# before taking the transaction one would let another worker lock the thread and
# read it without this commit (to be fenced later); the ``xact_lock`` CTE is
# materialized, and the unlock reads it, so that the order is fixed. The unlock
# also reads ``turn``, so that it runs only once the turn row is in: the usual
# failure (the turn ID committed meanwhile) leaves the session lock as it was,
# for ``_release``. ``released`` says whether the session hold was dropped. Parameters are
# the ``TurnRecord`` fields, with ``events`` the count and ``event_*`` arrays, and
# the checkpoint's rows as arrays (see ``TurnRecord``). The parts of one statement
# share a snapshot: the deletes see only the rows stored before it, never the ones
# it inserts; a rewrite deletes only the facts it does not upsert again, since one
# statement must not both delete and insert the same row. Arrays go in binary
# (``%(...)b``): the text format escapes every quote of every JSON element with a
# regular expression, which cost more than the round trip.
#
# A part with nothing to do in a given turn is left out of its statement (see
# ``commit_statement``): the server starts every part of a statement it runs, even
# one whose input is an empty array, and a usual turn writes through six of the ten
# writing parts (no fact removed, no rewrite, no receipt of another turn to mark).
COMMIT_HEAD = """
    WITH xact_lock AS MATERIALIZED (
        SELECT pg_try_advisory_xact_lock(%(lock)s) AS held
    ), thread AS ({thread}), turn AS (
        INSERT INTO ik_turns (thread_id, turn_id, request_digest, version, result, created_at,
                              announced)
        SELECT %(thread_id)s, %(turn_id)s, %(request_digest)s, %(version)s, %(result)s,
               %(created_at)s, %(announced)b::text[]
        FROM thread
        RETURNING true AS inserted
    ), events AS (
        INSERT INTO ik_outbox (id, thread_id, turn_id, seq, type, payload, created_at)
        SELECT e.id, %(thread_id)s, %(turn_id)s, thread.next_seq - %(events)s + e.n - 1,
               e.type, e.payload, %(created_at)s
        FROM thread, unnest(%(event_ids)b::text[], %(event_types)b::text[],
                            %(event_payloads)b::text[]) WITH ORDINALITY AS e(id, type, payload, n)
        ORDER BY e.n  -- so that ``ord`` follows ``seq`` (see SEQUENCE_OUTBOX)
    )"""
# Each optional part, in statement order, under the name of what calls for it.
COMMIT_PARTS = {
    # A bounded range: the index is not walked through the dead entries that a long
    # thread's earlier trims leave until vacuum.
    "trim": """, trimmed_messages AS (
        DELETE FROM ik_messages m USING thread
        WHERE m.thread_id = %(thread_id)s
          AND m.seq > thread.message_seq - %(keep_messages)s - %(trim_messages)s
          AND m.seq <= thread.message_seq - %(keep_messages)s
    )""",
    # Every message and fact row of the thread goes, but the facts the turn writes again
    # (see above): ``messages`` and ``facts`` are all of them.
    "rewrite": """, rewritten_messages AS (
        DELETE FROM ik_messages m USING thread WHERE m.thread_id = %(thread_id)s
    ), rewritten_facts AS (
        DELETE FROM ik_facts f USING thread
        WHERE f.thread_id = %(thread_id)s AND NOT f.key = ANY(%(fact_keys)b::text[])
    )""",
    "messages": """, new_messages AS (
        INSERT INTO ik_messages (thread_id, seq, body)
        SELECT %(thread_id)s, thread.message_seq - %(appended)s + m.n, m.body
        FROM thread, unnest(%(messages)b::text[]) WITH ORDINALITY AS m(body, n)
    )""",
    # One primary-key probe per key, found in a LATERAL subquery whose LIMIT keeps the
    # planner from flattening it: the statement runs on a generic plan, and with
    # ``f.key = ANY(...)`` (a filter) or a plain join (a hash of the thread's rows,
    # planned while the table was small) it read every fact of the thread at each
    # commit, a cost growing with the thread.
    "removed_facts": """, removed_facts AS (
        DELETE FROM ik_facts f
        USING thread, unnest(%(removed_facts)b::text[]) AS gone(key), LATERAL (
            SELECT ctid FROM ik_facts WHERE thread_id = %(thread_id)s AND key = gone.key
            LIMIT 1) AS found
        WHERE f.ctid = found.ctid
    )""",
    "facts": """, new_facts AS (
        INSERT INTO ik_facts (thread_id, key, body)
        SELECT %(thread_id)s, f.key, f.body
        FROM thread, unnest(%(fact_keys)b::text[], %(fact_bodies)b::text[])
                     WITH ORDINALITY AS f(key, body, n)
        ORDER BY f.n  -- so that ``ordinal`` follows the checkpoint's order
        ON CONFLICT (thread_id, key) DO UPDATE SET body = excluded.body
    )""",
    # The effect.completed events of this commit announce these receipts, which another
    # turn ID completed (the turn row announces the others, see ``TurnRecord``); only
    # completed ones: any other is not announced, and stays so. Probed like
    # removed_facts: the generic plan of ``r.key = ANY(...)`` or of a plain join read
    # every receipt of the thread at each commit (800 rows by turn 8,000).
    "mark_announced": """, announced AS (
        UPDATE ik_receipts r SET announced = r.status = 'completed'
        FROM thread, unnest(%(mark_announced)b::text[]) AS said(key), LATERAL (
            SELECT ctid FROM ik_receipts WHERE thread_id = %(thread_id)s AND key = said.key
            LIMIT 1) AS found
        WHERE r.ctid = found.ctid
    )""",
}
COMMIT_TAIL = """
    SELECT next_seq, (SELECT pg_advisory_unlock(%(lock)s) FROM xact_lock, turn
                      WHERE xact_lock.held AND turn.inserted) AS released
    FROM thread
"""


@functools.cache
def commit_statement(first: bool, parts: frozenset[str]) -> str:
    """The commit of a thread's first turn (``first``) or of a later one, with the
    optional ``parts`` (keys of ``COMMIT_PARTS``) that the turn needs."""
    unknown = parts - COMMIT_PARTS.keys()
    if unknown:
        raise ValueError(f"unknown commit parts: {sorted(unknown)}")
    head = COMMIT_HEAD.format(thread=UPSERT_THREAD if first else UPDATE_THREAD)
    body = "".join(text for name, text in COMMIT_PARTS.items() if name in parts)
    return _compact(head + body + COMMIT_TAIL)


def _commit_parts(record: TurnRecord) -> frozenset[str]:
    return frozenset(
        name
        for name, needed in (
            ("trim", record.trim_messages > 0),
            ("rewrite", record.rewrite),
            ("messages", bool(record.messages)),
            ("removed_facts", bool(record.removed_facts)),
            ("facts", bool(record.facts)),
            ("mark_announced", bool(record.mark_announced)),
        )
        if needed
    )


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
OUTBOX_COLUMNS = "id, position, thread_id, turn_id, seq, type, payload, created_at"
SELECT_OUTBOX = f"SELECT {OUTBOX_COLUMNS} FROM ik_outbox WHERE position > %(after)s"

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
    + _ROWS.format(ship="true", thread_id="th.thread_id")
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

_IDLE = TransactionStatus.IDLE
_FIRST_WAIT = 0.001
_MAX_WAIT = 0.01


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


def advisory_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for ``parts`` (IDs never contain NUL)."""
    text = "\x00".join(("intention_kernel", *parts))
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass
class _Held:
    """A thread lock and the session holding it (``None`` once released).

    ``mutex`` runs one hop at a time on the session, and makes the release wait for
    a hop still running. Without it a transaction could interleave with another
    hop's statements, and a late hop could run on the session after it went back
    to the pool, inside whatever its next borrower is doing. ``committed``: the
    turn's commit statement released the session's hold. ``returned``: the
    session died and was given back to the pool already (see ``_give_back_dead``);
    ``conn`` stays the dead session, so that every later hop of the turn fails on it
    and none runs on another session, which would not hold the lock.
    """

    conn: Connection | None
    key: int
    mutex: asyncio.Lock = field(default_factory=asyncio.Lock)
    committed: bool = False
    returned: bool = False


@dataclass
class _Claim:
    """A relay's claim of a thread and the session holding it (``None`` once released);
    ``mutex`` runs one statement at a time on it, and makes the release wait for one
    still running (the same reasons as :class:`_Held`)."""

    conn: Connection | None
    mutex: asyncio.Lock = field(default_factory=asyncio.Lock)


class _PostgresRecorder(Recorder):
    # The thread lock dies with its session, and a session can die (killed by an
    # administrator, cut by the network) while its worker's provider call still runs:
    # a ``prepared`` receipt under the lock may be a live attempt's. A write awaits the
    # pool and the server, so a cancellation can interrupt it.
    options = RecorderOptions(finishes_writes_when_cancelled=False, attempts_outlive_lock=True)

    def __init__(
        self,
        dsn: str,
        schema: str,
        lock_timeout: float,
        pool_size: tuple[int, int],
        timeout: float,
        connect_timeout: float | None,
    ) -> None:
        self._dsn, self._schema, self._lock_timeout = dsn, schema, lock_timeout
        self._pool_size, self._pool_timeout = pool_size, timeout
        self._open_timeout = timeout if connect_timeout is None else connect_timeout
        # libpq's own bound on one connection attempt (whole seconds, at least 2), else a
        # server that drops packets holds each attempt until the system's TCP timeout.
        self._connect_kwargs: dict[str, Any] = (
            {}
            if connect_timeout is None
            else {"connect_timeout": max(2, math.ceil(connect_timeout))}
        )
        self._opened: AsyncConnectionPool[Connection] | None = None
        self._held: dict[str, _Held] = {}
        self._claims: dict[str, _Claim] = {}  # see claim_outbox
        self._claim_slots = asyncio.Semaphore(max(1, pool_size[1] - 1))

    @property
    def _pool(self) -> AsyncConnectionPool[Connection]:
        if self._opened is None:
            raise KernelError("the PostgreSQL adapter is closed")
        return self._opened

    # -- plumbing ------------------------------------------------------------------------------

    async def _configure(self, conn: Connection) -> None:
        await conn.execute(CONFIGURE_SESSION, (sql.Identifier(self._schema).as_string(conn),))

    async def _run(self, thread_id: str | None, hop: Callable[[Connection], Awaitable[T]]) -> T:
        """Run ``hop`` on the session holding ``thread_id``'s lock, else on a pooled one
        (then ``hop`` must be safe to repeat).

        Runs in the caller's task, not shielded from its cancellation: psycopg settles a
        statement interrupted in flight before the cancellation reaches us (it cancels
        it on the server and waits for its end, or closes the session), and the hop
        keeps the session's mutex until then, so the lock is never released under a
        running statement. Each statement is atomic either way: an interrupted hop is
        a crash between two statements, which every hop already tolerates.
        """
        with _translated():
            held = self._held.get(thread_id) if thread_id is not None else None
            if held is not None:
                async with held.mutex:
                    if held.conn is not None:  # else the turn ended while this hop waited
                        return await hop(held.conn)
            # Idle pooled sessions may have died (server restart, terminated backend).
            # The pool discards each broken one, so a repeatable hop tries the next,
            # at most once per pooled session plus a fresh one.
            for attempt in range(self._pool.max_size, -1, -1):
                async with self._pool.connection() as conn:
                    try:
                        return await hop(conn)
                    except psycopg.OperationalError:
                        if not conn.broken or attempt == 0:
                            raise
            raise AssertionError("unreachable")

    async def open(self) -> None:
        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            self._dsn,
            min_size=self._pool_size[0],
            max_size=self._pool_size[1],
            kwargs={"autocommit": True, **self._connect_kwargs},
            configure=self._configure,
            timeout=self._pool_timeout,
            open=False,
            name=f"intention-kernel:{self._schema}",
        )
        with _translated():
            try:
                await pool.open(wait=True, timeout=self._open_timeout)
                async with pool.connection() as conn:
                    await self._migrate(conn)
            except BaseException as exc:
                await pool.close()
                if isinstance(exc, PoolTimeout):
                    raise StoreError(
                        f"cannot connect to PostgreSQL within {self._open_timeout}s: {exc}"
                    ) from exc
                raise
        self._opened = pool

    async def exists(self) -> bool:
        """Asked on a session of its own, outside the pool: opening the pool is what
        creates the schema."""
        if self._opened is not None:
            return True
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._dsn, autocommit=True, connect_timeout=max(2, math.ceil(self._open_timeout))
            )
        except psycopg.Error as exc:
            lines = "; ".join(line.strip() for line in str(exc).strip().splitlines())
            raise StoreError(f"cannot connect to PostgreSQL: {lines}") from exc
        with _translated():
            async with conn:
                return bool(await _value(conn, HAS_STORE, self._schema))

    async def _migrate(self, conn: Connection) -> None:
        """Apply pending migrations; safe when several workers start at once."""
        if await self._schema_version(conn) == len(MIGRATIONS):
            return  # the common case: no lock, no DDL, no CREATE privilege needed
        async with conn.transaction():
            # One migrator per schema at a time; the others wait here, then find the
            # new version and apply nothing. Without it two workers could both run
            # migration 1 (or race on CREATE SCHEMA, which is not concurrency-safe).
            await conn.execute(LOCK_XACT, (advisory_key("migrate", self._schema),))
            await conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._schema))
            )
            await conn.execute(CREATE_SCHEMA_TABLE)
            for version in range(await self._schema_version(conn) + 1, len(MIGRATIONS) + 1):
                await conn.execute(MIGRATIONS[version - 1])
                await conn.execute(INSERT_SCHEMA_VERSION, (version,))

    async def _schema_version(self, conn: Connection) -> int:
        if not await _value(conn, HAS_SCHEMA_TABLE):
            return 0
        current = int(await _value(conn, SELECT_SCHEMA_VERSION))
        if current > len(MIGRATIONS):
            raise StoreError(
                f"PostgreSQL schema {self._schema!r} is at version {current}, newer than this "
                f"library ({len(MIGRATIONS)}); upgrade intention-kernel"
            )
        return current

    async def close(self) -> None:
        pool, self._opened = self._opened, None
        if pool is not None:
            await pool.close()

    # -- the thread lock -----------------------------------------------------------------------

    def _thread_key(self, thread_id: str) -> int:
        return advisory_key("thread", self._schema, thread_id)

    @asynccontextmanager
    async def lock(self, thread_id: str) -> AsyncIterator[object]:
        key = self._thread_key(thread_id)

        async def try_lock(conn: Connection) -> tuple[bool, None] | None:
            return (True, None) if await _value(conn, TRY_LOCK, key) else None

        with _translated():
            conn, _ = await self._acquire(thread_id, try_lock)
        assert conn is not None  # try_lock answers only once it holds the lock
        async with self._holding(thread_id, key, conn) as held:
            yield held

    @asynccontextmanager
    async def start_turn(
        self, thread_id: str, turn_id: str, known_version: int | None
    ) -> AsyncIterator[TurnStart]:
        """The thread lock and ``begin_turn`` in one statement (see START_TURN_FUNCTION);
        a committed turn comes back without the lock."""
        key = self._thread_key(thread_id)
        params = {
            "lock": key,
            "thread_id": thread_id,
            "turn_id": turn_id,
            "known_version": known_version,
        }

        async def attempt(conn: Connection) -> tuple[bool, TurnStart] | None:
            row = await (await _execute(conn, START_TURN, params)).fetchone()
            return None if row is None else (row[0], _turn_start(row[1:]))

        with _translated():
            conn, start = await self._acquire(thread_id, attempt)
        if conn is None:  # a committed turn, read without the lock
            yield start
            return
        async with self._holding(thread_id, key, conn):
            yield start

    @asynccontextmanager
    async def _holding(self, thread_id: str, key: int, conn: Connection) -> AsyncIterator[_Held]:
        """Hold the thread lock that ``conn`` was granted for the block, then release it."""
        held = self._held[thread_id] = _Held(conn, key)
        interrupted = True  # by a cancellation (or an exit): anything but an Exception
        try:
            yield held
            interrupted = False
        except Exception:
            interrupted = False
            raise
        finally:
            # Another turn of this process may hold the thread already, if the commit
            # statement released it: only this turn's entry goes.
            if self._held.get(thread_id) is held:
                del self._held[thread_id]
            if not interrupted and not held.mutex.locked():
                # The usual end: no hop is running, so nothing here waits but UNLOCK,
                # and a cancellation during it makes ``_release`` close the session.
                await self._release(held, key, unlock=True)
            else:
                # Shielded, so that a cancelled turn (or one whose hops still run, which
                # the release waits for) still closes or unlocks the session before
                # anything else can borrow it. An interrupted turn's session is closed,
                # not unlocked: nothing is sent on behalf of a task being cancelled.
                release = asyncio.ensure_future(self._release(held, key, unlock=not interrupted))
                try:
                    await asyncio.shield(release)
                except asyncio.CancelledError:
                    await asyncio.wait([release])  # unlike ``await``, never cancels it
                    raise

    async def _acquire(
        self, thread_id: str, attempt: Callable[[Connection], Awaitable[tuple[bool, T] | None]]
    ) -> tuple[Connection | None, T]:
        """Poll ``attempt`` (a statement that tries ``pg_try_advisory_lock``) with backoff.

        ``attempt`` answers ``None`` while another session holds the lock, else
        whether it took the lock and what it read. Returns the session holding the
        lock, or ``None`` (back in the pool) if ``attempt`` had no need of it.

        Polling, not a blocking ``pg_advisory_lock``: an abandoned wait can never
        leave a lock granted behind our back. Between polls the session goes back
        to the pool, so turns queued on a hot thread cannot drain it.
        """
        deadline, wait = time.monotonic() + self._lock_timeout, _FIRST_WAIT
        seen_busy = False
        while True:
            # The wait for a session has its own bound, ``pool_timeout``: were it the
            # lock's, a short ``lock_timeout`` would fail turns on idle threads while
            # the pool opens a session for them. Once the thread was seen busy, a poll
            # waits for a session only until the lock's deadline, which then means busy.
            remaining = deadline - time.monotonic()
            bounded = seen_busy and remaining < self._pool_timeout
            try:
                conn = await self._pool.getconn(
                    max(remaining, 0.001) if bounded else self._pool_timeout
                )
            except PoolTimeout:
                if bounded:
                    raise self._busy(thread_id) from None
                raise
            try:
                got = await attempt(conn)
            except BaseException as exc:
                dead = isinstance(exc, psycopg.OperationalError) and conn.broken
                if not dead:
                    # Interrupted mid-statement, the lock may have been granted: only a
                    # closed session surely holds none, so this one never goes back.
                    await conn.close()
                await self._pool.putconn(conn)
                if dead:  # a dead idle session (server restart) held no lock: try again
                    continue
                raise
            if got is not None and got[0]:
                return conn, got[1]
            await self._pool.putconn(conn)
            if got is not None:
                return None, got[1]
            seen_busy = True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._busy(thread_id)
            await asyncio.sleep(min(wait * random.uniform(0.5, 1.0), remaining))
            wait = min(wait * 2, _MAX_WAIT)

    def _busy(self, thread_id: str) -> ThreadBusyError:
        return ThreadBusyError(
            f"thread {thread_id!r} stayed locked by another turn for {self._lock_timeout}s",
            thread_id=thread_id,
        )

    async def _give_back_dead(self, held: _Held) -> bool:
        """Whether the lock's session died; if so, give it back to the pool now (closed),
        so that its slot can serve another session even when the pool is full."""
        async with held.mutex:
            conn = held.conn
            if conn is None or held.returned or not conn.broken:
                return held.returned
            held.returned = True
            await conn.close()
            await self._pool.putconn(conn)
            return True

    async def _release(self, held: _Held, key: int, *, unlock: bool) -> None:
        """Give the session back to the pool without the thread lock: unlocked, or else
        closed (the server drops a closed session's locks and rolls back whatever it
        left open)."""
        async with held.mutex:  # after any hop still running on the session
            conn, held.conn = held.conn, None
            assert conn is not None
            if held.returned:
                return
            clean = False
            try:
                if unlock:
                    if not held.committed:
                        # False if the session did not hold it any more (a failed commit
                        # may have released it): either way, it holds no lock now.
                        await _value(conn, UNLOCK, key)
                    clean = conn.info.transaction_status == _IDLE
            except psycopg.Error:
                pass  # the session is gone, and its lock with it
            finally:
                if not clean:
                    # A session that may still hold the lock must never go back to the
                    # pool: its next borrower would own this thread for as long as it
                    # lives. (Neither closing nor returning a closed session waits.)
                    await conn.close()
                await self._pool.putconn(conn)

    # -- turns ---------------------------------------------------------------------------------

    async def begin_turn(
        self, thread_id: str, turn_id: str, known_version: int | None
    ) -> TurnStart:
        async def read(conn: Connection) -> TurnStart:
            params = {"thread_id": thread_id, "turn_id": turn_id, "known_version": known_version}
            cur = await _execute(conn, BEGIN_TURN, params)
            return _turn_start(_one(await cur.fetchone())[1:])

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
        statement = commit_statement(record.expected_version == 0, _commit_parts(record))
        held = self._held.get(record.thread_id)
        params["lock"] = held.key if held else self._thread_key(record.thread_id)

        async def commit(conn: Connection) -> None:
            if _faults.armed:  # as the one-statement commit transaction is sent
                _faults.reach(_faults.DURING_COMMIT)
            try:
                committed = await (await _execute(conn, statement, params)).fetchone()
            except UniqueViolation as exc:
                if exc.diag.constraint_name == "ik_turns_pkey":
                    raise _fenced(record, "the turn ID was committed by another worker") from exc
                raise
            if committed is None:
                raise _fenced(record, "the thread version moved")
            if held is not None and held.conn is conn and committed[1]:
                held.committed = True

        await self._run(record.thread_id, commit)

    # -- effects -------------------------------------------------------------------------------

    async def claim_effect(self, thread_id: str, key: str, plan: PlanFn) -> EffectPlan:
        async def claim(conn: Connection) -> EffectPlan:
            # Most keys are new: try what a first call writes, and read only if a
            # receipt was there already.
            first = plan(None)
            if first.write is not None:
                params = _receipt_params(first.write)
                if (await _execute(conn, INSERT_RECEIPT_IF_NEW, params)).rowcount == 1:
                    return first
            # No wrapping transaction: the write is one statement whose primary key
            # (insert) or compare-and-set (update) refuses it if anyone wrote the
            # receipt since the read, which under the thread lock nobody should.
            existing = _receipt(
                await (await _execute(conn, SELECT_RECEIPT, (thread_id, key))).fetchone()
            )
            decided = plan(existing)
            if decided.write is None:
                return decided
            if existing is not None:
                await _update_receipt(conn, decided.write, existing)
                return decided
            try:
                await _execute(conn, INSERT_RECEIPT, _receipt_params(decided.write))
            except UniqueViolation as exc:
                if exc.diag.constraint_name == "ik_receipts_pkey":
                    raise _receipt_moved(decided.write) from exc
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
            return [_one(_receipt(row)) for row in rows]

        return await self._run(None, read)

    async def resolve_receipt(self, thread_id: str, key: str, resolution: ResolutionFn) -> Receipt:
        async def apply(conn: Connection) -> Receipt:
            async with conn.transaction():
                cur = await conn.execute(SELECT_RECEIPT, (thread_id, key))
                existing = _receipt(await cur.fetchone())
                resolved, event = resolution(existing)
                await _update_receipt(conn, resolved, _one(existing))
                now = utcnow()
                next_seq = await _value(conn, BUMP_THREAD_SEQ, thread_id, now)
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
            if await _value(conn, HAS_UNSEQUENCED):
                async with conn.transaction():
                    head = await _value(conn, LOCK_OUTBOX_HEAD)
                    await conn.execute(SEQUENCE_OUTBOX, {"head": head})
            return [_event(row) for row in await (await conn.execute(query, args)).fetchall()]

        return await self._run(None, read)

    async def _sequence(self, conn: Connection) -> None:
        """Number every committed, unnumbered event (see SEQUENCE_OUTBOX)."""
        if await _value(conn, HAS_UNSEQUENCED):
            async with conn.transaction():
                head = await _value(conn, LOCK_OUTBOX_HEAD)
                await conn.execute(SEQUENCE_OUTBOX, {"head": head})

    # -- the outbox relay ----------------------------------------------------------------------

    @asynccontextmanager
    async def claim_outbox(self, thread_id: str) -> AsyncIterator[bool]:
        # A session advisory lock in a key space of its own ("relay", not "thread"):
        # relays exclude each other on every host, never a turn, and the server drops
        # a dead relay's claims with its session.
        #
        # The claim's reads and marks run on the session holding it (``_on_claim``):
        # were they to borrow other sessions, claims holding every pooled session
        # would wait on one another for a session none gives back, until PoolTimeout.
        # And at most max_pool_size - 1 claims hold sessions at once (the rest queue
        # here, without a timeout), leaving one for the relay's polls and the turns
        # of an application sharing the adapter, whatever the relay's concurrency.
        key = advisory_key("relay", self._schema, thread_id)
        async with self._claim_slots:
            with _translated():
                conn = await self._pool.getconn()
                try:
                    claimed = bool(await _value(conn, TRY_LOCK, key))
                except BaseException:
                    await conn.close()  # interrupted mid-statement: it may hold the lock
                    await self._pool.putconn(conn)
                    raise
            if not claimed:
                await self._pool.putconn(conn)
                yield False
                return
            claim = self._claims[thread_id] = _Claim(conn)
            try:
                yield True
            finally:
                if self._claims.get(thread_id) is claim:
                    del self._claims[thread_id]
                release = asyncio.ensure_future(self._unclaim(claim, key))
                try:
                    await asyncio.shield(release)
                except asyncio.CancelledError:
                    await asyncio.wait([release])
                    raise

    async def _unclaim(self, claim: _Claim, key: int) -> None:
        async with claim.mutex:  # after a read or mark still running on the session
            conn, claim.conn = claim.conn, None
            assert conn is not None
            try:
                clean = await _value(conn, UNLOCK, key) and conn.info.transaction_status == _IDLE
            except psycopg.Error:
                clean = False
            if not clean:  # never pool a session that may still hold the claim
                await conn.close()
            await self._pool.putconn(conn)

    async def _on_claim(self, thread_id: str, hop: Callable[[Connection], Awaitable[T]]) -> T:
        """Run ``hop`` on the session holding this adapter's claim of ``thread_id``; if
        there is none (or it was just released), on a pooled one."""
        claim = self._claims.get(thread_id)
        if claim is not None:
            with _translated():
                async with claim.mutex:
                    if claim.conn is not None:
                        return await hop(claim.conn)
        return await self._run(None, hop)

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
                count, oldest = _one(await (await conn.execute(SELECT_BACKLOG)).fetchone())
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

    async def prune_turns(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> tuple[int, tuple[str, str] | None]:
        start = after or ("", "")

        async def prune(conn: Connection) -> tuple[int, tuple[str, str] | None]:
            cur = await conn.execute(PRUNE_TURNS, (*start, before, limit))
            keys = [(row[0], row[1]) for row in await cur.fetchall()]
            return len(keys), (max(keys) if len(keys) == limit else None)

        return await self._run(None, prune)


class PostgresDurability(RecordedDurability):
    """Durability on PostgreSQL, shared safely by any number of workers and hosts.

    - ``dsn``: a libpq connection string or URL (``postgresql://user@host/db``), parsed
      at once: one libpq cannot parse raises ``StoreError`` here, not after
      ``pool_timeout``. (``schema=`` and ``lock_timeout=`` as URL parameters are
      :func:`~intention_kernel.durability.open_durability`'s; here they are arguments.)
    - ``schema``: the PostgreSQL schema (namespace) holding the adapter's tables,
      created and migrated on first use.
    - ``lock_timeout``: how long a turn waits for a busy thread before
      ``ThreadBusyError``.
    - ``min_pool_size`` / ``max_pool_size``: the connection pool. Each in-flight
      turn holds one session from its lock to its commit, so ``max_pool_size``
      bounds the concurrent turns of this adapter.
    - ``pool_timeout``: how long to wait for a free session (and, unless
      ``connect_timeout`` is given, to connect); a turn's wait for a session is bounded
      by this, not by ``lock_timeout``, so a turn on an idle thread never fails because
      the pool was busy for less.
    - ``connect_timeout``: how long opening the adapter waits to reach the server, and
      libpq's bound on each connection attempt (whole seconds, at least 2); the CLI
      passes a short one, so that an unreachable server is reported at once.

    Each is finite, non-negative seconds (``pool_timeout`` and ``connect_timeout``
    more than 0); NaN, infinity and negative values are refused with ``ValueError``.

    Session-level advisory locks need a real session per client: behind a pooler
    such as PgBouncer, use session pooling, not transaction pooling.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        min_pool_size: int = 1,
        max_pool_size: int = 10,
        pool_timeout: float = 30.0,
        connect_timeout: float | None = None,
    ) -> None:
        if not schema or "\x00" in schema or len(schema.encode()) > 63:
            raise ValueError(f"not a PostgreSQL schema name: {schema!r}")
        if not 0 <= min_pool_size <= max_pool_size or max_pool_size < 1:
            raise ValueError("need 0 <= min_pool_size <= max_pool_size and max_pool_size >= 1")
        lock_timeout = _check_seconds("lock_timeout", lock_timeout)
        if not _check_seconds("pool_timeout", pool_timeout):
            raise ValueError("pool_timeout must be more than 0 seconds")
        if connect_timeout is not None and not _check_seconds("connect_timeout", connect_timeout):
            raise ValueError("connect_timeout must be more than 0 seconds")
        _check_dsn(dsn)
        self.schema = schema
        super().__init__(
            _PostgresRecorder(
                dsn,
                schema,
                lock_timeout,
                (min_pool_size, max_pool_size),
                pool_timeout,
                connect_timeout,
            )
        )


def _check_dsn(dsn: str) -> None:
    """Refuse a connection string libpq cannot parse, at once: the pool would otherwise
    retry it until ``pool_timeout`` and then report a server it could not reach."""
    if "://" in dsn:
        try:
            _, ours = _take_url_options(dsn, URL_OPTIONS)
        except ValueError as exc:
            raise StoreError(str(exc)) from exc
        if ours:
            raise StoreError(
                f"{', '.join(f'{name}=' for name in ours)} in a PostgreSQL URL is understood "
                "by open_durability(); PostgresDurability takes it as an argument "
                "(schema=..., lock_timeout=...), and libpq refuses it"
            )
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise StoreError(f"not a valid PostgreSQL connection string: {str(exc).strip()}") from exc


# -- rows ------------------------------------------------------------------------------------


class _Translated:
    """Driver errors become ``StoreError`` at the adapter's edge, by class. (A class, not
    a generator context manager: it wraps every statement of a turn.)"""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, PoolTimeout):
            raise StoreError(
                f"no PostgreSQL session became available in time ({exc}); is the server up, "
                "and is max_pool_size large enough for the concurrent turns?"
            ) from exc
        if isinstance(exc, psycopg.Error):
            raise StoreError(
                f"PostgreSQL error {exc.sqlstate or ''}: {type(exc).__name__}: {exc}"
            ) from exc


_TRANSLATED = _Translated()


def _translated() -> _Translated:
    return _TRANSLATED


def _turn_start(row: Sequence[Any]) -> TurnStart:
    """A row of ``ik_start_turn`` without its ``locked`` column."""
    digest, result, expired, version, tenant_id, claim, *stored = row
    if result is not None:
        return TurnStart(StoredTurn(digest, result, bool(expired)), None, tenant_id)
    claimed_by = None if claim is None else ThreadOwner(claim[0])
    if version is None:
        return TurnStart(None, None, claimed_by=claimed_by)
    return TurnStart(None, _thread(version, tenant_id, *stored), claimed_by=claimed_by)


def _thread(
    version: int,
    tenant_id: str | None,
    checkpoint: str | None,
    messages: list[str] | None,
    facts: list[list[str]] | None,
) -> StoredThread:
    pairs = [(key, body) for key, body in facts or ()]
    return StoredThread(version, tenant_id, checkpoint, messages or (), pairs)


#: A cursor per session and statement, reused: a cursor that runs the same statement
#: again keeps the dumpers and loaders it looked up for its parameters and columns,
#: which ``conn.execute`` (a new cursor every time) looks up again for every statement.
#: A session runs one statement at a time (see ``_Held``), so no cursor is shared.
_cursors: weakref.WeakKeyDictionary[Connection, dict[str, psycopg.AsyncCursor[TupleRow]]] = (
    weakref.WeakKeyDictionary()
)


async def _execute(
    conn: Connection, query: str, params: Any = None
) -> psycopg.AsyncCursor[TupleRow]:
    cursors = _cursors.get(conn)
    if cursors is None:
        cursors = _cursors[conn] = {}
    cur = cursors.get(query)
    if cur is None:
        cur = cursors[query] = conn.cursor()
    return await cur.execute(query, params)


async def _value(conn: Connection, query: str, *args: Any) -> Any:
    """The first column of the single row ``query`` returns."""
    return _one(await (await _execute(conn, query, args or None)).fetchone())[0]


def _one(value: T | None) -> T:
    assert value is not None
    return value


def _fenced(record: TurnRecord, why: str) -> FencedCommitError:
    return FencedCommitError(
        f"turn {record.turn_id!r} of thread {record.thread_id!r} was not committed: {why} "
        "while it ran",
        thread_id=record.thread_id,
        turn_id=record.turn_id,
    )


def _receipt_moved(receipt: Receipt) -> FencedCommitError:
    return FencedCommitError(
        f"receipt {receipt.key!r} on thread {receipt.thread_id!r} changed while its effect ran",
        thread_id=receipt.thread_id,
        key=receipt.key,
    )


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
    return {
        "id": r.id,
        "thread_id": r.thread_id,
        "key": r.key,
        "status": str(r.status),
        "turn_id": r.turn_id,
        "step_id": r.step_id,
        "attempt": r.attempt,
        "value": dump_optional(r.value),
        "error": r.error,
        "created_at": r.created_at or utcnow(),
        "updated_at": r.updated_at or utcnow(),
        "resolution": dump_resolution(r.resolution),
        "announced": r.announced,
        "tenant_id": r.tenant_id,
    }


def _settle_again(new: Receipt, expected: Receipt) -> Callable[[Connection], Awaitable[None]]:
    """The receipt write ``new`` over ``expected``, safe to repeat: a write found applied
    already (its acknowledgement lost with a session) is not refused as a conflict."""

    async def write(conn: Connection) -> None:
        try:
            await _update_receipt(conn, new, expected)
        except FencedCommitError:
            cur = await _execute(conn, SELECT_RECEIPT, (new.thread_id, new.key))
            stored = _receipt(await cur.fetchone())
            if stored is None or (stored.status, stored.attempt, stored.updated_at) != (
                new.status,
                new.attempt,
                new.updated_at,
            ):
                raise

    return write


async def _update_receipt(conn: Connection, new: Receipt, expected: Receipt) -> None:
    # Each statement takes the parameters it names.
    statement = SETTLE_RECEIPT if is_settlement(new, expected) else UPDATE_RECEIPT
    params = _receipt_params(new)
    params.update(expected_status=expected.status.value, expected_attempt=expected.attempt)
    if (await _execute(conn, statement, params)).rowcount != 1:
        raise _receipt_moved(new)


def _receipt(row: Sequence[Any] | None) -> Receipt | None:
    if row is None:
        return None
    return decode_receipt(
        id=row[0],
        thread_id=row[1],
        key=row[2],
        status=row[3],
        turn_id=row[4],
        step_id=row[5],
        attempt=row[6],
        value=row[7],
        error=row[8],
        created_at=_utc(row[9]),
        updated_at=_utc(row[10]),
        resolution=row[11],
        announced=row[12],
        tenant_id=row[13],
        announced_by_turn=row[14],
    )


def _event(row: Sequence[Any]) -> OutboxEvent:
    return decode_event(
        id=row[0],
        position=row[1],
        thread_id=row[2],
        turn_id=row[3],
        seq=row[4],
        type=row[5],
        payload=row[6],
        created_at=_utc(row[7]),
    )


def _delivery(row: Sequence[Any]) -> OutboxDelivery:
    """An unpublished event from its ``OUTBOX_COLUMNS`` and its publication state."""
    return OutboxDelivery(_event(row), row[8], row[9], None if row[10] is None else _utc(row[10]))


def _utc(value: datetime) -> datetime:
    # timestamptz comes back in the session's time zone; normalize as utcnow() does.
    return value.astimezone(UTC)
