"""The SQLite adapter runs the whole conformance suite, plus SQLite specifics."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from intention_kernel.durability import Durability, open_durability
from intention_kernel.durability.sqlite import MIGRATIONS, SQLiteDurability
from intention_kernel.testing.conformance import DurabilityConformance, Tamper


class _SQLiteTamper:
    def __init__(self, path: Path) -> None:
        self._path = path

    def _execute(self, sql: str, *args: object) -> None:
        with sqlite3.connect(self._path) as conn:
            conn.execute("PRAGMA ignore_check_constraints = 1")
            assert conn.execute(sql, args).rowcount == 1

    async def write_checkpoint_text(self, thread_id: str, text: str) -> None:
        self._execute("UPDATE ik_threads SET checkpoint = ? WHERE thread_id = ?", text, thread_id)

    async def write_receipt_status(self, thread_id: str, key: str, status: str) -> None:
        self._execute(
            "UPDATE ik_receipts SET status = ? WHERE thread_id = ? AND key = ?",
            status,
            thread_id,
            key,
        )


class TestSQLiteDurability(DurabilityConformance):
    @pytest.fixture
    def make_durability(self, tmp_path: Path) -> Callable[[], Durability]:
        return lambda: SQLiteDurability(tmp_path / "kernel.db")

    @pytest.fixture
    def tamper(self, durability: Durability, tmp_path: Path) -> Tamper | None:
        return _SQLiteTamper(tmp_path / "kernel.db")


async def test_schema_is_created_once_and_versioned(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    for _ in range(2):
        async with SQLiteDurability(path):
            pass
    with sqlite3.connect(path) as conn:
        versions = [row[0] for row in conn.execute("SELECT version FROM ik_schema")]
        journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert versions == list(range(1, len(MIGRATIONS) + 1))
    assert journal == "wal"


async def test_open_durability_builds_sqlite_from_a_url(tmp_path: Path) -> None:
    durability = open_durability(f"sqlite:///{tmp_path}/url.db")
    assert isinstance(durability, SQLiteDurability)
    assert durability.path == f"{tmp_path}/url.db"
    with pytest.raises(ValueError, match="unknown durability scheme"):
        open_durability("mysql://x")


async def test_a_database_from_a_newer_library_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    async with SQLiteDurability(path):
        pass
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO ik_schema VALUES (?, 'future')", (len(MIGRATIONS) + 1,))
    from intention_kernel.errors import StoreError

    with pytest.raises(StoreError, match="newer than this library"):
        async with SQLiteDurability(path):
            pass
