"""The soak: thousands of turns, several processes, random kills and duplicate deliveries,
on SQLite and PostgreSQL, ending in an audit of everything the store and the provider
saw.

Each conversation thread has a script (charges proposed then accepted, rejected or
left pending over a question; charges of payment intents seen before; declines
that a later attempt retries; lost provider responses). Worker processes
(``tests/soak_worker.py``) each walk every thread, several at a time, so that
deliveries of one turn race across processes; they also send duplicates and
conflicting requests on purpose. Meanwhile the test SIGKILLs a random worker every
fraction of a second and starts a replacement, some of which are armed to die at a
durable fault point. A relay follows the outbox the whole time. Finally one
worker delivers everything once more (the retries a host does after a crash),
operators reconcile every uncertain receipt, and the audit checks, and prints:

- every scheduled turn committed exactly once, in schedule order (version = position);
- every redelivery answered with the committed result, every conflicting request
  refused, nothing else failed;
- each provider key called at most once, every call accounted for by a receipt;
- every event delivered to the relay exactly once, in order, and only for
  committed turns; one ``turn.committed`` per turn; one ``effect.completed`` per
  applied write;
- every checkpoint at its thread's last turn; no lock left behind.

Size: ``pytest tests/test_soak.py --soak-turns 20000`` for a longer run (default
:data:`CI_TURNS`); ``--soak-seed`` replays a schedule. Deselect with ``-m "not soak"``.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import make_conninfo

from intention_kernel.durability import Durability
from intention_kernel.testing import faults
from intention_kernel.turns import OutboxEvent
from proving_support import (
    CHARGE,
    Store,
    drop_schema,
    new_schema,
    read_all_events,
    read_ledger,
)

pytestmark = [pytest.mark.soak, pytest.mark.slow, pytest.mark.timeout(600)]

WORKER = Path(__file__).with_name("soak_worker.py")
CI_TURNS = 2400
THREADS = 16
WORKERS = 4
TASKS = 4
KILL_WINDOW = 0.5  # of the expected run time, in which workers are killed
REPLACEMENTS_WITH_A_FAULT = 0.4


# -- the schedule ----------------------------------------------------------------------------


def schedule(turns: int, rng: random.Random) -> dict[str, Any]:
    """Per-thread conversations of about ``turns`` turns in all, and provider behaviours."""
    threads: dict[str, list[str]] = {}
    behaviour: dict[str, str] = {}
    per_thread = max(turns // THREADS, 3)
    for t in range(THREADS):
        messages: list[str] = []
        seen: list[str] = []
        while len(messages) < per_thread:
            kind = rng.choices(["new", "again", "reject", "aside", "balance"], [5, 2, 1, 1, 1])[0]
            if kind == "balance":
                messages.append(f"balance {rng.randrange(1, 10_000)}")
                continue
            if kind == "again" and seen:
                pi = rng.choice(seen)
            else:
                pi = f"pi_{t}_{len(seen)}"
                seen.append(pi)
                mode = rng.choices(["ok", "not_applied_once", "lost_response"], [8, 1, 1])[0]
                behaviour[pi] = mode
            messages.append(f"charge {pi} {rng.randrange(1, 1000)}")
            if kind == "reject":
                messages.append("no")
            elif kind == "aside":
                messages += [f"balance {rng.randrange(1, 10_000)}", "yes"]
            else:
                messages.append("yes")
        threads[f"soak-{t:02d}"] = messages[:per_thread]
    return {"threads": threads, "behaviour": behaviour}


# -- processes -------------------------------------------------------------------------------


@dataclass
class Worker:
    process: asyncio.subprocess.Process
    fault: dict[str, Any] | None
    lines: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    async def read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            self.lines.append(json.loads(line))

    async def wait(self) -> int:
        stderr = await asyncio.wait_for(self.process.stderr.read(), 300)  # type: ignore[union-attr]
        status = await self.process.wait()
        if self.reader is not None:
            await self.reader
        assert status in (0, faults.EXIT_STATUS, -9), (
            f"worker failed ({status}):\n{stderr.decode()}"
        )
        return status


@dataclass
class Soak:
    store: Store
    root: Path
    rng: random.Random
    workers: list[Worker] = field(default_factory=list)

    @property
    def ledger(self) -> Path:
        return self.root / "provider.ledger"

    async def spawn(
        self,
        *,
        fault: dict[str, Any] | None = None,
        duplicates: float = 0.1,
        conflicts: float = 0.02,
    ) -> Worker:
        config = {
            "store": self.store.config(),
            "ledger": str(self.ledger),
            "schedule": str(self.root / "schedule.json"),
            "seed": self.rng.randrange(1 << 32),
            "tasks": TASKS,
            "duplicates": duplicates,
            "conflicts": conflicts,
            "fault": fault,
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            json.dumps(config),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=1 << 20,
        )
        worker = Worker(process, fault)
        worker.reader = asyncio.create_task(worker.read())
        self.workers.append(worker)
        return worker


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        yield Store("sqlite", str(tmp_path / "soak.db"))
        return
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = new_schema()
    yield Store("postgres", make_conninfo(dsn, application_name=schema), schema)
    drop_schema(dsn, schema)


@pytest.fixture
async def soak(store: Store, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Soak]:
    seed = request.config.getoption("--soak-seed")
    seed = random.randrange(1 << 32) if seed is None else seed
    print(f"soak seed: {seed} (--soak-seed {seed} replays this schedule)")
    soak = Soak(store, tmp_path, random.Random(seed))
    yield soak
    for worker in soak.workers:  # never leave a process behind, even on failure
        if worker.process.returncode is None:
            worker.process.kill()
        await worker.process.wait()
        if worker.reader is not None:
            worker.reader.cancel()


# -- the soak --------------------------------------------------------------------------------


async def test_soak_with_random_kills_and_duplicate_deliveries_loses_and_duplicates_nothing(
    soak: Soak, store: Store, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    turns = request.config.getoption("--soak-turns") or CI_TURNS
    plan = schedule(turns, soak.rng)
    (soak.root / "schedule.json").write_text(json.dumps(plan))
    scheduled = {
        (t, f"turn-{i + 1:04d}"): i + 1 for t, ms in plan["threads"].items() for i in range(len(ms))
    }

    async with store.durability() as relay:  # creates the schema before the workers race
        seen: list[OutboxEvent] = []
        stop = asyncio.Event()

        async def follow() -> None:  # a relay following the outbox while workers commit
            while not stop.is_set():
                seen.extend(await read_all_events(relay, seen[-1].position if seen else None))
                await asyncio.sleep(0.02)

        started = time.monotonic()
        following = asyncio.create_task(follow())
        for _ in range(WORKERS):
            await soak.spawn()
        kills, armed = await kill_at_random(soak, turns)
        for worker in list(soak.workers):
            await worker.wait()
        walked = time.monotonic() - started
        recovery = await soak.spawn(duplicates=0.0, conflicts=0.0)  # every delivery, once more
        assert await recovery.wait() == 0
        stop.set()
        await following
        seen.extend(await read_all_events(relay, seen[-1].position if seen else None))
        elapsed = time.monotonic() - started

        audit = await run_audit(store, relay, soak, plan, scheduled, seen, recovery)
        audit.insert(
            0,
            f"{len(scheduled)} turns on {THREADS} threads by {len(soak.workers)} "
            f"processes in {elapsed:.1f}s; {kills} killed at random, "
            f"{armed} replacements armed to die at a fault point (all walks done after "
            f"{walked:.1f}s, then one more walk delivering everything again)",
        )
    with capsys.disabled():
        print(f"\n-- soak audit ({store.kind}) " + "-" * 40)
        for line in audit:
            print("  " + line)


async def kill_at_random(soak: Soak, turns: int) -> tuple[int, int]:
    """SIGKILL a random running worker every so often, and start a replacement (some
    armed to die at a fault point), until half the expected run is over."""
    kills = 0
    deadline = time.monotonic() + max(4.0, turns * 0.004) * KILL_WINDOW
    while time.monotonic() < deadline:
        await asyncio.sleep(soak.rng.uniform(0.2, 0.8))
        running = [w for w in soak.workers if w.process.returncode is None]
        if not running:
            break
        victim = soak.rng.choice(running)
        victim.process.kill()
        await victim.wait()
        kills += 1
        fault = None
        if soak.rng.random() < REPLACEMENTS_WITH_A_FAULT:
            fault = {"point": soak.rng.choice(faults.POINTS), "skip": soak.rng.randrange(0, 30)}
        await soak.spawn(fault=fault)
    return kills, sum(1 for w in soak.workers if w.fault)


# -- the audit -------------------------------------------------------------------------------


async def run_audit(
    store: Store,
    durability: Durability,
    soak: Soak,
    plan: dict[str, Any],
    scheduled: dict[tuple[str, str], int],
    seen: list[OutboxEvent],
    recovery: Any,
) -> list[str]:
    report: list[str] = []
    statuses = Counter(w.process.returncode for w in soak.workers)
    faulted = sum(1 for w in soak.workers if w.fault and w.process.returncode == faults.EXIT_STATUS)

    # Turns: every scheduled turn committed once, at its place in its thread.
    committed = {(t, u): v for t, u, v in store.committed_turns()}
    assert committed == scheduled
    report.append(
        f"turns committed: {len(committed)} of {len(scheduled)} scheduled, each once, "
        "each at its place in its thread"
    )

    # Deliveries: the committed result for every redelivery, conflicts refused. (The
    # recovery walk runs what no surviving worker reached, and replays the rest.)
    final = {(o["t"], o["u"]): o["digest"] for o in recovery.lines}
    assert set(final) == set(scheduled)
    outcomes = [o for w in soak.workers for o in w.lines]
    assert [o for o in outcomes if "error" in o] == []
    answered = [o for o in outcomes if "digest" in o]
    wrong = [o for o in answered if o["digest"] != final[(o["t"], o["u"])]]
    assert wrong == [], "a delivery was answered with something else than the committed result"
    fresh = Counter((o["t"], o["u"]) for o in answered if not o["replayed"])
    assert all(n == 1 for n in fresh.values()), "a turn was executed (not replayed) twice"
    refused = sum(1 for o in outcomes if o.get("refused"))
    replays = len(answered) - len(fresh)
    report.append(
        f"deliveries: {len(answered)}; {replays} answered by replay with "
        f"the committed result; {refused} conflicting requests refused; 0 errors"
    )

    # Provider: each key at most once, every call accounted for by a receipt.
    calls = Counter(call["key"] for call in read_ledger(soak.ledger))
    assert [key for key, n in calls.items() if n > 1] == []
    receipts = {(r.thread_id, r.key): r for r in await durability.list_receipts()}
    by_key = {key: r for (_, key), r in receipts.items()}  # keys are unique across threads
    assert len(by_key) == len(receipts)
    assert all(by_key[key].status in ("completed", "uncertain") for key in calls)
    completed = {key for key, r in by_key.items() if r.status == "completed"}
    assert completed <= set(calls)
    uncertain = sorted(key for key, r in by_key.items() if r.status == "uncertain")
    failed = sum(1 for r in by_key.values() if r.status == "failed")
    report.append(
        f"provider: {len(calls)} keys called, each exactly once; receipts: {len(completed)} "
        f"completed, {len(uncertain)} uncertain (lost responses and deaths in the provider "
        f"window), {failed} declined and not retried"
    )

    # Outbox: seen by the relay exactly once, in order, only for committed turns.
    everything = await read_all_events(durability)
    assert seen == everything
    positions = [e.position for e in seen]
    assert positions == sorted(set(positions)) and len({e.id for e in seen}) == len(seen)
    if store.kind == "postgres":
        assert positions == list(range(1, len(seen) + 1))
    orphans = [
        e for e in seen if e.turn_id is not None and (e.thread_id, e.turn_id) not in committed
    ]
    assert orphans == []
    announced = Counter(
        (e.thread_id, e.turn_id, e.payload["version"]) for e in seen if e.type == "turn.committed"
    )
    assert announced == Counter((t, u, v) for (t, u), v in committed.items())
    for thread_id in plan["threads"]:
        seqs = [e.seq for e in seen if e.thread_id == thread_id]
        assert seqs == list(range(1, len(seqs) + 1))
    applied = Counter(e.payload["key"] for e in seen if e.type == "effect.completed")
    assert all(n == 1 for n in applied.values())
    assert set(applied) == completed
    report.append(
        f"events: {len(seen)} delivered to the relay exactly once, in commit order; "
        f"{len(announced)} turn.committed, {len(applied)} effect.completed (one per applied write)"
    )

    # Reconciliation: an operator settles every uncertain receipt from the provider's records.
    for key in uncertain:
        receipt = by_key[key]
        value = {"charge_id": "ch_reconciled", "amount": 0} if key in calls else None
        await durability.resolve_receipt(receipt.thread_id, key, applied=key in calls, value=value)
    assert await durability.list_receipts(status="uncertain") == []
    report.append(f"reconciled: {len(uncertain)} uncertain receipts, none left")

    # Checkpoints and locks.
    for thread_id, messages in plan["threads"].items():
        checkpoint = await durability.load_checkpoint(thread_id)
        assert checkpoint is not None and checkpoint.version == len(messages)
    if store.kind == "postgres":
        locks = store.query(
            "SELECT count(*) FROM pg_locks JOIN pg_stat_activity USING (pid) "
            "WHERE locktype = 'advisory' AND application_name = %s",
            store.schema,
        )
        assert locks == [(0,)]
    report.append(
        f"checkpoints: {len(plan['threads'])} threads at their last turn; no lock left; "
        f"processes: {statuses[-9]} SIGKILLed, {faulted} exited at a fault point, "
        f"{statuses[0]} finished"
    )
    assert all(key.startswith(CHARGE) for key in calls)
    return report
