"""Support for the HTTP host tests: an in-process app and a real served process.

- :func:`billing_agent` is a zero-argument factory for ``intention-kernel serve
  --agent host_support:billing_agent``: the demo's billing agent, its fake payment
  provider recording charges in ``$HOST_TEST_PROVIDER_DB`` and losing the response
  to the first charge of each payment intent in ``$HOST_TEST_LOST_RESPONSES``.
- :func:`served` starts ``intention-kernel serve`` in a real process on a free
  loopback port (on a SQLite file or any store URL), waits until ``/healthz``
  answers, and stops it afterwards.
- :func:`serving_in_thread` serves an app on a free loopback port from a thread of
  this process, so that a test keeps its hands on the agent's provider.
- :func:`asgi_client` talks to an app in process, without a socket.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette

from intention_kernel import Agent
from intention_kernel._demo import FakePaymentProvider, build_agent

TESTS_DIR = Path(__file__).resolve().parent
PROVIDER_ENV = "HOST_TEST_PROVIDER_DB"
LOST_RESPONSES_ENV = "HOST_TEST_LOST_RESPONSES"


def billing_agent() -> Agent:
    """The demo billing agent (for ``serve --agent``), provider file from the environment."""
    provider = opened_provider(os.environ[PROVIDER_ENV])
    for payment_intent_id in filter(None, os.environ.get(LOST_RESPONSES_ENV, "").split(",")):
        provider.simulate_lost_response(payment_intent_id)
    return build_agent(provider)


def opened_provider(path: str | os.PathLike[str]) -> FakePaymentProvider:
    """The demo's fake payment provider, its tables created (from synchronous code).

    Runs in a worker thread: Playwright's sync API keeps an event loop running on
    the main thread, where ``asyncio.run`` would refuse to start."""
    provider = FakePaymentProvider(path)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(lambda: asyncio.run(provider.open())).result()
    return provider


@contextlib.asynccontextmanager
async def asgi_client(app: Starlette, token: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://localhost", headers=headers
    ) as client:
        yield client


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def served(
    store: Path | str,
    *,
    provider: Path | None = None,
    agent: str = "host_support:billing_agent",
    tokens: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    log_path: Path | None = None,
    startup_timeout: float = 30.0,
) -> Iterator[str]:
    """``intention-kernel serve --agent AGENT`` on ``store`` (a SQLite file, or a store
    URL); yields its base URL. The billing agent's provider records in ``provider``,
    by default the SQLite store's own file. ``args`` are more options for serve,
    ``env`` more environment variables."""
    url = f"sqlite:///{store}" if isinstance(store, Path) else store
    if provider is None:
        if not isinstance(store, Path):
            raise ValueError("a store URL needs a provider file")
        provider = store
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(TESTS_DIR), environ.get("PYTHONPATH")])
    )
    environ[PROVIDER_ENV] = str(provider)
    for name in ("INTENTION_KERNEL_TOKENS", "INTENTION_KERNEL_DEMO_PROVIDER_DB"):
        environ.pop(name, None)
    environ.update(env or {})
    log_path = log_path or provider.with_suffix(".log")
    for _attempt in range(3):
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "intention_kernel",
            "serve",
            "--agent",
            agent,
            "--db",
            url,
            "--port",
            str(port),
            *args,
        ]
        for token, tenant in (tokens or {}).items():
            command += ["--token", f"{token}={tenant}"]
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                command, env=environ, cwd=cwd, stdout=log, stderr=subprocess.STDOUT
            )
        base_url = f"http://127.0.0.1:{port}"
        if _wait_healthy(process, base_url, startup_timeout):
            break
        _stop(process)  # the port was taken between free_port() and bind: try another
    else:
        raise RuntimeError(f"the host did not start; log:\n{log_path.read_text()}")
    try:
        yield base_url
    finally:
        _stop(process)


@contextlib.contextmanager
def serving_in_thread(app: Starlette, startup_timeout: float = 15.0) -> Iterator[str]:
    """``app`` on uvicorn in a background thread; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def _wait_healthy(process: subprocess.Popen[bytes], base_url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1.0).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)  # uvicorn shuts down gracefully, the store closes
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def store_url_for(
    request: pytest.FixtureRequest, tmp_path: Path, prefix: str, query: str = ""
) -> Iterator[str]:
    """The store a served process opens: a SQLite file, or a PostgreSQL schema of
    its own (``request.param`` names which), dropped at the end."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'host.db'}"
        return
    from proving_support import drop_schema

    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}{query}"
    finally:
        drop_schema(dsn, schema)
