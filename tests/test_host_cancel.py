"""``DELETE /v1/threads/{thread_id}/turns/{turn_id}``: ``Kernel.cancel`` over HTTP.

The app runs on uvicorn on a real socket. One client's turn is held inside its model
while other clients send DELETEs, each on its own connection and thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from host_support import serving_in_thread
from intention_kernel import Intent, Interpretation, InterpretationRequest, Kernel
from intention_kernel._interpretation import MAX_ANSWER_TEXT
from intention_kernel.durability import Durability
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.host import Principal, create_app
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing._agents import FakeProvider, billing_agent

TOKENS = {
    "acme-web": Principal("web", "acme", "user"),
    "acme-app": Principal("app", "acme", "user"),
    "globex": Principal("globex", "globex", "user"),
}


class HeldModel:
    """Holds a turn whose message is ``slow`` until a plain thread releases it, then
    asks for two look-ups; any other message gets a plain reply."""

    def __init__(self) -> None:
        self.thinking, self.done = threading.Event(), threading.Event()

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        if request.message != "slow":
            return Interpretation(reply="hello")
        self.thinking.set()
        while not self.done.is_set():  # noqa: ASYNC110  (set by a plain thread)
            await asyncio.sleep(0.01)
        return Interpretation(
            intents=[Intent("billing.balance", {"due": 5}), Intent("billing.balance", {"due": 5})]
        )


@pytest.fixture(params=["memory", "sqlite"])
def fresh_store(request: pytest.FixtureRequest, tmp_path: Path) -> Durability:
    """A store nothing opened yet: it opens on the server's loop, at its first use."""
    if request.param == "memory":
        return InMemoryDurability()
    return SQLiteDurability(tmp_path / "host.db")


@pytest.fixture
def served(fresh_store: Durability) -> Iterator[tuple[str, HeldModel]]:
    model = HeldModel()
    agent = dataclasses.replace(billing_agent(FakeProvider()), interpreter=model)
    app = create_app(Kernel(agent, fresh_store), tokens=TOKENS)
    try:
        with serving_in_thread(app) as base_url:
            yield base_url, model
    finally:
        model.done.set()  # a failed test leaves no turn held on the server


def client(base_url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def test_a_delete_from_another_client_stops_the_running_turn(
    served: tuple[str, HeldModel],
) -> None:
    base_url, model = served
    with client(base_url, "acme-web") as web, client(base_url, "acme-app") as app:
        first = web.post("/v1/threads/t1/turns", json={"turn_id": "d0", "message": "hi"})
        assert first.status_code == 200, first.text  # acme now owns t1
        answers: list[httpx.Response] = []
        running = threading.Thread(
            target=lambda: answers.append(
                web.post("/v1/threads/t1/turns", json={"turn_id": "d1", "message": "slow"})
            )
        )
        running.start()
        assert model.thinking.wait(30)
        cancel = app.delete("/v1/threads/t1/turns/d1", params={"reason": "pressed stop"})
        assert cancel.status_code == 200, cancel.text
        assert cancel.json() == {
            "thread_id": "t1",
            "turn_id": "d1",
            "status": "requested",
            "reason": "pressed stop",
        }
        model.done.set()
        running.join(60)
        assert not running.is_alive()
        [answer] = answers
        assert answer.status_code == 200, answer.text
        result = answer.json()
        assert result["steps"] == []  # stopped before its first step
        assert "pressed stop" in result["reply"]
        assert result["checkpoint_version"] == 2  # it committed what it did

        again = app.delete("/v1/threads/t1/turns/d1")
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "committed"
        replay = web.post("/v1/threads/t1/turns", json={"turn_id": "d1", "message": "slow"})
        assert replay.headers["Idempotency-Replayed"] == "true"
        assert replay.json()["reply"] == result["reply"]


def test_another_tenants_token_gets_404_and_stops_nothing(
    served: tuple[str, HeldModel],
) -> None:
    base_url, model = served
    with client(base_url, "acme-web") as web, client(base_url, "globex") as foreign:
        assert web.post("/v1/threads/t1/turns", json={"turn_id": "d0", "message": "hi"}).is_success
        answers: list[httpx.Response] = []
        running = threading.Thread(
            target=lambda: answers.append(
                web.post("/v1/threads/t1/turns", json={"turn_id": "d1", "message": "slow"})
            )
        )
        running.start()
        assert model.thinking.wait(30)
        refused = foreign.delete("/v1/threads/t1/turns/d1", params={"reason": "mine now"})
        assert refused.status_code == 404, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["detail"] == "no thread 't1'"  # as for an unknown thread
        model.done.set()
        running.join(60)
        [answer] = answers
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["steps"]) == 2  # the foreign DELETE stopped nothing
        committed = foreign.delete("/v1/threads/t1/turns/d1")
        assert committed.status_code == 404, committed.text  # nor learns it committed


