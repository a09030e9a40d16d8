"""PostgreSQL sessions: the pool, its retry of dead sessions, the cursor cache, the
schema-qualified statements, the portability probe, and the translation of driver
errors at the adapter's edge.

No session carries state from one transaction to the next: no advisory lock, no
``SET`` outside a transaction, no server-side prepared statement. A transaction pooler
(PgBouncer in transaction mode) may therefore hand each statement another server
connection. Statements name the schema's tables in full (``qualify``) instead of
relying on ``search_path``.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from intention_kernel.durability.postgres._schema import (
    CREATE_SCHEMA_TABLE,
    HAS_STORE,
    INSERT_SCHEMA_VERSION,
    MIGRATIONS,
    SELECT_SCHEMA_VERSION,
)
from intention_kernel.durability.postgres._statements import (
    ABSORB_CATALOG_CHANGES,
    HOLD_LEASE,
    LEASE_PROBE_ROW,
    LOCK_XACT,
    TRY_LEASE_UPDATE,
)
from intention_kernel.errors import KernelError, StoreError

__all__ = [
    "Connection",
    "PostgresSessions",
    "advisory_key",
    "execute",
    "fetch_value",
    "present",
    "qualify",
    "translated",
]

T = TypeVar("T")
Connection = psycopg.AsyncConnection[TupleRow]


def advisory_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for ``parts`` (IDs never contain NUL): the
    migration's transaction-level lock."""
    text = "\x00".join(("intention_kernel", *parts))
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


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

#: The adapter's tables and functions, as statements name them.
_NAMES = re.compile(
    r"\b(ik_(?:threads|turns|receipts|outbox_head|outbox|messages|facts|journal|leases|schema"
    r"|inbox|cancels|interrupts|streams|timers|start_turn_leased|lg_checkpoints|lg_writes"
    r"|lg_heads))\b"
)


def qualify(statement: str, schema: str) -> str:
    """``statement`` with every table and function of the adapter named in ``schema``
    (which holds no ``%``: psycopg would read it as a placeholder)."""
    quoted = '"' + schema.replace('"', '""') + '"'
    return _NAMES.sub(lambda m: f"{quoted}.{m.group(1)}", statement)


def translated() -> _Translated:
    return _TRANSLATED


#: A cursor per session and statement, reused: a cursor that runs the same statement
#: again keeps the dumpers and loaders it looked up for its parameters and columns,
#: which ``conn.execute`` (a new cursor every time) looks up again for every statement.
#: A borrower holds its session alone until it gives it back, so no cursor is shared.
_cursors: weakref.WeakKeyDictionary[Connection, dict[str, psycopg.AsyncCursor[TupleRow]]] = (
    weakref.WeakKeyDictionary()
)


async def execute(
    conn: Connection, query: str, params: Any = None
) -> psycopg.AsyncCursor[TupleRow]:
    cursors = _cursors.get(conn)
    if cursors is None:
        cursors = _cursors[conn] = {}
    cur = cursors.get(query)
    if cur is None:
        cur = cursors[query] = conn.cursor()
    return await cur.execute(query, params)


async def fetch_value(conn: Connection, query: str, *args: Any) -> Any:
    """The first column of the single row ``query`` returns; one ``dict`` argument is
    taken as named parameters."""
    params = args[0] if len(args) == 1 and isinstance(args[0], dict) else args or None
    return present(await (await execute(conn, query, params)).fetchone())[0]


def present(value: T | None) -> T:
    assert value is not None
    return value


