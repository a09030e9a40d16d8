"""SQLite durability: the embedded default, safe across processes on one file.

Design, and why:

- **WAL, ``synchronous=FULL`` by default.** Every commit is on disk before it is
  acknowledged; readers never block the writer. ``NORMAL`` is offered for hosts
  that accept losing the last commits on power loss (not on process crash).
- **Per-thread serialization with an OS lock** (:mod:`._filelock`): no database
  transaction is open while the interpreter or a capability runs, no extra
  commit is spent on a lease, and a dead holder's lock vanishes with its process.
- **Fenced commit.** The turn commit compares-and-sets the thread version and
  inserts the ``(thread_id, turn_id)`` primary key; a turn that lost its claim
  (it cannot, short of the lock file being deleted) would fail instead of
  overwriting.
- **Writes on one worker thread, reads inline on a second connection.** A write
  may flush to disk (``synchronous=FULL``) or wait up to ``busy_timeout`` for
  another process's write lock, so every write transaction runs on the adapter's
  worker thread and the event loop never blocks on one. A hop is never abandoned
  half-way: if the awaiting task is cancelled, the hop still finishes before the
  thread lock is released. Reads (the start of a turn, replays, inspection) run on
  the event loop itself: in WAL mode a reader never waits for a writer and never
  flushes, so a read costs tens of microseconds, less than the two thread switches
  of a hop. They run on a read-only connection of their own while writes may be on
  the worker (the writer's connection may be inside a transaction there), else on
  the writer's connection, whose page cache holds what it just wrote: a second
  connection reads again every page a write changed, which made the two reads that
  start a turn cost more than twice as much.
  ``:memory:`` has only the one connection, so there reads hop too.
- **By default a write hops only when turns overlap.** While the adapter runs a
  single turn (a CLI, a script, a worker serving one conversation at a time),
  nothing of its own waits on the event loop, and a hop's two thread switches
  cost more than the statements themselves on a busy machine: the write runs
  inline. As soon as a second turn (or an operator call) holds or awaits a thread
  lock, writes go to the worker thread so that the other turns keep running. A
  write never runs inline while a hop is still in flight, so the one writer
  connection is never used by two threads at once. Inline, nothing waits for a lock:
  when another connection holds the write lock, the write goes to the worker thread,
  which waits up to ``busy_timeout``, so a lock held elsewhere never stalls the event
  loop. ``offload_writes=True`` or ``False`` forces either behaviour.
- **Checkpoints in pieces.** The thread row holds the checkpoint's core; messages
  and facts have rows of their own, written only when a turn appends or changes
  them, so a turn costs the same on the 10,000th turn of a thread as on the 10th.

Transactions per turn: one read, one commit per effect state change
(``prepared``, then the outcome), and one commit for result + checkpoint + events.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from intention_kernel import _faults
from intention_kernel._json import dump_value
from intention_kernel.durability import _check_seconds
from intention_kernel.durability._filelock import LockFile, lock_offset
from intention_kernel.durability._rows import (
    decode_event,
    decode_receipt,
    dump_optional,
    dump_resolution,
    select_receipts,
)
from intention_kernel.durability._worker import WorkerThread
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
    CorruptRecordError,
    CorruptStoreError,
    FencedCommitError,
    KernelError,
    StoreError,
)
from intention_kernel.turns import EventDraft, OutboxEvent

__all__ = ["SQLiteDurability"]

T = TypeVar("T")

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
    # 2: checkpoints in pieces. ``ik_threads.checkpoint`` becomes the core document;
    # a thread's checkpoint still stored whole (by version 1) is read as it is and
    # split on its next commit. ``message_seq`` numbers the thread's messages. Facts
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
    # 3: operations. Publication state of each outbox event for the relay (the partial
    # index holds only what is left to publish, so it stays small while the relay keeps
    # up); whether a completed receipt's write was announced, set for existing ones
    # whose turn committed or that an operator resolved (the rule they were announced
    # by); and retention: a turn whose result was pruned keeps its row, marked.
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
    # 4: each receipt records its tenant, the tenant of the turn that first prepared it
    # (see ``ThreadOwner``: a thread with no committed turn belongs to the tenant of its
    # first receipt). Existing receipts of a committed thread take its owner, the only
    # tenant whose turns could write them; those of a thread with no committed turn
    # keep NULL (no tenant), which refuses any tenant's turn there: unknown fails closed.
    """
    ALTER TABLE ik_receipts ADD COLUMN tenant_id TEXT;
    UPDATE ik_receipts SET tenant_id = (
        SELECT th.tenant_id FROM ik_threads th
        WHERE th.thread_id = ik_receipts.thread_id AND th.version > 0);
    """,
    # 5: a turn row lists the receipts its effect.completed events announced (a JSON
    # array of keys, NULL for none): a receipt that the turn named by its ``turn_id``
    # completed and announced needs no mark of its own (see ``TurnRecord``), which
    # saves a statement and a page per effect in every commit. Existing receipts keep
    # their marks.
    """
    ALTER TABLE ik_turns ADD COLUMN announced TEXT;
    """,
)

CREATE_SCHEMA_TABLE = (
    "CREATE TABLE IF NOT EXISTS ik_schema (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
)
SELECT_SCHEMA_VERSION = "SELECT COALESCE(MAX(version), 0) FROM ik_schema"
HAS_SCHEMA_TABLE = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ik_schema'"
INSERT_SCHEMA_VERSION = "INSERT INTO ik_schema (version, applied_at) VALUES (?, ?)"

SELECT_TURN = """
    SELECT t.request_digest, t.result, th.tenant_id, t.pruned_at
    FROM ik_turns t LEFT JOIN ik_threads th ON th.thread_id = t.thread_id
    WHERE t.thread_id = ? AND t.turn_id = ?
