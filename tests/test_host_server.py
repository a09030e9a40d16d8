"""``intention-kernel serve`` on a real socket, the agent loader, and schemathesis
fuzzing the app against its own ``/openapi.json``."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, seed, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.schemas import BaseSchema

from host_support import TESTS_DIR, served
from intention_kernel import Agent, Kernel
from intention_kernel.cli._common import load_agent
from intention_kernel.cli._serve import parse_tokens
from intention_kernel.host import Principal, create_app
from intention_kernel.testing import InMemoryDurability, faults
from intention_kernel.testing._agents import FakeProvider, billing_agent

# -- a real process on loopback --------------------------------------------------------------


@pytest.mark.slow
def test_served_billing_agent_confirms_and_replays_over_real_http(tmp_path: Path) -> None:
    db = tmp_path / "host.db"
    with served(db) as base_url, httpx.Client(base_url=base_url, timeout=30) as client:
        url = "/v1/threads/acct-acme/turns"
        proposed = client.post(
            url, json={"message": "pay invoice 42"}, headers={"Idempotency-Key": "d1"}
        )
        assert proposed.status_code == 200
        assert proposed.json()["interaction"]["prompt"].startswith("Charge $125.00")
        accepted = client.post(url, json={"turn_id": "d2", "answer": "accept"})
        assert accepted.status_code == 200
        assert accepted.headers["idempotency-replayed"] == "false"
        assert accepted.json()["reply"].startswith("Charged $125.00 for invoice 42")
        retried = client.post(url, json={"turn_id": "d2", "answer": "accept"})
        assert retried.headers["idempotency-replayed"] == "true"
        assert retried.json() == {**accepted.json(), "replayed": True}
        conflict = client.post(url, json={"turn_id": "d2", "message": "pay invoice 43"})
        assert conflict.status_code == 409
        assert conflict.headers["content-type"] == "application/problem+json"
        thread = client.get("/v1/threads/acct-acme").json()
        assert thread["version"] == 2
        assert thread["facts"][0]["key"] == "invoice.42.payment"
    with sqlite3.connect(db) as conn:
        [(charges,)] = conn.execute("SELECT COUNT(*) FROM demo_provider_charges")
    assert charges == 1


@pytest.mark.slow
def test_served_host_with_tokens_refuses_anonymous_calls(tmp_path: Path) -> None:
    tokens = {"s3cret": "acme;role=operator;principal=alice", "chat": "acme"}
    with served(tmp_path / "host.db", tokens=tokens) as base_url:
        assert httpx.get(f"{base_url}/v1/receipts").status_code == 401
        authorized = httpx.get(
            f"{base_url}/v1/receipts", headers={"Authorization": "Bearer s3cret"}
        )
        assert authorized.json() == {"receipts": []}
        # Today's form, TOKEN=TENANT, is a user of the tenant: no receipts.
        user = httpx.get(f"{base_url}/v1/receipts", headers={"Authorization": "Bearer chat"})
        assert (user.status_code, user.json()["type"]) == (403, "/problems/forbidden")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "loop"), [((), "uvloop"), (("--loop", "asyncio"), "asyncio")], ids=["auto", "asyncio"]
)
def test_serve_runs_on_uvloop_where_installed_or_on_the_loop_it_is_told(
    tmp_path: Path, args: tuple[str, ...], loop: str
) -> None:
    pytest.importorskip("uvloop", reason="the http extra installs uvloop except on Windows")
    log = tmp_path / "host.log"
    with served(tmp_path / "host.db", args=args, log_path=log) as base_url:
        turn = httpx.post(
            f"{base_url}/v1/threads/acct-acme/turns",
            json={"turn_id": "t1", "message": "pay invoice 42"},
            timeout=30,
        )
        assert turn.status_code == 200
        assert turn.json()["interaction"]["prompt"].startswith("Charge $125.00")
    started = " ".join(log.read_text().split())
    assert f"· {loop} event loop ·" in started


def test_serve_refuses_loop_uvloop_when_uvloop_is_missing(tmp_path: Path) -> None:
    # A sitecustomize that makes ``import uvloop`` fail, as on a machine without it.
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['uvloop'] = None\n")
    command = [sys.executable, "-m", "intention_kernel", "serve", "--port", "1"]
    command += ["--agent", "host_support:billing_agent", "--loop", "uvloop"]
    path = os.pathsep.join(
        filter(None, [str(blocker), str(TESTS_DIR), os.environ.get("PYTHONPATH")])
    )
    env = {"PYTHONPATH": path, "HOST_TEST_PROVIDER_DB": str(tmp_path / "p.db")}
    run = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=False
    )
    assert run.returncode == 2
    assert "--loop uvloop needs uvloop" in " ".join(run.stderr.split())
    assert not (tmp_path / "intention-kernel.db").exists()  # refused before opening a store


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--agent", "no_such_module:agent"], "cannot import"),
        (["--agent", "host_support"], "module:attribute"),
        (["--agent", "host_support:TESTS_DIR"], "not an Agent"),
        (["--agent", "host_support:served"], "without arguments"),
        (["--agent", "host_support:billing_agent", "--token", "nosecret"], "TOKEN=TENANT"),
        (["--agent", "host_support:billing_agent", "--db", "mysql://x"], "unknown durability"),
        (
            [
                "--agent",
                "host_support:billing_agent",
                "--db",
                "postgresql://h/db?lock_timeout=5",
                "--lock-timeout",
                "1",
            ],
            "lock_timeout= twice",
        ),
    ],
)
def test_serve_refuses_a_bad_agent_token_or_store(
    arguments: list[str], message: str, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "intention_kernel", "serve", "--port", "1", *arguments]
    # The caller's PYTHONPATH too, so that a checkout run without installing is the code
    # under test.
    path = os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": path, "HOST_TEST_PROVIDER_DB": str(tmp_path / "p.db")}
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 2
    assert message in " ".join(run.stderr.split())


# -- the agent loader ------------------------------------------------------------------------


def test_an_agent_may_be_an_object_or_a_zero_argument_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOST_TEST_PROVIDER_DB", str(tmp_path / "p.db"))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "my_agents.py").write_text(
        "import host_support\nAGENT = host_support.billing_agent()\n"
        "class Holder:\n    factory = staticmethod(host_support.billing_agent)\n"
    )
    assert isinstance(load_agent("my_agents:AGENT"), Agent)
    assert isinstance(load_agent("my_agents:Holder.factory"), Agent)
    with pytest.raises(ValueError, match="'missing' not found"):
        load_agent("my_agents:missing")


def test_a_factory_that_takes_db_url_is_given_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOST_TEST_PROVIDER_DB", str(tmp_path / "p.db"))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "url_agents.py").write_text(
        "import host_support\nseen = []\n"
        "def factory(db_url=None):\n"
        "    seen.append(db_url)\n"
        "    return host_support.billing_agent()\n"
    )
    url_agents = importlib.import_module("url_agents")  # written above, at run time

    assert isinstance(load_agent("url_agents:factory", db_url="sqlite:///app.db"), Agent)
    assert isinstance(load_agent("url_agents:factory"), Agent)
    assert isinstance(load_agent("host_support:billing_agent", db_url="sqlite:///app.db"), Agent)
    assert url_agents.seen == ["sqlite:///app.db", None]


def test_tokens_map_secrets_to_principals_and_todays_form_is_a_user_of_its_tenant() -> None:
    assert parse_tokens(["a=acme", " c=globex "]) == {
        "a": Principal("acme", "acme", "user"),
        "c": Principal("globex", "globex", "user"),
    }
    assert parse_tokens(
        [
            "k7=acme;role=operator;principal=alice@acme.example",
            "r1=;role=operator;principal=root",
            "f2=acme; principal = chat ;role=user",
            "e3=a=b",
        ]
    ) == {
        "k7": Principal("alice@acme.example", "acme", "operator"),
        "r1": Principal("root", None, "operator"),
        "f2": Principal("chat", "acme", "user"),
        "e3": Principal("a=b", "a=b", "user"),
    }
    with pytest.raises(ValueError, match="twice"):
        parse_tokens(["a=x", "a=y"])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("s3cret=", "has no tenant and names no principal"),
        ("s3cret=;role=operator", "has no tenant and names no principal"),
        ("s3cret=acme;role=operator", "an operator names its principal"),
        ("s3cret=acme;role=admin;principal=a", "role is user or operator"),
        ("s3cret=acme;colour=red", "unknown attribute"),
        ("s3cret=ac;me", "unknown attribute"),
        ("s3cret=acme;principal=", "principal= needs a name"),
        ("s3cret=acme;role=user;role=operator", "role= is given twice"),
        ("s3cret", "must look like TOKEN=TENANT"),
    ],
)
def test_a_token_whose_role_or_principal_is_unclear_is_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as refused:
        parse_tokens([spec])
    assert "s3cret" not in str(refused.value), "the secret is never repeated"


# -- schemathesis against the app's own document -----------------------------------------
# Two apps are each fuzzed against their own /openapi.json. One has no authentication.
# The other has a bearer token bound to a tenant, sent with every case.
# Schemathesis's ignored_auth check then also proves that a missing or wrong token is
# refused with 401. Each app's store is seeded with receipts an operator can resolve.
# They are uncertain, or prepared by an attempt that died. Positive resolve cases are
# pointed at them in turn. So the success path (200) and the resolved-again refusal
# (409) are exercised, not only 404. Positive turns get a turn ID of their own, so they run
# instead of colliding as 409s. Bounded (max_examples) and seeded; the CI profile
# derandomizes besides (tests/conftest.py).

FUZZ_TOKEN = "fuzz-token-a"
FUZZ_TENANT = "tenant-a"
#: Resolvable receipts seeded per app: uncertain ones and ones left prepared.
SEEDED_UNCERTAIN = 10
SEEDED_PREPARED = 4
RESOLVE_KEY = "payments.charge:charge:pi_9"


@dataclass
class FuzzTarget:
    """One fuzzed app, the receipts seeded in its store, and what the cases hit."""

    schema: BaseSchema
    seeded: list[tuple[str, str]]
    turn_ids: Iterator[str] = field(default_factory=lambda: (f"fuzz-{n}" for n in count(1)))
    resolves: Iterator[int] = field(default_factory=count)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)


def fuzz_target(tokens: dict[str, Principal | str | None] | None) -> FuzzTarget:
    provider = FakeProvider(behaviour={"pi_9": "lost_response"})
    kernel = Kernel(billing_agent(provider), InMemoryDurability(lock_timeout=5.0))
    tenant = FUZZ_TENANT if tokens else None

    async def seed() -> list[tuple[str, str]]:
        threads = []
        for n in range(SEEDED_UNCERTAIN + SEEDED_PREPARED):
            thread = f"seeded-{n}"
            await kernel.turn(thread, "seed-1", "charge pi_9 700", tenant_id=tenant)
            if n < SEEDED_UNCERTAIN:
                result = await kernel.turn(thread, "seed-2", "yes", tenant_id=tenant)
                assert result.steps[0].status == "uncertain"
            else:
                with (
                    faults.injected(faults.AFTER_RECEIPT_PREPARED, "raise"),
                    contextlib.suppress(faults.InjectedFault),
                ):
                    await kernel.turn(thread, "seed-2", "yes", tenant_id=tenant)
            threads.append((thread, RESOLVE_KEY))
        statuses = Counter(r.status.value for r in await kernel.durability.list_receipts())
        assert statuses == {"uncertain": SEEDED_UNCERTAIN, "prepared": SEEDED_PREPARED}
        return threads

    # The token goes through schemathesis's auth configuration, not a fixed header: it
    # then leaves it out of the negative cases that test a missing Authorization header,
    # and its ignored_auth check knows the token is valid and probes without one.
    config = SchemathesisConfig.from_dict(
        {"auth": {"openapi": {"bearer": {"bearer": FUZZ_TOKEN}}}} if tokens else {}
    )
    app = create_app(kernel, tokens=tokens, allowed_hosts=["testserver"])  # schemathesis's Host
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    return FuzzTarget(schema, asyncio.run(seed()))


# Module level, as schemathesis parametrizes at collection time: one test per operation.
# The fuzz tests run in one process, in file order, after the parallel suite. Under
# pytest-xdist schemathesis runs each schema as one test of subtests. That fuzzed the
# first operation only, and the coverage check below ran in another worker.
pytestmark = pytest.mark.serial

OPEN = fuzz_target(None)
WITH_TOKENS = fuzz_target(
    {FUZZ_TOKEN: Principal("fuzzer", FUZZ_TENANT, "operator"), "fuzz-token-b": "tenant-b"}
)

FUZZ_SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# A case of the OpenAPI document's operations; this test reads only their path.
FuzzCase = schemathesis.Case[schemathesis.APIOperation[Any, Any, Any, Any]]


def keeps_its_promises(target: FuzzTarget, case: FuzzCase) -> None:
    """No 5xx, every response as documented, schema-invalid requests refused and
    schema-valid ones accepted."""
    positive = bool(case.meta and case.meta.generation.mode.is_positive)
    path = case.operation.path
    if positive and path.endswith("/turns"):
        own_turn_id(case, next(target.turn_ids))
    if positive and path == "/v1/receipts/resolve" and isinstance(case.body, dict):
        # Every other case resolves a seeded receipt, each twice in a row: the first
        # time 200, then 409. Twice in a row, so a few cases reach both answers.
        n = next(target.resolves)
        if n % 2 == 0:
            thread_id, key = target.seeded[(n // 4) % len(target.seeded)]
            case.body.update(thread_id=thread_id, key=key)
    response = case.call_and_validate()
    target.statuses[(path, response.status_code)] += 1


@OPEN.schema.parametrize()
@seed(20261129)
@FUZZ_SETTINGS
def test_the_open_app_keeps_every_promise_of_its_openapi_document(
    case: FuzzCase,
) -> None:
    keeps_its_promises(OPEN, case)


@WITH_TOKENS.schema.parametrize()
@seed(20261130)
@FUZZ_SETTINGS
def test_the_app_with_tokens_keeps_every_promise_of_its_openapi_document(
    case: FuzzCase,
) -> None:
    keeps_its_promises(WITH_TOKENS, case)


@pytest.mark.parametrize("target", [OPEN, WITH_TOKENS], ids=["open", "tokens"])
def test_the_fuzzing_reached_the_resolve_success_path(
    target: FuzzTarget, request: pytest.FixtureRequest
) -> None:
    """The fuzz tests above (run first, in file order) resolved seeded receipts and were
    refused when resolving them again, and ran turns rather than colliding."""
    resolved = {status for (path, status) in target.statuses if path == "/v1/receipts/resolve"}
    if not resolved:
        pytest.skip("the resolve operation was not fuzzed in this run (deselected)")
    assert {200, 409} <= resolved, target.statuses
    turns = Counter(
        {status: n for (path, status), n in target.statuses.items() if path.endswith("/turns")}
    )
    if turns:
        assert turns[200] > turns[409], turns


def own_turn_id(case: FuzzCase, turn_id: str) -> None:
    """Apply the one rule of a turn that OpenAPI cannot state: the turn ID comes from the
    body or the Idempotency-Key header, and not two different ones (otherwise 400/422).
    Every positive case gets a turn ID of its own: a reused one would be a 409 conflict."""
    if not isinstance(case.body, dict):
        return
    headers = case.headers if case.headers is not None else {}
    if headers.get("Idempotency-Key") is not None:
        case.body.pop("turn_id", None)
        headers["Idempotency-Key"] = turn_id
        case.headers = headers
    else:
        case.body["turn_id"] = turn_id
