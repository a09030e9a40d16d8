"""Shared kit of the proving-ground tests (crash matrix, model check, soak, bad input).

- :class:`LedgerProvider`: the conformance suite's fake payment provider, made
  durable. Every call that reaches it appends one line to a ledger file *before* it
  answers. So a test counts real provider calls by key, even when the calling
  process dies right after the call. It marks ``IN_PROVIDER_AFTER_WRITE`` there.
- :class:`Store`: one SQLite file or one PostgreSQL schema under test. It holds what
  the tests need around the adapter. That is a configuration that worker processes
  open (:func:`open_store`), and raw reads of every table (:meth:`Store.snapshot`).
  Those reads prove that a refused turn wrote nothing. It also holds the committed
  turns.
- :func:`read_ledger`, :func:`read_all_events`: the provider's calls and the outbox.
- :func:`proving_agent`: the billing agent plus ``payments.pay``, a write that pays at
  once (``"capability"`` mode), so that a thread's first turn writes and one turn can
  run two effects.
- :func:`migration_4_gives_receipts_their_owner`: the receipts' tenant migration, the
  same on both SQL adapters but for how each goes back to schema version 3.

Worker processes (``crash_worker.py``, ``soak_worker.py``) import this module too.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import pytest

from intention_kernel import (
    Agent,
    Answer,
    CapabilityContext,
    CapabilityResult,
    Fact,
    Intent,
    Interpretation,
    Kernel,
    capability,
)
from intention_kernel._effects import EffectAuthority
from intention_kernel._interpretation import InterpretationRequest
from intention_kernel._turns import OutboxEvent, TurnCommit, TurnScope
from intention_kernel.durability import Durability, TurnTransaction
from intention_kernel.durability._contract.records import ThreadOwner
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.errors import EffectNotAppliedError, TenantMismatchError
from intention_kernel.testing import faults
from intention_kernel.testing._agents import FakeProvider, billing_agent
from intention_kernel.testing.conformance import commit_for

CHARGE = "payments.charge:charge:"
PAY = "payments.pay:charge:"


def charge_key(payment_intent_id: str) -> str:
    """The stored (and provider idempotency) key of the billing agent's charge."""
    return CHARGE + payment_intent_id


def pay_key(payment_intent_id: str) -> str:
    """The stored key of :func:`proving_agent`'s immediate payment."""
    return PAY + payment_intent_id


# -- the provider ----------------------------------------------------------------------------


def append_line(path: str, record: dict[str, Any], *, sync: bool = True) -> None:
    """Append one JSON line with one ``write`` (``O_APPEND``: lines of concurrent
    processes never interleave); ``sync`` makes it survive a power cut too."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class LedgerProvider(FakeProvider):
    """:class:`FakeProvider` whose every applied call is one line of the ``path`` file.

    Behaviours per payment intent as in :class:`FakeProvider` (``ok``,
    ``not_applied``, ``lost_response``); ``not_applied_once`` declines the receipt's
    first attempt only. A charge's value names the payment intent and the attempt.
    """

    path: str = ""
    sync: bool = True

    async def charge(self, payment_intent_id: str, amount: int, authority: EffectAuthority) -> Any:
        # A str: the schedule adds not_applied_once, a mode FakeProvider lacks.
        mode: str = self.behaviour.get(payment_intent_id, "ok")
        self.authorities.append(authority)
        if mode == "not_applied" or (mode == "not_applied_once" and authority.attempt == 1):
            raise EffectNotAppliedError(f"card declined for {payment_intent_id}")
        record = {
            "key": authority.idempotency_key,
            "receipt_id": authority.receipt_id,
            "attempt": authority.attempt,
            "pid": os.getpid(),
        }
        append_line(self.path, record, sync=self.sync)
        self.ledger.append(authority.idempotency_key)
        faults.reach(faults.IN_PROVIDER_AFTER_WRITE)  # applied; the answer is on its way
        if mode == "lost_response":
            raise TimeoutError("the provider did not answer in time")
        return {"charge_id": f"ch_{payment_intent_id}_{authority.attempt}", "amount": amount}


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """Every provider call recorded in a ledger file, in call order."""
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def ledger_keys(path: str | Path) -> list[str]:
    return [call["key"] for call in read_ledger(path)]


# -- the agent -------------------------------------------------------------------------------


class PayInput(pydantic.BaseModel):
    payment_intent_id: str = pydantic.Field(pattern=r"^pi_\w+$")
    amount: int = pydantic.Field(gt=0)


class _PayOrBilling:
    """``pay pi_1 100`` (``and pay pi_2 200``...): one ``payments.pay`` intent each;
    anything else as the billing agent's interpreter reads it."""

    def __init__(self, billing: Agent) -> None:
        self.billing = billing.interpreter

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        parts = [part.split() for part in request.message.split(" and ")]
        if not all(len(words) == 3 and words[0] == "pay" for words in parts):
            return await self.billing.interpret(request)
        return Interpretation(
            intents=[
                Intent("payments.pay", {"payment_intent_id": pi, "amount": int(amount)})
                for _, pi, amount in parts
            ]
        )


