"""The floor: the statements of one turn issued by hand with the raw driver.

The same rows, the same statements and the same commits as the kernel's adapters.
A turn is one read, the ``prepared`` and ``completed`` receipt writes, and one commit.
The commit holds the result, the checkpoint core, the appended messages, the changed
fact and the events. On SQLite the receipt index is rows: one appended, the oldest
trimmed. The per-thread lock is the kernel's: an OS record lock for SQLite, an
advisory lock for PostgreSQL. It is written the way one would by hand: synchronous,
JSON built with ``json.dumps``, thread state kept in memory. No framework: the
kernel's overhead is its ratio to this.

The rows hold what the kernel's hold, column for column: a receipt's capability and
input, a turn's announced keys, each step's approval fields, the indexes the relay
reads. ``tests/test_bench_floor.py`` compares the SQLite rows' bytes, table by table.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import uuid
import zlib
from datetime import UTC, datetime
from typing import Any

from bench.workload import MAX_MESSAGES, FakeProvider, message, payment

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS threads (thread_id TEXT PRIMARY KEY, tenant_id TEXT,
    version INTEGER NOT NULL, schema_revision INTEGER, fingerprint TEXT, checkpoint TEXT,
    next_seq INTEGER NOT NULL, message_seq INTEGER NOT NULL, updated_at TEXT NOT NULL,
    receipt_seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS turns (thread_id TEXT NOT NULL, turn_id TEXT NOT NULL,
    request_digest TEXT, version INTEGER NOT NULL, result TEXT NOT NULL,
    created_at TEXT NOT NULL, announced TEXT, PRIMARY KEY (thread_id, turn_id));
CREATE TABLE IF NOT EXISTS receipts (thread_id TEXT NOT NULL, key TEXT NOT NULL,
    id TEXT NOT NULL UNIQUE, status TEXT NOT NULL, turn_id TEXT NOT NULL,
    step_id TEXT NOT NULL, attempt INTEGER NOT NULL, value TEXT, error TEXT,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, announced INTEGER NOT NULL,
    tenant_id TEXT, actor TEXT, capability_id TEXT, input TEXT, approved_by TEXT,
    PRIMARY KEY (thread_id, key));
CREATE INDEX IF NOT EXISTS receipts_status ON receipts (status);
CREATE TABLE IF NOT EXISTS messages (thread_id TEXT NOT NULL, seq INTEGER NOT NULL,
    body TEXT NOT NULL, PRIMARY KEY (thread_id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS facts (thread_id TEXT NOT NULL, key TEXT NOT NULL,
    body TEXT NOT NULL, PRIMARY KEY (thread_id, key));
CREATE TABLE IF NOT EXISTS receipt_index (thread_id TEXT NOT NULL, seq INTEGER NOT NULL,
    key TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (thread_id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (position INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE, thread_id TEXT NOT NULL, turn_id TEXT, seq INTEGER NOT NULL,
    type TEXT NOT NULL, payload TEXT, created_at TEXT NOT NULL, published_at TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, UNIQUE (thread_id, seq));
CREATE INDEX IF NOT EXISTS outbox_unpublished ON outbox (thread_id, seq)
    WHERE published_at IS NULL;
"""
#: Entries a checkpoint's receipt index keeps (the agent's ``max_receipts``).
MAX_RECEIPTS = 100
#: The agent's fingerprint, as the kernel's rows spell one.
FINGERPRINT = "sha256:" + "0" * 32
#: What the kernel's result records of each step besides its outcome.
STEP_TAIL = {"proposed_input": None, "approved_input": None, "round": 1, "actor": None}


class _Thread:
    def __init__(self) -> None:
        self.version = 0
        self.receipts: list[dict[str, Any]] = []


