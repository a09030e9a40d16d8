"""The soak: thousands of turns, several processes, random kills and duplicate deliveries,
on SQLite and PostgreSQL, ending in an audit of everything the store, the provider and
the outbox relay saw.

Each conversation thread has a script (charges proposed then accepted, rejected or
left pending over a question; charges of payment intents seen before; declines
that a later attempt retries; lost provider responses). Worker processes
(``tests/soak_worker.py``) each walk every thread, several at a time, so that
deliveries of one turn race across processes; they also send duplicates and
conflicting requests on purpose. Meanwhile the library's own outbox relay
(:class:`~intention_kernel.outbox.OutboxRelay`, in ``tests/relay_worker.py``)
publishes to a file. The test SIGKILLs a random worker (now and then the relay) at
moments spread over the whole run, by the share of turns committed so far. It starts
a replacement, some armed to die at a durable fault point. A replacement takes each
thread up at its last committed turn, delivered again. On PostgreSQL some of
those moments SIGSTOP a worker past its lease instead, then SIGCONT it: the others
take its threads, and each write it tries on waking is refused (it delivers that
turn again, and gets the committed result). The ``pgbouncer`` store runs every
client of the soak through PgBouncer in transaction mode. Finally one worker
delivers everything once more (the retries a host does after a crash). Operators
reconcile every uncertain receipt, and the relay drains. Then the audit checks, and
prints, what follows.

Every scheduled turn committed once, in schedule order (version = position). Every
redelivery was answered with the committed result, and every conflicting request was
refused. Nothing else failed. Each turn's outcome is one its schedule allows. An
accepted charge completed, or went uncertain (a lost response, or a death in the
provider window), or was declined. The same payment intent was deduplicated, or
failed closed later on. A rejected or pending charge never ran.

Each provider key was called at most once, and a receipt accounts for every call.
The relay delivered every committed event at least once, and again only after a relay
died. Each thread's events came in ``seq`` order. There is one ``turn.committed`` per
turn and one ``effect.completed`` per applied write, and the outbox is in commit order.
Every checkpoint is at its thread's last turn, and no lock is left behind, on either
store. A write was refused for a lost lease only in a worker the test stopped past
its lease.

The concurrent mode (SQLite; issue 22) runs the same schedule and audit with one
worker process at a time. It runs every thread at once, a task each, each turn's
interpreter awaiting as a model call does. So the turns' writes share group commits,
and each duplicate comes while the first copy is still in flight. Each round's
process is SIGKILLed with groups in flight, or dies at a fault point (a group
commit's ``before_commit`` and ``after_commit`` among them). The next round takes it
up. Between rounds nothing writes turns. So the audit also checks, at each death,
that every turn the dead process acknowledged is on disk.

Size: ``pytest tests/test_soak.py --soak-turns 20000`` for a longer run (default
:data:`CI_TURNS`); ``--soak-seed`` replays a schedule. Deselect with ``-m "not soak"``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import prefork
from intention_kernel.durability import Durability
from intention_kernel.durability.abc import RecordedDurability
from intention_kernel.outbox import OutboxRelay
from intention_kernel.testing import faults
from proving_support import (
    CHARGE,
    Store,
    charge_key,
    drop_schema,
    new_schema,
    read_all_events,
    read_ledger,
)

pytestmark = [pytest.mark.soak, pytest.mark.slow, pytest.mark.timeout(600)]  # see conftest

WORKER = Path(__file__).with_name("soak_worker.py")
RELAY = Path(__file__).with_name("relay_worker.py")
CI_TURNS = 2400
THREADS = 16
WORKERS = 4
TASKS = 4
KILLS_PER_TURN = 1 / 300  # eight in the CI run
MAX_KILLS = 40
KILLED_UNTIL = 0.9  # of the scheduled turns committed: kills are spread up to there
RELAY_KILLS = 0.2  # of the kills, aimed at the relay
REPLACEMENTS_WITH_A_FAULT = 0.4
RANDOM_SIGKILL = "random SIGKILL"
#: On PostgreSQL, the share of the test's moments that SIGSTOP a worker instead of
#: killing it, for longer than its lease (2 s, see ``open_store``), then SIGCONT it.
PAUSES = 0.4
PAUSED_FOR = 3.5
#: The concurrent mode's workers: every thread at once (a task each), each turn awaiting
#: a model for about 5 ms, a duplicate delivered while the first copy is in flight.
CONCURRENT: dict[str, Any] = {"tasks": THREADS, "model_await": 0.005, "together": True}
GROUP_POINTS = ["before_commit", "after_commit"]  # see intention_kernel.testing.sqlite


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


def turn_id(index: int) -> str:
    return f"turn-{index + 1:04d}"


# -- processes -------------------------------------------------------------------------------


@dataclass
class Worker:
    process: prefork.Forked
    fault: dict[str, Any] | None
    relay: bool = False
    killed_at: float | None = None  # share of the turns committed when the test killed it
    paused: int = 0  # times the test stopped it past its lease (SIGSTOP, then SIGCONT)
    lines: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    async def read(self) -> None:
        async for line in self.process.stdout:
            self.lines.append(json.loads(line))

    @property
    def deliveries(self) -> list[dict[str, Any]]:
        """Its lines about deliveries (each names a thread and a turn)."""
        return [line for line in self.lines if "t" in line]

    @property
    def writer(self) -> dict[str, int] | None:
        """What its SQLite writer thread ran, if its walk ended (see soak_worker.py)."""
        return next((line["writer"] for line in self.lines if "writer" in line), None)

    async def wait(self) -> int:
        stderr = await asyncio.wait_for(self.process.stderr.read(), 300)
        status = await self.process.wait()
        if self.reader is not None:
            await self.reader
        assert status in (0, faults.EXIT_STATUS, -9), (
            f"worker failed ({status}):\n{stderr.decode()}"
        )
        return status

    @property
    def death(self) -> str | None:
        """How this process died: at its fault point, by the test's SIGKILL, or not."""
        if self.process.returncode == faults.EXIT_STATUS and self.fault:
            return str(self.fault["point"])
        if self.process.returncode == -9:
            return RANDOM_SIGKILL
        return None


