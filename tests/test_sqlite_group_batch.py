"""Less work per write in a SQLite group, and still a failing write fails alone.

A write that is not atomic runs in its group without a savepoint of its own. What it
leaves behind when it fails is exactly what it leaves when it runs alone."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import pytest

from intention_kernel._effects import ReceiptStatus, plan_effect, settle, utcnow
from intention_kernel.durability.abc import JournalEntry
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.errors import FencedCommitError, StoreError
from intention_kernel.testing.sqlite import WriterProbe

# -- helpers ---------------------------------------------------------------------------------


async def _in_one_group(probe: WriterProbe, *writes: Any) -> list[Any]:
    """Run the awaitables ``writes`` (each one write) as one group; their outcomes."""
    grouped = probe.grouped
    gate = await probe.hold()
    started = [asyncio.ensure_future(w) for w in writes]
    await gate.wait_for_queued(len(started))
    await gate.release()
    done = await asyncio.gather(*started, return_exceptions=True)
    assert probe.grouped - grouped == len(writes)  # one group of them all
    return done


def _scratch(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE scratch (x TEXT UNIQUE)")


@asynccontextmanager
async def _scratch_store(path: Path) -> AsyncIterator[WriterProbe]:
    """The probe of an adapter open on a file with a ``scratch`` table, writes on its thread."""
    _scratch(path)
    probe = WriterProbe()
    async with SQLiteDurability(path, offload_writes=True, seam=probe):
        yield probe


def _rows(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT x FROM scratch")}


def _insert(*values: str) -> Callable[[sqlite3.Connection], None]:
    """One statement that inserts ``values`` in order: it fails at the first duplicate,
    after the rows before it were written."""

    def write(conn: sqlite3.Connection) -> None:
        rows = ", ".join("(?)" for _ in values)
        conn.execute(f"INSERT INTO scratch VALUES {rows}", values)

    return write


def _then_fail(conn: sqlite3.Connection) -> None:
    """Two statements that may commit one by one: the second fails on a duplicate."""
    conn.execute("INSERT INTO scratch VALUES ('first of two')")
    conn.execute("INSERT INTO scratch VALUES ('dup'), ('dup')")


def _entry(key: str, value: str, turn: str = "turn-1") -> JournalEntry:
    return JournalEntry("t", turn, key, "d", value, utcnow())


# -- a write that is not atomic, in a group ------------------------------------------------


async def test_a_failed_one_statement_write_leaves_no_row_and_its_group_mates_commit(
    tmp_path: Path,
) -> None:
    """The failing statement wrote two rows before its duplicate: without a savepoint,
    SQLite's statement rollback takes them back, and nothing else: the atomic write
    before it and the write after it commit."""
    path = tmp_path / "k.db"
    async with _scratch_store(path) as probe:
        done = await _in_one_group(
            probe,
            probe.write(_insert("atomic before"), atomic=True),
            probe.write(_insert("b", "dup", "dup")),
            probe.write(_insert("after")),
        )
        assert done[0] is None and done[2] is None, done
        assert isinstance(done[1], StoreError) and "UNIQUE" in str(done[1])
    assert _rows(path) == {"atomic before", "after"}


@pytest.mark.parametrize("how", ["alone", "grouped"])
async def test_a_failed_write_that_is_not_atomic_leaves_what_it_leaves_alone(
    tmp_path: Path, how: Literal["alone", "grouped"]
) -> None:
    """A body that is not atomic may commit its statements one by one: alone, the
    statement before the one that failed autocommits. In a group it stays in the
    transaction and commits with it: the same rows either way, and the caller sees
    the same error."""
    path = tmp_path / "k.db"
    async with _scratch_store(path) as probe:
        if how == "alone":
            groups = probe.groups
            with pytest.raises(StoreError, match="UNIQUE"):
                await probe.write(_then_fail)
            assert probe.groups == groups + 1
            await probe.write(_insert("mate"))
        else:
            done = await _in_one_group(probe, probe.write(_then_fail), probe.write(_insert("mate")))
            assert isinstance(done[0], StoreError) and "UNIQUE" in str(done[0])
            assert done[1] is None
    assert _rows(path) == {"first of two", "mate"}


async def test_an_atomic_write_that_fails_after_writing_rolls_back_alone(tmp_path: Path) -> None:
    """An atomic body's rows before its failure are taken back by its savepoint; the
    writes that are not atomic around it keep theirs."""
    path = tmp_path / "k.db"
    async with _scratch_store(path) as probe:
        done = await _in_one_group(
            probe,
            probe.write(_insert("before")),
            probe.write(_then_fail, atomic=True),
            probe.write(_insert("after")),
        )
        assert done[0] is None and done[2] is None, done
        assert isinstance(done[1], StoreError)
    assert _rows(path) == {"before", "after"}


async def test_a_journal_entry_recorded_twice_in_one_group_is_refused_alone(
    tmp_path: Path,
) -> None:
    """Two writes of one journal key in one group (a lost lock): the second is refused
    by the primary key, the first and another turn's entry commit."""
    path = tmp_path / "k.db"
    probe = WriterProbe()
    async with SQLiteDurability(path, offload_writes=True, seam=probe) as store:
        recorder = await store.recorder()
        done = await _in_one_group(
            probe,
            recorder.write_journal(_entry("k", '"first"')),
            recorder.write_journal(_entry("k", '"second"')),
            recorder.write_journal(_entry("k", '"other turn"', turn="turn-2")),
        )
        assert done[0] is None and done[2] is None, done
        assert isinstance(done[1], FencedCommitError)
        [first] = await recorder.read_journal("t", "turn-1")
        [other] = await recorder.read_journal("t", "turn-2")
    assert (first.value, other.value) == ('"first"', '"other turn"')


