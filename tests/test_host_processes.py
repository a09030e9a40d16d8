"""The HTTP host as it is deployed: ``intention-kernel serve`` in a real process on
loopback, on SQLite and on PostgreSQL.

Tenant isolation with bearer tokens bound to tenants, receipts listed and resolved,
a thread held by another process answering 503 with Retry-After, and the console.
On PostgreSQL each test has a schema of its own (named in the ``--db`` URL, dropped
afterwards), so that what other tests left in the test database, or a schema another
library version migrated, cannot change what the host shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from host_support import LOST_RESPONSES_ENV, served, store_url_for
from intention_kernel import TurnScope
from intention_kernel.durability import open_durability

pytestmark = pytest.mark.slow

PROBLEM = "application/problem+json"
CHARGE_43 = "payments.charge:charge:pi_demo_43"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from store_url_for(request, tmp_path, "ik_test")


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex[:10]


def client(base_url: str, token: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=base_url, headers=headers, timeout=30)


def turn(http: httpx.Client, thread: str, turn_id: str, **body: Any) -> httpx.Response:
    return http.post(f"/v1/threads/{thread}/turns", json={"turn_id": turn_id, **body})


def charges(provider: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(provider) as conn:
        rows = conn.execute(
            "SELECT payment_intent_id, amount_cents FROM demo_provider_charges ORDER BY rowid"
        )
        return [(pi, amount) for pi, amount in rows]


def test_a_tenant_never_reads_or_writes_another_tenants_thread(
    store_url: str, tmp_path: Path, run_id: str
) -> None:
    acme, globex = f"acme-{run_id}", f"globex-{run_id}"
    # Tenant-prefixed thread IDs, as the README recommends: IDs are one namespace.
    ours, theirs = f"{acme}/acct", f"{globex}/acct"
    provider = tmp_path / "provider.db"
    # Operators of each tenant (a person's token), and a chat front end of acme's.
    tokens = {
        "tok-acme": f"{acme};role=operator;principal=alice@acme.example",
        "tok-globex": f"{globex};role=operator;principal=gina@globex.example",
        "tok-acme-chat": acme,
    }
    lost = {LOST_RESPONSES_ENV: "pi_demo_43"}  # acme's charge is applied, its answer lost
    with (
        served(store_url, provider=provider, tokens=tokens, env=lost) as base_url,
        client(base_url, "tok-acme") as a,
        client(base_url, "tok-globex") as b,
        client(base_url, "tok-acme-chat") as chat,
        client(base_url) as anonymous,
    ):
        assert turn(a, ours, "a1", message="pay invoice 43").json()["interaction"] is not None
        uncertain = turn(a, ours, "a2", answer="accept").json()
        assert uncertain["steps"][0]["status"] == "uncertain"
        assert turn(b, theirs, "b1", message="pay invoice 42").status_code == 200
        assert turn(b, theirs, "b2", answer="accept").json()["steps"][0]["status"] == "completed"

        # globex learns nothing about acme's thread: it is reported like a missing one.
        read = b.get(f"/v1/threads/{ours}")
        assert (read.status_code, read.headers["content-type"]) == (404, PROBLEM)
        assert read.json()["detail"] == f"no thread {ours!r}"
        posted = turn(b, ours, "b3", message="what do I owe on invoice 43?")
        assert (posted.status_code, posted.json()["type"]) == (404, "/problems/not-found")
        listed = b.get("/v1/receipts").json()["receipts"]
        assert {(r["thread_id"], r["status"]) for r in listed} == {(theirs, "completed")}
        assert b.get("/v1/receipts", params={"thread_id": ours}).json() == {"receipts": []}
        body = {"thread_id": ours, "key": CHARGE_43, "applied": False, "note": "none"}
        refused = b.post("/v1/receipts/resolve", json=body)
        assert (refused.status_code, refused.json()["type"]) == (404, "/problems/not-found")
        assert anonymous.get("/v1/receipts").status_code == 401
        # acme's chat front end reads its thread but may not touch receipts.
        assert chat.get(f"/v1/threads/{ours}").json()["version"] == 2
        for forbidden in (chat.get("/v1/receipts"), chat.post("/v1/receipts/resolve", json=body)):
            assert (forbidden.status_code, forbidden.json()["type"]) == (403, "/problems/forbidden")

        # acme lists only its own receipts, and reconciles the uncertain charge.
        assert {r["thread_id"] for r in a.get("/v1/receipts").json()["receipts"]} == {ours}
        pending = a.get("/v1/receipts", params={"status": "uncertain"}).json()["receipts"]
        assert [(r["thread_id"], r["key"]) for r in pending] == [(ours, CHARGE_43)]
        [(_, amount)] = [c for c in charges(provider) if c[0] == "pi_demo_43"]
        value = {"payment_intent_id": "pi_demo_43", "amount_cents": amount}
        resolved = a.post(
            "/v1/receipts/resolve",
            json={**body, "applied": True, "value": value, "note": "in the provider's ledger"},
        )
        assert resolved.status_code == 200, resolved.text
        assert resolved.json()["status"] == "completed"
        assert resolved.json()["resolution"]["actor"] == "alice@acme.example"
        again = a.post("/v1/receipts/resolve", json=body)
        assert (again.status_code, again.json()["type"]) == (409, "/problems/receipt-state")
        assert a.get("/v1/receipts", params={"status": "uncertain"}).json() == {"receipts": []}
        assert a.get(f"/v1/threads/{ours}").json()["version"] == 2, "globex changed nothing"

        # The console needs no token to load; its API calls do.
        page = anonymous.get("/console")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "operator console" in page.text
        assert anonymous.get("/console/console.js").status_code == 200
    assert sorted(pi for pi, _ in charges(provider)) == ["pi_demo_42", "pi_demo_43"]


class _Released(Exception):
    """Ends the lock holder's turn without committing anything."""


