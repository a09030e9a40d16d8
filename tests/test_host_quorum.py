"""A quorum through the host: each token's principal is one approver."""

from __future__ import annotations

from host_support import asgi_client
from intention_kernel import Kernel
from intention_kernel.durability import Durability
from intention_kernel.host import Principal, create_app
from intention_kernel.testing._agents import FakeProvider, billing_agent

TOKENS = {
    "tok-ana": Principal("ana@acme.example", "acme"),
    "tok-bob": Principal("bob@acme.example", "acme", "operator"),
}
ANA = {"authorization": "Bearer tok-ana"}
BOB = {"authorization": "Bearer tok-bob"}


async def test_two_tokens_are_two_approvers(store: Durability) -> None:
    provider = FakeProvider()
    app = create_app(Kernel(billing_agent(provider, approvals=2), store), tokens=TOKENS)
    async with asgi_client(app) as client:
        opened = await client.post(
            "/v1/threads/t/turns",
            json={"turn_id": "d1", "message": "charge pi_1 500"},
            headers=ANA,
        )
        shown = opened.json()["interaction"]
        assert (shown["approvals"], shown["approved_by"]) == (2, [])
        answer = {"decision": "accept", "digest": shown["digest"]}
        first = await client.post(
            "/v1/threads/t/turns", json={"turn_id": "d2", "answer": answer}, headers=ANA
        )
        # The same token again is the same person: it does not count twice.
        again = await client.post(
            "/v1/threads/t/turns", json={"turn_id": "d3", "answer": answer}, headers=ANA
        )
        thread = await client.get("/v1/threads/t", headers=ANA)
        queue = await client.get("/v1/interactions", headers=BOB)
        assert provider.calls() == 0
        second = await client.post(
            "/v1/threads/t/turns", json={"turn_id": "d4", "answer": answer}, headers=BOB
        )
        schema = (await client.get("/openapi.json")).json()["components"]["schemas"]
    for response in (first, again, thread, queue, second):
        assert response.status_code == 200, response.text
    assert first.json()["interaction"]["approved_by"] == ["ana@acme.example"]
    assert again.json()["interaction"]["approved_by"] == ["ana@acme.example"]
    assert "already approved" in again.json()["steps"][0]["error"]
    assert thread.json()["interaction"]["approved_by"] == ["ana@acme.example"]
    [pending] = queue.json()["interactions"]
    assert pending["interaction"]["approved_by"] == ["ana@acme.example"]
    assert second.json()["steps"][0]["status"] == "completed"
    assert provider.ledger == ["payments.charge:charge:pi_1"]
    events = [e for e in await store.read_outbox() if e.thread_id == "t"]
    assert [e.payload["actor"] for e in events if e.type == "interaction.approved"] == [
        "ana@acme.example"
    ]
    [resolved] = [e.payload for e in events if e.type == "interaction.resolved"]
    assert resolved["approved_by"] == ["ana@acme.example", "bob@acme.example"]
    properties = schema["Interaction"]["properties"]
    assert properties["approved_by"]["type"] == "array"
    assert properties["approved_by"]["items"] == {"type": "string"}
    assert properties["approvals"]["type"] == "integer"
