"""The PostgreSQL adapter runs the whole conformance suite, plus PostgreSQL specifics:
thread leases, fencing, migrations, outbox positions and lost connections.

Every test works in its own schema (a random name, dropped afterwards).
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from typer.testing import CliRunner

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    Intent,
    Interpretation,
    capability,
)
from intention_kernel._checkpoint import encode_checkpoint
from intention_kernel._effects import EffectAuthority, Receipt, ReceiptStatus
from intention_kernel._facts import Evidence, FactRecord
from intention_kernel._interpretation import InterpretationRequest
from intention_kernel._kernel import Kernel
from intention_kernel._turns import EventDraft, OutboxEvent, TurnCommit, TurnResult, TurnScope
from intention_kernel.cli._app import app as cli_app
from intention_kernel.durability import (
    Durability,
    TurnTransaction,
    _take_url_options,
    open_durability,
)
from intention_kernel.durability._contract.recorders import lock_and_begin
from intention_kernel.durability._layout.rows import receipt_params
from intention_kernel.durability.postgres import MIGRATIONS, PostgresDurability
from intention_kernel.durability.postgres._schema import ASYNC_LEASE_TAKE
from intention_kernel.durability.postgres._sessions import TextArray
from intention_kernel.durability.postgres._statements import TAKE_LEASE
from intention_kernel.errors import (
    CorruptRecordError,
    EffectUncertainError,
    FencedCommitError,
    LeaseLostError,
    ReceiptStateError,
    StoreError,
    ThreadBusyError,
    ThreadLockTimeoutError,
)
from intention_kernel.testing._agents import FakeProvider, billing_agent
from intention_kernel.testing.conformance import DurabilityConformance, Inspector, Tamper
from intention_kernel.testing.conformance import commit_for as minimal_commit
from proving_support import Store as SQLStore
from proving_support import (
    StoreInspector,
    cancels_before_scopes_stop_any_tenant,
    inbox_before_steers_reads_as_queued,
    interrupts_before_senders_stop_any_turn_on_their_base,
    journal_before_tenants_gets_its_threads_owner,
    migration_4_gives_receipts_their_owner,
    receipts_before_actors_read_as_no_actor,
    receipts_before_origins_read_with_none,
)
from tcp_proxy import TcpProxy

pytestmark = pytest.mark.postgres


@dataclass(frozen=True)
class Store:
    """A PostgreSQL schema of its own for one test."""

    dsn: str
    schema: str

    def durability(self, via: TcpProxy | None = None, **options: Any) -> PostgresDurability:
        """An adapter whose sessions carry the schema name as ``application_name``
        (connected through ``via``, if given)."""
        dsn = make_conninfo(self.dsn, application_name=self.schema)
        return PostgresDurability(via.dsn(dsn) if via else dsn, schema=self.schema, **options)

    def execute(self, query: str, *args: object) -> list[tuple[Any, ...]]:
        """Run one statement in the test's schema and return its rows."""
        with psycopg.connect(self.dsn) as conn:
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(self.schema)))
            cur = conn.execute(query.encode(), args or None)
            return cur.fetchall() if cur.description else []

    def lease(self, thread_id: str) -> tuple[str, int] | None:
        """The owner and epoch of the live turn lease on ``thread_id``, if any."""
        rows = self.execute(
            "SELECT owner, epoch FROM ik_leases WHERE thread_id = %s AND kind = 'turn'"
            " AND expires_at > clock_timestamp()",
            thread_id,
        )
        return (rows[0][0], rows[0][1]) if rows else None

    def live_leases(self) -> int:
        """How many leases (turn or relay) are alive, on the server's clock."""
        rows = self.execute("SELECT count(*) FROM ik_leases WHERE expires_at > clock_timestamp()")
        return int(rows[0][0])

    def expire(self, thread_id: str) -> None:
        """Make the live lease of ``thread_id`` lapse now, as a paused holder's would."""
        rows = self.execute(
            "UPDATE ik_leases SET expires_at = clock_timestamp() - interval '1 second'"
            " WHERE thread_id = %s AND kind = 'turn' AND expires_at > clock_timestamp()"
            " RETURNING epoch",
            thread_id,
        )
        assert rows, f"nobody holds a lease on {thread_id!r}"


@pytest.fixture
def store(postgres_dsn: str) -> Iterator[Store]:
    store = Store(postgres_dsn, "ik_test_" + uuid.uuid4().hex[:12])
    yield store
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(store.schema))
        )


class _PostgresTamper:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def write_checkpoint_text(self, thread_id: str, text: str) -> None:
        self._store.execute(
            "UPDATE ik_threads SET checkpoint = %s WHERE thread_id = %s", text, thread_id
        )

    async def write_receipt_status(self, thread_id: str, key: str, status: str) -> None:
        self._store.execute("ALTER TABLE ik_receipts DROP CONSTRAINT ik_receipts_status_check")
        self._store.execute(
            "UPDATE ik_receipts SET status = %s WHERE thread_id = %s AND key = %s",
            status,
            thread_id,
            key,
        )


class TestPostgresDurability(DurabilityConformance):
    @pytest.fixture
    def make_durability(self, store: Store) -> Callable[[], Durability]:
        return store.durability

    @pytest.fixture
    def tamper(self, durability: Durability, store: Store) -> Tamper | None:
        return _PostgresTamper(store)

    @pytest.fixture
    def inspector(self, store: Store) -> Inspector | None:
        return StoreInspector(SQLStore("postgres", store.dsn, store.schema))

    @pytest.fixture
    def make_durability_with_lock_timeout(
        self, store: Store
    ) -> Callable[[float], Durability] | None:
        return lambda seconds: store.durability(lock_timeout=seconds)


# -- helpers ---------------------------------------------------------------------------------


def commit_for(tx: TurnTransaction, events: tuple[EventDraft, ...] = ()) -> TurnCommit:
    """The conformance kit's minimal commit, with a ``turn.committed`` event by default."""
    version = (tx.checkpoint.version if tx.checkpoint else 0) + 1
    return minimal_commit(tx, events or (EventDraft("turn.committed", {"v": version}),))


async def plain(tx: TurnTransaction) -> TurnCommit:
    return commit_for(tx)


