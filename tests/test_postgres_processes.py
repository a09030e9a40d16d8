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

import prefork
from intention_kernel._checkpoint import SCHEMA_REVISION, KernelCheckpoint
from intention_kernel._turns import OutboxEvent, TurnCommit, TurnResult, TurnScope
from intention_kernel.durability import TurnTransaction
from intention_kernel.durability.postgres import MIGRATIONS, PostgresDurability
from intention_kernel.errors import ThreadBusyError

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

WORKER = Path(__file__).with_name("postgres_worker.py")
PROCESS_TIMEOUT = 60.0


class Cluster:
    """Worker processes on one store (``schema``) and one provider ledger (``ledger``)."""

    def __init__(self, dsn: str, root: Path) -> None:
        suffix = uuid.uuid4().hex[:12]
        self.schema, self.ledger = f"ik_test_{suffix}", f"ik_ledger_{suffix}"
        self.dsn, self.root = make_conninfo(dsn, application_name=self.schema), root
        self.processes: list[prefork.Forked] = []

    def path(self, name: str) -> str:
        return str(self.root / name)

    def durability(self, **options: Any) -> PostgresDurability:
        return PostgresDurability(self.dsn, schema=self.schema, **options)

    def query(self, schema: str, text: str, *args: object) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
            cur = conn.execute(text.encode(), args or None)
            return cur.fetchall() if cur.description else []

    async def spawn(self, **config: Any) -> prefork.Forked:
        # A killed worker's threads are free once its leases lapse: 3 s here, not 30.
        config = {
            "dsn": self.dsn,
            "schema": self.schema,
            "ledger": self.ledger,
            "lease_expiry": 3.0,
            **config,
        }
        process = await prefork.spawn(WORKER, json.dumps(config))
        self.processes.append(process)
        return process

    async def wait_for_file(self, path: str, process: prefork.Forked) -> None:
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


async def finish(process: prefork.Forked) -> list[dict[str, Any]]:
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


async def test_a_killed_lease_holder_frees_its_thread_when_its_lease_expires(
    cluster: Cluster,
) -> None:
    """A SIGKILLed worker cannot release its lease: the thread stays taken until the
    lease expires (here 2 s), then the next worker takes it and finds nothing of the
    dead turn."""
    holder = await cluster.spawn(
        mode="hold", thread="t", ready=cluster.path("ready"), lease_expiry=2.0
    )
    await cluster.wait_for_file(cluster.path("ready"), holder)
    async with cluster.durability(lock_timeout=0.3) as durability:
        with pytest.raises(ThreadBusyError):
            await durability.with_turn(TurnScope("t", "mine"), first_commit)
        holder.kill()
        await holder.communicate()
        async with cluster.durability(lock_timeout=0.3) as impatient:
            with pytest.raises(ThreadBusyError):  # its lease outlives it, for a while
                await impatient.with_turn(TurnScope("t", "mine"), first_commit)
        async with cluster.durability(lock_timeout=10.0) as patient:
            result = await patient.with_turn(TurnScope("t", "mine"), first_commit)
        assert (result.replayed, result.checkpoint_version) == (False, 1)  # held one left nothing


class Worker:
    """A ``turns`` worker whose report lines are read as they come."""

    def __init__(self, process: prefork.Forked, schedule: list[list[str]]) -> None:
        self.process, self.schedule, self.pid = process, schedule, process.pid
        self.outcomes: list[dict[str, Any]] = []
        self.stderr = b""
        self._reading = asyncio.gather(self._read_stdout(), self._read_stderr())

    async def _read_stdout(self) -> None:
        while line := await self.process.stdout.readline():
            self.outcomes.append(json.loads(line))

    async def _read_stderr(self) -> None:
        self.stderr = await self.process.stderr.read()

    async def finished(self) -> list[dict[str, Any]]:
        await asyncio.wait_for(self.process.wait(), PROCESS_TIMEOUT)
        await self._reading
        assert self.process.returncode == 0, self.stderr.decode()
        return self.outcomes

    async def killed(self) -> list[list[str]]:
        """SIGKILL it; what it had not reported yet (the turn it was in, and the rest)."""
        self.process.kill()
        await self.process.wait()
        await self._reading
        assert self.process.returncode == -9
        return self.schedule[len(self.outcomes) :]


