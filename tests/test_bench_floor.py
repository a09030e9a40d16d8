"""The SQLite floor stores what the kernel stores, table by table, byte for byte.

The cost meter reads the kernel's CPU as a ratio to the floor's. A floor that wrote
smaller rows, or skipped an index the kernel keeps, would make that ratio look worse
than it is. One whose rows grew would make it look better. Each table's row count and
bytes (every column's length, NULL as 0) are compared after the same turns."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from bench.floor import SQLiteFloor
from bench.worker import KernelRow, Worker

TURNS = 60
TABLES = ("threads", "turns", "receipts", "messages", "facts", "receipt_index", "outbox")


def stored(path: Path, prefix: str) -> dict[str, tuple[int, int]]:
    """Each table's rows and bytes, and its indexes' names without the prefix."""
    out: dict[str, tuple[int, int]] = {}
    with sqlite3.connect(path) as conn:
        for table in TABLES:
            name = prefix + table
            columns = [row[1] for row in conn.execute(f"PRAGMA table_info({name})")]
            total = " + ".join(f"coalesce(length({c}), 0)" for c in columns)
            rows, size = conn.execute(f"SELECT count(*), sum({total}) FROM {name}").fetchone()
            out[table] = (rows, size)
    return out


def indexes(path: Path, prefix: str) -> set[tuple[str, str]]:
    """The (table, index) pairs of the turn's tables, an index named by what it keys."""
    with sqlite3.connect(path) as conn:
        found = conn.execute("SELECT tbl_name, sql FROM sqlite_master WHERE type = 'index'")
        return {
            # "CREATE INDEX [IF NOT EXISTS] name ON table (keys) [WHERE ...]": the keys on.
            (table.removeprefix(prefix), " ".join(sql.split(" ON ", 1)[1].split()[1:]))
            for table, sql in found
            if table.removeprefix(prefix) in TABLES and sql is not None
        }


async def run(row: object) -> None:
    await row.setup()  # type: ignore[attr-defined]
    try:
        await Worker(row, "f").turns(TURNS)
    finally:
        await row.close()  # type: ignore[attr-defined]


def test_the_sqlite_floor_writes_the_kernels_rows(tmp_path: Path) -> None:
    kernel_db, floor_db = tmp_path / "kernel.db", tmp_path / "floor.db"
    asyncio.run(run(KernelRow("sqlite", str(kernel_db), "", "unused", "FULL")))
    asyncio.run(run(SQLiteFloor(str(floor_db), "FULL")))
    kernel, floor = stored(kernel_db, "ik_"), stored(floor_db, "")
    for table in TABLES:
        (kernel_rows, kernel_bytes), (floor_rows, floor_bytes) = kernel[table], floor[table]
        assert floor_rows == kernel_rows, table
        # A timestamp whose microseconds are 0 is 7 characters shorter in ISO form.
        assert floor_bytes == pytest.approx(kernel_bytes, rel=0.002), table
    # The receipt's primary key, its ID's, and a status index; the outbox's relay index.
    assert indexes(floor_db, "") == indexes(kernel_db, "ik_")
