"""Problem details for every failure, authentication, and tenant isolation over HTTP."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from host_support import asgi_client
from intention_kernel import (
    CheckpointCompatibilityError,
    CorruptRecordError,
    FencedCommitError,
    InterpretationError,
    InvalidRequestError,
    Kernel,
    KernelError,
    ShuttingDownError,
    SteerOrphanedError,
    StoreError,
    TenantMismatchError,
    ThreadBusyError,
    ThreadLockTimeoutError,
    TurnCancelledError,
    TurnConflictError,
    TurnExpiredError,
    TurnResult,
    TurnScope,
)
from intention_kernel.durability import TurnOperation
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.host import PROBLEM_TYPES, Principal, create_app
from intention_kernel.testing import InMemoryDurability, ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import damage_sqlite_table

TOKENS: dict[str, Principal | str | None] = {
    "tok-acme": Principal("alice@acme.example", "acme", "operator"),
    "tok-globex": Principal("gina@globex.example", "globex", "operator"),
    "tok-ops": Principal("oscar@example.com", None, "operator"),
    "tok-acme-chat": "acme",  # a chat front end: a user of acme
}


class FailingDurability(InMemoryDurability):
    """Raises ``error`` from every turn, as a store or the kernel might."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    async def with_turn(
        self, scope: TurnScope, operation: TurnOperation, *, wait: bool = True
    ) -> TurnResult:
        raise self.error


@pytest.mark.parametrize(
    ("error", "status", "slug"),
    [
        (InvalidRequestError("bad id"), 422, "invalid-request"),
        (TurnConflictError("used"), 409, "turn-conflict"),
        (TurnExpiredError("pruned"), 409, "turn-expired"),
        (TurnCancelledError("dequeued"), 409, "turn-cancelled"),
        (TenantMismatchError("theirs", thread_id="t1"), 404, "not-found"),
        (CheckpointCompatibilityError("newer"), 409, "incompatible-checkpoint"),
        (CorruptRecordError("garbled"), 500, "corrupt-record"),
        (InterpretationError("model down"), 502, "interpretation-failed"),
        (ThreadBusyError("busy"), 409, "thread-busy"),
        (SteerOrphanedError("orphaned", taken_by="d0"), 409, "steer-orphaned"),
        (ThreadLockTimeoutError("waited"), 503, "lock-timeout"),
        (FencedCommitError("moved"), 503, "turn-fenced"),
        (StoreError("disk gone"), 503, "store-unavailable"),
        (ShuttingDownError("draining"), 503, "shutting-down"),
        (KernelError("inconsistent"), 500, "internal-error"),
        (RuntimeError("secret internals"), 500, "internal-error"),
    ],
)
async def test_every_error_is_a_problem_with_a_stable_type(
    error: BaseException, status: int, slug: str
) -> None:
    kernel = Kernel(billing_agent(FakeProvider()), FailingDurability(error))
    async with asgi_client(create_app(kernel)) as client:
        response = await client.post("/v1/threads/t1/turns", json={"turn_id": "d1", "message": "x"})
    assert response.status_code == status
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == f"/problems/{slug}"
    assert problem["status"] == status
    assert problem["title"] == PROBLEM_TYPES[slug].title
    assert problem["thread_id"] == "t1"
    if isinstance(error, KernelError):
        assert problem["turn_id"] == "d1"
    if isinstance(error, SteerOrphanedError):  # the turn ID to deliver again
        assert problem["taken_by"] == "d0"
    else:
        assert "taken_by" not in problem
    assert "secret internals" not in response.text
    if status == 503:
        assert int(response.headers["retry-after"]) >= 1


async def test_a_lock_timeout_is_503_lock_timeout_with_retry_after() -> None:
    """An agent that waits (``on_busy="wait"``) gave up after the store's lock timeout:
    503, the store's problem, not the person's."""
    provider = FakeProvider(behaviour={"pi_1": "block"})
    kernel = Kernel(billing_agent(provider), InMemoryDurability(lock_timeout=0.05))
    async with asgi_client(create_app(kernel)) as client:
        url = "/v1/threads/t1/turns"
        await client.post(url, json={"turn_id": "d1", "message": "charge pi_1 5"})
        holder = asyncio.create_task(client.post(url, json={"turn_id": "d2", "answer": "accept"}))
        await provider.entered.wait()
        busy = await client.post(url, json={"turn_id": "d3", "message": "balance"})
        provider.released.set()
        assert (await holder).status_code == 200
    assert busy.status_code == 503
    assert busy.json()["type"] == "/problems/lock-timeout"
    assert busy.json()["thread_id"] == "t1"
    assert busy.headers["retry-after"] == "1"


