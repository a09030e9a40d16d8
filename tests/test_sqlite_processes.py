"""The SQLite adapter's guarantees, proven with real OS processes and real crashes.

Each multi-process test starts workers (``tests/sqlite_worker.py``) on one database
file. A worker is a billing agent whose fake payment provider appends one fsync'd line
per call to a ledger file. The test kills some of them. Then it checks what a user
would see: turn results, receipts, the checkpoint, the outbox, and how often the
provider was really called. After every test, the outbox may only hold events of turns
that committed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import prefork
from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    FencedCommitError,
    Intent,
    Interpretation,
    Kernel,
    capability,
)
from intention_kernel._effects import ReceiptStatus
from intention_kernel._interpretation import InterpretationRequest
from intention_kernel._turns import OutboxEvent, TurnCommit, TurnScope
from intention_kernel.durability import TurnTransaction
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.testing.conformance import commit_for

WORKER = Path(__file__).with_name("sqlite_worker.py")
CRASH_STATUS = 137  # what the worker exits with when it simulates a crash
PROCESS_TIMEOUT = 20.0
FILE_TIMEOUT = 15.0


def charge_key(payment_intent_id: str) -> str:
    """The stored (and provider idempotency) key of the worker's charge."""
    return f"payments.charge:charge:{payment_intent_id}"


def turn(thread_id: str, turn_id: str, payment_intent_id: str, amount: int) -> dict[str, str]:
    return {
        "thread_id": thread_id,
        "turn_id": turn_id,
        "message": f"charge {payment_intent_id} {amount}",
    }


# -- processes -------------------------------------------------------------------------------


class Worker:
    """One worker process and what it printed."""

    def __init__(self, name: str, process: prefork.Forked) -> None:
        self.name = name
        self.process = process

    async def finish(self, status: int = 0) -> list[dict[str, Any]]:
        """Wait for the process; check its exit status; return its turn outcomes."""
        stdout, stderr = await asyncio.wait_for(self.process.communicate(), PROCESS_TIMEOUT)
        assert self.process.returncode == status, (
            f"worker {self.name} exited with {self.process.returncode}, expected {status}; "
            f"stderr:\n{stderr.decode()}"
        )
        return [json.loads(line) for line in stdout.decode().splitlines()]

    async def kill(self) -> None:
        """SIGKILL: no cleanup code of the worker runs."""
        self.process.kill()
        await self.process.communicate()
        assert self.process.returncode == -9


