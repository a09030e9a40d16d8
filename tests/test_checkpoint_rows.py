"""Checkpoints stored in pieces: a long thread stays cheap and loads back exactly, and a
database written by schema version 1 (whole checkpoint documents) is upgraded in place.

(How much a turn costs is shown by ``bench/``, never by timed tests.)
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    Fact,
    Intent,
    Interpretation,
    Kernel,
    capability,
)
from intention_kernel._checkpoint import KernelCheckpoint, encode_checkpoint
from intention_kernel._interpretation import InterpretationRequest
from intention_kernel.durability.sqlite import MIGRATIONS, SQLiteDurability
from intention_kernel.testing._agents import FakeProvider, billing_agent
from sqlite_history import undo_migration_8

MAX_MESSAGES = 6


class _Rules:
    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        n = request.message.split()[-1]
        return Interpretation(intents=[Intent("shop.pay", {"n": int(n)})])


def _agent(calls: list[str]) -> Agent:
    @capability("shop.pay", effect="write", confirmation="capability")
    async def pay(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        """Pay one order: a new fact per turn, and one fact replaced every turn."""
        n = input["n"]

        def charge(authority: EffectAuthority) -> dict[str, Any]:
            calls.append(authority.key)
            return {"n": n}

        effect = await ctx.run_effect(f"pay:{n}", charge)
        return CapabilityResult(
            value=effect.value, facts=[Fact(f"paid.{n}", effect.value), Fact("last", n)]
        )

    return Agent(
        name="shop",
        version="1",
        capabilities=[pay],
        interpreter=_Rules(),
        max_messages=MAX_MESSAGES,
        max_receipts=20,
    )


async def test_a_long_thread_loads_a_bounded_exact_checkpoint_on_a_cache_miss(
    tmp_path: Path,
) -> None:
    path, calls, turns = tmp_path / "k.db", list[str](), 10_000
    async with SQLiteDurability(path, synchronous="NORMAL") as store:
        kernel = Kernel(_agent(calls), store)
        for n in range(1, turns + 1):
            await kernel.turn("t", str(n), f"pay {n}")
        warm = await store.load_checkpoint("t")
    async with SQLiteDurability(path, synchronous="NORMAL") as reopened:  # nothing cached
        cold = await reopened.load_checkpoint("t")
        assert cold == warm
        assert cold is not None and cold.version == turns
        last_three = [str(n) for n in range(turns - 2, turns + 1) for _ in range(2)]
        assert [m.turn_id for m in cold.messages] == last_three
        assert len(cold.facts) == turns + 1
        assert cold.facts["last"].value == turns and cold.facts["last"].version == turns
        assert cold.facts["paid.1"].value == {"n": 1}
        assert list(cold.facts)[:3] == ["paid.1", "last", "paid.2"]  # recording order
        assert [r.key for r in cold.receipts] == [f"shop.pay:pay:{n}" for n in range(9981, 10001)]
        # The next turn starts from the checkpoint read back from rows.
        await Kernel(_agent(calls), reopened).turn("t", "next", "pay 10001")
        after = await reopened.load_checkpoint("t")
        assert after is not None and after.version == turns + 1 and len(after.facts) == turns + 2
    with sqlite3.connect(path) as conn:
        stored = conn.execute("SELECT count(*) FROM ik_messages").fetchone()[0]
        core = conn.execute("SELECT checkpoint FROM ik_threads").fetchone()[0]
        index = conn.execute("SELECT count(*) FROM ik_receipt_index").fetchone()[0]
    assert stored == MAX_MESSAGES  # trimmed rows are deleted, not only hidden
    assert index == 20  # so are trimmed receipt index rows
    assert {"facts", "receipts"}.isdisjoint(json.loads(core))
    assert len(core) < 1_000, len(core)  # the hot row stays well under one page
    assert len(calls) == turns + 1


def _downgrade_to_version_1(path: Path, checkpoints: dict[str, KernelCheckpoint]) -> None:
    """Turn the database into what schema version 1 wrote: whole checkpoint documents
    in ``ik_threads.checkpoint`` and no message or fact rows."""
    with sqlite3.connect(path) as conn:
        undo_migration_8(conn)
        for thread_id, checkpoint in checkpoints.items():
            conn.execute(
                "UPDATE ik_threads SET checkpoint = ? WHERE thread_id = ?",
                (encode_checkpoint(checkpoint), thread_id),
            )
        conn.execute("DROP TABLE ik_messages")
        conn.execute("DROP TABLE ik_facts")
        conn.execute("ALTER TABLE ik_threads DROP COLUMN message_seq")
        # and what migration 3 added
        conn.execute("DROP INDEX ik_outbox_unpublished")
        for column in ("published_at", "attempts", "last_error", "retry_at"):
            conn.execute(f"ALTER TABLE ik_outbox DROP COLUMN {column}")
        conn.execute("ALTER TABLE ik_receipts DROP COLUMN announced")
        conn.execute("ALTER TABLE ik_receipts DROP COLUMN tenant_id")  # migration 4
        conn.execute("ALTER TABLE ik_turns DROP COLUMN pruned_at")
        conn.execute("ALTER TABLE ik_turns DROP COLUMN announced")  # migration 5
        conn.execute("DROP TABLE ik_journal")  # migration 6
        conn.execute("ALTER TABLE ik_receipts DROP COLUMN actor")  # migration 7
        conn.execute("DELETE FROM ik_schema WHERE version > 1")


async def test_a_version_1_database_is_upgraded_and_its_threads_go_on(tmp_path: Path) -> None:
    path, provider = tmp_path / "k.db", FakeProvider()
    async with SQLiteDurability(path) as store:
        kernel = Kernel(billing_agent(provider, max_messages=4), store)
        await kernel.turn("t", "1", "balance 500")
        await kernel.turn("t", "2", "charge pi_1 500")
        await kernel.turn("t", "3", "yes")
        before = await store.load_checkpoint("t")
    assert before is not None
    _downgrade_to_version_1(path, {"t": before})

    async with SQLiteDurability(path) as upgraded:
        assert await upgraded.load_checkpoint("t") == before
        # The charge's turn committed, so its effect.completed was announced.
        [receipt] = await upgraded.list_receipts("t")
        assert receipt.announced
        kernel = Kernel(billing_agent(provider, max_messages=4), upgraded)
        assert (await kernel.turn("t", "3", "yes")).replayed
        await kernel.turn("t", "4", "balance 20")  # reads the whole document, writes rows
        after = await upgraded.load_checkpoint("t")
    assert after is not None and after.version == 4
    assert after.facts["charge.pi_1"] == before.facts["charge.pi_1"]
    assert after.facts["balance"].value == 20
    assert [m.turn_id for m in after.messages] == ["3", "3", "4", "4"]
    with sqlite3.connect(path) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM ik_schema ORDER BY version")]
        core = json.loads(conn.execute("SELECT checkpoint FROM ik_threads").fetchone()[0])
        rows = conn.execute("SELECT count(*) FROM ik_messages").fetchone()[0]
    assert versions == list(range(1, len(MIGRATIONS) + 1))
    assert "messages" not in core and "facts" not in core and rows == 4
    async with SQLiteDurability(path) as reopened:  # read back from rows only
        assert await reopened.load_checkpoint("t") == after
    assert provider.calls() == 1


async def test_a_receipt_index_stored_in_its_core_moves_into_rows_on_the_next_commit(
    tmp_path: Path,
) -> None:
    """Before migration 8 a core held its thread's receipt index. Such a core reads as
    it was, and the thread's next commit writes the index as rows and a core without it;
    every row is written anew, as after any base that is not stored exactly."""
    path, calls = tmp_path / "k.db", list[str]()
    async with SQLiteDurability(path) as store:
        kernel = Kernel(_agent(calls), store)
        for n in range(1, 31):
            await kernel.turn("t", str(n), f"pay {n}")
        before = await store.load_checkpoint("t")
    assert before is not None and len(before.receipts) == 20
    with sqlite3.connect(path) as conn:
        undo_migration_8(conn)
        core = json.loads(conn.execute("SELECT checkpoint FROM ik_threads").fetchone()[0])
    assert len(core["receipts"]) == 20

    async with SQLiteDurability(path) as upgraded:
        assert await upgraded.load_checkpoint("t") == before
        await Kernel(_agent(calls), upgraded).turn("t", "31", "pay 31")
        after = await upgraded.load_checkpoint("t")
    assert after is not None and after.receipts[:-1] == before.receipts[1:]
    assert [r.key for r in after.receipts] == [f"shop.pay:pay:{n}" for n in range(12, 32)]
    with sqlite3.connect(path) as conn:
        core = json.loads(conn.execute("SELECT checkpoint FROM ik_threads").fetchone()[0])
        rows = conn.execute("SELECT key FROM ik_receipt_index ORDER BY seq").fetchall()
        messages = conn.execute("SELECT count(*) FROM ik_messages").fetchone()[0]
    assert "receipts" not in core
    assert [key for (key,) in rows] == [r.key for r in after.receipts]
    assert messages == MAX_MESSAGES
    async with SQLiteDurability(path) as reopened:  # read back from rows only
        assert await reopened.load_checkpoint("t") == after
        await Kernel(_agent(calls), reopened).turn("t", "32", "pay 32")
        last = await reopened.load_checkpoint("t")
    assert last is not None and last.receipts[:-1] == after.receipts[1:]
    assert len(calls) == 32
