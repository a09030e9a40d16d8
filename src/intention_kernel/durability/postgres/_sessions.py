"""PostgreSQL sessions and what surrounds them.

- The pool, its retry of dead sessions, and the idle sessions kept at hand.
- The order in which waiting borrowers get a session.
- The cursor cache.
- The schema-qualified statements.
- The portability probe.
- The translation of driver errors at the adapter's edge.

No session carries state from one transaction to the next: no advisory lock, no
``SET`` outside a transaction, no server-side prepared statement. A transaction pooler
(PgBouncer in transaction mode) may therefore hand each statement another server
connection. Statements name the schema's tables in full (``qualify``) instead of
relying on ``search_path``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import heapq
import itertools
import math
import os
import re
import struct
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from time import monotonic
from typing import Any, TypeVar, cast

import psycopg
from psycopg import sql
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import PyFormat, RecursiveDumper
from psycopg.pq import Format, TransactionStatus
from psycopg.pq.abc import PGconn
from psycopg.rows import AsyncRowFactory, TupleRow, tuple_row
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
    "TextArray",
    "advisory_key",
    "execute",
    "fetch_value",
    "present",
    "qualify",
    "translated",
]

T = TypeVar("T")
_IDLE = int(TransactionStatus.IDLE)
#: Seconds a session borrowed from the pool may stay at hand (see ``_borrow``).
_KEEP_AT_HAND = 30.0
#: Seconds a turn's start may jump ahead of started turns' statements, at most.
_HEAD_START = 5.0


#: A borrower waiting in the queue: handed a session, or ``None`` to borrow one.
_Waiter = asyncio.Future["tuple[Connection, float] | None"]


class Connection(psycopg.AsyncConnection[TupleRow]):
    """A session of the adapter's: a psycopg connection, and the cursors it reuses.

    A cursor per statement, reused: one that runs the same statement again keeps the
    dumpers and loaders it looked up for its parameters and columns.
    ``conn.execute`` makes a new cursor every time, which looks them up again. A
    borrower holds its session alone until it gives it back, so no cursor is shared.
    """

    def __init__(self, pgconn: PGconn, row_factory: AsyncRowFactory[TupleRow] = tuple_row) -> None:
        super().__init__(pgconn, row_factory)
        self.statements: dict[str, psycopg.AsyncCursor[TupleRow]] = {}


def advisory_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for ``parts`` (IDs never contain NUL): the
    migration's transaction-level lock."""
    text = "\x00".join(("intention_kernel", *parts))
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _store_error(exc: BaseException) -> StoreError | None:
    """The ``StoreError`` a driver error becomes, by its class; None for other errors."""
    if isinstance(exc, PoolTimeout):
        return StoreError(
            f"no PostgreSQL session became available in time ({exc}); is the server up, "
            "and is max_pool_size large enough for the concurrent turns?"
        )
    if isinstance(exc, psycopg.Error):
        return StoreError(f"PostgreSQL error {exc.sqlstate or ''}: {type(exc).__name__}: {exc}")
    return None


class _Translated:
    """Driver errors become ``StoreError`` at the adapter's edge, by class. (A class, not
    a generator context manager: it wraps every statement of a turn.)"""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is not None and (error := _store_error(exc)) is not None:
            raise error from exc


_TRANSLATED = _Translated()

#: The adapter's tables and functions, as statements name them.
_NAMES = re.compile(
    r"\b(ik_(?:threads|turns|receipts|outbox_head|outbox|messages|facts|journal|leases|schema"
    r"|inbox|cancels|interrupts|streams|timers|start_turn_leased|prepare_receipt|commit_turn"
    r"|lg_checkpoints|lg_writes|lg_heads))\b"
)


def qualify(statement: str, schema: str) -> str:
    """``statement`` with every table and function of the adapter named in ``schema``
    (which holds no ``%``: psycopg would read it as a placeholder)."""
    quoted = '"' + schema.replace('"', '""') + '"'
    return _NAMES.sub(lambda m: f"{quoted}.{m.group(1)}", statement)


class _Qualified(dict[str, str]):
    """Each statement as one adapter sends it (``qualify``), made on first use."""

    __slots__ = ("_schema",)

    def __init__(self, schema: str) -> None:
        super().__init__()
        self._schema = schema

    def __missing__(self, statement: str) -> str:
        qualified = self[statement] = qualify(statement, self._schema)
        return qualified


def translated() -> _Translated:
    return _TRANSLATED