def proving_agent(provider: FakeProvider, *, approvals: int = 1) -> Agent:
    """The billing agent, plus ``payments.pay``: a write in ``"capability"`` mode whose
    capability decides that a small payment needs no consent and pays at once, so that
    it runs in the turn that asks for it (a thread's first turn included). ``approvals``
    is how many distinct actors must accept a charge."""
    billing = billing_agent(provider, approvals=approvals)

    @capability(
        "payments.pay", effect="write", confirmation="capability", description="Pay at once"
    )
    async def pay(input: PayInput, ctx: CapabilityContext) -> CapabilityResult:
        pi = input.payment_intent_id
        effect = await ctx.run_effect(
            f"charge:{pi}", lambda authority: provider.charge(pi, input.amount, authority)
        )
        return CapabilityResult(
            value=effect.value,
            facts=[Fact(f"paid.{pi}", effect.value)],
            reply=f"Paid {input.amount} to {pi}.",
        )

    return Agent(
        name="billing",
        version="1",
        capabilities=[*billing.capabilities, pay],
        interpreter=_PayOrBilling(billing),
    )


# -- the store -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Store:
    """One store under test: a SQLite file, or a PostgreSQL schema of its own."""

    kind: str  # "sqlite" or "postgres"
    location: str  # the SQLite path, or the PostgreSQL DSN
    schema: str = ""

    @property
    def id(self) -> str:
        return self.kind

    def config(self) -> dict[str, str]:
        """What a worker process needs to open this store (see :func:`open_store`)."""
        return {"kind": self.kind, "location": self.location, "schema": self.schema}

    def durability(self, **options: Any) -> Durability:
        return open_store(self.config(), **options)

    # -- raw access ----------------------------------------------------------------------------

    def query(self, text: str, *args: object) -> list[tuple[Any, ...]]:
        """One statement on the store itself (``%s`` placeholders on PostgreSQL, ``?`` on
        SQLite), autocommitted."""
        if self.kind == "sqlite":
            with closing(sqlite3.connect(self.location, isolation_level=None)) as conn:
                return conn.execute(text, args).fetchall()
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.location) as pg:
            pg.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(self.schema)))
            cur = pg.execute(text.encode(), args or None)
            return cur.fetchall() if cur.description else []

    def tables(self) -> list[str]:
        if self.kind == "sqlite":
            rows = self.query(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'ik%'"
            )
        else:
            rows = self.query(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                self.schema,
            )
        # ik_leases holds who may write a thread, not what was written: every turn
        # takes a lease (a new epoch), committed or refused.
        return sorted(name for (name,) in rows if name not in ("ik_schema", "ik_leases"))

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table of the adapter, sorted: equal snapshots mean that
        nothing at all was written in between."""
        return {
            table: sorted(self.query(f"SELECT * FROM {table}"), key=repr) for table in self.tables()
        }

    def committed_turns(self) -> list[tuple[str, str, int]]:
        """``(thread_id, turn_id, version)`` of every committed turn."""
        rows = self.query("SELECT thread_id, turn_id, version FROM ik_turns")
        return sorted((t, u, v) for t, u, v in rows)


class StoreInspector:
    """The conformance suite's raw reads of a SQL store (its ``Inspector``)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def schema_revisions(self) -> set[int]:
        rows = self._store.query("SELECT DISTINCT schema_revision FROM ik_threads")
        return {revision for (revision,) in rows}

    async def snapshot(self) -> object:
        return self._store.snapshot()


