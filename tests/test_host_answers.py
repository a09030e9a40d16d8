"""How the host answers what no endpoint handles: a wrong method, as problem details
that agree with the OpenAPI document; and how it logs a failure it handled."""

from __future__ import annotations

import logging

import pytest

from host_support import asgi_client
from intention_kernel import Kernel
from intention_kernel.host import create_app
from intention_kernel.testing import InMemoryDurability, ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent

PROBLEM = "application/problem+json"


def kernel() -> Kernel:
    return Kernel(billing_agent(FakeProvider()), InMemoryDurability())


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "PATCH", "DELETE"])
async def test_a_wrong_method_on_a_turns_path_is_405_with_allow_post(method: str) -> None:
    async with asgi_client(create_app(kernel())) as client:
        await client.post("/v1/threads/x/turns", json={"turn_id": "d1", "message": "balance"})
        response = await client.request(method, "/v1/threads/x/turns")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.headers["content-type"] == PROBLEM
    if method != "HEAD":
        assert response.json()["type"] == "/problems/method-not-allowed"


async def test_every_path_allows_exactly_the_methods_its_openapi_entry_lists() -> None:
    async with asgi_client(create_app(kernel())) as client:
        document = (await client.get("/openapi.json")).json()
        for template, operations in document["paths"].items():
            path = template.replace("{thread_id}", "t1").replace("{slug}", "not-found")
            documented = {method.upper() for method in operations}
            for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - documented:
                response = await client.request(method, path)
                assert response.status_code == 405, (method, path, response.text)
                allowed = {m.strip() for m in response.headers["allow"].split(",")} - {"HEAD"}
                assert allowed == documented, (method, path)
                assert response.headers["content-type"] == PROBLEM


async def test_a_handled_502_logs_one_warning_line_and_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(request: object) -> object:
        raise ConnectionError("model endpoint unreachable")

    agent = billing_agent(FakeProvider(), interpreter=ScriptedInterpreter(broken))  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, logger="intention_kernel.host"):
        async with asgi_client(create_app(Kernel(agent, InMemoryDurability()))) as client:
            response = await client.post(
                "/v1/threads/t1/turns", json={"turn_id": "d1", "message": "x"}
            )
    assert response.status_code == 502
    records = [r for r in caplog.records if r.name == "intention_kernel.host"]
    assert [r.levelno for r in records] == [logging.WARNING]
    [record] = records
    assert record.exc_info is None and record.exc_text is None
    assert "\n" not in record.getMessage()
    assert "POST /v1/threads/t1/turns" in record.getMessage()
