"""A fixed workload whose stored checkpoint rows are compared byte for byte.

``python tests/layout_support.py OUT.json`` runs it on the memory, SQLite and
PostgreSQL stores and writes every thread's stored rows as JSON. Run with an older
tree's ``src/`` first on ``PYTHONPATH``, it records the bytes that tree stored.
``tests/test_layout_bytes.py`` then checks that this tree stores the very same bytes.
The workload trims messages and the receipt index, and moves receipt entries.
It then migrates every checkpoint to a new schema revision in place.
The clock is fixed, so the rows hold no time of the run.
Receipt IDs are random, so each is replaced by its order of first appearance.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    Fact,
    Intent,
    Interpretation,
    Kernel,
    capability,
)
from intention_kernel import _checkpoint as checkpoint_module
from intention_kernel._interpretation import InterpretationRequest
from intention_kernel.durability._memory import InMemoryDurability
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.operations import migrate_checkpoints

#: (thread, turn, message): ``use N`` uses (or reuses) the receipt of key N.
TURNS: list[tuple[str, str, str]] = [
    ("t-one", "1", "use 1 Zoë ✓"),
    ("t-one", "2", "use 2"),
    ("t-one", "3", "use 1 again"),
    ("t-one", "4", "use 3"),
    ("t-one", "5", "use 2 again"),
    ("t-one", "6", "use 4 日本語"),
    ("t-two", "a", "use 9 \t\\ \u2028"),
    ("t-one", "7", "use 2 back"),
]
CLOCK = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
RECEIPT_ID = re.compile(r"rcpt_[0-9a-f]+")


class Interpreter:
    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        verb, n = request.message.split(" ", 2)[:2]
        return Interpretation(intents=[Intent(f"rows.{verb}", {"n": n, "said": request.message})])


def agent() -> Agent:
    @capability("rows.use", effect="write", confirmation="capability")
    async def use(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        """Use a receipt, and record a fact of its key."""
        n = input["n"]

        async def call(authority: Any) -> dict[str, Any]:
            return {"n": n, "said": input["said"], "ü": [1.5, 2**60]}

        effect = await ctx.run_effect(f"use:{n}", call)
        return CapabilityResult(
            value=effect.value, facts=[Fact(f"used.{n}", effect.value)], reply=f"Used {n}."
        )

    return Agent(
        name="layout-bytes",
        version="1",
        capabilities=[use],
        interpreter=Interpreter(),
        max_messages=4,
        max_receipts=3,
    )


async def rows_of(durability: Any) -> dict[str, Any]:
    """Every thread's stored rows, receipt IDs numbered in order of appearance."""
    recorder = await durability.recorder()
    found: dict[str, Any] = {}
    for thread_id in sorted({thread for thread, _, _ in TURNS}):
        thread = await recorder.read_thread(thread_id)
        found[thread_id] = {
            "version": thread.version,
            "core": thread.checkpoint,
            "messages": list(thread.messages),
            "facts": [list(pair) for pair in thread.facts],
            "receipt_index": None if thread.receipt_index is None else list(thread.receipt_index),
        }
    text = json.dumps(found, ensure_ascii=False, sort_keys=True)
    ids: dict[str, str] = {}
    for receipt_id in RECEIPT_ID.findall(text):
        ids.setdefault(receipt_id, f"receipt-{len(ids)}")
    numbered: dict[str, Any] = json.loads(RECEIPT_ID.sub(lambda m: ids[m.group()], text))
    return numbered


def upgrade(document: dict[str, Any]) -> dict[str, Any]:
    """A migration that changes no field: the checkpoint is written anew all the same."""
    return document


async def run(durability: Any) -> dict[str, Any]:
    kernel = Kernel(agent(), durability, clock=lambda: CLOCK)
    for thread, turn, message in TURNS:
        result = await kernel.turn(thread, turn, message)
        assert result.steps[0].status == "completed", result
    turns = await rows_of(durability)
    migrations = (*checkpoint_module.CHECKPOINT_MIGRATIONS, upgrade)
    previous = checkpoint_module.CHECKPOINT_MIGRATIONS
    checkpoint_module.CHECKPOINT_MIGRATIONS = migrations
    try:
        report = await migrate_checkpoints(durability, migrations=migrations)
        assert report.migrated == 2 and not report.failed, report
        migrated = await rows_of(durability)
        # A turn after the migration writes a difference from the migrated rows.
        await kernel.turn("t-two", "b", "use 8")
        after = await rows_of(durability)
    finally:
        checkpoint_module.CHECKPOINT_MIGRATIONS = previous
    return {"turns": turns, "migrated": migrated, "after": after}


STORES = ("memory", "sqlite", "postgres")


@asynccontextmanager
async def store(name: str, directory: Path, dsn: str | None) -> AsyncIterator[Any]:
    """A new, empty store of kind ``name``; PostgreSQL in a schema of its own."""
    if name == "memory":
        async with InMemoryDurability() as memory:
            yield memory
        return
    if name == "sqlite":
        async with SQLiteDurability(str(directory / "store.db")) as sqlite:
            yield sqlite
        return
    import psycopg
    from psycopg import sql

    from intention_kernel.durability.postgres import PostgresDurability

    assert dsn is not None
    schema = "ik_layout_" + uuid.uuid4().hex[:12]
    try:
        async with PostgresDurability(dsn, schema=schema) as postgres:
            yield postgres
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def written(name: str, directory: Path, dsn: str | None) -> dict[str, Any]:
    """The rows the workload leaves in a new store of kind ``name``."""
    async with store(name, directory, dsn) as durability:
        return await run(durability)


async def write_all(dsn: str | None) -> dict[str, Any]:
    found = {}
    for name in STORES[:2] if dsn is None else STORES:
        with tempfile.TemporaryDirectory() as directory:
            found[name] = await written(name, Path(directory), dsn)
    return found


def main() -> None:
    dsn = os.environ.get("INTENTION_KERNEL_POSTGRES_DSN")
    written = asyncio.run(write_all(dsn))
    text = json.dumps(written, ensure_ascii=False, indent=1, sort_keys=True) + "\n"
    Path(sys.argv[1]).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