"""
SELECT_THREAD = "SELECT version, tenant_id, checkpoint FROM ik_threads WHERE thread_id = ?"
SELECT_MESSAGES = "SELECT body FROM ik_messages WHERE thread_id = ? ORDER BY seq"
SELECT_FACTS = "SELECT key, body FROM ik_facts WHERE thread_id = ? ORDER BY rowid"
# The checkpoint document only when the caller does not already hold this version.
SELECT_THREAD_UNLESS_KNOWN = """
    SELECT version, tenant_id, CASE WHEN version IS ? THEN NULL ELSE checkpoint END
    FROM ik_threads WHERE thread_id = ?
"""

RECEIPT_COLUMNS = (
    "thread_id, key, id, status, turn_id, step_id, attempt, value, error, resolution, "
    "created_at, updated_at, announced, tenant_id"
)
READ_RECEIPTS = select_receipts(RECEIPT_COLUMNS)
SELECT_RECEIPT = f"{READ_RECEIPTS} WHERE r.thread_id = ? AND r.key = ?"
INSERT_RECEIPT = f"INSERT INTO ik_receipts ({RECEIPT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
# The tenant that claimed a thread with no committed turn: its first receipt's.
SELECT_CLAIM = "SELECT tenant_id FROM ik_receipts WHERE thread_id = ? ORDER BY rowid LIMIT 1"
# The first call of an effect key in one statement: insert the planned receipt unless
# one exists. Not a conflict hidden: no row inserted means the caller reads the
# existing receipt and plans from it (``claim_effect``).
INSERT_RECEIPT_IF_NEW = INSERT_RECEIPT + " ON CONFLICT (thread_id, key) DO NOTHING"
# Compare-and-set: the receipt must still be in the state the caller last saw.
UPDATE_RECEIPT = """
    UPDATE ik_receipts
    SET status = ?, turn_id = ?, step_id = ?, attempt = ?, value = ?, error = ?,
        resolution = ?, updated_at = ?, announced = ?
    WHERE thread_id = ? AND key = ? AND status = ? AND attempt = ?
"""
# The outcome of an attempt (see ``is_settlement``): the same compare-and-set, writing
# only what an outcome changes.
SETTLE_RECEIPT = """
    UPDATE ik_receipts SET status = ?, value = ?, error = ?, updated_at = ?
    WHERE thread_id = ? AND key = ? AND status = ? AND attempt = ?
"""
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
# only); anything above 0 means another turn committed first, so the WHERE refuses.
INSERT_THREAD = """
    INSERT INTO ik_threads (thread_id, tenant_id, version, schema_revision, fingerprint,
                            checkpoint, next_seq, updated_at, message_seq)
    VALUES (:thread_id, :tenant_id, :version, :schema_revision, :fingerprint, :checkpoint,
            1 + :events, :now, :messages)
    ON CONFLICT (thread_id) DO UPDATE SET
        tenant_id = excluded.tenant_id, version = excluded.version,
        schema_revision = excluded.schema_revision, fingerprint = excluded.fingerprint,
        checkpoint = excluded.checkpoint, next_seq = ik_threads.next_seq + :events,
        updated_at = excluded.updated_at, message_seq = ik_threads.message_seq + :messages
    WHERE ik_threads.version = 0
    RETURNING next_seq, message_seq
"""
# Later commits: fenced on the version this turn loaded.
UPDATE_THREAD = """
    UPDATE ik_threads
    SET version = :version, schema_revision = :schema_revision, fingerprint = :fingerprint,
        checkpoint = :checkpoint, next_seq = next_seq + :events, updated_at = :now,
        message_seq = message_seq + :messages
    WHERE thread_id = :thread_id AND version = :expected
    RETURNING next_seq, message_seq
"""
# The checkpoint's rows (see ``TurnRecord``): messages numbered on from message_seq.
INSERT_MESSAGE = "INSERT INTO ik_messages (thread_id, seq, body) VALUES (?, ?, ?)"
TRIM_MESSAGES = "DELETE FROM ik_messages WHERE thread_id = ? AND seq > ? AND seq <= ?"
DELETE_MESSAGES = "DELETE FROM ik_messages WHERE thread_id = ?"
# A replaced fact keeps its row (and rowid, hence its place in the order).
UPSERT_FACT = """
    INSERT INTO ik_facts (thread_id, key, body) VALUES (?, ?, ?)
    ON CONFLICT (thread_id, key) DO UPDATE SET body = excluded.body