class Gate:
    """An operation that holds its turn (and the thread's lease) until released."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.released = asyncio.Event()

    async def __call__(self, tx: TurnTransaction) -> TurnCommit:
        self.entered.set()
        await self.released.wait()
        return commit_for(tx)


@asynccontextmanager
async def no_lock(thread_id: str) -> AsyncIterator[object]:
    yield thread_id


async def skip_the_lock(monkeypatch: pytest.MonkeyPatch, durability: PostgresDurability) -> None:
    """Make ``durability`` start its turns without a lease, as if it had lost it: a plain
    read (``begin_turn``) instead of ``start_turn``."""
    recorder = await durability.recorder()
    monkeypatch.setattr(recorder, "lock", no_lock)
    monkeypatch.setattr(recorder, "start_turn", partial(lock_and_begin, recorder))


def with_query(dsn: str, query: str) -> str:
    """``dsn`` (a URL) with ``query`` appended to its query string."""
    return f"{dsn}{'&' if '?' in dsn else '?'}{query}"


async def read_all(durability: Durability, after: int | None = None) -> list[Any]:
    events: list[Any] = []
    while batch := await durability.read_outbox(
        after=events[-1].position if events else after, limit=500
    ):
        events.extend(batch)
    return events


# -- schema ----------------------------------------------------------------------------------


async def test_schema_is_created_once_in_its_own_namespace_and_versioned(store: Store) -> None:
    for _ in range(2):
        async with store.durability():
            pass
    versions = store.execute("SELECT version FROM ik_schema ORDER BY version")
    assert [v for (v,) in versions] == list(range(1, len(MIGRATIONS) + 1))
    tables = store.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
        "ORDER BY table_name",
        store.schema,
    )
    assert [t for (t,) in tables] == [
        "ik_cancels",
        "ik_facts",
        "ik_inbox",
        "ik_interrupts",
        "ik_journal",
        "ik_leases",
        "ik_lg_checkpoints",
        "ik_lg_heads",
        "ik_lg_writes",
        "ik_messages",
        "ik_outbox",
        "ik_outbox_head",
        "ik_receipts",
        "ik_schema",
        "ik_streams",
        "ik_threads",
        "ik_timers",
        "ik_turns",
    ]
    times = store.execute(
        "SELECT DISTINCT data_type FROM information_schema.columns "
        "WHERE table_schema = %s AND data_type LIKE 'timestamp%%'",
        store.schema,
    )
    assert times == [("timestamp with time zone",)]


async def test_concurrent_first_opens_migrate_once(store: Store) -> None:
    adapters = [store.durability() for _ in range(8)]
    await asyncio.gather(*(a.__aenter__() for a in adapters))
    await asyncio.gather(*(a.aclose() for a in adapters))
    assert store.execute("SELECT count(*) FROM ik_schema") == [(len(MIGRATIONS),)]


async def test_a_schema_from_a_newer_library_is_refused(store: Store) -> None:
    async with store.durability():
        pass
    store.execute("INSERT INTO ik_schema VALUES (%s, now())", len(MIGRATIONS) + 1)
    with pytest.raises(StoreError, match="newer than this library"):
        async with store.durability():
            pass


#: Back to the receipt index of schema versions 1-4, for tests of older databases.
UNDO_MIGRATION_5 = (
    "DROP INDEX ik_receipts_unsettled; CREATE INDEX ik_receipts_status ON ik_receipts (status)"
)
UNDO_MIGRATION_7 = "ALTER TABLE ik_turns DROP COLUMN announced"
UNDO_MIGRATION_8 = "DROP TABLE ik_journal"
UNDO_MIGRATION_9 = "ALTER TABLE ik_receipts DROP COLUMN actor"
UNDO_MIGRATION_20 = (
    "ALTER TABLE ik_interrupts DROP CONSTRAINT ik_interrupts_pkey;"
    " ALTER TABLE ik_interrupts DROP COLUMN turn_id, DROP COLUMN scope, DROP COLUMN seq;"
    " ALTER TABLE ik_interrupts ADD CONSTRAINT ik_interrupts_pkey"
    " PRIMARY KEY (thread_id, base_version);"
    " ALTER TABLE ik_inbox DROP COLUMN started"
)
UNDO_MIGRATION_21 = (
    "DROP FUNCTION ik_prepare_receipt(text, text, bigint, text, text, text, text, text, text,"
    " integer, text, text, timestamptz, timestamptz, text, boolean, text, text, text, text, text)"
)
UNDO_MIGRATION_22 = (
    "DROP FUNCTION ik_commit_turn(boolean, text, bigint, text, text, text, text, bigint, bigint,"
    " text, text, integer, text, timestamptz, text[], text[], text[], text[], text[], bigint,"
    " bigint, boolean, text[], text[], text[], text[], boolean, jsonb, text[])"
)
UNDO_MIGRATION_23 = "ALTER TABLE ik_leases DROP COLUMN turn_id;" + ASYNC_LEASE_TAKE
UNDO_MIGRATION_16 = "DROP TABLE ik_timers"
UNDO_MIGRATION_15 = "DROP TABLE ik_streams"
UNDO_MIGRATION_14 = "DROP TABLE ik_lg_checkpoints, ik_lg_writes, ik_lg_heads"
UNDO_MIGRATION_13 = (
    "DROP TABLE ik_leases;"
    " DROP FUNCTION ik_start_turn_leased(boolean, text, text, bigint, text, interval)"
)
UNDO_MIGRATION_12 = "ALTER TABLE ik_journal DROP COLUMN tenant_id"
UNDO_MIGRATION_11 = "DROP TABLE ik_inbox, ik_cancels, ik_interrupts"
UNDO_MIGRATION_10 = (
    "ALTER TABLE ik_receipts DROP COLUMN capability_id, DROP COLUMN input, DROP COLUMN approved_by"
)


async def test_a_version_1_schema_is_upgraded_and_its_threads_go_on(store: Store) -> None:
    provider = FakeProvider()
    async with store.durability() as durability:
        kernel = Kernel(billing_agent(provider, max_messages=4), durability)
        for turn, text in enumerate(["balance 500", "charge pi_1 500", "yes"], start=1):
            await kernel.turn("t", str(turn), text)
        before = await durability.load_checkpoint("t")
    assert before is not None
    # What schema version 1 wrote: whole documents in ik_threads.checkpoint, no rows.
    store.execute("UPDATE ik_threads SET checkpoint = %s", encode_checkpoint(before))
    store.execute("DROP TABLE ik_messages, ik_facts")
    store.execute("ALTER TABLE ik_threads DROP COLUMN message_seq")
    store.execute(
        "ALTER TABLE ik_outbox DROP COLUMN published_at, DROP COLUMN attempts, "
        "DROP COLUMN last_error, DROP COLUMN retry_at"
    )
    store.execute("ALTER TABLE ik_receipts DROP COLUMN announced, DROP COLUMN tenant_id")
    store.execute("ALTER TABLE ik_turns DROP COLUMN pruned_at")
    store.execute(UNDO_MIGRATION_5)
    store.execute(UNDO_MIGRATION_7)
    store.execute(UNDO_MIGRATION_8)
    store.execute(UNDO_MIGRATION_9)
    store.execute(UNDO_MIGRATION_16)
    store.execute(UNDO_MIGRATION_15)
    store.execute(UNDO_MIGRATION_14)
    store.execute(UNDO_MIGRATION_13)
    store.execute(UNDO_MIGRATION_11)
    store.execute(UNDO_MIGRATION_10)
    store.execute("DELETE FROM ik_schema WHERE version > 1")

    async with store.durability() as upgraded:
        assert await upgraded.load_checkpoint("t") == before
        # The charge's turn committed, so its effect.completed was announced.
        [receipt] = await upgraded.list_receipts("t")
        assert receipt.announced
        kernel = Kernel(billing_agent(provider, max_messages=4), upgraded)
        await kernel.turn("t", "4", "balance 20")
        after = await upgraded.load_checkpoint("t")
    assert after is not None and after.version == 4
    assert after.facts["charge.pi_1"] == before.facts["charge.pi_1"]
    assert [m.turn_id for m in after.messages] == ["3", "3", "4", "4"]
    assert [v for (v,) in store.execute("SELECT version FROM ik_schema ORDER BY 1")] == list(
        range(1, len(MIGRATIONS) + 1)
    )
    assert store.execute("SELECT count(*) FROM ik_messages") == [(4,)]
    indexes = store.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = 'ik_receipts'"
        " ORDER BY 1",
        store.schema,
    )
    assert [i for (i,) in indexes] == [
        "ik_receipts_id_key",
        "ik_receipts_pkey",
        "ik_receipts_unsettled",
    ]
    async with store.durability() as reopened:
        assert await reopened.load_checkpoint("t") == after
    assert provider.calls() == 1


async def test_migration_4_gives_existing_receipts_their_threads_owner(store: Store) -> None:
    def back_to_version_3() -> None:
        store.execute("ALTER TABLE ik_receipts DROP COLUMN tenant_id")
        store.execute(UNDO_MIGRATION_5)
        store.execute(UNDO_MIGRATION_7)
        store.execute(UNDO_MIGRATION_8)
        store.execute(UNDO_MIGRATION_9)
        store.execute(UNDO_MIGRATION_16)
        store.execute(UNDO_MIGRATION_15)
        store.execute(UNDO_MIGRATION_14)
        store.execute(UNDO_MIGRATION_13)
        store.execute(UNDO_MIGRATION_11)
        store.execute(UNDO_MIGRATION_10)
        store.execute("DELETE FROM ik_schema WHERE version > 3")

    await migration_4_gives_receipts_their_owner(store.durability, back_to_version_3)


async def test_receipts_stored_before_migration_9_read_as_approved_by_no_one(
    store: Store,
) -> None:
    def back_to_version_8() -> None:
        store.execute(UNDO_MIGRATION_16)
        store.execute(UNDO_MIGRATION_15)
        store.execute(UNDO_MIGRATION_14)
        store.execute(UNDO_MIGRATION_13)
        store.execute(UNDO_MIGRATION_12)
        store.execute(UNDO_MIGRATION_11)
        store.execute(UNDO_MIGRATION_10)
        store.execute(UNDO_MIGRATION_9)
        store.execute("DELETE FROM ik_schema WHERE version > 8")

    await receipts_before_actors_read_as_no_actor(store.durability, back_to_version_8)


async def test_receipts_stored_before_migration_10_read_with_no_origin(store: Store) -> None:
    def back_to_version_9() -> None:
        store.execute(UNDO_MIGRATION_16)
        store.execute(UNDO_MIGRATION_15)
        store.execute(UNDO_MIGRATION_14)
        store.execute(UNDO_MIGRATION_13)
        store.execute(UNDO_MIGRATION_12)
        store.execute(UNDO_MIGRATION_11)
        store.execute(UNDO_MIGRATION_10)
        store.execute("DELETE FROM ik_schema WHERE version > 9")

    await receipts_before_origins_read_with_none(store.durability, back_to_version_9)


async def test_migration_12_gives_existing_journal_entries_their_threads_owner(
    store: Store,
) -> None:
    def back_to_version_11() -> None:
        store.execute(UNDO_MIGRATION_16)
        store.execute(UNDO_MIGRATION_15)
        store.execute(UNDO_MIGRATION_14)
        store.execute(UNDO_MIGRATION_13)
        store.execute(UNDO_MIGRATION_12)
        store.execute("DELETE FROM ik_schema WHERE version > 11")

    await journal_before_tenants_gets_its_threads_owner(store.durability, back_to_version_11)


async def test_stop_requests_stored_before_migration_18_stop_any_tenants_turn(
    store: Store,
) -> None:
    def back_to_version_17() -> None:
        store.execute(
            "ALTER TABLE ik_cancels DROP CONSTRAINT ik_cancels_pkey;"
            " ALTER TABLE ik_cancels DROP COLUMN scope;"
            " ALTER TABLE ik_cancels ADD CONSTRAINT ik_cancels_pkey"
            " PRIMARY KEY (thread_id, turn_id)"
        )
        store.execute("DELETE FROM ik_schema WHERE version > 17")

    def old_cancel(thread_id: str, turn_id: str, reason: str) -> None:
        store.execute(
            "INSERT INTO ik_cancels VALUES (%s, %s, %s, now())", thread_id, turn_id, reason
        )

    await cancels_before_scopes_stop_any_tenant(store.durability, back_to_version_17, old_cancel)


async def test_inbox_entries_stored_before_migration_19_are_queued_messages(
    store: Store,
) -> None:
    def back_to_version_18() -> None:
        store.execute("ALTER TABLE ik_inbox DROP COLUMN steer, DROP COLUMN taken_by")
        store.execute("DELETE FROM ik_schema WHERE version > 18")

    await inbox_before_steers_reads_as_queued(store.durability, back_to_version_18)


async def test_interrupts_stored_before_migration_20_stop_any_turn_on_their_base(
    store: Store,
) -> None:
    def back_to_version_19() -> None:
        store.execute(UNDO_MIGRATION_20)
        store.execute("DELETE FROM ik_schema WHERE version > 19")

    def old_interrupt(thread_id: str, base_version: int) -> None:
        store.execute("INSERT INTO ik_interrupts VALUES (%s, %s, now())", thread_id, base_version)

    await interrupts_before_senders_stop_any_turn_on_their_base(
        store.durability, back_to_version_19, old_interrupt
    )


async def test_a_version_20_schema_gains_the_turn_functions_and_old_workers_go_on(
    store: Store,
) -> None:
    """Migrations 21 and 22 add ``ik_prepare_receipt`` and ``ik_commit_turn``, and change
    no table. A worker of the previous library, sharing the upgraded schema, still
    prepares with its fenced CTE (``INSERT_RECEIPT_IF_NEW``): refused without the
    lease, written with it."""
    from intention_kernel.durability import postgres

    async def charge(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect(tx.scope.turn_id, lambda a: {"id": a.key}, step_id="s")
        return commit_for(tx)

    async with store.durability() as durability:
        await durability.with_turn(TurnScope("t", "1"), charge)
    store.execute(UNDO_MIGRATION_22)
    store.execute(UNDO_MIGRATION_21)
    store.execute("DELETE FROM ik_schema WHERE version > 20")
    functions = (
        "SELECT count(*) FROM pg_proc WHERE proname IN ('ik_prepare_receipt', 'ik_commit_turn')"
        " AND pronamespace = to_regnamespace(%s)"
    )
    assert store.execute(functions, store.schema) == [(0,)]

    async with store.durability() as upgraded:
        assert (await upgraded.with_turn(TurnScope("t", "2"), charge)).checkpoint_version == 2
    assert store.execute(functions, store.schema) == [(2,)]
    assert store.execute("SELECT max(version) FROM ik_schema") == [(len(MIGRATIONS),)]

    # The previous library's prepare, on the upgraded schema, with and without a lease.
    receipt = Receipt(uuid.uuid4().hex, "t", "old:k", ReceiptStatus.PREPARED, "old", "s", 1)
    params = {
        **receipt_params(receipt, lambda moment: moment),
        "lease_kind": "turn",
        "lease_owner": "old-worker",
        "lease_epoch": 7,
    }

    def old_prepare() -> list[tuple[Any, ...]]:
        with psycopg.connect(store.dsn) as conn:
            path = sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(store.schema))
            conn.execute(path)
            return conn.execute(postgres.INSERT_RECEIPT_IF_NEW, params).fetchall()

    assert old_prepare() == [(0, 0)]  # no lease of its own: refused
    store.execute(
        "UPDATE ik_leases SET epoch = 7, owner = 'old-worker',"
        " expires_at = clock_timestamp() + interval '1 minute'"
        " WHERE thread_id = 't' AND kind = 'turn'"
    )
    assert old_prepare() == [(1, 1)]
    keys = store.execute("SELECT key, status FROM ik_receipts ORDER BY ordinal")
    assert keys == [("1", "completed"), ("2", "completed"), ("old:k", "prepared")]


async def test_a_version_22_schema_gains_the_leases_turn_and_old_takes_go_on(
    store: Store,
) -> None:
    """Migration 23 adds ``ik_leases.turn_id``, written by ``ik_start_turn_leased`` as
    it takes the lease. Rows of before read as no turn. A worker of the previous
    library takes leases with the same function, and with its ``lock``'s statement."""

    async def plain(tx: TurnTransaction) -> TurnCommit:
        return commit_for(tx)

    async with store.durability() as durability:
        await durability.with_turn(TurnScope("t", "1"), plain)
    store.execute(UNDO_MIGRATION_23)
    store.execute("DELETE FROM ik_schema WHERE version > 22")
    assert store.execute("SELECT count(*) FROM ik_leases WHERE thread_id = 't'") == [(1,)]

    async def names_its_turn(tx: TurnTransaction) -> TurnCommit:
        held = store.execute("SELECT turn_id FROM ik_leases WHERE thread_id = 't'")
        assert held == [(tx.scope.turn_id,)]
        return commit_for(tx)

    async with store.durability() as upgraded:
        assert store.execute("SELECT turn_id FROM ik_leases WHERE thread_id = 't'") == [(None,)]
        await upgraded.with_turn(TurnScope("t", "2"), names_its_turn)
    assert store.execute("SELECT max(version) FROM ik_schema") == [(len(MIGRATIONS),)]
    # The previous library's ``lock`` statement, on the upgraded schema.
    old_take = TAKE_LEASE.replace(" turn_id = NULL,", "")
    assert old_take != TAKE_LEASE
    params = {"thread_id": "t", "lease_kind": "turn", "lease_owner": "old", "expiry": "1 min"}
    with psycopg.connect(store.dsn) as conn:
        conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(store.schema)))
        assert conn.execute(old_take, params).fetchall() == [(3,)]


