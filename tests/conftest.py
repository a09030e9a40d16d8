"""Shared fixtures: service discovery that skips locally and fails in CI; the
hypothesis profiles; the soak's size (``--soak-turns``); a store of each kind (``store``);
the chat-completions stub and a model behind it (``stub``, ``model``)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from intention_kernel.durability import Durability
    from intention_kernel.interpreters.openai import OpenAIInterpreter
    from openai_stub import OpenAIStub

REQUIRE_SERVICES = os.environ.get("INTENTION_KERNEL_REQUIRE_SERVICES") == "1"
POSTGRES_DSN = os.environ.get(
    "INTENTION_KERNEL_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test"
)
#: A PgBouncer in transaction mode in front of that server (scripts/pgbouncer.sh).
PGBOUNCER_DSN = os.environ.get("INTENTION_KERNEL_PGBOUNCER_DSN")
NATS_URL = os.environ.get("INTENTION_KERNEL_NATS_URL", "nats://127.0.0.1:4222")


def service_unavailable(what: str, why: str) -> None:
    """Skip with a reason locally; fail when CI set INTENTION_KERNEL_REQUIRE_SERVICES=1."""
    message = f"{what} is not reachable ({why})"
    if REQUIRE_SERVICES:
        pytest.fail(f"{message}, and INTENTION_KERNEL_REQUIRE_SERVICES=1 makes it mandatory")
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """A reachable PostgreSQL DSN (INTENTION_KERNEL_POSTGRES_DSN), or skip/fail."""
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the dev extra installs it
        service_unavailable("PostgreSQL", f"psycopg is not installed: {exc}")
        raise
    try:
        with psycopg.connect(POSTGRES_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        service_unavailable(f"PostgreSQL at {POSTGRES_DSN}", str(exc).strip())
    return POSTGRES_DSN


@pytest.fixture(scope="session")
def pgbouncer_dsn(postgres_dsn: str) -> str:
    """A reachable PgBouncer in transaction mode (INTENTION_KERNEL_PGBOUNCER_DSN, started
    by ``scripts/pgbouncer.sh start``) in front of ``postgres_dsn``'s server, or skip/fail."""
    import psycopg

    if not PGBOUNCER_DSN:
        service_unavailable(
            "PgBouncer",
            "INTENTION_KERNEL_PGBOUNCER_DSN is not set; run scripts/pgbouncer.sh start and set"
            " it to postgresql://postgres@127.0.0.1:6432/test",
        )
    assert PGBOUNCER_DSN is not None
    try:
        # prepare_threshold=None: transaction mode keeps no prepared statement.
        with psycopg.connect(PGBOUNCER_DSN, connect_timeout=3, prepare_threshold=None) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        service_unavailable(f"PgBouncer at {PGBOUNCER_DSN}", str(exc).strip())
    return PGBOUNCER_DSN


@pytest.fixture(scope="session")
def nats_url() -> str:
    """A reachable NATS server with JetStream (INTENTION_KERNEL_NATS_URL), or skip/fail."""
    import asyncio

    try:
        import nats
    except ImportError as exc:  # pragma: no cover - the dev extra installs it
        service_unavailable("NATS", f"nats-py is not installed: {exc}")
        raise

    async def probe() -> None:
        client = await nats.connect(
            NATS_URL, connect_timeout=3, max_reconnect_attempts=0, allow_reconnect=False
        )
        try:
            await client.jetstream().account_info()
        finally:
            await client.close()

    try:
        asyncio.run(probe())
    except Exception as exc:
        service_unavailable(f"NATS with JetStream at {NATS_URL}", f"{type(exc).__name__}: {exc}")
    return NATS_URL


