"""The crash matrix: a turn dies at every durable point, on SQLite and PostgreSQL, and
the same delivery, retried by a new process, gets exactly what the source document
requires at that point.

The turn is the acceptance of a confirmed charge (one external write). A real
worker process (``tests/crash_worker.py``) runs it and dies at the fault point
(``os._exit``: no cleanup of any kind); a new process then retries the same
delivery. At each point the outcome is fixed:

- ``after_lock``, ``after_checkpoint_load``: nothing was written; the retry runs
  the turn again and the provider is called once;
- ``after_receipt_prepared``: a ``prepared`` receipt, the provider not called; the
  retry fails closed (``uncertain``, no call);
- ``in_provider_after_write``: the provider was called, its answer lost, the
  receipt ``prepared``; the retry fails closed (``uncertain``, no second call);
- ``after_receipt_completed``, ``before_commit``, ``during_commit``: a ``completed``
  receipt and no turn; the retry runs again and the effect is deduplicated (its
  stored value, no call);
- ``after_commit``: the turn committed; the retry replays the stored result;

and in every case the provider's ledger holds each key at most once, the outbox
holds events of committed turns only, and an operator's reconciliation of an
uncertain receipt lets the business go on without a second charge.

The same matrix runs in process with ``"raise"`` faults on every adapter
(including the in-memory one), which also proves that an adapter instance that
saw a turn die keeps no stale state.
"""

from __future__ import annotations

import ast
import asyncio
import json
import sys
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from intention_kernel import Kernel
from intention_kernel.durability import Durability
from intention_kernel.testing import InMemoryDurability, faults
from intention_kernel.testing.agents import billing_agent
from proving_support import (
    LedgerProvider,
    Store,
    assert_outbox_matches_commits,
    charge_key,
    drop_schema,
    ledger_keys,
    new_schema,
    read_all_events,
)

WORKER = Path(__file__).with_name("crash_worker.py")
PROCESS_TIMEOUT = 60.0
THREAD = "th-crash"
KEY = charge_key("pi_1")
CHARGED = {"charge_id": "ch_pi_1_1", "amount": 500}


@dataclass(frozen=True)
class Expected:
    """What a turn that died at a point leaves behind, and what its retry returns."""

    receipt_left: str | None  # the receipt's status right after the death
    called: bool  # whether the provider was called before the death
    committed: bool  # whether the dead turn had committed
    replayed: bool  # whether the retry replays
    step: str  # the retried turn's step status
    calls: int  # provider calls, all processes together, once the retry is done


RUNS_AGAIN = Expected(None, False, committed=False, replayed=False, step="completed", calls=1)
FAILS_CLOSED_UNCALLED = Expected(
    "prepared", False, committed=False, replayed=False, step="uncertain", calls=0
)
FAILS_CLOSED_CALLED = Expected(
    "prepared", True, committed=False, replayed=False, step="uncertain", calls=1
)
DEDUPLICATED = Expected(
    "completed", True, committed=False, replayed=False, step="completed", calls=1
)
REPLAYED = Expected("completed", True, committed=True, replayed=True, step="completed", calls=1)

EXPECTED = {
    faults.AFTER_LOCK: RUNS_AGAIN,
    faults.AFTER_CHECKPOINT_LOAD: RUNS_AGAIN,
    faults.AFTER_RECEIPT_PREPARED: FAILS_CLOSED_UNCALLED,
    faults.IN_PROVIDER_AFTER_WRITE: FAILS_CLOSED_CALLED,
    faults.AFTER_RECEIPT_COMPLETED: DEDUPLICATED,
    faults.BEFORE_COMMIT: DEDUPLICATED,
    faults.DURING_COMMIT: DEDUPLICATED,
    faults.AFTER_COMMIT: REPLAYED,
}
assert tuple(EXPECTED) == faults.POINTS


def propose() -> dict[str, str]:
    return {"thread_id": THREAD, "turn_id": "propose", "message": "charge pi_1 500"}


