"""Real processes killed at the inbox's durable points (issue 36), on SQLite and
PostgreSQL: during an interrupted turn's commit, and after a steer was taken by a
turn whose process then died and which nobody delivers again."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inbox_support import (
    INTERRUPT_WORKER,
    STEER_WORKER,
    run_worker,
    wait_for_file,
    worker_process,
)
from intention_kernel import (
    Intent,
    Interpretation,
    InterpretationRequest,
    Kernel,
    Queued,
    SteerOrphanedError,
    TurnResult,
)
from intention_kernel.durability._engine.recorded import RecordedDurability
from intention_kernel.testing import faults
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import Store, make_sql_store, read_all_events

INTERRUPTED = "Interrupted by a new message."


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path)


class OneLookUp:
    """Asks for one balance look-up, at once."""

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        return Interpretation(intents=[Intent("billing.balance", {"due": 7})])


def committed(events: list[Any], turn_id: str) -> list[Any]:
    return [e for e in events if e.type == "turn.committed" and e.turn_id == turn_id]


@pytest.mark.slow
@pytest.mark.parametrize("point", [faults.BEFORE_COMMIT, faults.DURING_COMMIT, faults.AFTER_COMMIT])
async def test_a_process_killed_during_an_interrupted_turns_commit(
    sql_store: Store, tmp_path: Path, point: str
) -> None:
    """Turn 1 runs in a worker process; message 2, sent here, interrupts it. Turn 1
    stops at its next safe point and the worker dies (``os._exit``) at a point of
    that commit. The lock is free once it died: message 2 runs here once. Turn 1
    committed once, interrupted (after the commit), or not at all: then its
    redelivery, in a new process, commits it once, in full."""
    files = {name: str(tmp_path / name) for name in ("entered", "release")}
    turn = {"thread_id": "t", "turn_id": "1", "message": "look twice"}
    async with sql_store.durability() as durability:  # the schema, before any worker
        agent = dataclasses.replace(
            billing_agent(FakeProvider()), interpreter=OneLookUp(), on_busy="interrupt"
        )
        kernel = Kernel(agent, durability)
        config = {"store": sql_store.config(), "files": files, "turn": turn, "fault": point}
        async with worker_process(INTERRUPT_WORKER, config) as worker:
            await wait_for_file(files["entered"])
            assert await kernel.submit("t", "2", "balance") == Queued("t", "2", 1)
            Path(files["release"]).touch()  # noqa: ASYNC240
            out, err = await asyncio.wait_for(worker.communicate(), 60)
        assert worker.returncode == faults.EXIT_STATUS, err.decode()
        # It was stopped before its first step, and died at the commit.
        seen = [json.loads(line) for line in out.decode().splitlines()]
        assert seen == [{"stop": "interrupt"}], seen
        await asyncio.wait_for(kernel.drained(), 60)  # this process waited for the lock
        assert isinstance(durability, RecordedDurability)
        assert await durability.read_inbox("t") == []
        events = await read_all_events(durability, thread_id="t")
        first_committed = point == faults.AFTER_COMMIT
        assert len(committed(events, "1")) == (1 if first_committed else 0)
        assert len(committed(events, "2")) == 1

        second = await kernel.submit("t", "2", "balance")
        assert isinstance(second, TurnResult) and second.replayed
        # The new message ran in full: the interrupt did not stop it.
        assert [s.value for s in second.steps] == [{"due": 7}]
        assert INTERRUPTED not in (second.reply or "")
        # Next after the interrupted turn when that committed; else first.
        assert second.checkpoint_version == (2 if first_committed else 1)

        redelivery = await run_worker(INTERRUPT_WORKER, dict(config, fault=None))
        out, err = await asyncio.wait_for(redelivery.communicate(), 60)
        assert redelivery.returncode == 0, err.decode()
        first = json.loads(out.decode().splitlines()[-1])["result"]
        if first_committed:  # its result, replayed: stopped before its first step
            assert (first["replayed"], first["checkpoint_version"]) == (True, 1)
            assert first["steps"] == [] and first["reply"].endswith(INTERRUPTED)
        else:  # run now, on top of message 2: nothing stops it
            assert (first["replayed"], first["checkpoint_version"]) == (False, 2)
            assert len(first["steps"]) == 2 and INTERRUPTED not in first["reply"]
        events = await read_all_events(durability, thread_id="t")
        assert [len(committed(events, t)) for t in ("1", "2")] == [1, 1]
        assert len([e for e in events if e.type == "turn.cancelled"]) == int(first_committed)
        assert await kernel.drain("t") == []


@pytest.mark.slow
@pytest.mark.parametrize("die", ["taken", "asked_round_2"])
async def test_a_steer_taken_by_a_killed_turn_reaches_a_model_once(
    sql_store: Store, tmp_path: Path, die: str
) -> None:
    """Turn 1, in a worker process, takes steer 2 at its round boundary and dies
    (``os._exit``): before its journal records the steer, or after, with the model
    asked. The steer's own delivery comes first, here, once the dead worker's lock
    is free. Unrecorded, the steer runs as its own turn, once, and a late
    redelivery of turn 1 never hears it. Recorded, it stays with turn 1, whose
    model may have acted on it: its delivery says to deliver turn 1 again, whose
    redelivery (a new process) commits both."""
    from steer_worker import SteeredModel

    files = {name: str(tmp_path / name) for name in ("asks", "entered", "release")}
    turn = {"thread_id": "t", "turn_id": "1", "message": "paint it"}
    async with sql_store.durability() as durability:  # the schema, before any worker
        agent = dataclasses.replace(
            billing_agent(FakeProvider()),
            interpreter=SteeredModel(files, None),
            on_busy="steer",
        )
        kernel = Kernel(agent, durability)
        config = {"store": sql_store.config(), "files": files, "turn": turn, "die": die}
        async with worker_process(STEER_WORKER, config) as worker:
            await wait_for_file(files["entered"])
            assert await kernel.submit("t", "2", "make it blue") == Queued("t", "2", 1)
            Path(files["release"]).touch()  # noqa: ASYNC240
            _, err = await asyncio.wait_for(worker.communicate(), 60)
        assert worker.returncode == faults.EXIT_STATUS, err.decode()
        assert isinstance(durability, RecordedDurability)
        assert await durability.taker("t", "2") == "1"  # taken, then its taker died

        recorded = die == "asked_round_2"
        if recorded:  # turn 1 was delivered directly: only its client has its request
            for deliver in (kernel.turn, kernel.submit):
                with pytest.raises(SteerOrphanedError, match="deliver '1' again") as orphaned:
                    await asyncio.wait_for(deliver("t", "2", "make it blue"), 60)
                assert (orphaned.value.turn_id, orphaned.value.taken_by) == ("2", "1")
            assert await durability.taker("t", "2") == "1"
        else:
            own = await asyncio.wait_for(kernel.turn("t", "2", "make it blue"), 60)
            assert (own.turn_id, own.replayed, own.checkpoint_version) == ("2", False, 1)
            assert await durability.taker("t", "2") is None
        assert await durability.read_inbox("t") == []

        redelivery = await run_worker(STEER_WORKER, dict(config, die=None))
        out, err = await asyncio.wait_for(redelivery.communicate(), 60)
        assert redelivery.returncode == 0, err.decode()
        result = json.loads(out)
        lines = Path(files["asks"]).read_text().splitlines()  # noqa: ASYNC240
        # The model's round 2 in the workers (this process's model ran the steer's turn).
        asks = [a for a in map(json.loads, lines) if a["round"] == 2 and a["pid"] != os.getpid()]
        if recorded:  # the same round heard it on both deliveries, and it ran once
            assert result["reply"] == "Painted, hearing: make it blue"
            assert [a["steered"] for a in asks] == [["make it blue"], ["make it blue"]]
            steer = await kernel.submit("t", "2", "make it blue")
            assert isinstance(steer, TurnResult)
            assert (steer.turn_id, steer.replayed) == ("1", True)
        else:  # it took nothing it recorded: it runs, and hears nothing
            assert (result["reply"], result["checkpoint_version"]) == ("Painted, hearing: ", 2)
            assert [a["steered"] for a in asks] == [[]]
        events = await read_all_events(durability, thread_id="t")
        assert len(committed(events, "1")) == 1
        assert len(committed(events, "2")) == int(not recorded)
        steered = [e.payload["turn_id"] for e in events if e.type == "turn.steered"]
        assert steered == (["2"] if recorded else [])
        assert await kernel.drain("t") == []


@pytest.mark.slow
async def test_a_steer_recorded_by_a_killed_queued_turn_runs_that_turn_to_its_end(
    sql_store: Store, tmp_path: Path
) -> None:
    """Turn 1 was queued, and a worker's drain runs it. It takes steer 2, sent by
    another process that then went away. It journals the steer, asks round 2 and
    dies (``os._exit``). Nobody delivers turn 1 again, but its inbox entry keeps its
    request. The steer's own delivery, here, once the dead worker's lock is free,
    drains the inbox up to turn 1. Turn 1 goes on from its journal (round 1 is
    not asked again), commits once, and the steer answers with its result."""
    from steer_worker import SteeredModel

    files = {name: str(tmp_path / name) for name in ("asks", "entered", "release")}
    turn = {"thread_id": "t", "turn_id": "1", "message": "paint it"}
    steer = {"thread_id": "t", "turn_id": "2", "message": "make it blue"}
    async with sql_store.durability() as durability:  # the schema, before any worker
        config = {"store": sql_store.config(), "files": files, "turn": turn}
        taker = dict(config, die="asked_round_2", queued=True)
        async with worker_process(STEER_WORKER, taker) as worker:
            await wait_for_file(files["entered"])
            sender = dict(config, turn=steer, submit=True)  # the steer's client, then gone
            async with worker_process(STEER_WORKER, sender) as client:
                out, err = await asyncio.wait_for(client.communicate(), 60)
            assert client.returncode == 0, err.decode()
            assert json.loads(out) == {"thread_id": "t", "turn_id": "2", "position": 2}
            Path(files["release"]).touch()  # noqa: ASYNC240
            _, err = await asyncio.wait_for(worker.communicate(), 60)
        assert worker.returncode == faults.EXIT_STATUS, err.decode()
        assert isinstance(durability, RecordedDurability)
        assert await durability.taker("t", "2") == "1"  # taken, then its taker died
        assert [e.turn_id for e in await durability.read_inbox("t")] == ["1"]

        agent = dataclasses.replace(
            billing_agent(FakeProvider()),
            interpreter=SteeredModel(files, None),
            on_busy="steer",
        )
        kernel = Kernel(agent, durability)
        result = await asyncio.wait_for(kernel.turn("t", "2", "make it blue"), 60)
        assert (result.turn_id, result.replayed) == ("1", True)
        assert result.reply == "Painted, hearing: make it blue"
        assert [s.value for s in result.steps] == [{"due": 1}]  # round 1's look-up, once
        asks = [json.loads(line) for line in Path(files["asks"]).read_text().splitlines()]  # noqa: ASYNC240
        here = [a for a in asks if a["pid"] == os.getpid()]
        assert [(a["round"], a["steered"]) for a in here] == [(2, ["make it blue"])]
        assert [a["round"] for a in asks if a["pid"] != os.getpid()] == [1, 2]
        events = await read_all_events(durability, thread_id="t")
        assert [len(committed(events, t)) for t in ("1", "2")] == [1, 0]
        steered = [e.payload["turn_id"] for e in events if e.type == "turn.steered"]
        assert steered == ["2"]
        assert await durability.read_inbox("t") == []
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.version == 1
        again = await kernel.submit("t", "2", "make it blue")
        assert isinstance(again, TurnResult) and again.reply == result.reply
        assert await kernel.drain("t") == []
