"""The crash matrix: a turn dies at every durable point, on SQLite and PostgreSQL, and
the same delivery, retried by a new process, gets exactly what the source document
requires at that point.

Three turns die (see :data:`SCENARIOS`). The first is the acceptance of a confirmed
charge: the thread's second turn, one external write. The second is a thread's very
first turn paying at once. It is a ``"capability"``-mode write, on the first-commit
path, which creates the thread. The third is a turn with two external writes, dying
between them. A real worker process
(``tests/crash_worker.py``) runs the turn and dies at the fault point (``os._exit``: no
cleanup of any kind); a new process then retries the same delivery. At each point the
outcome of each write is fixed.

At ``after_lock`` and ``after_checkpoint_load`` nothing was written. The retry runs
the turn again, and the provider is called once. At ``after_receipt_prepared`` the
receipt is prepared and the provider was not called. The retry fails closed:
uncertain, no call. At ``in_provider_after_write`` the provider was called and its
answer lost, with the receipt still prepared. The retry fails closed: uncertain, no
second call. At ``after_receipt_completed``, ``before_commit`` and ``during_commit``
the receipt is completed and there is no turn. The retry runs again, and the effect
is deduplicated: its stored value, no call. At ``after_commit`` the turn committed,
and the retry replays the stored result.

With two writes, a death after the first completed leaves the second to the retry,
which runs it once. A death inside the second's provider window fails the second
closed and deduplicates the first. In every case the provider's ledger holds each key
at most once. The outbox holds events of committed turns only. An operator's
reconciliation of an uncertain receipt lets the business go on without a second
charge.

``during_commit`` dies inside the commit transaction, every row written and nothing
committed. On SQLite the point is inside the open transaction. On PostgreSQL, the
commit is one statement. There the server is made to hold that statement's transaction
open, while the worker dies. A deferred trigger holds it, waiting for a lock the test
holds. In process, it is held open while the test terminates the adapter's
session.

The same matrix runs in process with ``"raise"`` faults on every adapter
(including the in-memory one), which also proves that an adapter instance that
saw a turn die keeps no stale state.
"""

from __future__ import annotations

import ast
import asyncio
import json
import signal
import threading
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import prefork
from intention_kernel import Kernel, StoreError
from intention_kernel.durability import Durability
from intention_kernel.testing import InMemoryDurability, faults
from intention_kernel.testing._agents import billing_agent
from proving_support import (
    LedgerProvider,
    Store,
    assert_outbox_matches_commits,
    charge_key,
    drop_schema,
    ledger_keys,
    make_sql_store,
    new_schema,
    pay_key,
    proving_agent,
    read_all_events,
)

WORKER = Path(__file__).with_name("crash_worker.py")
PROCESS_TIMEOUT = 60.0
THREAD = "th-crash"
KEY = charge_key("pi_1")
CHARGED = {"charge_id": "ch_pi_1_1", "amount": 500}


class TurnRequest(TypedDict):
    """The arguments of one ``Kernel.turn`` call, as the worker receives them too."""

    thread_id: str
    turn_id: str
    message: str


@dataclass(frozen=True)
class Scenario:
    """A delivery that dies, on a thread the turns ``before`` prepared."""

    name: str
    thread: str
    before: tuple[tuple[str, str], ...]  # (turn ID, message), committed first
    turn: tuple[str, str]  # the delivery that dies, then is retried
    effects: tuple[tuple[str, Any], ...]  # (key, value once completed), in the turn's order
    pending: dict[str, Any] | None  # the confirmation the turn answers
    again: tuple[tuple[str, str], ...]  # later turns asking for the same writes again

    def request(self) -> TurnRequest:
        return {"thread_id": self.thread, "turn_id": self.turn[0], "message": self.turn[1]}

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.effects]

    def commits(self, committed: bool) -> list[tuple[str, str, int]]:
        """``(thread, turn, version)`` of the committed turns, with the dying one or not."""
        turns = [*self.before, *([self.turn] if committed else [])]
        return [(self.thread, turn_id, i + 1) for i, (turn_id, _) in enumerate(turns)]


def paid(pi: str, amount: int, attempt: int = 1) -> dict[str, Any]:
    return {"charge_id": f"ch_{pi}_{attempt}", "amount": amount}


