"""The SQLite adapter runs the whole conformance suite, plus SQLite specifics."""

from __future__ import annotations

import asyncio
import fcntl
import json
import math
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from intention_kernel._turns import TurnCommit, TurnScope
from intention_kernel.durability import Durability, TurnTransaction, open_durability
from intention_kernel.durability.sqlite import MIGRATIONS, SQLiteDurability
from intention_kernel.errors import (
    CorruptRecordError,
    CorruptStoreError,
    FencedCommitError,
    StoreError,
    ThreadBusyError,
    ThreadLockTimeoutError,
)
from intention_kernel.testing.conformance import (
    DurabilityConformance,
    Inspector,
    Tamper,
    commit_for,
)
from proving_support import (
    Store,
    StoreInspector,
    cancels_before_scopes_stop_any_tenant,
    damage_sqlite_table,
    inbox_before_steers_reads_as_queued,
    interrupts_before_senders_stop_any_turn_on_their_base,
    journal_before_tenants_gets_its_threads_owner,
    migration_4_gives_receipts_their_owner,
    receipts_before_actors_read_as_no_actor,
    receipts_before_origins_read_with_none,
)
from sqlite_history import (
    undo_migration_8,
    undo_migration_9,
    undo_migration_11,
    undo_migration_15,
    undo_migration_16,
    undo_migration_17,
)
from sqlite_owner import watch_connections


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


class OneUserAtATime:
    """The whole suite runs with the adapter's connections watched: one thread uses
    each at a time, and no cursor is freed open on another thread (``sqlite_owner``)."""

    @pytest.fixture(autouse=True)
    def one_user_at_a_time(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        problems = watch_connections(monkeypatch)
        yield
        assert problems == []


class SQLiteConformance(OneUserAtATime, DurabilityConformance):
    """The whole suite on one SQLite file, with the adapter that :meth:`adapter` makes:
    the one thing the classes below (and ``test_sqlite_group_commit.py``'s) change."""

    @staticmethod
    def adapter(path: Path, **options: Any) -> Durability:
        """A new, unopened adapter on ``path`` with ``options`` (``lock_timeout``)."""
        return SQLiteDurability(path, **options)

    @pytest.fixture
    def make_durability(self, tmp_path: Path) -> Callable[[], Durability]:
        return lambda: self.adapter(tmp_path / "kernel.db")

    @pytest.fixture
    def tamper(self, durability: Durability, tmp_path: Path) -> Tamper | None:
        return _SQLiteTamper(tmp_path / "kernel.db")

    @pytest.fixture
    def inspector(self, tmp_path: Path) -> Inspector | None:
        return StoreInspector(Store("sqlite", str(tmp_path / "kernel.db")))

    @pytest.fixture
    def make_durability_with_lock_timeout(
        self, tmp_path: Path
    ) -> Callable[[float], Durability] | None:
        return lambda seconds: self.adapter(tmp_path / "kernel.db", lock_timeout=seconds)


class TestSQLiteDurability(SQLiteConformance):
    """The defaults: writes inline while one turn runs, on the worker thread once turns
    overlap."""


class TestSQLiteDurabilityWithWritesOnTheWorkerThread(SQLiteConformance):
    """``offload_writes=True``: every write hops, also when turns do not overlap."""

    @staticmethod
    def adapter(path: Path, **options: Any) -> Durability:
        return SQLiteDurability(path, offload_writes=True, **options)


class TestSQLiteDurabilityWithWritesOnTheEventLoop(SQLiteConformance):
    """``offload_writes=False``: no write hops, also when turns overlap (unless the
    database is busy)."""

    @staticmethod
    def adapter(path: Path, **options: Any) -> Durability:
        return SQLiteDurability(path, offload_writes=False, **options)


async def test_writes_hop_to_the_worker_thread_only_while_turns_overlap(tmp_path: Path) -> None:
    """The default: inline while one turn runs; on the worker thread once turns overlap."""
    hopped: list[bool] = []

    def trace(connection: str, sql: str) -> None:
        if connection == "writer":
            hopped.append(threading.current_thread().name == "ik-sqlite")

    async def slow(tx: TurnTransaction) -> TurnCommit:
        await asyncio.sleep(0.02)  # a model call: other turns run meanwhile
        return commit_for(tx)

    async with SQLiteDurability(tmp_path / "k.db", trace=trace) as store:
        hopped.clear()  # opening connects and migrates on the worker thread
        await store.with_turn(TurnScope("a", "1"), slow)
        alone, hopped[:] = set(hopped), []
        await asyncio.gather(*(store.with_turn(TurnScope(t, "2"), slow) for t in "abc"))
        together, hopped[:] = set(hopped), []
        await store.with_turn(TurnScope("a", "3"), slow)
        alone_again = set(hopped)
    assert alone == alone_again == {False}
    assert True in together


async def test_a_refused_or_timed_out_thread_lock_leaves_lone_writes_inline(
    tmp_path: Path,
) -> None:
    """A turn that never got its thread lock (busy at once, or timed out) stops counting
    as in flight: the next lone turn still writes inline, not on the worker thread."""
    hopped: list[bool] = []

    def trace(connection: str, sql: str) -> None:
        if connection == "writer":
            hopped.append(threading.current_thread().name == "ik-sqlite")

    held, done = asyncio.Event(), asyncio.Event()

    async def holding(tx: TurnTransaction) -> TurnCommit:
        held.set()
        await done.wait()
        return commit_for(tx)

    async def quick(tx: TurnTransaction) -> TurnCommit:
        return commit_for(tx)

    async with SQLiteDurability(tmp_path / "k.db", trace=trace, lock_timeout=0.05) as store:
        holder = asyncio.create_task(store.with_turn(TurnScope("a", "0"), holding))
        await held.wait()
        with pytest.raises(ThreadBusyError):
            await store.with_turn(TurnScope("a", "1"), quick, wait=False)
        with pytest.raises(ThreadLockTimeoutError):
            await store.with_turn(TurnScope("a", "2"), quick)
        done.set()
        await holder
        hopped.clear()
        await store.with_turn(TurnScope("b", "1"), quick)
    assert hopped and set(hopped) == {False}


async def test_reads_use_the_writers_connection_only_while_no_write_can_be_on_the_worker(
    tmp_path: Path,
) -> None:
    """A turn's start reads on the writer's connection while writes run inline. That
    connection's page cache is current. While a write hop is inside its transaction on
    the worker thread, a read goes to the read-only connection. It sees only what is
    committed."""
    from intention_kernel.testing import faults

    on_writer: list[str] = []
    on_reader: list[str] = []

    def trace(connection: str, sql: str) -> None:
        if connection == "reader":
            on_reader.append(sql)
        elif threading.current_thread() is threading.main_thread():
            on_writer.append(sql)

    held, release = threading.Event(), threading.Event()

    def hold(_: str) -> None:  # the worker thread, inside the commit transaction
        held.set()
        assert release.wait(10)

    async with SQLiteDurability(tmp_path / "k.db", trace=trace) as store:

        async def slow(tx: TurnTransaction) -> TurnCommit:
            await asyncio.sleep(0.02)  # overlap the two turns, so that writes hop
            return commit_for(tx)

        on_writer.clear()
        await store.with_turn(TurnScope("a", "1"), slow)
        assert any("FROM ik_turns" in sql for sql in on_writer)  # the turn start: inline

        with faults.injected(faults.DURING_COMMIT, hold):
            turns = asyncio.gather(
                store.with_turn(TurnScope("a", "2"), slow),
                store.with_turn(TurnScope("b", "1"), slow),
            )
            assert await asyncio.to_thread(held.wait, 10)
            on_writer.clear()
            on_reader.clear()
            seen = await store.load_checkpoint("a")
            in_flight = await store.load_checkpoint("b")
            assert on_writer == []  # both reads ran on the reader connection
            assert sum("FROM ik_threads" in sql for sql in on_reader) == 2
            release.set()
            await turns
        # One commit was held inside its transaction, the other queued behind it on
        # the worker: the reads saw neither.
        assert seen is not None and seen.version == 1
        assert in_flight is None
        after = await store.load_checkpoint("a")
        assert after is not None and after.version == 2


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


async def test_every_path_to_one_database_shares_its_thread_locks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A symlink or a relative path names the same file, so the same lock file: turns on
    one thread through different paths are serialized, none is fenced after running."""
    real = tmp_path / "data" / "kernel.db"
    real.parent.mkdir()
    link = tmp_path / "link.db"
    link.symlink_to(real)
    monkeypatch.chdir(tmp_path)
    relative = Path("data") / ".." / "data" / "kernel.db"
    inside = overlaps = 0

    async def operation(tx: TurnTransaction) -> TurnCommit:
        nonlocal inside, overlaps
        inside += 1
        overlaps += inside > 1
        await asyncio.sleep(0.05)
        inside -= 1
        return commit_for(tx)

    async with (
        SQLiteDurability(real) as a,
        SQLiteDurability(link) as b,
        SQLiteDurability(relative) as c,
    ):
        results = await asyncio.gather(
            *(
                store.with_turn(TurnScope("t", name), operation)
                for store, name in ((a, "a"), (b, "b"), (c, "c"))
            )
        )
    assert overlaps == 0
    assert sorted(r.checkpoint_version for r in results) == [1, 2, 3]
    locks = [f for _, _, files in os.walk(tmp_path) for f in files if f.endswith(".locks")]
    assert locks == ["kernel.db.locks"]


#: Runs one turn and prints the lock file's ``lockf`` calls during it, read by an audit hook.
_LOCKF_OF_A_TURN = """
import asyncio, json, sys
from intention_kernel._turns import TurnScope
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.testing.conformance import commit_for

calls = []

async def operation(tx):
    return commit_for(tx)

async def main():
    async with SQLiteDurability(sys.argv[1]) as store:
        await store.with_turn(TurnScope("t", "1"), operation)
        sys.addaudithook(lambda event, args: event == "fcntl.lockf" and calls.append(args[1:4:2]))
        await store.with_turn(TurnScope("t", "2"), operation)
    print(json.dumps(calls))

asyncio.run(main())
"""


def test_a_turn_lets_go_of_its_delivery_mark_before_its_threads_lock(tmp_path: Path) -> None:
    """A turn holds two bytes of the lock file: the thread's, then its own mark.

    It lets go of the mark first. In the other order a moment opens between the
    two calls. The turn's next delivery, in another process, could take the
    thread's byte then, and find the mark still taken. It would run unmarked, and a
    cancel would dequeue its queued copy. An audit hook in a child process records
    the calls (a hook cannot be removed, so not in this one)."""
    done = subprocess.run(
        [sys.executable, "-c", _LOCKF_OF_A_TURN, str(tmp_path / "k.db")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    calls = [tuple(call) for call in json.loads(done.stdout)]
    taken = [offset for cmd, offset in calls if cmd != fcntl.LOCK_UN]
    released = [offset for cmd, offset in calls if cmd == fcntl.LOCK_UN]
    assert len(taken) == 2, calls  # the thread's byte, then the turn's mark
    assert released == taken[::-1]


async def test_migration_4_gives_existing_receipts_their_threads_owner(tmp_path: Path) -> None:
    path = tmp_path / "k.db"

    def back_to_version_3() -> None:
        with sqlite3.connect(path) as conn:
            undo_migration_8(conn)
            conn.execute("ALTER TABLE ik_receipts DROP COLUMN tenant_id")
            conn.execute("ALTER TABLE ik_turns DROP COLUMN announced")  # migration 5
            conn.execute("DROP TABLE ik_journal")  # migration 6
            conn.execute("ALTER TABLE ik_receipts DROP COLUMN actor")  # migration 7
            conn.execute("DELETE FROM ik_schema WHERE version > 3")

    await migration_4_gives_receipts_their_owner(lambda: SQLiteDurability(path), back_to_version_3)


async def test_receipts_stored_before_migration_7_read_as_approved_by_no_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k.db"

    def back_to_version_6() -> None:
        with sqlite3.connect(path) as conn:
            undo_migration_8(conn)
            conn.execute("ALTER TABLE ik_receipts DROP COLUMN actor")
            conn.execute("DELETE FROM ik_schema WHERE version > 6")

    await receipts_before_actors_read_as_no_actor(lambda: SQLiteDurability(path), back_to_version_6)


async def test_receipts_stored_before_migration_9_read_with_no_origin(tmp_path: Path) -> None:
    path = tmp_path / "k.db"

    def back_to_version_8() -> None:
        with sqlite3.connect(path) as conn:
            undo_migration_9(conn)

    await receipts_before_origins_read_with_none(lambda: SQLiteDurability(path), back_to_version_8)


async def test_migration_11_gives_existing_journal_entries_their_threads_owner(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k.db"

    def back_to_version_10() -> None:
        with sqlite3.connect(path) as conn:
            undo_migration_11(conn)

    await journal_before_tenants_gets_its_threads_owner(
        lambda: SQLiteDurability(path), back_to_version_10
    )


async def test_stop_requests_stored_before_migration_15_stop_any_tenants_turn(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k.db"

    def back_to_version_14() -> None:
        with sqlite3.connect(path) as conn:
            undo_migration_15(conn)

    def old_cancel(thread_id: str, turn_id: str, reason: str) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute(
                "INSERT INTO ik_cancels VALUES (?, ?, ?, '2026-01-01T00:00:00+00:00')",
                (thread_id, turn_id, reason),
            )

    await cancels_before_scopes_stop_any_tenant(
        lambda: SQLiteDurability(path), back_to_version_14, old_cancel
    )


async def test_inbox_entries_stored_before_migration_16_are_queued_messages(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k.db"

    def back_to_version_15() -> None:
        with sqlite3.connect(path) as conn:
            undo_migration_16(conn)

    await inbox_before_steers_reads_as_queued(lambda: SQLiteDurability(path), back_to_version_15)


async def test_interrupts_stored_before_migration_17_stop_any_turn_on_their_base(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k.db"

    def back_to_version_16() -> None:
        with sqlite3.connect(path) as conn:
            undo_migration_17(conn)

    def old_interrupt(thread_id: str, base_version: int) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute(
                "INSERT INTO ik_interrupts VALUES (?, ?, '2026-01-01T00:00:00+00:00')",
                (thread_id, base_version),
            )

    await interrupts_before_senders_stop_any_turn_on_their_base(
        lambda: SQLiteDurability(path), back_to_version_16, old_interrupt
    )


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0])
@pytest.mark.parametrize("option", ["lock_timeout", "busy_timeout"])
def test_a_wait_that_never_ends_or_is_negative_is_refused(
    option: str, value: float, tmp_path: Path
) -> None:
    """NaN compares false with every deadline, so it would wait forever, as infinity does."""
    options: dict[str, Any] = {option: value}
    with pytest.raises(ValueError, match=option):
        SQLiteDurability(tmp_path / "k.db", **options)
    assert list(tmp_path.iterdir()) == []


async def _first_turns(path: Path, threads: int = 3) -> None:
    async def first(tx: TurnTransaction) -> TurnCommit:
        return commit_for(tx)

    async with SQLiteDurability(path) as store:
        for n in range(threads):
            await store.with_turn(TurnScope(f"t{n}", "1"), first)


async def test_a_damaged_page_is_a_corrupt_store_not_a_transient_store_error(
    tmp_path: Path,
) -> None:
    """Retrying reads the same garbage: the error says the store is damaged, which the
    host answers with 500, not 503 "retry"."""
    path = tmp_path / "k.db"
    await _first_turns(path)
    damage_sqlite_table(path, "ik_threads")
    async with SQLiteDurability(path) as store:
        with pytest.raises(CorruptStoreError, match="is damaged") as caught:
            await store.load_checkpoint("t1")
        assert not isinstance(caught.value, StoreError)
        assert caught.value.thread_id == "t1"
        with pytest.raises(CorruptStoreError, match="is damaged") as caught:
            await store.with_turn(TurnScope("t1", "2"), plain)
        assert caught.value.thread_id == "t1"


@pytest.mark.parametrize("damage", ["truncated", "not a database"])
async def test_a_truncated_or_foreign_file_is_refused_as_a_corrupt_store(
    damage: str, tmp_path: Path
) -> None:
    path = tmp_path / "k.db"
    await _first_turns(path, threads=40)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    if damage == "truncated":
        os.truncate(path, path.stat().st_size // 2)
    else:
        path.write_bytes(b"these are not the bytes of a database\n" * 200)

    async def read_every_thread() -> None:
        async with SQLiteDurability(path) as store:
            for n in range(40):
                await store.load_checkpoint(f"t{n}")

    with pytest.raises(CorruptStoreError, match="is damaged"):
        await read_every_thread()


async def test_text_that_is_not_utf8_is_a_corrupt_record_of_its_thread(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    await _first_turns(path)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE ik_threads SET checkpoint = CAST(X'7bff22' AS TEXT) WHERE thread_id = 't1'"
        )
    async with SQLiteDurability(path) as store:
        with pytest.raises(CorruptRecordError, match="not UTF-8") as caught:
            await store.with_turn(TurnScope("t1", "2"), plain)
        assert caught.value.thread_id == "t1"
        with pytest.raises(CorruptRecordError, match="not UTF-8") as read:
            await store.load_checkpoint("t1")
        assert read.value.thread_id == "t1"
        assert (await store.with_turn(TurnScope("t2", "2"), plain)).checkpoint_version == 2


async def plain(tx: TurnTransaction) -> TurnCommit:
    return commit_for(tx)


async def test_a_commit_is_fenced_on_the_owner_the_turn_started_with(tmp_path: Path) -> None:
    """The thread lock keeps other turns out, not another program writing the file: a
    turn whose thread changed owner while it ran is refused at commit, as PostgreSQL's
    is, and writes nothing."""
    path = tmp_path / "k.db"

    async def hand_over(tx: TurnTransaction) -> TurnCommit:
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE ik_threads SET tenant_id = 'b' WHERE thread_id = 't'")
        return commit_for(tx)

    async with SQLiteDurability(path) as store:
        await store.with_turn(TurnScope("t", "1", tenant_id="a"), plain)
        with pytest.raises(FencedCommitError, match="was not committed") as caught:
            await store.with_turn(TurnScope("t", "2", tenant_id="a"), hand_over)
        assert (caught.value.thread_id, caught.value.turn_id) == ("t", "2")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT tenant_id, version FROM ik_threads").fetchall() == [("b", 1)]
        assert conn.execute("SELECT turn_id FROM ik_turns").fetchall() == [("1",)]
