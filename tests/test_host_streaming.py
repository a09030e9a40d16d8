"""The host streams a turn as server-sent events when asked with
``Accept: text/event-stream``: through httpx against the ASGI app, through raw ASGI
for a client that disconnects mid-stream, on every store; then over uvicorn, and once
against ``intention-kernel serve``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from host_support import asgi_client, served, serving_in_thread
from intention_kernel import Intent, Interpretation, InterpretationRequest, Kernel
from intention_kernel.durability import Durability
from intention_kernel.host import create_app
from intention_kernel.testing import InMemoryDurability, ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent
from loop_support import GatedRounds

SSE = {"Accept": "text/event-stream"}
URL = "/v1/threads/acct-1/turns"


def parse_sse(text: str) -> list[tuple[str, Any]]:
    """``(event, data)`` of each server-sent event in ``text``."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(": ")
            fields[name] = value
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def script(request: InterpretationRequest) -> Interpretation:
    """Round 1 reads the balance, round 2 proposes a charge, round 3 replies; a message
    ``fail`` makes round 2 raise."""
    if not request.rounds:
        return Interpretation(intents=[Intent("billing.balance", {"due": 7})])
    if request.message == "fail":
        raise RuntimeError("the model went away")
    if len(request.rounds) == 1:
        return Interpretation(
            intents=[Intent("payments.charge", {"payment_intent_id": "pi_1", "amount": 7})]
        )
    return Interpretation(reply="You owe 7; confirm the charge.")


def kernel_for(store: Durability, interpreter: Any) -> Kernel:
    return Kernel(
        dataclasses.replace(billing_agent(FakeProvider()), interpreter=interpreter), store
    )


@pytest.fixture
async def client(store: Durability) -> AsyncIterator[httpx.AsyncClient]:
    kernel = kernel_for(store, ScriptedInterpreter(script, multi_round=True))
    async with asgi_client(create_app(kernel)) as client:
        yield client


async def test_the_event_stream_ends_with_result_equal_to_the_json_answer_of_the_delivery(
    client: httpx.AsyncClient,
) -> None:
    body = {"turn_id": "d1", "message": "pay what I owe"}
    response = await client.post(URL, json=body, headers=SSE)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["idempotency-replayed"] == "false"
    events = parse_sse(response.text)
    assert [name for name, _ in events] == ["step", "interaction", "step", "result"]
    result = events[-1][1]
    steps = [data for name, data in events if name == "step"]
    assert [s.pop("input") for s in steps] == [{"due": 7}, None]  # the input that ran
    assert steps == result["steps"]
    again = await client.post(URL, json=body)
    assert again.headers["idempotency-replayed"] == "true"
    assert again.json() == {**result, "replayed": True}


async def test_a_replayed_delivery_streams_only_its_result(client: httpx.AsyncClient) -> None:
    body = {"turn_id": "d1", "message": "pay what I owe"}
    committed = (await client.post(URL, json=body)).json()

    response = await client.post(URL, json=body, headers=SSE)

    assert response.headers["idempotency-replayed"] == "true"
    assert parse_sse(response.text) == [("result", {**committed, "replayed": True})]


async def test_a_turn_refused_before_it_ran_answers_problem_details_not_a_stream(
    client: httpx.AsyncClient,
) -> None:
    await client.post(URL, json={"turn_id": "d1", "message": "pay what I owe"})

    conflict = await client.post(URL, json={"turn_id": "d1", "message": "other"}, headers=SSE)
    assert conflict.status_code == 409
    assert conflict.headers["content-type"] == "application/problem+json"
    assert conflict.json()["type"] == "/problems/turn-conflict"
    empty = await client.post(URL, json={"turn_id": "d2"}, headers=SSE)
    assert empty.status_code == 422
    assert empty.headers["content-type"] == "application/problem+json"