def _turn_documents(
    thread: str, n: int, state: _Thread, value: dict[str, Any], receipt_id: str, now: str
) -> dict[str, Any]:
    """The JSON a turn stores: result, checkpoint core, messages, fact, events."""
    turn, step = str(n), f"{n}#2"
    reply = f"You owe 4200.\nCharged 100 to {payment(n)}."
    fact = {
        "key": f"charge.{payment(n)}",
        "value": value,
        "version": 1,
        "evidence": {
            "capability_id": "payments.charge",
            "turn_id": turn,
            "step_id": step,
            "receipt_ids": [receipt_id],
            "derived_from": [],
        },
    }
    state.receipts.append(
        {
            "key": f"payments.charge:charge:{payment(n)}",
            "id": receipt_id,
            "status": "completed",
            "turn_id": turn,
            "step_id": step,
        }
    )
    del state.receipts[:-MAX_RECEIPTS]
    result: dict[str, Any] = {
        "thread_id": thread,
        "turn_id": turn,
        "replayed": False,
        "reply": reply,
        "interaction": None,
        "steps": [
            {
                "step_id": f"{n}#1",
                "capability_id": "account.balance",
                "status": "completed",
                "value": {"due": 4200},
                "error": None,
                "receipt_ids": [],
                **STEP_TAIL,
            },
            {
                "step_id": step,
                "capability_id": "payments.charge",
                "status": "completed",
                "value": value,
                "error": None,
                "receipt_ids": [receipt_id],
                **STEP_TAIL,
            },
        ],
        "facts": [fact],
        "checkpoint_version": state.version,
    }
    core = {
        "schema_revision": 1,
        "agent_fingerprint": FINGERPRINT,
        "version": state.version,
        "agenda": [],
        "interaction": None,
        "receipts": state.receipts,
    }
    events = [
        (
            "effect.completed",
            {
                "key": state.receipts[-1]["key"],
                "receipt_id": receipt_id,
                "capability_id": "payments.charge",
                "step_id": step,
                "attempt": 1,
                "status": "completed",
            },
        ),
        ("fact.recorded", {"key": fact["key"], "version": 1, "step_id": step}),
        (
            "turn.committed",
            {
                "version": state.version,
                "steps": [
                    {k: step[k] for k in ("step_id", "capability_id", "status")}
                    for step in result["steps"]
                ],
            },
        ),
    ]
    entry = state.receipts[-1]
    bare = {k: v for k, v in core.items() if k != "receipts"}
    return {
        "result": json.dumps(result, separators=(",", ":")),
        # The turn row's list of the receipts its effect.completed events announced.
        "announced": json.dumps([entry["key"]], separators=(",", ":")),
        "core": json.dumps(core, separators=(",", ":")),
        # SQLite's rows: the core without its receipt index, and the index's new entry.
        "bare_core": json.dumps(bare, separators=(",", ":")),
        "index_entry": (entry["key"], json.dumps(entry, separators=(",", ":"))),
        "messages": [
            json.dumps({"role": r, "content": c, "turn_id": turn}, separators=(",", ":"))
            for r, c in (("user", message(n)), ("assistant", reply))
        ],
        "fact": (fact["key"], json.dumps(fact, separators=(",", ":"))),
        "events": [
            ("evt_" + uuid.uuid4().hex, t, json.dumps(p, separators=(",", ":"))) for t, p in events
        ],
    }


def _input(n: int) -> str:
    """The input a receipt records: the charge capability's, as JSON."""
    return json.dumps({"payment_id": payment(n), "amount": 100}, separators=(",", ":"))


def _digest(n: int) -> str:
    return f"{zlib.crc32(message(n).encode()):08x}" * 8


