"""The SQLite schema: its migrations, and the code that applies them."""

from __future__ import annotations

import sqlite3

from intention_kernel._effects import utcnow
from intention_kernel.errors import StoreError

__all__ = ["HAS_SCHEMA_TABLE", "MIGRATIONS", "migrate"]

#: Ordered schema migrations; the list index + 1 is the schema version recorded in
#: ``ik_schema``. Append, never edit.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE ik_threads (
        thread_id       TEXT PRIMARY KEY,
        tenant_id       TEXT,
        version         INTEGER NOT NULL,
        schema_revision INTEGER,
        fingerprint     TEXT,
        checkpoint      TEXT,
        next_seq        INTEGER NOT NULL,
        updated_at      TEXT NOT NULL
    );
    CREATE TABLE ik_turns (
        thread_id      TEXT NOT NULL,
        turn_id        TEXT NOT NULL,
        request_digest TEXT,
        version        INTEGER NOT NULL,
        result         TEXT NOT NULL,
        created_at     TEXT NOT NULL,
        PRIMARY KEY (thread_id, turn_id)
    );
    CREATE TABLE ik_receipts (
        thread_id  TEXT NOT NULL,
        key        TEXT NOT NULL,
        id         TEXT NOT NULL UNIQUE,
        status     TEXT NOT NULL
                   CHECK (status IN ('prepared', 'completed', 'failed', 'uncertain')),
        turn_id    TEXT NOT NULL,
        step_id    TEXT NOT NULL,
        attempt    INTEGER NOT NULL,
        value      TEXT,
        error      TEXT,
        resolution TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (thread_id, key)
    );
    CREATE INDEX ik_receipts_status ON ik_receipts (status);
    CREATE TABLE ik_outbox (
        position   INTEGER PRIMARY KEY AUTOINCREMENT,
        id         TEXT NOT NULL UNIQUE,
        thread_id  TEXT NOT NULL,
        turn_id    TEXT,
        seq        INTEGER NOT NULL,
        type       TEXT NOT NULL,
        payload    TEXT,
        created_at TEXT NOT NULL,
        UNIQUE (thread_id, seq)
    );
    """,
    # 2: checkpoints in pieces. ``ik_threads.checkpoint`` becomes the core document. A
    # thread's checkpoint still stored whole (by version 1) is read as it is. Its next
    # commit splits it. ``message_seq`` numbers the thread's messages. Facts
    # keep their rowid when replaced, so ``ORDER BY rowid`` is recording order.
    """
    ALTER TABLE ik_threads ADD COLUMN message_seq INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE ik_messages (
        thread_id TEXT NOT NULL,
        seq       INTEGER NOT NULL,
        body      TEXT NOT NULL,
        PRIMARY KEY (thread_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE ik_facts (
        thread_id TEXT NOT NULL,
        key       TEXT NOT NULL,
        body      TEXT NOT NULL,
        PRIMARY KEY (thread_id, key)
    );
    """,
    # 3: operations.
    # - Publication state of each outbox event for the relay. The partial index holds
    #   only what is left to publish, so it stays small while the relay keeps up.
    # - Whether a completed receipt's write was announced. It is set for existing ones
    #   whose turn committed or that an operator resolved: the rule they were
    #   announced by.
    # - Retention: a turn whose result was pruned keeps its row, marked.
    """
    ALTER TABLE ik_outbox ADD COLUMN published_at TEXT;
    ALTER TABLE ik_outbox ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE ik_outbox ADD COLUMN last_error TEXT;
    ALTER TABLE ik_outbox ADD COLUMN retry_at TEXT;
    CREATE INDEX ik_outbox_unpublished ON ik_outbox (thread_id, seq)
        WHERE published_at IS NULL;
    ALTER TABLE ik_receipts ADD COLUMN announced INTEGER NOT NULL DEFAULT 0;
    UPDATE ik_receipts SET announced = 1
    WHERE status = 'completed' AND (resolution IS NOT NULL OR EXISTS (
        SELECT 1 FROM ik_turns t
        WHERE t.thread_id = ik_receipts.thread_id AND t.turn_id = ik_receipts.turn_id));
    ALTER TABLE ik_turns ADD COLUMN pruned_at TEXT;
    """,
    # 4: each receipt records its tenant, the tenant of the turn that first prepared it.
    # See ``ThreadOwner``: a thread with no committed turn belongs to the tenant of its
    # first receipt. Existing receipts of a committed thread take its owner. That is
    # the only tenant whose turns could write them. Those of a thread with no committed
    # turn keep NULL (no tenant). NULL refuses any tenant's turn there: unknown fails
    # closed.
    """
    ALTER TABLE ik_receipts ADD COLUMN tenant_id TEXT;
    UPDATE ik_receipts SET tenant_id = (
        SELECT th.tenant_id FROM ik_threads th
        WHERE th.thread_id = ik_receipts.thread_id AND th.version > 0);
    """,
    # 5: a turn row lists the receipts its effect.completed events announced. It is a
    # JSON array of keys, NULL for none. Take a receipt that the turn named by its
    # ``turn_id`` completed and announced. It needs no mark of its own (see
    # ``TurnRecord``). That saves a statement and a page per effect in every commit.
    # Existing receipts keep their marks.
    """
    ALTER TABLE ik_turns ADD COLUMN announced TEXT;
    """,
    # 6: the journal (``JournalRecorder``): what a turn recorded before its commit. It
    # has one row per (thread, turn, key), read back in rowid (write) order. It holds
    # only the turns in flight and those that never committed. (A commit deletes its
    # own rows.) So retention's scan by ``created_at`` needs no index. Every write
    # would pay for one.
    """
    CREATE TABLE ik_journal (
        thread_id      TEXT NOT NULL,
        turn_id        TEXT NOT NULL,
        key            TEXT NOT NULL,
        request_digest TEXT,
        value          TEXT NOT NULL,
        created_at     TEXT NOT NULL,
        PRIMARY KEY (thread_id, turn_id, key)
    );
    """,
    # 7: each receipt names who approved its write (``Receipt.actor``). Receipts stored
    # before have NULL: no actor, which is what they recorded.
    """
    ALTER TABLE ik_receipts ADD COLUMN actor TEXT;
    """,
    # 8: the checkpoint's receipt index in rows of its own, numbered by ``receipt_seq``.
    # So the thread row stays under one page. A core stored before holds its index. It
    # is read as it is, and its thread's next commit moves the index into rows.
    """
    ALTER TABLE ik_threads ADD COLUMN receipt_seq INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE ik_receipt_index (
        thread_id TEXT NOT NULL,
        seq       INTEGER NOT NULL,
        key       TEXT NOT NULL,
        body      TEXT NOT NULL,
        PRIMARY KEY (thread_id, seq)
    ) WITHOUT ROWID;
    """,
    # 9: each receipt says what its write was (``Receipt.capability_id``, ``input``,
    # ``approved_by``; the last two JSON as text). Receipts stored before read NULL:
    # no capability, no input, no approvers, which is what they recorded.
    """
    ALTER TABLE ik_receipts ADD COLUMN capability_id TEXT;
    ALTER TABLE ik_receipts ADD COLUMN input TEXT;
    ALTER TABLE ik_receipts ADD COLUMN approved_by TEXT;
    """,
    # 10: each thread's inbox, messages accepted while a turn ran (``on_busy="queue"``),
    # and the requests to stop a turn (``Kernel.cancel``, ``on_busy="interrupt"``).
    # ``seq`` orders the entries by acceptance; AUTOINCREMENT never reuses a number.
    """
    CREATE TABLE ik_inbox (
        seq            INTEGER PRIMARY KEY AUTOINCREMENT,
        thread_id      TEXT NOT NULL,
        turn_id        TEXT NOT NULL,
        tenant_id      TEXT,
        request_digest TEXT,
        request        TEXT NOT NULL,
        created_at     TEXT NOT NULL,
        UNIQUE (thread_id, turn_id)
    );
    CREATE INDEX ik_inbox_order ON ik_inbox (thread_id, seq);
    CREATE TABLE ik_cancels (
        thread_id  TEXT NOT NULL,
        turn_id    TEXT NOT NULL,
        reason     TEXT,
        created_at TEXT NOT NULL,
        PRIMARY KEY (thread_id, turn_id)
    ) WITHOUT ROWID;
    CREATE TABLE ik_interrupts (
        thread_id    TEXT NOT NULL,
        base_version INTEGER NOT NULL,
        created_at   TEXT NOT NULL,
        PRIMARY KEY (thread_id, base_version)
    ) WITHOUT ROWID;
    """,
    # 11: each journal entry records its tenant, the tenant of the turn that wrote it. An
    # entry claims a thread with no committed turn, as a receipt does (``ThreadOwner``).
    # Only its tenant's turn may read it. Without it, another tenant delivering the
    # same thread and turn IDs went on from the first tenant's model responses. Existing
    # entries on a committed thread take its owner. That is the only tenant whose turns
    # could write them. The others keep NULL (no tenant), as migration 4 left receipts.
    # Unknown fails closed, until retention prunes them.
    """
    ALTER TABLE ik_journal ADD COLUMN tenant_id TEXT;
    UPDATE ik_journal SET tenant_id = (
        SELECT th.tenant_id FROM ik_threads th
        WHERE th.thread_id = ik_journal.thread_id AND th.version > 0);
    """,
    # 12: LangGraph's checkpoints, for ``KernelSaver`` (a graph driven by its own
    # application). A checkpoint row holds the serialized checkpoint and its metadata.
    # A write row holds one pending write of a task. Its ``run_id`` is the metadata's,
    # for ``delete_for_runs``. ``ik_lg_heads`` names each namespace's
    # latest checkpoint: a put moves it only from the parent it names (compare-and-set).
    """
    CREATE TABLE ik_lg_checkpoints (
        thread_id     TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        parent_id     TEXT,
        type          TEXT NOT NULL,
        checkpoint    BLOB NOT NULL,
        metadata_type TEXT NOT NULL,
        metadata      BLOB NOT NULL,
        run_id        TEXT,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
    ) WITHOUT ROWID;
    CREATE INDEX ik_lg_checkpoints_run ON ik_lg_checkpoints (run_id) WHERE run_id IS NOT NULL;
    CREATE TABLE ik_lg_writes (
        thread_id     TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        task_id       TEXT NOT NULL,
        idx           INTEGER NOT NULL,
        channel       TEXT NOT NULL,
        type          TEXT NOT NULL,
        value         BLOB NOT NULL,
        task_path     TEXT NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    ) WITHOUT ROWID;
    CREATE TABLE ik_lg_heads (
        thread_id     TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns)
    ) WITHOUT ROWID;
    """,
    # 13: a streamed turn's events, by segment (``StreamRecorder``). They are written
    # with the journal entry of each round. They are kept after the commit deletes the
    # entry. The turn's watchers read them in any process. The entry carries its
    # segment, and a trigger copies it: one autocommitted statement per round, as before.
    """
    CREATE TABLE IF NOT EXISTS ik_streams (
        thread_id  TEXT NOT NULL,
        turn_id    TEXT NOT NULL,
        segment    INTEGER NOT NULL,
        events     TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (thread_id, turn_id, segment)
    ) WITHOUT ROWID;
    ALTER TABLE ik_journal ADD COLUMN segment INTEGER;
    ALTER TABLE ik_journal ADD COLUMN events TEXT;
    CREATE TRIGGER IF NOT EXISTS ik_journal_streams AFTER INSERT ON ik_journal
    WHEN NEW.events IS NOT NULL BEGIN
        INSERT INTO ik_streams (thread_id, turn_id, segment, events, created_at)
        VALUES (NEW.thread_id, NEW.turn_id, NEW.segment, NEW.events, NEW.created_at);
    END;
    """,
    # 14: each thread's timers (``ctx.schedule``), one row per key. Workers claim the
    # due ones by ``ik_timers_due``: pending rows only, earliest first. Times are UTC
    # ISO text with microseconds, so text order is time order.
    """
    CREATE TABLE ik_timers (
        thread_id            TEXT NOT NULL,
        key                  TEXT NOT NULL,
        tenant_id            TEXT,
        due_at               TEXT NOT NULL,
        message              TEXT,
        data                 TEXT,
        unless_version_after INTEGER,
        every_us             INTEGER,
        status               TEXT NOT NULL,
        set_at               TEXT,
        settled_at           TEXT,
        turn_id              TEXT,
        claimed_until        TEXT,
        cron                 TEXT,
        PRIMARY KEY (thread_id, key)
    ) WITHOUT ROWID;
    CREATE INDEX ik_timers_due ON ik_timers (due_at) WHERE status = 'pending';
    """,
    # 15: each stop request records its caller's scope (``ownership.cancel_scope``):
    # ``'*'`` for any tenant, else the tenant it stops. A turn reads only the requests
    # of its own tenant and those for any. Without it, another tenant's DELETE could
    # stop the first turn of a thread nobody owned yet. Requests stored before were
    # made for any tenant, and keep ``'*'``. The key gains the scope: a request of one
    # tenant never keeps another's from being stored. SQLite cannot change a key in
    # place, so the table is built again.
    """
    CREATE TABLE ik_cancels_scoped (
        thread_id  TEXT NOT NULL,
        turn_id    TEXT NOT NULL,
        scope      TEXT NOT NULL,
        reason     TEXT,
        created_at TEXT NOT NULL,
        PRIMARY KEY (thread_id, turn_id, scope)
    ) WITHOUT ROWID;
    INSERT INTO ik_cancels_scoped (thread_id, turn_id, scope, reason, created_at)
    SELECT thread_id, turn_id, '*', reason, created_at FROM ik_cancels;
    DROP TABLE ik_cancels;
    ALTER TABLE ik_cancels_scoped RENAME TO ik_cancels;
    """,
    # 16: steering (``on_busy="steer"``). ``steer`` marks a message for the running
    # turn. ``taken_by`` names the turn whose round boundary took it. It is written
    # before that round's journal entry. A taken entry never runs as a turn of its own.
    # Its turn ID replays the taker's result once the taker committed.
    """
    ALTER TABLE ik_inbox ADD COLUMN steer INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE ik_inbox ADD COLUMN taken_by TEXT;
    """,
    # 17: an interrupt names its sender. There is one row per sender's turn ID and
    # tenant scope (``ownership.cancel_scope``), with the seq of its inbox entry. A turn is stopped
    # only by another sender of its tenant, accepted after its own entry. Before, rows
    # were keyed by the base version alone. A message finding an entry queued and
    # nothing running then stopped its own turn. Another tenant's message stopped a
    # turn on an unowned thread.
    # Rows stored before keep their meaning: any sender (``''``), any tenant, the
    # largest seq. SQLite cannot change a key in place, so the table is built again.
    # ``ik_inbox.started`` marks an entry whose turn began. A cancel no longer
    # dequeues it, as the turn runs on; it answers ``"requested"``.
    """
    ALTER TABLE ik_inbox ADD COLUMN started INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE ik_interrupts_by_sender (
        thread_id    TEXT NOT NULL,
        base_version INTEGER NOT NULL,
        turn_id      TEXT NOT NULL DEFAULT '',
        scope        TEXT NOT NULL DEFAULT '*',
        seq          INTEGER NOT NULL DEFAULT 9223372036854775807,
        created_at   TEXT NOT NULL,
        PRIMARY KEY (thread_id, base_version, turn_id, scope)
    ) WITHOUT ROWID;
    INSERT INTO ik_interrupts_by_sender (thread_id, base_version, created_at)
    SELECT thread_id, base_version, created_at FROM ik_interrupts;
    DROP TABLE ik_interrupts;
    ALTER TABLE ik_interrupts_by_sender RENAME TO ik_interrupts;
    """,
)

CREATE_SCHEMA_TABLE = (
    "CREATE TABLE IF NOT EXISTS ik_schema (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
)
SELECT_SCHEMA_VERSION = "SELECT COALESCE(MAX(version), 0) FROM ik_schema"
HAS_SCHEMA_TABLE = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ik_schema'"
INSERT_SCHEMA_VERSION = "INSERT INTO ik_schema (version, applied_at) VALUES (?, ?)"


def _statements(script: str) -> list[str]:
    """The statements of ``script``: a trigger's body holds semicolons of its own."""
    statements, pending = [], ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                statements.append(pending)
            pending = ""
    return statements


def migrate(conn: sqlite3.Connection) -> None:
    """Apply pending migrations; safe when several processes open the file at once."""
    conn.execute(CREATE_SCHEMA_TABLE)
    current = conn.execute(SELECT_SCHEMA_VERSION).fetchone()[0]
    if current == len(MIGRATIONS):
        return
    # BEGIN IMMEDIATE takes the write lock, so only one process migrates. The others
    # wait (busy_timeout), then see the new version and apply nothing.
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = conn.execute(SELECT_SCHEMA_VERSION).fetchone()[0]
        if current > len(MIGRATIONS):
            raise StoreError(
                f"database schema version {current} is newer than this library "
                f"({len(MIGRATIONS)}); upgrade intention-kernel"
            )
        for version in range(current + 1, len(MIGRATIONS) + 1):
            for statement in _statements(MIGRATIONS[version - 1]):
                conn.execute(statement)
            conn.execute(INSERT_SCHEMA_VERSION, (version, utcnow().isoformat()))
        conn.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise
