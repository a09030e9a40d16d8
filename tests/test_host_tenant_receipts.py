"""Receipts over HTTP follow the thread's owner, also before its first commit."""

from __future__ import annotations

import pytest

from host_support import asgi_client
from intention_kernel import TurnScope
from intention_kernel.durability import TurnTransaction
from intention_kernel.host import create_app
from intention_kernel.kernel import Kernel
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing.agents import FakeProvider, billing_agent
from intention_kernel.turns import TurnCommit

TOKENS = {"tok-acme": "acme", "tok-globex": "globex", "tok-ops": None}


async def test_receipts_of_a_crashed_first_turn_are_its_tenants_only() -> None:
    durability = InMemoryDurability()
    kernel = Kernel(billing_agent(FakeProvider()), durability)

    async def crashes(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("payments.charge:charge:pi_1", lambda a: {"id": "ch_1"}, step_id="s")
        raise RuntimeError("crashed before its commit")

    with pytest.raises(RuntimeError):
        await durability.with_turn(TurnScope("acct-1", "d1", tenant_id="acme"), crashes)
    await kernel.turn("acct-2", "d1", "charge pi_2 5", tenant_id="globex")
    await kernel.turn("acct-2", "d2", "yes", tenant_id="globex")

    app = create_app(kernel, tokens=TOKENS)
    async with (
        asgi_client(app, "tok-acme") as acme,
        asgi_client(app, "tok-globex") as globex,
        asgi_client(app, "tok-ops") as ops,
    ):
        mine = (await acme.get("/v1/receipts")).json()["receipts"]
        assert [(r["thread_id"], r["status"]) for r in mine] == [("acct-1", "completed")]
        theirs = (await globex.get("/v1/receipts")).json()["receipts"]
        assert [r["thread_id"] for r in theirs] == ["acct-2"]
        assert (await globex.get("/v1/receipts?thread_id=acct-1")).json() == {"receipts": []}
        assert (await ops.get("/v1/receipts")).json() == {"receipts": []}
        body = {"thread_id": "acct-1", "key": mine[0]["key"], "applied": False}
        assert (await globex.post("/v1/receipts/resolve", json=body)).status_code == 404
        assert (await ops.post("/v1/receipts/resolve", json=body)).status_code == 404
