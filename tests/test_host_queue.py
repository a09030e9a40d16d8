"""``GET /v1/interactions``: the pending confirmations across the caller's threads,
which the console's queue shows beside the receipts to reconcile."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from host_support import asgi_client
from intention_kernel import Kernel
from intention_kernel.host import Principal, create_app
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing._agents import FakeProvider, billing_agent

# The queue is an operator's view: each token is an operator of its tenant.
TOKENS = {
    "acme-token": Principal("ada", "acme", "operator"),
    "globex-token": Principal("grace", "globex", "operator"),
    "ops-token": Principal("ops", None, "operator"),
}


async def seeded() -> Kernel:
    kernel = Kernel(billing_agent(FakeProvider()), InMemoryDurability())
    for thread, tenant, pi in (
        ("acme-1", "acme", "pi_1"),
        ("acme-2", "acme", "pi_2"),
        ("acme-3", "acme", "pi_3"),
        ("globex-1", "globex", "pi_4"),
        ("open-1", None, "pi_5"),
    ):
        await kernel.turn(thread, "d1", f"charge {pi} 500", tenant_id=tenant)
    await kernel.turn("acme-2", "d2", "yes", tenant_id="acme")  # answered
    return kernel


async def listed(client: httpx.AsyncClient, query: str = "") -> dict[str, Any]:
    response = await client.get(f"/v1/interactions{query}")
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def test_each_token_sees_the_pending_confirmations_of_its_own_tenant_only() -> None:
    kernel = await seeded()
    app = create_app(kernel, tokens=TOKENS)
    seen = {}
    for token in TOKENS:
        async with asgi_client(app, token=token) as client:
            body = await listed(client)
        seen[token] = [item["thread_id"] for item in body["interactions"]]
    assert seen == {
        "acme-token": ["acme-1", "acme-3"],
        "globex-token": ["globex-1"],
        "ops-token": ["open-1"],
    }
    async with asgi_client(app) as anonymous:
        assert (await anonymous.get("/v1/interactions")).status_code == 401


async def test_a_user_token_may_not_list_the_queue_across_threads() -> None:
    app = create_app(await seeded(), tokens={"chat-token": "acme"})
    async with asgi_client(app, token="chat-token") as client:
        response = await client.get("/v1/interactions")
    assert response.status_code == 403
    assert response.json()["type"].endswith("/forbidden")


async def test_without_tokens_only_threads_without_a_tenant_are_listed() -> None:
    async with asgi_client(create_app(await seeded())) as client:
        [item] = (await listed(client))["interactions"]
    assert item["thread_id"] == "open-1"
    assert item["version"] == 1
    assert item["interaction"]["kind"] == "confirmation"
    assert item["interaction"]["capability_id"] == "payments.charge"
    assert item["interaction"]["prompt"]


async def test_the_list_is_bounded_and_pages_on() -> None:
    app = create_app(await seeded(), tokens=TOKENS)
    async with asgi_client(app, token="acme-token") as client:
        first = await listed(client, "?limit=1")
        assert [i["thread_id"] for i in first["interactions"]] == ["acme-1"]
        assert first["next_after"] == "acme-1"
        rest = await listed(client, "?limit=1&after=acme-1")
        assert [i["thread_id"] for i in rest["interactions"]] == ["acme-3"]
        last = await listed(client, "?limit=1&after=acme-3")
        assert last == {"interactions": [], "next_after": None}


@pytest.mark.parametrize("query", ["?limit=0", "?limit=501", "?limit=x", "?limit=-1", "?after="])
async def test_a_bad_limit_or_cursor_is_422(query: str) -> None:
    async with asgi_client(create_app(await seeded())) as client:
        response = await client.get(f"/v1/interactions{query}")
    assert response.status_code == 422
    assert response.json()["type"] == "/problems/invalid-request"