@contextlib.contextmanager
def holding(store_url: str, thread_id: str, tenant_id: str | None = None) -> Iterator[None]:
    """Hold ``thread_id``'s lock from this process, as a turn of another worker would:
    a turn through the store's own ``with_turn`` that waits, then aborts."""
    entered, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    async def hold() -> None:
        async with open_durability(store_url) as store:

            async def operation(tx: object) -> Any:
                entered.set()
                await asyncio.to_thread(release.wait, 60)
                raise _Released

            with contextlib.suppress(_Released):
                await store.with_turn(TurnScope(thread_id, "lock-holder", tenant_id), operation)

    def run() -> None:
        try:
            asyncio.run(hold())
        except BaseException as exc:
            failures.append(exc)
            entered.set()

    worker = threading.Thread(target=run, name="lock-holder", daemon=True)
    worker.start()
    assert entered.wait(30), "the lock holder never got the thread"
    try:
        assert failures == []
        yield
    finally:
        release.set()
        worker.join(30)
    assert failures == []


def test_a_thread_held_by_another_worker_past_the_lock_timeout_is_503_lock_timeout(
    store_url: str, tmp_path: Path, run_id: str
) -> None:
    thread = f"busy-{run_id}"
    with (
        served(store_url, provider=tmp_path / "provider.db", args=["--lock-timeout", "0.5"]) as url,
        client(url) as http,
    ):
        assert turn(http, thread, "t1", message="what do I owe on invoice 42?").status_code == 200
        with holding(store_url, thread):
            busy = turn(http, thread, "t2", message="what do I owe on invoice 43?")
            assert (busy.status_code, busy.headers["content-type"]) == (503, PROBLEM)
            assert busy.json()["type"] == "/problems/lock-timeout"
            assert busy.headers["retry-after"] == "1"
        retried = turn(http, thread, "t2", message="what do I owe on invoice 43?")
        assert retried.status_code == 200
        assert retried.headers["idempotency-replayed"] == "false", "the busy turn never ran"
        assert http.get(f"/v1/threads/{thread}").json()["version"] == 2


def test_the_demo_agent_keeps_its_provider_beside_a_sqlite_store(tmp_path: Path) -> None:
    store, elsewhere = tmp_path / "data" / "app.db", tmp_path / "cwd"
    store.parent.mkdir()
    elsewhere.mkdir()
    with (
        served(
            store,
            provider=tmp_path / "unused.db",
            agent="intention_kernel._demo:serve_agent",
            cwd=elsewhere,
        ) as url,
        client(url) as http,
    ):
        assert turn(http, "acct", "d1", message="pay invoice 42").status_code == 200
        assert turn(http, "acct", "d2", answer="accept").json()["steps"][0]["status"] == (
            "completed"
        )
    assert charges(tmp_path / "data" / "app.demo-provider.db") == [("pi_demo_42", 12_500)]
    assert list(elsewhere.iterdir()) == [], "nothing may be written to the current directory"