async def test_open_durability_builds_postgres_from_a_url(store: Store) -> None:
    """``schema`` and ``lock_timeout`` in the URL reach the adapter; every other query
    parameter reaches libpq as it was written; the CLI opens the same store."""
    default = open_durability(store.dsn)
    assert isinstance(default, PostgresDurability)
    assert default.schema == "intention_kernel"  # the default
    app_name = f"url {store.schema}"
    url = with_query(
        store.dsn, f"schema={store.schema}&lock_timeout=0.3&application_name=url%20{store.schema}"
    )
    durability = open_durability(url)
    assert isinstance(durability, PostgresDurability)
    assert durability.schema == store.schema

    async def charge(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("charge", lambda a: {"id": "ch_1"}, step_id="s")
        return commit_for(tx)

    async with durability, store.durability() as holder:
        assert (await durability.with_turn(TurnScope("t", "1"), charge)).checkpoint_version == 1
        assert store.execute("SELECT turn_id FROM ik_turns") == [("1",)]  # in that schema
        sessions = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        assert store.execute(sessions, app_name)[0][0] >= 1
        gate = Gate()
        held = asyncio.create_task(holder.with_turn(TurnScope("t", "2"), gate))
        await asyncio.wait_for(gate.entered.wait(), 5)
        started = time.monotonic()
        with pytest.raises(ThreadBusyError):
            await durability.with_turn(TurnScope("t", "3"), plain)
        assert 0.3 <= time.monotonic() - started < 5  # lock_timeout=0.3, not the default 30
        gate.released.set()
        await held

    listed = await asyncio.to_thread(
        CliRunner().invoke, cli_app, ["receipts", "list", "--db", url, "--json"]
    )
    assert listed.exit_code == 0, listed.output
    assert [json.loads(line)["key"] for line in listed.output.splitlines()] == ["charge"]


def test_adapter_parameters_in_a_url_are_taken_off_and_checked() -> None:
    dsn, options = _take_url_options(
        "postgresql://u@h/db?application_name=a%20b&schema=my%20app&options=-c%20x%3D1",
        ("schema", "lock_timeout"),
    )
    assert dsn == "postgresql://u@h/db?application_name=a%20b&options=-c%20x%3D1"
    assert options == {"schema": "my app"}
    for bad, why in [
        ("postgresql://h/db?schema=a&schema=b", "twice"),
        ("postgresql://h/db?lock_timeout=soon", "number of seconds"),
        ("postgresql://h/db?lock_timeout=-1", "number of seconds"),
    ]:
        with pytest.raises(ValueError, match=why):
            open_durability(bad)


def test_a_malformed_dsn_fails_at_once_with_a_store_error(postgres_dsn: str) -> None:
    """Not a 30-second pool timeout that blames the server: libpq refuses these before
    any connection is tried."""
    started = time.monotonic()
    with pytest.raises(StoreError, match="understood by open_durability"):
        PostgresDurability(with_query(postgres_dsn, "schema=billing"))
    with pytest.raises(StoreError, match="not a valid PostgreSQL connection string"):
        PostgresDurability(with_query(postgres_dsn, "no_such_option=1"))
    with pytest.raises(StoreError, match="not a valid PostgreSQL connection string"):
        open_durability("postgresql://[::1/db")
    assert time.monotonic() - started < 1


async def test_an_unreachable_server_is_a_store_error() -> None:
    durability = PostgresDurability(
        "postgresql://postgres@127.0.0.1:1/none?connect_timeout=1", pool_timeout=1.0
    )
    with pytest.raises(StoreError, match="cannot connect"):
        await durability.__aenter__()


def test_importing_without_psycopg_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "try:\n"
        "    import intention_kernel.durability.postgres\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert "pip install 'intention-kernel[postgres]'" in out.stdout


# -- the thread lock -------------------------------------------------------------------------


async def test_a_lease_excludes_a_second_holder_until_it_lapses(store: Store) -> None:
    """A turn's lease keeps every other worker off its thread. Once it lapses (its holder
    paused past its expiry), another worker takes the thread and commits, and nothing
    the first holder does afterwards is stored: its commit is refused."""
    async with store.durability() as holder, store.durability(lock_timeout=0.3) as other:
        gate = Gate()
        held = asyncio.create_task(holder.with_turn(TurnScope("t", "first"), gate))
        await asyncio.wait_for(gate.entered.wait(), 5)
        started = time.monotonic()
        with pytest.raises(ThreadBusyError) as busy:
            await other.with_turn(TurnScope("t", "second"), plain)
        assert busy.value.thread_id == "t"
        assert time.monotonic() - started >= 0.3
        # Another thread is not affected.
        assert (await other.with_turn(TurnScope("u", "1"), plain)).checkpoint_version == 1

        store.expire("t")  # the holder's lease lapses, as a paused worker's would
        result = await other.with_turn(TurnScope("t", "second"), plain)
        assert result.checkpoint_version == 1

        gate.released.set()
        with pytest.raises(LeaseLostError):  # its lease is gone: nothing it does commits
            await held
        assert (await holder.with_turn(TurnScope("t", "third"), plain)).checkpoint_version == 2
    turns = store.execute("SELECT turn_id FROM ik_turns WHERE thread_id = 't' ORDER BY version")
    assert turns == [("second",), ("third",)]
    assert store.live_leases() == 0


async def test_a_zero_lock_timeout_bounds_only_the_wait_for_a_busy_thread(store: Store) -> None:
    """``lock_timeout=0`` is no wait for a busy thread, not no wait for a session: turns
    on idle threads commit while the pool opens sessions for them, and a busy thread
    raises ``ThreadLockTimeoutError`` (a ``ThreadBusyError``), never ``StoreError``."""
    async with store.durability(lock_timeout=0, min_pool_size=1, max_pool_size=6) as durability:
        gate = Gate()
        held = asyncio.create_task(durability.with_turn(TurnScope("busy", "1"), gate))
        await asyncio.wait_for(gate.entered.wait(), 5)
        results = await asyncio.gather(
            *(durability.with_turn(TurnScope(f"idle-{n}", "1"), plain) for n in range(4)),
            return_exceptions=True,
        )
        assert [getattr(r, "checkpoint_version", r) for r in results] == [1, 1, 1, 1]
        busy = await asyncio.gather(
            *(durability.with_turn(TurnScope("busy", f"2-{n}"), plain) for n in range(4)),
            return_exceptions=True,
        )
        assert [type(b) for b in busy] == [ThreadLockTimeoutError] * 4
        gate.released.set()
        assert (await held).checkpoint_version == 1


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0])
@pytest.mark.parametrize("option", ["lock_timeout", "pool_timeout"])
def test_a_wait_that_never_ends_or_is_negative_is_refused(
    option: str, value: float, postgres_dsn: str
) -> None:
    options: dict[str, Any] = {option: value}
    with pytest.raises(ValueError, match=option):
        PostgresDurability(postgres_dsn, **options)
    if option == "lock_timeout":
        with pytest.raises(ValueError, match=option):
            open_durability(with_query(postgres_dsn, f"lock_timeout={value}"))