def accept() -> dict[str, str]:
    return {"thread_id": THREAD, "turn_id": "accept", "message": "yes"}


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        yield Store("sqlite", str(tmp_path / "billing.db"))
        return
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = new_schema()
    yield Store("postgres", make_conninfo(dsn, application_name=schema), schema)
    drop_schema(dsn, schema)


@dataclass
class Processes:
    """Worker processes of one test; none outlives it."""

    store: Store
    ledger: Path
    running: list[asyncio.subprocess.Process]

    async def spawn(
        self, turns: list[dict[str, str]], store: Store | None = None, **config: Any
    ) -> asyncio.subprocess.Process:
        config.update(store=(store or self.store).config(), ledger=str(self.ledger), turns=turns)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            json.dumps(config),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self.running.append(process)
        return process


async def finish(process: asyncio.subprocess.Process, status: int = 0) -> list[dict[str, Any]]:
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


# -- what every case checks ------------------------------------------------------------------


async def check_after_the_death(durability: Durability, ledger: Path, expected: Expected) -> None:
    assert Counter(ledger_keys(ledger)) == ({KEY: 1} if expected.called else {})
    receipts = await durability.list_receipts(THREAD)
    left = [(r.key, r.status, r.attempt) for r in receipts]
    assert left == ([(KEY, expected.receipt_left, 1)] if expected.receipt_left else [])
    checkpoint = await durability.load_checkpoint(THREAD)
    assert checkpoint is not None
    assert checkpoint.version == (2 if expected.committed else 1)
    if not expected.committed:  # the confirmation is still pending: nothing consumed it
        assert checkpoint.interaction is not None
        assert checkpoint.interaction.input == {"payment_intent_id": "pi_1", "amount": 500}
    committed = [(THREAD, "propose", 1)] + ([(THREAD, "accept", 2)] if expected.committed else [])
    assert_outbox_matches_commits(await read_all_events(durability), committed)


async def check_the_retry(
    durability: Durability,
    store: Store | None,
    ledger: Path,
    retried: dict[str, Any],
    expected: Expected,
) -> None:
    """The retry's result, the receipt, the outbox and the ledger, once the dust settled."""
    assert retried["replayed"] is expected.replayed
    assert retried["checkpoint_version"] == 2
    assert retried["interaction"] is None  # the acceptance was consumed, exactly once
    [step] = retried["steps"]
    assert step["status"] == expected.step
    [receipt] = await durability.list_receipts(THREAD)
    assert (receipt.key, receipt.attempt) == (KEY, 1)
    assert receipt.status == ("uncertain" if expected.step == "uncertain" else "completed")
    assert step["receipt_ids"] == [receipt.id]
    if expected.step == "completed":
        assert step["value"] == receipt.value == CHARGED
    else:
        assert step["error"].startswith("EffectUncertainError")

    calls = Counter(ledger_keys(ledger))
    assert sum(calls.values()) == expected.calls
    assert all(n == 1 for n in calls.values()), f"a key reached the provider twice: {calls}"
    if store is not None:
        assert store.committed_turns() == [(THREAD, "accept", 2), (THREAD, "propose", 1)]
    events = await read_all_events(durability)
    assert_outbox_matches_commits(events, [(THREAD, "propose", 1), (THREAD, "accept", 2)])
    effect_events = [(e.turn_id, e.type) for e in events if e.type.startswith("effect.")]
    announced = "effect.uncertain" if expected.step == "uncertain" else "effect.completed"
    assert effect_events == [("accept", announced)]


