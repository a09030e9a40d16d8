"""Thread leases on PostgreSQL: a paused holder, renewal, expiry on the server's clock,
and real worker processes stopped (SIGSTOP) past their lease while another takes over.

A paused worker is made two ways. In this process, it is made by blocking the event
loop inside a provider call. Then nothing runs, the lease renewal included, as in a
long GC pause. It is also made as a real process frozen with SIGSTOP and woken with
SIGCONT. Every test works
in a schema of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import prefork
from intention_kernel import _effects as effects
from intention_kernel._effects import EffectAuthority
from intention_kernel._turns import EventDraft, TurnCommit, TurnScope
from intention_kernel.durability import TurnTransaction
from intention_kernel.durability.postgres import PostgresDurability
from intention_kernel.durability.postgres._recorder import CLAIM_MOVES
from intention_kernel.errors import (
    EffectNotAppliedError,
    EffectUncertainError,
    FencedCommitError,
    LeaseLostError,
    ThreadBusyError,
)
from intention_kernel.testing.conformance import commit_for

pytestmark = pytest.mark.postgres

WORKER = Path(__file__).with_name("postgres_worker.py")


class Schema:
    """A schema of its own for the store, and one for the provider's ledger."""

    def __init__(self, dsn: str) -> None:
        suffix = uuid.uuid4().hex[:12]
        self.name, self.ledger = f"ik_test_{suffix}", f"ik_ledger_{suffix}"
        self.dsn = make_conninfo(dsn, application_name=self.name)

    def durability(self, **options: Any) -> PostgresDurability:
        return PostgresDurability(self.dsn, schema=self.name, **options)

    def query(self, text: str, *args: object, schema: str | None = None) -> list[Any]:
        with psycopg.connect(self.dsn) as conn:  # one transaction: one server session
            conn.execute(
                sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema or self.name))
            )
            cur = conn.execute(text.encode(), args or None)
            return cur.fetchall() if cur.description else []


@pytest.fixture
def schema(postgres_dsn: str) -> Iterator[Schema]:
    made = Schema(postgres_dsn)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(made.ledger)))
    made.query(
        "CREATE TABLE calls (n bigserial PRIMARY KEY, thread_id text NOT NULL, "
        "key text NOT NULL, pid integer NOT NULL)",
        schema=made.ledger,
    )
    yield made
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for name in (made.name, made.ledger):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


async def plain(tx: TurnTransaction) -> TurnCommit:
    return commit_for(tx, (EventDraft("turn.committed", {"by": tx.scope.turn_id}),))


async def one() -> int:
    return 1


def in_another_worker(schema: Schema, scope: TurnScope, key: str | None) -> dict[str, Any]:
    """Run a turn on an adapter of its own, in a thread with its own event loop, while
    this thread's event loop is blocked (paused). It waits for the thread's lease, runs
    the effect ``key`` if given, and commits; returns what it saw."""
    seen: dict[str, Any] = {}

    async def operation(tx: TurnTransaction) -> TurnCommit:
        if key is not None:
            try:
                await tx.run_effect(key, lambda a: seen.setdefault("called", a.key), step_id="s")
            except EffectUncertainError:
                seen["uncertain"] = True
        return await plain(tx)

    async def turn() -> None:
        async with schema.durability(lock_timeout=20) as other:
            seen["result"] = await other.with_turn(scope, operation)

    worker = threading.Thread(target=asyncio.run, args=(turn(),))
    worker.start()
    worker.join(60)
    assert not worker.is_alive()
    return seen


# -- a holder paused in this process ---------------------------------------------------------


