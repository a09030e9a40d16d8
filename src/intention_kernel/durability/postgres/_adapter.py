"""``PostgresDurability``: the adapter class, its options and their checks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from intention_kernel.durability._contract.options import check_seconds, take_url_options
from intention_kernel.durability.abc import RecordedDurability
from intention_kernel.durability.postgres._recorder import PostgresRecorder
from intention_kernel.errors import StoreError

__all__ = [
    "DEFAULT_LEASE_EXPIRY",
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_SCHEMA",
    "URL_OPTIONS",
    "PostgresDurability",
]

DEFAULT_SCHEMA = "intention_kernel"
DEFAULT_LOCK_TIMEOUT = 30.0
#: Seconds a thread lease lasts unless renewed: a dead worker's threads are free after it.
DEFAULT_LEASE_EXPIRY = 30.0
#: Query parameters of a ``postgresql://`` URL that ``open_durability`` takes for the
#: adapter (they are not libpq's, which refuses unknown ones).
URL_OPTIONS = ("schema", "lock_timeout", "lease_expiry")


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
    - ``lease_expiry``: how long a thread lease lasts unless its holder renews it
      (at least every third of it, while the turn runs). A worker that died, or
      was paused longer than this, loses its threads. Another worker takes them.
      Every later write of the paused one is refused (``LeaseLostError``).
    - ``min_pool_size`` / ``max_pool_size``: the connection pool. A turn borrows a
      session for one statement at a time. It holds none while its model or a
      provider call runs. So the pool bounds statements in flight, not turns. Up
      to ``min_pool_size`` idle sessions stay at hand for the next statement, of
      any turn. They go back to the pool whenever a borrower waits there.
    - ``pool_timeout``: how long to wait for a free session. It also bounds connecting,
      unless ``connect_timeout`` is given. A turn's wait for a session is bounded by
      this, not by ``lock_timeout``. So a turn on an idle thread never fails because
      the pool was busy for less.
    - ``connect_timeout``: how long opening the adapter waits to reach the server. It
      is also libpq's bound on each connection attempt (whole seconds, at least 2).
      The CLI passes a short one, so that an unreachable server is reported at once.

    Each is finite, non-negative seconds (``pool_timeout``, ``connect_timeout`` and
    ``lease_expiry`` more than 0); NaN, infinity and negative values are refused
    with ``ValueError``.

    No session carries state between transactions. So a transaction pooler works in
    front of the server: PgBouncer in transaction mode, Supabase's, Neon's.
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
        lease_expiry: float = DEFAULT_LEASE_EXPIRY,
    ) -> None:
        if not schema or "\x00" in schema or len(schema.encode()) > 63:
            raise ValueError(f"not a PostgreSQL schema name: {schema!r}")
        if "%" in schema:  # statements name the schema, and psycopg reads % as a placeholder
            raise ValueError(f"a schema name with '%' is not supported: {schema!r}")
        if not 0 <= min_pool_size <= max_pool_size or max_pool_size < 1:
            raise ValueError("need 0 <= min_pool_size <= max_pool_size and max_pool_size >= 1")
        lock_timeout = check_seconds("lock_timeout", lock_timeout)
        if not check_seconds("pool_timeout", pool_timeout):
            raise ValueError("pool_timeout must be more than 0 seconds")
        if connect_timeout is not None and not check_seconds("connect_timeout", connect_timeout):
            raise ValueError("connect_timeout must be more than 0 seconds")
        if not check_seconds("lease_expiry", lease_expiry):
            raise ValueError("lease_expiry must be more than 0 seconds")
        _check_dsn(dsn)
        self.schema = schema
        self._sessions = PostgresRecorder(
            dsn,
            schema,
            lock_timeout,
            (min_pool_size, max_pool_size),
            pool_timeout,
            connect_timeout,
            lease_expiry,
        )
        super().__init__(self._sessions)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
        """One of the adapter's pooled sessions, held for the block, in autocommit mode.

        It opens the adapter if it is not open yet. Like every session of the adapter,
        it carries no settings. Name the adapter's tables in ``schema``, or set
        ``search_path`` in the block.

        For the application's own statements beside the adapter's: its own tables, a
        diagnostic, an ``EXPLAIN`` of a query of the adapter's. A held session is one
        fewer for turns: with every session held, a turn waits up to ``pool_timeout``.
        Writing the adapter's tables through it bypasses every rule the adapter keeps.
        The pool rolls back a transaction the block leaves open.
        """
        await self.recorder()
        async with self._sessions.session() as conn:
            yield conn

    def missing_store_reason(self) -> str:
        """Names the schema where no store was found."""
        return f"the PostgreSQL database has no intention-kernel store in schema {self.schema!r}"


def _check_dsn(dsn: str) -> None:
    """Refuse a connection string libpq cannot parse, at once.

    The pool would otherwise retry it until ``pool_timeout``. It would then report a
    server it could not reach."""
    if "://" in dsn:
        try:
            _, ours = take_url_options(dsn, URL_OPTIONS)
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
