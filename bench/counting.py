"""Counting commits and statements instead of assuming them.

SQLite: every connection opened in the process gets a trace callback (by wrapping
``sqlite3.connect``, which LangGraph, DBOS's SQLAlchemy engine and our adapter all
call). A *commit* is a transaction that wrote: an explicit ``BEGIN … COMMIT`` (or an
outermost ``SAVEPOINT … RELEASE``) with at least one write statement in it, or a
write statement run in autocommit mode. Read-only transactions write nothing to the
WAL and are not counted.

PostgreSQL: the server's next transaction ID before and after a block of turns,
while no other client is busy. Only a transaction that writes is given an ID, so
the difference is the number of writing transactions (commits or rollbacks); a
read-only transaction costs none.
"""

from __future__ import annotations

import cProfile
import inspect
import os
import sqlite3
from typing import Any

WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER", "WITH")


class SQLiteCounter:
    def __init__(self) -> None:
        self.statements = 0
        self.commits = 0

    def trace(self) -> Any:
        # tx: inside a transaction; outer: it was opened by a SAVEPOINT, so the
        # outermost RELEASE commits it.
        state = {"tx": False, "wrote": False, "savepoints": 0, "outer": False}

        def callback(statement: str) -> None:
            text = statement.lstrip().upper()
            if text.startswith("--"):
                return  # a statement run by a trigger, not by the client
            self.statements += 1
            if text.startswith("BEGIN"):
                state.update(tx=True, wrote=False, outer=False)
            elif text.startswith(("COMMIT", "END")):
                self.commits += bool(state["wrote"])
                state.update(tx=False, wrote=False, savepoints=0)
            elif text.startswith("ROLLBACK") and not text.startswith("ROLLBACK TO"):
                state.update(tx=False, wrote=False, savepoints=0)
            elif text.startswith("SAVEPOINT"):
                if not state["tx"]:
                    state.update(tx=True, wrote=False, savepoints=0, outer=True)
                state["savepoints"] += 1
            elif text.startswith("RELEASE"):
                state["savepoints"] -= 1
                if state["savepoints"] <= 0 and state["outer"]:
                    self.commits += bool(state["wrote"])
                    state.update(tx=False, wrote=False, savepoints=0, outer=False)
            elif text.startswith(WRITES) and not text.startswith("WITH RECURSIVE"):
                if state["tx"]:
                    state["wrote"] = True
                else:
                    self.commits += 1

        return callback


COUNTER = SQLiteCounter()


def install_sqlite_trace() -> SQLiteCounter:
    """Trace every SQLite connection this process opens from now on."""
    original = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = original(*args, **kwargs)
        conn.set_trace_callback(COUNTER.trace())
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]
    sqlite3.dbapi2.connect = connect  # type: ignore[assignment]
    return COUNTER


class PsycopgCounter:
    """Statements sent through psycopg (sync and asyncio cursors, ``executemany``
    counting each parameter set). Outside a pipeline, each is one round trip."""

    def __init__(self) -> None:
        self.statements = 0


PSYCOPG_COUNTER = PsycopgCounter()


def install_psycopg_trace() -> PsycopgCounter:
    """Count the statements of every psycopg cursor in this process from now on."""
    import psycopg

    def counted(method: Any, many: bool) -> Any:
        if inspect.iscoroutinefunction(method):

            async def run_async(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
                if many:
                    params = list(params)
                PSYCOPG_COUNTER.statements += len(params) if many else 1
                return await method(self, query, params, **kw)

            return run_async

        def run(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            if many:
                params = list(params)
            PSYCOPG_COUNTER.statements += len(params) if many else 1
            return method(self, query, params, **kw)

        return run

    for cls in (psycopg.Cursor, psycopg.AsyncCursor):
        cls.execute = counted(cls.execute, False)  # type: ignore[method-assign]
        cls.executemany = counted(cls.executemany, True)  # type: ignore[method-assign]
    return PSYCOPG_COUNTER


NEXT_XID = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"


class WALMeter:
    """WAL frames appended to a SQLite file's WAL while the block runs.

    It holds a read transaction open on a connection of its own meanwhile. Its
    snapshot has a frame in the WAL (it writes one first: ``PRAGMA user_version``).
    No checkpoint can then copy the frames after it into the database. So no writer
    starts the WAL over, and every frame written is appended. A reader of the database
    file alone would not stop that: its snapshot is taken when every frame was copied.
    The frames are counted in the ``-wal`` file, those of its current generation. Their
    salts are the file header's. The file's size would not do: a WAL that started over
    is written again from its start. The salts are checked again at the end.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.frames = 0
        self.bytes = 0

    def __enter__(self) -> WALMeter:
        self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self._page = self._conn.execute("PRAGMA page_size").fetchone()[0]
        # Its own write must not checkpoint (which would copy every frame, and leave
        # its snapshot in the database file alone).
        self._conn.execute("PRAGMA wal_autocheckpoint = 0")
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        self._conn.execute(f"PRAGMA user_version = {version + 1}")
        self._conn.execute("BEGIN")
        self._conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()
        self._salts, self._start = self._count()
        return self

    def __exit__(self, *exc: object) -> None:
        salts, end = self._count()
        self._conn.execute("COMMIT")
        self._conn.close()
        if salts != self._salts:
            raise RuntimeError("the WAL started over while it was measured: frames not counted")
        self.frames = end - self._start
        self.bytes = self.frames * (self._page + 24)

    def _count(self) -> tuple[bytes, int]:
        """The WAL's salts, and its frames of the current generation (by bisection: they
        come first, older generations' frames after them)."""
        frame = self._page + 24
        with open(self.path + "-wal", "rb") as f:
            salts = f.read(32)[16:24]
            low, high = 0, max(os.fstat(f.fileno()).st_size - 32, 0) // frame
            while low < high:
                middle = (low + high) // 2
                f.seek(32 + middle * frame)
                if f.read(24)[8:16] == salts:
                    low = middle + 1
                else:
                    high = middle
        return salts, low


def profiled_calls(profiler: cProfile.Profile) -> int:
    """The calls ``profiler`` saw, Python and built-in, counted from its raw entries.

    ``pstats`` keys its table by file, line and name, so functions that share them
    collide and all but one drop out. Every ``__init__`` dataclasses generates is
    ``<string>:2(__init__)``: 38 of a kernel turn's calls went missing that way."""
    return sum(entry.callcount for entry in profiler.getstats())


def sqlite_driver_seconds(profiler: cProfile.Profile) -> float:
    """The own time of the ``sqlite3`` module's methods (``execute``, ``fetchone``...),
    in the profiler's clock. They are C: their own time carries little of its cost."""
    return sum(
        entry.inlinetime
        for entry in profiler.getstats()
        if isinstance(entry.code, str) and "sqlite3." in entry.code
    )
