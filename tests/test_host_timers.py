"""The HTTP host fires due timers in the background (its lifespan), unless told not to,
and ``GET /v1/threads/{thread_id}/timers`` lists a thread's timers to its tenant."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from host_support import asgi_client
from intention_kernel import Kernel
from intention_kernel.durability import Durability
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.host import Principal, create_app
from timer_worker import jobs_agent


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