def test_bad_input_is_problem_details_and_records_no_stop(
    served: tuple[str, HeldModel],
) -> None:
    base_url, model = served
    model.done.set()  # nothing is held here
    with client(base_url, "acme-web") as web:
        long = web.delete("/v1/threads/t1/turns/d1", params={"reason": "x" * (MAX_ANSWER_TEXT + 1)})
        assert long.status_code == 422, long.text
        assert long.headers["content-type"] == "application/problem+json"
        assert "reason" in long.json()["detail"]
        nul = web.delete("/v1/threads/t1/turns/d%00")
        assert nul.status_code == 422, nul.text
        assert nul.headers["content-type"] == "application/problem+json"
        ran = web.post("/v1/threads/t1/turns", json={"turn_id": "d1", "message": "slow"})
        assert ran.status_code == 200, ran.text
        assert len(ran.json()["steps"]) == 2  # the refused cancel recorded nothing


def test_without_a_token_a_delete_is_401() -> None:
    app = create_app(Kernel(billing_agent(FakeProvider()), InMemoryDurability()), tokens=TOKENS)
    with serving_in_thread(app) as base_url, httpx.Client(base_url=base_url) as anonymous:
        refused = anonymous.delete("/v1/threads/t1/turns/d1")
        assert refused.status_code == 401, refused.text


# -- a queue agent's turn on a busy thread: 202 with its place ---------------------------------


@pytest.fixture
def served_queue(fresh_store: Durability) -> Iterator[tuple[str, HeldModel]]:
    model = HeldModel()
    agent = dataclasses.replace(billing_agent(FakeProvider()), interpreter=model, on_busy="queue")
    app = create_app(Kernel(agent, fresh_store), tokens=TOKENS)
    try:
        with serving_in_thread(app) as base_url:
            yield base_url, model
    finally:
        model.done.set()


def test_a_turn_queued_behind_a_running_one_answers_202_with_its_place(
    served_queue: tuple[str, HeldModel],
) -> None:
    base_url, model = served_queue
    with client(base_url, "acme-web") as web, client(base_url, "acme-app") as app:
        answers: list[httpx.Response] = []
        running = threading.Thread(
            target=lambda: answers.append(
                web.post("/v1/threads/t1/turns", json={"turn_id": "d1", "message": "slow"})
            )
        )
        running.start()
        assert model.thinking.wait(30)
        second = {"turn_id": "d2", "message": "hi"}
        # Waiting for the held turn would time out: the answer comes at once.
        queued = app.post("/v1/threads/t1/turns", json=second, timeout=10)
        assert queued.status_code == 202, queued.text
        assert queued.json() == {"thread_id": "t1", "turn_id": "d2", "position": 1}
        assert app.post("/v1/threads/t1/turns", json=second, timeout=10).json() == queued.json()
        third = app.post("/v1/threads/t1/turns", json={"turn_id": "d3", "message": "hi"})
        assert third.status_code == 202, third.text
        assert third.json()["position"] == 2
        assert app.delete("/v1/threads/t1/turns/d3").json()["status"] == "dequeued"

        model.done.set()
        running.join(60)
        [answer] = answers
        assert answer.status_code == 200, answer.text
        for _ in range(3000):  # the server drains the inbox in the background
            later = app.post("/v1/threads/t1/turns", json=second)
            if later.status_code != 202:
                break
            threading.Event().wait(0.01)
        # The background drain ran it, or this redelivery did, draining the inbox first.
        assert later.status_code == 200, later.text
        assert later.json()["checkpoint_version"] == 2
        replay = app.post("/v1/threads/t1/turns", json=second)
        assert replay.headers["Idempotency-Replayed"] == "true"
        assert replay.json() == {**later.json(), "replayed": True}
        thread = app.get("/v1/threads/t1").json()
        assert thread["version"] == 2  # the dequeued turn never ran


