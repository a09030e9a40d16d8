"""KernelSaver's rows in SQLite and PostgreSQL.

They live in the tables of the stores' migrations: SQLite 12, PostgreSQL 14.

In SQLite, each put is one write transaction of the adapter.
It runs on the worker thread or inline, as the adapter's own writes do.
So SQLite's write lock serializes the puts of every process on the file.

In PostgreSQL, each put is one transaction.
It holds a transaction-level advisory lock on its thread and namespace.
So one writer at a time reads and moves the head.
That holds through a transaction pooler too.

Reads take one snapshot, a read transaction, for a checkpoint and its writes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from intention_kernel.integrations.langgraph._rows import (
    StoredCheckpoint,
    StoredWrite,
    moves_head,
)

if TYPE_CHECKING:
    from intention_kernel.durability.postgres._recorder import PostgresRecorder
    from intention_kernel.durability.postgres._sessions import Connection
    from intention_kernel.durability.sqlite._recorder import SQLiteRecorder

__all__ = ["PostgresRows", "SQLiteRows"]

_COLUMNS = (
    "thread_id, checkpoint_ns, checkpoint_id, parent_id, type, checkpoint, metadata_type, "
    "metadata, run_id"
)
#: The same columns, with the thread ID a placeholder, to copy to another thread.
_COPIED = (
    "?, checkpoint_ns, checkpoint_id, parent_id, type, checkpoint, metadata_type, metadata, run_id"
)
_WRITES_COPIED = "?, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, value, task_path"
_WRITE_COLUMNS = "task_id, idx, channel, type, value, task_path"

# -- SQLite ------------------------------------------------------------------------------------

_SQLITE_HEAD = "SELECT checkpoint_id FROM ik_lg_heads WHERE thread_id = ? AND checkpoint_ns = ?"
_SQLITE_PARENT = (
    "SELECT parent_id FROM ik_lg_checkpoints "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
_SQLITE_INSERT = (
    f"INSERT OR REPLACE INTO ik_lg_checkpoints ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SQLITE_MOVE = "INSERT OR REPLACE INTO ik_lg_heads VALUES (?, ?, ?)"
_SQLITE_WRITE = (
    "INSERT OR {verb} INTO ik_lg_writes (thread_id, checkpoint_ns, checkpoint_id, "
    f"{_WRITE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SQLITE_GET = f"SELECT {_COLUMNS} FROM ik_lg_checkpoints WHERE thread_id = ? AND checkpoint_ns = ?"
_SQLITE_WRITES = (
    f"SELECT {_WRITE_COLUMNS} FROM ik_lg_writes "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? "
    "ORDER BY task_path, task_id, idx"
)


def _checkpoint(row: Sequence[Any]) -> StoredCheckpoint:
    return StoredCheckpoint(
        row[0], row[1], row[2], row[3], row[4], bytes(row[5]), row[6], bytes(row[7]), row[8]
    )


def _write(row: Sequence[Any]) -> StoredWrite:
    return StoredWrite(row[0], int(row[1]), row[2], row[3], bytes(row[4]), row[5])


def _row_params(row: StoredCheckpoint) -> tuple[Any, ...]:
    return (
        row.thread_id,
        row.checkpoint_ns,
        row.checkpoint_id,
        row.parent_id,
        row.type,
        row.checkpoint,
        row.metadata_type,
        row.metadata,
        row.run_id,
    )


def _search_where(
    thread_id: str | None,
    checkpoint_ns: str | None,
    checkpoint_id: str | None,
    before: str | None,
    mark: str,
) -> tuple[str, list[Any]]:
    """The WHERE clause of a search and its parameters (``mark``: the placeholder)."""
    clauses, params = [], []
    for column, value, op in (
        ("thread_id", thread_id, "="),
        ("checkpoint_ns", checkpoint_ns, "="),
        ("checkpoint_id", checkpoint_id, "="),
        ("checkpoint_id", before, "<"),
    ):
        if value is not None:
            clauses.append(f"{column} {op} {mark}")
            params.append(value)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class SQLiteRows:
    """The rows in an SQLite store, through its adapter's connections."""

    def __init__(self, recorder: SQLiteRecorder) -> None:
        self._db = recorder

    async def put(self, row: StoredCheckpoint, *, fork: bool) -> None:
        def body(conn: sqlite3.Connection) -> None:
            place = (row.thread_id, row.checkpoint_ns)
            found = conn.execute(_SQLITE_HEAD, place).fetchone()
            same = conn.execute(_SQLITE_PARENT, (*place, row.checkpoint_id)).fetchone()
            parent = (
                conn.execute(_SQLITE_PARENT, (*place, row.parent_id)).fetchone()
                if row.parent_id is not None
                else None
            )
            head = moves_head(
                None if found is None else found[0],
                row,
                stored_parent=False if same is None else same[0],
                parent_exists=parent is not None,
                fork=fork,
            )
            conn.execute(_SQLITE_INSERT, _row_params(row))
            if head:
                conn.execute(_SQLITE_MOVE, (*place, row.checkpoint_id))

        await self._db._write(body, (), row.thread_id, atomic=True)

    async def put_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[StoredWrite],
        *,
        replace: bool,
    ) -> None:
        statement = _SQLITE_WRITE.format(verb="REPLACE" if replace else "IGNORE")
        params = [
            (thread_id, checkpoint_ns, checkpoint_id, *_write_params(write)) for write in writes
        ]

        def body(conn: sqlite3.Connection) -> None:
            conn.executemany(statement, params)

        await self._db._write(body, (), thread_id, atomic=True)

    async def get(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> tuple[StoredCheckpoint, list[StoredWrite]] | None:
        def read(conn: sqlite3.Connection) -> tuple[StoredCheckpoint, list[StoredWrite]] | None:
            conn.execute("BEGIN")  # one snapshot for the head, the row and its writes
            wanted = checkpoint_id
            if wanted is None:
                head = conn.execute(_SQLITE_HEAD, (thread_id, checkpoint_ns)).fetchone()
                if head is None:
                    return None
                wanted = head[0]
            found = conn.execute(
                _SQLITE_GET + " AND checkpoint_id = ?", (thread_id, checkpoint_ns, wanted)
            ).fetchone()
            if found is None:
                return None
            row = _checkpoint(found)
            return row, _sqlite_writes(conn, row)

        return await self._db._read(read, thread_id)

    async def search(
        self,
        thread_id: str | None,
        checkpoint_ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        limit: int | None = None,
    ) -> list[tuple[StoredCheckpoint, list[StoredWrite]]]:
        where, params = _search_where(thread_id, checkpoint_ns, checkpoint_id, before, "?")
        query = f"SELECT {_COLUMNS} FROM ik_lg_checkpoints{where} ORDER BY checkpoint_id DESC"
        if limit is not None:
            query += " LIMIT ?"
            params.append(limit)

        def read(conn: sqlite3.Connection) -> list[tuple[StoredCheckpoint, list[StoredWrite]]]:
            conn.execute("BEGIN")
            rows = [_checkpoint(found) for found in conn.execute(query, params).fetchall()]
            return [(row, _sqlite_writes(conn, row)) for row in rows]

        return await self._db._read(read, thread_id)

    async def delete_thread(self, thread_id: str) -> None:
        await self.prune([thread_id], keep_latest=False)

    async def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        def body(conn: sqlite3.Connection) -> None:
            for run_id in run_ids:
                places = _Maintenance.places(conn.execute(_RUN_PLACES, (run_id,)).fetchall())
                for place in places:
                    for statement, params in _Maintenance.run_steps(place, run_id):
                        conn.execute(statement, params)

        await self._db._write(body, (), None, atomic=True)

    async def copy_thread(self, source: str, target: str) -> None:
        def body(conn: sqlite3.Connection) -> None:
            for statement in _COPY:
                conn.execute(statement, (target, source))

        await self._db._write(body, (), target, atomic=True)

    async def prune(self, thread_ids: Sequence[str], *, keep_latest: bool) -> None:
        def body(conn: sqlite3.Connection) -> None:
            for thread_id in thread_ids:
                if not keep_latest:
                    for statement in _DELETE_THREAD:
                        conn.execute(statement, (thread_id,))
                    continue
                heads = conn.execute(_HEADS, (thread_id,)).fetchall()
                for statement, params in _Maintenance.keep_latest(thread_id, heads):
                    conn.execute(statement, params)

        await self._db._write(body, (), None, atomic=True)


# -- maintenance, the same statements on both stores (PostgreSQL's with %s) -----------------

_RUN_PLACES = "SELECT DISTINCT thread_id, checkpoint_ns FROM ik_lg_checkpoints WHERE run_id = ?"
_RUN_WRITES = (
    "DELETE FROM ik_lg_writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id IN "
    "(SELECT checkpoint_id FROM ik_lg_checkpoints "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND run_id = ?)"
)
_RUN_CHECKPOINTS = (
    "DELETE FROM ik_lg_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND run_id = ?"
)
# A head whose checkpoint is gone moves to the newest remaining one, if any.
_LOST_HEAD = (
    "DELETE FROM ik_lg_heads WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id "
    "NOT IN (SELECT checkpoint_id FROM ik_lg_checkpoints "
    "WHERE thread_id = ? AND checkpoint_ns = ?)"
)
_NEWEST_HEAD = (
    "INSERT INTO ik_lg_heads SELECT thread_id, checkpoint_ns, MAX(checkpoint_id) "
    "FROM ik_lg_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
    "GROUP BY thread_id, checkpoint_ns ON CONFLICT DO NOTHING"
)
_COPY = (
    f"INSERT INTO ik_lg_checkpoints ({_COLUMNS}) SELECT {_COPIED} FROM ik_lg_checkpoints "
    "WHERE thread_id = ? ON CONFLICT DO NOTHING",
    f"INSERT INTO ik_lg_writes (thread_id, checkpoint_ns, checkpoint_id, {_WRITE_COLUMNS}) "
    f"SELECT {_WRITES_COPIED} FROM ik_lg_writes WHERE thread_id = ? ON CONFLICT DO NOTHING",
    "INSERT INTO ik_lg_heads SELECT ?, checkpoint_ns, checkpoint_id FROM ik_lg_heads "
    "WHERE thread_id = ? ON CONFLICT (thread_id, checkpoint_ns) "
    "DO UPDATE SET checkpoint_id = EXCLUDED.checkpoint_id",
)
_DELETE_THREAD = tuple(
    f"DELETE FROM {table} WHERE thread_id = ?"
    for table in ("ik_lg_checkpoints", "ik_lg_writes", "ik_lg_heads")
)
_HEADS = "SELECT checkpoint_ns, checkpoint_id FROM ik_lg_heads WHERE thread_id = ?"
_ALL_BUT_HEAD = tuple(
    f"DELETE FROM {table} WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id <> ?"
    for table in ("ik_lg_checkpoints", "ik_lg_writes")
)
_HEADLESS = tuple(
    f"DELETE FROM {table} WHERE thread_id = ? AND checkpoint_ns NOT IN "
    "(SELECT checkpoint_ns FROM ik_lg_heads WHERE thread_id = ?)"
    for table in ("ik_lg_checkpoints", "ik_lg_writes")
)


