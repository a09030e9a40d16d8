"""The HTTP host fires due timers in the background (its lifespan), unless told not to,
and ``GET /v1/threads/{thread_id}/timers`` lists a thread's timers to its tenant. A
timer's turn is read over HTTP as any turn is (its status and its events), by its
thread's tenant only; a client may still not post a turn under its ID."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncGenerator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import httpx
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from host_support import asgi_client
from intention_kernel import (
    Agent,
    CapabilityContext,
    Intent,
    Interpretation,
    InterpretationRequest,
    Kernel,
    TurnEvent,
    capability,
)
from intention_kernel.durability import Durability
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.host import Principal, create_app
from intention_kernel.testing import ScriptedInterpreter
from timer_worker import jobs_agent
from timers_support import Clock, approval_agent


def seed(path: Path) -> None:
    async def go() -> None:
        async with SQLiteDurability(path) as store:
            kernel = Kernel(jobs_agent(), store)
            await kernel.schedule("t", "due", at=datetime.now(UTC) - timedelta(seconds=1))

    asyncio.run(go())


def status(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return str(conn.execute("SELECT status FROM ik_timers").fetchone()[0])


def test_the_host_fires_due_timers_in_the_background(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    seed(path)
    app = create_app(Kernel(jobs_agent(), SQLiteDurability(path)), timer_poll=0.02)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        deadline = time.monotonic() + 20
        while status(path) != "fired":
            assert time.monotonic() < deadline, "the host fired nothing"
            time.sleep(0.02)
        assert client.get("/healthz").status_code == 200


def test_a_host_told_not_to_fires_no_timer(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    seed(path)
    app = create_app(Kernel(jobs_agent(), SQLiteDurability(path)), timers=False)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert client.get("/healthz").status_code == 200
        time.sleep(0.3)
    assert status(path) == "pending"


# -- GET /v1/threads/{thread_id}/timers ------------------------------------------------------

TOKENS = {
    "acme-web": Principal("web", "acme", "user"),
    "acme-ops": Principal("ops", "acme", "operator"),
    "globex": Principal("globex", "globex", "user"),
}
LATER = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


async def test_a_threads_timers_are_listed_to_its_tenant_only(store: Durability) -> None:
    kernel = Kernel(jobs_agent(), store)
    await kernel.turn("t", "1", "hello", tenant_id="acme")
    await kernel.schedule("t", "later", at=LATER, message="remind", data={"n": 1}, tenant_id="acme")
    await kernel.schedule("t", "weekly", at=LATER, every=timedelta(days=7), tenant_id="acme")
    await kernel.schedule("free", "nudge", at=LATER, tenant_id="globex")  # a thread with no turn
    app = create_app(kernel, tokens=TOKENS)
    async with asgi_client(app, "acme-web") as web, asgi_client(app, "globex") as globex:
        listed = await web.get("/v1/threads/t/timers")
        assert listed.status_code == 200, listed.text
        body = listed.json()
        assert body["thread_id"] == "t"
        assert [(t["key"], t["status"]) for t in body["timers"]] == [
            ("later", "pending"),
            ("weekly", "pending"),
        ]
        later, weekly = body["timers"]
        assert datetime.fromisoformat(later["due_at"]) == LATER
        assert (later["message"], later["data"], later["every_seconds"]) == (
            "remind",
            {"n": 1},
            None,
        )
        assert weekly["every_seconds"] == 7 * 24 * 3600
        fired = await web.get("/v1/threads/t/timers", params={"status": "fired"})
        assert (fired.status_code, fired.json()["timers"]) == (200, [])
        one = await web.get("/v1/threads/t/timers", params={"limit": "1"})
        assert [t["key"] for t in one.json()["timers"]] == ["later"]
        # Another tenant's thread answers as an unknown one does.
        for client, path in ((globex, "/v1/threads/t/timers"), (web, "/v1/threads/nope/timers")):
            refused = await client.get(path)
            assert refused.status_code == 404, refused.text
            assert refused.json()["type"] == "/problems/not-found"
        # A thread with timers and no turn yet: its timers' tenant reads them, no other.
        assert [
            t["key"] for t in (await globex.get("/v1/threads/free/timers")).json()["timers"]
        ] == ["nudge"]
        assert (await web.get("/v1/threads/free/timers")).status_code == 404
        async with asgi_client(app, "acme-ops") as ops:  # an operator reads it as a user does
            assert len((await ops.get("/v1/threads/t/timers")).json()["timers"]) == 2
        async with asgi_client(app) as anonymous:
            assert (await anonymous.get("/v1/threads/t/timers")).status_code == 401


async def test_timers_listed_over_http_follow_their_firing(store: Durability) -> None:
    clock = [datetime(2026, 12, 5, 9, 0, tzinfo=UTC)]
    kernel = Kernel(jobs_agent(), store, clock=lambda: clock[0])
    await kernel.schedule("t", "soon", after=timedelta(minutes=1), message="go")
    async with asgi_client(create_app(kernel)) as client:
        (pending,) = (await client.get("/v1/threads/t/timers")).json()["timers"]
        assert (pending["status"], pending["turn_id"]) == ("pending", None)
        clock[0] += timedelta(minutes=1)
        (fired,) = await kernel.fire_due_timers()
        (shown,) = (await client.get("/v1/threads/t/timers")).json()["timers"]
        assert (shown["status"], shown["turn_id"]) == ("fired", fired.turn_id)
        pending_only = await client.get("/v1/threads/t/timers", params={"status": "pending"})
        assert pending_only.json()["timers"] == []
        # Timers and a thread view: "t/timers" names the list, not a thread of that ID.
        assert (await client.get("/v1/threads/t")).json()["thread_id"] == "t"


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"status": "done"}, "status must be one of pending, fired, void"),
        ({"limit": "0"}, "limit must be an integer from 1 to 500"),
        ({"limit": "501"}, "limit must be an integer from 1 to 500"),
        ({"limit": "x"}, "limit must be an integer from 1 to 500"),
    ],
)
async def test_a_bad_timer_listing_is_refused(
    store: Durability, params: dict[str, str], problem: str
) -> None:
    kernel = Kernel(jobs_agent(), store)
    await kernel.schedule("t", "soon", at=LATER)
    async with asgi_client(create_app(kernel)) as client:
        refused = await client.get("/v1/threads/t/timers", params=params)
        assert refused.status_code == 422, refused.text
        assert problem in refused.json()["detail"]
        wrong = await client.post("/v1/threads/t/timers", json={})
        assert (wrong.status_code, wrong.headers["allow"]) == (405, "GET")


# -- a timer's turn, read over HTTP -------------------------------------------------------


def held_agent(entered: asyncio.Event, release: asyncio.Event) -> Agent:
    """A timer's turn holds in its step until the test releases it."""

    @capability("jobs.held", effect="read", description="Held")
    async def held(input: dict[str, Any], ctx: CapabilityContext) -> str:
        entered.set()
        await asyncio.wait_for(release.wait(), 10)
        return "done"

    class Interpreter:
        async def interpret(self, request: InterpretationRequest) -> Interpretation:
            if request.timer is None:
                return Interpretation(reply="hello")
            return Interpretation([Intent("jobs.held", {})], reply="ran the job")

    return Agent(name="held", version="1", capabilities=[held], interpreter=Interpreter())