async def test_a_failure_after_the_stream_started_is_an_error_event_and_commits_nothing(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(URL, json={"turn_id": "d1", "message": "fail"}, headers=SSE)

    events = parse_sse(response.text)
    assert [name for name, _ in events] == ["step", "error"]
    problem = events[-1][1]
    assert problem["status"] == 502
    assert problem["turn_id"] == "d1"
    assert (await client.get("/v1/threads/acct-1")).status_code == 404


async def test_an_accept_header_without_event_stream_answers_json(
    client: httpx.AsyncClient,
) -> None:
    for accept in ("application/json", "text/event-stream;q=0", "*/*"):
        response = await client.post(
            URL, json={"turn_id": f"d-{accept}", "message": "x"}, headers={"Accept": accept}
        )
        assert response.headers["content-type"] == "application/json", accept


async def test_the_openapi_document_says_a_turn_may_answer_an_event_stream(
    client: httpx.AsyncClient,
) -> None:
    document = (await client.get("/openapi.json")).json()
    ok = document["paths"]["/v1/threads/{thread_id}/turns"]["post"]["responses"]["200"]
    assert set(ok["content"]) == {"application/json", "text/event-stream"}


async def test_a_client_that_disconnects_mid_stream_does_not_abort_the_turn(
    store: Durability,
) -> None:
    interpreter = GatedRounds()
    kernel = kernel_for(store, interpreter)
    app = create_app(kernel)
    request = json.dumps({"turn_id": "d1", "message": "what do I owe?"}).encode()
    sent: list[Message] = []
    first_event = asyncio.Event()
    disconnected = asyncio.Event()
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": request, "more_body": False}
        await first_event.wait()
        disconnected.set()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            first_event.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": URL,
        "raw_path": URL.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", b"application/json"),
            (b"accept", b"text/event-stream"),
            (b"content-length", str(len(request)).encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("localhost", 80),
    }
    await app(scope, receive, send)  # returns once the disconnect ended the response

    assert disconnected.is_set()
    bodies = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert [name for name, _ in parse_sse(bodies.decode())] == ["step"]
    assert await store.load_checkpoint("acct-1") is None  # the turn is still running
    interpreter.gate.set()

    async with asgi_client(app) as client:
        retried = await client.post(URL, json={"turn_id": "d1", "message": "what do I owe?"})
    assert retried.headers["idempotency-replayed"] == "true"
    assert retried.json()["reply"] == "You owe 5."
    assert interpreter.calls == 2


@pytest.mark.slow
def test_a_served_host_streams_a_turn_that_ends_with_the_json_answer(tmp_path: Path) -> None:
    with served(tmp_path / "host.db") as base_url, httpx.Client(base_url=base_url) as client:
        body = {"turn_id": "d1", "message": "pay invoice 42"}
        with client.stream("POST", "/v1/threads/acct-acme/turns", json=body, headers=SSE) as sse:
            assert sse.headers["content-type"].startswith("text/event-stream")
            events = parse_sse(sse.read().decode())
        assert events[-1][0] == "result"
        assert "interaction" in [name for name, _ in events]
        again = client.post("/v1/threads/acct-acme/turns", json=body)
        assert again.json() == {**events[-1][1], "replayed": True}


class ThreadGatedRounds:
    """Works in rounds; round 2 waits for ``gate``, set from the test's thread."""

    multi_round = True

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls = 0

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        self.calls += 1
        if not request.rounds:
            return Interpretation(intents=[Intent("billing.balance", {"due": 5})])
        await asyncio.to_thread(self.gate.wait, 30)
        return Interpretation(reply="You owe 5.")


class DisconnectWatch:
    """ASGI middleware: sets ``seen`` once the app is told that its client went away."""

    seen = threading.Event()

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watched() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                DisconnectWatch.seen.set()
            return message

        await self.app(scope, watched, send)


def test_a_client_that_closes_a_uvicorn_stream_mid_turn_leaves_a_committed_turn() -> None:
    interpreter = ThreadGatedRounds()
    app = create_app(kernel_for(InMemoryDurability(), interpreter))
    app.add_middleware(DisconnectWatch)

    body = {"turn_id": "d1", "message": "what do I owe?"}
    with serving_in_thread(app) as base_url, httpx.Client(base_url=base_url) as client:
        with client.stream("POST", URL, json=body, headers=SSE) as sse:
            lines = sse.iter_lines()
            assert next(lines) == "event: step"
        # The app has seen the client go while round 2 waits; then round 2 may answer.
        assert DisconnectWatch.seen.wait(30)
        interpreter.gate.set()
        retried = client.post(URL, json=body)
    assert retried.headers["idempotency-replayed"] == "true"
    assert retried.json()["reply"] == "You owe 5."
    assert interpreter.calls == 2
