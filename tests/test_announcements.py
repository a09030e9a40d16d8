"""How the SQL adapters record that an applied write was announced.

The rule itself (each applied write announced exactly once, by the first committed turn
that uses its completed receipt) is in the conformance suite and the crash matrix. This
is where it is written. A turn may have completed the receipt under its own turn ID.
That turn lists the key in its turn row and leaves the receipt row alone. This saves
one statement and one page per effect. A turn may announce a receipt completed under
another turn ID, one that never committed. That turn marks the receipt row itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import Kernel
from intention_kernel.testing import faults
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import Store, make_sql_store


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path)


def stored(store: Store) -> tuple[dict[str, bool], dict[str, list[str] | None]]:
    """Each receipt's own mark (by payment), and each turn's announced keys."""
    marks = {
        key.rsplit(":", 1)[1]: bool(mark)
        for key, mark in store.query("SELECT key, announced FROM ik_receipts")
    }
    turns: dict[str, Any] = dict(store.query("SELECT turn_id, announced FROM ik_turns"))
    if store.kind == "sqlite":
        turns = {t: None if a is None else json.loads(a) for t, a in turns.items()}
    return marks, turns


async def test_a_turn_announces_in_its_own_row_what_its_turn_id_completed(store: Store) -> None:
    provider = FakeProvider()
    pi_1, pi_2 = "payments.charge:charge:pi_1", "payments.charge:charge:pi_2"
    async with store.durability() as durability:
        kernel = Kernel(billing_agent(provider), durability)
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", "yes")  # completes pi_1 and commits
        await kernel.turn("t", "3", "charge pi_2 500")
        with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
            await kernel.turn("t", "4", "yes")  # completes pi_2, never commits
        await kernel.turn("t", "5", "yes")  # uses pi_2's completed receipt, announces it
        receipts = {r.key: r.announced for r in await durability.list_receipts("t")}

    assert receipts == {pi_1: True, pi_2: True}
    marks, turns = stored(store)
    # pi_1: turn 2 completed it and its row says so; the receipt row was not written again.
    # pi_2: completed under turn ID 4, which never committed, so turn 5 marked its row.
    assert marks == {"pi_1": False, "pi_2": True}
    assert turns == {"1": None, "2": [pi_1], "3": None, "5": [pi_2]}
    assert provider.calls() == 2