def sse_events(text: str) -> list[tuple[str, Any]]:
    """The ``(event, data)`` of each event of a server-sent stream."""
    found = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.split("\n") if line and not line.startswith(":")
        )
        if fields:
            found.append((fields["event"], json.loads(fields["data"])))
    return found


async def read_as_any_turn(
    app: Starlette, web: httpx.AsyncClient, globex: httpx.AsyncClient, turn_id: str
) -> dict[str, Any]:
    """The committed turn ``turn_id`` of thread ``t``, read over HTTP as any turn is:
    its status by the thread's tenant (``web``), with the ID percent-encoded or as sent,
    and its events, the result alone once committed. Another tenant (``globex``) gets
    404, a caller without a token 401. Returns its result."""
    url = f"/v1/threads/t/turns/{quote(turn_id, safe='')}"
    committed = await web.get(url)
    assert committed.status_code == 200, committed.text
    assert committed.json()["status"] == "committed"
    result: dict[str, Any] = committed.json()["result"]
    assert result["turn_id"] == turn_id
    unquoted = await web.get(f"/v1/threads/t/turns/{turn_id}")  # ":" and "@" as sent
    assert (unquoted.status_code, unquoted.json()) == (200, committed.json())
    replayed = sse_events((await web.get(url + "/events")).text)
    assert replayed == [("result", result)]
    # Another tenant reads it as an unknown turn; a caller without a token not at all.
    for path in (url, url + "/events"):
        refused = await globex.get(path)
        assert refused.status_code == 404, refused.text
        assert refused.json()["type"] == "/problems/not-found"
    async with asgi_client(app) as anonymous:
        assert (await anonymous.get(url)).status_code == 401
    return result