class PostgresSessions:
    """The pool of sessions one adapter runs its statements on."""

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
        # No server-side prepared statements: a transaction pooler may run the next
        # execution on a server connection that never saw the PREPARE.
        self._connect_kwargs: dict[str, Any] = {"prepare_threshold": None}
        if connect_timeout is not None:
            self._connect_kwargs["connect_timeout"] = max(2, math.ceil(connect_timeout))
        self._opened: AsyncConnectionPool[Connection] | None = None
        self._qualified: dict[str, str] = {}

    @property
    def _pool(self) -> AsyncConnectionPool[Connection]:
        if self._opened is None:
            raise KernelError("the PostgreSQL adapter is closed")
        return self._opened

    # -- plumbing ------------------------------------------------------------------------------

    def _q(self, statement: str) -> str:
        """``statement`` as this adapter sends it: its names in the adapter's schema."""
        qualified = self._qualified.get(statement)
        if qualified is None:
            qualified = self._qualified[statement] = qualify(statement, self._schema)
        return qualified

    async def _run(self, hop: Callable[[Connection], Awaitable[T]], *, repeat: bool = True) -> T:
        """Run ``hop`` on a pooled session.

        Idle pooled sessions may have died (server restart, terminated backend). The
        pool discards each broken one; with ``repeat`` the hop is tried on the next,
        at most once per pooled session plus a fresh one, so ``hop`` must then be safe
        to repeat: a statement may have run before its session broke.

        Runs in the caller's task, not shielded from its cancellation: psycopg settles a
        statement interrupted in flight before the cancellation reaches us (it cancels
        it on the server and waits for its end, or closes the session). Each statement
        is atomic either way: an interrupted hop is a crash between two statements,
        which every hop already tolerates.
        """
        pool = self._pool
        with translated():
            for attempt in range(pool.max_size if repeat else 0, -1, -1):
                # getconn and putconn, not ``pool.connection()``: its ``with conn``
                # commits on the way out, a wasted call in autocommit mode, and the
                # two context managers cost a turn about a tenth of its Python calls
                # at four borrows a turn. putconn rolls back what a hop left open.
                conn = await pool.getconn()
                try:
                    return await hop(conn)
                except psycopg.OperationalError:
                    if not conn.broken or attempt == 0:
                        raise
                finally:
                    await pool.putconn(conn)
            raise AssertionError("unreachable")

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Connection]:
        """A pooled session, held for the block (see ``PostgresDurability.session``). Only
        taking it is translated: the block's own driver errors reach its code as they are."""
        pool = self._pool
        with translated():
            conn = await pool.getconn()
        try:
            yield conn
        finally:
            await pool.putconn(conn)  # the pool rolls back what the block left open

    async def open(self) -> None:
        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            self._dsn,
            min_size=self._pool_size[0],
            max_size=self._pool_size[1],
            kwargs={"autocommit": True, **self._connect_kwargs},
            timeout=self._pool_timeout,
            open=False,
            name=f"intention-kernel:{self._schema}",
        )
        with translated():
            try:
                await pool.open(wait=True, timeout=self._open_timeout)
                async with pool.connection() as conn:
                    await self._migrate(conn)
                await self._probe(pool)
            except BaseException as exc:
                await pool.close()
                if isinstance(exc, PoolTimeout):
                    raise StoreError(
                        f"cannot connect to PostgreSQL within {self._open_timeout}s: {exc}"
                    ) from exc
                raise
        self._opened = pool

    async def _probe(self, pool: AsyncConnectionPool[Connection]) -> None:
        """Refuse a server that does not give what a lease's fence needs.

        A fenced write locks its lease row FOR SHARE, and a takeover must wait for that
        lock (see FENCE). Here one transaction locks a probe row as a write would, and
        another tries to update it within 200 ms: it must be refused for the lock. A
        server that lets it through (a PostgreSQL look-alike whose row locks are
        stubs) would let a paused worker write after another took its thread.
        Both transactions roll back, and the probe row (kind 'probe', a thread of
        its own) is deleted.
        """
        # The taker is a session of its own, outside the pool: a pool of one session
        # must open too.
        taker = await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, **self._connect_kwargs
        )
        async with taker, pool.connection() as holder:
            version = int(await fetch_value(holder, "SHOW server_version_num"))
            if version < 120000:
                raise StoreError(
                    f"PostgreSQL {version // 10000} is too old for thread leases: "
                    "PostgreSQL 12 or newer is needed"
                )
            probe = {
                "thread_id": f"probe-{uuid.uuid4().hex}",
                "lease_kind": "probe",
                # Named like a lease's owner, so a row left by a killed opener is its own.
                "lease_owner": f"probe:{os.getpid()}",
                "lease_epoch": 1,
            }
            # A process killed during the probe leaves its row: it lapses in a minute.
            await holder.execute(self._q(LEASE_PROBE_ROW), probe)
            try:
                async with holder.transaction(force_rollback=True):
                    held = await fetch_value(holder, self._q(HOLD_LEASE), probe)
                    blocked = False
                    try:
                        async with taker.transaction(force_rollback=True):
                            await taker.execute("SET LOCAL lock_timeout = '200ms'")
                            await taker.execute(self._q(TRY_LEASE_UPDATE), probe)
                    except psycopg.errors.LockNotAvailable:
                        blocked = True
            finally:
                await holder.execute(
                    self._q("DELETE FROM ik_leases WHERE kind = 'probe' AND thread_id = %s"),
                    (probe["thread_id"],),
                )
            if held != 1 or not blocked:
                raise StoreError(
                    "this server does not make a row locked FOR SHARE hold off an update "
                    "of it, which thread leases rely on to fence a worker that lost its "
                    "lease; use PostgreSQL (or a service that runs PostgreSQL itself)"
                )

    async def exists(self) -> bool:
        """Asked on a session of its own, outside the pool: opening the pool is what
        creates the schema."""
        if self._opened is not None:
            return True
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._dsn,
                autocommit=True,
                prepare_threshold=None,
                connect_timeout=max(2, math.ceil(self._open_timeout)),
            )
        except psycopg.Error as exc:
            lines = "; ".join(line.strip() for line in str(exc).strip().splitlines())
            raise StoreError(f"cannot connect to PostgreSQL: {lines}") from exc
        with translated():
            async with conn:
                return bool(await fetch_value(conn, HAS_STORE, self._schema))

    async def _migrate(self, conn: Connection) -> None:
        """Apply pending migrations; safe when several workers start at once."""
        if await self._schema_version(conn) == len(MIGRATIONS):
            return  # the common case: no lock, no DDL, no CREATE privilege needed
        async with conn.transaction():
            # One migrator per schema at a time; the others wait here, then find the
            # new version and apply nothing. Without it two workers could both run
            # migration 1 (or race on CREATE SCHEMA, which is not concurrency-safe).
            # A transaction-level lock: it ends with the transaction, pooler or not.
            await conn.execute(LOCK_XACT, (advisory_key("migrate", self._schema),))
            # What the previous holder created, this session's caches must see now.
            await conn.execute(ABSORB_CATALOG_CHANGES)
            await conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._schema))
            )
            # The migrations name tables bare: for this transaction only, they live in
            # the schema (``SET LOCAL`` ends with the transaction).
            await conn.execute(
                "SELECT set_config('search_path', %s, true)",
                (sql.Identifier(self._schema).as_string(conn),),
            )
            await conn.execute(CREATE_SCHEMA_TABLE)
            for version in range(await self._schema_version(conn) + 1, len(MIGRATIONS) + 1):
                await conn.execute(MIGRATIONS[version - 1])
                await conn.execute(INSERT_SCHEMA_VERSION, (version,))

    async def _schema_version(self, conn: Connection) -> int:
        if not await fetch_value(conn, HAS_STORE, self._schema):
            return 0
        current = int(await fetch_value(conn, self._q(SELECT_SCHEMA_VERSION)))
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