CHARGE_ON_ACCEPTANCE = Scenario(
    "charge",
    THREAD,
    before=(("propose", "charge pi_1 500"),),
    turn=("accept", "yes"),
    effects=((KEY, CHARGED),),
    pending={"payment_intent_id": "pi_1", "amount": 500},
    again=(("propose-again", "charge pi_1 500"), ("accept-again", "yes")),
)
FIRST_TURN = Scenario(
    "first-turn",
    "th-first",
    before=(),
    turn=("pay", "pay pi_1 100"),
    effects=((pay_key("pi_1"), paid("pi_1", 100)),),
    pending=None,
    again=(("pay-again", "pay pi_1 100"),),
)
TWO_EFFECTS = Scenario(
    "two-effects",
    "th-two",
    before=(("ask", "balance 7"),),
    turn=("pay-both", "pay pi_1 100 and pay pi_2 200"),
    effects=((pay_key("pi_1"), paid("pi_1", 100)), (pay_key("pi_2"), paid("pi_2", 200))),
    pending=None,
    again=(("pay-both-again", "pay pi_1 100 and pay pi_2 200"),),
)
SCENARIOS = (CHARGE_ON_ACCEPTANCE, FIRST_TURN, TWO_EFFECTS)


@dataclass(frozen=True)
class Outcome:
    """What a turn that died at a point leaves behind, and what its retry returns."""

    left: tuple[str | None, ...]  # each write's receipt status right after the death
    called: tuple[bool, ...]  # whether each write reached the provider before the death
    committed: bool  # whether the dead turn had committed (then its retry replays)
    steps: tuple[str, ...]  # the retried turn's step status, one per write

    def calls(self, keys: list[str]) -> Counter[str]:
        """Provider calls per key once the retry is done: before the death, or by the
        retry when nothing was left behind."""
        return Counter(
            key
            for key, left, called, step in zip(
                keys, self.left, self.called, self.steps, strict=True
            )
            if called or (left is None and step == "completed")
        )


RUNS_AGAIN = Outcome((None,), (False,), committed=False, steps=("completed",))
FAILS_CLOSED_UNCALLED = Outcome(("prepared",), (False,), committed=False, steps=("uncertain",))
FAILS_CLOSED_CALLED = Outcome(("prepared",), (True,), committed=False, steps=("uncertain",))
DEDUPLICATED = Outcome(("completed",), (True,), committed=False, steps=("completed",))
REPLAYED = Outcome(("completed",), (True,), committed=True, steps=("completed",))

ONE_WRITE = {
    faults.AFTER_LOCK: RUNS_AGAIN,
    faults.AFTER_CHECKPOINT_LOAD: RUNS_AGAIN,
    faults.AFTER_RECEIPT_PREPARED: FAILS_CLOSED_UNCALLED,
    faults.IN_PROVIDER_AFTER_WRITE: FAILS_CLOSED_CALLED,
    faults.AFTER_RECEIPT_COMPLETED: DEDUPLICATED,
    faults.BEFORE_COMMIT: DEDUPLICATED,
    faults.DURING_COMMIT: DEDUPLICATED,
    faults.AFTER_COMMIT: REPLAYED,
}
assert tuple(ONE_WRITE) == faults.POINTS


@dataclass(frozen=True)
class Case:
    scenario: Scenario
    point: str
    outcome: Outcome
    skip: int = 0  # passes through the point that survive before the one that dies
    label: str = ""

    @property
    def id(self) -> str:
        return f"{self.scenario.name}-{self.label or self.point}"


CASES = [
    *(Case(CHARGE_ON_ACCEPTANCE, point, ONE_WRITE[point]) for point in faults.POINTS),
    *(Case(FIRST_TURN, point, ONE_WRITE[point]) for point in faults.POINTS),
    Case(
        TWO_EFFECTS,
        faults.AFTER_RECEIPT_COMPLETED,
        Outcome(("completed", None), (True, False), False, ("completed", "completed")),
        label="between-the-writes",
    ),
    Case(
        TWO_EFFECTS,
        faults.AFTER_RECEIPT_PREPARED,
        Outcome(("completed", "prepared"), (True, False), False, ("completed", "uncertain")),
        skip=1,
        label="second-prepared",
    ),
    Case(
        TWO_EFFECTS,
        faults.IN_PROVIDER_AFTER_WRITE,
        Outcome(("completed", "prepared"), (True, True), False, ("completed", "uncertain")),
        skip=1,
        label="in-the-second-provider-call",
    ),
]
CASE_IDS = [case.id for case in CASES]


