"""The PostgreSQL adapter through a real PgBouncer in transaction mode
(``scripts/pgbouncer.sh``): the conformance suite and the process tests, unchanged.

In transaction mode a server session serves one transaction, then goes back to the
pool. Nothing a session keeps between transactions survives: advisory locks held by
the session, ``SET`` outside a transaction, prepared statements. The adapter relies on
none of them since thread leases (issue 32) replaced session advisory locks; before,
every test here failed.

The tests read and tamper with the store on the server directly (``postgres_dsn``);
only the adapter under test goes through PgBouncer. Before each test, every server
session the test is likely to get carries another client's state, as in production
(``foreign_state``): a ``search_path`` to another schema and prepared statements named
as psycopg names its own. An adapter that relied on session state would read another
schema's tables, or run another client's statement under its own statement's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import random
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import prefork
from intention_kernel.durability import Durability
from intention_kernel.durability.postgres import MIGRATIONS, PostgresDurability
from intention_kernel.durability.postgres._schema import CREATE_SCHEMA_TABLE, INSERT_SCHEMA_VERSION
from intention_kernel.durability.postgres._sessions import advisory_key
from intention_kernel.testing.conformance import DurabilityConformance, Inspector, Tamper
from proving_support import Store as SQLStore
from proving_support import StoreInspector
from test_postgres import Store, _PostgresTamper
from test_postgres_leases import Schema, processes
from test_postgres_leases import (
    test_a_worker_stopped_past_its_lease_is_refused_every_write_after_it_wakes as _stopped,
)
from test_postgres_processes import Cluster, finish, touch
from test_postgres_processes import (
    test_a_killed_lease_holder_frees_its_thread_when_its_lease_expires as _killed_holder,
)
from test_postgres_processes import (
    test_processes_opening_a_fresh_schema_at_once_migrate_it_once as _fresh_schema,
)
from test_postgres_processes import (
    test_racing_workers_killed_at_random_never_duplicate_anything as _racing,
)

pytestmark = [pytest.mark.postgres, pytest.mark.pgbouncer]
__all__ = ["processes"]  # a fixture of test_postgres_leases, used here

#: Server sessions given another client's state before each test: about the pool's
#: size in scripts/pgbouncer.sh, and fewer than it, so that none waits for another.
FOREIGN_SESSIONS = 8


@contextlib.contextmanager
def holding_sessions(pooled: str) -> Iterator[None]:
    """Let one process at a time hold several server sessions at once.

    Each helper holds its sessions until it has them all. Three xdist workers doing so
    at once want 24 of the pool's 20: each waits for the others, and PgBouncer fails
    them all after ``query_wait_timeout``. A lock file per PgBouncer serializes them.
    """
    port = conninfo_to_dict(pooled).get("port", "6432")
    path = Path(tempfile.gettempdir()) / f"intention-kernel-pgbouncer-{port}.lock"
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def foreign_state(pooled: str) -> None:
    """Leave ``FOREIGN_SESSIONS`` of PgBouncer's server sessions as another client would:
    ``search_path`` on a schema of its own and ``_pg3_0``.. ``_pg3_3`` prepared. Each
    client holds a transaction open until all have one, so each is on a session of its
    own; PgBouncer hands out the sessions released last first, so a test gets these."""
    with holding_sessions(pooled):
        _foreign_state(pooled)


def _foreign_state(pooled: str) -> None:
    clients = [
        psycopg.connect(pooled, autocommit=True, prepare_threshold=None, connect_timeout=5)
        for _ in range(FOREIGN_SESSIONS)
    ]
    try:
        for conn in clients:
            conn.execute("BEGIN")
            conn.execute("SELECT set_config('search_path', 'ik_pgbouncer_elsewhere', false)")
            conn.execute("DEALLOCATE ALL")
            for n in range(4):
                conn.execute(f"PREPARE _pg3_{n} AS SELECT 'another client''s statement'")
        for conn in clients:
            conn.execute("COMMIT")
    finally:
        for conn in clients:
            conn.close()


@dataclass(frozen=True)
class PooledStore(Store):
    """A schema of its own, whose adapters connect through PgBouncer (``pooled``)."""

    pooled: str = ""

    def durability(self, via: Any = None, **options: Any) -> PostgresDurability:
        dsn = make_conninfo(self.pooled, application_name=self.schema)
        return PostgresDurability(dsn, schema=self.schema, **options)


@pytest.fixture
def pooled_store(postgres_dsn: str, pgbouncer_dsn: str) -> Iterator[PooledStore]:
    store = PooledStore(postgres_dsn, "ik_test_" + uuid.uuid4().hex[:12], pgbouncer_dsn)
    foreign_state(pgbouncer_dsn)
    yield store
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(store.schema))
        )


def test_a_session_lock_taken_through_pgbouncer_goes_with_the_session_to_another_client(
    pgbouncer_dsn: str,
) -> None:
    """Why session state cannot be relied on here: between two transactions of one
    client, PgBouncer hands its server session to another client, with the advisory
    lock the first one took on it. (In session mode no other client ever gets it.)"""
    key = random.randrange(1 << 62)

    def connect() -> psycopg.Connection[Any]:
        return psycopg.connect(pgbouncer_dsn, autocommit=True, prepare_threshold=None)

    def backend(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return int(row[0])

    with holding_sessions(pgbouncer_dsn), connect() as first:
        # One statement: the next one may already run on another server session.
        row = first.execute("SELECT pg_backend_pid() FROM pg_advisory_lock(%s)", (key,))
        locked = row.fetchone()
        assert locked is not None
        session = int(locked[0])
        others: list[psycopg.Connection[Any]] = []
        try:
            # Other clients open transactions until one is on the first client's session:
            # PgBouncer lends out every idle server session, that one included. Another
            # test's client may hold it for a moment: then all let go and try again.
            for _ in range(5):
                other = on_session(connect, backend, session, others)
                if other is not None:
                    break
            else:
                pytest.fail("no other client got the session: is PgBouncer in session mode?")
            # The other client's transaction now holds the first client's lock ...
            held = other.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND pid = pg_backend_pid() AND objid = (%s::bigint & 4294967295)::oid",
                (key,),
            ).fetchone()
            assert held == (1,)
            # ... and the first client's next statement runs on another session.
            assert backend(first) != session
            other.execute("SELECT pg_advisory_unlock(%s)", (key,))  # else it stays there
        finally:
            for other in others:
                other.close()


def on_session(
    connect: Callable[[], psycopg.Connection[Any]],
    backend: Callable[[psycopg.Connection[Any]], int],
    session: int,
    others: list[psycopg.Connection[Any]],
) -> psycopg.Connection[Any] | None:
    """Open transactions until one runs on ``session``; ``None`` after a pool's worth.

    Clients that missed are closed before a miss returns, so their sessions go back."""
    opened: list[psycopg.Connection[Any]] = []
    for _ in range(FOREIGN_SESSIONS * 2):
        other = connect()
        opened.append(other)
        other.execute("BEGIN")
        if backend(other) == session:
            others.extend(opened)
            return other
    for other in opened:
        other.close()
    return None


# Every test of the suite failed through PgBouncer before thread leases: an adapter
# set search_path once per session, prepared statements and held session locks.
class TestPostgresDurabilityThroughPgBouncer(DurabilityConformance):
    @pytest.fixture
    def make_durability(self, pooled_store: PooledStore) -> Callable[[], Durability]:
        return pooled_store.durability

    @pytest.fixture
    def tamper(self, durability: Durability, pooled_store: PooledStore) -> Tamper | None:
        return _PostgresTamper(pooled_store)

    @pytest.fixture
    def inspector(self, pooled_store: PooledStore) -> Inspector | None:
        return StoreInspector(SQLStore("postgres", pooled_store.dsn, pooled_store.schema))

    @pytest.fixture
    def make_durability_with_lock_timeout(
        self, pooled_store: PooledStore
    ) -> Callable[[float], Durability] | None:
        return lambda seconds: pooled_store.durability(lock_timeout=seconds)


# -- the process tests, their workers connected through PgBouncer -----------------------------


class PooledCluster(Cluster):
    """Workers and the test's adapters through PgBouncer; the test's own queries and the
    provider's ledger on the server directly."""

    def __init__(self, dsn: str, pooled: str, root: Path) -> None:
        super().__init__(dsn, root)
        self.pooled = make_conninfo(pooled, application_name=self.schema)

    def durability(self, **options: Any) -> PostgresDurability:
        return PostgresDurability(self.pooled, schema=self.schema, **options)

    async def spawn(self, **config: Any) -> Any:
        return await super().spawn(**{"dsn": self.pooled, "ledger_dsn": self.dsn, **config})


