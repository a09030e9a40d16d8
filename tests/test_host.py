"""The HTTP host's endpoints, through httpx against the ASGI app (no socket)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from host_support import asgi_client
from intention_kernel import Kernel, TurnResult
from intention_kernel.host import create_app
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing._agents import FakeProvider, billing_agent

PROBLEM = "application/problem+json"


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
def kernel(provider: FakeProvider) -> Kernel:
    return Kernel(billing_agent(provider), InMemoryDurability(), max_message_chars=200)


@pytest.fixture
async def client(kernel: Kernel) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(create_app(kernel)) as client:
        yield client


async def turn(
    client: httpx.AsyncClient, thread: str, turn_id: str, **body: object
) -> dict[str, Any]:
    response = await client.post(f"/v1/threads/{thread}/turns", json={"turn_id": turn_id, **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


# -- turns -----------------------------------------------------------------------------------


async def test_a_turn_answers_200_with_the_turn_result_json(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/threads/t1/turns", json={"turn_id": "d1", "message": "balance"}
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["idempotency-replayed"] == "false"
    result = TurnResult.from_dict(response.json())
    assert (result.thread_id, result.turn_id, result.replayed) == ("t1", "d1", False)
    assert result.reply == "You owe 4200."
    assert result.to_dict() == response.json()


async def test_a_retried_delivery_returns_the_stored_result_and_charges_once(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    await turn(client, "t1", "d1", message="charge pi_1 500")
    first = await turn(client, "t1", "d2", answer="accept")
    retry = await client.post("/v1/threads/t1/turns", json={"turn_id": "d2", "answer": "accept"})
    assert retry.status_code == 200
    assert retry.headers["idempotency-replayed"] == "true"
    assert retry.json() == {**first, "replayed": True}
    assert provider.calls() == 1


async def test_the_turn_id_may_come_from_the_idempotency_key_header(
    client: httpx.AsyncClient,
) -> None:
    headers = {"Idempotency-Key": "delivery-7"}
    response = await client.post(
        "/v1/threads/t1/turns", json={"message": "balance"}, headers=headers
    )
    assert response.json()["turn_id"] == "delivery-7"
    same = {"turn_id": "delivery-7", "message": "balance"}
    again = await client.post("/v1/threads/t1/turns", json=same, headers=headers)
    assert again.headers["idempotency-replayed"] == "true"


async def test_a_turn_id_in_body_and_header_that_differ_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/threads/t1/turns",
        json={"turn_id": "a", "message": "balance"},
        headers={"Idempotency-Key": "b"},
    )
    assert response.status_code == 400
    assert response.json()["type"] == "/problems/malformed-request"


async def test_a_turn_without_a_turn_id_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/threads/t1/turns", json={"message": "balance"})
    assert response.status_code == 422
    assert response.headers["content-type"] == PROBLEM
    assert "Idempotency-Key" in response.json()["detail"]


async def test_a_structured_answer_runs_the_confirmation_it_names(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    proposed = await turn(client, "t1", "d1", message="charge pi_1 500")
    interaction = proposed["interaction"]
    assert interaction["kind"] == "confirmation"
    assert interaction["input"] == {"payment_intent_id": "pi_1", "amount": 500}
    stale = {"interaction_id": "ix_other", "decision": "accept"}
    refused = await turn(client, "t1", "d2", answer=stale)
    assert refused["interaction"]["id"] == interaction["id"]
    assert provider.calls() == 0
    accepted = await turn(
        client, "t1", "d3", answer={"interaction_id": interaction["id"], "decision": "accept"}
    )
    assert [(s["capability_id"], s["status"]) for s in accepted["steps"]] == [
        ("payments.charge", "completed")
    ]
    assert accepted["interaction"] is None
    assert provider.calls() == 1


async def test_a_turn_id_reused_for_another_request_is_409(client: httpx.AsyncClient) -> None:
    await turn(client, "t1", "d1", message="balance")
    response = await client.post("/v1/threads/t1/turns", json={"turn_id": "d1", "message": "peek"})
    assert response.status_code == 409
    problem = response.json()
    assert problem["type"] == "/problems/turn-conflict"
    assert (problem["thread_id"], problem["turn_id"]) == ("t1", "d1")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"turn_id": "d1"}, None),
        ({"turn_id": "d1", "message": 42}, "message"),
        ({"turn_id": "d1", "message": "hi", "colour": "red"}, "colour"),
        ({"turn_id": "d1", "answer": "maybe"}, "answer"),
        ({"turn_id": "", "message": "hi"}, "turn_id"),
        ({"turn_id": "d1", "message": "x" * 201}, None),
    ],
)
async def test_a_request_the_schema_or_the_kernel_refuses_is_422(
    client: httpx.AsyncClient, body: dict[str, Any], field: str | None
) -> None:
    response = await client.post("/v1/threads/t1/turns", json=body)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"] == "/problems/invalid-request"
    if field is not None:
        assert field in problem["detail"]


async def test_a_body_that_is_not_json_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/threads/t1/turns", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["type"] == "/problems/malformed-request"


async def test_a_body_over_the_limit_is_413(client: httpx.AsyncClient) -> None:
    body = b'{"message": "' + b"x" * (1 << 20) + b'"}'
    response = await client.post(
        "/v1/threads/t1/turns", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["type"] == "/problems/payload-too-large"


async def test_thread_ids_may_contain_slashes(client: httpx.AsyncClient) -> None:
    await turn(client, "org%2Facct-1", "d1", message="balance")
    thread = (await client.get("/v1/threads/org%2Facct-1")).json()
    assert thread["thread_id"] == "org/acct-1"


# -- threads ---------------------------------------------------------------------------------


async def test_a_thread_shows_messages_facts_with_evidence_interaction_and_agenda(
    client: httpx.AsyncClient,
) -> None:
    await turn(client, "t1", "d1", message="balance 900")
    proposed = await turn(client, "t1", "d2", message="charge pi_1 500")
    response = await client.get("/v1/threads/t1")
    assert response.status_code == 200
    thread = response.json()
    assert thread["version"] == 2
    assert thread["compatible"] is True
    assert [m["content"] for m in thread["messages"]] == [
        "balance 900",
        "You owe 900.",
        "charge pi_1 500",
        "Charge 500 to pi_1?",
    ]
    [fact] = thread["facts"]
    assert fact["key"] == "balance"
    assert fact["value"] == 900
    assert fact["evidence"]["capability_id"] == "billing.balance"
    assert fact["evidence"]["turn_id"] == "d1"
    # The thread view adds the held input's schema (for an edit) to the interaction.
    shown = dict(thread["interaction"])
    assert shown.pop("input_schema")["required"] == ["payment_intent_id", "amount"]
    assert shown == proposed["interaction"]
    [item] = thread["agenda"]
    assert item["capability_id"] == "payments.charge"
    assert item["interaction_id"] == proposed["interaction"]["id"]


async def test_an_unknown_thread_is_404(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/threads/nobody")
    assert response.status_code == 404
    assert response.json() == {
        "type": "/problems/not-found",
        "title": "Not found",
        "status": 404,
        "detail": "no thread 'nobody'",
        "thread_id": "nobody",
    }


# -- receipts --------------------------------------------------------------------------------


async def uncertain_charge(client: httpx.AsyncClient, provider: FakeProvider, thread: str) -> str:
    provider.behaviour["pi_9"] = "lost_response"
    await turn(client, thread, "p1", message="charge pi_9 700")
    result = await turn(client, thread, "p2", answer="accept")
    assert result["steps"][0]["status"] == "uncertain"
    return "payments.charge:charge:pi_9"


async def test_receipts_are_listed_by_thread_and_status(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    key = await uncertain_charge(client, provider, "t1")
    await turn(client, "t2", "d1", message="charge pi_2 100")
    await turn(client, "t2", "d2", answer="accept")
    everything = (await client.get("/v1/receipts")).json()["receipts"]
    assert {(r["thread_id"], r["status"]) for r in everything} == {
        ("t1", "uncertain"),
        ("t2", "completed"),
    }
    uncertain = await client.get("/v1/receipts", params={"status": "uncertain"})
    assert [r["key"] for r in uncertain.json()["receipts"]] == [key]
    of_t2 = await client.get("/v1/receipts", params={"thread_id": "t2"})
    assert [r["thread_id"] for r in of_t2.json()["receipts"]] == ["t2"]
    bad = await client.get("/v1/receipts", params={"status": "lost"})
    assert bad.status_code == 422


async def test_resolving_an_uncertain_receipt_lets_the_next_turn_replay_it(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    key = await uncertain_charge(client, provider, "t1")
    value = {"charge_id": "ch_found", "amount": 700}
    body = {"thread_id": "t1", "key": key, "applied": True, "value": value, "note": "dashboard"}
    response = await client.post("/v1/receipts/resolve", json=body)
    assert response.status_code == 200
    receipt = response.json()
    assert receipt["status"] == "completed"
    assert receipt["value"] == value
    assert receipt["resolution"]["actor"] == "anonymous"
    assert receipt["resolution"]["note"] == "dashboard"
    again = await client.post("/v1/receipts/resolve", json=body)
    assert again.status_code == 409
    assert again.json()["type"] == "/problems/receipt-state"
    assert again.json()["key"] == key


async def test_resolving_an_unknown_receipt_is_404(client: httpx.AsyncClient) -> None:
    body = {"thread_id": "t1", "key": "payments.charge:charge:pi_0", "applied": False, "note": "n"}
    response = await client.post("/v1/receipts/resolve", json=body)
    assert response.status_code == 404
    assert (
        response.json()["detail"]
        == "no receipt for key 'payments.charge:charge:pi_0' on thread 't1'"
    )


async def test_resolving_a_key_without_its_capability_prefix_names_the_stored_key(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    key = await uncertain_charge(client, provider, "t1")
    body = {"thread_id": "t1", "key": "charge:pi_9", "applied": False, "note": "n"}
    response = await client.post("/v1/receipts/resolve", json=body)
    assert (response.status_code, response.json()["type"]) == (404, "/problems/not-found")
    assert response.json()["detail"] == (
        f"no receipt for key 'charge:pi_9' on thread 't1'; did you mean {key!r}?"
    )


async def test_resolve_takes_booleans_only_as_booleans(client: httpx.AsyncClient) -> None:
    body = {"thread_id": "t1", "key": "k", "applied": "yes"}
    response = await client.post("/v1/receipts/resolve", json=body)
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["applied"]


NON_FINITE = ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", '{"amount": [1, 1e999]}']


RESOLUTIONS_REFUSED = {
    "no note": ({"applied": False}, ["note"], "Field required"),
    "an empty note": ({"applied": False, "note": ""}, ["note"], "at least 1 character"),
    "a blank note": ({"applied": False, "note": " \t\n"}, ["note"], "only white space"),
    "applied without a value": ({"applied": True, "note": "n"}, [], "needs a value"),
    "not applied with a value": (
        {"applied": False, "value": {"id": "ch"}, "note": "n"},
        [],
        "takes no value",
    ),
}


@pytest.mark.parametrize("extra", list(RESOLUTIONS_REFUSED.values()), ids=list(RESOLUTIONS_REFUSED))
async def test_a_resolution_without_a_note_or_an_applied_one_without_a_value_is_422(
    client: httpx.AsyncClient, provider: FakeProvider, extra: tuple[dict[str, Any], list[str], str]
) -> None:
    fields, loc, message = extra
    key = await uncertain_charge(client, provider, "t1")
    response = await client.post(
        "/v1/receipts/resolve", json={"thread_id": "t1", "key": key, **fields}
    )
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"] == "/problems/invalid-request"
    assert problem["errors"][0]["loc"] == loc
    assert message in problem["detail"]
    [receipt] = (await client.get("/v1/receipts", params={"thread_id": "t1"})).json()["receipts"]
    assert (receipt["status"], receipt["resolution"]) == ("uncertain", None)


async def test_an_applied_resolution_may_say_the_provider_returned_null(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    key = await uncertain_charge(client, provider, "t1")
    body = {"thread_id": "t1", "key": key, "applied": True, "value": None, "note": "returns none"}
    response = await client.post("/v1/receipts/resolve", json=body)
    assert response.status_code == 200, response.text
    assert (response.json()["status"], response.json()["value"]) == ("completed", None)


@pytest.mark.parametrize("value", NON_FINITE)
async def test_a_resolution_value_that_json_cannot_hold_is_422_and_changes_nothing(
    client: httpx.AsyncClient, provider: FakeProvider, value: str
) -> None:
    key = await uncertain_charge(client, provider, "t1")
    body = f'{{"thread_id": "t1", "key": "{key}", "applied": true, "value": {value}, "note": "n"}}'
    response = await client.post(
        "/v1/receipts/resolve", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"] == "/problems/invalid-request"
    assert problem["errors"][0]["loc"] == ["value"]
    assert "finite" in problem["detail"]
    [receipt] = (await client.get("/v1/receipts", params={"thread_id": "t1"})).json()["receipts"]
    assert receipt["status"] == "uncertain"


@pytest.mark.parametrize("value", NON_FINITE)
async def test_an_answer_value_that_json_cannot_hold_is_422(
    client: httpx.AsyncClient, provider: FakeProvider, value: str
) -> None:
    await turn(client, "t1", "d1", message="charge pi_1 500")
    body = f'{{"turn_id": "d2", "answer": {{"decision": "accept", "value": {value}}}}}'
    response = await client.post(
        "/v1/threads/t1/turns", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"] == "/problems/invalid-request"
    assert ["answer", "AnswerBody", "value"] in [e["loc"] for e in problem["errors"]]
    assert provider.calls() == 0
    thread = (await client.get("/v1/threads/t1")).json()
    assert thread["version"] == 1
    assert thread["interaction"] is not None


# -- the rest --------------------------------------------------------------------------------


async def test_health_names_the_agent_served(client: httpx.AsyncClient, kernel: Kernel) -> None:
    response = await client.get("/healthz")
    assert response.json() == {
        "status": "ok",
        "agent": "billing",
        "agent_version": "1",
        "fingerprint": kernel.fingerprint,
    }


async def test_the_openapi_document_describes_every_route(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    assert document["openapi"] == "3.1.0"
    paths = document["paths"]
    assert set(paths) >= {
        "/v1/threads/{thread_id}/turns",
        "/v1/threads/{thread_id}/turns/{turn_id}",
        "/v1/threads/{thread_id}",
        "/v1/receipts",
        "/v1/receipts/resolve",
        "/healthz",
        "/openapi.json",
        "/console",
    }
    turn_op = paths["/v1/threads/{thread_id}/turns"]["post"]
    assert set(turn_op["responses"]) == {
        "200",
        "202",
        "400",
        "403",
        "404",
        "409",
        "413",
        "415",
        "422",
        "500",
        "502",
        "503",
    }
    message = document["components"]["schemas"]["TurnBody"]["properties"]["message"]
    assert {"type": "string", "maxLength": 200} in message["anyOf"]