class _Maintenance:
    """``delete_for_runs``, ``copy_thread`` and ``prune`` as statement lists.

    Each store runs a list in one transaction.
    ``execute(statement, params)`` returns the rows.
    """

    @staticmethod
    def places(rows: Sequence[Sequence[Any]]) -> list[tuple[str, str]]:
        return sorted({(str(r[0]), str(r[1])) for r in rows})

    @staticmethod
    def run_steps(place: tuple[str, str], run_id: str) -> list[tuple[str, tuple[Any, ...]]]:
        return [
            (_RUN_WRITES, (*place, *place, run_id)),
            (_RUN_CHECKPOINTS, (*place, run_id)),
            (_LOST_HEAD, (*place, *place)),
            (_NEWEST_HEAD, place),
        ]

    @staticmethod
    def keep_latest(
        thread_id: str, heads: Sequence[Sequence[Any]]
    ) -> list[tuple[str, tuple[Any, ...]]]:
        steps: list[tuple[str, tuple[Any, ...]]] = [
            (statement, (thread_id, thread_id)) for statement in _HEADLESS
        ]
        for ns, head in heads:
            steps += [(statement, (thread_id, ns, head)) for statement in _ALL_BUT_HEAD]
        return steps


def _write_params(write: StoredWrite) -> tuple[Any, ...]:
    return (write.task_id, write.idx, write.channel, write.type, write.value, write.task_path)