async def test_a_thread_of_an_incompatible_agent_is_409_and_shown_incompatible() -> None:
    store = InMemoryDurability()
    old = Kernel(billing_agent(FakeProvider()), store)
    await old.turn("t1", "d1", "balance")
    new = Kernel(billing_agent(FakeProvider(), version="2"), store)
    async with asgi_client(create_app(new)) as client:
        response = await client.post("/v1/threads/t1/turns", json={"turn_id": "d2", "message": "x"})
        thread = (await client.get("/v1/threads/t1")).json()
    assert response.status_code == 409
    assert response.json()["type"] == "/problems/incompatible-checkpoint"
    assert thread["compatible"] is False
    assert thread["agent_fingerprint"] == old.fingerprint


async def test_an_interpreter_failure_is_502_and_commits_nothing() -> None:
    def broken(request: object) -> object:
        raise ConnectionError("model endpoint unreachable")

    agent = billing_agent(FakeProvider(), interpreter=ScriptedInterpreter(broken))  # type: ignore[arg-type]
    kernel = Kernel(agent, InMemoryDurability())
    async with asgi_client(create_app(kernel)) as client:
        response = await client.post("/v1/threads/t1/turns", json={"turn_id": "d1", "message": "x"})
        after = await client.get("/v1/threads/t1")
    assert response.status_code == 502
    assert response.json()["type"] == "/problems/interpretation-failed"
    assert after.status_code == 404


async def test_routing_errors_are_problems_too() -> None:
    kernel = Kernel(billing_agent(FakeProvider()), InMemoryDurability())
    async with asgi_client(create_app(kernel)) as client:
        missing = await client.get("/v2/anything")
        wrong = await client.delete("/v1/threads/t1/turns")
        types = await client.get("/problems")
        described = [await client.get(t["type"]) for t in types.json()]
    assert (missing.status_code, missing.json()["type"]) == (404, "/problems/not-found")
    assert (wrong.status_code, wrong.json()["type"]) == (405, "/problems/method-not-allowed")
    assert wrong.headers["allow"] == "POST"
    assert [r.json()["title"] for r in described] == [t.title for t in PROBLEM_TYPES.values()]


def test_importing_the_host_without_starlette_names_the_extra() -> None:
    code = "import sys; sys.modules['starlette'] = None; import intention_kernel.host"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode != 0
    assert "pip install 'intention-kernel[http]'" in run.stderr


# -- authentication and tenants --------------------------------------------------------------


@pytest.fixture
async def tenants() -> Kernel:
    return Kernel(
        billing_agent(FakeProvider(behaviour={"pi_9": "lost_response"})), InMemoryDurability()
    )


async def test_every_api_call_needs_a_known_bearer_token(tenants: Kernel) -> None:
    app = create_app(tenants, tokens=TOKENS)
    async with asgi_client(app) as anonymous, asgi_client(app, "wrong") as stranger:
        for client in (anonymous, stranger):
            response = await client.get("/v1/receipts")
            assert response.status_code == 401
            assert response.json()["type"] == "/problems/unauthorized"
            assert response.headers["www-authenticate"].startswith("Bearer")
        assert (await anonymous.get("/healthz")).status_code == 200
        assert (await anonymous.get("/openapi.json")).status_code == 200
        assert (await anonymous.get("/console")).status_code == 200


async def test_a_tenant_never_sees_or_touches_another_tenants_thread(tenants: Kernel) -> None:
    app = create_app(tenants, tokens=TOKENS)
    async with asgi_client(app, "tok-acme") as acme, asgi_client(app, "tok-globex") as globex:
        url = "/v1/threads/acct-1/turns"
        await acme.post(url, json={"turn_id": "d1", "message": "charge pi_9 70"})
        await acme.post(url, json={"turn_id": "d2", "answer": "accept"})
        [receipt] = (await acme.get("/v1/receipts")).json()["receipts"]

        theirs = await globex.get("/v1/threads/acct-1")
        unknown = await globex.get("/v1/threads/acct-404")
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.json()["detail"] == "no thread 'acct-1'"
        posted = await globex.post(url, json={"turn_id": "g1", "message": "balance"})
        assert posted.status_code == 404
        assert posted.json()["detail"] == "no thread 'acct-1'"
        assert (await globex.get("/v1/receipts")).json() == {"receipts": []}
        body = {"thread_id": "acct-1", "key": receipt["key"], "applied": False, "note": "n"}
        refused = await globex.post("/v1/receipts/resolve", json=body)
        assert refused.status_code == 404

        resolved = await acme.post("/v1/receipts/resolve", json=body)
        assert resolved.status_code == 200
        assert resolved.json()["resolution"]["actor"] == "alice@acme.example"
    result = await tenants.turn("acct-1", "d9", "balance", tenant_id="acme")
    assert result.reply == "You owe 4200."


async def test_a_token_without_a_tenant_sees_only_threads_without_one(tenants: Kernel) -> None:
    await tenants.turn("shared", "d1", "balance")
    await tenants.turn("acme-only", "d1", "balance", tenant_id="acme")
    app = create_app(tenants, tokens=TOKENS)
    async with asgi_client(app, "tok-ops") as ops:
        assert (await ops.get("/v1/threads/shared")).status_code == 200
        assert (await ops.get("/v1/threads/acme-only")).status_code == 404