async def test_a_replay_takes_no_lock_and_waits_for_no_turn(store: Store) -> None:
    """A turn starts in one statement (``ik_start_turn_leased``): a committed turn comes
    back without a lease, so its retry is answered while another turn holds the thread,
    and the holder's lease is untouched; a new turn on that thread still waits."""
    async with store.durability() as holder, store.durability(lock_timeout=0.3) as other:
        done = await holder.with_turn(TurnScope("t", "done"), plain)
        gate = Gate()
        held = asyncio.create_task(holder.with_turn(TurnScope("t", "running"), gate))
        await asyncio.wait_for(gate.entered.wait(), 5)
        holding = store.lease("t")
        assert holding is not None
        started = time.monotonic()
        again = await other.with_turn(TurnScope("t", "done"), plain)
        assert again.replayed and again.turn_id == "done" and not done.replayed
        assert time.monotonic() - started < 0.3  # not a wait for the lock
        assert store.lease("t") == holding  # the replay took no lease
        with pytest.raises(ThreadBusyError):
            await other.with_turn(TurnScope("t", "new"), plain)
        gate.released.set()
        assert (await held).checkpoint_version == 2
        # The turn that waited for the lease reads what the holder committed as it let
        # go (the second query of ik_start_turn_leased takes its own snapshot).
        assert (await other.with_turn(TurnScope("t", "new"), plain)).checkpoint_version == 3
    assert store.live_leases() == 0


async def test_a_cancelled_turn_lets_go_of_its_lease_at_once(store: Store) -> None:
    async with store.durability(max_pool_size=2) as durability:
        gate = Gate()
        cancelled = asyncio.create_task(durability.with_turn(TurnScope("t", "1"), gate))
        await asyncio.wait_for(gate.entered.wait(), 5)
        waiting = asyncio.create_task(durability.with_turn(TurnScope("t", "2"), plain))
        await asyncio.sleep(0.05)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert (await waiting).checkpoint_version == 1
        for i in range(20):
            await durability.with_turn(TurnScope(f"t{i % 3}", f"x{i}"), plain)
        assert store.live_leases() == 0
    async with store.durability(lock_timeout=0.2) as other:
        assert (await other.with_turn(TurnScope("t", "3"), plain)).checkpoint_version == 2


async def test_no_statement_relies_on_a_sessions_settings(store: Store) -> None:
    """Behind a transaction pooler a statement may run on a server connection that
    another client configured. Every pooled session here is set to look in another
    schema (``search_path``) first: turns, effects, the journal, the outbox and
    resolutions still work, since every statement names the adapter's schema."""
    async with store.durability(min_pool_size=2, max_pool_size=2) as durability:
        async with durability.session() as a, durability.session() as b:
            for conn in (a, b):
                await conn.execute("SET search_path TO pg_catalog")

        async def work(tx: TurnTransaction) -> TurnCommit:
            assert await tx.recorded("round", _one) == 1
            await tx.run_effect("charge", lambda authority: "paid", step_id="s")
            return commit_for(tx)

        assert (await durability.with_turn(TurnScope("t", "1"), work)).checkpoint_version == 1
        assert [r.status for r in await durability.list_receipts()] == ["completed"]
        assert len(await durability.read_outbox()) == 1
        async with durability.session() as conn:
            path = await (await conn.execute("SHOW search_path")).fetchone()
        assert path == ("pg_catalog",)  # the setting was there all along


async def test_a_text_array_reaches_the_server_as_psycopgs_list_would(store: Store) -> None:
    """The commit's arrays go through the adapter's own binary dumper. Each one
    must reach the server as psycopg's list dumper sends it: same elements, same
    order, any character the ``text`` type takes. A NUL is refused by the server,
    as it is in psycopg's list, and the session goes on."""
    values = [
        "",
        "plain",
        'a "quoted" {brace}, comma',
        "back\\slash\\",
        "NULL",
        " spaced ",
        "é ü ß 日本語 🎉",
        '{"json": [1, "two", null]}',
        "x" * 100_000,
    ]
    async with store.durability() as durability:
        await durability.recorder()
        async with durability.session() as conn:
            for case in ([values[0]], values, values[::-1], ["only"]):
                sent = await (
                    await conn.execute(
                        "SELECT %b::text[], %b::text[] = %b::text[], cardinality(%b::text[])",
                        (TextArray(case), TextArray(case), case, TextArray(case)),
                    )
                ).fetchone()
                assert sent == (case, True, len(case))
            empty = await (await conn.execute("SELECT %b::text[]", (TextArray(),))).fetchone()
            assert empty == ([],)
            refused = []
            for array in (["a\x00b"], TextArray(["a\x00b"])):
                with pytest.raises(psycopg.DataError, match="0x00") as info:
                    await conn.execute("SELECT %b::text[]", (array,))
                refused.append(type(info.value))
            assert refused[0] is refused[1]
            assert await (await conn.execute("SELECT 1")).fetchone() == (1,)


async def _one() -> int:
    return 1