def _sqlite_writes(conn: sqlite3.Connection, row: StoredCheckpoint) -> list[StoredWrite]:
    found = conn.execute(_SQLITE_WRITES, (row.thread_id, row.checkpoint_ns, row.checkpoint_id))
    return [_write(w) for w in found.fetchall()]


# -- PostgreSQL --------------------------------------------------------------------------------

_PG_HEAD = "SELECT checkpoint_id FROM ik_lg_heads WHERE thread_id = %s AND checkpoint_ns = %s"
_PG_PARENT = (
    "SELECT parent_id FROM ik_lg_checkpoints "
    "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
)
_PG_INSERT = (
    f"INSERT INTO ik_lg_checkpoints ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET "
    "type = EXCLUDED.type, checkpoint = EXCLUDED.checkpoint, "
    "metadata_type = EXCLUDED.metadata_type, metadata = EXCLUDED.metadata, run_id = EXCLUDED.run_id"
)
_PG_MOVE = (
    "INSERT INTO ik_lg_heads VALUES (%s, %s, %s) ON CONFLICT (thread_id, checkpoint_ns) "
    "DO UPDATE SET checkpoint_id = EXCLUDED.checkpoint_id"
)
_PG_WRITE = (
    "INSERT INTO ik_lg_writes (thread_id, checkpoint_ns, checkpoint_id, "
    f"{_WRITE_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO "
)
_PG_GET = (
    f"SELECT {_COLUMNS} FROM ik_lg_checkpoints "
    "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
)
_PG_WRITES = (
    f"SELECT {_WRITE_COLUMNS} FROM ik_lg_writes "
    "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s "
    "ORDER BY task_path, task_id, idx"
)