class Cluster:
    """Workers sharing one database file and one provider ledger."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.db = root / "billing.db"
        self.ledger = root / "provider.ledger"
        self.workers: list[Worker] = []

    def path(self, name: str) -> str:
        return str(self.root / name)

    async def spawn(self, turns: Sequence[dict[str, str]], **options: Any) -> Worker:
        config = {"db": str(self.db), "ledger": str(self.ledger), "turns": list(turns), **options}
        process = await prefork.spawn(WORKER, json.dumps(config))
        worker = Worker(f"#{len(self.workers)}", process)
        self.workers.append(worker)
        return worker

    async def wait_for_file(self, path: str, worker: Worker) -> None:
        """Wait until ``worker`` creates ``path``; fail early if it died instead."""
        deadline = time.monotonic() + FILE_TIMEOUT
        while not exists(path):
            if worker.process.returncode is not None:
                await worker.finish()  # fails with the worker's stderr
                pytest.fail(f"worker {worker.name} exited without creating {path}")
            assert time.monotonic() < deadline, f"worker {worker.name} never created {path}"
            await asyncio.sleep(0.005)

    async def start_together(
        self, turn_lists: Sequence[Sequence[dict[str, str]]], **options: Any
    ) -> list[Worker]:
        """One worker per list of turns; once every one has opened the store, they
        all start their turns at the same moment (a start barrier file)."""
        barrier = self.path("go")
        workers = [
            await self.spawn(turns, arrived=self.path(f"arrived-{i}"), barrier=barrier, **options)
            for i, turns in enumerate(turn_lists)
        ]
        for i, worker in enumerate(workers):
            await self.wait_for_file(self.path(f"arrived-{i}"), worker)
        touch(barrier)
        return workers

    def ledger_keys(self) -> list[str]:
        """The idempotency key of every real provider call, in call order."""
        if not exists(str(self.ledger)):
            return []
        lines = self.ledger.read_text().splitlines()
        return [json.loads(line)["key"] for line in lines]

    def committed_turns(self) -> list[tuple[str, str, int]]:
        """``(thread_id, turn_id, version)`` of every committed turn, by version."""
        with closing(sqlite3.connect(self.db)) as conn:
            rows = conn.execute(
                "SELECT thread_id, turn_id, version FROM ik_turns ORDER BY thread_id, version"
            ).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]


def exists(path: str) -> bool:
    return os.path.exists(path)


def touch(path: str) -> None:
    Path(path).touch()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = Cluster(tmp_path)
    yield cluster
    for worker in cluster.workers:  # never leave a process behind, even on failure
        if worker.process.returncode is None:
            worker.process.kill()
        await worker.process.communicate()


async def assert_outbox_holds_only_committed_turns(cluster: Cluster) -> None:
    """Events exist only for committed turns: one ``turn.committed`` each, and the
    per-thread ``seq`` runs 1, 2, 3... without gaps in commit order."""
    versions: dict[tuple[str, str | None], int] = {
        (t, u): v for t, u, v in cluster.committed_turns()
    }
    events: list[OutboxEvent] = []
    async with SQLiteDurability(cluster.db) as durability:
        while batch := await durability.read_outbox(
            after=events[-1].position if events else None, limit=100
        ):
            events.extend(batch)
    orphans = [
        (e.thread_id, e.turn_id, e.type)
        for e in events
        if e.turn_id is not None and (e.thread_id, e.turn_id) not in versions
    ]
    assert orphans == [], "outbox events of turns that never committed"
    committed = [
        (e.thread_id, e.turn_id, e.payload["version"]) for e in events if e.type == "turn.committed"
    ]
    assert Counter((t, u) for t, u, _ in committed) == Counter(list(versions))
    assert all(versions[(t, u)] == v for t, u, v in committed)
    positions = [e.position for e in events]
    assert positions == sorted(set(positions))
    for thread_id in {e.thread_id for e in events}:
        seqs = [e.seq for e in events if e.thread_id == thread_id]
        assert seqs == list(range(1, len(seqs) + 1)), f"seq of {thread_id!r} has gaps"


# -- the guarantees --------------------------------------------------------------------------


@pytest.mark.slow
async def test_processes_racing_one_turn_id_commit_it_once(cluster: Cluster) -> None:
    delivery = turn("th-race", "delivery-1", "pi_race", 500)
    workers = await cluster.start_together([[delivery]] * 6, provider_delay=0.3)
    outcomes = [outcome for worker in workers for outcome in await worker.finish()]

    assert [sorted(o) for o in outcomes] == [
        ["finished_at", "result", "started_at", "turn_id"]
    ] * 6, outcomes
    fresh = [o for o in outcomes if not o["result"]["replayed"]]
    replays = [o for o in outcomes if o["result"]["replayed"]]
    assert len(fresh) == 1
    assert len(replays) == 5
    # They raced: every process asked before the one execution had finished.
    assert max(o["started_at"] for o in outcomes) < fresh[0]["finished_at"]

    committed = dict(fresh[0]["result"], replayed=True)
    assert all(o["result"] == committed for o in replays)
    assert [s["status"] for s in committed["steps"]] == ["completed"]
    assert committed["checkpoint_version"] == 1
    assert cluster.committed_turns() == [("th-race", "delivery-1", 1)]
    assert cluster.ledger_keys() == [charge_key("pi_race")]
    async with SQLiteDurability(cluster.db) as durability:
        checkpoint = await durability.load_checkpoint("th-race")
        receipts = await durability.list_receipts("th-race")
    assert checkpoint is not None
    assert checkpoint.version == 1
    assert [(r.key, r.status, r.attempt) for r in receipts] == [
        (charge_key("pi_race"), "completed", 1)
    ]
    await assert_outbox_holds_only_committed_turns(cluster)


@pytest.mark.slow
async def test_process_killed_after_provider_call_leaves_prepared_and_retry_fails_closed(
    cluster: Cluster,
) -> None:
    key = charge_key("pi_7")
    delivery = turn("th-crash", "delivery-7", "pi_7", 700)

    crashed = await cluster.spawn([delivery], crash="in_provider")
    assert await crashed.finish(status=CRASH_STATUS) == []
    assert cluster.ledger_keys() == [key]  # the provider did charge
    async with SQLiteDurability(cluster.db) as durability:
        [prepared] = await durability.list_receipts("th-crash")
        assert await durability.load_checkpoint("th-crash") is None
    assert (prepared.key, prepared.status, prepared.turn_id) == (key, "prepared", "delivery-7")
    assert cluster.committed_turns() == []

    retry = await cluster.spawn([delivery])
    [outcome] = await retry.finish()
    result = outcome["result"]
    assert (result["replayed"], result["checkpoint_version"]) == (False, 1)
    [step] = result["steps"]
    assert step["status"] == "uncertain"
    assert step["error"].startswith("EffectUncertainError")
    assert cluster.ledger_keys() == [key]  # failed closed: not charged again
    assert cluster.committed_turns() == [("th-crash", "delivery-7", 1)]

    charged = {"charge_id": "ch_pi_7", "amount": 700}
    async with SQLiteDurability(cluster.db) as durability:
        [uncertain] = await durability.list_receipts("th-crash")
        assert (uncertain.id, uncertain.status, uncertain.attempt) == (prepared.id, "uncertain", 1)
        resolved = await durability.resolve_receipt(
            "th-crash", key, applied=True, value=charged, note="seen at provider", actor="ops"
        )
    assert (resolved.id, resolved.status, resolved.value) == (prepared.id, "completed", charged)

    later = await cluster.spawn([delivery, turn("th-crash", "delivery-8", "pi_7", 700)])
    redelivered, fresh = await later.finish()
    assert redelivered["result"] == dict(result, replayed=True)
    assert fresh["result"]["replayed"] is False
    assert fresh["result"]["checkpoint_version"] == 2
    [step] = fresh["result"]["steps"]
    assert (step["status"], step["value"]) == ("completed", charged)
    assert step["receipt_ids"] == [prepared.id]
    assert cluster.ledger_keys() == [key]  # the resolved value, not a second charge

    async with SQLiteDurability(cluster.db) as durability:
        events = await durability.read_outbox("th-crash")
    assert [(e.turn_id, e.type) for e in events if e.type.startswith(("effect.", "receipt."))] == [
        ("delivery-7", "effect.uncertain"),
        (None, "receipt.resolved"),
        # delivery-8 reuses the resolved receipt: a deduplicated call announces nothing,
        # the operator's resolution already did.
    ]
    await assert_outbox_holds_only_committed_turns(cluster)


@pytest.mark.slow
async def test_process_killed_before_commit_leaves_no_result_and_retry_deduplicates(
    cluster: Cluster,
) -> None:
    key = charge_key("pi_9")
    delivery = turn("th-precommit", "delivery-9", "pi_9", 900)

    crashed = await cluster.spawn([delivery], crash="after_effect")
    assert await crashed.finish(status=CRASH_STATUS) == []
    assert cluster.committed_turns() == []
    async with SQLiteDurability(cluster.db) as durability:
        assert await durability.load_checkpoint("th-precommit") is None
        assert await durability.read_outbox("th-precommit") == []
        [completed] = await durability.list_receipts("th-precommit")
    assert (completed.key, completed.status) == (key, "completed")

    retry = await cluster.spawn([delivery, delivery])
    first, again = await retry.finish()
    result = first["result"]
    assert (result["replayed"], result["checkpoint_version"]) == (False, 1)
    [step] = result["steps"]
    assert (step["status"], step["value"]) == ("completed", completed.value)
    assert step["receipt_ids"] == [completed.id]
    assert again["result"] == dict(result, replayed=True)
    assert cluster.ledger_keys() == [key]  # one provider call across both processes
    assert cluster.committed_turns() == [("th-precommit", "delivery-9", 1)]

    async with SQLiteDurability(cluster.db) as durability:
        [receipt] = await durability.list_receipts("th-precommit")
        events = await durability.read_outbox("th-precommit")
    assert (receipt.id, receipt.status, receipt.attempt) == (completed.id, "completed", 1)
    assert [e.type for e in events].count("effect.completed") == 1
    await assert_outbox_holds_only_committed_turns(cluster)


@pytest.mark.slow
async def test_lock_of_a_killed_process_is_released_immediately(cluster: Cluster) -> None:
    holder = await cluster.spawn(
        [turn("th-lock", "stuck", "pi_stuck", 100)],
        ready=cluster.path("holding"),
        hold_until=cluster.path("never"),
    )
    await cluster.wait_for_file(cluster.path("holding"), holder)
    # A generous lock_timeout: if the dead holder's lock lingered, this fails slowly
    # with ThreadBusyError, never by luck.
    waiter = await cluster.spawn(
        [turn("th-lock", "next", "pi_next", 200)], started=cluster.path("waiting"), lock_timeout=10
    )
    await cluster.wait_for_file(cluster.path("waiting"), waiter)
    await asyncio.sleep(0.3)
    assert cluster.committed_turns() == [], "the waiter ran while the lock was held"

    killed_at = time.time()
    await holder.kill()
    [outcome] = await waiter.finish()

    assert "error" not in outcome, outcome
    assert outcome["finished_at"] - killed_at < 2.0
    result = outcome["result"]
    assert (result["replayed"], result["checkpoint_version"]) == (False, 1)
    assert [s["status"] for s in result["steps"]] == ["completed"]
    assert cluster.committed_turns() == [("th-lock", "next", 1)]
    assert cluster.ledger_keys() == [charge_key("pi_next")]
    await assert_outbox_holds_only_committed_turns(cluster)


@pytest.mark.slow
async def test_turns_of_one_thread_are_serialized_across_processes(cluster: Cluster) -> None:
    n_workers, n_turns = 4, 10
    marker = cluster.path("running")
    workers = await cluster.start_together(
        [
            [turn("th-serial", f"w{w}-t{i}", f"pi_w{w}_{i}", 100 + i) for i in range(n_turns)]
            for w in range(n_workers)
        ],
        marker=marker,
        provider_delay=0.02,
    )
    per_worker = [await worker.finish() for worker in workers]
    outcomes = [o for outcomes in per_worker for o in outcomes]

    assert not exists(marker + ".overlaps"), "two turns of the thread ran at the same time"
    assert not exists(marker)
    assert all("result" in o for o in outcomes), [o for o in outcomes if "error" in o]
    total = n_workers * n_turns
    assert len(outcomes) == total
    # They contended: every worker asked before any worker's first turn finished.
    firsts = [outcomes[0] for outcomes in per_worker]
    assert max(o["started_at"] for o in firsts) < min(o["finished_at"] for o in firsts)

    assert not any(o["result"]["replayed"] for o in outcomes)
    assert all([s["status"] for s in o["result"]["steps"]] == ["completed"] for o in outcomes)
    assert sorted(o["result"]["checkpoint_version"] for o in outcomes) == list(range(1, total + 1))
    committed = cluster.committed_turns()
    assert [v for _, _, v in committed] == list(range(1, total + 1))
    assert Counter(u for _, u, _ in committed) == Counter(o["turn_id"] for o in outcomes)
    assert Counter(cluster.ledger_keys()) == Counter(
        charge_key(f"pi_w{w}_{i}") for w in range(n_workers) for i in range(n_turns)
    )
    async with SQLiteDurability(cluster.db) as durability:
        checkpoint = await durability.load_checkpoint("th-serial")
    assert checkpoint is not None
    assert checkpoint.version == total
    await assert_outbox_holds_only_committed_turns(cluster)


@pytest.mark.slow
async def test_a_busy_thread_times_out_with_thread_busy_error(cluster: Cluster) -> None:
    holder = await cluster.spawn(
        [turn("th-busy", "first", "pi_first", 100)],
        ready=cluster.path("holding"),
        hold_until=cluster.path("release"),
    )
    await cluster.wait_for_file(cluster.path("holding"), holder)
    impatient = await cluster.spawn([turn("th-busy", "second", "pi_second", 200)], lock_timeout=0.5)
    [refused] = await impatient.finish()

    assert (refused["error"], refused["error_thread_id"]) == ("ThreadLockTimeoutError", "th-busy")
    assert 0.5 <= refused["finished_at"] - refused["started_at"] < 5.0
    assert cluster.committed_turns() == []

    touch(cluster.path("release"))
    [outcome] = await holder.finish()
    assert outcome["result"]["checkpoint_version"] == 1
    assert cluster.committed_turns() == [("th-busy", "first", 1)]
    assert cluster.ledger_keys() == [charge_key("pi_first")]
    async with SQLiteDurability(cluster.db) as durability:
        receipts = await durability.list_receipts("th-busy")
    assert [r.key for r in receipts] == [charge_key("pi_first")]
    await assert_outbox_holds_only_committed_turns(cluster)


@pytest.mark.slow
@pytest.mark.parametrize("on_busy", ["reject", "wait"])
async def test_a_replay_is_answered_while_another_process_holds_the_thread(
    cluster: Cluster, on_busy: str
) -> None:
    """A process holds the thread in a turn (its capability waits for a file). Another
    process delivers a turn of the thread that was already committed: it is replayed,
    without waiting for the lock (``on_busy="reject"`` would refuse it, and a short
    lock timeout time out, if it waited). A new turn of that process is still busy."""
    committed = turn("th-replay", "first", "pi_first", 100)
    [original] = await (await cluster.spawn([committed])).finish()
    holder = await cluster.spawn(
        [turn("th-replay", "second", "pi_second", 200)],
        ready=cluster.path("holding"),
        hold_until=cluster.path("release"),
    )
    await cluster.wait_for_file(cluster.path("holding"), holder)
    redelivery = await cluster.spawn(
        [committed, turn("th-replay", "third", "pi_third", 300)],
        on_busy=on_busy,
        lock_timeout=0.5,
    )
    replayed, refused = await redelivery.finish()
    assert replayed["result"] == dict(original["result"], replayed=True)
    busy = "ThreadBusyError" if on_busy == "reject" else "ThreadLockTimeoutError"
    assert (refused["error"], refused["error_thread_id"]) == (busy, "th-replay")
    assert holder.process.returncode is None  # the holder still holds the thread

    touch(cluster.path("release"))
    [second] = await holder.finish()
    assert second["result"]["checkpoint_version"] == 2
    assert cluster.committed_turns() == [("th-replay", "first", 1), ("th-replay", "second", 2)]
    assert cluster.ledger_keys() == [charge_key("pi_first"), charge_key("pi_second")]


# -- fencing (in one process: the lock has to be bypassed to get a stale commit) -------------


class GatedInterpreter:
    """Holds the first turn it interprets until ``gate`` is set."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        if not self.entered.is_set():
            self.entered.set()
            await self.gate.wait()
        return Interpretation(intents=[Intent("billing.balance", {})])