async def reconcile_and_go_on(durability: Durability, ledger: Path, expected: Expected) -> None:
    """An operator reconciles an uncertain receipt from the provider's records; then the
    same payment intent is charged again without reaching the provider a second time."""
    provider = LedgerProvider(path=str(ledger))
    kernel = Kernel(billing_agent(provider), durability)
    if expected.step == "uncertain":
        applied = KEY in ledger_keys(ledger)
        resolved = await durability.resolve_receipt(
            THREAD, KEY, applied=applied, value=CHARGED if applied else None, actor="ops"
        )
        assert resolved.status == ("completed" if applied else "failed")
    await kernel.turn(THREAD, "propose-again", "charge pi_1 500")
    again = await kernel.turn(THREAD, "accept-again", "yes")
    [step] = again.steps
    assert step.status == "completed"
    assert step.value in (CHARGED, {"charge_id": "ch_pi_1_2", "amount": 500})
    assert Counter(ledger_keys(ledger)) == {KEY: 1}  # charged once, whatever happened


# -- real processes, really dying ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("point", faults.POINTS)
async def test_a_process_dying_at_a_fault_point_is_recovered_by_retrying_the_delivery(
    store: Store, processes: Processes, point: str
) -> None:
    expected = EXPECTED[point]
    async with store.durability() as durability:
        proposed = await Kernel(
            billing_agent(LedgerProvider(path=str(processes.ledger))), durability
        ).turn(**propose())
        assert proposed.interaction is not None

    if store.kind == "postgres" and point == faults.DURING_COMMIT:
        await die_inside_the_postgres_commit(store, processes, server_notices=True)
    else:
        crashed = await processes.spawn([accept()], fault={"point": point, "action": "exit"})
        assert await finish(crashed, faults.EXIT_STATUS) == []

    async with store.durability() as durability:
        await check_after_the_death(durability, processes.ledger, expected)

    [outcome] = await finish(await processes.spawn([accept()]))
    retried = outcome["result"]
    async with store.durability() as durability:
        await check_the_retry(durability, store, processes.ledger, retried, expected)
        # A third delivery, here: the stored result again, nothing runs.
        provider = LedgerProvider(path=str(processes.ledger))
        third = await Kernel(billing_agent(provider), durability).turn(**accept())
        assert third.to_dict() == dict(retried, replayed=True)
        assert provider.calls() == 0
        await reconcile_and_go_on(durability, processes.ledger, expected)


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
    try:
        async with store.durability() as durability:
            await Kernel(
                billing_agent(LedgerProvider(path=str(processes.ledger))), durability
            ).turn(**propose())
        await die_inside_the_postgres_commit(store, processes, server_notices=False)
        async with store.durability() as durability:
            await check_after_the_death(durability, processes.ledger, REPLAYED)
        [outcome] = await finish(await processes.spawn([accept()]))
        async with store.durability() as durability:
            await check_the_retry(durability, store, processes.ledger, outcome["result"], REPLAYED)
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


async def die_inside_the_postgres_commit(
    store: Store, processes: Processes, *, server_notices: bool
) -> None:
    """Kill a worker while the server holds its commit transaction open, every row of
    the turn written and ``COMMIT`` not yet done.

    A deferred trigger on ``ik_turns`` (fired at commit time, after all the
    statement's work) waits for an advisory lock this test holds, in sessions
    that opted in with ``ik_test.stall=on``. Once the worker's session waits there,
    the worker's ``DURING_COMMIT`` fault exits the process. With
    ``client_connection_check_interval`` set (``server_notices``), the server
    notices the dead client while waiting and rolls the transaction back.
    """
    stall_lock = zlib.crc32(store.schema.encode())  # this test's own advisory lock key
    store.query(STALL_COMMITS.format(lock=stall_lock))
    name = store.schema + "_victim"
    options = "-c ik_test.stall=on"
    if server_notices:
        options += " -c client_connection_check_interval=50"
    stalled = Store(
        "postgres",
        make_conninfo(store.location, application_name=name, options=options),
        store.schema,
    )
    go = str(processes.ledger) + ".die"
    with psycopg.connect(store.location, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (stall_lock,))
        crashed = await processes.spawn(
            [accept()],
            store=stalled,
            fault={"point": faults.DURING_COMMIT, "action": "exit_when", "file": go},
        )
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
        )
        await until(lambda: holder.execute(waiting, (name,)).fetchone() == (1,), crashed)
        touch(go)
        assert await finish(crashed, faults.EXIT_STATUS) == []
        if server_notices:
            gone = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            await until(lambda: holder.execute(gone, (name,)).fetchone() == (0,), None)
        holder.execute("SELECT pg_advisory_unlock(%s)", (stall_lock,))
        if not server_notices:  # the orphaned session commits once the lock is free
            gone = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            await until(lambda: holder.execute(gone, (name,)).fetchone() == (0,), None)
    store.query("DROP TRIGGER ik_test_stall ON ik_turns")


