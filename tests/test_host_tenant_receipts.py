"""Threads and receipts over HTTP follow the thread's owner, also before its first commit
and while its first turn runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from host_support import asgi_client
from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    Fact,
    Intent,
    Interpretation,
    Receipt,
    TurnScope,
    capability,
)
from intention_kernel._kernel import Kernel
from intention_kernel._turns import TurnCommit
from intention_kernel.durability import TurnTransaction
from intention_kernel.durability.abc import RecordedDurability, StoredThread
from intention_kernel.host import Principal, create_app
from intention_kernel.testing import InMemoryDurability, ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent

TOKENS = {
    "tok-acme": Principal("alice@acme.example", "acme", "operator"),
    "tok-globex": Principal("gina@globex.example", "globex", "operator"),
    "tok-ops": Principal("oscar@example.com", None, "operator"),
}


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
        body = {"thread_id": "acct-1", "key": mine[0]["key"], "applied": False, "note": "n"}
        assert (await globex.post("/v1/receipts/resolve", json=body)).status_code == 404
        assert (await ops.post("/v1/receipts/resolve", json=body)).status_code == 404
        # Another tenant is never offered the thread's keys.
        bare = {**body, "key": mine[0]["key"].partition(":")[2]}
        for other in (globex, ops):
            hidden = await other.post("/v1/receipts/resolve", json=bare)
            assert (
                hidden.json()["detail"] == f"no receipt for key {bare['key']!r} on thread 'acct-1'"
            )
        offered = await acme.post("/v1/receipts/resolve", json=bare)
        assert offered.json()["detail"].endswith(f"; did you mean {mine[0]['key']!r}?")


# -- a first turn in flight ------------------------------------------------------------------
# While a tenant's first turn runs, its thread has no owner yet. Each test holds such a
# turn inside its capability, before anything durable is written, and sends a request
# of a caller without a tenant meanwhile; the turn goes on only once that request
# reached the store. An ownership decision taken before the read or the resolution
# would then be stale by the time the read or the resolution happens.

THREAD = "acct-1"
CHARGE_KEY = "payments.charge:charge:pi_1"


@dataclass
class Gate:
    """Holds the capability of a turn until released."""

    entered: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    async def hold(self) -> None:
        self.entered.set()
        await self.released.wait()


def first_write_agent(gate: Gate, provider_calls: list[str]) -> Agent:
    """A write its capability runs in the proposing turn (``"capability"`` mode, no
    question asked), whose provider answer is lost, and a read; both held by ``gate``."""

    @capability("payments.charge", effect="write", confirmation="capability")
    async def charge(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        """Charge pi_1 at once."""
        await gate.hold()

        def provider(authority: EffectAuthority) -> Any:
            provider_calls.append(authority.key)
            raise TimeoutError("the provider's answer was lost")

        effect = await ctx.run_effect("charge:pi_1", provider)
        return CapabilityResult(value=effect.value)

    @capability("billing.balance")
    async def balance(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        """Amount due."""
        await gate.hold()
        return CapabilityResult(value=42, facts=[Fact("balance", 42)], reply="You owe 42.")

    interpreter = ScriptedInterpreter(
        {
            "charge": Interpretation([Intent("payments.charge", {})]),
            "balance": Interpretation([Intent("billing.balance", {})]),
        }
    )
    return Agent(
        name="first-write", version="1", capabilities=[charge, balance], interpreter=interpreter
    )


async def test_a_tenantless_token_cannot_resolve_a_receipt_of_a_first_turn_in_flight(
    store: RecordedDurability, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, provider_calls = Gate(), list[str]()
    kernel = Kernel(first_write_agent(gate, provider_calls), store)
    reached = asyncio.Event()
    resolve = store.resolve_receipt

    async def signalled(*args: Any, **kwargs: Any) -> Receipt:
        reached.set()
        return await resolve(*args, **kwargs)

    monkeypatch.setattr(store, "resolve_receipt", signalled)
    app = create_app(kernel, tokens=TOKENS)
    async with asgi_client(app, "tok-acme") as acme, asgi_client(app, "tok-ops") as ops:
        first = asyncio.create_task(
            acme.post(f"/v1/threads/{THREAD}/turns", json={"turn_id": "a1", "message": "charge"})
        )
        await gate.entered.wait()  # acme's first turn holds the thread; nothing is written
        body = {"thread_id": THREAD, "key": CHARGE_KEY, "applied": False, "note": "no charge"}
        resolving = asyncio.create_task(ops.post("/v1/receipts/resolve", json=body))
        await reached.wait()  # the resolution reached the store while the turn runs
        gate.released.set()
        turn = await first
        assert turn.status_code == 200, turn.text
        assert turn.json()["steps"][0]["status"] == "uncertain"
        refused = await resolving
        assert (refused.status_code, refused.json()["type"]) == (404, "/problems/not-found")
        assert refused.json()["detail"] == f"no receipt for key {CHARGE_KEY!r} on thread {THREAD!r}"
        retried = await acme.post(
            f"/v1/threads/{THREAD}/turns", json={"turn_id": "a2", "message": "charge"}
        )
        assert retried.json()["steps"][0]["status"] == "uncertain"
    [receipt] = await store.list_receipts(thread_id=THREAD)
    assert (receipt.status, receipt.resolution, receipt.tenant_id) == ("uncertain", None, "acme")
    assert provider_calls == [CHARGE_KEY], "the uncertain charge was never retried"
    assert [e.type for e in await store.read_outbox(THREAD)].count("receipt.resolved") == 0


async def test_a_tenantless_token_cannot_read_a_first_turn_committed_while_it_looked(
    store: RecordedDurability, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, provider_calls = Gate(), list[str]()
    kernel = Kernel(first_write_agent(gate, provider_calls), store)
    recorder = await store.recorder()
    read_thread = recorder.read_thread
    looked, committed = asyncio.Event(), asyncio.Event()

    async def read_then_wait(thread_id: str) -> StoredThread | None:
        # What the request read is taken before the turn commits; it goes on after.
        stored = await read_thread(thread_id)
        looked.set()
        await committed.wait()
        return stored

    monkeypatch.setattr(recorder, "read_thread", read_then_wait)
    app = create_app(kernel, tokens=TOKENS)
    async with asgi_client(app, "tok-acme") as acme, asgi_client(app, "tok-ops") as ops:
        first = asyncio.create_task(
            acme.post(f"/v1/threads/{THREAD}/turns", json={"turn_id": "a1", "message": "balance"})
        )
        await gate.entered.wait()
        reading = asyncio.create_task(ops.get(f"/v1/threads/{THREAD}"))
        await looked.wait()
        gate.released.set()
        assert (await first).json()["reply"] == "You owe 42."
        committed.set()
        read = await reading
        assert (read.status_code, read.json()["detail"]) == (404, f"no thread {THREAD!r}")
        assert (await acme.get(f"/v1/threads/{THREAD}")).json()["version"] == 1
    assert provider_calls == []


# -- a first turn that recorded model rounds and failed --------------------------------------


@pytest.mark.parametrize("other", ["tok-globex", "tok-ops"])
async def test_a_failed_first_turns_recorded_rounds_are_not_another_tenants(
    store: RecordedDurability, other: str
) -> None:
    """Issue 31, N1 over HTTP. Acme's first turn on a thread records round 1 (its
    balance read) and fails in round 2: 502. Another token (another tenant, or none)
    posting the same thread ID, turn ID and message gets 404, as JSON and as SSE, and
    learns nothing; acme's redelivery goes on from round 1 and answers 200."""
    asked: list[int] = []
    failed: list[bool] = []

    def script(request: Any) -> Interpretation:
        asked.append(len(request.rounds) + 1)
        if not request.rounds:
            return Interpretation([Intent("billing.balance", {"due": 70})])
        if not failed:
            failed.append(True)
            raise RuntimeError("the model's connection dropped")
        [step] = request.rounds[0].steps
        return Interpretation(reply=f"acme owes {step.value['due']}")

    interpreter = ScriptedInterpreter(script, multi_round=True)
    kernel = Kernel(billing_agent(FakeProvider(), interpreter=interpreter), store)
    app = create_app(kernel, tokens=TOKENS)
    turn = {"turn_id": "d1", "message": "what do I owe?"}
    async with asgi_client(app, "tok-acme") as acme, asgi_client(app, other) as stranger:
        first = await acme.post("/v1/threads/acct-1/turns", json=turn)
        assert first.status_code == 502, first.text
        assert asked == [1, 2]
        refused = await stranger.post("/v1/threads/acct-1/turns", json=turn)
        streamed = await stranger.post(
            "/v1/threads/acct-1/turns", json=turn, headers={"accept": "text/event-stream"}
        )
        for answer in (refused, streamed):
            assert answer.status_code == 404, answer.text
            assert answer.json()["type"] == "/problems/not-found"
            assert "70" not in answer.text
        assert asked == [1, 2]  # the stranger's deliveries asked the model nothing
        mine = await acme.post("/v1/threads/acct-1/turns", json=turn)
        assert mine.status_code == 200, mine.text
        assert mine.json()["reply"] == "acme owes 70" and asked == [1, 2, 2]
        assert (await stranger.post("/v1/threads/acct-1/turns", json=turn)).status_code == 404
