"""What a request must pass before it reaches an endpoint: a JSON media type for a
body, a Host the app serves (DNS rebinding), no cross-origin browser request
without a token; and ``serve`` refusing to listen openly without tokens.

Through httpx against the ASGI app, and against real ``intention-kernel serve``
processes. The console, which the same host serves, is proven to keep working
through this guard in ``test_console.py``, in a real browser, where a page of
another origin also tries the attack itself.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from host_support import asgi_client, free_port, served
from intention_kernel import Kernel
from intention_kernel.host import create_app
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing._agents import FakeProvider, billing_agent

PROBLEM = "application/problem+json"
TURNS = "/v1/threads/t1/turns"


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
def kernel(provider: FakeProvider) -> Kernel:
    return Kernel(billing_agent(provider), InMemoryDurability())


@pytest.fixture
async def client(kernel: Kernel) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(create_app(kernel)) as client:
        yield client


async def pending_charge(client: httpx.AsyncClient) -> None:
    proposed = await client.post(TURNS, json={"turn_id": "d1", "message": "charge pi_1 500"})
    assert proposed.json()["interaction"]["kind"] == "confirmation"


async def still_pending(client: httpx.AsyncClient, provider: FakeProvider) -> None:
    thread = (await client.get("/v1/threads/t1")).json()
    assert thread["version"] == 1 and thread["interaction"] is not None
    assert provider.calls() == 0


# -- the media type of a body ----------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"],
)
async def test_a_body_not_sent_as_json_is_415_and_accepts_no_pending_charge(
    client: httpx.AsyncClient, provider: FakeProvider, content_type: str | None
) -> None:
    await pending_charge(client)
    headers = {"Content-Type": content_type} if content_type else {}
    response = await client.post(
        TURNS, content=b'{"turn_id": "d2", "answer": "accept"}', headers=headers
    )
    assert response.status_code == 415, response.text
    assert response.headers["content-type"] == PROBLEM
    assert response.headers["accept"] == "application/json"
    assert response.json()["type"] == "/problems/unsupported-media-type"
    await still_pending(client, provider)


async def test_a_resolution_not_sent_as_json_is_415(client: httpx.AsyncClient) -> None:
    body = b'{"thread_id": "t1", "key": "k", "applied": false, "note": "n"}'
    response = await client.post(
        "/v1/receipts/resolve", content=body, headers={"Content-Type": "text/plain"}
    )
    assert response.status_code == 415
    assert response.json()["type"] == "/problems/unsupported-media-type"


async def test_json_with_a_charset_parameter_is_accepted(client: httpx.AsyncClient) -> None:
    response = await client.post(
        TURNS,
        content=b'{"turn_id": "d1", "message": "balance"}',
        headers={"Content-Type": "Application/JSON; charset=utf-8"},
    )
    assert response.status_code == 200, response.text


# -- cross-origin browser requests -----------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://attacker.example"},
        {"Origin": "http://localhost:3000"},  # another origin on the same machine
        {"Origin": "null"},  # a sandboxed frame or a local file
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},
        {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"},
    ],
    ids=["foreign-origin", "other-port", "null-origin", "cross-site", "same-site"],
)
async def test_a_cross_origin_request_without_a_token_is_403_and_accepts_nothing(
    client: httpx.AsyncClient, provider: FakeProvider, headers: dict[str, str]
) -> None:
    await pending_charge(client)
    response = await client.post(TURNS, json={"turn_id": "d2", "answer": "accept"}, headers=headers)
    assert response.status_code == 403, response.text
    assert response.headers["content-type"] == PROBLEM
    assert response.json()["type"] == "/problems/cross-origin"
    read = await client.get("/v1/receipts", headers=headers)
    assert read.status_code == 403
    await still_pending(client, provider)


async def test_a_form_posted_from_another_site_is_403_although_it_navigates(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    await pending_charge(client)
    form = {
        "Sec-Fetch-Site": "cross-site",
        "Sec-Fetch-Mode": "navigate",
        "Content-Type": "text/plain",
    }
    response = await client.post(
        TURNS, content=b'{"turn_id": "d2", "answer": "accept"}', headers=form
    )
    assert response.status_code == 403
    assert response.json()["type"] == "/problems/cross-origin"
    await still_pending(client, provider)


async def test_a_request_from_the_hosts_own_origin_is_served(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    await pending_charge(client)
    own = {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"}
    response = await client.post(TURNS, json={"turn_id": "d2", "answer": "accept"}, headers=own)
    assert response.status_code == 200, response.text
    assert provider.calls() == 1


async def test_a_link_to_the_console_from_another_site_opens_it(
    client: httpx.AsyncClient,
) -> None:
    navigation = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    response = await client.get("/console?thread=t1", headers=navigation)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")


async def test_a_cross_origin_request_with_a_bearer_token_is_served(kernel: Kernel) -> None:
    app = create_app(kernel, tokens={"s3cret": "acme"})
    async with asgi_client(app, token="s3cret") as client:
        response = await client.post(
            TURNS,
            json={"turn_id": "d1", "message": "balance"},
            headers={"Origin": "https://chat.example"},
        )
    assert response.status_code == 200, response.text


# -- the Host header (DNS rebinding) ---------------------------------------------------------


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8000", "10.0.0.5", ""])
async def test_a_host_name_the_app_does_not_serve_is_400_and_reads_nothing(
    client: httpx.AsyncClient, host: str
) -> None:
    await pending_charge(client)
    for path in ("/v1/receipts", "/v1/threads/t1", "/console"):
        response = await client.get(path, headers={"Host": host})
        assert response.status_code == 400, (path, response.text)
        assert response.headers["content-type"] == PROBLEM
        assert response.json()["type"] == "/problems/host-not-allowed"
        assert "t1" not in response.text


@pytest.mark.parametrize("host", ["localhost:8000", "127.0.0.1", "127.0.0.1:8000", "[::1]:8000"])
async def test_loopback_host_names_are_served_by_default(
    client: httpx.AsyncClient, host: str
) -> None:
    response = await client.get("/healthz", headers={"Host": host})
    assert response.status_code == 200, response.text


async def test_allowed_hosts_add_names_and_subdomains(kernel: Kernel) -> None:
    app = create_app(kernel, allowed_hosts=["ops.example.com", "*.internal.example"])
    async with asgi_client(app) as client:
        for host in (
            "ops.example.com",
            "OPS.example.com:8443",
            "a.b.internal.example",
            "localhost",
        ):
            response = await client.get("/healthz", headers={"Host": host})
            assert response.status_code == 200, host
        for host in ("example.com", "internal.example", "ops.example.com.attacker.example"):
            response = await client.get("/healthz", headers={"Host": host})
            assert response.status_code == 400, host


@pytest.mark.parametrize(
    "pattern", ["http://ops.example.com", "ops.example.com:8000", "a.*.example", "*example.com", ""]
)
def test_a_malformed_allowed_host_is_refused(kernel: Kernel, pattern: str) -> None:
    with pytest.raises(ValueError, match="allowed host"):
        create_app(kernel, allowed_hosts=[pattern])


# -- a real host process ---------------------------------------------------------------------


def serve_command(*args: str) -> list[str]:
    agent = ["--agent", "host_support:billing_agent", "--port", str(free_port())]
    return [sys.executable, "-m", "intention_kernel", "serve", *agent, *args]


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "192.0.2.10"])
def test_serve_on_a_non_loopback_address_without_tokens_refuses_to_start(
    tmp_path: Path, bind: str
) -> None:
    store = tmp_path / "host.db"
    done = subprocess.run(
        serve_command("--db", f"sqlite:///{store}", "--host", bind),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOST_TEST_PROVIDER_DB": str(tmp_path / "p.db")},
        cwd=Path(__file__).parent,
    )
    assert done.returncode == 2, done.stderr
    message = " ".join(done.stderr.split())
    assert f"--host {bind} is not a loopback address and no --token is given" in message
    assert "--insecure" in message
    assert "Traceback" not in done.stderr
    assert not store.exists()  # refused before anything was opened


@pytest.mark.slow
def test_serve_on_every_address_starts_with_insecure_and_still_checks_the_host(
    tmp_path: Path,
) -> None:
    with served(
        tmp_path / "host.db", args=["--host", "0.0.0.0", "--insecure", "--allowed-host", "ops.test"]
    ) as url:
        assert httpx.get(f"{url}/healthz", headers={"Host": "ops.test:80"}).status_code == 200
        rebound = httpx.get(f"{url}/v1/receipts", headers={"Host": "attacker.example"})
        assert rebound.status_code == 400
        assert rebound.json()["type"] == "/problems/host-not-allowed"


@pytest.mark.slow
def test_a_served_host_refuses_a_cross_site_post_of_an_acceptance(tmp_path: Path) -> None:
    with served(tmp_path / "host.db") as url:
        turns = f"{url}/v1/threads/acct-acme/turns"
        proposed = httpx.post(turns, json={"turn_id": "d1", "message": "pay invoice 42"})
        assert proposed.json()["interaction"] is not None
        # What a page on another site sends with fetch(..., {mode: "no-cors"}).
        forged = httpx.post(
            turns,
            content=b'{"turn_id": "d2", "answer": "accept"}',
            headers={
                "Content-Type": "text/plain;charset=UTF-8",
                "Origin": "http://attacker.example",
                "Sec-Fetch-Site": "cross-site",
                "Sec-Fetch-Mode": "no-cors",
            },
        )
        assert forged.status_code == 403
        thread = httpx.get(f"{url}/v1/threads/acct-acme").json()
        assert thread["version"] == 1 and thread["interaction"] is not None