def touch(path: str) -> None:
    Path(path).touch()


async def until(condition: Any, process: asyncio.subprocess.Process | None) -> None:
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


@pytest.mark.parametrize("point", faults.POINTS)
async def test_a_turn_raising_at_a_fault_point_leaves_the_store_as_a_crash_would(
    adapter: Store | None, point: str, tmp_path: Path
) -> None:
    if adapter is None and point == faults.DURING_COMMIT:
        pytest.skip("the in-memory commit is plain assignments, with nothing in between")
    expected = EXPECTED[point]
    ledger = tmp_path / "provider.ledger"
    durability = adapter.durability() if adapter is not None else InMemoryDurability()
    async with durability:
        provider = LedgerProvider(path=str(ledger), sync=False)
        kernel = Kernel(billing_agent(provider), durability)
        await kernel.turn(**propose())
        with faults.injected(point, "raise") as fault, pytest.raises(faults.InjectedFault) as died:
            await kernel.turn(**accept())
        assert died.value.point == point and fault.fired == 1
        await check_after_the_death(durability, ledger, expected)
        retried = await kernel.turn(**accept())  # the same adapter instance
        await check_the_retry(durability, adapter, ledger, retried.to_dict(), expected)
    if adapter is not None:  # and a fresh instance agrees
        async with adapter.durability() as reopened:
            again = await Kernel(billing_agent(provider), reopened).turn(**accept())
            assert again.to_dict() == dict(retried.to_dict(), replayed=True)
            await reconcile_and_go_on(reopened, ledger, expected)


@pytest.mark.parametrize(
    "point", [faults.IN_PROVIDER_AFTER_WRITE, faults.AFTER_RECEIPT_COMPLETED, faults.BEFORE_COMMIT]
)
async def test_a_crashed_delivery_arriving_after_other_turns_keeps_one_index_entry_per_receipt(
    adapter: Store | None, point: str, tmp_path: Path
) -> None:
    """The accepting turn dies after its receipt was written; the answer arrives under a
    new delivery ID (which reuses the receipt and indexes it), the charge is proposed
    again, and then the crashed delivery arrives at last: its turn reuses the receipt too,
    and the checkpoint still indexes that receipt once."""
    provider = LedgerProvider(path=str(tmp_path / "provider.ledger"), sync=False)
    durability = adapter.durability() if adapter is not None else InMemoryDurability()
    async with durability:
        kernel = Kernel(billing_agent(provider), durability)
        await kernel.turn(**propose())
        with faults.injected(point, "raise"), pytest.raises(faults.InjectedFault):
            await kernel.turn(**accept())
        await kernel.turn(THREAD, "accept-under-a-new-id", "yes")
        await kernel.turn(THREAD, "propose-again", "charge pi_1 500")
        late = await kernel.turn(**accept())
        assert not late.replayed and late.steps[0].receipt_ids
        checkpoint = await durability.load_checkpoint(THREAD)
        assert checkpoint is not None
        assert [r.key for r in checkpoint.receipts] == [KEY]
        [receipt] = await durability.list_receipts(THREAD)
        assert checkpoint.receipts[0].status == receipt.status
    assert provider.calls() == 1


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
    another name: unarmed, a fault point is one attribute read."""
    import intention_kernel

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
