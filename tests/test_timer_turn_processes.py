"""A timer's turn in real worker processes, on SQLite and PostgreSQL (issue 37).

A worker killed in the middle of a timer's turn in model rounds (``os._exit``, no
cleanup) is taken over once its claim lapses: the rounds it recorded are not asked
of the model again, and its write takes effect once. A cancel sent from another
process stops a timer's turn at its next safe point; the timer is settled."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import prefork
from intention_kernel import Kernel
from intention_kernel._timers import timer_turn_id
from intention_kernel.durability._engine.recorded import RecordedDurability
from intention_kernel.testing import faults
from proving_support import Store, make_sql_store
from timer_rounds_worker import held_agent

WORKER = Path(__file__).with_name("timer_rounds_worker.py")
DEADLINE = 60.0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path)


def files_in(tmp_path: Path) -> dict[str, str]:
    names = ("asks", "tools", "ledger", "entered", "release")
    return {name: str(tmp_path / f"{name}.jsonl") for name in names}


def lines(path: str) -> list[dict[str, Any]]:
    file = Path(path)
    if not file.exists():
        return []
    return [json.loads(line) for line in file.read_text().splitlines()]


async def run_worker(store: Store, files: dict[str, str], **options: Any) -> tuple[int, list[Any]]:
    config = {"store": store.config(), "files": files, "claim_for": 1.0, **options}
    process = await prefork.spawn(WORKER, json.dumps(config))
    out, err = await asyncio.wait_for(process.communicate(), DEADLINE)
    assert process.returncode in (0, faults.EXIT_STATUS), err.decode()[-2000:]
    return process.returncode, [json.loads(line) for line in out.decode().splitlines()]


async def schedule(store: Store, agent: Any, **when: Any) -> datetime:
    due = datetime.now(UTC) - timedelta(seconds=1)
    async with store.durability() as durability:
        await Kernel(agent, durability).schedule("t", "job", at=due, **when)
    return due


@pytest.mark.parametrize("die", ["asked_round_3", "in_pay"])
async def test_a_worker_killed_mid_timer_turn_is_taken_over_rounds_not_asked_again(
    sql_store: Store, tmp_path: Path, die: str
) -> None:
    files = files_in(tmp_path)
    due = await schedule(sql_store, held_agent(files))
    status, _ = await run_worker(sql_store, files, agent="rounds", die=die)
    assert status == faults.EXIT_STATUS
    first = lines(files["asks"])
    assert [a["round"] for a in first] == ([1, 2, 3] if die == "asked_round_3" else [1, 2])
    status, outcomes = await run_worker(sql_store, files, agent="rounds")
    assert status == 0
    turn_id = timer_turn_id("job", due)
    assert [(o["u"], o["o"]) for o in outcomes] == [(turn_id, "fired")]
    assert outcomes[0]["reply"].startswith("paid: ")
    asks = lines(files["asks"])[len(first) :]
    assert [a["round"] for a in asks] == [3]  # rounds 1 and 2 came from the journal
    assert len(lines(files["ledger"])) == 1  # the write took effect once
    assert sql_store.query("SELECT thread_id, turn_id FROM ik_turns") == [("t", turn_id)]
    rows = sql_store.query("SELECT status, turn_id FROM ik_timers")
    assert rows == [("fired", turn_id)]


@pytest.mark.parametrize("every", [None, timedelta(hours=1)])
async def test_a_timer_turn_is_cancelled_from_another_process(
    sql_store: Store, tmp_path: Path, every: timedelta | None
) -> None:
    files = files_in(tmp_path)
    due = await schedule(sql_store, held_agent(files), every=every)
    turn_id = timer_turn_id("job", due)
    worker = asyncio.create_task(run_worker(sql_store, files, agent="held"))
    while not lines(files["entered"]):  # its turn runs its first step
        assert not worker.done(), worker.result()
        await asyncio.sleep(0.02)
    async with sql_store.durability() as durability:
        cancel = await Kernel(held_agent(files), durability).cancel("t", turn_id, reason="enough")
    assert cancel.status == "requested"
    Path(files["release"]).touch()  # noqa: ASYNC240
    status, outcomes = await worker
    assert status == 0
    assert [(o["u"], o["o"]) for o in outcomes] == [(turn_id, "cancelled")]
    assert "Cancelled before it finished: enough" in outcomes[0]["reply"]
    assert [t["tool"] for t in lines(files["tools"])] == ["jobs.first"]  # no second step
    assert sql_store.query("SELECT thread_id, turn_id FROM ik_turns") == [("t", turn_id)]
    (row,) = sql_store.query("SELECT status, due_at FROM ik_timers")
    if every is None:
        assert row[0] == "fired"
    else:  # its next occurrence stands
        assert row[0] == "pending"


async def test_a_cancel_of_a_timer_turn_another_process_runs_while_its_copy_waits_is_requested(
    sql_store: Store, tmp_path: Path
) -> None:
    """Process A fires a timer, and its turn is held in its first step. A's claim lapses:
    this process claims the occurrence too, finds the thread busy, and queues a copy of
    the turn. Process C, which runs neither, cancels the turn. It answers "requested",
    not "dequeued": the turn runs in A. The copy stays queued. Once released, A's turn
    stops at its next safe point, and this process's copy replays its commit."""
    files = files_in(tmp_path)
    due = await schedule(sql_store, held_agent(files))
    turn_id = timer_turn_id("job", due)
    worker = asyncio.create_task(run_worker(sql_store, files, agent="held"))
    while not lines(files["entered"]):  # its turn runs its first step
        assert not worker.done(), worker.result()
        await asyncio.sleep(0.02)
    async with sql_store.durability() as durability:
        agent = dataclasses.replace(held_agent(files), on_busy="queue")
        kernel = Kernel(agent, durability)
        await asyncio.sleep(1.2)  # A's claim (1 s) lapses while its turn runs
        [queued] = await kernel.fire_due_timers(claim_for=30.0)
        assert (queued.turn_id, queued.outcome) == (turn_id, "queued")
        assert isinstance(durability, RecordedDurability)
        assert [e.turn_id for e in await durability.read_inbox("t")] == [turn_id]
        cancel = {"thread_id": "t", "turn_id": turn_id, "reason": "enough"}
        status, answers = await run_worker(sql_store, files, agent="held", cancel=cancel)
        assert (status, answers) == (0, [{"cancelled": "requested"}])
        assert [e.turn_id for e in await durability.read_inbox("t")] == [turn_id]  # it stays
        Path(files["release"]).touch()  # noqa: ASYNC240
        status, outcomes = await worker
        assert status == 0
        assert [(o["u"], o["o"]) for o in outcomes] == [(turn_id, "cancelled")]
        await asyncio.wait_for(kernel.drained(), DEADLINE)  # the copy replays A's commit
        assert await durability.read_inbox("t") == []
    assert [t["tool"] for t in lines(files["tools"])] == ["jobs.first"]  # no second step
    assert sql_store.query("SELECT thread_id, turn_id FROM ik_turns") == [("t", turn_id)]
    assert sql_store.query("SELECT status, turn_id FROM ik_timers") == [("fired", turn_id)]