def deal(
    pairs: list[list[str]], n_workers: int, victims: set[int], rng: random.Random
) -> tuple[list[list[list[str]]], list[list[int]]]:
    """Each worker's schedule, and the positions in it of the pairs only it delivers.

    Every pair goes to one worker; half of those not dealt to a victim go to a second
    worker as well (any other, a victim included), which races the first on it. So a
    victim's own pairs are delivered by nobody else: each is a fresh provider call when
    it gets there, and what a victim that is not respawned leaves behind only the
    recovery can commit.
    """
    shuffled = list(pairs)
    rng.shuffle(shuffled)
    schedules: list[list[list[str]]] = [[] for _ in range(n_workers)]
    raced: set[tuple[str, str]] = set()
    for i, pair in enumerate(shuffled):
        first = i % n_workers
        schedules[first].append(pair)
        if first not in victims and rng.random() < 0.5:
            second = rng.choice([w for w in range(n_workers) if w != first])
            schedules[second].append(pair)
            raced.add((pair[0], pair[1]))
    for schedule in schedules:
        rng.shuffle(schedule)
    alone = [[i for i, p in enumerate(s) if (p[0], p[1]) not in raced] for s in schedules]
    return schedules, alone


@pytest.mark.timeout(120)
async def test_racing_workers_killed_at_random_never_duplicate_anything(
    cluster: Cluster, rng: random.Random
) -> None:
    """8 workers share 6 threads, each with part of the schedule (half of the turns
    delivered by two workers at once). Four are SIGKILLed at spread-out points. Each dies
    the moment its provider call is logged, so mid-turn. It stops there itself, so a
    slow test cannot kill it late. Two are respawned with what they had not reported,
    like a host redelivering. Two are not. A final recovery delivers every turn once
    more. Then: every turn committed exactly once, versions gapless,
    each effect key called at most once, and each turn's events exactly what its
    receipts say."""
    threads, per_thread, n_workers = 6, 20, 8
    pairs = [[f"th-{t}", f"turn-{n}"] for t in range(threads) for n in range(per_thread)]
    victims = rng.sample(range(n_workers), 4)
    respawned, finals = victims[:2], victims[2:]
    schedules, alone = deal(pairs, n_workers, set(victims), rng)

    # Where each victim dies: after reporting this many turns, at its next provider
    # call. The points are spread over the run. Each is early enough that three turns
    # only it delivers (so three fresh calls) are still ahead. The kill comes at the
    # first of them at the latest. A final victim still leaves at least one to the
    # recovery.
    def kill_point(worker: int, low: float, high: float) -> int:
        size = len(schedules[worker])
        return max(1, min(rng.randint(int(size * low), int(size * high)), alone[worker][-3]))

    fractions = [(0.1, 0.3), (0.3, 0.5), (0.3, 0.5), (0.5, 0.8)]
    kill_at = {v: kill_point(v, *fractions[i]) for i, v in enumerate(victims)}

    barrier = cluster.path("go")
    workers: list[Worker] = []
    for i, schedule in enumerate(schedules):
        # A victim stops at that call, once it is logged, and waits there for its kill.
        pause = (
            {"pause_at": kill_at[i], "paused": cluster.path(f"paused-{i}")} if i in kill_at else {}
        )
        process = await cluster.spawn(
            mode="turns",
            turns=schedule,
            read_every=7,
            arrived=cluster.path(f"arrived-{i}"),
            barrier=barrier,
            **pause,
        )
        workers.append(Worker(process, schedule))
    for i, worker in enumerate(workers):
        await cluster.wait_for_file(cluster.path(f"arrived-{i}"), worker.process)
    left_behind: dict[int, list[list[str]]] = {}
    respawns: list[Worker] = []

    async with cluster.durability() as relay:
        seen: list[OutboxEvent] = []
        stop = asyncio.Event()

        async def poll() -> None:  # a relay following the outbox while workers commit
            while not stop.is_set():
                seen.extend(await read_all(relay, seen[-1].position if seen else None))
                await asyncio.sleep(0.002)

        async def kill_mid_turn(victim: int) -> None:
            worker = workers[victim]
            paused = cluster.path(f"paused-{victim}")
            deadline = time.monotonic() + PROCESS_TIMEOUT
            while not exists(paused):
                assert worker.process.returncode is None, f"victim {victim} ended unkilled"
                assert time.monotonic() < deadline, f"victim {victim} never got there"
                await asyncio.sleep(0.001)
            left_behind[victim] = await worker.killed()
            if victim in respawned:  # redelivered by a new process, from where it stopped
                process = await cluster.spawn(mode="turns", turns=left_behind[victim])
                respawns.append(Worker(process, left_behind[victim]))

        started = time.monotonic()
        polling = asyncio.create_task(poll())
        touch(barrier)
        await asyncio.gather(*(kill_mid_turn(v) for v in victims))
        survivors = [await w.finished() for i, w in enumerate(workers) if i not in victims]
        redelivered = [await w.finished() for w in respawns]
        # Every delivery is retried until it commits, as a host would after a crash.
        recovery = await Worker(await cluster.spawn(mode="turns", turns=pairs), pairs).finished()
        stop.set()
        await polling
        seen.extend(await read_all(relay, seen[-1].position if seen else None))
        everything = await read_all(relay)
        elapsed = time.monotonic() - started

        receipts = await relay.list_receipts()
        checkpoints = {f"th-{t}": await relay.load_checkpoint(f"th-{t}") for t in range(threads)}

    outcomes = [o for report in survivors + redelivered for o in report] + recovery
    assert [o for o in outcomes if "error" in o] == []
    assert len(recovery) == len(pairs)

    # The recovery had work to do: turns that only a final victim delivered, and that it
    # did not get to, were first committed by the recovery.
    fresh = {(o["turn"][0], o["turn"][1]) for o in recovery if not o["replayed"]}
    unfinished = {(p[0], p[1]) for v in finals for p in left_behind[v]}
    assert fresh and fresh <= unfinished
    assert any(o["replayed"] for o in outcomes)

    # Every (thread, turn) committed exactly once, each thread's versions gapless.
    turns = cluster.query(cluster.schema, "SELECT thread_id, turn_id, version FROM ik_turns")
    assert sorted([t, u] for t, u, _ in turns) == sorted(pairs)
    for t in range(threads):
        versions = sorted(v for th, _, v in turns if th == f"th-{t}")
        assert versions == list(range(1, per_thread + 1))
        checkpoint = checkpoints[f"th-{t}"]
        assert checkpoint is not None and checkpoint.version == per_thread

    # No effect reached the provider twice; every call is accounted for by a receipt
    # that is completed, or uncertain when the caller died before recording its answer.
    calls = cluster.query(cluster.ledger, "SELECT thread_id, key, pid FROM calls")
    called = Counter((thread, key) for thread, key, _ in calls)
    assert [call for call, n in called.items() if n > 1] == []
    by_key = {(r.thread_id, r.key): r for r in receipts}
    assert len(by_key) == threads * (per_thread + 4)
    assert {r.status for r in receipts} <= {"completed", "uncertain"}
    assert all((r.thread_id, r.key) in called for r in receipts if r.status == "completed")
    victim_pids = {workers[v].pid for v in victims}
    caller = {(thread, key): pid for thread, key, pid in calls}
    uncertain = [k for k, r in by_key.items() if r.status == "uncertain"]
    # Only a death makes one uncertain here (the provider never fails): if it was called
    # at all, a victim called it.
    assert all(caller[k] in victim_pids for k in uncertain if k in caller)

    # The kills interrupted turns: a victim called the provider for a turn it never
    # reported (it died inside it, between that call and the report).
    reported = {
        workers[v].pid: {(o["turn"][0], o["turn"][1]) for o in workers[v].outcomes} for v in victims
    }
    died_inside = [
        (pid, thread, key)
        for thread, key, pid in calls
        if pid in reported
        and key.startswith("charge:")
        and (thread, key.removeprefix("charge:")) not in reported[pid]
    ]
    print(
        f"{elapsed:.1f}s, {len(calls)} provider calls, {len(uncertain)} uncertain receipts, "
        f"kills after {sorted(kill_at.values())} reports, {len(fresh)} turns left to the "
        f"recovery, victims died inside {len(died_inside)} turns"
    )
    assert died_inside

    # The relay saw every event exactly once, in gapless positions; seq gapless per thread.
    assert len(everything) == cluster.query(cluster.schema, "SELECT count(*) FROM ik_outbox")[0][0]
    assert seen == everything
    assert [e.position for e in seen] == list(range(1, len(seen) + 1))
    assert len({e.id for e in seen}) == len(seen)
    for t in range(threads):
        seqs = [e.seq for e in seen if e.thread_id == f"th-{t}"]
        assert seqs == list(range(1, len(seqs) + 1))

    # Per committed turn: one event per effect, saying what its receipt says, then
    # turn.committed with the turn's version; consecutive; nothing else anywhere.
    events: dict[tuple[str, str], list[OutboxEvent]] = {}
    for event in seen:
        assert event.turn_id is not None
        events.setdefault((event.thread_id, event.turn_id), []).append(event)
    assert set(events) == {(t, u) for t, u, _ in turns}
    for thread, turn, version in turns:
        mine = events[(thread, turn)]
        keys = [f"charge:{turn}", f"shared:{int(turn.split('-')[1]) % 4}"]
        stored = [by_key[(thread, key)] for key in keys]
        assert [e.type for e in mine] == [f"effect.{r.status}" for r in stored] + ["turn.committed"]
        assert [e.payload.get("key") for e in mine[:2]] == keys
        for event, receipt in zip(mine[:2], stored, strict=True):
            if receipt.status == "completed":
                assert event.payload["value"] == receipt.value
        assert mine[2].payload == {"version": version}
        assert [e.seq for e in mine] == list(range(mine[0].seq, mine[0].seq + 3))

    # Every lease was let go of, but those of the victims, which lapse on their own.
    live = "SELECT owner FROM ik_leases WHERE expires_at > clock_timestamp()"
    owners = [owner for (owner,) in cluster.query(cluster.schema, live)]
    victim_owners = {str(workers[v].pid) for v in victims}
    assert all(owner.split(":")[1] in victim_owners for owner in owners), owners