def test_another_tenant_neither_dequeues_nor_stops_turns_on_a_thread_nobody_owns_yet(
    served_queue: tuple[str, HeldModel],
) -> None:
    """The first turn of ``u`` is held before anything durable: nobody owns ``u`` yet.
    Another tenant's DELETE of the turn queued behind it is 404, and its DELETE of the
    running turn is recorded for its own tenant only: it stops nothing."""
    base_url, model = served_queue
    with client(base_url, "acme-web") as web, client(base_url, "globex") as foreign:
        answers: list[httpx.Response] = []
        running = threading.Thread(
            target=lambda: answers.append(
                web.post("/v1/threads/u/turns", json={"turn_id": "d1", "message": "slow"})
            )
        )
        running.start()
        assert model.thinking.wait(30)
        queued = web.post("/v1/threads/u/turns", json={"turn_id": "d2", "message": "hi"})
        assert queued.status_code == 202, queued.text

        refused = foreign.delete("/v1/threads/u/turns/d2")
        assert refused.status_code == 404, refused.text
        assert refused.json()["detail"] == "no thread 'u'"
        foreign.delete("/v1/threads/u/turns/d1", params={"reason": "mine now"})

        model.done.set()
        running.join(60)
        [answer] = answers
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["steps"]) == 2  # the foreign DELETE stopped nothing
        for _ in range(3000):  # the queued turn still runs: it was not dequeued
            later = web.post("/v1/threads/u/turns", json={"turn_id": "d2", "message": "hi"})
            if later.status_code != 202:
                break
            threading.Event().wait(0.01)
        assert later.status_code == 200, later.text
        assert later.json()["checkpoint_version"] == 2
        # The owner's own DELETE of a queued turn still works.
        assert web.post("/v1/threads/u/turns", json={"turn_id": "d3", "message": "slow"}).is_success


@pytest.fixture
def served_interrupt(fresh_store: Durability) -> Iterator[tuple[str, HeldModel]]:
    model = HeldModel()
    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=model, on_busy="interrupt"
    )
    app = create_app(Kernel(agent, fresh_store, cancel_check_after=0.0), tokens=TOKENS)
    try:
        with serving_in_thread(app) as base_url:
            yield base_url, model
    finally:
        model.done.set()


def test_another_tenants_message_interrupts_nothing_on_a_thread_nobody_owns_yet(
    served_interrupt: tuple[str, HeldModel],
) -> None:
    """The first turn of ``u`` is held before anything durable: nobody owns ``u`` yet.
    Another tenant's message to the ``"interrupt"`` agent is queued, and its interrupt
    is recorded for its own tenant only: the running turn goes on to its end. Once
    the thread is the first tenant's, the foreign message is 404."""
    base_url, model = served_interrupt
    with client(base_url, "acme-web") as web, client(base_url, "globex") as foreign:
        answers: list[httpx.Response] = []
        running = threading.Thread(
            target=lambda: answers.append(
                web.post("/v1/threads/u/turns", json={"turn_id": "d1", "message": "slow"})
            )
        )
        running.start()
        assert model.thinking.wait(30)
        message = {"turn_id": "f1", "message": "hi"}
        queued = foreign.post("/v1/threads/u/turns", json=message, timeout=10)
        assert queued.status_code == 202, queued.text

        model.done.set()
        running.join(60)
        [answer] = answers
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["steps"]) == 2  # the foreign message stopped nothing
        for _ in range(3000):  # the server drops the foreign entry in the background
            later = foreign.post("/v1/threads/u/turns", json=message)
            if later.status_code != 202:
                break
            threading.Event().wait(0.01)
        assert later.status_code == 404, later.text
        assert web.get("/v1/threads/u").json()["version"] == 1