"""
DELETE_FACT = "DELETE FROM ik_facts WHERE thread_id = ? AND key = ?"
DELETE_FACTS = "DELETE FROM ik_facts WHERE thread_id = ?"
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
OUTBOX_COLUMNS = "id, position, thread_id, turn_id, seq, type, payload, created_at"

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
SELECT_BACKLOG = "SELECT count(*), min(created_at) FROM ik_outbox WHERE published_at IS NULL"
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
    SET checkpoint = ?, schema_revision = ?, fingerprint = ?, message_seq = message_seq + ?
    WHERE thread_id = ? AND version = ?
    RETURNING message_seq
"""
PRUNE_EVENTS = """
    DELETE FROM ik_outbox WHERE position IN (
        SELECT position FROM ik_outbox
        WHERE published_at IS NOT NULL AND created_at < ? ORDER BY position LIMIT ?)
"""
# The turn row stays, so that a late delivery is refused (TurnExpiredError), not re-run.
# Only turns that still hold a result are selected, after the cursor: a run never reads
# the keys of turns pruned before. No index on the unpruned turns: it would cost one
# more index write per committed turn, and retention runs rarely.
PRUNE_TURNS = """
    UPDATE ik_turns SET result = '', pruned_at = ?
    WHERE rowid IN (
        SELECT rowid FROM ik_turns
        WHERE (thread_id, turn_id) > (?, ?) AND pruned_at IS NULL AND created_at < ?
        ORDER BY thread_id, turn_id LIMIT ?)
    RETURNING thread_id, turn_id
"""