@dataclass
class Soak:
    store: Store
    root: Path
    rng: random.Random
    workers: list[Worker] = field(default_factory=list)
    relays: list[Worker] = field(default_factory=list)
    progress: Any = None  # the connection committed() reads on
    #: What every worker's configuration adds (the concurrent mode's ``tasks``,
    #: ``model_await`` and ``together``; see soak_worker.py).
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def ledger(self) -> Path:
        return self.root / "provider.ledger"

    @property
    def sink(self) -> Path:
        return self.root / "relay.sink"

    async def start(self, script: Path, config: dict[str, Any]) -> prefork.Forked:
        return await prefork.spawn(script, json.dumps(config), limit=1 << 20)

    async def spawn(
        self,
        *,
        fault: dict[str, Any] | None = None,
        duplicates: float = 0.1,
        conflicts: float = 0.02,
        resume: bool = False,
    ) -> Worker:
        config = {
            "resume": resume,
            "store": self.store.config(),
            "ledger": str(self.ledger),
            "schedule": str(self.root / "schedule.json"),
            "seed": self.rng.randrange(1 << 32),
            "tasks": TASKS,
            "duplicates": duplicates,
            "conflicts": conflicts,
            "fault": fault,
            **self.options,
        }
        worker = Worker(await self.start(WORKER, config), fault)
        worker.reader = asyncio.create_task(worker.read())
        self.workers.append(worker)
        return worker

    async def spawn_relay(self) -> Worker:
        config = {
            "store": self.store.config(),
            "sink": str(self.sink),
            "stop": str(self.root / "relay.stop"),
        }
        relay = Worker(await self.start(RELAY, config), None, relay=True)
        relay.reader = asyncio.create_task(relay.read())
        self.relays.append(relay)
        return relay

    def committed(self) -> int:
        """Turns committed so far, on one connection kept for the whole soak (a new
        PostgreSQL session per look would cost the server a process each time)."""
        if self.progress is None:
            if self.store.kind == "sqlite":
                self.progress = sqlite3.connect(self.store.location, isolation_level=None)
            else:
                self.progress = psycopg.connect(
                    self.store.location, autocommit=True, prepare_threshold=None
                )
        if self.store.kind == "sqlite":
            row = self.progress.execute("SELECT count(*) FROM ik_turns").fetchone()
        else:  # named in full: behind PgBouncer no session setting holds
            count = sql.SQL("SELECT count(*) FROM {}.ik_turns")
            row = self.progress.execute(count.format(sql.Identifier(self.store.schema))).fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("pgbouncer", marks=[pytest.mark.postgres, pytest.mark.pgbouncer]),
    ]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The store; ``pgbouncer``: PostgreSQL with every client of the soak (workers,
    relays, the test's adapter and its queries) through PgBouncer in transaction mode."""
    if request.param == "sqlite":
        yield Store("sqlite", str(tmp_path / "soak.db"))
        return
    dsn: str = request.getfixturevalue("postgres_dsn")
    via = dsn if request.param == "postgres" else request.getfixturevalue("pgbouncer_dsn")
    schema = new_schema()
    yield Store("postgres", make_conninfo(via, application_name=schema), schema)
    drop_schema(dsn, schema)


@pytest.fixture
async def soak(store: Store, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Soak]:
    seed = request.config.getoption("--soak-seed")
    seed = random.randrange(1 << 32) if seed is None else seed
    print(f"soak seed: {seed} (--soak-seed {seed} replays this schedule)")
    soak = Soak(store, tmp_path, random.Random(seed))
    yield soak
    if soak.progress is not None:
        soak.progress.close()
    for worker in [*soak.workers, *soak.relays]:  # never leave a process behind
        if worker.process.returncode is None:
            worker.process.kill()
        await worker.process.wait()
        if worker.reader is not None:
            worker.reader.cancel()


# -- the soak --------------------------------------------------------------------------------


async def test_soak_with_random_kills_and_duplicate_deliveries_loses_and_duplicates_nothing(
    soak: Soak, store: Store, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    async def walk(total: int) -> None:
        for _ in range(WORKERS):
            await soak.spawn()
        await kill_through_the_run(soak, total)

    turns = request.config.getoption("--soak-turns") or CI_TURNS
    report = await run_soak(soak, store, turns, walk)
    show(f"soak audit ({request.node.callspec.params['store']})", report, capsys)


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
async def test_concurrent_soak_killed_with_groups_in_flight_loses_and_duplicates_nothing(
    soak: Soak, store: Store, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """The concurrent mode (issue 22): one worker process at a time runs every thread at
    once over one SQLite adapter. Each turn awaits a model, so their writes share
    group commits. Duplicates come while the first copy is in flight. Each
    round's process is SIGKILLed (or dies at a fault point, a group's among them) with
    groups in flight, and before the next round starts, every turn it acknowledged is
    on disk. The audit is the soak's."""
    soak.options = CONCURRENT
    acknowledged: list[int] = []

    async def walk(total: int) -> None:
        acknowledged.extend(await kill_in_rounds(soak, total))

    turns = request.config.getoption("--soak-turns") or CI_TURNS
    report = await run_soak(soak, store, turns, walk)
    rounds = soak.workers[:-1]  # the last one is the recovery walk
    grouped = [w.writer["grouped"] for w in rounds if w.writer is not None]
    # (A walk that ends may have had only replays left, so the sum.)
    assert sum(grouped) > 0, "the turns' writes never shared a commit"
    report.insert(
        2,
        f"{len(rounds)} rounds of {CONCURRENT['tasks']} threads at once in one process; after "
        f"each death ({len(acknowledged)}), every turn it acknowledged was on disk "
        f"({sum(acknowledged)} acknowledgements checked); the walks that ended ran "
        f"{sum(grouped)} writes in groups of two or more",
    )
    show("concurrent soak audit (sqlite)", report, capsys)


async def run_soak(
    soak: Soak,
    store: Store,
    turns: int,
    walk: Callable[[int], Awaitable[None]],
) -> list[str]:
    """Schedule about ``turns`` turns, start the relay, let ``walk(total)`` run (and
    kill) the workers, deliver everything once more, and audit; answers the report."""
    plan = schedule(turns, soak.rng)
    (soak.root / "schedule.json").write_text(json.dumps(plan))
    scheduled = {
        (t, turn_id(i)): i + 1 for t, ms in plan["threads"].items() for i in range(len(ms))
    }
    report: list[str] = []

    async with store.durability() as durability:  # creates the schema before the workers race
        started = time.monotonic()
        await soak.spawn_relay()
        await walk(len(scheduled))
        for worker in list(soak.workers):
            await worker.wait()
        walked = time.monotonic() - started
        recovery = await soak.spawn(duplicates=0.0, conflicts=0.0)  # every delivery, once more
        assert await recovery.wait() == 0

        audit_turns(store, soak, scheduled, recovery, report)
        uncertain = await audit_outcomes(durability, soak, plan, recovery, report)
        await reconcile(durability, soak, uncertain, report)
        (soak.root / "relay.stop").touch()  # the relay drains what is left, and stops
        for relay in soak.relays:
            await relay.wait()
        assert soak.relays[-1].lines == [{"unpublished": 0}]
        elapsed = time.monotonic() - started
        await audit_outbox(durability, soak, plan, report)
        await audit_the_end(durability, store, soak, plan, report)

    deaths = Counter(w.death for w in [*soak.workers, *soak.relays] if w.death)
    report.insert(
        0,
        f"{len(scheduled)} turns on {THREADS} threads by {len(soak.workers)} worker and "
        f"{len(soak.relays)} relay processes in {elapsed:.1f}s (all walks done after "
        f"{walked:.1f}s, then one more walk delivering everything again)",
    )
    kills = sorted(w.killed_at for w in [*soak.workers, *soak.relays] if w.killed_at is not None)
    report.insert(
        1,
        "deaths: "
        + ", ".join(f"{n} {phase}" for phase, n in sorted(deaths.items()))
        + f"; the test's kills came with {', '.join(f'{k:.0%}' for k in kills)} of the turns "
        f"committed ({sum(1 for r in soak.relays if r.death)} of them the relay's)",
    )
    return report


def show(title: str, report: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print(f"\n-- {title} " + "-" * 40)
        for line in report:
            print("  " + line)


async def kill_through_the_run(soak: Soak, total: int) -> None:
    """SIGKILL a random running worker (sometimes the relay) at moments spread over the
    run by progress: each when a random share of the turns, up to :data:`KILLED_UNTIL`,
    has committed. Every worker that dies meanwhile (killed, or at its own fault point)
    is replaced, some replacements armed to die at a fault point."""
    kills = min(max(6, round(total * KILLS_PER_TURN)), MAX_KILLS)
    moments = sorted(soak.rng.uniform(0.02, KILLED_UNTIL) for _ in range(kills))
    replaced: set[int] = set()

    async def replace_the_dead() -> None:
        for worker in list(soak.workers):
            if worker.process.returncode is not None and id(worker) not in replaced:
                replaced.add(id(worker))
                if worker.process.returncode != 0:  # a finished walk needs no successor
                    fault = None
                    if soak.rng.random() < REPLACEMENTS_WITH_A_FAULT:
                        point, skip = soak.rng.choice(faults.POINTS), soak.rng.randrange(0, 30)
                        fault = {"point": point, "skip": skip}
                    await soak.spawn(fault=fault, resume=True)

    for moment in moments:
        while (done := soak.committed()) < moment * total:
            await replace_the_dead()
            if not any(w.process.returncode is None for w in soak.workers):
                return  # every walk is over (the rest of the schedule was replays)
            await asyncio.sleep(0.1)
        if soak.rng.random() < RELAY_KILLS:
            relay = soak.relays[-1]
            relay.process.kill()
            relay.killed_at = done / total
            await relay.wait()
            await soak.spawn_relay()
            continue
        running = [w for w in soak.workers if w.process.returncode is None]
        if not running:
            return
        victim = soak.rng.choice(running)
        if soak.store.kind == "postgres" and soak.rng.random() < PAUSES:
            # Frozen past its lease: its threads go to the others, and once woken its
            # writes are refused (it delivers those turns again, see soak_worker.py).
            victim.process.send_signal(signal.SIGSTOP)
            await asyncio.sleep(PAUSED_FOR)
            victim.process.send_signal(signal.SIGCONT)
            victim.paused += 1
            continue
        victim.process.kill()
        await victim.wait()
        if victim.process.returncode == -9:  # not exited at its own fault point first
            victim.killed_at = done / total
        await replace_the_dead()


async def kill_in_rounds(soak: Soak, total: int) -> list[int]:
    """The concurrent mode's walk: one worker process at a time. Each is SIGKILLed at a
    moment spread over the run by progress, as :func:`kill_through_the_run` does. A
    worker that takes every thread up again replaces it. Some are armed to die at a
    fault point, a group commit's among them. Between two rounds no process writes turns:
    every turn the dead one acknowledged must be on disk then, before the next round
    could commit it again. Answers how many acknowledgements each death had."""
    kills = min(max(6, round(total * KILLS_PER_TURN)), MAX_KILLS)  # as kill_through_the_run
    moments = sorted(soak.rng.uniform(0.02, KILLED_UNTIL) for _ in range(kills))
    checked: list[int] = []
    worker = await soak.spawn()
    while True:
        while moments and worker.process.returncode is None:
            if soak.committed() >= moments[0] * total:
                moments.pop(0)
                worker.process.kill()
                break
            await asyncio.sleep(0.02)
        done = soak.committed()
        await worker.wait()  # and every line it wrote before it died
        if worker.process.returncode == 0:
            return checked
        if worker.process.returncode == -9:  # not exited at its own fault point first
            worker.killed_at = done / total
        on_disk = {(t, u) for t, u, _ in soak.store.committed_turns()}
        acknowledged = {(o["t"], o["u"]) for o in worker.deliveries if "digest" in o}
        assert acknowledged <= on_disk, f"acknowledged, not on disk: {acknowledged - on_disk}"
        checked.append(len(acknowledged))
        fault = None
        if soak.rng.random() < REPLACEMENTS_WITH_A_FAULT:
            point = soak.rng.choice([*faults.POINTS, *GROUP_POINTS])
            fault = {"point": point, "skip": soak.rng.randrange(0, 30)}
        worker = await soak.spawn(fault=fault, resume=True)


# -- the audit -------------------------------------------------------------------------------


def audit_turns(
    store: Store,
    soak: Soak,
    scheduled: dict[tuple[str, str], int],
    recovery: Worker,
    report: list[str],
) -> None:
    # Turns: every scheduled turn committed once, at its place in its thread.
    rows = store.committed_turns()
    assert len(rows) == len({(t, u) for t, u, _ in rows})
    committed = {(t, u): v for t, u, v in rows}
    assert committed == scheduled
    report.append(
        f"turns committed: {len(committed)} of {len(scheduled)} scheduled, each once, "
        "each at its place in its thread"
    )

    # Deliveries: the committed result for every redelivery, conflicts refused. (The
    # recovery walk runs what no surviving worker reached, and replays the rest.)
    final = {(o["t"], o["u"]): o["digest"] for o in recovery.deliveries}
    assert set(final) == set(scheduled)
    outcomes = [o for w in soak.workers for o in w.deliveries]
    assert [o for o in outcomes if "error" in o] == []
    # A write refused for a lost lease: only in a process the test stopped past it.
    lost = [o for w in soak.workers if not w.paused for o in w.deliveries if "lease_lost" in o]
    assert lost == [], "a worker that was never stopped lost its lease"
    lost_after_pauses = sum(1 for o in outcomes if "lease_lost" in o)
    pauses = sum(w.paused for w in soak.workers)
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
        + (
            f"; {lost_after_pauses} refused a write after their worker was stopped past "
            f"its lease ({pauses} pauses), each delivered again"
            if pauses
            else ""
        )
    )


async def audit_outcomes(
    durability: Durability, soak: Soak, plan: dict[str, Any], recovery: Worker, report: list[str]
) -> list[str]:
    """Each turn's outcome against its schedule, the receipts and the provider's ledger;
    returns the keys of the uncertain receipts."""
    steps = {(o["t"], o["u"]): [tuple(s) for s in o["steps"]] for o in recovery.deliveries}
    charge = "payments.charge"
    outcome: dict[str, str] = {}  # payment intent -> its latest acceptance's outcome
    failures: Counter[str] = Counter()  # payment intent -> declined acceptances
    accepted: set[str] = set()
    rejected: set[str] = set()
    by_death = 0  # uncertain though the provider would have answered
    for thread_id, messages in plan["threads"].items():
        pending: str | None = None
        for index, message in enumerate(messages):
            got = steps[(thread_id, turn_id(index))]
            words = message.split()
            if words[0] == "charge":
                assert got == [(charge, "awaiting_confirmation")], (thread_id, index, got)
                pending = words[1]
            elif words[0] == "balance":
                assert got == [("billing.balance", "completed")], (thread_id, index, got)
            elif pending is None:
                assert got == [], (thread_id, index, got)  # an answer with nothing pending
            elif words[0] == "no":
                assert got == [(charge, "rejected")], (thread_id, index, got)
                rejected.add(pending)
                pending = None
            else:
                [(capability, status)] = got
                mode = plan["behaviour"][pending]
                before = outcome.get(pending)
                if before in ("completed", "uncertain"):  # deduplicated, or failing closed
                    allowed = {before}
                elif mode == "lost_response":
                    allowed = {"uncertain"}
                elif mode == "not_applied_once" and failures[pending] == 0:
                    # Declined at its first attempt; completed if that attempt's turn died
                    # and its retry ran the second attempt (checked on the receipt below).
                    allowed = {"failed", "uncertain", "completed"}
                else:
                    allowed = {"completed", "uncertain"}
                assert capability == charge and status in allowed, (thread_id, index, got)
                if status == "uncertain" and before is None and allowed != {"uncertain"}:
                    by_death += 1
                failures[pending] += status == "failed"
                outcome[pending] = status
                accepted.add(pending)
                pending = None

    # Receipts: one per accepted payment intent, in its latest outcome; none for the others.
    receipts = {(r.thread_id, r.key): r for r in await durability.list_receipts()}
    by_key = {key: r for (_, key), r in receipts.items()}  # keys are unique across threads
    assert len(by_key) == len(receipts)
    assert {key: str(r.status) for key, r in by_key.items()} == {
        charge_key(pi): status for pi, status in outcome.items()
    }

    for pi, status in outcome.items():
        receipt = by_key[charge_key(pi)]
        if status == "completed":  # the value of the attempt that was applied
            assert receipt.value["charge_id"] == f"ch_{pi}_{receipt.attempt}"
            assert receipt.attempt >= (2 if plan["behaviour"][pi] == "not_applied_once" else 1)

    # Provider: each key at most once, every call accounted for by a receipt.
    calls = Counter(call["key"] for call in read_ledger(soak.ledger))
    assert [key for key, n in calls.items() if n > 1] == [], "a key reached the provider twice"
    assert all(key.startswith(CHARGE) for key in calls)
    assert all(by_key[key].status in ("completed", "uncertain") for key in calls)
    completed = {key for key, r in by_key.items() if r.status == "completed"}
    assert completed <= set(calls)
    uncertain = sorted(key for key, r in by_key.items() if r.status == "uncertain")
    never_run = rejected - accepted
    assert not {charge_key(pi) for pi in never_run} & (set(calls) | set(by_key))
    report.append(
        f"outcomes as scheduled: {len(accepted)} payment intents accepted, {len(completed)} "
        f"completed, {len(uncertain)} uncertain ({by_death} of them after a death in the "
        f"provider window, the rest lost responses), {sum(failures.values())} declined; "
        f"{len(never_run)} only rejected, never run"
    )
    report.append(
        f"provider: {len(calls)} keys called, none twice; every call accounted for by a "
        "completed or uncertain receipt"
    )
    return uncertain


async def reconcile(
    durability: Durability, soak: Soak, uncertain: list[str], report: list[str]
) -> None:
    """An operator settles every uncertain receipt from the provider's records."""
    calls = {call["key"] for call in read_ledger(soak.ledger)}
    threads = {r.key: r.thread_id for r in await durability.list_receipts(status="uncertain")}
    assert sorted(threads) == uncertain
    for key in uncertain:
        value = {"charge_id": "ch_reconciled", "amount": 0} if key in calls else None
        await durability.resolve_receipt(threads[key], key, applied=key in calls, value=value)
    assert await durability.list_receipts(status="uncertain") == []
    report.append(f"reconciled: {len(uncertain)} uncertain receipts, none left")


async def audit_outbox(
    durability: Durability, soak: Soak, plan: dict[str, Any], report: list[str]
) -> None:
    everything = await read_all_events(durability)
    positions = [e.position for e in everything]
    assert positions == sorted(set(positions)) and len({e.id for e in everything}) == len(
        everything
    )
    if soak.store.kind == "postgres":
        assert positions == list(range(1, len(everything) + 1))
    scheduled = {(t, turn_id(i)) for t, ms in plan["threads"].items() for i in range(len(ms))}
    assert [
        e for e in everything if e.turn_id is not None and (e.thread_id, e.turn_id) not in scheduled
    ] == []
    announced = Counter((e.thread_id, e.turn_id) for e in everything if e.type == "turn.committed")
    assert set(announced) == scheduled and set(announced.values()) == {1}
    for thread_id in plan["threads"]:
        seqs = [e.seq for e in everything if e.thread_id == thread_id]
        assert seqs == list(range(1, len(seqs) + 1))
    applied = Counter(e.payload["key"] for e in everything if e.type == "effect.completed")
    assert set(applied.values()) <= {1}, "an applied write announced twice"
    resolved = {e.payload["key"] for e in everything if e.type == "receipt.resolved"}
    completed = {
        r.key for r in await durability.list_receipts(status="completed") if r.key not in resolved
    }
    assert set(applied) == completed

    # The relay: every committed event delivered at least once, each thread in seq order;
    # an event again only from a later relay process (one killed before marking it).
    delivered = [json.loads(line) for line in soak.sink.read_text().splitlines()]
    assert Counter(d["id"] for d in delivered).keys() == {e.id for e in everything}
    assert len({(d["id"], d["pid"]) for d in delivered}) == len(delivered)
    for thread_id in plan["threads"]:
        first = list(dict.fromkeys(d["seq"] for d in delivered if d["thread_id"] == thread_id))
        assert first == [e.seq for e in everything if e.thread_id == thread_id]
    again = len(delivered) - len(everything)
    if not any(r.death for r in soak.relays):
        assert again == 0
    assert isinstance(durability, RecordedDurability)
    backlog = await OutboxRelay(durability, lambda event: None).status()
    assert backlog.unpublished == 0
    report.append(
        f"events: {len(everything)} committed, in commit order, each delivered by "
        f"OutboxRelay at least once and in its thread's order ({again} again after relay "
        f"deaths), none left unpublished; {len(announced)} turn.committed (one per turn), "
        f"{len(applied)} effect.completed (one per write applied by a turn), {len(resolved)} "
        "receipt.resolved"
    )


async def audit_the_end(
    durability: Durability, store: Store, soak: Soak, plan: dict[str, Any], report: list[str]
) -> None:
    for thread_id, messages in plan["threads"].items():
        checkpoint = await durability.load_checkpoint(thread_id)
        assert checkpoint is not None and checkpoint.version == len(messages)
    if store.kind == "postgres":
        # A lease outlives only a worker that died holding it, and lapses on its own.
        live = store.query("SELECT owner FROM ik_leases WHERE expires_at > clock_timestamp()")
        dead = {
            str(w.process.pid)
            for w in [*soak.workers, *soak.relays]
            if w.process.returncode not in (0, None)
        }
        assert all(owner.split(":")[1] in dead for (owner,) in live), live
        where = f"no lease alive but {len(live)} of dead workers (they lapse on their own)"
    else:
        held = sqlite_record_locks(store.location + ".locks")
        assert held in ([], None), f"record locks still held on the lock file: {held}"
        where = (
            "no record lock held on the lock file (/proc/locks)"
            if held is not None
            else "(/proc/locks unavailable: lock file not checked)"
        )
    statuses = Counter(w.process.returncode for w in soak.workers)
    report.append(
        f"checkpoints: {len(plan['threads'])} threads at their last turn; {where}; "
        f"worker exits: {statuses[-9]} SIGKILLed, {statuses[faults.EXIT_STATUS]} at a fault "
        f"point, {statuses[0]} finished"
    )


def sqlite_record_locks(path: str) -> list[str] | None:
    """Every POSIX record lock any process holds on ``path`` (Linux ``/proc/locks``), or
    ``None`` where the kernel does not list them."""
    if not os.path.exists("/proc/locks"):
        return None
    stat = os.stat(path)
    inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    with open("/proc/locks") as locks:
        return [line.strip() for line in locks if inode in line.split()]