def execute(
    conn: Connection, query: str, params: Any = None
) -> Coroutine[Any, Any, psycopg.AsyncCursor[TupleRow]]:
    """The cursor's ``execute`` for the caller to await. (Not a coroutine itself: a
    frame of ours would be resumed at every wait for the server.)"""
    cur = conn.statements.get(query)
    if cur is None:
        cur = conn.statements[query] = conn.cursor()
    return cur.execute(query, params)


async def fetch_value(conn: Connection, query: str, *args: Any) -> Any:
    """The first column of the single row ``query`` returns; one ``dict`` argument is
    taken as named parameters."""
    params = args[0] if len(args) == 1 and isinstance(args[0], dict) else args or None
    return present(await (await execute(conn, query, params)).fetchone())[0]


def present(value: T | None) -> T:
    assert value is not None
    return value


#: A one-dimensional array in PostgreSQL's binary format: a header (dimensions, null
#: flag, element type, length, lower bound), then each element's length and bytes.
#: An empty array has no lower bound.
_TEXT_OID = 25
_TEXT_ARRAY_OID = 1009
_EMPTY_ARRAY = struct.pack("!iii", 0, 0, _TEXT_OID)
_ARRAY_HEAD = struct.Struct("!iiiii").pack
_ITEM_LENGTH = struct.Struct("!i").pack
#: The header of a one-element array and that element's length, in one ``pack``.
_ONE_ITEM_HEAD = functools.partial(struct.Struct("!iiiiii").pack, 1, 0, _TEXT_OID, 1, 1)


class TextArray(list[str]):
    """A ``text[]`` parameter sent in binary (``%(name)b``); no element is None."""

    __slots__ = ()


class _TextArrayDumper(RecursiveDumper):
    """Dumps a ``TextArray`` in one call, its elements by psycopg's own ``str`` dumper.

    psycopg's list dumper inspects every list for its depth and element type first:
    about twenty calls an array, seven arrays a commit. The element dumper is the
    one psycopg would use, so encoding and refusals stay psycopg's.
    """

    format = Format.BINARY
    oid = _TEXT_ARRAY_OID

    def __init__(self, cls: type, context: AdaptContext | None = None) -> None:
        super().__init__(cls, context)
        # psycopg's binary ``str`` dumper returns bytes, never None.
        dumper = self._tx.get_dumper("", PyFormat.BINARY)
        self._dump_item = cast("Callable[[str], bytes]", dumper.dump)

    def dump(self, obj: TextArray) -> Buffer:
        dump_item = self._dump_item
        if len(obj) == 1:  # the common case: the header and the length in one pack
            data = dump_item(obj[0])
            return _ONE_ITEM_HEAD(len(data)) + data
        if not obj:
            return _EMPTY_ARRAY
        # Each element's length, then its bytes, in one pass over the list.
        items = [_ITEM_LENGTH(len(data := dump_item(item))) + data for item in obj]
        return _ARRAY_HEAD(1, 0, _TEXT_OID, len(items), 1) + b"".join(items)