async def test_no_session_is_held_while_the_model_or_a_capability_runs(store: Store) -> None:
    """With a pool of one session, a turn whose interpreter, capability and provider
    call each run a whole other turn (on another thread) still commits: no session
    is held from one statement to the next. And no session is idle in a transaction."""
    seen: list[str] = []

    async with store.durability(min_pool_size=1, max_pool_size=1, pool_timeout=3) as durability:

        async def other_turn(moment: str) -> None:
            scope = TurnScope(f"other-{len(seen)}", "1")
            assert (await durability.with_turn(scope, plain)).checkpoint_version == 1
            rows = store.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                " AND state LIKE 'idle in transaction%%'",
                store.schema,
            )
            assert rows == [(0,)], moment
            seen.append(moment)

        async def interpret(request: InterpretationRequest) -> Interpretation:
            await other_turn("the interpretation")
            return Interpretation(intents=[Intent("probe.pay", {})])

        async def provider(authority: EffectAuthority) -> str:
            await other_turn("the provider call")
            return "paid"

        @capability("probe.pay", effect="write", confirmation="required")
        async def pay(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            await other_turn("the capability")
            effect = await ctx.run_effect("once", provider)
            return CapabilityResult(value=effect.value)

        class Interpreter:
            async def interpret(self, request: InterpretationRequest) -> Interpretation:
                return await interpret(request)

        kernel = Kernel(Agent("probe", "1", [pay], Interpreter()), durability)
        await kernel.turn("t", "1", "pay")
        result = await kernel.turn("t", "2", answer="accept")
    assert [step.status for step in result.steps] == ["completed"]
    assert "the provider call" in seen and "the capability" in seen
    assert "the interpretation" in seen


async def test_turns_waiting_for_the_only_session_each_get_it_in_turn(store: Store) -> None:
    """The adapter keeps an idle session at hand for the next statement, but never
    while a borrower waits in the pool for one. With one session, eight turns on
    eight threads all commit; none waits out ``pool_timeout``."""
    async with store.durability(min_pool_size=1, max_pool_size=1, pool_timeout=3) as durability:
        results = await asyncio.gather(
            *(durability.with_turn(TurnScope(f"t{n}", "1"), plain) for n in range(8))
        )
    assert [r.checkpoint_version for r in results] == [1] * 8


async def _queue_order(
    store: Store, *, pool_timeout: float, between: float, a_reads: bool
) -> list[str]:
    """Who gets the only session, in order, once a block frees it.

    While the block holds it, turn ``a``, back from its model, queues to write; then,
    ``between`` seconds later, turn ``b`` queues to commit; then three turns queue
    to start. With ``a_reads``, ``a`` reads first and commits after, a second
    statement. A starting turn's name is written once it started and again, with
    ``+``, once it committed; ``a`` and ``b``'s once they committed."""
    order: list[str] = []
    models = {"a": asyncio.Event(), "b": asyncio.Event()}
    async with store.durability(
        min_pool_size=1, max_pool_size=1, pool_timeout=pool_timeout
    ) as durability:

        async def held(tx: TurnTransaction) -> TurnCommit:
            name = tx.scope.thread_id
            await models[name].wait()  # its model: it holds no session meanwhile
            if name == "a" and a_reads:
                await durability.load_checkpoint("a")
            return await plain(tx)

        async def started(tx: TurnTransaction) -> TurnCommit:
            order.append(tx.scope.thread_id)  # its lease and read are done
            return await plain(tx)

        async def run(name: str, fn: Callable[[TurnTransaction], Awaitable[TurnCommit]]) -> None:
            await durability.with_turn(TurnScope(name, "1"), fn)
            order.append(name if fn is held else f"+{name}")

        turns = [asyncio.create_task(run(name, held)) for name in models]
        while len(store.execute("SELECT 1 FROM ik_leases")) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        async with durability.session():
            models["a"].set()
            await asyncio.sleep(between)  # a queues
            models["b"].set()
            await asyncio.sleep(0.2)  # b queues to commit
            turns += [asyncio.create_task(run(f"new{n}", started)) for n in range(3)]
            await asyncio.sleep(0.2)  # three turns queue to start, last
        await asyncio.wait_for(asyncio.gather(*turns), 20)
    return order


NEW = ["new0", "new1", "new2"]


async def test_a_freed_session_goes_to_a_start_then_to_the_turn_that_waited_first(
    store: Store,
) -> None:
    """Borrowers wait for a session in the adapter's queue, not first come. Turns
    that wait to start go first: one statement, and their model runs with no
    session. A started turn keeps the place of its first wait for all its writes.

    Here a's read, b's commit, then a's commit run after the starts. Then the
    started turns commit. First come would serve a's commit after theirs. A burst's
    turns would then all finish near its end, and start their next model together."""
    order = await _queue_order(store, pool_timeout=10, between=0.2, a_reads=True)
    assert sorted(order[:3]) == NEW, order
    assert order[3:5] == ["b", "a"], order  # b took the session between a's statements
    assert sorted(order[5:]) == [f"+{name}" for name in NEW], order


async def test_a_start_jumps_ahead_of_a_waiting_turn_for_a_bounded_time(store: Store) -> None:
    """A start goes ahead of a started turn only if that turn first waited less than
    the head start before it: at most 5 s, or half of ``pool_timeout``. So starts
    that keep coming cannot hold a started turn's commit for ever."""
    # A head start of 3 s. Turn a waits 3.5 s before the starts queue, b 0.2 s:
    # a margin of half a second and more either way.
    order = await _queue_order(store, pool_timeout=6, between=3.5, a_reads=False)
    assert order[0] == "a", order
    assert sorted(order[1:4]) == NEW, order
    assert order[4] == "b", order


async def test_a_turn_that_waits_pool_timeout_for_a_session_fails_and_writes_nothing(
    store: Store,
) -> None:
    """A borrower that waits ``pool_timeout`` in the queue gets ``StoreError``, not a
    session later. Its turn took nothing: the thread stays free, and nothing is
    written. One that waits less gets the session once it is free."""
    async with store.durability(min_pool_size=1, max_pool_size=1, pool_timeout=0.5) as durability:
        async with durability.session():
            began = time.monotonic()
            with pytest.raises(StoreError, match=r"couldn't get a connection after 0\.50 sec"):
                await durability.with_turn(TurnScope("t", "1"), plain)
            waited = time.monotonic() - began
            later = asyncio.create_task(durability.with_turn(TurnScope("t", "2"), plain))
            await asyncio.sleep(0.2)
        assert (await asyncio.wait_for(later, 5)).checkpoint_version == 1
        assert store.execute("SELECT turn_id FROM ik_turns") == [("2",)]
        assert store.live_leases() == 0
    assert 0.5 <= waited < 2.0, waited  # the timeout, and a sweep's period at most


async def test_a_transaction_a_session_block_leaves_open_never_holds_a_turn(
    store: Store,
) -> None:
    """A session block that leaves a transaction open gives its session back to the
    pool, which rolls it back. The next statement runs on a session that is idle, so
    the turn that follows commits, and what the block did is gone."""
    async with store.durability(min_pool_size=1, max_pool_size=1) as durability:
        await durability.recorder()
        async with durability.session() as conn:
            await conn.execute("BEGIN")
            await conn.execute(
                sql.SQL("CREATE TABLE {}.left_open (n int)").format(sql.Identifier(store.schema))
            )
        result = await durability.with_turn(TurnScope("t", "1"), plain)
        assert result.checkpoint_version == 1
        # Seen from a session of another program, before the adapter closes.
        assert store.execute("SELECT count(*) FROM ik_turns") == [(1,)]
        assert store.execute("SELECT to_regclass('left_open') IS NULL") == [(True,)]


# -- fencing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prior_turns", "winner_turn_id"),
    [(0, "winner"), (1, "winner"), (1, "stale")],
    ids=["first-commit", "later-commit", "same-turn-id"],
)
async def test_a_stale_commit_is_fenced(
    store: Store, monkeypatch: pytest.MonkeyPatch, prior_turns: int, winner_turn_id: str
) -> None:
    async with store.durability() as honest, store.durability() as rogue:
        # The rogue adapter skips the thread lock, as if its session had been lost.
        await skip_the_lock(monkeypatch, rogue)
        for i in range(prior_turns):
            await honest.with_turn(TurnScope("t", f"prior-{i}"), plain)
        gate = Gate()
        stale = asyncio.create_task(rogue.with_turn(TurnScope("t", "stale"), gate))
        await asyncio.wait_for(gate.entered.wait(), 5)  # it has loaded the thread
        winner = await honest.with_turn(TurnScope("t", winner_turn_id), plain)
        assert winner.checkpoint_version == prior_turns + 1
        gate.released.set()
        with pytest.raises(FencedCommitError) as fenced:
            await stale
        assert (fenced.value.thread_id, fenced.value.turn_id) == ("t", "stale")
        turns = store.execute("SELECT turn_id, version FROM ik_turns ORDER BY version")
        assert turns == [(f"prior-{i}", i + 1) for i in range(prior_turns)] + [
            (winner_turn_id, prior_turns + 1)
        ]
        events = await read_all(honest)
        assert [e.turn_id for e in events] == [t for t, _ in turns]


@pytest.mark.parametrize("on_the_loop", [False, True], ids=["sync-provider", "async-provider"])
async def test_an_outcome_write_held_up_on_the_server_survives_the_turns_cancellation(
    store: Store, monkeypatch: pytest.MonkeyPatch, on_the_loop: bool
) -> None:
    """Unlike SQLite's hops, a PostgreSQL statement does not outlive a cancellation of
    its caller (psycopg cancels it on the server). So the adapter writes a receipt's
    outcome again, in a task of its own, when a cancellation cut the write short.
    Here the write waits for a row lock another session holds while the turn is
    cancelled: it still lands once the lock goes. A sync provider's cancellation
    lands as its thread returns; an async one's, in the write itself."""
    loop = asyncio.get_running_loop()
    running: list[asyncio.Task[TurnResult]] = []
    unlocking: list[asyncio.Task[Any]] = []  # held, so that no task is collected mid-way
    blocker = await psycopg.AsyncConnection.connect(store.dsn, autocommit=True)

    def charge(authority: EffectAuthority) -> dict[str, str]:
        loop.call_soon(running[0].cancel)  # lands while the outcome write waits
        return {"charged": authority.key}

    async def charge_on_the_loop(authority: EffectAuthority) -> dict[str, str]:
        return charge(authority)

    provider = charge_on_the_loop if on_the_loop else charge

    try:
        async with store.durability() as durability:
            recorder = await durability.recorder()
            original = recorder.claim_effect

            async def claim_then_lock(thread_id: str, key: str, plan: Any) -> Any:
                # The receipt is prepared (committed): lock its row for 0.3 s.
                decided = await original(thread_id, key, plan)
                await blocker.execute("BEGIN")
                await blocker.execute(
                    sql.SQL("SELECT 1 FROM {}.ik_receipts WHERE thread_id = 't' FOR UPDATE").format(
                        sql.Identifier(store.schema)
                    )
                )
                loop.call_later(0.3, lambda: unlocking.append(loop.create_task(rollback())))
                return decided

            async def rollback() -> None:
                await blocker.execute("ROLLBACK")

            monkeypatch.setattr(recorder, "claim_effect", claim_then_lock)

            async def op(tx: TurnTransaction) -> TurnCommit:
                await tx.run_effect("charge", provider, step_id="s")
                return commit_for(tx)

            running.append(asyncio.create_task(durability.with_turn(TurnScope("t", "1"), op)))
            with pytest.raises(asyncio.CancelledError):
                await running[0]
            [receipt] = await durability.list_receipts(thread_id="t")
            assert receipt.status == "completed", receipt
            assert receipt.value == {"charged": "charge"}
            await asyncio.gather(*unlocking)
    finally:
        await blocker.close()