async def test_a_receipt_outcome_that_finds_its_receipt_moved_fails_alone(
    tmp_path: Path,
) -> None:
    """Two outcomes of one prepared receipt in one group: the compare-and-set lets the
    first through and refuses the second, which writes nothing; another receipt's
    outcome in the same group commits."""
    path = tmp_path / "k.db"
    plan = functools.partial(plan_effect, thread_id="t", turn_id="1", step_id="s", now=utcnow())
    probe = WriterProbe()
    async with SQLiteDurability(path, offload_writes=True, seam=probe) as store:
        recorder = await store.recorder()
        prepared = {}
        for key in ("a", "b"):
            claimed = await recorder.claim_effect("t", key, functools.partial(plan, key=key))
            assert claimed.write is not None
            prepared[key] = claimed.write
        done = await _in_one_group(
            probe,
            recorder.write_receipt(
                settle(prepared["a"], "completed", now=utcnow(), value=1), prepared["a"]
            ),
            recorder.write_receipt(settle(prepared["a"], "failed", now=utcnow()), prepared["a"]),
            recorder.write_receipt(
                settle(prepared["b"], "completed", now=utcnow(), value=2), prepared["b"]
            ),
        )
        assert done[0] is None and done[2] is None, done
        assert isinstance(done[1], FencedCommitError)
        receipts = {r.key: r for r in await recorder.read_receipts("t", None)}
    assert (receipts["a"].status, receipts["a"].value) == (ReceiptStatus.COMPLETED, 1)
    assert (receipts["b"].status, receipts["b"].value) == (ReceiptStatus.COMPLETED, 2)


async def _traced_group(
    path: Path, *writes: tuple[Callable[[sqlite3.Connection], None], bool]
) -> tuple[list[Any], list[str], int]:
    """Run ``writes`` (each a body and whether it is atomic) as one group on a scratch file.

    It answers their outcomes, the statements the writer sent, and its transactions."""
    _scratch(path)
    statements: list[str] = []

    def trace(role: str, sql: str) -> None:
        if role == "writer" and not sql.startswith("PRAGMA"):
            statements.append(" ".join(sql.split()))

    probe = WriterProbe()
    async with SQLiteDurability(path, offload_writes=True, trace=trace, seam=probe):
        statements.clear()
        groups = probe.groups
        done = await _in_one_group(probe, *(probe.write(fn, atomic=a) for fn, a in writes))
        return done, statements, probe.groups - groups


