"""Shared fixtures: service discovery that skips locally and fails in CI."""

from __future__ import annotations

import os

import pytest

REQUIRE_SERVICES = os.environ.get("INTENTION_KERNEL_REQUIRE_SERVICES") == "1"
POSTGRES_DSN = os.environ.get(
    "INTENTION_KERNEL_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test"
)


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
