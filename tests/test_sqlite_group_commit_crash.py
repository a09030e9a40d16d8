"""The crash matrix's concurrent mode, with many turns in flight over one SQLite adapter.

A real process is killed with a group commit in flight. Afterwards:

- Every turn it acknowledged is on disk: a group is acknowledged only after its
  ``COMMIT``. It acknowledged nothing that is not.
- Every provider call it made has its receipt on disk. ``prepared`` was durable, in
  some group, before the effect ran.
- A new process delivers every turn again and finishes them all. It makes no second
  provider call for any key, and commits no turn twice.

The worker (``tests/group_crash_worker.py``) dies with ``os._exit`` on the adapter's
worker thread. It dies at a group's ``before_commit`` point: every write of the group
ran, ``COMMIT`` was not sent, and the group's writes are lost. Or it dies at
``after_commit``: ``COMMIT`` returned and no caller was told, so the writes are on
disk and acknowledged to nobody.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import Kernel, KernelError
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.testing import faults
from proving_support import LedgerProvider, ledger_keys, pay_key, process_env, proving_agent

WORKER = Path(__file__).with_name("group_crash_worker.py")
CLIENTS, TURNS = 16, 4


async def _run_worker(config: dict[str, Any]) -> int:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        json.dumps(config),
        env=process_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    if process.returncode not in (0, faults.EXIT_STATUS):
        raise AssertionError(err.decode())
    return process.returncode


def _query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(sql).fetchall()


async def _killed(tmp_path: Path, **options: Any) -> set[tuple[str, str]]:
    """Run the worker with ``options`` until it is killed; the turns it committed.

    What it acknowledged is among them, and each call it made has its receipt:
    ``prepared`` was durable, in some group, before the effect ran.
    """
    db, ledger, acks = tmp_path / "k.db", tmp_path / "ledger", tmp_path / "acks"
    config = {
        "db": str(db),
        "ledger": str(ledger),
        "acks": str(acks),
        "clients": CLIENTS,
        "turns": TURNS,
        **options,
    }
    assert await _run_worker(config) == faults.EXIT_STATUS  # killed inside a group
    acknowledged = (
        {(a["thread_id"], a["turn_id"]) for a in map(json.loads, acks.read_text().splitlines())}
        if acks.exists()
        else set()
    )
    committed = set(_query(db, "SELECT thread_id, turn_id FROM ik_turns"))
    assert acknowledged <= committed  # no acknowledged turn lost
    receipts = {key for (key,) in _query(db, "SELECT key FROM ik_receipts")}
    called = ledger_keys(ledger)
    assert set(called) <= receipts
    assert all(n == 1 for n in Counter(called).values())
    return committed


async def _deliver_again(
    tmp_path: Path, committed: set[tuple[str, str]], charged: frozenset[str] = frozenset()
) -> None:
    """Deliver every client's turn again, in a new adapter.

    Each turn finishes once, and no key is charged twice. A turn whose provider call
    lost its completed receipt fails closed (uncertain), by the effect rules, instead
    of charging again. ``charged`` are keys charged outside the clients' turns.
    """
    db, ledger = tmp_path / "k.db", tmp_path / "ledger"
    provider = LedgerProvider(path=str(ledger))
    async with SQLiteDurability(db) as store:
        kernel = Kernel(proving_agent(provider), store)
        for k in range(CLIENTS):
            for i in range(TURNS):
                try:
                    result = await kernel.turn(f"c{k}", str(i), f"pay pi_c{k}_{i} 100")
                except KernelError as exc:  # pragma: no cover - shown if it happens
                    raise AssertionError(f"c{k}/{i}: {exc!r}") from exc
                assert result.replayed == ((f"c{k}", str(i)) in committed)
    calls = Counter(ledger_keys(ledger))
    assert all(n == 1 for n in calls.values()), calls
    keys = {pay_key(f"pi_c{k}_{i}") for k in range(CLIENTS) for i in range(TURNS)}
    assert set(calls) <= keys | charged
    rows = _query(db, "SELECT thread_id, turn_id FROM ik_turns")
    assert len(rows) == len(set(rows)) == CLIENTS * TURNS


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
async def test_a_process_killed_with_a_group_in_flight_loses_no_acknowledged_turn(
    tmp_path: Path, point: str, group: int
) -> None:
    committed = await _killed(tmp_path, kill={"point": point, "group": group})
    assert len(committed) < CLIENTS * TURNS  # the kill came before the end
    await _deliver_again(tmp_path, committed)


@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
async def test_a_process_killed_in_a_groups_careful_run_loses_no_acknowledged_turn(
    tmp_path: Path, point: str
) -> None:
    """A fenced turn's commit fails a group's first transaction, which rolls back; the
    group's other writes run again, carefully. The process dies in that second
    transaction, before or after its ``COMMIT``. Afterwards, as for any group: what was
    acknowledged is on disk, the fenced turn's rows are not, every call has its receipt,
    and delivering every turn again charges no key twice."""
    kill = {"point": point, "group": 1, "careful": True}
    committed = await _killed(tmp_path, doomed=True, kill=kill)
    assert not {t for t in committed if t[0] == "doomed"}  # its rows rolled back each time
    assert not _query(tmp_path / "k.db", "SELECT 1 FROM ik_messages WHERE thread_id = 'doomed'")
    doomed = frozenset(pay_key(f"pi_doomed_{i}") for i in range(3 * TURNS))
    await _deliver_again(tmp_path, committed, doomed)
