"""The crash matrix of a turn in model rounds, on SQLite and PostgreSQL: a real worker
process (``tests/rounds_worker.py``) dies (``os._exit``, no cleanup) after a recorded
model response, and a new process delivers the same turn again. The model writes down
every request it is sent, the tools every call, the provider every applied write.

A turn of three rounds (read, pay 100, final text) dies at one of three places.
At ``in_balance``, round 1 is recorded and its first step starts. At ``in_pay``,
round 2 is recorded, round 1's read ran, and the write starts before its receipt is
prepared. At ``asked_round_3``, the model is asked round 3: rounds 1 and 2 are
recorded, the read and the write done.

In each case the redelivery never asks the model for a round it answered before the
death. The write is applied once in all: run by the redelivery, or settled by its
completed receipt. The read runs again, as reads are not recorded. And the committed
turn leaves no journal rows behind.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bridge_support import run_worker
from intention_kernel.testing import faults
from proving_support import Store, make_sql_store
from rounds_worker import REFUSED

WORKER = Path(__file__).with_name("rounds_worker.py")
TURN = {"thread_id": "th-rounds", "turn_id": "turn-1", "message": "pay what I owe"}


@dataclass(frozen=True)
class Death:
    """Where the first process dies, and what it leaves behind."""

    die: str
    asked_before: list[int]  # the rounds the dead process asked, in order
    recorded: list[str]  # the journal keys it left
    tools_before: list[str]  # the tools it ran to their end
    paid_before: int  # writes the provider applied before the death
    asked_again: list[int]  # the rounds the redelivery asks
    tools_again: list[str]  # the tools the redelivery runs


DEATHS = [
    Death(
        "in_balance",
        asked_before=[1],
        recorded=["kernel.round.1"],
        tools_before=[],
        paid_before=0,
        asked_again=[2, 3],
        tools_again=["account.balance", "payments.pay"],
    ),
    Death(
        "in_pay",
        asked_before=[1, 2],
        recorded=["kernel.round.1", "kernel.round.2"],
        tools_before=["account.balance"],
        paid_before=0,
        asked_again=[3],
        tools_again=["account.balance", "payments.pay"],
    ),
    Death(
        "asked_round_3",
        asked_before=[1, 2, 3],
        recorded=["kernel.round.1", "kernel.round.2"],
        tools_before=["account.balance", "payments.pay"],
        paid_before=1,
        asked_again=[3],
        tools_again=["account.balance", "payments.pay"],
    ),
]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(
        request.param, request, tmp_path, file="rounds.db", name_sessions=True
    )


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def deliver(
    store: Store,
    files: dict[str, str],
    die: str | None,
    status: int,
    turn: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    config = {"store": store.config(), "files": files, "turn": turn or TURN, "die": die}
    return await run_worker(WORKER, config, status)


@pytest.mark.slow
@pytest.mark.parametrize("death", DEATHS, ids=[d.die for d in DEATHS])
async def test_a_redelivery_never_asks_the_model_again_for_a_recorded_round(
    store: Store, tmp_path: Path, death: Death
) -> None:
    files = {name: str(tmp_path / f"{name}.jsonl") for name in ("asks", "tools", "ledger")}
    asks, tools, ledger = (Path(files[name]) for name in ("asks", "tools", "ledger"))
    # The schema exists before the first worker: its death must not race a migration.
    async with store.durability():
        pass

    assert await deliver(store, files, death.die, faults.EXIT_STATUS) == []
    first_pid = {line["pid"] for line in lines(asks)}
    assert [line["round"] for line in lines(asks)] == death.asked_before
    assert [line["tool"] for line in lines(tools)] == death.tools_before
    assert len(lines(ledger)) == death.paid_before
    journal = store.query(
        "SELECT key FROM ik_journal WHERE thread_id = "
        + ("?" if store.kind == "sqlite" else "%s")
        + " ORDER BY key",
        TURN["thread_id"],
    )
    assert [key for (key,) in journal] == death.recorded
    assert store.query("SELECT count(*) FROM ik_turns") == [(0,)]

    [result] = await deliver(store, files, None, 0)
    again = [line for line in lines(asks) if line["pid"] not in first_pid]
    assert [line["round"] for line in again] == death.asked_again
    ran_again = [line["tool"] for line in lines(tools) if line["pid"] not in first_pid]
    assert ran_again == death.tools_again
    [paid] = lines(ledger)  # the write was applied once, in all
    assert paid["key"] == "payments.pay:charge:pi_1" and paid["attempt"] == 1
    assert result["replayed"] is False
    assert [(s["capability_id"], s["status"]) for s in result["steps"]] == [
        ("account.balance", "completed"),
        ("payments.pay", "completed"),
    ]
    assert result["reply"] == "paid: ch_pi_1_1"
    assert store.query("SELECT count(*) FROM ik_journal") == [(0,)]

    # A third delivery replays the committed turn: the model is asked nothing.
    [replayed] = await deliver(store, files, None, 0)
    assert replayed == dict(result, replayed=True)
    assert len(lines(asks)) == len(death.asked_before) + len(death.asked_again)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("first", "other"),
    [("acme", "globex"), (None, "acme"), ("acme", None)],
    ids=["tenant-vs-tenant", "none-vs-tenant", "tenant-vs-none"],
)
async def test_another_tenant_cannot_go_on_from_a_dead_tenants_rounds(
    store: Store, tmp_path: Path, first: str | None, other: str | None
) -> None:
    """The first tenant's worker dies in round 2 (rounds 1 and 2 recorded, the balance
    read) on a thread with no committed turn. Another tenant's worker delivers the same
    thread ID, turn ID and message: it is refused before the model or a tool is asked
    anything, and leaves the journal as it was. The first tenant's redelivery goes on
    from its rounds and completes; the other tenant stays refused."""
    files = {name: str(tmp_path / f"{name}.jsonl") for name in ("asks", "tools", "ledger")}
    asks, tools, ledger = (Path(files[name]) for name in ("asks", "tools", "ledger"))
    async with store.durability():
        pass
    mine, theirs = dict(TURN, tenant_id=first), dict(TURN, tenant_id=other)
    placeholder = "?" if store.kind == "sqlite" else "%s"
    journal = f"SELECT key, tenant_id FROM ik_journal WHERE thread_id = {placeholder} ORDER BY key"

    assert await deliver(store, files, "in_pay", faults.EXIT_STATUS, mine) == []
    recorded = [("kernel.round.1", first), ("kernel.round.2", first)]
    assert store.query(journal, TURN["thread_id"]) == recorded
    before = (lines(asks), lines(tools), lines(ledger))

    refused = {"refused": "TenantMismatchError"}
    assert await deliver(store, files, None, REFUSED, theirs) == [refused]
    other_turn = dict(theirs, turn_id="turn-2")
    assert await deliver(store, files, None, REFUSED, other_turn) == [refused]
    assert (lines(asks), lines(tools), lines(ledger)) == before
    assert store.query(journal, TURN["thread_id"]) == recorded
    assert store.query("SELECT count(*) FROM ik_turns") == [(0,)]

    [result] = await deliver(store, files, None, 0, mine)
    assert [line["round"] for line in lines(asks)[len(before[0]) :]] == [3]
    assert result["reply"] == "paid: ch_pi_1_1" and result["replayed"] is False
    assert len(lines(ledger)) == 1
    assert await deliver(store, files, None, REFUSED, theirs) == [refused]
    assert await deliver(store, files, None, 0, mine) == [dict(result, replayed=True)]
