"""Timers fired by several real worker processes, on SQLite and on PostgreSQL, while
workers are killed (SIGKILL mid-run, and ``os._exit`` at a turn's durable points):
each timer's turn commits exactly once, and none is lost. The killed workers' claims
are taken over once they end (``claim_for``)."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import prefork
from intention_kernel import Kernel
from intention_kernel.durability._contract.records import Timer, TimerWrite
from intention_kernel.testing import faults
from proving_support import Store, make_sql_store
from timer_worker import timer_agent

WORKER = Path(__file__).with_name("timer_worker.py")
TIMERS = 240
THREADS = 40
DEADLINE = 120.0  # seconds for every timer to be settled


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path)


async def set_timers(store: Store) -> set[tuple[str, str]]:
    """``TIMERS`` timers over ``THREADS`` threads, all due already."""
    due = datetime.now(UTC) - timedelta(seconds=1)
    async with store.durability() as durability:
        kernel = Kernel(timer_agent(0.0), durability)
        keys = set()
        for n in range(TIMERS):
            thread, key = f"t{n % THREADS}", f"k{n}"
            await kernel.schedule(thread, key, at=due - timedelta(microseconds=n))
            keys.add((thread, key))
    return keys


async def spawn(store: Store, **options: Any) -> prefork.Forked:
    config = {"store": store.config(), "claim_for": 1.5, "limit": 8, "hold": 0.01, **options}
    return await prefork.spawn(WORKER, json.dumps(config))


def fired_count(store: Store) -> int:
    return int(store.query("SELECT count(*) FROM ik_timers WHERE status = 'fired'")[0][0])


async def check_exactly_once(store: Store, keys: set[tuple[str, str]]) -> None:
    """Every timer fired, each by exactly one committed turn announced once."""
    rows = store.query("SELECT thread_id, key, status, turn_id FROM ik_timers")
    assert {(t, k) for t, k, _, _ in rows} == keys
    assert Counter(status for _, _, status, _ in rows) == {"fired": TIMERS}
    turns = {(t, u) for t, _, _, u in rows}
    committed = store.query("SELECT thread_id, turn_id FROM ik_turns")
    assert sorted(committed) == sorted(turns)  # one turn per timer, and no other
    events = store.query("SELECT thread_id, turn_id, type FROM ik_outbox WHERE turn_id IS NOT NULL")
    per_turn = Counter((t, u, kind) for t, u, kind in events)
    for thread, turn in turns:
        assert per_turn[(thread, turn, "turn.committed")] == 1
        assert per_turn[(thread, turn, "timer.fired")] == 1
    versions = store.query("SELECT thread_id, version FROM ik_threads")
    assert sum(v for _, v in versions) == TIMERS  # no thread committed a turn twice


async def finish(processes: list[prefork.Forked]) -> list[str]:
    lines = []
    for process in processes:
        out, err = await asyncio.wait_for(process.communicate(), DEADLINE)
        if process.returncode not in (0, -signal.SIGKILL, faults.EXIT_STATUS):
            pytest.fail(f"a worker exited with {process.returncode}: {err.decode()[-2000:]}")
        lines.extend(out.decode().splitlines())
    return lines


async def test_workers_killed_mid_run_fire_each_timer_exactly_once(sql_store: Store) -> None:
    keys = await set_timers(sql_store)
    workers = [await spawn(sql_store) for _ in range(3)]
    start = time.monotonic()
    while fired_count(sql_store) < TIMERS // 6:  # well into the run
        assert time.monotonic() - start < DEADLINE, "the workers fire nothing"
        await asyncio.sleep(0.01)
    workers[0].send_signal(signal.SIGKILL)  # its claims and turns in flight are left
    workers.append(await spawn(sql_store))  # a late worker joins
    lines = await finish(workers)
    assert workers[0].returncode == -signal.SIGKILL
    await check_exactly_once(sql_store, keys)
    outcomes = Counter(json.loads(line)["o"] for line in lines)
    assert outcomes["failed"] == 0
    assert outcomes["fired"] <= TIMERS


@pytest.mark.parametrize(
    "point", [faults.AFTER_LOCK, faults.BEFORE_COMMIT, faults.DURING_COMMIT, faults.AFTER_COMMIT]
)
async def test_a_worker_dying_at_a_durable_point_leaves_no_timer_lost_or_doubled(
    sql_store: Store, point: str
) -> None:
    keys = await set_timers(sql_store)
    dying = await spawn(sql_store, fault={"point": point, "skip": 2})
    start = time.monotonic()
    while fired_count(sql_store) == 0 and dying.returncode is None:  # a head start
        assert time.monotonic() - start < DEADLINE, "the dying worker fires nothing"
        await asyncio.sleep(0.01)
    workers = [dying, await spawn(sql_store), await spawn(sql_store)]
    await finish(workers)
    assert dying.returncode == faults.EXIT_STATUS  # it died where it was told
    await check_exactly_once(sql_store, keys)


#: Timers of the soak by default; ``--soak-turns N`` sets another count.
SOAK_TIMERS = 2_000


@pytest.mark.soak
@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_soak_workers_killed_at_random_fire_every_timer_exactly_once(
    sql_store: Store, request: pytest.FixtureRequest
) -> None:
    """Many timers, three workers at a time, one killed (SIGKILL) every second and
    replaced: at the end each timer fired by exactly one committed turn."""
    count = request.config.getoption("--soak-turns") or SOAK_TIMERS
    due = datetime.now(UTC) - timedelta(seconds=1)
    keys: set[tuple[str, str]] = set()
    async with sql_store.durability() as durability:
        recorder: Any = await durability.recorder()  # type: ignore[attr-defined]
        threads = max(1, count // 50)
        for t in range(threads):
            thread = f"s{t}"
            writes = []
            for n in range(t, count, threads):
                at = due - timedelta(microseconds=n)
                timer = Timer(thread, f"k{n}", at, set_at=datetime.now(UTC))
                writes.append(TimerWrite(thread, timer.key, timer))
                keys.add((thread, timer.key))
            async with recorder.lock(thread):
                await recorder.write_timers(thread, writes, ())
    workers = [await spawn(sql_store, hold=0.0) for _ in range(3)]
    spawned = list(workers)
    rng = random.Random(request.config.getoption("--soak-seed") or 37)
    deadline = time.monotonic() + 800
    while fired_count(sql_store) < count:
        assert time.monotonic() < deadline, f"{fired_count(sql_store)} of {count} fired"
        await asyncio.sleep(1.0)
        victim = workers.pop(rng.randrange(len(workers)))
        if victim.returncode is None:
            victim.send_signal(signal.SIGKILL)
        replacement = await spawn(sql_store, hold=0.0)
        workers.append(replacement)
        spawned.append(replacement)
    await finish(spawned)
    rows = sql_store.query("SELECT thread_id, key, status, turn_id FROM ik_timers")
    assert {(t, k) for t, k, _, _ in rows} == keys
    assert Counter(status for _, _, status, _ in rows) == {"fired": count}
    committed = sql_store.query("SELECT thread_id, turn_id FROM ik_turns")
    assert sorted(committed) == sorted((t, u) for t, _, _, u in rows)
    events = sql_store.query("SELECT turn_id FROM ik_outbox WHERE type = 'timer.fired'")
    assert len(events) == count and len(set(events)) == count