async def test_a_user_token_runs_turns_and_reads_but_may_not_list_or_resolve_receipts(
    tenants: Kernel,
) -> None:
    app = create_app(tenants, tokens=TOKENS)
    async with asgi_client(app, "tok-acme-chat") as chat, asgi_client(app, "tok-acme") as ops:
        url = "/v1/threads/acct-1/turns"
        assert (
            await chat.post(url, json={"turn_id": "d1", "message": "charge pi_9 70"})
        ).is_success
        accepted = await chat.post(url, json={"turn_id": "d2", "answer": "accept"})
        assert accepted.json()["steps"][0]["status"] == "uncertain"
        assert (await chat.get("/v1/threads/acct-1")).json()["version"] == 2
        key = "payments.charge:charge:pi_9"
        body = {"thread_id": "acct-1", "key": key, "applied": False, "note": "none"}
        for refused in (
            await chat.get("/v1/receipts"),
            await chat.get("/v1/receipts", params={"thread_id": "acct-1"}),
            await chat.post("/v1/receipts/resolve", json=body),
        ):
            assert refused.status_code == 403
            assert refused.headers["content-type"] == "application/problem+json"
            assert refused.json()["type"] == "/problems/forbidden"
            assert "needs an operator token" in refused.json()["detail"]
        [receipt] = (await ops.get("/v1/receipts")).json()["receipts"]
        assert (receipt["status"], receipt["resolution"]) == ("uncertain", None)
        resolved = await ops.post("/v1/receipts/resolve", json=body)
        assert resolved.json()["resolution"]["actor"] == "alice@acme.example"


def test_a_principal_needs_a_name_and_a_known_role() -> None:
    for name in ("", "  "):
        with pytest.raises(ValueError, match="needs a name"):
            Principal(name, "acme", "operator")
    with pytest.raises(ValueError, match="'user' or 'operator'"):
        Principal("alice", "acme", "admin")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NUL"):
        Principal("alice", "ac\x00me")


def test_tokens_need_a_store_that_knows_thread_owners() -> None:
    class Opaque:
        pass

    kernel = Kernel(billing_agent(FakeProvider()), Opaque())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="thread_owner"):
        create_app(kernel, tokens=TOKENS)


async def test_the_openapi_document_says_what_needs_an_operator_and_a_note(
    tenants: Kernel,
) -> None:
    async with asgi_client(create_app(tenants, tokens=TOKENS)) as anonymous:
        document = (await anonymous.get("/openapi.json")).json()
    paths = document["paths"]

    def refusals(path: str, method: str, at: Any = None) -> list[str]:
        """The problem types an operation declares for 403."""
        responses = (at or paths)[path][method]["responses"]
        schema = responses["403"]["content"]["application/problem+json"]["schema"]
        return [uri.rsplit("/", 1)[-1] for uri in schema["allOf"][1]["properties"]["type"]["enum"]]

    assert "forbidden" in refusals("/v1/receipts", "get")
    assert "forbidden" in refusals("/v1/receipts/resolve", "post")
    assert "forbidden" in refusals("/v1/interactions", "get")
    # Every operation may meet the request guard's 403; only the role's is limited.
    # A turn is refused as forbidden when its answer names another actor than the token's.
    assert sorted(refusals("/v1/threads/{thread_id}/turns", "post")) == [
        "cross-origin",
        "forbidden",
    ]
    assert refusals("/v1/threads/{thread_id}", "get") == ["cross-origin"]
    assert refusals("/v1/threads/{thread_id}/turns/{turn_id}", "delete") == ["cross-origin"]
    body = document["components"]["schemas"]["ResolveBody"]
    assert "note" in body["required"]
    assert {"properties": {"applied": {"const": True}}, "required": ["value"]} in body["anyOf"]
    async with asgi_client(create_app(tenants)) as open_app:
        unauthenticated = (await open_app.get("/openapi.json")).json()["paths"]
    assert refusals("/v1/receipts/resolve", "post", unauthenticated) == ["cross-origin"]


async def test_a_damaged_sqlite_store_is_500_corrupt_not_503_retry(tmp_path: Path) -> None:
    """Retrying cannot help: the answer must not tell the client to retry (no 503, no
    Retry-After), but that the store needs repair."""
    path = tmp_path / "app.db"
    async with SQLiteDurability(path) as store:
        await Kernel(billing_agent(FakeProvider()), store).turn("t1", "d1", "balance")
    damage_sqlite_table(path, "ik_threads")
    async with SQLiteDurability(path) as store:
        kernel = Kernel(billing_agent(FakeProvider()), store)
        async with asgi_client(create_app(kernel)) as client:
            turn = await client.post("/v1/threads/t1/turns", json={"turn_id": "d2", "message": "x"})
            thread = await client.get("/v1/threads/t1")
    for response in (turn, thread):
        assert response.status_code == 500, response.text
        assert response.json()["type"] == "/problems/corrupt-record"
        assert "is damaged" in response.json()["detail"]
        assert "retry-after" not in response.headers