@capability("billing.balance", description="Read the balance")
async def balance(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
    return CapabilityResult(value={"balance": 42}, reply="Your balance is 42.")


@asynccontextmanager
async def no_lock(thread_id: str, *, wait: bool = True) -> AsyncIterator[object]:
    yield thread_id


@asynccontextmanager
async def no_turn_lock(thread_id: str, turn_id: str, wait: bool) -> AsyncIterator[object]:
    yield thread_id


@pytest.mark.parametrize(
    ("prior_turns", "winner_turn_id"),
    [(0, "winner"), (1, "winner"), (1, "stale")],
    ids=["first-commit", "later-commit", "same-turn-id"],
)
async def test_stale_commit_is_fenced(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, prior_turns: int, winner_turn_id: str
) -> None:
    interpreter = GatedInterpreter()
    interpreter.entered.set()  # prior turns pass straight through
    agent = Agent(name="billing", version="1", capabilities=[balance], interpreter=interpreter)
    async with (
        SQLiteDurability(cluster.db) as honest,
        SQLiteDurability(cluster.db) as rogue,
    ):
        # The rogue adapter skips the thread lock, as if the lock file had been deleted.
        monkeypatch.setattr(await rogue.recorder(), "lock", no_lock)
        # A turn takes the lock through ``turn_lock``, which marks it too.
        monkeypatch.setattr(await rogue.recorder(), "turn_lock", no_turn_lock)
        honest_kernel, rogue_kernel = Kernel(agent, honest), Kernel(agent, rogue)
        for i in range(prior_turns):
            await honest_kernel.turn("th-fence", f"prior-{i}", "balance?")

        interpreter.entered.clear()
        stale = asyncio.create_task(rogue_kernel.turn("th-fence", "stale", "balance?"))
        await interpreter.entered.wait()  # the stale turn has loaded the thread
        winner = await honest_kernel.turn("th-fence", winner_turn_id, "balance?")
        assert (winner.replayed, winner.checkpoint_version) == (False, prior_turns + 1)
        interpreter.gate.set()
        with pytest.raises(FencedCommitError) as fenced:
            await stale
        assert (fenced.value.thread_id, fenced.value.turn_id) == ("th-fence", "stale")

        expected = [("th-fence", f"prior-{i}", i + 1) for i in range(prior_turns)]
        expected.append(("th-fence", winner_turn_id, prior_turns + 1))
        assert cluster.committed_turns() == expected
        checkpoint = await honest.load_checkpoint("th-fence")
        assert checkpoint is not None
        assert checkpoint.version == prior_turns + 1
        assert {m.turn_id for m in checkpoint.messages} == {u for _, u, _ in expected}
        await assert_outbox_holds_only_committed_turns(cluster)

        # The fenced turn left nothing behind: delivering it again is an ordinary turn.
        again = await honest_kernel.turn("th-fence", "stale", "balance?")
        if winner_turn_id == "stale":
            assert again == replace(winner, replayed=True)
        else:
            assert (again.replayed, again.checkpoint_version) == (False, prior_turns + 2)
    await assert_outbox_holds_only_committed_turns(cluster)


#: Opens and closes a SQLiteDurability on each path read from stdin; answers one line each.
OPENER = """
import asyncio, sys
from intention_kernel.durability.sqlite import SQLiteDurability
async def open_close(path):
    async with SQLiteDurability(path):
        pass
print("ready", flush=True)
for line in sys.stdin:
    try:
        asyncio.run(open_close(line.strip()))
        print("opened", flush=True)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
"""


@pytest.mark.slow
async def test_processes_opening_one_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    """The first connections to a new file race to switch it to WAL. SQLite answers
    that race busy without waiting, so without a retry some processes failed to open."""
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            OPENER,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(8)
    ]
    try:

        async def answer(process: asyncio.subprocess.Process) -> str:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), PROCESS_TIMEOUT)
            return line.decode().strip()

        assert [await answer(p) for p in processes] == ["ready"] * 8
        for round_ in range(20):
            path = str(tmp_path / f"new-{round_}.db")
            for process in processes:  # every process gets the path before any answers
                assert process.stdin is not None
                process.stdin.write(f"{path}\n".encode())
            await asyncio.gather(*(p.stdin.drain() for p in processes if p.stdin is not None))
            answers = await asyncio.gather(*(answer(p) for p in processes))
            assert answers == ["opened"] * 8, f"round {round_}: {answers}"
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
            await process.communicate()