def open_store(config: dict[str, Any], **options: Any) -> Durability:
    """A new adapter on the store a :meth:`Store.config` describes.

    On PostgreSQL, ``config`` may name the adapter's ``lease_expiry``."""
    if config["kind"] == "sqlite":
        return SQLiteDurability(config["location"], **options)
    from intention_kernel.durability.postgres import PostgresDurability

    # A worker killed mid-turn keeps its thread until its lease lapses: 2 s here.
    options.setdefault("lease_expiry", float(config.get("lease_expiry", 2.0)))
    return PostgresDurability(config["location"], schema=config["schema"], **options)


def new_schema() -> str:
    return "ik_test_" + uuid.uuid4().hex[:12]


@contextlib.contextmanager
def new_database(dsn: str) -> Iterator[str]:
    """The URL of a PostgreSQL database of the caller's own, dropped afterwards: for
    commands and processes that open ``open_durability(url)``, whose schema is the
    default one."""
    import psycopg
    from psycopg import sql

    name = "ik_test_" + uuid.uuid4().hex[:12]
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield dsn.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def unpublished(url: str) -> int:
    """Events the relays still owe, read from the store itself (a URL of either store).

    A sink logs an event before its relay records it as published.
    So a delivery log alone does not say that the store knows.
    """
    query = "SELECT count(*) FROM ik_outbox WHERE published_at IS NULL"
    if url.startswith("sqlite:///"):
        uri = Path(url.removeprefix("sqlite:///")).absolute().as_uri() + "?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            count: int = conn.execute(query).fetchone()[0]
            return count
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute("SET search_path TO intention_kernel")
        row = conn.execute(query).fetchone()
        assert row is not None
        return int(row[0])


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a worker or CLI process: this library's source and the tests
    directory first on ``PYTHONPATH`` (so that the worktree under test is what runs,
    and ``module:callable`` targets in tests/ import), and ``extra``."""
    import intention_kernel

    source = str(Path(intention_kernel.__file__).parents[1])
    tests = str(Path(__file__).parent)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([source, tests, os.environ.get("PYTHONPATH", "")]),
        **extra,
    }


def make_sql_store(
    kind: str,
    request: Any,
    tmp_path: Path,
    *,
    file: str = "kernel.db",
    name_sessions: bool = False,
) -> Iterator[Store]:
    """A fixture body: a SQLite file (``"sqlite"``, named ``file``) or a PostgreSQL
    schema of its own (``"postgres"``), dropped after the test. ``name_sessions``: the
    store's sessions carry the schema as ``application_name``, so that a test can find
    (and kill) them in ``pg_stat_activity``."""
    if kind == "sqlite":
        yield Store("sqlite", str(tmp_path / file))
        return
    dsn: str = request.getfixturevalue("postgres_dsn")
    from psycopg.conninfo import make_conninfo

    schema = new_schema()
    location = make_conninfo(dsn, application_name=schema) if name_sessions else dsn
    yield Store("postgres", location, schema)
    drop_schema(dsn, schema)


def make_store(kind: str, request: Any, tmp_path: Path) -> Iterator[Store | None]:
    """Like :func:`make_sql_store`, and ``None`` for ``"memory"`` (the in-memory adapter)."""
    if kind == "memory":
        yield None
    else:
        yield from make_sql_store(kind, request, tmp_path)


async def migration_4_gives_receipts_their_owner(
    open_durability: Callable[[], Durability], back_to_version_3: Callable[[], None]
) -> None:
    """Receipts written before they carried a tenant: a committed thread's take its
    owner, so that its tenant's later turns still replay them; a thread with no
    committed turn cannot tell whose its receipts are, and refuses every tenant.
    ``back_to_version_3`` makes the store look as schema version 3 wrote it."""

    def charge(expected: object) -> Callable[[TurnTransaction], Any]:
        async def operation(tx: TurnTransaction) -> TurnCommit:
            effect = await tx.run_effect("k", lambda a: {"v": 1}, step_id="s")
            assert effect.value == expected
            return commit_for(tx)

        return operation

    async def crash(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("k", lambda a: {"v": 2}, step_id="s")
        raise RuntimeError("crashed before its commit")

    async with open_durability() as durability:
        await durability.with_turn(TurnScope("owned", "1", tenant_id="acme"), charge({"v": 1}))
        with pytest.raises(RuntimeError):
            await durability.with_turn(TurnScope("crashed", "1", tenant_id="acme"), crash)
    back_to_version_3()

    async with open_durability() as upgraded:
        owners = {r.thread_id: r.tenant_id for r in await upgraded.list_receipts()}
        assert owners == {"owned": "acme", "crashed": None}
        again = await upgraded.with_turn(
            TurnScope("owned", "2", tenant_id="acme"), charge({"v": 1})
        )
        assert again.checkpoint_version == 2
        with pytest.raises(TenantMismatchError):
            await upgraded.with_turn(TurnScope("crashed", "1", tenant_id="acme"), charge({}))


async def journal_before_tenants_gets_its_threads_owner(
    open_durability: Callable[[], Durability], before_tenants: Callable[[], None]
) -> None:
    """Journal entries written before they carried a tenant. Those on a committed
    thread take its owner. So its tenant's redelivery still goes on from them.
    Those on a thread with no committed turn cannot tell whose they are. They refuse
    every tenant's turn there (unknown fails closed). ``before_tenants`` makes the
    store look as the schema before ``JournalEntry.tenant_id`` wrote it."""

    def reads(expected: object) -> Callable[[TurnTransaction], Any]:
        async def operation(tx: TurnTransaction) -> TurnCommit:
            assert await tx.recorded("k", _computed("asked again")) == expected
            return commit_for(tx)

        return operation

    async def dies(tx: TurnTransaction) -> TurnCommit:
        await tx.recorded("k", _computed("first answer"))
        raise RuntimeError("crashed before its commit")

    async with open_durability() as durability:
        await durability.with_turn(TurnScope("owned", "1", tenant_id="acme"), _commits)
        for thread_id in ("owned", "unowned"):
            with pytest.raises(RuntimeError):
                await durability.with_turn(TurnScope(thread_id, "2", tenant_id="acme"), dies)
    before_tenants()

    async with open_durability() as upgraded:
        again = await upgraded.with_turn(
            TurnScope("owned", "2", tenant_id="acme"), reads("first answer")
        )
        assert again.checkpoint_version == 2
        for tenant in ("acme", "globex"):
            with pytest.raises(TenantMismatchError):
                await upgraded.with_turn(TurnScope("unowned", "2", tenant_id=tenant), reads(None))


def _computed(value: object) -> Callable[[], Any]:
    async def compute() -> object:
        return value

    return compute


async def _commits(tx: TurnTransaction) -> TurnCommit:
    return commit_for(tx)


async def receipts_before_actors_read_as_no_actor(
    open_durability: Callable[[], Durability], before_actors: Callable[[], None]
) -> None:
    """Receipts stored before they named their approver read as no actor after the
    migration; the store's next approved write records its approver.
    ``before_actors`` makes the store look as the schema before ``Receipt.actor`` wrote it."""
    provider = FakeProvider()
    async with open_durability() as durability:
        kernel = Kernel(billing_agent(provider), durability)
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", answer=Answer(None, "accept", actor="ana"))
    before_actors()
    async with open_durability() as upgraded:
        [old] = await upgraded.list_receipts(thread_id="t")
        assert (old.status, old.actor) == ("completed", None)
        kernel = Kernel(billing_agent(provider), upgraded)
        await kernel.turn("t", "3", "charge pi_2 300")
        await kernel.turn("t", "4", answer=Answer(None, "accept", actor="bob"))
        receipts = await upgraded.list_receipts(thread_id="t")
        assert [(r.key, r.actor) for r in receipts] == [
            ("payments.charge:charge:pi_1", None),
            ("payments.charge:charge:pi_2", "bob"),
        ]
    assert provider.calls() == 2


async def receipts_before_origins_read_with_none(
    open_durability: Callable[[], Durability], before_origins: Callable[[], None]
) -> None:
    """Receipts stored before they said what their write was read with no capability,
    no input and no approvers after the migration, their other fields as stored; the
    store's next write records all three. ``before_origins`` makes the store look as the
    schema before ``Receipt.capability_id`` wrote it (the columns dropped, the version
    rolled back)."""
    provider = FakeProvider()
    async with open_durability() as durability:
        kernel = Kernel(billing_agent(provider), durability)
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", answer=Answer(None, "accept", actor="ana"))
        [written] = await durability.list_receipts(thread_id="t")
    assert written.capability_id == "payments.charge"  # what the old schema cannot hold
    before_origins()
    async with open_durability() as upgraded:
        [old] = await upgraded.list_receipts(thread_id="t")
        assert (old.capability_id, old.input, old.approved_by) == (None, None, ())
        assert (old.status, old.actor, old.value) == ("completed", "ana", written.value)
        kernel = Kernel(billing_agent(provider), upgraded)
        await kernel.turn("t", "3", "charge pi_2 300")
        await kernel.turn("t", "4", answer=Answer(None, "accept", actor="bob"))
        receipts = await upgraded.list_receipts(thread_id="t")
        assert [(r.key, r.capability_id, r.input, r.approved_by) for r in receipts] == [
            ("payments.charge:charge:pi_1", None, None, ()),
            (
                "payments.charge:charge:pi_2",
                "payments.charge",
                {"payment_intent_id": "pi_2", "amount": 300},
                ("bob",),
            ),
        ]
    assert provider.calls() == 2


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def fresh_store_urls(
    request: pytest.FixtureRequest, tmp_path: Path, prefix: str
) -> Iterator[Callable[[], str]]:
    """A factory of URLs of fresh, empty stores of the kind ``request.param`` names:
    memory, SQLite files, PostgreSQL schemas of their own (dropped afterwards)."""
    if request.param == "memory":
        yield lambda: "memory://"
        return
    if request.param == "sqlite":
        yield lambda: f"sqlite:///{tmp_path / uuid.uuid4().hex}.db"
        return
    dsn: str = request.getfixturevalue("postgres_dsn")
    schemas: list[str] = []

    def fresh() -> str:
        schemas.append(f"{prefix}_{uuid.uuid4().hex[:12]}")
        return f"{dsn}?schema={schemas[-1]}"

    try:
        yield fresh
    finally:
        for schema in schemas:
            drop_schema(dsn, schema)


async def read_all_events(
    durability: Durability, after: int | None = None, thread_id: str | None = None
) -> list[OutboxEvent]:
    """The whole outbox after ``after``, page by page, as a relay reads it."""
    events: list[OutboxEvent] = []
    while batch := await durability.read_outbox(
        thread_id=thread_id, after=events[-1].position if events else after, limit=500
    ):
        events.extend(batch)
    return events


def assert_outbox_matches_commits(
    events: Sequence[OutboxEvent], committed: Sequence[tuple[str, str, int]]
) -> None:
    """Events exist only for committed turns, one ``turn.committed`` each carrying its
    version; positions strictly increase and each thread's ``seq`` runs 1, 2, 3..."""
    versions = {(t, u): v for t, u, v in committed}
    orphans = [
        (e.thread_id, e.turn_id, e.type)
        for e in events
        if e.turn_id is not None and (e.thread_id, e.turn_id) not in versions
    ]
    assert orphans == [], "outbox events of turns that never committed"
    announced = Counter(
        (e.thread_id, e.turn_id, e.payload["version"]) for e in events if e.type == "turn.committed"
    )
    assert announced == Counter(committed)
    positions = [e.position for e in events]
    assert positions == sorted(set(positions))
    assert len({e.id for e in events}) == len(events)
    for thread_id in {e.thread_id for e in events}:
        seqs = [e.seq for e in events if e.thread_id == thread_id]
        assert seqs == list(range(1, len(seqs) + 1)), f"seq of {thread_id!r} has gaps"