async def test_a_timer_turns_status_and_events_are_read_by_its_tenant(store: Durability) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    kernel = Kernel(held_agent(entered, release), store)
    await kernel.turn("t", "1", "hi", tenant_id="acme")
    set_timer = await kernel.schedule("t", "job", after=timedelta(0), tenant_id="acme")
    turn_id = "timer:job@" + set_timer.due_at.strftime("%Y%m%dT%H%M%S.%fZ")
    url = f"/v1/threads/t/turns/{quote(turn_id, safe='')}"
    app = create_app(kernel, tokens=TOKENS, timers=False)
    async with asgi_client(app, "acme-web") as web, asgi_client(app, "globex") as globex:
        assert (await web.get(url)).status_code == 404  # not fired yet: no such turn
        firing = asyncio.create_task(kernel.fire_due_timers())
        await asyncio.wait_for(entered.wait(), 10)
        running = await web.get(url)
        assert running.status_code == 200, running.text
        assert running.json() == {
            "thread_id": "t",
            "turn_id": turn_id,
            "status": "running",
            "result": None,
        }
        watching = asyncio.create_task(web.get(url + "/events"))  # ends with the result
        release.set()
        (fired,) = await asyncio.wait_for(firing, 10)
        assert (fired.outcome, fired.turn_id) == ("fired", turn_id)
        watched = await asyncio.wait_for(watching, 10)
        assert watched.status_code == 200, watched.text
        assert watched.headers["content-type"].startswith("text/event-stream")
        result = await read_as_any_turn(app, web, globex, turn_id)
        assert "ran the job" in result["reply"]
        assert sse_events(watched.text)[-1] == ("result", result)
        unknown = await web.get("/v1/threads/t/turns/" + quote("timer:nope@x", safe=""))
        assert unknown.status_code == 404


async def test_a_timer_turn_id_is_still_refused_for_a_posted_turn(store: Durability) -> None:
    kernel = Kernel(jobs_agent(), store)
    await kernel.turn("t", "1", "hi", tenant_id="acme")
    await kernel.schedule("t", "job", after=timedelta(0), tenant_id="acme")
    (fired,) = await kernel.fire_due_timers()
    app = create_app(kernel, tokens=TOKENS, timers=False)
    async with asgi_client(app, "acme-web") as web:
        posted = [
            await web.post("/v1/threads/t/turns", json={"turn_id": fired.turn_id, "message": "x"}),
            await web.post(
                "/v1/threads/t/turns",
                json={"message": "x"},
                headers={"idempotency-key": "timer:other@20261205T090000.000000Z"},
            ),
            await web.post(
                "/v1/threads/t/turns",
                json={"turn_id": "timer:other@20261205T090000.000000Z", "message": "x"},
                headers={"prefer": "respond-async"},
            ),
            await web.post(
                "/v1/threads/t/turns",
                json={"turn_id": fired.turn_id, "message": "x"},
                headers={"accept": "text/event-stream"},
            ),
        ]
        for response in posted:
            assert response.status_code == 422, response.text
            assert "reserved" in response.json()["detail"]
    checkpoint = await kernel.checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 2  # the turn and the timer's