class _SQLiteRecorder(Recorder):
    #: ``_run`` never lets a cancellation through before its hop ends.
    options = RecorderOptions(finishes_writes_when_cancelled=True, attempts_outlive_lock=False)

    def __init__(
        self,
        path: str,
        *,
        synchronous: Literal["FULL", "NORMAL"],
        lock_timeout: float,
        busy_timeout: float,
        offload_writes: bool | None,
    ) -> None:
        self._path = path
        self._offload_writes = offload_writes
        self._synchronous = synchronous
        self._lock_timeout = lock_timeout
        self._busy_timeout_ms = int(busy_timeout * 1000)
        self._writer_waits = True  # the writer's busy timeout is set (see _wait_for_locks)
        self._conn: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._worker: WorkerThread | None = None
        # Named after the database's real path: two adapters that reach one file through
        # a symlink or another relative path must share one lock file, or their turns
        # on a thread would overlap (and the later commit be fenced after running).
        self._locks = LockFile(os.path.realpath(path) + ".locks") if path != ":memory:" else None
        self._memory_locks: dict[str, asyncio.Lock] = {}
        self._memory_relayed: set[str] = set()
        self._lockers = 0  # tasks holding or awaiting a thread lock of this adapter
        self._hops = 0  # calls submitted to the worker thread and not finished

    # -- plumbing ------------------------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T], thread_id: str | None = None) -> T:
        """Run ``fn`` on the worker thread, or inline (see the module docstring); a
        started hop always runs to its end.

        Inline, no statement waits for another connection's write lock: the writer's
        busy timeout is 0 there, and a busy database hands the call to the worker
        thread, which waits for it. Without that, a lock held by another process would
        stall the event loop, and every other task of the process, for up to
        ``busy_timeout``. The call starts again from its first statement on the worker
        only if it wrote nothing (a busy error comes from the statement that needs the
        write lock, and each call writes in one transaction or one statement, last).
        ``thread_id`` names the thread in the error when a row read is corrupt.
        """
        conn = self._conn
        if self._worker is None or conn is None:
            raise KernelError("the SQLite adapter is closed")
        if self._inline():
            self._wait_for_locks(conn, False)
            done = self._call(conn, fn, thread_id, conn.total_changes)
            if not isinstance(done, _Busy):
                return done
        return await self._hop(fn, thread_id)

    def _call(
        self,
        conn: sqlite3.Connection,
        fn: Callable[[sqlite3.Connection], T],
        thread_id: str | None,
        inline_changes: int | None = None,
    ) -> T | _Busy:
        """``fn(conn)``, rolled back on any error, with the driver's errors translated.
        Inline (``inline_changes``: the connection's change count before the call), a
        busy database that kept the call from writing anything answers ``_BUSY``, so
        that the caller hands the call to the worker thread."""
        try:
            return fn(conn)
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.rollback()
            if (
                inline_changes is not None
                and _is_busy(exc)
                and conn.total_changes == inline_changes
            ):
                return _BUSY
            raise self._error(exc, thread_id) from exc
        except UnicodeDecodeError as exc:
            if conn.in_transaction:
                conn.rollback()
            raise self._not_utf8(exc, thread_id) from exc
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise

    async def _hop(self, fn: Callable[[sqlite3.Connection], T], thread_id: str | None) -> T:
        """Run ``fn`` on the worker thread, waiting up to ``busy_timeout`` for the write
        lock; a started hop always runs to its end."""
        worker, conn = self._worker, self._conn
        if worker is None or conn is None:
            raise KernelError("the SQLite adapter is closed")

        def call() -> T:
            self._wait_for_locks(conn, True)
            done = self._call(conn, fn, thread_id)
            assert not isinstance(done, _Busy)  # only an inline call answers _BUSY
            return done

        future = worker.submit(call)
        self._hops += 1
        future.add_done_callback(self._hop_done)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # Keep the thread lock until the statement is done, then honour the cancel.
            await asyncio.wait([future])
            raise

    def _wait_for_locks(self, conn: sqlite3.Connection, waits: bool) -> None:
        """Give the writer's connection its busy timeout (on the worker) or none (inline).
        Only ever called where the connection is free: inline with no hop in flight, or
        on the worker thread; so the flag always says what the connection has."""
        if self._writer_waits is not waits:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms if waits else 0}")
            self._writer_waits = waits

    def _error(self, exc: sqlite3.Error, thread_id: str | None = None) -> KernelError:
        """A driver error at the adapter's edge: a damaged file is ``CorruptStoreError``
        (not transient: the host must not answer "retry"), the rest ``StoreError``."""
        if _is_corrupt(exc):
            return CorruptStoreError(
                f"SQLite database {self._path!r} is damaged: {exc}; restore it from a backup",
                thread_id=thread_id,
            )
        return StoreError(f"SQLite error on {self._path}: {type(exc).__name__}: {exc}")

    def _not_utf8(self, exc: UnicodeDecodeError, thread_id: str | None) -> CorruptRecordError:
        where = f"of thread {thread_id!r} " if thread_id is not None else ""
        return CorruptRecordError(
            f"a row {where}in SQLite database {self._path!r} holds text that is not UTF-8 "
            f"({exc.reason} at byte {exc.start}); it was written by something else than "
            "intention-kernel",
            thread_id=thread_id,
        )

    def _inline(self) -> bool:
        """Whether a write runs on the event loop now rather than on the worker thread
        (see the module docstring)."""
        offload = self._offload_writes
        return offload is False or (offload is None and self._lockers <= 1 and not self._hops)

    def _hop_done(self, _: object) -> None:
        self._hops -= 1

    async def _read(self, fn: Callable[[sqlite3.Connection], T], thread_id: str | None = None) -> T:
        """Run the read-only ``fn`` inline: on the writer's connection when writes run
        inline, else on the reader connection (see the module docstring); on
        ``:memory:``, which has no second connection, hop. Neither connection waits
        inline: a read the database keeps busy (a WAL reader rarely is; another process
        holding it in exclusive locking mode) runs again on the worker thread."""
        conn = self._reader
        if conn is None:
            return await self._run(fn, thread_id)
        if self._inline() and self._conn is not None:
            # No hop in flight, and none can start before ``fn`` returns: it runs
            # without an await, so the writer's connection is free (see the docstring).
            conn = self._conn
            self._wait_for_locks(conn, False)
        try:
            return fn(conn)
        except sqlite3.Error as exc:
            if not _is_busy(exc):
                raise self._error(exc, thread_id) from exc
        except UnicodeDecodeError as exc:
            raise self._not_utf8(exc, thread_id) from exc
        finally:
            if conn.in_transaction:
                conn.rollback()
        return await self._hop(fn, thread_id)

    async def open(self) -> None:
        self._worker = WorkerThread("ik-sqlite")

        def connect() -> sqlite3.Connection:
            directory = os.path.dirname(os.path.abspath(self._path))
            if self._path != ":memory:" and not os.path.isdir(directory):
                raise StoreError(f"directory of SQLite database {self._path!r} does not exist")
            conn = sqlite3.connect(
                self._path, isolation_level=None, check_same_thread=False, cached_statements=64
            )
            try:
                conn.text_factory = _TEXT
                conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute(f"PRAGMA synchronous = {self._synchronous}")
                _migrate(conn)
            except BaseException:
                conn.close()
                raise
            return conn

        try:
            self._conn = await self._worker.submit(connect)
        except (sqlite3.Error, StoreError) as exc:
            self._worker.close()
            self._worker = None
            if isinstance(exc, StoreError):
                raise
            raise self._open_error(exc) from exc
        try:
            if self._path != ":memory:":
                # No busy timeout: it is only used inline (see _read).
                self._reader = sqlite3.connect(
                    self._path, timeout=0, isolation_level=None, check_same_thread=False
                )
                self._reader.text_factory = _TEXT
                self._reader.execute("PRAGMA query_only = 1")
            if self._locks is not None:
                self._locks.open()
        except (sqlite3.Error, OSError) as exc:
            # A read-only directory (or file system) can still open a database whose
            # -wal and -shm files a crash left behind, and then refuse the lock file.
            await self.close()
            raise self._open_error(exc) from exc

    def _open_error(self, exc: sqlite3.Error | OSError) -> KernelError:
        if isinstance(exc, OSError):
            return StoreError(
                f"cannot open SQLite database {self._path!r}: its lock file "
                f"{exc.filename!r} cannot be opened for writing: {exc.strerror}"
            )
        if _is_corrupt(exc):
            return self._error(exc)
        return StoreError(f"cannot open SQLite database {self._path!r}: {exc}")

    async def exists(self) -> bool:
        if self._path == ":memory:":
            return True  # private to this adapter, like the in-memory one

        def probe() -> bool:
            if not os.path.isfile(self._path):
                return False
            # Read-only and without waiting, so that nothing is created, not even -wal.
            uri = Path(self._path).absolute().as_uri() + "?mode=ro"
            with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=0)) as conn:
                return conn.execute(HAS_SCHEMA_TABLE).fetchone() is not None

        try:
            return await asyncio.to_thread(probe)
        except sqlite3.Error as exc:
            if _is_corrupt(exc):
                raise self._error(exc) from exc
            raise StoreError(
                f"{self._path!r} cannot be read as a SQLite store: {type(exc).__name__}: {exc}"
            ) from exc

    async def close(self) -> None:
        conn, worker, reader = self._conn, self._worker, self._reader
        self._conn = None
        self._worker = None
        self._reader = None
        if reader is not None:
            reader.close()
        if conn is not None and worker is not None:
            await worker.submit(conn.close)
        if worker is not None:
            worker.close()
        if self._locks is not None:
            self._locks.close()

    @asynccontextmanager
    async def lock(self, thread_id: str) -> AsyncIterator[object]:
        self._lockers += 1
        try:
            if self._locks is None:  # ":memory:" is private to this adapter
                lock = self._memory_locks.setdefault(thread_id, asyncio.Lock())
                async with lock:
                    yield lock
                return
            async with self._locks.hold(thread_id, self._lock_timeout):
                yield thread_id
        finally:
            self._lockers -= 1

    # -- turns ---------------------------------------------------------------------------------

    async def begin_turn(
        self, thread_id: str, turn_id: str, known_version: int | None
    ) -> TurnStart:
        def read(conn: sqlite3.Connection) -> TurnStart:
            row = conn.execute(SELECT_TURN, (thread_id, turn_id)).fetchone()
            if row is not None:
                return TurnStart(StoredTurn(row[0], row[1], row[3] is not None), None, row[2])
            thread = conn.execute(SELECT_THREAD_UNLESS_KNOWN, (known_version, thread_id))
            found = _thread(thread.fetchone())
            if found is None or not found.version:
                claim = conn.execute(SELECT_CLAIM, (thread_id,)).fetchone()
                owner = None if claim is None else ThreadOwner(claim[0])
                return TurnStart(None, found, claimed_by=owner)
            if found.checkpoint is None:
                return TurnStart(None, found)
            # Not cached: read the rows too. Under the thread lock nobody writes them,
            # so no snapshot is needed (read_thread takes one: it runs without the lock).
            return TurnStart(None, _with_rows(conn, thread_id, found))

        return await self._read(read, thread_id)

    async def read_thread(self, thread_id: str) -> StoredThread | None:
        def read(conn: sqlite3.Connection) -> StoredThread | None:
            conn.execute("BEGIN")  # one snapshot for the thread row and its rows
            found = _thread(conn.execute(SELECT_THREAD, (thread_id,)).fetchone())
            found = found if found is None else _with_rows(conn, thread_id, found)
            conn.execute("COMMIT")
            return found

        return await self._read(read, thread_id)

    async def commit_turn(self, record: TurnRecord) -> None:
        now = record.created_at.isoformat()
        params = {
            "thread_id": record.thread_id,
            "tenant_id": record.tenant_id,
            "version": record.version,
            "expected": record.expected_version,
            "schema_revision": record.schema_revision,
            "fingerprint": record.fingerprint,
            "checkpoint": record.checkpoint,
            "events": len(record.events),
            "messages": len(record.messages),
            "now": now,
        }
        rows = _event_rows(record.events, record.thread_id, record.turn_id, now)
        thread_id = record.thread_id
        announced = dump_value(list(record.announced)) if record.announced else None

        def commit(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    INSERT_TURN,
                    (
                        record.thread_id,
                        record.turn_id,
                        record.request_digest,
                        record.version,
                        record.result,
                        now,
                        announced,
                    ),
                )
            except sqlite3.IntegrityError as exc:
                conn.rollback()
                if exc.sqlite_errorcode != sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
                    raise
                raise _fenced(record, "the turn ID was committed by another worker") from exc
            statement = INSERT_THREAD if record.expected_version == 0 else UPDATE_THREAD
            returned = conn.execute(statement, params).fetchone()
            if returned is None:
                conn.rollback()
                raise _fenced(record, "the thread version moved")
            next_seq, message_seq = returned
            if record.rewrite:
                conn.execute(DELETE_MESSAGES, (thread_id,))
                conn.execute(DELETE_FACTS, (thread_id,))
            first = message_seq - len(record.messages) + 1
            conn.executemany(
                INSERT_MESSAGE,
                [(thread_id, first + i, body) for i, body in enumerate(record.messages)],
            )
            if record.trim_messages:
                last_trimmed = message_seq - record.keep_messages
                first_kept = last_trimmed - record.trim_messages
                conn.execute(TRIM_MESSAGES, (thread_id, first_kept, last_trimmed))
            conn.executemany(UPSERT_FACT, [(thread_id, k, body) for k, body in record.facts])
            conn.executemany(DELETE_FACT, [(thread_id, k) for k in record.removed_facts])
            if record.mark_announced:
                conn.executemany(MARK_ANNOUNCED, [(thread_id, k) for k in record.mark_announced])
            first_seq = next_seq - len(rows)
            conn.executemany(
                INSERT_EVENT,
                [(r[0], r[1], r[2], first_seq + i, r[3], r[4], r[5]) for i, r in enumerate(rows)],
            )
            if _faults.armed:  # every row written, the transaction still open
                _faults.reach(_faults.DURING_COMMIT)
            conn.execute("COMMIT")

        await self._run(commit, thread_id)

    # -- effects -------------------------------------------------------------------------------

    async def claim_effect(self, thread_id: str, key: str, plan: PlanFn) -> EffectPlan:
        def claim(conn: sqlite3.Connection) -> EffectPlan:
            # Most keys are new: try what a first call writes, and read only if a
            # receipt was there already.
            first = plan(None)
            if first.write is not None:
                row = _receipt_row(first.write)
                if conn.execute(INSERT_RECEIPT_IF_NEW, row).rowcount == 1:
                    return first
            # Under the thread lock nobody else writes this receipt, so the read needs
            # no transaction and the write is one autocommitted statement.
            existing = _receipt(conn.execute(SELECT_RECEIPT, (thread_id, key)).fetchone())
            decided = plan(existing)
            if decided.write is not None:
                if existing is None:
                    conn.execute(INSERT_RECEIPT, _receipt_row(decided.write))
                else:
                    _update_receipt(conn, decided.write, existing)
            return decided

        return await self._run(claim, thread_id)

    async def write_receipt(self, receipt: Receipt, expected: Receipt) -> None:
        await self._run(lambda c: _update_receipt(c, receipt, expected), receipt.thread_id)

    async def read_receipts(
        self, thread_id: str | None, status: ReceiptStatus | None, tenant_id: str | None = None
    ) -> list[Receipt]:
        clauses, args = [], []
        if thread_id is not None:
            clauses.append("r.thread_id = ?")
            args.append(thread_id)
        if status is not None:
            clauses.append("r.status = ?")
            args.append(str(status))
        if tenant_id is not None:
            clauses.append("r.tenant_id = ?")
            args.append(tenant_id)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"{READ_RECEIPTS} {where} ORDER BY r.created_at, r.rowid"

        def read(conn: sqlite3.Connection) -> list[Receipt]:
            return [_require(_receipt(row)) for row in conn.execute(sql, args)]

        return await self._read(read, thread_id)

    async def resolve_receipt(self, thread_id: str, key: str, resolution: ResolutionFn) -> Receipt:
        def apply(conn: sqlite3.Connection) -> Receipt:
            conn.execute("BEGIN IMMEDIATE")
            existing = _receipt(conn.execute(SELECT_RECEIPT, (thread_id, key)).fetchone())
            resolved, event = resolution(existing)
            assert existing is not None
            _update_receipt(conn, resolved, existing)
            now = utcnow().isoformat()
            seq = conn.execute(BUMP_THREAD_SEQ, (thread_id, now)).fetchone()[0] - 1
            row = _event_rows([event], thread_id, None, now)[0]
            conn.execute(INSERT_EVENT, (row[0], row[1], row[2], seq, row[3], row[4], row[5]))
            conn.execute("COMMIT")
            return resolved

        return await self._run(apply, thread_id)

    # -- outbox --------------------------------------------------------------------------------

    async def read_outbox(
        self, thread_id: str | None, after: int | None, limit: int
    ) -> list[OutboxEvent]:
        sql = f"SELECT {OUTBOX_COLUMNS} FROM ik_outbox WHERE position > ?"
        args: list[Any] = [after or 0]
        if thread_id is not None:
            sql += " AND thread_id = ?"
            args.append(thread_id)
        sql += " ORDER BY position LIMIT ?"
        args.append(limit)

        def read(conn: sqlite3.Connection) -> list[OutboxEvent]:
            return [_event(r) for r in conn.execute(sql, args)]

        return await self._read(read)

    # -- the outbox relay ----------------------------------------------------------------------

    @asynccontextmanager
    async def claim_outbox(self, thread_id: str) -> AsyncIterator[bool]:
        # A byte of the same lock file as the turns' locks, at another offset: relays
        # exclude each other across processes, never a turn; the OS drops a dead
        # relay's claims. (Thread IDs hold no NUL, so the tag cannot name a thread.)
        locks = self._locks
        if locks is None:  # ":memory:" is private to this adapter
            if thread_id in self._memory_relayed:
                yield False
                return
            self._memory_relayed.add(thread_id)
            try:
                yield True
            finally:
                self._memory_relayed.discard(thread_id)
            return
        offset = lock_offset("\x00relay\x00" + thread_id)
        if not locks.try_acquire(offset):
            yield False
            return
        try:
            yield True
        finally:
            locks.release(offset)

    async def pending_threads(self, now: datetime, limit: int) -> list[str]:
        args = (_stamp(now), limit)
        return await self._read(lambda c: [r[0] for r in c.execute(PENDING_THREADS, args)])

    async def read_unpublished(self, thread_id: str, limit: int) -> list[OutboxDelivery]:
        args = (thread_id, limit)
        return await self._read(
            lambda c: [_delivery(r) for r in c.execute(SELECT_UNPUBLISHED, args)], thread_id
        )

    async def mark_published(self, thread_id: str, seqs: Sequence[int], at: datetime) -> None:
        rows = [(_stamp(at), thread_id, seq) for seq in seqs]

        def mark(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(MARK_PUBLISHED, rows)
            conn.execute("COMMIT")

        await self._run(mark)

    async def mark_failed(
        self, thread_id: str, seq: int, attempts: int, error: str, retry_at: datetime
    ) -> None:
        args = (attempts, error, _stamp(retry_at), thread_id, seq)
        await self._run(lambda conn: conn.execute(MARK_FAILED, args))

    async def outbox_backlog(self, failing_limit: int) -> OutboxBacklog:
        def read(conn: sqlite3.Connection) -> OutboxBacklog:
            conn.execute("BEGIN")  # one snapshot for the count and the failing events
            count, oldest = conn.execute(SELECT_BACKLOG).fetchone()
            failing = [_delivery(r) for r in conn.execute(SELECT_FAILING, (failing_limit,))]
            conn.execute("COMMIT")
            return OutboxBacklog(count, _parse_time(oldest), failing)

        return await self._read(read)

    # -- deploy check, migration, retention ----------------------------------------------------

    async def scan_threads(
        self, after: str | None, limit: int, below_revision: int | None
    ) -> list[tuple[str, StoredThread]]:
        args = (after or "", below_revision, below_revision, limit)

        def read(conn: sqlite3.Connection) -> list[tuple[str, StoredThread]]:
            conn.execute("BEGIN")  # each thread and its rows from one snapshot
            rows = conn.execute(SCAN_THREADS, args).fetchall()
            found = [
                (row[0], _with_rows(conn, row[0], StoredThread(row[1], row[2], row[3])))
                for row in rows
            ]
            conn.execute("COMMIT")
            return found

        return await self._read(read)

    async def read_interactions(
        self, after: str | None, limit: int, owner: ThreadOwner | None
    ) -> list[tuple[str, StoredThread]]:
        args = (
            after or "",
            INTERACTION_MARKER,
            owner is not None,
            owner.tenant_id if owner else None,
            limit,
        )

        def read(conn: sqlite3.Connection) -> list[tuple[str, StoredThread]]:
            rows = conn.execute(SELECT_INTERACTIONS, args).fetchall()
            return [(row[0], StoredThread(row[1], row[2], row[3])) for row in rows]

        return await self._read(read)

    async def rewrite_checkpoint(self, rewrite: CheckpointRewrite) -> None:
        thread_id = rewrite.thread_id

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            returned = conn.execute(
                REWRITE_THREAD,
                (
                    rewrite.checkpoint,
                    rewrite.schema_revision,
                    rewrite.fingerprint,
                    len(rewrite.messages),
                    thread_id,
                    rewrite.version,
                ),
            ).fetchone()
            if returned is None:
                conn.rollback()
                raise FencedCommitError(
                    f"thread {thread_id!r} moved on while its checkpoint was migrated",
                    thread_id=thread_id,
                )
            first = returned[0] - len(rewrite.messages) + 1
            conn.execute(DELETE_MESSAGES, (thread_id,))
            conn.executemany(
                INSERT_MESSAGE,
                [(thread_id, first + i, body) for i, body in enumerate(rewrite.messages)],
            )
            conn.execute(DELETE_FACTS, (thread_id,))
            conn.executemany(UPSERT_FACT, [(thread_id, k, body) for k, body in rewrite.facts])
            conn.execute("COMMIT")

        await self._run(write, thread_id)

    async def prune_events(self, before: datetime, limit: int) -> int:
        args = (_stamp(before), limit)
        return int(await self._run(lambda conn: conn.execute(PRUNE_EVENTS, args).rowcount))

    async def prune_turns(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> tuple[int, tuple[str, str] | None]:
        start = after or ("", "")
        cutoff, now = _stamp(before), _stamp(utcnow())

        def prune(conn: sqlite3.Connection) -> tuple[int, tuple[str, str] | None]:
            rows = conn.execute(PRUNE_TURNS, (now, *start, cutoff, limit)).fetchall()
            keys = [(row[0], row[1]) for row in rows]
            return len(keys), (max(keys) if len(keys) == limit else None)

        return await self._run(prune)


class SQLiteDurability(RecordedDurability):
    """Durability on one SQLite file, shared safely by any number of processes.

    - ``synchronous``: ``"FULL"`` (default) flushes every commit; ``"NORMAL"``
      may lose the last commits on power loss, never on a process crash.
    - ``lock_timeout``: how long a turn waits for a busy thread before
      ``ThreadBusyError``.
    - ``busy_timeout``: how long a statement waits for SQLite's write lock.
      Both are finite, non-negative seconds; NaN, infinity and negative values are
      refused with ``ValueError``.
    - ``offload_writes``: where write transactions run. ``None`` (default): on the
      event loop while the adapter runs one turn at a time, on the adapter's worker
      thread as soon as turns overlap, so that a disk flush or another process's
      write lock never stalls the other turns. ``True``: always on the worker thread
      (the event loop never waits on a write). ``False``: always on the event loop
      (a turn with one write saves six thread switches; for programs that run one
      turn at a time). Reads always run inline on a connection of their own.

    The lock file ``<path>.locks`` sits beside the database's real file (symlinks
    resolved, so every path to one database shares one lock file); keep them on a local
    file system (POSIX record locks are unreliable on network mounts).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        lock_timeout: float = 30.0,
        busy_timeout: float = 30.0,
        offload_writes: bool | None = None,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be 'FULL' or 'NORMAL'")
        lock_timeout = _check_seconds("lock_timeout", lock_timeout)
        busy_timeout = _check_seconds("busy_timeout", busy_timeout)
        self.path = os.fspath(path)
        super().__init__(
            _SQLiteRecorder(
                self.path,
                synchronous=synchronous,
                lock_timeout=lock_timeout,
                busy_timeout=busy_timeout,
                offload_writes=offload_writes,
            )
        )


# -- rows ------------------------------------------------------------------------------------


def _migrate(conn: sqlite3.Connection) -> None:
    """Apply pending migrations; safe when several processes open the file at once."""
    conn.execute(CREATE_SCHEMA_TABLE)
    current = conn.execute(SELECT_SCHEMA_VERSION).fetchone()[0]
    if current == len(MIGRATIONS):
        return
    # BEGIN IMMEDIATE takes the write lock, so only one process migrates; the others
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
            for statement in MIGRATIONS[version - 1].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(INSERT_SCHEMA_VERSION, (version, utcnow().isoformat()))
        conn.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise


def _is_corrupt(exc: sqlite3.Error) -> bool:
    """Whether SQLite found the file damaged: a malformed page or a truncated file
    (``SQLITE_CORRUPT``), or a file that is not a database (``SQLITE_NOTADB``)."""
    code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
    return code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


#: Decodes stored text strictly, so that text that is not UTF-8 raises
#: ``UnicodeDecodeError`` (a class the adapter translates) rather than the driver's
#: ``OperationalError``, which only its message would tell from a failing statement.
_TEXT = functools.partial(str, encoding="utf-8")


class _Busy:
    """What an inline call answers when a busy database kept it from writing."""


_BUSY = _Busy()


def _is_busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused a lock that another connection holds (``SQLITE_BUSY`` and
    its extended codes)."""
    return (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == sqlite3.SQLITE_BUSY


def _thread(row: Sequence[Any] | None) -> StoredThread | None:
    if row is None:
        return None
    return StoredThread(version=row[0], tenant_id=row[1], checkpoint=row[2])


def _with_rows(conn: sqlite3.Connection, thread_id: str, thread: StoredThread) -> StoredThread:
    messages = [row[0] for row in conn.execute(SELECT_MESSAGES, (thread_id,))]
    facts = conn.execute(SELECT_FACTS, (thread_id,)).fetchall()
    return StoredThread(thread.version, thread.tenant_id, thread.checkpoint, messages, facts)


def _fenced(record: TurnRecord, why: str) -> FencedCommitError:
    return FencedCommitError(
        f"turn {record.turn_id!r} of thread {record.thread_id!r} was not committed: {why} "
        "while it ran",
        thread_id=record.thread_id,
        turn_id=record.turn_id,
    )


def _receipt_row(r: Receipt) -> tuple[Any, ...]:
    """Column values in ``RECEIPT_COLUMNS`` order."""
    return (
        r.thread_id,
        r.key,
        r.id,
        str(r.status),
        r.turn_id,
        r.step_id,
        r.attempt,
        dump_optional(r.value),
        r.error,
        dump_resolution(r.resolution),
        (r.created_at or utcnow()).isoformat(),
        (r.updated_at or utcnow()).isoformat(),
        int(r.announced),
        r.tenant_id,
    )


def _update_receipt(conn: sqlite3.Connection, new: Receipt, expected: Receipt) -> None:
    row = _receipt_row(new)
    fence = (new.thread_id, new.key, expected.status.value, expected.attempt)
    if is_settlement(new, expected):
        # status, value, error, updated_at
        cursor = conn.execute(SETTLE_RECEIPT, (row[3], row[7], row[8], row[11], *fence))
    else:
        cursor = conn.execute(UPDATE_RECEIPT, (*row[3:10], *row[11:13], *fence))
    if cursor.rowcount != 1:
        raise FencedCommitError(
            f"receipt {new.key!r} on thread {new.thread_id!r} changed while its effect ran",
            thread_id=new.thread_id,
            key=new.key,
        )


def _receipt(row: Sequence[Any] | None) -> Receipt | None:
    if row is None:
        return None
    try:
        created_at, updated_at = datetime.fromisoformat(row[10]), datetime.fromisoformat(row[11])
    except (TypeError, ValueError) as exc:
        raise CorruptRecordError(
            f"receipt row for key {row[1]!r} on thread {row[0]!r} has a bad timestamp: {exc}",
            thread_id=row[0],
            key=row[1],
        ) from exc
    return decode_receipt(
        thread_id=row[0],
        key=row[1],
        id=row[2],
        status=row[3],
        turn_id=row[4],
        step_id=row[5],
        attempt=row[6],
        value=row[7],
        error=row[8],
        resolution=row[9],
        created_at=created_at,
        updated_at=updated_at,
        announced=row[12],
        tenant_id=row[13],
        announced_by_turn=row[14],
    )


def _stamp(moment: datetime) -> str:
    """A timestamp as stored: ISO 8601 text, always with microseconds, so that text
    order is time order."""
    return moment.isoformat(timespec="microseconds")


def _parse_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _event(r: Sequence[Any]) -> OutboxEvent:
    """An event from its ``OUTBOX_COLUMNS``."""
    return decode_event(
        id=r[0],
        position=r[1],
        thread_id=r[2],
        turn_id=r[3],
        seq=r[4],
        type=r[5],
        payload=r[6],
        created_at=datetime.fromisoformat(r[7]),
    )


def _delivery(r: Sequence[Any]) -> OutboxDelivery:
    """An unpublished event from its ``OUTBOX_COLUMNS`` and its publication state."""
    return OutboxDelivery(_event(r), r[8], r[9], _parse_time(r[10]))


def _require(receipt: Receipt | None) -> Receipt:
    assert receipt is not None
    return receipt


def _event_rows(
    events: Sequence[EventDraft], thread_id: str, turn_id: str | None, now: str
) -> list[tuple[Any, ...]]:
    return [(e.id, thread_id, turn_id, e.type, dump_value(e.payload), now) for e in events]