async def _configure(conn: Connection) -> None:
    """Teach a new pooled session to send ``TextArray`` parameters."""
    conn.adapters.register_dumper(TextArray, _TextArrayDumper)


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
        # libpq's own bound on one connection attempt (whole seconds, at least 2).
        # Without it, a server that drops packets holds each attempt until the system's
        # TCP timeout.
        # No server-side prepared statements: a transaction pooler may run the next
        # execution on a server connection that never saw the PREPARE.
        self._connect_kwargs: dict[str, Any] = {"prepare_threshold": None}
        if connect_timeout is not None:
            self._connect_kwargs["connect_timeout"] = max(2, math.ceil(connect_timeout))
        self._opened: AsyncConnectionPool[Connection] | None = None
        self._at_hand: list[tuple[Connection, float]] = []
        self._keep = pool_size[0]
        # Sessions borrowed from the pool, those at hand included.
        self._out = 0
        # Borrowers waiting for a session, oldest turn first (see ``_borrow``).
        self._queue: list[tuple[float, int, _Waiter, float]] = []
        # One timer fails the waiters past ``pool_timeout``, not one per waiter. A
        # timer per wait cost 7% of the CPU with 2,000 turns in flight.
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_every = max(0.05, timeout / 10)
        self._arrivals = itertools.count()
        # How long a start may jump ahead of the statements of started turns. It
        # bounds their wait behind starts, below ``pool_timeout``.
        self._head_start = min(_HEAD_START, timeout / 2)
        # Work that outlives its caller (a release, a return to the pool), held until
        # it ends; ``close`` waits for it.
        self._background: set[asyncio.Task[Any]] = set()
        self._sql = _Qualified(schema)

    @property
    def _pool(self) -> AsyncConnectionPool[Connection]:
        if self._opened is None:
            raise KernelError("the PostgreSQL adapter is closed")
        return self._opened

    # -- plumbing ------------------------------------------------------------------------------

    def _q(self, statement: str) -> str:
        """``statement`` as this adapter sends it: its names in the adapter's schema.
        (A turn's statements read ``self._sql[statement]``, one call fewer.)"""
        return self._sql[statement]

    async def _run(self, hop: Callable[[Connection], Awaitable[T]], *, repeat: bool = True) -> T:
        """Run ``hop`` on a pooled session.

        Idle pooled sessions may have died (server restart, terminated backend). The
        pool discards each broken one. With ``repeat`` the hop is tried on the next.
        It is tried at most once per pooled session, plus once on a fresh one. So
        ``hop`` must then be safe to repeat: a statement may have run before its
        session broke.

        Runs in the caller's task, not shielded from its cancellation. psycopg settles a
        statement interrupted in flight before the cancellation reaches us. It cancels
        it on the server and waits for its end, or it closes the session. Each statement
        is atomic either way. An interrupted hop is a crash between two statements,
        which every hop already tolerates.
        """
        pool = self._opened
        if pool is None:
            raise KernelError("the PostgreSQL adapter is closed")
        # The first attempt outside the retry loop, and driver errors caught here, not
        # by ``translated()``: a turn makes four borrows, each crossing these lines.
        at_hand = self._at_hand
        try:
            conn, due = at_hand.pop() if at_hand else await self._borrow(pool)
            try:
                return await hop(conn)
            except psycopg.OperationalError:
                if not repeat or not conn.broken:
                    raise
            finally:
                if not self._kept(conn, due):
                    await self._put(pool, conn)
            # The session broke: the next ones, at most one per pooled session.
            for attempt in range(pool.max_size, 0, -1):
                conn, due = at_hand.pop() if at_hand else await self._borrow(pool)
                try:
                    return await hop(conn)
                except psycopg.OperationalError:
                    if not conn.broken or attempt == 1:
                        raise
                finally:
                    if not self._kept(conn, due):
                        await self._put(pool, conn)
        except (PoolTimeout, psycopg.Error) as exc:
            raise present(_store_error(exc)) from exc
        raise AssertionError("unreachable")

    # Sessions at hand. A borrow from the pool and its return cost about 37 calls
    # (two of its locks, three log lines); at four a turn, a tenth of a turn's calls.
    # So the adapter keeps up to ``min_pool_size`` idle sessions at hand, borrowed from
    # the pool, and every borrower takes one of those first. No turn holds one between
    # its statements: a session at hand serves any borrower. The pool keeps that many
    # sessions open anyway. A session goes back to the pool when it is not idle (the
    # pool rolls it back or discards it), and at least every ``_KEEP_AT_HAND``
    # seconds. The pool so still retires old sessions.
    #
    # Waiting borrowers queue here, not in the pool, ordered by ``_priority``. A
    # session given back goes straight to the first waiter. The order:
    # - First, a turn's start, a lease's renewal, and stop checks read together.
    #   A start is one statement; then the turn's model runs, holding no session.
    #   A renewal keeps a turn alive. A batch of stop checks lets many turns go on.
    #   Their head start is bounded (``_head_start``).
    # - Then every other statement of a turn, by when the turn first waited here.
    #   A turn back from its model keeps that place for all its writes.
    # - Then any other statement, by when it asked.
    # The pool's own queue is first come, first served. There a turn of four
    # statements queues four times behind every younger turn. A turn that could
    # start waits behind them all. In a burst, all turns finish near its end. They
    # start their next model call together, so the bursts never spread out.

    async def _borrow(self, pool: AsyncConnectionPool[Connection]) -> tuple[Connection, float]:
        """A session from the pool, and until when the adapter may keep it at hand."""
        if self._out < pool.max_size and not self._queue:
            self._out += 1
        else:
            got = await self._wait_turn()
            if got is not None:
                return got  # handed over by a borrower done with it
        try:
            conn = await pool.getconn()
        except BaseException:
            self._out -= 1
            self._admit()
            raise
        return conn, monotonic() + _KEEP_AT_HAND

    def _priority(self) -> float:
        """Where a waiting borrower queues: lower first. Leases override it."""
        return monotonic()

    async def _wait_turn(self) -> tuple[Connection, float] | None:
        """Wait in the queue: a session handed over, or ``None`` to borrow from the pool."""
        loop = asyncio.get_running_loop()
        waiter: _Waiter = loop.create_future()
        deadline = monotonic() + self._pool_timeout
        heapq.heappush(self._queue, (self._priority(), next(self._arrivals), waiter, deadline))
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._sweep_every, self._sweep)
        try:
            return await waiter
        except asyncio.CancelledError:
            # Handed a session (or a place) just before the cancel: pass it on.
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                got = waiter.result()
                if got is None:
                    self._out -= 1
                    self._admit()
                elif not self._kept(*got):
                    self._in_pool(got[0])
            raise

    def _sweep(self) -> None:
        """Fail each waiter past its deadline; drop those done; again while any wait."""
        self._sweeper = None
        now = monotonic()
        waiting = []
        for entry in self._queue:
            waiter, deadline = entry[2], entry[3]
            if waiter.done():
                continue
            if deadline <= now:
                waiter.set_exception(
                    PoolTimeout(f"couldn't get a connection after {self._pool_timeout:.2f} sec")
                )
            else:
                waiting.append(entry)
        heapq.heapify(waiting)
        self._queue = waiting
        if waiting:
            self._sweeper = asyncio.get_running_loop().call_later(self._sweep_every, self._sweep)

    def _first_waiter(self) -> _Waiter | None:
        """The first waiter still waiting, taken from the queue."""
        queue = self._queue
        while queue:
            waiter = heapq.heappop(queue)[2]
            if not waiter.done():
                return waiter
        return None

    def _admit(self) -> None:
        """A place in the pool came free: the first waiter borrows it."""
        waiter = self._first_waiter()
        if waiter is not None:
            self._out += 1
            waiter.set_result(None)

    def _kept(self, conn: Connection, due: float) -> bool:
        """Hand ``conn`` to the first waiter, or keep it at hand; whether either was."""
        if conn.pgconn.transaction_status != _IDLE or self._opened is None:
            return False  # not idle or broken: the pool rolls it back or discards it
        waiter = self._first_waiter()
        if waiter is not None:
            waiter.set_result((conn, due))
            return True
        at_hand = self._at_hand
        if len(at_hand) < self._keep and monotonic() < due:
            at_hand.append((conn, due))
            return True
        return False

    async def _put(self, pool: AsyncConnectionPool[Connection], conn: Connection) -> None:
        """Give ``conn`` back to the pool; the first waiter may then borrow."""
        try:
            await pool.putconn(conn)
        finally:
            self._out -= 1
            self._admit()

    def _in_pool(self, conn: Connection) -> None:
        """``_put`` from a synchronous path: the return runs in the background."""
        pool = self._opened
        if pool is None:
            self._out -= 1
            return
        self._in_background(self._put(pool, conn))

    def _in_background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)  # held, so that it is not collected mid-way
        task.add_done_callback(self._background.discard)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Connection]:
        """A pooled session, held for the block (see ``PostgresDurability.session``). Only
        taking it is translated: the block's own driver errors reach its code as they are."""
        pool = self._pool
        at_hand = self._at_hand
        with translated():
            conn, due = at_hand.pop() if at_hand else await self._borrow(pool)
        try:
            yield conn
        finally:
            if not self._kept(conn, due):
                await self._put(pool, conn)  # the pool rolls back what the block left open

    async def open(self) -> None:
        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            self._dsn,
            min_size=self._pool_size[0],
            max_size=self._pool_size[1],
            kwargs={"autocommit": True, **self._connect_kwargs},
            connection_class=Connection,
            configure=_configure,
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
        lock (see FENCE). Here one transaction locks a probe row as a write would.
        Another tries to update it within 200 ms: it must be refused for the lock. Some
        PostgreSQL look-alikes have row locks that are stubs. Such a server lets the
        update through. It would let a paused worker write after another took its
        thread.
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
            conn = await Connection.connect(
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
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        queue, self._queue = self._queue, []
        for entry in queue:  # a waiter would wait for ever: nothing gives back now
            if not entry[2].done():
                entry[2].set_exception(KernelError("the PostgreSQL adapter is closed"))
        pool, self._opened = self._opened, None
        if pool is not None:
            at_hand, self._at_hand = self._at_hand, []
            for conn, _ in at_hand:
                await self._put(pool, conn)
            await pool.close()