async def test_a_turn_without_its_lease_writes_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that runs a turn without the thread's lease (it lost it) is refused at
    every write: its receipt prepare (so its provider is never called), its journal
    entry and its commit. Nothing of it is stored."""
    async with store.durability() as rogue:
        await skip_the_lock(monkeypatch, rogue)
        calls: list[str] = []

        async def effect(tx: TurnTransaction) -> TurnCommit:
            await tx.run_effect("charge", lambda authority: calls.append("charge"), step_id="s")
            raise AssertionError("a prepare without the lease must be refused")

        async def journal(tx: TurnTransaction) -> TurnCommit:
            await tx.recorded("round", _one)
            raise AssertionError("a journal write without the lease must be refused")

        for operation in (effect, journal, plain):
            with pytest.raises(LeaseLostError) as refused:
                await rogue.with_turn(TurnScope("t", "1"), operation)
            assert refused.value.thread_id == "t"
        assert calls == []
        assert await rogue.list_receipts() == []
        assert await rogue.load_checkpoint("t") is None
    assert store.execute("SELECT count(*) FROM ik_journal") == [(0,)]
    assert store.execute("SELECT count(*) FROM ik_turns") == [(0,)]


async def test_effects_gathered_in_one_turn_share_its_session_safely(store: Store) -> None:
    async def provider(authority: EffectAuthority) -> str:
        await asyncio.sleep(0.01)
        return authority.key

    async def gathered(tx: TurnTransaction) -> TurnCommit:
        keys = [f"k{i}" for i in range(6)]
        effects = await asyncio.gather(*(tx.run_effect(k, provider, step_id=k) for k in keys))
        assert [e.value for e in effects] == keys
        return commit_for(tx)

    async with store.durability() as durability:
        await durability.with_turn(TurnScope("t", "1"), gathered)
        receipts = await durability.list_receipts()
    assert sorted((r.key, r.status) for r in receipts) == [(f"k{i}", "completed") for i in range(6)]


# -- outbox positions ------------------------------------------------------------------------


async def test_outbox_positions_never_skip_an_event_under_concurrent_committers(
    store: Store,
) -> None:
    """A relay polling while many sessions commit sees every event exactly once.

    A trigger sleeps after each event insert, so transactions commit long after
    they wrote their events and in a different order: a position taken at insert
    time (a sequence) would let the relay move past events that commit later.
    """
    adapters = [store.durability(max_pool_size=4) for _ in range(4)]
    for adapter in adapters:
        await adapter.__aenter__()
    store.execute(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_sleep(random() * 0.02); RETURN NULL; END $$"
    )
    store.execute(
        "CREATE TRIGGER slow_commit AFTER INSERT ON ik_outbox "
        "FOR EACH STATEMENT EXECUTE FUNCTION slow_commit()"
    )
    relay, seen, done = adapters[0], list[OutboxEvent](), asyncio.Event()

    async def poll() -> None:
        while not done.is_set():
            seen.extend(await read_all(relay, seen[-1].position if seen else None))
            await asyncio.sleep(0.001)

    async def committer(adapter: Durability, worker: int) -> None:
        for i in range(12):
            events = tuple(EventDraft("e", {"i": i, "n": n}) for n in range(3))

            async def operation(tx: TurnTransaction, events: Any = events) -> TurnCommit:
                return commit_for(tx, events)

            await adapter.with_turn(TurnScope(f"t{worker}", f"{i}"), operation)

    try:
        polling = asyncio.create_task(poll())
        await asyncio.gather(
            *(committer(adapters[w % 4], w) for w in range(16)), *(read_all(a) for a in adapters)
        )
        done.set()
        await polling
        seen.extend(await read_all(relay, seen[-1].position if seen else None))
    finally:
        for adapter in adapters:
            await adapter.aclose()
    total = 16 * 12 * 3
    assert [e.position for e in seen] == list(range(1, total + 1))
    assert len({e.id for e in seen}) == total
    for worker in range(16):
        mine = [e for e in seen if e.thread_id == f"t{worker}"]
        assert [e.seq for e in mine] == list(range(1, len(mine) + 1))
        assert [(e.turn_id, e.payload["n"]) for e in mine] == [
            (str(i), n) for i in range(12) for n in range(3)
        ]


async def test_a_corrupted_outbox_payload_is_a_typed_error(store: Store) -> None:
    async with store.durability() as durability:
        await durability.with_turn(TurnScope("t", "1"), plain)
        store.execute("UPDATE ik_outbox SET payload = '{not json'")
        with pytest.raises(CorruptRecordError):
            await durability.read_outbox()


# -- lost connections ------------------------------------------------------------------------


async def test_a_lease_lost_before_commit_leaves_nothing_and_the_retry_works(
    store: Store,
) -> None:
    calls: list[str] = []

    def charge(authority: EffectAuthority) -> dict[str, int]:
        calls.append(authority.key)
        return {"ok": 1}

    async def doomed(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("charge", charge, step_id="s")
        store.expire("t")
        return commit_for(tx)

    async def retried(tx: TurnTransaction) -> TurnCommit:
        effect = await tx.run_effect("charge", lambda a: calls.append("again"), step_id="s")
        assert effect.value == {"ok": 1}
        return commit_for(tx)

    async with store.durability() as durability:
        with pytest.raises(LeaseLostError):
            await durability.with_turn(TurnScope("t", "1"), doomed)
        assert await durability.load_checkpoint("t") is None
        assert await durability.read_outbox() == []
        result = await durability.with_turn(TurnScope("t", "1"), retried)
        assert (result.replayed, result.checkpoint_version) == (False, 1)
        assert calls == ["charge"]
        [receipt] = await durability.list_receipts()
        assert receipt.status == "completed"


async def test_an_outcome_known_after_the_lease_lapsed_is_still_recorded(
    store: Store,
) -> None:
    """The lease lapses during the provider call: the turn cannot commit, but the
    completed write is recorded (fenced by its attempt, not the lease), so the retried
    delivery replays it instead of failing closed as uncertain."""
    calls: list[str] = []

    def provider(authority: EffectAuthority) -> dict[str, bool]:
        calls.append(authority.key)
        if len(calls) == 1:
            store.expire("t")
        return {"charged": True}

    async def charge(tx: TurnTransaction) -> TurnCommit:
        effect = await tx.run_effect("charge", provider, step_id="s")
        assert effect.value == {"charged": True}
        return commit_for(tx)

    async with store.durability(max_pool_size=1, pool_timeout=5) as durability:
        with pytest.raises(LeaseLostError):  # its lease is gone: the turn does not commit
            await durability.with_turn(TurnScope("t", "1"), charge)
        [receipt] = await durability.list_receipts()
        assert (receipt.status, receipt.value) == ("completed", {"charged": True})
        assert await durability.load_checkpoint("t") is None
        retried = await durability.with_turn(TurnScope("t", "1"), charge)
        assert (retried.replayed, retried.checkpoint_version) == (False, 1)
        assert calls == ["charge"]
        assert store.live_leases() == 0


async def test_an_outcome_recorded_late_never_overwrites_what_another_turn_decided(
    store: Store,
) -> None:
    """The same, but while the provider still runs another worker takes the thread and
    finds the receipt prepared: it makes it uncertain, and the late write is refused."""
    async with store.durability() as durability, store.durability() as other:
        calls: list[str] = []

        async def sees_it_prepared(tx: TurnTransaction) -> TurnCommit:
            with pytest.raises(EffectUncertainError):
                await tx.run_effect("charge", lambda a: calls.append("other"), step_id="s")
            return commit_for(tx)

        async def provider(authority: EffectAuthority) -> dict[str, bool]:
            calls.append(authority.key)
            store.expire("t")
            await other.with_turn(TurnScope("t", "2"), sees_it_prepared)
            return {"charged": True}

        async def charge(tx: TurnTransaction) -> TurnCommit:
            await tx.run_effect("charge", provider, step_id="s")
            return commit_for(tx)

        with pytest.raises(FencedCommitError):
            await durability.with_turn(TurnScope("t", "1"), charge)
        [receipt] = await durability.list_receipts()
        assert receipt.status == "uncertain"
        assert calls == ["charge"]
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.version == 1  # the other turn's


async def test_a_receipt_whose_attempt_may_still_run_cannot_be_resolved_as_not_applied(
    store: Store,
) -> None:
    """The lease lapses while the provider call runs: the live ``prepared`` receipt now
    sits on a free thread, as a dead attempt's would. An operator (another
    worker) is refused "not applied", which would let a retry call the provider a
    second time; the live attempt then records its outcome and the retry replays it."""
    calls: list[str] = []
    killed, release = asyncio.Event(), asyncio.Event()

    async def provider(authority: EffectAuthority) -> dict[str, bool]:
        calls.append(authority.key)
        if len(calls) == 1:
            store.expire("t")
            killed.set()
            await release.wait()  # still charging while the operator looks
        return {"charged": True}

    async def charge(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("charge", provider, step_id="s")
        return commit_for(tx)

    async with store.durability() as durability, store.durability() as operator:
        running = asyncio.create_task(durability.with_turn(TurnScope("t", "1"), charge))
        await asyncio.wait_for(killed.wait(), 10)
        [receipt] = await operator.list_receipts(thread_id="t")
        assert receipt.status == "prepared"
        with pytest.raises(ReceiptStateError, match="may still be running"):
            await operator.resolve_receipt("t", "charge", applied=False, note="not seen yet")
        [still] = await operator.list_receipts(thread_id="t")
        assert (still.status, still.resolution) == ("prepared", None)
        assert [e.type for e in await operator.read_outbox(thread_id="t")] == []
        release.set()
        with pytest.raises(LeaseLostError):  # its lease is gone: the turn does not commit
            await running
        [receipt] = await operator.list_receipts(thread_id="t")
        assert (receipt.status, receipt.value) == ("completed", {"charged": True})
        retried = await durability.with_turn(TurnScope("t", "1"), charge)
        assert (retried.replayed, retried.checkpoint_version) == (False, 1)
    assert calls == ["charge"]


async def retry_until_served(
    durability: Durability, scope: TurnScope, operation: Callable[[TurnTransaction], Any]
) -> TurnResult:
    """Deliver a turn again and again while the store fails (or the thread is still
    taken by a lease that could not be released), for up to 30 seconds."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await durability.with_turn(scope, operation)
        except (StoreError, ThreadBusyError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_a_lost_commit_acknowledgement_is_resolved_by_replay(store: Store) -> None:
    """A proxy lets the commit reach the server and drops the server's answer with the
    connection: the turn is durable, the worker sees a connection error. The retry of
    the same turn ID replays it; nothing runs twice and nothing is missing."""
    calls: list[str] = []

    def provider(authority: EffectAuthority) -> dict[str, str]:
        calls.append(authority.key)
        return {"id": authority.key}

    runs: list[str] = []

    async def charge(tx: TurnTransaction) -> TurnCommit:
        runs.append(tx.scope.turn_id)
        await tx.run_effect(f"charge:{tx.scope.turn_id}", provider, step_id="s")
        return commit_for(tx)

    async with (
        TcpProxy.to(store.dsn) as proxy,
        store.durability(via=proxy, min_pool_size=2) as durability,
    ):
        await durability.with_turn(TurnScope("t", "1"), charge)
        proxy.lose_reply_to(b"ik_commit_turn(")
        with pytest.raises(StoreError):
            await durability.with_turn(TurnScope("t", "2"), charge)
        assert proxy.lost_replies == 1
        assert store.execute("SELECT turn_id FROM ik_turns ORDER BY version") == [
            ("1",),
            ("2",),
        ]  # it did commit
        retried = await durability.with_turn(TurnScope("t", "2"), charge)
        assert (retried.replayed, retried.checkpoint_version) == (True, 2)
        assert (await durability.with_turn(TurnScope("t", "3"), charge)).checkpoint_version == 3
        events = await read_all(durability)
        receipts = await durability.list_receipts()
    assert runs == ["1", "2", "3"] and calls == ["charge:1", "charge:2", "charge:3"]
    assert [(e.turn_id, e.position, e.seq) for e in events] == [(str(n), n, n) for n in (1, 2, 3)]
    assert [(r.key, r.status) for r in receipts] == [
        (f"charge:{n}", "completed") for n in (1, 2, 3)
    ]
    assert store.live_leases() == 0


async def test_the_adapter_rides_out_a_server_restart(store: Store) -> None:
    """A proxy closes every connection and refuses new ones for a while, as a restarting
    server does, then accepts again. A turn in flight fails and commits nothing; a turn
    while the server is down fails with ``StoreError`` within ``pool_timeout``; after
    it, the same adapter (not a new one) serves the retried turn, and nothing
    committed before is lost. (The pool reconnects with exponential backoff, so the
    first deliveries after the outage may still fail; they are retried, as a host
    would.)"""
    calls: list[str] = []
    entered, release = asyncio.Event(), asyncio.Event()

    def provider(authority: EffectAuthority) -> dict[str, str]:
        calls.append(authority.key)
        return {"id": authority.key}

    async def charge(tx: TurnTransaction) -> TurnCommit:
        effect = await tx.run_effect(f"charge:{tx.scope.turn_id}", provider, step_id="s")
        assert effect.value == {"id": f"charge:{tx.scope.turn_id}"}
        if tx.scope.turn_id == "2" and not release.is_set():
            entered.set()
            await release.wait()
        return commit_for(tx)

    async with TcpProxy.to(store.dsn) as proxy:
        # The turn in flight cannot let go of its lease while the server is away: the
        # lease lapses on its own, after ``lease_expiry``.
        options = {"min_pool_size": 3, "pool_timeout": 2.0, "lock_timeout": 2.0}
        options["lease_expiry"] = 1.0
        async with store.durability(via=proxy, **options) as durability:
            await durability.with_turn(TurnScope("t", "1"), charge)
            in_flight = asyncio.create_task(durability.with_turn(TurnScope("t", "2"), charge))
            await asyncio.wait_for(entered.wait(), 5)

            await proxy.down()  # the server goes away
            release.set()
            with pytest.raises(StoreError):
                await in_flight
            started = time.monotonic()
            with pytest.raises(StoreError, match="no PostgreSQL session became available"):
                await durability.with_turn(TurnScope("t", "2"), charge)
            assert time.monotonic() - started < 10
            with pytest.raises(StoreError):
                await durability.read_outbox()

            await proxy.up()  # and comes back
            retried = await retry_until_served(durability, TurnScope("t", "2"), charge)
            assert (retried.replayed, retried.checkpoint_version) == (False, 2)

            proxy.cut()  # every idle pooled session dies again; reads come first
            assert len(await read_all(durability)) == 2
            assert (await durability.with_turn(TurnScope("t", "3"), charge)).checkpoint_version == 3
            checkpoint = await durability.load_checkpoint("t")
            receipts = await durability.list_receipts()
            events = await read_all(durability)
    assert proxy.cut_links >= 3
    assert checkpoint is not None and checkpoint.version == 3
    # charge:2 completed before the outage: the retried turn replayed it, no second call.
    assert calls == ["charge:1", "charge:2", "charge:3"]
    assert [(r.key, r.status) for r in receipts] == [
        (f"charge:{n}", "completed") for n in (1, 2, 3)
    ]
    assert [(e.turn_id, e.position) for e in events] == [(str(n), n) for n in (1, 2, 3)]
    assert store.execute("SELECT turn_id, version FROM ik_turns ORDER BY version") == [
        ("1", 1),
        ("2", 2),
        ("3", 3),
    ]


async def test_the_pool_reconnects_after_every_session_was_dropped(store: Store) -> None:
    async with store.durability(min_pool_size=3) as durability:
        await durability.with_turn(TurnScope("t", "1"), plain)
        dropped = store.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            store.schema,
        )
        assert len(dropped) >= 3
        assert (await durability.load_checkpoint("t")) is not None
        assert len(await durability.read_outbox()) == 1
        assert await durability.list_receipts() == []
        assert (await durability.with_turn(TurnScope("t", "2"), plain)).checkpoint_version == 2