def propose() -> TurnRequest:
    return {"thread_id": THREAD, "turn_id": "propose", "message": "charge pi_1 500"}


def accept() -> TurnRequest:
    return CHARGE_ON_ACCEPTANCE.request()


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(
        request.param, request, tmp_path, file="billing.db", name_sessions=True
    )


@dataclass
class Processes:
    """Worker processes of one test; none outlives it."""

    store: Store
    ledger: Path
    running: list[prefork.Forked]

    async def spawn(
        self, turns: Sequence[Mapping[str, object]], store: Store | None = None, **config: Any
    ) -> prefork.Forked:
        config.update(store=(store or self.store).config(), ledger=str(self.ledger), turns=turns)
        process = await prefork.spawn(WORKER, json.dumps(config))
        self.running.append(process)
        return process


async def finish(process: prefork.Forked, status: int = 0) -> list[dict[str, Any]]:
    stdout, stderr = await asyncio.wait_for(process.communicate(), PROCESS_TIMEOUT)
    assert process.returncode == status, (
        f"worker exited with {process.returncode}, expected {status}:\n{stderr.decode()}"
    )
    return [json.loads(line) for line in stdout.decode().splitlines()]


@pytest.fixture
async def processes(store: Store, tmp_path: Path) -> AsyncIterator[Processes]:
    processes = Processes(store, tmp_path / "provider.ledger", [])
    yield processes
    for process in processes.running:
        if process.returncode is None:
            process.kill()
        await process.communicate()


async def prepare(durability: Durability, scenario: Scenario, ledger: Path) -> None:
    kernel = Kernel(proving_agent(LedgerProvider(path=str(ledger), sync=False)), durability)
    for turn_id, message in scenario.before:
        await kernel.turn(scenario.thread, turn_id, message)


# -- what every case checks ------------------------------------------------------------------


async def check_after_the_death(durability: Durability, ledger: Path, case: Case) -> None:
    scenario, outcome = case.scenario, case.outcome
    called = Counter(k for k, c in zip(scenario.keys, outcome.called, strict=True) if c)
    assert Counter(ledger_keys(ledger)) == called
    receipts = await durability.list_receipts(scenario.thread)
    left = [(r.key, r.status, r.attempt) for r in receipts]
    assert left == [
        (key, status, 1) for key, status in zip(scenario.keys, outcome.left, strict=True) if status
    ]
    checkpoint = await durability.load_checkpoint(scenario.thread)
    version = len(scenario.before) + outcome.committed
    if version == 0:  # the thread's first turn never committed: there is no thread
        assert checkpoint is None
    else:
        assert checkpoint is not None and checkpoint.version == version
    if scenario.pending is not None and not outcome.committed:  # nothing consumed it
        assert checkpoint is not None and checkpoint.interaction is not None
        assert checkpoint.interaction.input == scenario.pending
    events = await read_all_events(durability)
    assert_outbox_matches_commits(events, scenario.commits(outcome.committed))


async def check_the_retry(
    durability: Durability,
    store: Store | None,
    ledger: Path,
    retried: dict[str, Any],
    case: Case,
) -> None:
    """The retry's result, the receipts, the outbox and the ledger, once the dust settled."""
    scenario, outcome = case.scenario, case.outcome
    assert retried["replayed"] is outcome.committed
    assert retried["checkpoint_version"] == len(scenario.before) + 1
    assert retried["interaction"] is None  # an acceptance was consumed, exactly once
    steps = retried["steps"]
    assert [step["status"] for step in steps] == list(outcome.steps)
    receipts = {r.key: r for r in await durability.list_receipts(scenario.thread)}
    assert sorted(receipts) == sorted(scenario.keys)
    for (key, value), step in zip(scenario.effects, steps, strict=True):
        receipt = receipts[key]
        assert receipt.attempt == 1
        assert receipt.status == ("uncertain" if step["status"] == "uncertain" else "completed")
        assert step["receipt_ids"] == [receipt.id]
        if step["status"] == "completed":
            assert step["value"] == receipt.value == value
        else:
            assert step["error"].startswith("EffectUncertainError")

    calls = Counter(ledger_keys(ledger))
    assert calls == outcome.calls(scenario.keys), f"provider calls {calls}"
    if store is not None:
        assert store.committed_turns() == sorted(scenario.commits(True))
    events = await read_all_events(durability)
    assert_outbox_matches_commits(events, scenario.commits(True))
    effect_events = [
        (e.turn_id, e.type, e.payload["key"]) for e in events if e.type.startswith("effect.")
    ]
    announced = [
        (scenario.turn[0], "effect.uncertain" if step == "uncertain" else "effect.completed", key)
        for key, step in zip(scenario.keys, outcome.steps, strict=True)
    ]
    assert effect_events == announced