def damage_sqlite_table(path: str | Path, table: str) -> None:
    """Overwrite the root page of ``table`` in the (closed) SQLite file at ``path`` with
    garbage, as a failing disk would: the schema stays readable, that table does not."""
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the main file
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,))
        root = root[0]
    with open(path, "r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(b"\xff" * page_size)


async def cancels_before_scopes_stop_any_tenant(
    open_durability: Callable[[], Durability],
    before_scopes: Callable[[], None],
    old_cancel: Callable[[str, str, str], None],
) -> None:
    """A stop request stored before requests carried a scope was made for any tenant,
    and still stops a turn of any tenant after the upgrade; a new scoped one of
    another tenant stops nothing. ``old_cancel(thread, turn, reason)`` writes a row
    as the schema before scopes did."""
    async with open_durability() as durability:
        await durability.with_turn(TurnScope("t", "1", tenant_id="acme"), _commits)
    before_scopes()
    old_cancel("t", "2", "before the upgrade")
    async with open_durability() as upgraded:
        store: Any = upgraded
        assert await store.read_cancel("t", "2", 1, "acme") == ("cancel", "before the upgrade")
        found = await store.request_cancel("t", "3", "mine", owner=ThreadOwner("globex"))
        assert found == "not-found"  # acme's thread
        assert await store.read_cancel("t", "3", 1, "acme") == (None, None)
        assert await store.request_cancel("t", "3", "ok", owner=ThreadOwner("acme")) == (
            "requested"
        )
        assert await store.read_cancel("t", "3", 1, "acme") == ("cancel", "ok")
        assert await store.read_cancel("t", "3", 1, "globex") == (None, None)


async def inbox_before_steers_reads_as_queued(
    open_durability: Callable[[], Durability], before_steers: Callable[[], None]
) -> None:
    """An entry queued before steering existed is a queued message after the upgrade:
    not a steer, taken by no turn, still waiting in its place."""
    from intention_kernel._effects import utcnow
    from intention_kernel.durability._contract.records import InboxEntry

    async with open_durability() as durability:
        store: Any = durability
        entry = InboxEntry("t", "q1", "acme", None, '{"message": "hi"}', utcnow())
        assert await store.enqueue(entry) == 1
    before_steers()
    async with open_durability() as upgraded:
        store = upgraded
        [kept] = await store.read_inbox("t")
        assert (kept.turn_id, kept.steer, kept.taken_by) == ("q1", False, None)
        assert await store.taker("t", "q1") is None
        assert await store.take_steers("t", "x") == []  # a queued entry is no steer
        assert [e.turn_id for e in await store.read_inbox("t")] == ["q1"]


async def interrupts_before_senders_stop_any_turn_on_their_base(
    open_durability: Callable[[], Durability],
    before_senders: Callable[[], None],
    old_interrupt: Callable[[str, int], None],
) -> None:
    """An interrupt stored before it named its sender keeps its meaning after the
    upgrade: it stops any turn of any tenant on its base. A new one names its sender:
    it stops neither the sender's own turn nor another tenant's. An inbox entry
    stored before reads as not started."""
    from intention_kernel._effects import utcnow
    from intention_kernel.durability._contract.records import InboxEntry

    async with open_durability() as durability:
        store: Any = durability
        entry = InboxEntry("t", "q0", "acme", None, '{"message": "hi"}', utcnow())
        assert await store.enqueue(entry) == 1
    before_senders()
    old_interrupt("t", 4)
    async with open_durability() as upgraded:
        store = upgraded
        # An entry stored before was not started: a cancel dequeues it.
        assert await store.request_cancel("t", "q0", None) == "dequeued"
        assert await store.read_cancel("t", "x", 4, "acme") == ("interrupt", None)
        assert await store.read_cancel("t", "x", 3, "acme") == (None, None)
        entry = InboxEntry("t", "q1", "acme", None, '{"message": "hi"}', utcnow())
        assert await store.enqueue(entry) == 1
        await store.request_interrupt("t", 7, "q1", "acme")
        assert await store.read_cancel("t", "x", 7, "acme") == ("interrupt", None)
        assert await store.read_cancel("t", "q1", 7, "acme") == (None, None)
        assert await store.read_cancel("t", "x", 7, "beta") == (None, None)
