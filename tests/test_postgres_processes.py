"""The PostgreSQL adapter's guarantees, proven with real OS processes and SIGKILL.

Workers (``tests/postgres_worker.py``) share one schema; their fake provider
records every call in a ``calls`` table of a second schema. The checks look
only at what a user sees: committed turns, receipts, checkpoints, the outbox as
a relay reads it, and how often the provider was really called.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from intention_kernel.checkpoint import SCHEMA_REVISION, KernelCheckpoint
from intention_kernel.durability import TurnTransaction
from intention_kernel.durability.postgres import MIGRATIONS, PostgresDurability
from intention_kernel.errors import ThreadBusyError
from intention_kernel.turns import OutboxEvent, TurnCommit, TurnResult, TurnScope

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

WORKER = Path(__file__).with_name("postgres_worker.py")
PROCESS_TIMEOUT = 60.0


class Cluster:
    """Worker processes on one store (``schema``) and one provider ledger (``ledger``)."""

    def __init__(self, dsn: str, root: Path) -> None:
        suffix = uuid.uuid4().hex[:12]
        self.schema, self.ledger = f"ik_test_{suffix}", f"ik_ledger_{suffix}"
        self.dsn, self.root = make_conninfo(dsn, application_name=self.schema), root
        self.processes: list[asyncio.subprocess.Process] = []

    def path(self, name: str) -> str:
        return str(self.root / name)

    def durability(self, **options: Any) -> PostgresDurability:
        return PostgresDurability(self.dsn, schema=self.schema, **options)

    def query(self, schema: str, text: str, *args: object) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            cur = conn.execute(text.encode(), args or None)
            return cur.fetchall() if cur.description else []

    async def spawn(self, **config: Any) -> asyncio.subprocess.Process:
        config = {"dsn": self.dsn, "schema": self.schema, "ledger": self.ledger, **config}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            json.dumps(config),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self.processes.append(process)
        return process

    async def wait_for_file(self, path: str, process: asyncio.subprocess.Process) -> None:
        deadline = time.monotonic() + 30
        while not exists(path):
            if process.returncode is not None:
                _, stderr = await process.communicate()
                pytest.fail(f"worker exited before creating {path}:\n{stderr.decode()}")
            assert time.monotonic() < deadline, f"{path} never appeared"
            await asyncio.sleep(0.005)


def exists(path: str) -> bool:
    return Path(path).exists()


def touch(path: str) -> None:
    Path(path).touch()


async def finish(process: asyncio.subprocess.Process) -> list[dict[str, Any]]:
    stdout, stderr = await asyncio.wait_for(process.communicate(), PROCESS_TIMEOUT)
    assert process.returncode == 0, stderr.decode()
    return [json.loads(line) for line in stdout.decode().splitlines()]


@pytest.fixture
async def cluster(postgres_dsn: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = Cluster(postgres_dsn, tmp_path)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(cluster.ledger)))
    cluster.query(
        cluster.ledger,
        "CREATE TABLE calls (n bigserial PRIMARY KEY, thread_id text NOT NULL, "
        "key text NOT NULL, pid integer NOT NULL)",
    )
    yield cluster
    for process in cluster.processes:  # never leave a process behind, even on failure
        if process.returncode is None:
            process.kill()
        await process.communicate()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for schema in (cluster.schema, cluster.ledger):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def rng() -> random.Random:
    seed = random.randrange(1 << 32)
    print(f"random seed: {seed}")  # shown on failure, to replay the same schedule
    return random.Random(seed)


async def read_all(durability: PostgresDurability, after: int | None = None) -> list[OutboxEvent]:
    events: list[OutboxEvent] = []
    while batch := await durability.read_outbox(
        after=events[-1].position if events else after, limit=500
    ):
        events.extend(batch)
    return events


async def first_commit(tx: TurnTransaction) -> TurnCommit:
    assert tx.checkpoint is None
    checkpoint = KernelCheckpoint(schema_revision=SCHEMA_REVISION, agent_fingerprint="f", version=1)
    result = TurnResult(tx.scope.thread_id, tx.scope.turn_id, False, "ok", checkpoint_version=1)
    return TurnCommit(result, checkpoint, ())


# -- the guarantees --------------------------------------------------------------------------


async def test_processes_opening_a_fresh_schema_at_once_migrate_it_once(cluster: Cluster) -> None:
    barrier = cluster.path("go")
    openers = [
        await cluster.spawn(mode="open", arrived=cluster.path(f"arrived-{i}"), barrier=barrier)
        for i in range(6)
    ]
    for i, process in enumerate(openers):
        await cluster.wait_for_file(cluster.path(f"arrived-{i}"), process)
    touch(barrier)
    for process in openers:
        assert await finish(process) == []
    versions = cluster.query(cluster.schema, "SELECT version FROM ik_schema ORDER BY version")
    assert [v for (v,) in versions] == list(range(1, len(MIGRATIONS) + 1))
    async with cluster.durability() as durability:
        assert await durability.read_outbox() == []


async def test_a_killed_lock_holder_frees_its_thread_at_once(cluster: Cluster) -> None:
    holder = await cluster.spawn(mode="hold", thread="t", ready=cluster.path("ready"))
    await cluster.wait_for_file(cluster.path("ready"), holder)
    async with cluster.durability(lock_timeout=0.3) as durability:
        with pytest.raises(ThreadBusyError):
            await durability.with_turn(TurnScope("t", "mine"), first_commit)
        holder.kill()
        await holder.communicate()
        killed_at = time.monotonic()
        async with cluster.durability(lock_timeout=5.0) as patient:
            result = await patient.with_turn(TurnScope("t", "mine"), first_commit)
        assert (result.replayed, result.checkpoint_version) == (False, 1)  # held one left nothing
        assert time.monotonic() - killed_at < 2.0


@pytest.mark.timeout(120)
async def test_racing_workers_killed_at_random_never_duplicate_anything(
    cluster: Cluster, rng: random.Random
) -> None:
    threads, per_thread, n_workers, n_killed = 6, 20, 8, 3
    pairs = [[f"th-{t}", f"turn-{n}"] for t in range(threads) for n in range(per_thread)]

    def schedule() -> list[list[str]]:
        mine = list(pairs)
        rng.shuffle(mine)
        return mine

    barrier = cluster.path("go")
    workers = [
        await cluster.spawn(
            mode="turns",
            turns=schedule(),
            read_every=7,
            arrived=cluster.path(f"arrived-{i}"),
            barrier=barrier,
        )
        for i in range(n_workers)
    ]
    for i, process in enumerate(workers):
        await cluster.wait_for_file(cluster.path(f"arrived-{i}"), process)

    async with cluster.durability() as relay:
        seen: list[OutboxEvent] = []
        stop = asyncio.Event()

        async def poll() -> None:  # a relay following the outbox while workers commit
            while not stop.is_set():
                seen.extend(await read_all(relay, seen[-1].position if seen else None))
                await asyncio.sleep(0.002)

        async def kill(process: asyncio.subprocess.Process) -> None:
            await asyncio.sleep(rng.uniform(0.05, 1.5))
            process.kill()
            await process.communicate()

        started = time.monotonic()
        polling = asyncio.create_task(poll())
        touch(barrier)
        victims = rng.sample(workers, n_killed)
        await asyncio.gather(*(kill(v) for v in victims))
        survivors = [await finish(w) for w in workers if w not in victims]
        # Every delivery is retried until it commits, as a host would after a crash.
        recovery = await finish(await cluster.spawn(mode="turns", turns=pairs))
        stop.set()
        await polling
        seen.extend(await read_all(relay, seen[-1].position if seen else None))
        everything = await read_all(relay)
        elapsed = time.monotonic() - started

        receipts = await relay.list_receipts()
        checkpoints = {f"th-{t}": await relay.load_checkpoint(f"th-{t}") for t in range(threads)}

    assert all(v.returncode == -9 for v in victims)
    outcomes = [o for outcomes in survivors for o in outcomes] + recovery
    assert [o for o in outcomes if "error" in o] == []
    assert len(recovery) == len(pairs)
    assert any(o["replayed"] for o in outcomes) and not all(o["replayed"] for o in outcomes)

    # Every (thread, turn) committed exactly once, each thread's versions gapless.
    turns = cluster.query(cluster.schema, "SELECT thread_id, turn_id, version FROM ik_turns")
    assert sorted([t, u] for t, u, _ in turns) == sorted(pairs)
    for t in range(threads):
        versions = sorted(v for th, _, v in turns if th == f"th-{t}")
        assert versions == list(range(1, per_thread + 1))
        checkpoint = checkpoints[f"th-{t}"]
        assert checkpoint is not None and checkpoint.version == per_thread

    # No effect reached the provider twice; every call is accounted for by a receipt
    # that is completed, or uncertain when the caller died before hearing back.
    calls = cluster.query(cluster.ledger, "SELECT thread_id, key FROM calls")
    uncertain = sum(r.status == "uncertain" for r in receipts)
    print(f"{elapsed:.1f}s, {len(calls)} provider calls, {uncertain} uncertain receipts")
    assert [c for c, n in Counter(calls).items() if n > 1] == []
    by_key = {(r.thread_id, r.key): r for r in receipts}
    assert len(by_key) == threads * (per_thread + 4)
    assert {r.status for r in receipts} <= {"completed", "uncertain"}
    for call in calls:
        assert by_key[call].status in ("completed", "uncertain")
    completed = {k for k, r in by_key.items() if r.status == "completed"}
    assert completed <= set(calls)

    # The relay saw every event exactly once, in gapless positions; seq gapless per thread;
    # one turn.committed per committed turn, carrying its version.
    assert len(everything) == cluster.query(cluster.schema, "SELECT count(*) FROM ik_outbox")[0][0]
    assert seen == everything
    assert [e.position for e in seen] == list(range(1, len(seen) + 1))
    assert len({e.id for e in seen}) == len(seen)
    for t in range(threads):
        seqs = [e.seq for e in seen if e.thread_id == f"th-{t}"]
        assert seqs == list(range(1, len(seqs) + 1))
    committed = Counter(
        (e.thread_id, e.turn_id, e.payload["version"]) for e in seen if e.type == "turn.committed"
    )
    assert committed == Counter((t, u, v) for t, u, v in turns)
    assert len(seen) == 3 * len(turns)
    locks = "SELECT count(*) FROM pg_locks JOIN pg_stat_activity USING (pid) "
    locks += "WHERE locktype = 'advisory' AND application_name = %s"
    assert cluster.query(cluster.schema, locks, cluster.schema) == [(0,)]