async def reconcile_and_go_on(durability: Durability, ledger: Path, case: Case) -> None:
    """An operator reconciles each uncertain receipt from the provider's records; then the
    same writes are asked for again, without reaching the provider a second time."""
    scenario, outcome = case.scenario, case.outcome
    provider = LedgerProvider(path=str(ledger))
    kernel = Kernel(proving_agent(provider), durability)
    for (key, value), status in zip(scenario.effects, outcome.steps, strict=True):
        if status == "uncertain":
            applied = key in ledger_keys(ledger)
            resolved = await durability.resolve_receipt(
                scenario.thread, key, applied=applied, value=value if applied else None, actor="ops"
            )
            assert resolved.status == ("completed" if applied else "failed")
    for turn_id, message in scenario.again:
        again = await kernel.turn(scenario.thread, turn_id, message)
    assert [step.status for step in again.steps] == ["completed"] * len(scenario.effects)
    for (_, value), result in zip(scenario.effects, again.steps, strict=True):
        assert result.value in (value, dict(value, charge_id=value["charge_id"][:-1] + "2"))
    # Charged once per key, whatever happened.
    assert Counter(ledger_keys(ledger)) == Counter(scenario.keys)


# -- real processes, really dying ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
async def test_a_process_dying_at_a_fault_point_is_recovered_by_retrying_the_delivery(
    store: Store, processes: Processes, case: Case
) -> None:
    scenario = case.scenario
    async with store.durability() as durability:
        await prepare(durability, scenario, processes.ledger)

    if store.kind == "postgres" and case.point == faults.DURING_COMMIT:
        await die_inside_the_postgres_commit(
            store, processes, scenario.request(), server_notices=True
        )
    else:
        fault = {"point": case.point, "action": "exit", "skip": case.skip}
        crashed = await processes.spawn([scenario.request()], fault=fault)
        assert await finish(crashed, faults.EXIT_STATUS) == []

    async with store.durability() as durability:
        await check_after_the_death(durability, processes.ledger, case)

    [outcome] = await finish(await processes.spawn([scenario.request()]))
    retried = outcome["result"]
    async with store.durability() as durability:
        await check_the_retry(durability, store, processes.ledger, retried, case)
        # A third delivery, here: the stored result again, nothing runs.
        provider = LedgerProvider(path=str(processes.ledger))
        third = await Kernel(proving_agent(provider), durability).turn(**scenario.request())
        assert third.to_dict() == dict(retried, replayed=True)
        assert provider.calls() == 0
        await reconcile_and_go_on(durability, processes.ledger, case)


@pytest.mark.slow
@pytest.mark.postgres
async def test_a_process_dying_inside_a_postgres_commit_the_server_then_completes_is_replayed(
    postgres_dsn: str, tmp_path: Path
) -> None:
    """Without ``client_connection_check_interval`` the server finishes the commit
    statement of a client that died waiting for it: the acknowledgement is lost, the
    turn is committed, and the retry replays it."""
    schema = new_schema()
    store = Store("postgres", make_conninfo(postgres_dsn, application_name=schema), schema)
    processes = Processes(store, tmp_path / "provider.ledger", [])
    case = Case(CHARGE_ON_ACCEPTANCE, faults.DURING_COMMIT, REPLAYED, label="server-completes")
    try:
        async with store.durability() as durability:
            await prepare(durability, case.scenario, processes.ledger)
        await die_inside_the_postgres_commit(store, processes, accept(), server_notices=False)
        async with store.durability() as durability:
            await check_after_the_death(durability, processes.ledger, case)
        [outcome] = await finish(await processes.spawn([accept()]))
        async with store.durability() as durability:
            await check_the_retry(durability, store, processes.ledger, outcome["result"], case)
    finally:
        for process in processes.running:
            if process.returncode is None:
                process.kill()
            await process.communicate()
        drop_schema(postgres_dsn, schema)