# -- the event loop --------------------------------------------------------------------------

#: Holds the database's write lock (``BEGIN IMMEDIATE``) until a line arrives on stdin.
WRITE_LOCK_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


@pytest.mark.parametrize("write", ["commit", "effect"])
async def test_a_write_lock_held_by_another_process_never_stalls_the_event_loop(
    write: str, tmp_path: Path
) -> None:
    """With one turn in flight its writes run inline; when another process holds the
    database's write lock, the write waits on the worker thread instead, and the event
    loop keeps serving everything else (reads, replays, any task) meanwhile."""
    path = tmp_path / "k.db"
    async with SQLiteDurability(path, busy_timeout=10) as store:

        async def first(tx: TurnTransaction) -> TurnCommit:
            return commit_for(tx)

        await store.with_turn(TurnScope("other", "1"), first)
        holder = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WRITE_LOCK_HOLDER,
            str(path),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert holder.stdin is not None and holder.stdout is not None
        reached = asyncio.Event()

        async def operation(tx: TurnTransaction) -> TurnCommit:
            reached.set()
            if write == "effect":
                await tx.run_effect("charge:1", lambda authority: {"ok": True}, step_id="s1")
            return commit_for(tx)  # nothing awaited from here to the commit's first write

        try:
            line = await asyncio.wait_for(holder.stdout.readline(), PROCESS_TIMEOUT)
            assert line == b"locked\n"
            turn = asyncio.create_task(store.with_turn(TurnScope("t", "1"), operation))
            # The turn ran to its write (which met the lock) before this task resumes.
            await reached.wait()
            for _ in range(100):  # the loop runs other tasks, round after round
                await asyncio.sleep(0)
            assert not turn.done(), turn.exception() if turn.done() else None
            checkpoint = await store.load_checkpoint("other")
            replay = await store.with_turn(TurnScope("other", "1"), first)
            assert checkpoint is not None and checkpoint.version == 1 and replay.replayed
            assert not turn.done()  # still waiting for the other process's lock
        finally:
            holder.stdin.write(b"release\n")
            await holder.stdin.drain()
            assert await asyncio.wait_for(holder.wait(), PROCESS_TIMEOUT) == 0
        result = await asyncio.wait_for(turn, PROCESS_TIMEOUT)
        assert result.checkpoint_version == 1 and not result.replayed
        if write == "effect":
            [receipt] = await store.list_receipts("t")
            assert receipt.status == ReceiptStatus.COMPLETED and receipt.value == {"ok": True}