class PostgresRows:
    """The rows in a PostgreSQL store's schema, on its adapter's pooled sessions."""

    def __init__(self, recorder: PostgresRecorder) -> None:
        self._db = recorder

    async def put(self, row: StoredCheckpoint, *, fork: bool) -> None:
        from intention_kernel.durability.postgres._sessions import advisory_key
        from intention_kernel.durability.postgres._statements import LOCK_XACT

        q = self._db._q
        place = (row.thread_id, row.checkpoint_ns)

        async def hop(conn: Connection) -> None:
            async with conn.transaction():
                # One writer per thread and namespace reads and moves the head.
                await conn.execute(LOCK_XACT, (advisory_key("langgraph", *place),))
                found = await (await conn.execute(q(_PG_HEAD), place)).fetchone()
                same = await (
                    await conn.execute(q(_PG_PARENT), (*place, row.checkpoint_id))
                ).fetchone()
                parent = None
                if row.parent_id is not None:
                    parent = await (
                        await conn.execute(q(_PG_PARENT), (*place, row.parent_id))
                    ).fetchone()
                head = moves_head(
                    None if found is None else found[0],
                    row,
                    stored_parent=False if same is None else same[0],
                    parent_exists=parent is not None,
                    fork=fork,
                )
                await conn.execute(q(_PG_INSERT), _row_params(row))
                if head:
                    await conn.execute(q(_PG_MOVE), (*place, row.checkpoint_id))

        await self._db._run(hop)

    async def put_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[StoredWrite],
        *,
        replace: bool,
    ) -> None:
        statement = self._db._q(
            _PG_WRITE
            + (
                "UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, "
                "value = EXCLUDED.value, task_path = EXCLUDED.task_path"
                if replace
                else "NOTHING"
            )
        )
        params = [
            (thread_id, checkpoint_ns, checkpoint_id, *_write_params(write)) for write in writes
        ]

        async def hop(conn: Connection) -> None:
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(statement, params)

        await self._db._run(hop)

    async def get(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> tuple[StoredCheckpoint, list[StoredWrite]] | None:
        q = self._db._q

        async def hop(conn: Connection) -> tuple[StoredCheckpoint, list[StoredWrite]] | None:
            async with conn.transaction():
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                wanted = checkpoint_id
                if wanted is None:
                    head = await (
                        await conn.execute(q(_PG_HEAD), (thread_id, checkpoint_ns))
                    ).fetchone()
                    if head is None:
                        return None
                    wanted = head[0]
                found = await (
                    await conn.execute(q(_PG_GET), (thread_id, checkpoint_ns, wanted))
                ).fetchone()
                if found is None:
                    return None
                row = _checkpoint(found)
                return row, await self._writes(conn, row)

        return await self._db._run(hop)

    async def _writes(self, conn: Connection, row: StoredCheckpoint) -> list[StoredWrite]:
        found = await conn.execute(
            self._db._q(_PG_WRITES), (row.thread_id, row.checkpoint_ns, row.checkpoint_id)
        )
        return [_write(w) for w in await found.fetchall()]

    async def search(
        self,
        thread_id: str | None,
        checkpoint_ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        limit: int | None = None,
    ) -> list[tuple[StoredCheckpoint, list[StoredWrite]]]:
        where, params = _search_where(thread_id, checkpoint_ns, checkpoint_id, before, "%s")
        if limit is not None:
            where += " ORDER BY checkpoint_id DESC LIMIT %s"
            params.append(limit)
        else:
            where += " ORDER BY checkpoint_id DESC"
        query = self._db._q(f"SELECT {_COLUMNS} FROM ik_lg_checkpoints{where}")

        async def hop(conn: Connection) -> list[tuple[StoredCheckpoint, list[StoredWrite]]]:
            async with conn.transaction():
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                found = await (await conn.execute(query, params)).fetchall()
                rows = [_checkpoint(r) for r in found]
                return [(row, await self._writes(conn, row)) for row in rows]

        return await self._db._run(hop)

    def _pg(self, statement: str) -> str:
        """A maintenance statement as PostgreSQL takes it: %s placeholders, qualified."""
        return self._db._q(statement.replace("?", "%s"))

    async def _lock(self, conn: Connection, places: list[tuple[str, str]]) -> None:
        """Lock each place as a put does, in order, so two maintainers never deadlock."""
        from intention_kernel.durability.postgres._sessions import advisory_key
        from intention_kernel.durability.postgres._statements import LOCK_XACT

        for place in sorted(places):
            await conn.execute(LOCK_XACT, (advisory_key("langgraph", *place),))

    async def delete_thread(self, thread_id: str) -> None:
        await self.prune([thread_id], keep_latest=False)

    async def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        async def hop(conn: Connection) -> None:
            async with conn.transaction():
                for run_id in run_ids:
                    found = await conn.execute(self._pg(_RUN_PLACES), (run_id,))
                    places = _Maintenance.places(await found.fetchall())
                    await self._lock(conn, places)
                    for place in places:
                        for statement, params in _Maintenance.run_steps(place, run_id):
                            await conn.execute(self._pg(statement), params)

        await self._db._run(hop)

    async def copy_thread(self, source: str, target: str) -> None:
        async def hop(conn: Connection) -> None:
            async with conn.transaction():
                for statement in _COPY:
                    await conn.execute(self._pg(statement), (target, source))

        await self._db._run(hop)

    async def prune(self, thread_ids: Sequence[str], *, keep_latest: bool) -> None:
        async def hop(conn: Connection) -> None:
            async with conn.transaction():
                for thread_id in thread_ids:
                    if not keep_latest:
                        for statement in _DELETE_THREAD:
                            await conn.execute(self._pg(statement), (thread_id,))
                        continue
                    found = await conn.execute(self._pg(_HEADS), (thread_id,))
                    heads = await found.fetchall()
                    await self._lock(conn, [(thread_id, str(ns)) for ns, _ in heads])
                    for statement, params in _Maintenance.keep_latest(thread_id, heads):
                        await conn.execute(self._pg(statement), params)

        await self._db._run(hop)