STALL_COMMITS = """
    CREATE FUNCTION ik_test_stall() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF current_setting('ik_test.stall', true) = 'on' THEN
            PERFORM pg_advisory_xact_lock({lock});
        END IF;
        RETURN NULL;
    END $$;
    CREATE CONSTRAINT TRIGGER ik_test_stall AFTER INSERT ON ik_turns
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ik_test_stall();
"""
WAITING_INSIDE_THE_COMMIT = (
    "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
    " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
)
SESSIONS = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"


@contextmanager
def stalled_commits(store: Store, dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """Make the server hold open the commit transaction of sessions that opted in with
    ``ik_test.stall=on``, after all of the commit statement's work and before its end.

    A deferred trigger on ``ik_turns`` (fired at commit time, after every row of the
    turn is written) waits for an advisory lock that the connection yielded here holds
    until the block ends."""
    stall_lock = zlib.crc32(store.schema.encode())  # this test's own advisory lock key
    store.query(STALL_COMMITS.format(lock=stall_lock))
    try:
        with psycopg.connect(dsn, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (stall_lock,))
            yield holder
            holder.execute("SELECT pg_advisory_unlock_all()")
    finally:
        store.query("DROP TRIGGER ik_test_stall ON ik_turns")
        store.query("DROP FUNCTION ik_test_stall()")


def stalling(store: Store, name: str, *, server_notices: bool = True) -> Store:
    """The same store, through sessions named ``name`` that opted in to the stall."""
    options = "-c ik_test.stall=on"
    if server_notices:
        options += " -c client_connection_check_interval=50"
    conninfo = make_conninfo(store.location, application_name=name, options=options)
    return Store("postgres", conninfo, store.schema)


async def die_inside_the_postgres_commit(
    store: Store, processes: Processes, request: TurnRequest, *, server_notices: bool
) -> None:
    """Kill a worker while the server holds its commit transaction open, every row of
    the turn written and ``COMMIT`` not yet done (see :func:`stalled_commits`).

    Once the worker's session waits there, the worker's ``DURING_COMMIT`` fault (armed
    as the statement is sent) exits the process. With ``client_connection_check_interval``
    set (``server_notices``), the server notices the dead client while waiting and rolls
    the transaction back; without it, the orphaned session commits once the lock is free.
    """
    name = store.schema + "_victim"
    go = str(processes.ledger) + ".die"
    with stalled_commits(store, store.location) as holder:
        crashed = await processes.spawn(
            [request],
            store=stalling(store, name, server_notices=server_notices),
            fault={"point": faults.DURING_COMMIT, "action": "exit_when", "file": go},
        )
        await until(lambda: holder.execute(WAITING_INSIDE_THE_COMMIT, (name,)).fetchone(), crashed)
        touch(go)
        assert await finish(crashed, faults.EXIT_STATUS) == []
        if server_notices:
            await until(lambda: holder.execute(SESSIONS, (name,)).fetchone() == (0,), None)
        holder.execute("SELECT pg_advisory_unlock_all()")
        await until(lambda: holder.execute(SESSIONS, (name,)).fetchone() == (0,), None)


async def lose_the_session_inside_the_postgres_commit(
    store: Store, kernel: Kernel, request: TurnRequest, name: str
) -> None:
    """In process: the adapter's session is terminated by the server while it holds the
    commit transaction open (see :func:`stalled_commits`), as a crashed host's would be.
    Nothing of the commit survives, and the turn raises the adapter's ``StoreError``."""

    def terminate_once_inside_the_commit(base: str) -> None:
        with psycopg.connect(base, autocommit=True) as watcher:
            deadline = time.monotonic() + 30
            while (row := watcher.execute(WAITING_INSIDE_THE_COMMIT, (name,)).fetchone()) is None:
                assert time.monotonic() < deadline, "the commit never reached the stall"
                time.sleep(0.005)
            watcher.execute("SELECT pg_terminate_backend(%s)", row)

    base = make_conninfo(store.location, application_name="", options="")
    with stalled_commits(store, base):
        watchers: list[threading.Thread] = []

        def watch(point: str) -> None:  # at DURING_COMMIT: the statement is about to be sent
            watchers.append(threading.Thread(target=terminate_once_inside_the_commit, args=(base,)))
            watchers[-1].start()

        with faults.injected(faults.DURING_COMMIT, watch) as fault, pytest.raises(StoreError):
            await kernel.turn(**request)
        assert fault.fired == 1
        for watcher in watchers:
            watcher.join(30)


def touch(path: str) -> None:
    Path(path).touch()


async def until(condition: Any, process: prefork.Forked | None) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        if process is not None and process.returncode is not None:
            _, stderr = await process.communicate()
            pytest.fail(f"the worker exited early:\n{stderr.decode()}")
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


# -- the same matrix in process, with "raise" faults, on every adapter -----------------------


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def adapter(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store | None]:
    """``None`` for the in-memory adapter, else the store under test."""
    if request.param == "memory":
        yield None
        return
    yield request.getfixturevalue("store_" + request.param)


@pytest.fixture
def store_sqlite(tmp_path: Path) -> Store:
    return Store("sqlite", str(tmp_path / "billing.db"))


@pytest.fixture
def store_postgres(postgres_dsn: str) -> Iterator[Store]:
    schema = new_schema()
    yield Store("postgres", postgres_dsn, schema)
    drop_schema(postgres_dsn, schema)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
async def test_a_turn_raising_at_a_fault_point_leaves_the_store_as_a_crash_would(
    adapter: Store | None, case: Case, tmp_path: Path
) -> None:
    """On PostgreSQL, ``during_commit`` is the adapter's session terminated by the server
    inside the commit transaction (a raised fault there would only precede the
    statement, which is ``before_commit`` again)."""
    scenario, point = case.scenario, case.point
    if adapter is None and point == faults.DURING_COMMIT:
        pytest.skip("the in-memory commit is plain assignments, with nothing in between")
    in_flight = adapter is not None and adapter.kind == "postgres" and point == faults.DURING_COMMIT
    victim = adapter.schema + "_victim" if adapter is not None else ""
    if in_flight:
        assert adapter is not None
        adapter = stalling(adapter, victim)
    ledger = tmp_path / "provider.ledger"
    durability = adapter.durability() if adapter is not None else InMemoryDurability()
    async with durability:
        await prepare(durability, scenario, ledger)
        provider = LedgerProvider(path=str(ledger), sync=False)
        kernel = Kernel(proving_agent(provider), durability)
        if in_flight:
            assert adapter is not None
            await lose_the_session_inside_the_postgres_commit(
                adapter, kernel, scenario.request(), victim
            )
        else:
            with (
                faults.injected(point, "raise", skip=case.skip) as fault,
                pytest.raises(faults.InjectedFault) as died,
            ):
                await kernel.turn(**scenario.request())
            assert died.value.point == point and fault.fired == 1
        await check_after_the_death(durability, ledger, case)
        retried = await kernel.turn(**scenario.request())  # the same adapter instance
        await check_the_retry(durability, adapter, ledger, retried.to_dict(), case)
    if adapter is not None:  # and a fresh instance agrees
        async with adapter.durability() as reopened:
            again = await Kernel(proving_agent(provider), reopened).turn(**scenario.request())
            assert again.to_dict() == dict(retried.to_dict(), replayed=True)
            await reconcile_and_go_on(reopened, ledger, case)


async def test_unarmed_fault_points_are_never_entered(
    adapter: Store | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unarmed, no fault point goes further than its flag check: ``_faults.reach`` is
    never called by a turn with a confirmation, an external write (in either confirmation
    mode), a commit and a replay, on any adapter."""
    from intention_kernel import _faults

    assert _faults.armed is False
    entered: list[str] = []

    def reach(point: str) -> None:
        entered.append(point)
        raise AssertionError(f"fault point {point} entered while nothing is armed")

    monkeypatch.setattr(_faults, "reach", reach)
    provider = LedgerProvider(path=str(tmp_path / "provider.ledger"), sync=False)
    durability = adapter.durability() if adapter is not None else InMemoryDurability()
    async with durability:
        kernel = Kernel(billing_agent(provider), durability)
        assert (await kernel.turn(**propose())).interaction is not None
        accepted = await kernel.turn(**accept())
        assert accepted.steps[0].status == "completed"
        assert (await kernel.turn(**accept())).replayed
        await kernel.turn(THREAD, "refund", "refund pi_1 100")
        refunded = await kernel.turn(THREAD, "refund-yes", "yes")
        assert refunded.steps[0].status == "completed"
    assert entered == []
    assert provider.calls() == 2


def test_every_fault_point_in_the_library_is_behind_the_armed_flag() -> None:
    """Every call of ``_faults.reach`` in ``src/`` sits in the body of an
    ``if _faults.armed:`` (in the same function), and nothing imports ``reach`` under
    another name: unarmed, a fault point is one attribute read. And the mechanism is a
    testing hook, not part of the public API."""
    import intention_kernel

    assert [name for name in intention_kernel.__all__ if "fault" in name.lower()] == []
    root = Path(intention_kernel.__file__).parent
    guarded: list[str] = []
    unguarded: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(root.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_faults"):
                assert "reach" not in {a.name for a in node.names}, f"{where} imports reach"
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "reach"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "_faults"
            ):
                continue
            label = f"{where}:{node.lineno}"
            (guarded if _behind_the_armed_flag(node, parents) else unguarded).append(label)
    assert unguarded == [], f"fault points reached without checking _faults.armed: {unguarded}"
    # The durable code paths (each point but IN_PROVIDER_AFTER_WRITE, which the test's own
    # provider marks through testing.faults.reach) and testing.faults.reach itself.
    assert len(guarded) >= len(faults.POINTS), guarded


def _behind_the_armed_flag(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` is in the body (not the ``else``) of an ``if _faults.armed:`` of
    its own function."""
    child, parent = node, parents.get(node)
    while parent is not None and not isinstance(
        parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
    ):
        if (
            isinstance(parent, ast.If)
            and isinstance(parent.test, ast.Attribute)
            and parent.test.attr == "armed"
            and isinstance(parent.test.value, ast.Name)
            and parent.test.value.id == "_faults"
            and any(child is statement for statement in parent.body)
        ):
            return True
        child, parent = parent, parents.get(parent)
    return False


@pytest.mark.parametrize(
    "point", [faults.AFTER_RECEIPT_COMPLETED, faults.BEFORE_COMMIT, faults.DURING_COMMIT]
)
async def test_a_write_applied_by_a_turn_that_never_committed_is_announced_once(
    adapter: Store | None, point: str, tmp_path: Path
) -> None:
    """The accepting turn dies after its charge completed; the person's answer then arrives
    under a new delivery ID, whose turn reuses the completed receipt and announces it (the
    receipt is marked announced in that turn's commit). The crashed delivery arriving at
    last, through a restarted adapter, announces nothing more: the charge happened once,
    and the outbox says so once."""
    if adapter is None and point == faults.DURING_COMMIT:
        pytest.skip("the in-memory commit is plain assignments, with nothing in between")
    provider = LedgerProvider(path=str(tmp_path / "provider.ledger"), sync=False)
    durability = adapter.durability() if adapter is not None else InMemoryDurability()
    async with durability:
        kernel = Kernel(billing_agent(provider), durability)
        await kernel.turn(**propose())
        with faults.injected(point, "raise"), pytest.raises(faults.InjectedFault):
            await kernel.turn(**accept())
        [receipt] = await durability.list_receipts(THREAD)
        assert (receipt.status, receipt.announced) == ("completed", False)
        answered = await kernel.turn(THREAD, "accept-redelivered-under-a-new-id", "yes")
        assert answered.steps[0].status == "completed" and provider.calls() == 1
        [receipt] = await durability.list_receipts(THREAD)
        assert receipt.announced
        await kernel.turn(THREAD, "propose-again", "charge pi_1 500")
        if adapter is not None:
            await durability.aclose()
            durability = adapter.durability()
            kernel = Kernel(billing_agent(provider), durability)
        async with durability:
            await kernel.turn(THREAD, "accept-again", "yes")  # deduplicated: no event
            await kernel.turn(**accept())  # the crashed delivery at last
            events = await read_all_events(durability, thread_id=THREAD)
    completed = [e for e in events if e.type == "effect.completed"]
    assert [(e.turn_id, e.payload["key"]) for e in completed] == [
        ("accept-redelivered-under-a-new-id", KEY)
    ]
    assert provider.calls() == 1


# -- a quorum's accepts, with a kill between them ----------------------------------------------

QUORUM = 2


def accepted_by(actor: str, turn_id: str) -> dict[str, Any]:
    """A structured accept of the thread's pending charge by ``actor`` (as the host
    sends it: the actor is the token's principal)."""
    return {"thread_id": THREAD, "turn_id": turn_id, "answer": {"actor": actor}}


async def killed(process: prefork.Forked) -> list[dict[str, Any]]:
    """The first line a held worker prints, once it printed it; then ``SIGKILL``."""
    line = await asyncio.wait_for(process.stdout.readline(), PROCESS_TIMEOUT)
    assert line, "the worker ended before it was held"
    process.kill()  # SIGKILL: no cleanup, no rollback by the process itself
    await asyncio.wait_for(process.wait(), PROCESS_TIMEOUT)
    assert process.returncode == -signal.SIGKILL
    return [json.loads(line)]


async def quorum_state(durability: Durability) -> tuple[int, tuple[str, ...] | None]:
    """The thread's version and its pending interaction's approvers (``None``: none
    pending)."""
    checkpoint = await durability.load_checkpoint(THREAD)
    assert checkpoint is not None
    pending = checkpoint.interaction
    return checkpoint.version, (pending.approved_by if pending is not None else None)


@pytest.mark.slow
async def test_a_quorum_killed_after_its_first_accept_committed_runs_once_on_the_second(
    store: Store, processes: Processes
) -> None:
    await finish(await processes.spawn([propose()], approvals=QUORUM))
    [first] = await killed(
        await processes.spawn([accepted_by("ana", "ana")], approvals=QUORUM, hold=True)
    )
    assert first["result"]["interaction"]["approved_by"] == ["ana"]
    async with store.durability() as durability:
        assert await quorum_state(durability) == (2, ("ana",))
    assert ledger_keys(processes.ledger) == []

    # A new process: ana's delivery again is a replay, bob's accept completes the quorum.
    again, second = await finish(
        await processes.spawn(
            [accepted_by("ana", "ana"), accepted_by("bob", "bob")], approvals=QUORUM
        )
    )
    assert again["result"] == dict(first["result"], replayed=True)
    assert [s["status"] for s in second["result"]["steps"]] == ["completed"]
    assert second["result"]["interaction"] is None
    assert ledger_keys(processes.ledger) == [KEY]
    async with store.durability() as durability:
        assert await quorum_state(durability) == (3, None)
        events = await read_all_events(durability)
    assert_outbox_matches_commits(
        events, [(THREAD, "propose", 1), (THREAD, "ana", 2), (THREAD, "bob", 3)]
    )
    assert [
        (e.turn_id, e.payload["actor"]) for e in events if e.type == "interaction.approved"
    ] == [("ana", "ana")]
    [resolved] = [e for e in events if e.type == "interaction.resolved"]
    assert (resolved.turn_id, resolved.payload["approved_by"]) == ("bob", ["ana", "bob"])


# ``during_commit`` needs a server-side stall on PostgreSQL (see above); the other points
# are where a process can be held and killed on both stores.
HELD_POINTS = [point for point in faults.POINTS if point != faults.DURING_COMMIT]


@pytest.mark.slow
@pytest.mark.parametrize("point", HELD_POINTS)
async def test_a_quorum_killed_during_its_second_accept_runs_at_most_once_on_the_retry(
    store: Store, processes: Processes, point: str
) -> None:
    outcome = ONE_WRITE[point]
    await finish(await processes.spawn([propose(), accepted_by("ana", "ana")], approvals=QUORUM))
    fault = {"point": point, "action": "hold"}
    held = await processes.spawn([accepted_by("bob", "bob")], approvals=QUORUM, fault=fault)
    assert await killed(held) == [{"held": point}]
    assert ledger_keys(processes.ledger) == ([KEY] if outcome.called[0] else [])
    async with store.durability() as durability:
        # Unless the kill came after the commit, ana's approval is all that was recorded.
        assert await quorum_state(durability) == ((3, None) if outcome.committed else (2, ("ana",)))

    [retried] = await finish(await processes.spawn([accepted_by("bob", "bob")], approvals=QUORUM))
    result = retried["result"]
    assert result["replayed"] is outcome.committed
    assert [s["status"] for s in result["steps"]] == list(outcome.steps)
    assert result["interaction"] is None
    assert Counter(ledger_keys(processes.ledger)) == outcome.calls([KEY])
    async with store.durability() as durability:
        assert await quorum_state(durability) == (3, None)
        events = await read_all_events(durability)
    assert_outbox_matches_commits(
        events, [(THREAD, "propose", 1), (THREAD, "ana", 2), (THREAD, "bob", 3)]
    )
    [resolved] = [e for e in events if e.type == "interaction.resolved"]
    assert resolved.payload["approved_by"] == ["ana", "bob"]