async def test_an_expiry_turn_is_read_by_its_tenant_as_a_timer_turn_is(store: Durability) -> None:
    """The expiry closes a confirmation in turn ``expire:<interaction id>``. The thread's
    tenant reads its status and events; another tenant gets 404; a POST under an
    ``expire:`` ID is still refused."""
    clock = Clock()
    kernel = Kernel(approval_agent(), store, clock=clock)
    opened = await kernel.turn("t", "1", "ship o1", tenant_id="acme")
    assert opened.interaction is not None
    turn_id = "expire:" + opened.interaction.id
    url = f"/v1/threads/t/turns/{quote(turn_id, safe='')}"
    app = create_app(kernel, tokens=TOKENS, timers=False)
    async with asgi_client(app, "acme-web") as web, asgi_client(app, "globex") as globex:
        assert (await web.get(url)).status_code == 404  # not expired yet: no such turn
        clock.move(minutes=30)
        (expiry,) = await kernel.fire_due_timers()
        assert (expiry.outcome, expiry.turn_id) == ("fired", turn_id)
        result = await read_as_any_turn(app, web, globex, turn_id)
        assert (result["interaction"], result["checkpoint_version"]) == (None, 2)
        posted = await web.post("/v1/threads/t/turns", json={"turn_id": turn_id, "message": "x"})
        hello = {"id": "u1", "role": "user", "content": "hi"}
        run = {"threadId": "t", "runId": turn_id, "messages": [hello]}
        agui = await web.post("/v1/agui", json=run)  # a run delivers a turn too
        for refused in (posted, agui):
            assert refused.status_code == 422, refused.text
            assert "reserved" in refused.json()["detail"]
    checkpoint = await kernel.checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 2  # the turn and its expiry


def held_in_round_two(entered: asyncio.Event, release: asyncio.Event) -> Agent:
    """A timer's turn in rounds: round 1 runs at once, round 2 holds until released.
    While it holds, round 1 is recorded in the turn's stream."""

    @capability("jobs.quick", effect="read", description="Quick")
    async def quick(input: dict[str, Any], ctx: CapabilityContext) -> str:
        return "quick"

    @capability("jobs.held", effect="read", description="Held")
    async def held(input: dict[str, Any], ctx: CapabilityContext) -> str:
        entered.set()
        await asyncio.wait_for(release.wait(), 10)
        return "done"

    def script(request: InterpretationRequest) -> Interpretation:
        if request.timer is None:
            return Interpretation(reply="hello")
        steps = ("jobs.quick", "jobs.held")
        if len(request.rounds) < len(steps):
            return Interpretation([Intent(steps[len(request.rounds)], {})])
        return Interpretation(reply="ran the job")

    model = ScriptedInterpreter(script, multi_round=True)
    return Agent(name="rounds", version="1", capabilities=[quick, held], interpreter=model)


async def test_an_agui_run_may_not_take_a_timer_turns_id(store: Durability) -> None:
    """An AG-UI run delivers a turn: a running or committed timer turn's ID is refused
    with 422 before anything is read, though the running turn has a recorded round."""
    entered, release = asyncio.Event(), asyncio.Event()
    kernel = Kernel(held_in_round_two(entered, release), store)
    set_timer = await kernel.schedule("t", "job", after=timedelta(0))
    turn_id = "timer:job@" + set_timer.due_at.strftime("%Y%m%dT%H%M%S.%fZ")
    hello = {"id": "u1", "role": "user", "content": "hi"}
    run = {"threadId": "t", "runId": turn_id, "messages": [hello]}
    async with asgi_client(create_app(kernel, timers=False)) as client:
        firing = asyncio.create_task(kernel.fire_due_timers())
        await asyncio.wait_for(entered.wait(), 10)
        watching = kernel.watch_turn("t", turn_id)
        first = await asyncio.wait_for(anext(watching), 10)
        assert first.type == "step", "round 1 is recorded while round 2 holds"
        await cast(AsyncGenerator[TurnEvent, None], watching).aclose()
        while_running = await client.post("/v1/agui", json=run)
        release.set()
        (fired,) = await asyncio.wait_for(firing, 10)
        once_committed = await client.post("/v1/agui", json=run)
    for refused in (while_running, once_committed):
        assert refused.status_code == 422, refused.text
        assert "reserved" in refused.json()["detail"]
    assert (fired.outcome, fired.turn_id) == ("fired", turn_id)
    checkpoint = await kernel.checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 1  # the timer's turn alone