@pytest.fixture
async def cluster(postgres_dsn: str, pgbouncer_dsn: str, tmp_path: Path) -> Any:
    cluster = PooledCluster(postgres_dsn, pgbouncer_dsn, tmp_path)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(cluster.ledger)))
    cluster.query(
        cluster.ledger,
        "CREATE TABLE calls (n bigserial PRIMARY KEY, thread_id text NOT NULL, "
        "key text NOT NULL, pid integer NOT NULL)",
    )
    foreign_state(pgbouncer_dsn)
    yield cluster
    for process in cluster.processes:
        if process.returncode is None:
            process.kill()
        try:
            await process.communicate()
        except RuntimeError:  # a test's reader still owns the pipe: just reap it
            await process.wait()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for schema in (cluster.schema, cluster.ledger):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.slow
async def test_processes_opening_a_fresh_schema_at_once_migrate_it_once(
    cluster: PooledCluster,
) -> None:
    await _fresh_schema(cluster)


@pytest.mark.slow
async def test_a_killed_lease_holder_frees_its_thread_when_its_lease_expires(
    cluster: PooledCluster,
) -> None:
    await _killed_holder(cluster)


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_racing_workers_killed_at_random_never_duplicate_anything(
    cluster: PooledCluster,
) -> None:
    seed = random.randrange(1 << 32)
    print(f"random seed: {seed}")
    await _racing(cluster, random.Random(seed))