# -- hypothesis: bounded for CI, deterministic there ----------------------------------------
# "ci" (chosen when CI or INTENTION_KERNEL_REQUIRE_SERVICES is set) derandomizes, so that a
# CI run is reproducible, and keeps no example database. "dev" explores new examples on
# every run and remembers failing ones in .hypothesis/ (git-ignored). "thorough" is for a
# long local run: pytest tests/test_model_check.py --hypothesis-profile=thorough
_BOUNDED: dict[str, Any] = {
    "max_examples": 40,
    "stateful_step_count": 25,
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow],
}
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, **_BOUNDED)
settings.register_profile("dev", **_BOUNDED)
settings.register_profile(
    "thorough",
    max_examples=1000,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI") or REQUIRE_SERVICES else "dev")


# -- the soak's size ---------------------------------------------------------------------------


SOAK_TIMEOUT = 600  # seconds, for the CI-sized soak (tests/test_soak.py)
SOAK_CI_TURNS = 2400


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow and soak tests run first; a longer soak (``--soak-turns``) gets a timeout
    in proportion."""
    # pytest-xdist hands tests out in this order: a slow test left to the end runs alone.
    items.sort(
        key=lambda item: not any(item.iter_markers("slow")) and not any(item.iter_markers("soak"))
    )
    turns = config.getoption("--soak-turns")
    if turns and turns > SOAK_CI_TURNS:
        timeout = SOAK_TIMEOUT * turns // SOAK_CI_TURNS
        for item in items:
            if item.get_closest_marker("soak"):
                item.add_marker(pytest.mark.timeout(timeout), append=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-turns",
        type=int,
        default=None,
        help="turns the soak tests deliver per store (default: a CI-sized run, see "
        "tests/test_soak.py)",
    )
    parser.addoption(
        "--soak-seed", type=int, default=None, help="seed of the soak's schedule and kills"
    )


#: The conformance suites that also run on uvloop's event loop, which ``serve`` uses
#: where it is installed: the adapters' waits, cancellations and shields must hold on
#: both loops.
_ON_BOTH_LOOPS = (
    "TestPostgresDurability",
    "TestSQLiteDurability",
    "TestSQLiteDurabilityWithWritesOnTheWorkerThread",
    "TestSQLiteDurabilityWithGroupCommit",
)


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    loops: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
    cls = getattr(item, "cls", None)
    if cls is not None and cls.__name__ in _ON_BOTH_LOOPS:
        try:
            import uvloop
        except ImportError:  # the http extra installs it, except on Windows
            pass
        else:
            loops["uvloop"] = uvloop.new_event_loop
    return loops


# -- a store of each kind ------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Durability]:
    """Each store in turn: memory, a SQLite file, a PostgreSQL schema of its own. A test
    module may define a ``store`` fixture of its own instead."""
    from intention_kernel.durability.sqlite import SQLiteDurability
    from intention_kernel.testing import InMemoryDurability

    if request.param == "memory":
        yield InMemoryDurability()
        return
    if request.param == "sqlite":
        async with SQLiteDurability(tmp_path / "store.db") as sqlite_store:
            yield sqlite_store
        return
    import psycopg
    from psycopg import sql

    from intention_kernel.durability.postgres import PostgresDurability

    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = "ik_store_" + uuid.uuid4().hex[:12]
    try:
        async with PostgresDurability(dsn, schema=schema) as pg_store:
            yield pg_store
    finally:

        def drop() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                drop_it = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                conn.execute(drop_it.format(sql.Identifier(schema)))

        # Off the event loop: a task the test left running may hold the schema's locks.
        # It needs the loop to finish and free them; a blocking drop here would wait forever.
        await asyncio.to_thread(drop)


# -- a chat-completions server and a model behind it ---------------------------------------------


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    """The replaying chat-completions server (``tests/openai_stub.py``); no request may
    reach it with nothing queued."""
    from openai_stub import running_stub

    with running_stub() as server:
        yield server
    assert server.unexpected == 0, "a request reached the stub with nothing queued"


@pytest.fixture
async def model(stub: OpenAIStub) -> AsyncIterator[OpenAIInterpreter]:
    """An ``OpenAIInterpreter`` (rounds on) talking to ``stub``, without retries."""
    from intention_kernel.interpreters.openai import OpenAIInterpreter

    async with OpenAIInterpreter(
        "gpt-4o-mini", base_url=stub.base_url, api_key="k", max_retries=0, timeout=5
    ) as interpreter:
        yield interpreter
