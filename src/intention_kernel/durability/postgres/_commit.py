"""The PostgreSQL turn commit: one statement, built from the parts a turn needs."""

from __future__ import annotations

import functools
import re

from intention_kernel.durability.abc import TurnRecord

__all__ = ["COMMIT_PARTS", "TIMER_PARTS", "commit_parts", "commit_statement"]

# First commit of a thread. A row may already exist at version 0 (operator events
# only); anything above 0 means another turn committed first, so the WHERE refuses
# (under READ COMMITTED a concurrent first commit is waited for, then re-checked).
UPSERT_THREAD = """
    INSERT INTO ik_threads (thread_id, tenant_id, version, schema_revision, fingerprint,
                            checkpoint, next_seq, updated_at, message_seq)
    SELECT %(thread_id)s, %(tenant_id)s, %(version)s, %(schema_revision)s, %(fingerprint)s,
           %(checkpoint)s, 1 + %(events)s, %(created_at)s, %(appended)s
    FROM lease
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
    FROM lease
    WHERE thread_id = %(thread_id)s AND version = %(expected_version)s
      AND tenant_id IS NOT DISTINCT FROM %(tenant_id)s
    RETURNING next_seq, message_seq
"""
# A whole commit in one statement, hence one transaction and one round trip. The
# turn and its events are inserted only from the thread row the compare-and-set
# returned: a fenced commit writes nothing and returns no row; a turn ID committed
# meanwhile violates ``ik_turns_pkey`` and aborts the statement.
#
# The commit is fenced by the turn's lease, and releases it, in its first part
# (``lease``): the lease row, still at the turn's epoch and alive on the server's
# clock, lapses at once; the thread's compare-and-set reads that part, so a turn
# that lost its lease writes nothing (see FENCE in ``_statements`` for why the row
# lock settles every race with a takeover). The release commits with the turn: a
# worker taking the thread next waits for the lease row, then reads this commit.
# A refused commit (the turn ID committed meanwhile) rolls the release back too,
# and the adapter lets go of the lease itself. ``leased`` says whether the lease
# held; a NULL ``next_seq`` with it, that the thread version moved. Parameters are
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
    WITH lease AS (
        UPDATE ik_leases SET expires_at = 'epoch'
        WHERE thread_id = %(thread_id)s AND kind = 'turn' AND epoch = %(lease_epoch)s
          AND owner = %(lease_owner)s AND expires_at > clock_timestamp()
        RETURNING epoch
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
    # every receipt of the thread at each commit, a cost growing with the thread.
    "mark_announced": """, announced AS (
        UPDATE ik_receipts r SET announced = r.status = 'completed'
        FROM thread, unnest(%(mark_announced)b::text[]) AS said(key), LATERAL (
            SELECT ctid FROM ik_receipts WHERE thread_id = %(thread_id)s AND key = said.key
            LIMIT 1) AS found
        WHERE r.ctid = found.ctid
    )""",
    # The turn used the journal (``TurnRecord.journaled``): its entries go with the
    # commit, and only with it (``USING thread``: a fenced commit deletes nothing).
    "journal": """, journal AS (
        DELETE FROM ik_journal j USING thread
        WHERE j.thread_id = %(thread_id)s AND j.turn_id = %(turn_id)s
    )""",
}
# The parts of a turn that writes its thread's timers: rare, so kept apart from the hot
# path's parts above (a statement with them is longer than psycopg's query cache takes).
TIMER_PARTS = {
    # The thread's timer rows the turn sets or settles (``TurnRecord.timers``), one
    # JSON array of rows; at most one write per key, so no row is written twice.
    "timers": """, timer_rows AS (
        INSERT INTO ik_timers (thread_id, key, tenant_id, due_at, message, data,
                               unless_version_after, every_us, status, set_at, settled_at,
                               turn_id, claimed_until, cron)
        SELECT %(thread_id)s, r.key, r.tenant_id, r.due_at, r.message, r.data,
               r.unless_version_after, r.every_us, r.status, r.set_at, r.settled_at,
               r.turn_id, NULL, r.cron
        FROM thread, jsonb_to_recordset(%(timer_rows)s::jsonb) AS r(
            key text, tenant_id text, due_at timestamptz, message text, data text,
            unless_version_after bigint, every_us bigint, status text,
            set_at timestamptz, settled_at timestamptz, turn_id text, cron text)
        ON CONFLICT (thread_id, key) DO UPDATE SET
            tenant_id = excluded.tenant_id, due_at = excluded.due_at,
            message = excluded.message, data = excluded.data,
            unless_version_after = excluded.unless_version_after,
            every_us = excluded.every_us, status = excluded.status,
            set_at = excluded.set_at, settled_at = excluded.settled_at,
            turn_id = excluded.turn_id, claimed_until = NULL, cron = excluded.cron
    )""",
    "timer_deletes": """, timer_deletes AS (
        DELETE FROM ik_timers t USING thread
        WHERE t.thread_id = %(thread_id)s AND t.key = ANY(%(timer_deletes)s::text[])
    )""",
}
COMMIT_TAIL = """
    SELECT (SELECT next_seq FROM thread), (SELECT count(*) FROM lease) AS leased
"""


@functools.cache
def commit_statement(first: bool, parts: frozenset[str]) -> str:
    """The commit of a thread's first turn (``first``) or of a later one, with the
    optional ``parts`` (keys of ``COMMIT_PARTS``) that the turn needs."""
    unknown = parts - COMMIT_PARTS.keys() - TIMER_PARTS.keys()
    if unknown:
        raise ValueError(f"unknown commit parts: {sorted(unknown)}")
    head = COMMIT_HEAD.format(thread=UPSERT_THREAD if first else UPDATE_THREAD)
    every = (*COMMIT_PARTS.items(), *TIMER_PARTS.items())
    body = "".join(text for name, text in every if name in parts)
    return _compact(head + body + COMMIT_TAIL)


def commit_parts(record: TurnRecord) -> frozenset[str]:
    return frozenset(
        name
        for name, needed in (
            ("trim", record.trim_messages > 0),
            ("rewrite", record.rewrite),
            ("messages", bool(record.messages)),
            ("removed_facts", bool(record.removed_facts)),
            ("facts", bool(record.facts)),
            ("mark_announced", bool(record.mark_announced)),
            ("journal", record.journaled),
            ("timers", any(w.timer is not None for w in record.timers)),
            ("timer_deletes", any(w.timer is None for w in record.timers)),
        )
        if needed
    )


def _compact(statement: str) -> str:
    """``statement`` without its ``--`` comments and runs of whitespace.

    psycopg caches the conversion of a query (placeholders to ``$n``, a regex pass)
    only for queries of at most 4,096 characters; a longer one is converted again
    at every execution. So the comments that explain a statement must not make it
    slower. (None of our statements has ``--`` inside a string literal.)
    """
    without_comments = re.sub(r"--[^\n]*", "", statement)
    return " ".join(without_comments.split())