@pytest.fixture
def pooled_schema(postgres_dsn: str, pgbouncer_dsn: str) -> Iterator[Schema]:
    """A store schema and a ledger schema, every client of both through PgBouncer."""
    made = Schema(pgbouncer_dsn)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(made.ledger)))
    made.query(
        "CREATE TABLE calls (n bigserial PRIMARY KEY, thread_id text NOT NULL, "
        "key text NOT NULL, pid integer NOT NULL)",
        schema=made.ledger,
    )
    foreign_state(pgbouncer_dsn)
    yield made
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for name in (made.name, made.ledger):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.mark.slow
@pytest.mark.parametrize("where", ["before_effect", "in_provider"])
async def test_a_worker_stopped_past_its_lease_is_refused_every_write_after_it_wakes(
    pooled_schema: Schema,
    tmp_path: Path,
    processes: list[prefork.Forked],
    where: str,
) -> None:
    await _stopped(pooled_schema, tmp_path, processes, where)


@pytest.mark.slow
async def test_workers_that_waited_for_the_migration_lock_see_what_its_holder_created(
    cluster: PooledCluster, postgres_dsn: str
) -> None:
    """Real processes open a fresh schema through PgBouncer while this test holds the
    migration's lock, so that every one of them looks, finds no schema, and waits.
    The test then migrates the schema as the adapter does and commits. Each waiter
    must see the schema it waited for and apply nothing: none may fail.

    Before the fix they often did (UniqueViolation on ``pg_namespace``). A server
    session takes in the catalog changes other sessions committed at the start of a
    transaction, or when it locks a relation; not after an advisory lock's wait.
    PgBouncer's server sessions are warm, and answered ``CREATE SCHEMA IF NOT
    EXISTS`` from a cache that still said "no such schema" (see
    ABSORB_CATALOG_CHANGES). Fresh sessions rarely show it: their first cache miss
    takes the changes in. The adapter no longer retries a migration that failed."""
    key = advisory_key("migrate", cluster.schema)
    warm_up(cluster.pooled, cluster.schema)
    barrier = cluster.path("go")
    with psycopg.connect(postgres_dsn) as holder:  # one transaction, committed at the end
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
        openers = [
            await cluster.spawn(mode="open", arrived=cluster.path(f"arrived-{i}"), barrier=barrier)
            for i in range(6)
        ]
        for i, process in enumerate(openers):
            await cluster.wait_for_file(cluster.path(f"arrived-{i}"), process)
        touch(barrier)
        deadline = time.monotonic() + 30
        while waiting_for(postgres_dsn, key) < len(openers):
            assert time.monotonic() < deadline, "the openers never all waited for the lock"
            await asyncio.sleep(0.02)
        holder.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(cluster.schema)))
        holder.execute(
            "SELECT set_config('search_path', %s, true)",
            (sql.Identifier(cluster.schema).as_string(holder),),
        )
        holder.execute(CREATE_SCHEMA_TABLE)
        for version, migration in enumerate(MIGRATIONS, 1):
            holder.execute(migration.encode())
            holder.execute(INSERT_SCHEMA_VERSION, (version,))
    for process in openers:
        assert await finish(process) == []
    versions = cluster.query(cluster.schema, "SELECT version FROM ik_schema ORDER BY version")
    assert [v for (v,) in versions] == list(range(1, len(MIGRATIONS) + 1))


def warm_up(pooled: str, schema: str) -> None:
    """Leave ``FOREIGN_SESSIONS`` of PgBouncer's server sessions as a busy one would be:
    each has looked for ``schema`` (and cached that it has none) and has run the
    migration's first statements on another schema, in a transaction of its own."""
    with holding_sessions(pooled):
        _warm_up(pooled, schema)


def _warm_up(pooled: str, schema: str) -> None:
    clients = [
        psycopg.connect(pooled, autocommit=True, prepare_threshold=None, connect_timeout=5)
        for _ in range(FOREIGN_SESSIONS)
    ]
    try:
        for conn in clients:  # each holds a transaction open: each on a session of its own
            conn.execute("BEGIN")
            conn.execute("SELECT to_regclass(format('%%I.ik_schema', %s::text))", (schema,))
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (random.randrange(1 << 62),))
            conn.execute("CREATE SCHEMA IF NOT EXISTS public")
        for conn in clients:
            conn.execute("COMMIT")
    finally:
        for conn in clients:
            conn.close()


def waiting_for(dsn: str, key: int) -> int:
    """How many sessions wait for the advisory lock ``key``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND objid = (%s::bigint & 4294967295)::oid",
            (key,),
        ).fetchone()
    assert row is not None
    return int(row[0])