async def test_a_paused_holder_past_its_lease_writes_nothing_after_another_took_over(
    schema: Schema,
) -> None:
    """The holder's event loop stops inside its provider call for longer than its lease.
    Another worker takes the thread and commits. When the holder wakes, the outcome of
    its call is still recorded (fenced by its attempt), but its journal entry and its
    commit are refused: nothing else of its turn is stored or announced."""
    calls: list[str] = []
    other: dict[str, Any] = {}

    async def provider(authority: EffectAuthority) -> str:
        calls.append(authority.key)
        # Blocks the event loop: no renewal, no statement, as in a long pause.
        other.update(in_another_worker(schema, TurnScope("t", "other"), None))
        return "paid"

    async def paused(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("charge", provider, step_id="s")
        await tx.recorded("after the call", one)
        return await plain(tx)

    async with schema.durability(lease_expiry=1.0) as holder:
        with pytest.raises(LeaseLostError) as refused:
            await holder.with_turn(TurnScope("t", "paused"), paused)
        assert (refused.value.thread_id, refused.value.turn_id) == ("t", "paused")
        [receipt] = await holder.list_receipts()
        assert (receipt.status, receipt.value) == ("completed", "paid")
        events = await holder.read_outbox()
        # A redelivery replays the recorded outcome: no second call.
        again = await holder.with_turn(TurnScope("t", "paused"), paused)
    assert other["result"].checkpoint_version == 1
    assert again.checkpoint_version == 2 and not again.replayed
    assert calls == ["charge"]
    assert [e.payload for e in events] == [{"by": "other"}]
    assert schema.query("SELECT turn_id FROM ik_turns ORDER BY version") == [
        ("other",),
        ("paused",),
    ]


async def test_a_paused_holder_past_its_lease_records_no_stream_segment(schema: Schema) -> None:
    """A streamed round's segment goes with its journal entry: refused together when
    the lease was lost, so no watcher ever reads a segment of a fenced delivery."""
    other: dict[str, Any] = {}

    async def provider(authority: EffectAuthority) -> str:
        other.update(in_another_worker(schema, TurnScope("t", "other"), None))
        return "paid"

    async def paused(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("charge", provider, step_id="s")
        segment = (1, '{"delivery": "d", "events": []}')
        await tx.recorded("round", one, stream=lambda: segment)  # type: ignore[call-arg]
        return await plain(tx)

    async with schema.durability(lease_expiry=1.0) as holder:
        with pytest.raises(LeaseLostError):
            await holder.with_turn(TurnScope("t", "paused"), paused)
    assert other["result"].checkpoint_version == 1
    assert schema.query("SELECT count(*) FROM ik_journal") == [(0,)]
    assert schema.query("SELECT count(*) FROM ik_streams") == [(0,)]


async def test_a_paused_holders_late_outcome_never_overwrites_the_next_holders_judgement(
    schema: Schema,
) -> None:
    """The same pause, but the next holder runs the same effect key: it finds the
    receipt prepared by a live attempt and fails closed (uncertain), without calling
    the provider. The paused holder's late outcome is then refused, and the receipt
    stays uncertain for an operator: no provider is ever called twice."""
    calls: list[str] = []
    other: dict[str, Any] = {}

    async def provider(authority: EffectAuthority) -> str:
        calls.append(authority.key)
        other.update(in_another_worker(schema, TurnScope("t", "other"), "charge"))
        return "paid"

    async def paused(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("charge", provider, step_id="s")
        return await plain(tx)

    async with schema.durability(lease_expiry=1.0) as holder:
        with pytest.raises(LeaseLostError) as refused:
            await holder.with_turn(TurnScope("t", "paused"), paused)
        [receipt] = await holder.list_receipts()
    assert (refused.value.thread_id, refused.value.key) == ("t", receipt.key)
    assert other == {"uncertain": True, "result": other["result"]}
    assert receipt.status == "uncertain"
    assert calls == ["charge"]
    assert schema.query("SELECT turn_id FROM ik_turns") == [("other",)]


async def test_a_settle_refused_under_a_live_lease_is_a_conflict_not_a_lost_lease(
    schema: Schema,
) -> None:
    """The receipt is moved behind the holder's back while its provider call runs, and
    its lease stays alive. The outcome's write is refused as a conflict
    (``FencedCommitError``), never as a lost lease: only a holder whose lease is gone
    may be told it lost it. Nothing of the turn is committed."""

    def provider(authority: EffectAuthority) -> str:
        # Written straight to the table, as no holder of the thread could.
        moved = "UPDATE ik_receipts SET status = 'uncertain' WHERE id = %s"
        schema.query(moved, authority.receipt_id)
        return "paid"

    async def moved(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("charge", provider, step_id="s")
        return await plain(tx)

    async with schema.durability() as holder:
        with pytest.raises(FencedCommitError) as refused:
            await holder.with_turn(TurnScope("t", "moved"), moved)
        assert type(refused.value) is FencedCommitError
        [receipt] = await holder.list_receipts()
    assert receipt.status == "uncertain"
    assert schema.query("SELECT count(*) FROM ik_turns") == [(0,)]


async def test_a_claim_whose_receipt_a_woken_holder_settled_replays_the_settled_value(
    schema: Schema,
) -> None:
    """A holder stops past its lease inside its provider call. The next holder reads
    the receipt as prepared by that live attempt. Just then the stopped holder wakes
    and settles its attempt: the outcome is a fact, so that write has no lease fence.
    The next holder's compare-and-set finds the receipt moved. It reads it again and
    replays the settled value: the provider ran once, and the next holder's turn
    commits instead of failing. The woken holder's commit is refused."""
    calls: list[str] = []
    resume = threading.Event()
    other: dict[str, Any] = {}

    async def settled() -> None:
        query = "SELECT status FROM ik_receipts"
        for _ in range(600):
            if await asyncio.to_thread(schema.query, query) != [("prepared",)]:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the woken holder never settled its attempt")

    async def next_holder() -> None:
        async with schema.durability(lock_timeout=20) as store:
            recorder = store._sessions
            update = recorder._fenced_update

            async def woken_first(conn: Any, new: Any, expected: Any, lease: Any) -> None:
                # Between this claim's read and its write, the stopped holder wakes.
                if not resume.is_set():
                    resume.set()
                    await settled()
                await update(conn, new, expected, lease)

            recorder._fenced_update = woken_first  # type: ignore[method-assign]

            async def operation(tx: TurnTransaction) -> TurnCommit:
                other["effect"] = await tx.run_effect(
                    "charge", lambda a: other.setdefault("called", a.key), step_id="s"
                )
                return await plain(tx)

            other["result"] = await store.with_turn(TurnScope("t", "other"), operation)

    worker = threading.Thread(target=asyncio.run, args=(next_holder(),))

    async def provider(authority: EffectAuthority) -> str:
        calls.append(authority.key)
        worker.start()
        # This event loop blocks: the holder stops, its lease renewal too.
        assert resume.wait(60)
        return "paid"

    async def stopped(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("charge", provider, step_id="s")
        return await plain(tx)

    async with schema.durability(lease_expiry=1.0) as holder:
        with pytest.raises(LeaseLostError):
            await holder.with_turn(TurnScope("t", "stopped"), stopped)
        await asyncio.to_thread(worker.join, 60)
        [receipt] = await holder.list_receipts()
    assert not worker.is_alive()
    assert calls == ["charge"] and "called" not in other
    effect = other["effect"]
    assert (effect.value, effect.replayed) == ("paid", True)
    assert (receipt.status, receipt.value, receipt.turn_id) == ("completed", "paid", "stopped")
    assert other["result"].checkpoint_version == 1
    assert schema.query("SELECT turn_id FROM ik_turns") == [("other",)]


async def test_a_claim_whose_receipt_keeps_moving_gives_up_after_a_few_reads(
    schema: Schema,
) -> None:
    """A receipt that moves again before every write of a claim (as no holder of the
    thread could move it) is read and planned at most ``CLAIM_MOVES`` more times. Then
    the claim raises ``FencedCommitError``: it never spins, and nothing is committed."""

    def not_applied(authority: EffectAuthority) -> str:
        raise EffectNotAppliedError()

    async def fails(tx: TurnTransaction) -> TurnCommit:
        with contextlib.suppress(EffectNotAppliedError):
            await tx.run_effect("charge", not_applied, step_id="s")
        return await plain(tx)

    writes: list[int] = []

    async def retries(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("charge", lambda a: "paid", step_id="s")
        return await plain(tx)

    async with schema.durability() as store:
        await store.with_turn(TurnScope("t", "failed"), fails)
        recorder = store._sessions
        update = recorder._fenced_update

        async def moved_first(conn: Any, new: Any, expected: Any, lease: Any) -> None:
            writes.append(expected.attempt)
            bump = "UPDATE ik_receipts SET attempt = attempt + 1 WHERE id = %s"
            await asyncio.to_thread(schema.query, bump, expected.id)
            await update(conn, new, expected, lease)

        recorder._fenced_update = moved_first  # type: ignore[method-assign]
        with pytest.raises(FencedCommitError) as refused:
            await store.with_turn(TurnScope("t", "retried"), retries)
        [receipt] = await store.list_receipts()
    assert type(refused.value) is FencedCommitError
    assert writes == list(range(1, CLAIM_MOVES + 2))  # each read saw the last move
    assert (receipt.status, receipt.attempt) == ("failed", CLAIM_MOVES + 2)
    assert schema.query("SELECT turn_id FROM ik_turns") == [("failed",)]


async def test_a_turn_whose_lease_lapsed_never_writes_under_the_next_turn_of_its_adapter(
    schema: Schema,
) -> None:
    """Two turns of one adapter on one thread: the first one's lease lapses while it
    runs, and the second takes the thread. The first turn's writes name its own
    grant, not the adapter's newest one on the thread: its prepare and its commit are
    refused. The second turn commits."""
    b_started, a_done = asyncio.Event(), asyncio.Event()
    outcome: dict[str, Any] = {}

    async def second(tx: TurnTransaction) -> TurnCommit:
        b_started.set()
        await a_done.wait()
        return await plain(tx)

    async with schema.durability(lock_timeout=20) as store:

        async def first(tx: TurnTransaction) -> TurnCommit:
            # The lease lapses, as after renewals that failed for the whole expiry.
            await asyncio.to_thread(
                schema.query,
                "UPDATE ik_leases SET expires_at = clock_timestamp() WHERE thread_id = 't'",
            )
            outcome["b"] = asyncio.create_task(store.with_turn(TurnScope("t", "b"), second))
            await b_started.wait()
            try:
                await tx.run_effect("charge", lambda a: "paid", step_id="s")
            except LeaseLostError as refused:
                outcome["prepare"] = refused
            return await plain(tx)

        try:
            with pytest.raises(LeaseLostError):
                await store.with_turn(TurnScope("t", "a"), first)
        finally:
            a_done.set()
        taken = await outcome["b"]
        receipts = await store.list_receipts()
    assert isinstance(outcome["prepare"], LeaseLostError)
    assert receipts == []
    assert taken.checkpoint_version == 1
    assert schema.query("SELECT turn_id FROM ik_turns") == [("b",)]


@pytest.mark.parametrize("quiet_first", [False, True], ids=["first-lease", "after-a-quiet-spell"])
async def test_a_renewed_lease_keeps_the_thread_through_a_call_longer_than_its_expiry(
    schema: Schema, quiet_first: bool
) -> None:
    """A provider call three times as long as the lease: the holder renews it while it
    runs, so another worker is kept off the thread the whole time, and the turn
    commits. One timer renews every lease of the adapter, and stops when none is
    held: a lease taken after a quiet spell is renewed too."""
    async with (
        schema.durability(lease_expiry=0.5) as holder,
        schema.durability(lock_timeout=0.1) as other,
    ):
        if quiet_first:  # a lease held and let go, then a spell of many renewal ticks
            await holder.with_turn(TurnScope("before", "1"), plain)
            await asyncio.sleep(0.5)
        refusals: list[type[BaseException]] = []

        async def provider(authority: EffectAuthority) -> str:
            for _ in range(6):  # 1.5 s in all, three lease lifetimes
                await asyncio.sleep(0.25)
                try:
                    await other.with_turn(TurnScope("t", "intruder"), plain)
                except ThreadBusyError as exc:
                    refusals.append(type(exc))
            return "done"

        async def long_call(tx: TurnTransaction) -> TurnCommit:
            await tx.run_effect("slow", provider, step_id="s")
            return await plain(tx)

        result = await holder.with_turn(TurnScope("t", "long"), long_call)
    assert result.checkpoint_version == 1
    assert len(refusals) == 6
    assert schema.query("SELECT turn_id FROM ik_turns WHERE thread_id = 't'") == [("long",)]


async def test_expiry_is_judged_by_the_servers_clock_not_the_workers(
    schema: Schema, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose clock runs an hour fast neither gives its lease a later expiry
    nor takes a live lease early: the lease's expiry is the server's clock plus
    ``lease_expiry``, and only the server's clock says when it lapsed."""
    fast = effects.utcnow() + timedelta(hours=1)
    monkeypatch.setattr(effects, "utcnow", lambda: fast)
    monkeypatch.setattr(time, "time", lambda: fast.timestamp())
    entered, release = asyncio.Event(), asyncio.Event()

    async def gate(tx: TurnTransaction) -> TurnCommit:
        entered.set()
        await release.wait()
        return await plain(tx)

    async with (
        schema.durability(lease_expiry=30) as holder,
        schema.durability(lock_timeout=0.2) as other,
    ):
        held = asyncio.create_task(holder.with_turn(TurnScope("t", "1"), gate))
        await asyncio.wait_for(entered.wait(), 5)
        [(left,)] = schema.query(
            "SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM ik_leases"
        )
        assert 0 < float(left) <= 30
        with pytest.raises(ThreadBusyError):
            await other.with_turn(TurnScope("t", "2"), plain)
        release.set()
        assert (await held).checkpoint_version == 1


# -- real processes, SIGSTOP -----------------------------------------------------------------


async def spawn(schema: Schema, **config: Any) -> prefork.Forked:
    config = {"dsn": schema.dsn, "schema": schema.name, "ledger": schema.ledger, **config}
    return await prefork.spawn(WORKER, json.dumps(config))


@pytest.fixture
async def processes() -> AsyncIterator[list[prefork.Forked]]:
    started: list[prefork.Forked] = []
    yield started
    for process in started:  # never leave a process behind, stopped or not
        if process.returncode is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
        await process.communicate()


def exists(path: Path) -> bool:
    return path.exists()


async def wait_for(path: Path, process: prefork.Forked) -> None:
    deadline = time.monotonic() + 30
    while not exists(path):
        if process.returncode is not None:
            _, stderr = await process.communicate()
            pytest.fail(f"worker exited early:\n{stderr.decode()}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["before_effect", "in_provider"])
async def test_a_worker_stopped_past_its_lease_is_refused_every_write_after_it_wakes(
    schema: Schema,
    tmp_path: Path,
    processes: list[prefork.Forked],
    where: str,
) -> None:
    """A real worker process is SIGSTOPped mid-turn (before its effect, or inside its
    provider call) for longer than its lease. Another worker takes the thread, runs
    the same effect key and commits. SIGCONT: the woken worker's writes are all
    refused (its prepare, or its outcome over the other's uncertain judgement, its
    journal entry, its commit). No provider is called twice, no turn commits twice,
    and only the other worker's events exist."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    async with schema.durability() as store:  # creates the schema before the worker
        pass
    worker = await spawn(
        schema,
        mode="pause",
        thread="t",
        turn="paused",
        key="charge",
        where=where,
        ready=str(ready),
        go=str(go),
        lease_expiry=1.0,
    )
    processes.append(worker)
    await wait_for(ready, worker)
    os.kill(worker.pid, signal.SIGSTOP)
    calls_by_other: list[str] = []

    async def takes_over(tx: TurnTransaction) -> TurnCommit:
        # Prepared by the stopped worker's live attempt, the receipt fails closed.
        with contextlib.suppress(EffectUncertainError):
            await tx.run_effect("charge", lambda a: calls_by_other.append(a.key), step_id="s")
        return await plain(tx)

    try:
        async with schema.durability(lock_timeout=20) as store:
            taken = await store.with_turn(TurnScope("t", "other"), takes_over)
            assert taken.checkpoint_version == 1
    finally:
        go.touch()
        os.kill(worker.pid, signal.SIGCONT)
    stdout, stderr = await asyncio.wait_for(worker.communicate(), 60)
    assert worker.returncode == 0, stderr.decode()
    [outcome] = [json.loads(line) for line in stdout.decode().splitlines()]
    # Every refusal says why: the lease was lost (its outcome's write included).
    assert outcome["error"] == "LeaseLostError", outcome

    async with schema.durability() as store:
        receipts = await store.list_receipts()
        events = await store.read_outbox()
    calls = schema.query("SELECT key, pid FROM calls", schema=schema.ledger)
    if where == "before_effect":
        # Its prepare was refused: it never called the provider; the other one did.
        assert calls == [] and calls_by_other == ["charge"]
        assert [r.status for r in receipts] == ["completed"]
    else:
        # It called once before it stopped; the other failed closed, called nothing.
        assert [key for key, _ in calls] == ["charge"] and calls_by_other == []
        assert [r.status for r in receipts] == ["uncertain"]
    assert schema.query("SELECT turn_id FROM ik_turns") == [("other",)]
    assert schema.query("SELECT count(*) FROM ik_journal") == [(0,)]
    assert [e.payload for e in events] == [{"by": "other"}]


async def test_a_schema_whose_name_needs_quoting_serves_turns(postgres_dsn: str) -> None:
    """Every statement names the schema (no ``search_path``), quoted: a name with a
    space and a double quote works. A percent sign (a placeholder to psycopg) is
    refused at once."""
    with pytest.raises(ValueError, match="'%'"):
        PostgresDurability(postgres_dsn, schema="100%s")
    odd = f'ik test "{uuid.uuid4().hex[:6]}" ÿ'
    try:
        async with PostgresDurability(postgres_dsn, schema=odd) as store:

            async def work(tx: TurnTransaction) -> TurnCommit:
                await tx.recorded("round", one)
                await tx.run_effect("charge", lambda authority: "paid", step_id="s")
                return await plain(tx)

            assert (await store.with_turn(TurnScope("t", "1"), work)).checkpoint_version == 1
            assert [r.status for r in await store.list_receipts()] == ["completed"]
            assert len(await store.read_outbox()) == 1
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(odd)))


async def test_taking_a_lease_waits_for_no_flush_and_a_write_under_it_does(
    schema: Schema,
) -> None:
    """The lease's take commits asynchronously (migration 17): its transaction turns
    ``synchronous_commit`` off for itself alone. A read without a take leaves it on,
    and so does every write of the holder: a write that commits flushes the take's
    record with its own, so nothing durable ever rests on a take the disk lost."""
    async with schema.durability():
        pass  # creates and migrates the schema

    def setting_after(statement: str, *args: object) -> str:
        with psycopg.connect(schema.dsn) as conn:  # one transaction, then rolled back
            conn.execute(statement.encode(), args or None)
            row = conn.execute("SHOW synchronous_commit").fetchone()
            conn.rollback()
        assert row is not None
        return str(row[0])

    start = sql.SQL("SELECT * FROM {}.ik_start_turn_leased(%s, 't', 'u', NULL, %s, %s)").format(
        sql.Identifier(schema.name)
    )
    taken = start.as_string(None)
    assert setting_after("SHOW synchronous_commit") == "on"
    assert setting_after(taken, True, "owner", timedelta(seconds=30)) == "off"
    assert setting_after(taken, False, None, None) == "on"
    # A turn runs through it, from its take to its commit, as before.
    async with schema.durability() as store:

        async def work(tx: TurnTransaction) -> TurnCommit:
            await tx.run_effect("charge", lambda authority: "paid", step_id="s")
            return await plain(tx)

        assert (await store.with_turn(TurnScope("t", "1"), work)).checkpoint_version == 1
        assert [r.status for r in await store.list_receipts()] == ["completed"]


async def test_waiting_turns_of_one_adapter_poll_a_busy_thread_as_one(schema: Schema) -> None:
    """Ten turns of one adapter wait for a thread another adapter holds. One of them
    polls the server; the others sleep until it takes the thread or a turn of their
    adapter lets go. So the statements a busy thread costs do not grow with its
    waiters. Each waiter still takes the thread in turn, and commits."""
    waiters, held_for = 10, 2.0
    # The server counts calls of the schema's functions for the waiters' sessions only.
    counted = make_conninfo(schema.dsn, options="-c track_functions=pl")
    released = asyncio.Event()

    async def holding(tx: TurnTransaction) -> TurnCommit:
        await released.wait()
        return await plain(tx)

    async with schema.durability() as holder:
        held = asyncio.create_task(holder.with_turn(TurnScope("t", "held"), holding))
        while not schema.query("SELECT 1 FROM ik_leases WHERE thread_id = 't'"):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        async with PostgresDurability(counted, schema=schema.name, max_pool_size=3) as store:
            turns = [
                asyncio.create_task(store.with_turn(TurnScope("t", f"w{n}"), plain))
                for n in range(waiters)
            ]
            await asyncio.sleep(held_for)
            released.set()
            await held
            done = await asyncio.gather(*turns)
    assert sorted(r.checkpoint_version for r in done) == list(range(2, waiters + 2))

    def calls() -> int:
        rows = schema.query(
            "SELECT calls FROM pg_stat_user_functions"
            " WHERE schemaname = %s AND funcname = 'ik_start_turn_leased'",
            schema.name,
        )
        return int(rows[0][0]) if rows else 0

    # Sessions report their counts as they end; the pool's close ends them. So the
    # count is read until it stops moving.
    deadline, seen = time.monotonic() + 30, -1
    while (seen < waiters or calls() != seen) and time.monotonic() < deadline:
        seen = calls()
        await asyncio.sleep(0.5)
    # One poller: at most one call per 12.5 ms (half the longest backoff) while held.
    # Each take wakes the other waiters once, and so does each release: 2 * 10 * 10
    # calls at most. Ten pollers would have made about 800 calls in these two seconds.
    assert waiters <= seen <= held_for / 0.0125 + 2 * waiters * waiters, seen