# -- a read-only file system -----------------------------------------------------------------


def read_only(directory: Path, command: list[str]) -> list[str]:
    """``command`` run where ``directory`` is read-only. Root ignores file permissions,
    so as root the command runs in a mount namespace of its own, with ``directory``
    bind-mounted read-only onto itself (a read-only file system, ``EROFS``); any other
    user gets the directory's write bits removed."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return command
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0"', str(directory)],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"root without a mount namespace to make a directory read-only: {probe}")
    script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, str(directory), *command]


@pytest.mark.parametrize("leftovers", [True, False], ids=["crash left -wal and -shm", "clean"])
def test_serve_on_a_read_only_file_system_is_refused_with_one_message(
    leftovers: bool, tmp_path: Path
) -> None:
    """After a crash left ``-wal`` and ``-shm`` behind, SQLite still opens the database
    on a read-only file system, and the lock file was what failed: with a raw
    ``OSError`` and a traceback. Either way ``serve`` refuses, exit status 2."""
    directory = tmp_path / "store"
    directory.mkdir()
    db = directory / "app.db"
    create = (
        "import asyncio, os, sys\n"
        "from intention_kernel.durability.sqlite import SQLiteDurability\n"
        "from intention_kernel.testing.conformance import commit_for\n"
        "from intention_kernel._turns import TurnScope\n"
        "async def first(tx):\n"
        "    return commit_for(tx)\n"
        "async def main():\n"
        "    store = SQLiteDurability(sys.argv[1])\n"
        "    await store.__aenter__()\n"
        "    await store.with_turn(TurnScope('t', '1'), first)\n"
        "    if sys.argv[2] == 'crash':\n"
        "        os._exit(0)  # nothing closed: -wal and -shm stay\n"
        "    await store.aclose()\n"
        "asyncio.run(main())\n"
    )
    how = "crash" if leftovers else "close"
    subprocess.run([sys.executable, "-c", create, str(db), how], check=True, timeout=60)
    names = {p.name for p in directory.iterdir()}
    assert ({"app.db-wal", "app.db-shm"} <= names) is leftovers
    serve = [
        sys.executable,
        "-m",
        "intention_kernel",
        "serve",
        "--agent",
        "test_cli_operations:old_agent",
        "--db",
        f"sqlite:///{db}",
        "--port",
        "0",
    ]
    done = subprocess.run(
        read_only(directory, serve),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parent,
        env={**os.environ, "COLUMNS": "1000"},  # one message on one line
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("refused:") == 1
    assert f"refused: cannot open the store sqlite:///{db}: " in done.stderr
