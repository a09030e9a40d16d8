"""``intention-kernel serve`` on a real socket, the agent loader, and schemathesis
fuzzing the app against its own ``/openapi.json``."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, seed, settings

from host_support import TESTS_DIR, demo_agent, served
from intention_kernel import Agent, Kernel
from intention_kernel.cli._common import load_agent
from intention_kernel.cli.serve import parse_tokens
from intention_kernel.host import create_app
from intention_kernel.testing import InMemoryDurability

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
    with served(tmp_path / "host.db", tokens={"s3cret": "acme"}) as base_url:
        assert httpx.get(f"{base_url}/v1/receipts").status_code == 401
        authorized = httpx.get(
            f"{base_url}/v1/receipts", headers={"Authorization": "Bearer s3cret"}
        )
        assert authorized.json() == {"receipts": []}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--agent", "no_such_module:agent"], "cannot import"),
        (["--agent", "host_support"], "module:attribute"),
        (["--agent", "host_support:TESTS_DIR"], "not an Agent"),
        (["--agent", "host_support:served"], "without arguments"),
        (["--agent", "host_support:billing_agent", "--token", "nosecret"], "TOKEN=TENANT"),
        (["--agent", "host_support:billing_agent", "--db", "mysql://x"], "unknown durability"),
    ],
)
def test_serve_refuses_a_bad_agent_token_or_store(
    arguments: list[str], message: str, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "intention_kernel", "serve", "--port", "1", *arguments]
    env = {"PYTHONPATH": str(TESTS_DIR), "HOST_TEST_PROVIDER_DB": str(tmp_path / "p.db")}
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


def test_tokens_map_secrets_to_tenants() -> None:
    assert parse_tokens(["a=acme", "b=", " c=globex "]) == {"a": "acme", "b": None, "c": "globex"}
    with pytest.raises(ValueError, match="twice"):
        parse_tokens(["a=x", "a=y"])


# -- schemathesis against the app's own document -----------------------------------------


# Module level, as schemathesis parametrizes at collection time: one test per operation.
_FUZZ_DIR = Path(tempfile.mkdtemp(prefix="ik-host-fuzz-"))
_FUZZ_APP = create_app(
    Kernel(demo_agent(_FUZZ_DIR / "provider.db"), InMemoryDurability(lock_timeout=5.0))
)
schema = schemathesis.openapi.from_asgi("/openapi.json", _FUZZ_APP)


@pytest.fixture(scope="module", autouse=True)
def _remove_fuzz_dir() -> Iterator[None]:
    yield
    shutil.rmtree(_FUZZ_DIR, ignore_errors=True)


@schema.parametrize()
@seed(20261129)
@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_the_app_keeps_every_promise_of_its_openapi_document(case: schemathesis.Case) -> None:
    """No 5xx, every response as documented, schema-invalid requests refused and
    schema-valid ones accepted."""
    if (
        case.operation.path.endswith("/turns")
        and case.meta
        and case.meta.generation.mode.is_positive
    ):
        one_turn_id(case)
    case.call_and_validate()


def one_turn_id(case: schemathesis.Case) -> None:
    """Apply the one rule of a turn that OpenAPI cannot state: the turn ID comes from the
    body or the Idempotency-Key header, and not two different ones (otherwise 400/422)."""
    headers = case.headers if case.headers is not None else {}
    header = headers.get("Idempotency-Key")
    if not isinstance(case.body, dict):
        return
    if case.body.get("turn_id") is None and header is None:
        case.body["turn_id"] = "fuzz-turn"
    elif case.body.get("turn_id") is not None and header is not None:
        del headers["Idempotency-Key"]
