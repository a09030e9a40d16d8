"""PostgreSQL sessions: the pool, its retry of dead sessions, the cursor cache, and the
translation of driver errors at the adapter's edge."""

from __future__ import annotations

import asyncio
import hashlib
import math
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from intention_kernel.durability.postgres._schema import (
    CREATE_SCHEMA_TABLE,
    HAS_SCHEMA_TABLE,
    HAS_STORE,
    INSERT_SCHEMA_VERSION,
    MIGRATIONS,
    SELECT_SCHEMA_VERSION,
)
from intention_kernel.durability.postgres._statements import CONFIGURE_SESSION, LOCK_XACT
from intention_kernel.errors import KernelError, StoreError

__all__ = [
    "IDLE",
    "Claim",
    "Connection",
    "Held",
    "PostgresSessions",
    "advisory_key",
    "execute",
    "fetch_value",
    "present",
    "translated",
]

T = TypeVar("T")
Connection = psycopg.AsyncConnection[TupleRow]

IDLE = TransactionStatus.IDLE


def advisory_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for ``parts`` (IDs never contain NUL)."""
    text = "\x00".join(("intention_kernel", *parts))
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass
class Held:
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
class Claim:
    """A relay's claim of a thread and the session holding it (``None`` once released);
    ``mutex`` runs one statement at a time on it, and makes the release wait for one
    still running (the same reasons as :class:`Held`)."""

    conn: Connection | None
    mutex: asyncio.Lock = field(default_factory=asyncio.Lock)


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


def translated() -> _Translated:
    return _TRANSLATED


#: A cursor per session and statement, reused: a cursor that runs the same statement
#: again keeps the dumpers and loaders it looked up for its parameters and columns,
#: which ``conn.execute`` (a new cursor every time) looks up again for every statement.
#: A session runs one statement at a time (see ``Held``), so no cursor is shared.
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
    """The first column of the single row ``query`` returns."""
    return present(await (await execute(conn, query, args or None)).fetchone())[0]


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
        self._connect_kwargs: dict[str, Any] = (
            {}
            if connect_timeout is None
            else {"connect_timeout": max(2, math.ceil(connect_timeout))}
        )
        self._opened: AsyncConnectionPool[Connection] | None = None
        self._held: dict[str, Held] = {}
        self._claims: dict[str, Claim] = {}  # see claim_outbox
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
        with translated():
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

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Connection]:
        """A pooled session, configured as every other, held for the block (see
        ``PostgresDurability.session``). Only taking it is translated: the block's own
        driver errors reach its code as they are."""
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
            configure=self._configure,
            timeout=self._pool_timeout,
            open=False,
            name=f"intention-kernel:{self._schema}",
        )
        with translated():
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
            await conn.execute(LOCK_XACT, (advisory_key("migrate", self._schema),))
            await conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._schema))
            )
            await conn.execute(CREATE_SCHEMA_TABLE)
            for version in range(await self._schema_version(conn) + 1, len(MIGRATIONS) + 1):
                await conn.execute(MIGRATIONS[version - 1])
                await conn.execute(INSERT_SCHEMA_VERSION, (version,))

    async def _schema_version(self, conn: Connection) -> int:
        if not await fetch_value(conn, HAS_SCHEMA_TABLE):
            return 0
        current = int(await fetch_value(conn, SELECT_SCHEMA_VERSION))
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