async def test_a_group_with_no_failure_takes_no_savepoint(tmp_path: Path) -> None:
    """The statements a group sends when no write fails: one ``BEGIN IMMEDIATE``, the
    writes, one ``COMMIT``. No savepoint, not even around the atomic write."""
    path = tmp_path / "k.db"
    done, statements, transactions = await _traced_group(
        path, (_insert("one"), False), (_insert("two"), True), (_insert("three"), False)
    )
    assert done == [None, None, None] and transactions == 1
    assert statements == [
        "BEGIN IMMEDIATE",
        "INSERT INTO scratch VALUES ('one')",
        "INSERT INTO scratch VALUES ('two')",
        "INSERT INTO scratch VALUES ('three')",
        "COMMIT",
    ]
    assert _rows(path) == {"one", "two", "three"}


async def test_a_failed_atomic_write_runs_its_group_mates_again_with_savepoints(
    tmp_path: Path,
) -> None:
    """An atomic write fails after one of its rows was written. With no savepoint, the
    whole transaction is rolled back, and its caller gets its error. Its group-mates,
    the one before it included, run again in a new transaction, a savepoint around each
    atomic one. Each commits once: the rows are theirs, and no row of the failed one."""
    path = tmp_path / "k.db"
    done, statements, transactions = await _traced_group(
        path, (_insert("one"), False), (_then_fail, True), (_insert("three"), True)
    )
    assert done[0] is None and done[2] is None, done
    assert isinstance(done[1], StoreError) and "UNIQUE" in str(done[1])
    assert transactions == 2  # the first transaction, and the second
    assert statements == [
        "BEGIN IMMEDIATE",
        "INSERT INTO scratch VALUES ('one')",
        "INSERT INTO scratch VALUES ('first of two')",
        "INSERT INTO scratch VALUES ('dup'), ('dup')",
        "ROLLBACK",
        "BEGIN IMMEDIATE",
        "INSERT INTO scratch VALUES ('one')",
        "SAVEPOINT ik_write",
        "INSERT INTO scratch VALUES ('three')",
        "RELEASE ik_write",
        "COMMIT",
    ]
    assert _rows(path) == {"one", "three"}


async def test_a_second_failure_in_the_careful_run_fails_alone(tmp_path: Path) -> None:
    """Two atomic writes fail in one group. The first fails the first transaction. The
    second fails in the careful run, where its savepoint takes back its row. The writes
    around them commit, in that second transaction."""
    path = tmp_path / "k.db"
    done, statements, transactions = await _traced_group(
        path,
        (_insert("before"), True),
        (_then_fail, True),
        (_insert("middle"), False),
        (_then_fail, True),
        (_insert("after"), True),
    )
    assert [type(d) for d in done] == [
        type(None),
        StoreError,
        type(None),
        StoreError,
        type(None),
    ], done
    assert transactions == 2
    assert statements.count("ROLLBACK") == 1
    assert statements.count("ROLLBACK TO ik_write") == 1
    assert _rows(path) == {"before", "middle", "after"}


# -- a cancelled caller waits for its write --------------------------------------------------


async def test_a_cancelled_caller_goes_on_only_after_its_write_committed(tmp_path: Path) -> None:
    """Take a task cancelled while its write waits for the worker thread. It does not go
    on (and drop its thread lock) while the write may still run. It sees the
    cancellation once the write's group committed, and the write is on disk."""
    path = tmp_path / "k.db"
    async with _scratch_store(path) as probe:
        gate = await probe.hold()
        write = asyncio.ensure_future(probe.write(_insert("cancelled")))
        mate = asyncio.ensure_future(probe.write(_insert("mate")))
        await gate.wait_for_queued(2)
        write.cancel()
        await asyncio.sleep(0.05)
        assert not write.done()  # still waiting for the thread
        assert _rows(path) == set()
        await gate.release()
        with pytest.raises(asyncio.CancelledError):
            await write
        assert write.cancelled()
        await mate
    assert _rows(path) == {"cancelled", "mate"}


async def test_a_timed_out_caller_waits_for_its_write_too(tmp_path: Path) -> None:
    """``asyncio.wait_for`` cancels the write's task at its timeout: the timeout reaches
    the caller only after the write committed."""
    path = tmp_path / "k.db"
    async with _scratch_store(path) as probe:
        gate = await probe.hold()
        timed = asyncio.ensure_future(asyncio.wait_for(probe.write(_insert("late")), 0.01))
        await gate.wait_for_queued(1)
        await asyncio.sleep(0.05)
        assert not timed.done()
        await gate.release()
        with pytest.raises(TimeoutError):
            await timed
    assert _rows(path) == {"late"}
