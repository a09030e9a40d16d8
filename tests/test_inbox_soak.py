"""A soak of the inbox with kills (issue 36): several real processes deliver messages
to one thread of a ``"queue"`` agent, and are killed with SIGKILL at random and started
again. No acknowledged message is lost, none runs twice, and the order of acceptance
holds for what each process queued. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import Kernel
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import Store, make_sql_store, read_all_events

WORKER = Path(__file__).with_name("inbox_soak_worker.py")
PROCESSES = 3
TURNS = 12  # per process
KILLS = 6


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path)


def acked(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    # A line cut short by a kill is not an acknowledgement.
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


@pytest.mark.slow
async def test_queued_messages_are_never_lost_or_run_twice_when_processes_are_killed(
    sql_store: Store, tmp_path: Path
) -> None:
    random.seed(36)
    async with sql_store.durability():  # the schema, before any worker
        pass
    acks = tmp_path / "acks.jsonl"
    ready = tmp_path / "ready"  # the start barrier: one file per worker that is ready
    ready.mkdir()
    owed = {w: [f"w{w}-{n:02d}" for n in range(TURNS)] for w in range(PROCESSES)}

    async def start(worker: int, *, first: bool = False) -> asyncio.subprocess.Process:
        done = {a["turn_id"] for a in acked(acks)}
        # A restarted process delivers again what it had not seen acknowledged.
        turns = [t for t in owed[worker] if t not in done]
        config = {"store": sql_store.config(), "thread_id": "t", "turns": turns, "acks": str(acks)}
        # First starts wait for each other, so that their deliveries meet a busy thread.
        # A slow start on a loaded machine would otherwise let each run alone.
        # A restart only says it is ready: a worker killed early must not hold the rest.
        barrier = {"dir": str(ready), "name": str(worker), "parties": PROCESSES, "wait": first}
        config["barrier"] = barrier
        return await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            json.dumps(config),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )

    running = {w: await start(w, first=True) for w in range(PROCESSES)}
    # No kill before every first start is past the barrier. On a loaded machine the
    # kills could otherwise land during the imports, and the restarts run apart.
    # Then no delivery met a busy thread, and the inbox went untested.
    deadline = time.monotonic() + 120
    while len(list(ready.iterdir())) < PROCESSES:
        assert time.monotonic() < deadline, "the workers never got past their imports"
        await asyncio.sleep(0.01)
    kills = 0
    while kills < KILLS and any(p.returncode is None for p in running.values()):
        await asyncio.sleep(random.uniform(0.2, 0.6))
        alive = [w for w, p in running.items() if p.returncode is None]
        if not alive:
            break
        victim = random.choice(alive)
        running[victim].kill()  # SIGKILL: no cleanup, mid-turn or mid-enqueue
        await running[victim].wait()
        kills += 1
        running[victim] = await start(victim)
    for worker, process in running.items():
        _, err = await asyncio.wait_for(process.communicate(), 180)
        assert process.returncode == 0, (worker, err.decode())

    async with sql_store.durability() as durability:
        agent = dataclasses.replace(billing_agent(FakeProvider()), on_busy="queue")
        await Kernel(agent, durability).drain("t")  # what a dead process left queued
        events = await read_all_events(durability, thread_id="t")
        committed = [e.turn_id for e in events if e.type == "turn.committed"]
        checkpoint = await durability.load_checkpoint("t")
        inbox = await durability.read_inbox("t")  # type: ignore[attr-defined]
    every = {t for turns in owed.values() for t in turns}
    assert {a["turn_id"] for a in acked(acks)} == every  # each was acknowledged at last
    assert len(committed) == len(set(committed))  # none ran twice
    assert set(committed) == every  # none was lost
    assert inbox == []
    assert checkpoint is not None and checkpoint.version == len(every)
    # Each process's messages committed in the order it delivered them.
    for turns in owed.values():
        assert [t for t in committed if t in set(turns)] == turns
    assert kills > 0
    # The inbox was used: deliveries met a busy thread and were queued.
    assert any(a["ack"] == "queued" for a in acked(acks))