class SQLiteFloor:
    name_prefix = "floor-sqlite"

    def __init__(self, path: str, synchronous: str) -> None:
        self.path, self.synchronous = path, synchronous
        self.provider = FakeProvider()
        self.threads: dict[str, _Thread] = {}

    async def setup(self) -> None:
        conn = self.conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.executescript(SQLITE_SCHEMA)
        self.lockfd = os.open(self.path + ".locks", os.O_RDWR | os.O_CREAT, 0o644)

    async def close(self) -> None:
        self.conn.close()
        os.close(self.lockfd)

    def _lock(self, thread: str, op: int) -> None:
        fcntl.lockf(self.lockfd, op, 1, zlib.crc32(thread.encode()))

    async def turn(self, thread: str, n: int) -> None:
        conn, turn = self.conn, str(n)
        self._lock(thread, fcntl.LOCK_EX)
        try:
            prior = conn.execute(
                "SELECT t.request_digest, t.result, th.tenant_id FROM turns t LEFT JOIN threads"
                " th ON th.thread_id = t.thread_id WHERE t.thread_id = ? AND t.turn_id = ?",
                (thread, turn),
            ).fetchone()
            assert prior is None
            state = self.threads.setdefault(thread, _Thread())
            conn.execute(
                "SELECT version, tenant_id, CASE WHEN version IS ? THEN NULL ELSE checkpoint END"
                " FROM threads WHERE thread_id = ?",
                (state.version, thread),
            ).fetchone()
            key, rid = f"payments.charge:charge:{payment(n)}", "rcpt_" + uuid.uuid4().hex
            now = datetime.now(UTC).isoformat()
            inserted = conn.execute(
                "INSERT INTO receipts (thread_id, key, id, status, turn_id, step_id, attempt,"
                " created_at, updated_at, announced, capability_id, input)"
                " VALUES (?, ?, ?, 'prepared', ?, ?, 1, ?, ?, 0, 'payments.charge', ?)"
                " ON CONFLICT (thread_id, key) DO NOTHING",
                (thread, key, rid, turn, f"{n}#2", now, now, _input(n)),
            )
            assert inserted.rowcount == 1
            value = self.provider.charge(payment(n), 100, key)
            conn.execute(
                "UPDATE receipts SET status = 'completed', value = ?, updated_at = ?"
                " WHERE thread_id = ? AND key = ? AND status = 'prepared' AND attempt = 1",
                (json.dumps(value, separators=(",", ":")), now, thread, key),
            )
            state.version += 1
            docs = _turn_documents(thread, n, state, value, rid, now)
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?)",
                (thread, turn, _digest(n), state.version, docs["result"], now, docs["announced"]),
            )
            next_seq, message_seq, receipt_seq = conn.execute(
                "INSERT INTO threads VALUES (?, NULL, ?, 1, ?, ?, ?, ?, ?, 1)"
                " ON CONFLICT (thread_id) DO UPDATE SET version = excluded.version,"
                " schema_revision = 1, fingerprint = excluded.fingerprint,"
                " checkpoint = excluded.checkpoint, next_seq = next_seq + ?,"
                " message_seq = message_seq + 2, updated_at = excluded.updated_at,"
                " receipt_seq = receipt_seq + 1 RETURNING next_seq, message_seq, receipt_seq",
                (thread, state.version, FINGERPRINT, docs["bare_core"], 4, 2, now, 3),
            ).fetchone()
            conn.execute(
                "INSERT INTO receipt_index VALUES (?, ?, ?, ?)",
                (thread, receipt_seq, *docs["index_entry"]),
            )
            if receipt_seq > MAX_RECEIPTS:
                conn.execute(
                    "DELETE FROM receipt_index WHERE thread_id = ? AND seq = ?",
                    (thread, receipt_seq - MAX_RECEIPTS),
                )
            conn.executemany(
                "INSERT INTO messages VALUES (?, ?, ?)",
                [(thread, message_seq - 1 + i, body) for i, body in enumerate(docs["messages"])],
            )
            if message_seq > MAX_MESSAGES:
                conn.execute(
                    "DELETE FROM messages WHERE thread_id = ? AND seq <= ?",
                    (thread, message_seq - MAX_MESSAGES),
                )
            conn.execute(
                "INSERT INTO facts VALUES (?, ?, ?) ON CONFLICT (thread_id, key)"
                " DO UPDATE SET body = excluded.body",
                (thread, *docs["fact"]),
            )
            conn.executemany(
                "INSERT INTO outbox (id, thread_id, turn_id, seq, type, payload, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (e[0], thread, turn, next_seq - 3 + i, e[1], e[2], now)
                    for i, e in enumerate(docs["events"])
                ],
            )
            conn.execute("COMMIT")
        finally:
            self._lock(thread, fcntl.LOCK_UN)

    async def replay(self, thread: str, n: int) -> None:
        self._lock(thread, fcntl.LOCK_EX)
        try:
            row = self.conn.execute(
                "SELECT t.request_digest, t.result, th.tenant_id FROM turns t LEFT JOIN threads"
                " th ON th.thread_id = t.thread_id WHERE t.thread_id = ? AND t.turn_id = ?",
                (thread, str(n)),
            ).fetchone()
            assert row is not None and row[0] == _digest(n)
            json.loads(row[1])
        finally:
            self._lock(thread, fcntl.LOCK_UN)


PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS threads (thread_id text PRIMARY KEY, tenant_id text,
    version bigint NOT NULL, schema_revision integer, fingerprint text, checkpoint text,
    next_seq bigint NOT NULL, message_seq bigint NOT NULL, updated_at timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS turns (thread_id text NOT NULL, turn_id text NOT NULL,
    request_digest text, version bigint NOT NULL, result text NOT NULL,
    created_at timestamptz NOT NULL, announced text[], PRIMARY KEY (thread_id, turn_id));
CREATE TABLE IF NOT EXISTS receipts (thread_id text NOT NULL, key text NOT NULL,
    id text NOT NULL UNIQUE, status text NOT NULL, turn_id text NOT NULL,
    step_id text NOT NULL, attempt integer NOT NULL, value text, error text,
    created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL,
    announced boolean NOT NULL, tenant_id text, actor text, capability_id text,
    input text, approved_by text, PRIMARY KEY (thread_id, key));
CREATE INDEX IF NOT EXISTS receipts_unsettled ON receipts (status)
    WHERE status IN ('prepared', 'uncertain');
CREATE TABLE IF NOT EXISTS messages (thread_id text NOT NULL, seq bigint NOT NULL,
    body text NOT NULL, PRIMARY KEY (thread_id, seq));
CREATE TABLE IF NOT EXISTS facts (thread_id text NOT NULL, key text NOT NULL,
    body text NOT NULL, ordinal bigint GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (thread_id, key));
CREATE TABLE IF NOT EXISTS outbox (ord bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    position bigint UNIQUE, id text NOT NULL UNIQUE, thread_id text NOT NULL, turn_id text,
    seq bigint NOT NULL, type text NOT NULL, payload text, created_at timestamptz NOT NULL,
    published_at timestamptz, attempts integer NOT NULL DEFAULT 0, UNIQUE (thread_id, seq));
CREATE INDEX IF NOT EXISTS outbox_unpublished ON outbox (thread_id, seq)
    WHERE published_at IS NULL;
"""

# The commit as one statement, like the adapter's (one round trip, one transaction).
PG_COMMIT = """
WITH thread AS (
    INSERT INTO threads
    VALUES (%(thread)s, NULL, %(version)s, 1, %(fingerprint)s, %(core)s, 4, 2, %(now)s)
    ON CONFLICT (thread_id) DO UPDATE SET version = excluded.version,
        schema_revision = 1, fingerprint = excluded.fingerprint,
        checkpoint = excluded.checkpoint, next_seq = threads.next_seq + 3,
        message_seq = threads.message_seq + 2, updated_at = excluded.updated_at
    WHERE threads.version = %(version)s - 1
    RETURNING next_seq, message_seq
), turn AS (
    INSERT INTO turns SELECT %(thread)s, %(turn)s, %(digest)s, %(version)s, %(result)s, %(now)s,
        %(announced)s FROM thread
), events AS (
    INSERT INTO outbox (id, thread_id, turn_id, seq, type, payload, created_at)
    SELECT e.id, %(thread)s, %(turn)s, thread.next_seq - 4 + e.n, e.type, e.payload, %(now)s
    FROM thread, unnest(%(ids)b::text[], %(types)b::text[], %(payloads)b::text[])
         WITH ORDINALITY AS e(id, type, payload, n)
), old_messages AS (
    DELETE FROM messages m USING thread
    WHERE m.thread_id = %(thread)s AND m.seq <= thread.message_seq - %(keep)s
), new_messages AS (
    INSERT INTO messages SELECT %(thread)s, thread.message_seq - 2 + m.n, m.body
    FROM thread, unnest(%(messages)b::text[]) WITH ORDINALITY AS m(body, n)
), new_fact AS (
    INSERT INTO facts (thread_id, key, body) SELECT %(thread)s, %(fact_key)s, %(fact)s
    FROM thread ON CONFLICT (thread_id, key) DO UPDATE SET body = excluded.body
)
SELECT next_seq FROM thread
"""


class PostgresFloor:
    """Hand-written with psycopg's synchronous driver, or its asyncio one (``aio``):
    the same statements either way, driven from ``_turn`` and ``_replay``."""

    def __init__(self, dsn: str, schema: str, aio: bool = False) -> None:
        self.dsn, self.schema, self.aio = dsn, schema, aio
        self.provider = FakeProvider()
        self.threads: dict[str, _Thread] = {}

    async def setup(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as admin:
            admin.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            admin.execute(f'SET search_path = "{self.schema}"')
            admin.execute(PG_SCHEMA)
        options = f"-c search_path={self.schema}"
        if self.aio:
            self.conn: Any = await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, options=options
            )
        else:
            self.conn = psycopg.connect(self.dsn, autocommit=True, options=options)

    async def close(self) -> None:
        if self.aio:
            await self.conn.close()
        else:
            self.conn.close()

    async def turn(self, thread: str, n: int) -> None:
        await self._drive(self._turn(thread, n))

    async def replay(self, thread: str, n: int) -> None:
        await self._drive(self._replay(thread, n))

    async def _drive(self, steps: Any) -> None:
        """Run the statements ``steps`` yields, sending back (rowcount, first row)."""
        answer = None
        try:
            while True:
                query, params = steps.send(answer)
                if self.aio:
                    cur = await self.conn.execute(query, params)
                    row = await cur.fetchone() if cur.description else None
                else:
                    cur = self.conn.execute(query, params)
                    row = cur.fetchone() if cur.description else None
                answer = (cur.rowcount, row)
        except StopIteration:
            pass

    def _key(self, thread: str) -> int:
        return zlib.crc32(f"{self.schema}:{thread}".encode())

    def _turn(self, thread: str, n: int) -> Any:
        turn, lock = str(n), self._key(thread)
        _, got = yield "SELECT pg_try_advisory_lock(%s)", (lock,)
        assert got == (True,)
        state = self.threads.setdefault(thread, _Thread())
        _, row = yield (
            "SELECT t.request_digest, t.result, th.version, th.tenant_id, CASE WHEN"
            " t.turn_id IS NULL AND th.version IS DISTINCT FROM %(v)s THEN th.checkpoint END"
            " FROM (SELECT 1) AS one LEFT JOIN threads th ON th.thread_id = %(t)s"
            " LEFT JOIN turns t ON t.thread_id = %(t)s AND t.turn_id = %(n)s",
            {"t": thread, "n": turn, "v": state.version},
        )
        assert row is not None and row[1] is None
        key, rid = f"payments.charge:charge:{payment(n)}", "rcpt_" + uuid.uuid4().hex
        now = datetime.now(UTC)
        inserted, _ = yield (
            "INSERT INTO receipts (thread_id, key, id, status, turn_id, step_id, attempt,"
            " created_at, updated_at, announced, capability_id, input)"
            " VALUES (%s, %s, %s, 'prepared', %s, %s, 1, %s, %s, false, 'payments.charge', %s)"
            " ON CONFLICT (thread_id, key) DO NOTHING",
            (thread, key, rid, turn, f"{n}#2", now, now, _input(n)),
        )
        assert inserted == 1
        value = self.provider.charge(payment(n), 100, key)
        yield (
            "UPDATE receipts SET status = 'completed', value = %s, updated_at = %s"
            " WHERE thread_id = %s AND key = %s AND status = 'prepared' AND attempt = 1",
            (json.dumps(value, separators=(",", ":")), now, thread, key),
        )
        state.version += 1
        docs = _turn_documents(thread, n, state, value, rid, now.isoformat())
        events = docs["events"]
        _, committed = yield (
            PG_COMMIT,
            {
                "thread": thread,
                "turn": turn,
                "version": state.version,
                "core": docs["core"],
                "fingerprint": FINGERPRINT,
                "now": now,
                "digest": _digest(n),
                "result": docs["result"],
                "announced": [key],
                "ids": [e[0] for e in events],
                "types": [e[1] for e in events],
                "payloads": [e[2] for e in events],
                "keep": MAX_MESSAGES,
                "messages": docs["messages"],
                "fact_key": docs["fact"][0],
                "fact": docs["fact"][1],
            },
        )
        assert committed is not None
        yield "SELECT pg_advisory_unlock(%s)", (lock,)

    def _replay(self, thread: str, n: int) -> Any:
        lock = self._key(thread)
        _, got = yield "SELECT pg_try_advisory_lock(%s)", (lock,)
        assert got == (True,)
        _, row = yield (
            "SELECT request_digest, result FROM turns WHERE thread_id = %s AND turn_id = %s",
            (thread, str(n)),
        )
        assert row is not None and row[0] == _digest(n)
        json.loads(row[1])
        yield "SELECT pg_advisory_unlock(%s)", (lock,)
