"""The host's answers name their approver: the token's principal, never the body's."""

from __future__ import annotations

from typing import Any

import httpx

from host_support import asgi_client
from intention_kernel import Kernel
from intention_kernel.durability import Durability
from intention_kernel.host import Principal, create_app
from intention_kernel.testing._agents import FakeProvider, billing_agent

TOKENS = {"tok-ana": Principal("ana@acme.example", "acme")}
AUTH = {"authorization": "Bearer tok-ana"}


async def _turn(
    client: httpx.AsyncClient, turn_id: str, headers: dict[str, str] | None = None, **body: Any
) -> httpx.Response:
    """Post turn ``turn_id`` of thread ``t`` as Ana (``headers`` adds to hers)."""
    return await client.post(
        "/v1/threads/t/turns",
        json={"turn_id": turn_id, **body},
        headers={**AUTH, **(headers or {})},
    )


async def _ask(client: httpx.AsyncClient) -> httpx.Response:
    """Turn ``d1``: a charge that waits for an approver's answer."""
    return await _turn(client, "d1", message="charge pi_1 500")


async def test_the_host_records_the_tokens_principal_as_the_answers_actor(
    store: Durability,
) -> None:
    provider = FakeProvider()
    app = create_app(Kernel(billing_agent(provider), store), tokens=TOKENS)
    async with asgi_client(app) as client:
        opened = await _ask(client)
        shown = opened.json()["interaction"]
        answered = await _turn(
            client, "d2", answer={"decision": "accept", "digest": shown["digest"]}
        )
    assert answered.status_code == 200, answered.text
    assert provider.ledger == ["payments.charge:charge:pi_1"]
    # The step the answer ran names who answered, in the result the client receives.
    [step] = answered.json()["steps"]
    assert (step["status"], step["actor"]) == ("completed", "ana@acme.example")
    events = [e for e in await store.read_outbox() if e.thread_id == "t"]
    assert [e.payload.get("actor") for e in events if e.type == "interaction.resolved"] == [
        "ana@acme.example"
    ]
    assert [e.payload.get("actor") for e in events if e.type == "effect.completed"] == [
        "ana@acme.example"
    ]


async def test_the_hosts_receipts_name_the_principal_who_approved_the_write(
    store: Durability,
) -> None:
    tokens = {**TOKENS, "tok-ops": Principal("ops@acme.example", "acme", role="operator")}
    provider = FakeProvider()
    app = create_app(Kernel(billing_agent(provider), store), tokens=tokens)
    async with asgi_client(app) as client:
        await _ask(client)
        await _turn(client, "d2", answer={"decision": "accept"})
        listed = await client.get(
            "/v1/receipts?thread_id=t", headers={"authorization": "Bearer tok-ops"}
        )
    assert listed.status_code == 200, listed.text
    [receipt] = listed.json()["receipts"]
    assert (receipt["key"], receipt["status"]) == ("payments.charge:charge:pi_1", "completed")
    assert receipt["actor"] == "ana@acme.example"


async def test_the_host_refuses_an_answer_whose_actor_is_not_the_tokens_principal(
    store: Durability,
) -> None:
    provider = FakeProvider()
    app = create_app(Kernel(billing_agent(provider), store), tokens=TOKENS)
    async with asgi_client(app) as client:
        await _ask(client)
        forged = await _turn(
            client, "d2", answer={"decision": "accept", "actor": "boss@acme.example"}
        )
        same = await _turn(client, "d3", answer={"decision": "accept", "actor": "ana@acme.example"})
    assert forged.status_code == 403
    assert forged.headers["content-type"] == "application/problem+json"
    assert forged.json()["type"] == "/problems/forbidden"
    assert same.status_code == 200, same.text
    assert provider.ledger == ["payments.charge:charge:pi_1"]


async def test_a_streamed_answer_naming_another_actor_is_refused_and_runs_nothing(
    store: Durability,
) -> None:
    provider = FakeProvider()
    app = create_app(Kernel(billing_agent(provider), store), tokens=TOKENS)
    async with asgi_client(app) as client:
        await _ask(client)
        forged = await _turn(
            client,
            "d2",
            {"accept": "text/event-stream"},
            answer={"decision": "accept", "actor": "boss@acme.example"},
        )
    assert forged.status_code == 403
    assert forged.json()["type"] == "/problems/forbidden"
    assert provider.calls() == 0
    checkpoint = await store.load_checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 1 and checkpoint.interaction


async def test_the_thread_view_gives_the_held_inputs_schema_for_an_edit(
    store: Durability,
) -> None:
    """The console validates an edit against it before sending: it is the capability's
    own input schema, documented as such in the OpenAPI document."""
    kernel = Kernel(billing_agent(FakeProvider()), store)
    async with asgi_client(create_app(kernel)) as client:
        await client.post("/v1/threads/t/turns", json={"turn_id": "d1", "message": "charge pi_1 5"})
        thread = (await client.get("/v1/threads/t")).json()
        await client.post("/v1/threads/t/turns", json={"turn_id": "d2", "message": "refund pi_1 5"})
        refund = (await client.get("/v1/threads/t")).json()
        document = (await client.get("/openapi.json")).json()
    [charge] = [c for c in kernel.agent.capabilities if c.id == "payments.charge"]
    assert thread["interaction"]["capability_id"] == "payments.charge"
    assert thread["interaction"]["input_schema"] == charge.input_schema
    assert thread["interaction"]["input"] == {"payment_intent_id": "pi_1", "amount": 5}
    # A capability that confirms on its own is not edited in an answer: no schema.
    assert refund["interaction"]["kind"] == "capability"
    assert refund["interaction"]["input_schema"] is None
    schemas = document["components"]["schemas"]
    view = schemas["ThreadView"]["properties"]["interaction"]["anyOf"][0]["$ref"]
    shown = schemas[view.rsplit("/", 1)[1]]
    assert "input_schema" in shown["properties"]
    assert "JSON schema of the capability's input" in shown["description"]


async def test_a_rejected_step_names_who_rejected_it_and_other_steps_name_no_one(
    store: Durability,
) -> None:
    provider = FakeProvider()
    app = create_app(Kernel(billing_agent(provider), store), tokens=TOKENS)
    async with asgi_client(app) as client:
        opened = await _ask(client)
        rejected = await _turn(client, "d2", message="balance 7", answer={"decision": "reject"})
    assert [s["actor"] for s in opened.json()["steps"]] == [None]  # proposed: no answer yet
    steps = [(s["capability_id"], s["status"], s["actor"]) for s in rejected.json()["steps"]]
    assert steps == [
        ("payments.charge", "rejected", "ana@acme.example"),
        ("billing.balance", "completed", None),  # the message's own intent: no approver
    ]
    assert provider.ledger == []


async def test_the_openapi_document_says_each_steps_round_and_who_answered(
    store: Durability,
) -> None:
    app = create_app(Kernel(billing_agent(FakeProvider()), store))
    async with asgi_client(app) as client:
        document = (await client.get("/openapi.json")).json()
    step = document["components"]["schemas"]["StepResult"]
    assert step["properties"]["round"] == {"default": 1, "title": "Round", "type": "integer"}
    assert {"type": "string"} in step["properties"]["actor"]["anyOf"]
    assert "``round`` is the round of the turn the step ran in" in step["description"]
    assert "``actor`` is who answered" in step["description"]