def test_hot_path_statements_fit_psycopgs_query_cache() -> None:
    """psycopg converts a query's placeholders once and caches it, but only for
    queries of at most ``MAX_CACHED_STATEMENT_LENGTH`` characters: a longer commit
    statement would be converted again at every turn."""
    from psycopg import _queries

    from intention_kernel.durability import postgres

    hot = {
        "BEGIN_TURN": postgres.BEGIN_TURN,
        "COMMIT_TURN": postgres.COMMIT_TURN,
        "PREPARE_RECEIPT": postgres.PREPARE_RECEIPT,
        "UPDATE_RECEIPT": postgres.UPDATE_RECEIPT,
    }
    too_long = {
        name: len(text)
        for name, text in hot.items()
        if len(text) > _queries.MAX_CACHED_STATEMENT_LENGTH
    }
    assert not too_long, too_long


def _plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _plan_nodes(child)


async def test_a_commits_generic_plan_probes_receipts_and_facts_by_key_not_by_thread(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit function's statements run on generic plans once cached. Each key it
    touches (a receipt it announces, a fact it removes) must be one primary-key probe.
    It must never be a walk over the thread's rows with the key as a filter. That cost
    grew with the thread (300 receipts read per commit at turn 300). Checked on the plans
    PostgreSQL really executes inside the function (``auto_explain``), with
    ``plan_cache_mode = force_generic_plan``."""

    async with store.durability() as durability:
        for n in range(40):  # a thread with 40 receipts and facts
            await durability.with_turn(TurnScope("long", f"t{n}"), _charge_and_record(n))
        statement, captured = await _captured_commit(
            durability, monkeypatch, TurnScope("long", "last"), _charge_and_record(0, drop=7)
        )
    # The captured commit announces a write (turn 0's receipt, reused) and removes a fact.
    assert captured["announced"] == ["k0"] and captured["removed_facts"] == ["fact.7"]

    plans: list[dict[str, Any]] = []

    def keep_plan(notice: psycopg.errors.Diagnostic) -> None:
        text = notice.message_primary or ""
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1])["Plan"])

    with psycopg.connect(store.dsn, autocommit=True) as conn:
        conn.add_notice_handler(keep_plan)
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("LOAD 'auto_explain'")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_analyze = on",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_format = json",
            "client_min_messages = log",
        ):
            conn.execute(f"SET {setting}")
        with conn.transaction(force_rollback=True):
            revive_lease(conn, captured)
            row = conn.execute(statement, captured).fetchone()
    assert row is not None and row[0] is not None  # it committed (then rolled back)
    nodes = [node for plan in plans for node in _plan_nodes(plan)]
    probes = [n for n in nodes if n.get("Relation Name") in ("ik_receipts", "ik_facts")]
    assert {n["Relation Name"] for n in probes} == {"ik_receipts", "ik_facts"}
    walked = {
        n["Relation Name"]: n.get("Rows Removed by Filter")
        for n in probes
        if n.get("Rows Removed by Filter")
    }
    assert walked == {}


async def test_every_combination_of_commit_parts_runs_and_writes_what_its_parts_name(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit function skips the parts a turn has nothing for. Every combination of
    parts, on a real commit's parameters (a message appended, a fact recorded, one
    removed, a receipt to mark announced, a rewrite, a trim), must write exactly what
    its parts name. Each call is rolled back afterwards."""
    from itertools import combinations

    from intention_kernel.durability import postgres

    async with store.durability() as durability:
        for n in range(3):
            await durability.with_turn(TurnScope("t", f"t{n}"), _charge_and_record(n))
        _, captured = await _captured_commit(
            durability, monkeypatch, TurnScope("t", "last"), _charge_and_record(0, drop=1)
        )
    assert captured["removed_facts"] == ["fact.1"] and captured["fact_keys"] == ["fact.0"]
    # Every part with something to do: a message appended, the oldest one trimmed (one
    # kept), turn 0's receipt marked announced (as if turn 0 had never committed), a
    # rewrite, and the turn's journal deleted.
    captured.update(
        messages=["m"],
        keep_messages=1,
        trim_messages=1,
        mark_announced=["k0"],
        rewrite=True,
        journaled=True,
    )
    # What a commit sends for a part with nothing to do (see ``commit_turn``).
    nothing: dict[str, dict[str, Any]] = {
        "trim": {"trim_messages": 0},
        "rewrite": {"rewrite": False},
        "messages": {"messages": None},
        "removed_facts": {"removed_facts": None},
        "facts": {"fact_keys": None, "fact_bodies": None},
        "mark_announced": {"mark_announced": None},
        "journal": {"journaled": False},
    }
    names = list(nothing)
    counted = (
        "SELECT (SELECT count(*) FROM ik_messages), (SELECT count(*) FROM ik_facts),"
        " (SELECT count(*) FROM ik_facts WHERE key = 'fact.1'),"
        " (SELECT count(*) FROM ik_receipts WHERE announced)"
    )
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        conn.execute("INSERT INTO ik_messages VALUES ('t', 0, 'old')")  # for the trim
        before = _one_row(conn, counted)
        assert before[0] >= 1 and before[1] == 3 and before[2] == 1
        for size in range(len(names) + 1):
            for chosen in combinations(names, size):
                parts = frozenset(chosen)
                params = dict(captured, first=False)
                for name in set(names) - parts:
                    params.update(nothing[name])
                with conn.transaction(force_rollback=True):
                    revive_lease(conn, params)
                    row = conn.execute(postgres.COMMIT_TURN, params).fetchone()
                    assert row is not None and row[0] is not None, parts  # committed
                    messages, facts, removed_left, announced = _one_row(conn, counted)
                if "rewrite" in parts:
                    expected_messages = int("messages" in parts)
                else:
                    # The trim's range ends below the newest message: with one appended
                    # and one kept, it is the old row at seq 0.
                    trimmed = {"trim", "messages"} <= parts
                    expected_messages = before[0] + ("messages" in parts) - trimmed
                assert messages == expected_messages, parts
                # A rewrite keeps only the turn's own facts: fact.0, stored already.
                if "rewrite" in parts:
                    expected_facts = int("facts" in parts)
                else:
                    expected_facts = before[1] - ("removed_facts" in parts)
                assert facts == expected_facts, parts
                assert removed_left == int(not {"removed_facts", "rewrite"} & parts)
                assert announced == before[3] + ("mark_announced" in parts), parts
                with conn.transaction(force_rollback=True):  # a first turn's, refused
                    revive_lease(conn, params)
                    refused = conn.execute(postgres.COMMIT_TURN, {**params, "first": True})
                    # The lease held, the version moved.
                    assert refused.fetchone() == (None, True), parts
        assert _one_row(conn, counted) == before  # every statement was rolled back


async def _captured_commit(
    durability: PostgresDurability,
    monkeypatch: pytest.MonkeyPatch,
    scope: TurnScope,
    operation: Callable[[TurnTransaction], Any],
) -> tuple[str, dict[str, Any]]:
    """The commit statement and parameters of the turn ``operation`` would commit,
    stopped before they reach the server (caught at the driver's cursor)."""
    captured: list[tuple[str, dict[str, Any]]] = []
    execute = psycopg.AsyncCursor.execute

    async def capture(cursor: Any, query: Any, params: Any = None, **options: Any) -> Any:
        if isinstance(query, str) and "ik_commit_turn(" in query:
            captured.append((query, dict(params)))
            raise RuntimeError("captured")
        return await execute(cursor, query, params, **options)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", capture)
    with pytest.raises(RuntimeError, match="captured"):
        await durability.with_turn(scope, operation)
    monkeypatch.setattr(psycopg.AsyncCursor, "execute", execute)
    (commit,) = captured
    return commit


def revive_lease(conn: psycopg.Connection[Any], captured: dict[str, Any]) -> None:
    """Make the captured turn's lease alive again (its turn let go of it), so that its
    commit statement, run here by hand, passes the fence."""
    conn.execute(
        "UPDATE ik_leases SET epoch = %(lease_epoch)s, owner = %(lease_owner)s,"
        " expires_at = clock_timestamp() + interval '1 hour'"
        " WHERE thread_id = %(thread_id)s AND kind = 'turn'",
        captured,
    )


def _one_row(conn: psycopg.Connection[Any], query: str) -> tuple[Any, ...]:
    row = conn.execute(query).fetchone()
    assert row is not None
    return tuple(row)


def _charge_and_record(n: int, drop: int | None = None) -> Callable[[TurnTransaction], Any]:
    """A raw turn that runs the effect ``k{n}``, announces it, records ``fact.{n}`` and
    removes ``fact.{drop}``."""

    async def operation(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect(f"k{n}", lambda authority: {"n": n}, step_id="s")
        facts = dict(tx.checkpoint.facts) if tx.checkpoint else {}
        evidence = Evidence("c.charge", tx.scope.turn_id, "s")
        facts[f"fact.{n}"] = FactRecord(f"fact.{n}", n, 1, evidence)
        if drop is not None:
            del facts[f"fact.{drop}"]
        event = EventDraft("effect.completed", {"key": f"k{n}"})
        return minimal_commit(tx, (event,), facts=facts, announced=(f"k{n}",))

    return operation


async def test_listing_unsettled_receipts_uses_its_index_even_on_a_generic_plan(
    store: Store,
) -> None:
    """The operator's query for uncertain receipts reads the partial index of unsettled
    receipts, not every receipt ever written, even planned generically (as a pooler
    with prepared statements, or a server set so, would plan it)."""
    from intention_kernel.durability.postgres import receipts_query

    async with store.durability(max_pool_size=1) as durability:
        for n in range(30):
            await durability.with_turn(TurnScope(f"t{n}", "1"), _charge_and_record(n))
        assert await durability.list_receipts(status="uncertain") == []
        async with durability.session() as conn, conn.transaction(force_rollback=True):
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            await conn.execute(
                sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(store.schema))
            )
            await conn.execute("SET LOCAL enable_seqscan = off")  # a small table: the index
            query, params = receipts_query(None, ReceiptStatus.UNCERTAIN, None)
            cur = await conn.execute(("EXPLAIN (FORMAT JSON) " + query).encode(), params)
            row = await cur.fetchone()
    assert row is not None
    indexes = {n.get("Index Name") for n in _plan_nodes(row[0][0]["Plan"])}
    assert "ik_receipts_unsettled" in indexes


async def test_a_commit_is_fenced_on_the_owner_the_turn_started_with(store: Store) -> None:
    """A turn whose thread changed owner while it ran (another program writing the
    tables; no turn can, under the thread lock) is refused at commit, as SQLite's is,
    and writes nothing."""

    async def hand_over(tx: TurnTransaction) -> TurnCommit:
        store.execute("UPDATE ik_threads SET tenant_id = 'b' WHERE thread_id = 't'")
        return commit_for(tx)

    async with store.durability() as durability:
        await durability.with_turn(TurnScope("t", "1", tenant_id="a"), plain)
        with pytest.raises(FencedCommitError, match="was not committed") as caught:
            await durability.with_turn(TurnScope("t", "2", tenant_id="a"), hand_over)
        assert (caught.value.thread_id, caught.value.turn_id) == ("t", "2")
    assert store.execute("SELECT tenant_id, version FROM ik_threads") == [("b", 1)]
    assert store.execute("SELECT turn_id FROM ik_turns") == [("1",)]
