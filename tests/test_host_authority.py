"""The host passes the token's principal to the kernel (issue 31, N6): a "yes" in a
message names its sender, and the capability's approver policy judges it."""

from __future__ import annotations

from host_support import asgi_client
from intention_kernel import Kernel
from intention_kernel.durability import Durability
from intention_kernel.host import Principal, create_app
from intention_kernel.testing._agents import FakeProvider, billing_agent

TOKENS = {
    "tok-ana": Principal("ana@acme.example", "acme"),
    "tok-ops": Principal("ops@acme.example", "acme", "operator"),
}


async def test_a_yes_in_a_message_through_the_host_names_the_tokens_principal(
    store: Durability,
) -> None:
    provider = FakeProvider()
    app = create_app(Kernel(billing_agent(provider), store), tokens=TOKENS)
    async with asgi_client(app, token="tok-ana") as ana, asgi_client(app, token="tok-ops") as ops:
        opened = await ana.post(
            "/v1/threads/t/turns", json={"turn_id": "1", "message": "charge pi_1 500"}
        )
        assert opened.status_code == 200, opened.text
        answered = await ops.post("/v1/threads/t/turns", json={"turn_id": "2", "message": "yes"})
        assert answered.status_code == 200, answered.text
        [step] = answered.json()["steps"]
        assert (step["status"], step["actor"]) == ("completed", "ops@acme.example")
        [receipt] = (await ops.get("/v1/receipts?thread_id=t")).json()["receipts"]
    assert receipt["actor"] == "ops@acme.example"
    assert receipt["capability_id"] == "payments.charge"
    assert receipt["input"] == {"payment_intent_id": "pi_1", "amount": 500}
    assert receipt["approved_by"] == ["ops@acme.example"]
    events = [e for e in await store.read_outbox() if e.thread_id == "t"]
    for type in ("interaction.resolved", "effect.completed"):
        assert [e.payload.get("actor") for e in events if e.type == type] == ["ops@acme.example"], (
            type
        )


async def test_the_host_refuses_a_users_yes_to_an_operator_only_write(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, approvers="operator", self_approval=False), store)
    app = create_app(kernel, tokens=TOKENS)
    async with asgi_client(app, token="tok-ana") as ana, asgi_client(app, token="tok-ops") as ops:
        opened = await ana.post(
            "/v1/threads/t/turns", json={"turn_id": "1", "message": "charge pi_1 500"}
        )
        shown = opened.json()["interaction"]
        expected = "a principal with the role 'operator', other than the person who proposed it"
        assert shown["who_may_answer"] == expected
        assert shown["proposed_by"] == "ana@acme.example"
        for turn_id, body in (("2", {"message": "yes"}), ("3", {"answer": "accept"})):
            refused = await ana.post("/v1/threads/t/turns", json={"turn_id": turn_id, **body})
            assert refused.status_code == 200, refused.text
            assert refused.json()["interaction"]["id"] == shown["id"]
            assert expected in refused.json()["reply"]
        assert provider.calls() == 0
        queue = (await ops.get("/v1/interactions")).json()["interactions"]
        assert [item["interaction"]["who_may_answer"] for item in queue] == [expected]
        done = await ops.post("/v1/threads/t/turns", json={"turn_id": "4", "message": "yes"})
        assert done.json()["steps"][0]["status"] == "completed"
    assert provider.calls() == 1


async def test_the_queue_shows_who_may_answer_under_the_current_policy() -> None:
    from intention_kernel.testing import InMemoryDurability

    store = InMemoryDurability()
    await Kernel(billing_agent(FakeProvider()), store).turn(
        "t", "1", "charge pi_1 500", principal=TOKENS["tok-ana"]
    )
    redeployed = Kernel(billing_agent(FakeProvider(), approvers={"operator"}), store)
    async with asgi_client(create_app(redeployed, tokens=TOKENS), token="tok-ops") as ops:
        [item] = (await ops.get("/v1/interactions")).json()["interactions"]
    assert item["interaction"]["who_may_answer"] == "a principal with the role 'operator'"
    stored = await store.load_checkpoint("t")
    assert stored is not None and stored.interaction is not None
    assert stored.interaction.who_may_answer is None  # the default policy stores nothing
