"""Group commit on SQLite: overlapping turns share transactions, and still no write is
acknowledged before it is on disk, and a failing write fails alone."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from intention_kernel.durability import Durability, TurnTransaction
from intention_kernel.durability.abc import OutboxBacklog, TurnRecord
from intention_kernel.durability.sqlite import SQLiteDurability, _group
from intention_kernel.effects import utcnow
from intention_kernel.errors import FencedCommitError, StoreError
from intention_kernel.testing.conformance import (
    DurabilityConformance,
    Inspector,
    Tamper,
    commit_for,
)
from intention_kernel.turns import EventDraft, TurnCommit, TurnScope
from proving_support import Store, StoreInspector
from sqlite_owner import watch_connections
from test_sqlite import OneUserAtATime, _SQLiteTamper


def _grouping(path: Path, **options: Any) -> SQLiteDurability:
    """An adapter whose every write on the worker thread runs the group way: in a
    transaction the writer opens, within a savepoint, acknowledged after ``COMMIT``."""
    store = SQLiteDurability(path, offload_writes=True, **options)
    store._recorder.group_alone = True  # type: ignore[attr-defined]
    return store


class TestSQLiteDurabilityWithGroupCommit(OneUserAtATime, DurabilityConformance):
    """Every write runs as a member of a group (a savepoint in the writer's transaction)."""

    @pytest.fixture
    def make_durability(self, tmp_path: Path) -> Callable[[], Durability]:
        return lambda: _grouping(tmp_path / "kernel.db")

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
        return lambda seconds: _grouping(tmp_path / "kernel.db", lock_timeout=seconds)


# -- helpers ---------------------------------------------------------------------------------


class _Gate:
    """Blocks the adapter's worker thread until opened, so that the writes queued
    meanwhile form one group."""

    def __init__(self, store: SQLiteDurability) -> None:
        self._recorder: Any = store._recorder
        self._open = threading.Event()
        self.future = self._recorder._worker.submit(lambda: self._open.wait(10))

    async def wait_for_writes(self, count: int) -> None:
        """Until ``count`` writes wait behind the gate (each a hop in flight)."""
        for _ in range(1000):
            if self._recorder._worker._pending > count:  # the gate is one more
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"{self._recorder._worker._pending - 1} writes queued, not {count}")

    async def open(self) -> None:
        self._open.set()
        assert await self.future


@pytest.fixture
def group_fault() -> Iterator[Callable[[Callable[[str, int], None]], None]]:
    def arm(action: Callable[[str, int], None]) -> None:
        _group.group_fault = action

    yield arm
    _group.group_fault = None


async def _slow(tx: TurnTransaction) -> TurnCommit:
    await asyncio.sleep(0.01)  # a model call: the other turns run meanwhile
    return commit_for(tx)


def _turns(path: Path) -> set[tuple[str, str]]:
    """The committed turns, as another connection sees them."""
    with sqlite3.connect(path) as conn:
        return {(r[0], r[1]) for r in conn.execute("SELECT thread_id, turn_id FROM ik_turns")}


# -- acknowledged only after COMMIT ----------------------------------------------------------


async def test_a_group_is_acknowledged_only_after_its_commit(
    tmp_path: Path, group_fault: Callable[[Callable[[str, int], None]], None]
) -> None:
    path = tmp_path / "k.db"
    held, release = threading.Event(), threading.Event()
    sizes: list[int] = []

    def hold(point: str, size: int) -> None:  # on the worker thread
        if point == "before_commit":
            sizes.append(size)
            held.set()
            assert release.wait(10)

    threads = [f"t{i}" for i in range(8)]
    async with SQLiteDurability(path) as store:
        gate = _Gate(store)
        turns = [asyncio.ensure_future(store.with_turn(TurnScope(t, "1"), _slow)) for t in threads]
        await gate.wait_for_writes(len(threads))
        group_fault(hold)
        await gate.open()
        assert await asyncio.to_thread(held.wait, 10)
        # Every statement of the group ran; COMMIT did not: no turn is acknowledged,
        # and another connection sees none of them.
        await asyncio.sleep(0.05)
        assert not any(t.done() for t in turns)
        assert _turns(path) == set()
        release.set()
        await asyncio.gather(*turns)
        assert _turns(path) == {(t, "1") for t in threads}
    assert sizes[0] == len(threads)  # one transaction for the eight commits


async def test_overlapping_turns_share_commits(tmp_path: Path) -> None:
    """Without any gate, turns that overlap share transactions: fewer groups than writes."""
    async with SQLiteDurability(tmp_path / "k.db") as store:
        recorder: Any = store._recorder
        await asyncio.gather(*(store.with_turn(TurnScope(f"t{i}", "1"), _slow) for i in range(32)))
        writes = recorder._worker.groups
        grouped = recorder._worker.grouped
    assert grouped > 0
    assert writes < 32
    assert len(_turns(tmp_path / "k.db")) == 32


# -- a failing write fails alone -------------------------------------------------------------


async def test_a_fenced_turn_in_a_group_rolls_back_alone(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    async with SQLiteDurability(path) as store:
        for t in ("a", "b", "c"):
            await store.with_turn(TurnScope(t, "1"), _slow)
        gate = _Gate(store)
        turns = {t: asyncio.ensure_future(store.with_turn(TurnScope(t, "2"), _slow)) for t in "abc"}
        await gate.wait_for_writes(3)
        # Another writer moves thread b while its commit waits in the group.
        with sqlite3.connect(path) as other:
            other.execute("UPDATE ik_threads SET version = version + 1 WHERE thread_id = 'b'")
        await gate.open()
        await turns["a"]
        await turns["c"]
        with pytest.raises(FencedCommitError, match="version moved"):
            await turns["b"]
        recorder: Any = store._recorder
        assert recorder._worker.grouped >= 3
    assert _turns(path) == {("a", "1"), ("b", "1"), ("c", "1"), ("a", "2"), ("c", "2")}


async def test_a_duplicate_delivery_inside_one_group_commits_once(tmp_path: Path) -> None:
    """Two commits of one turn in one group (the thread lock bypassed, as two processes
    with a deleted lock file would): the turn-ID key fences the second, alone."""
    path = tmp_path / "k.db"
    outcomes: list[Any] = []
    async with SQLiteDurability(path) as store:
        recorder: Any = store._recorder
        original = recorder.commit_turn

        async def twice(record: TurnRecord) -> None:
            if record.thread_id != "a":
                await original(record)
                return
            outcomes.extend(
                await asyncio.gather(original(record), original(record), return_exceptions=True)
            )
            if outcomes[-1] is not None and outcomes[-2] is not None:
                raise outcomes[-1]

        gate = _Gate(store)
        recorder.commit_turn = twice
        other = asyncio.ensure_future(store.with_turn(TurnScope("b", "1"), _slow))
        turn = asyncio.ensure_future(store.with_turn(TurnScope("a", "1"), _slow))
        await gate.wait_for_writes(3)
        await gate.open()
        await asyncio.gather(turn, other)
        assert recorder._worker.grouped >= 3
    assert len(outcomes) == 2
    assert [type(o) for o in outcomes if o is not None] == [FencedCommitError]
    assert "committed by another worker" in str(next(o for o in outcomes if o is not None))
    assert _turns(path) == {("a", "1"), ("b", "1")}
    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("SELECT version FROM ik_threads WHERE thread_id = 'a'").fetchone()
    assert version == 1


async def test_a_failed_commit_fails_the_whole_group(tmp_path: Path) -> None:
    """A constraint checked only at ``COMMIT`` (a deferred foreign key) fails the
    transaction after every statement succeeded: no write of the group is
    acknowledged, none is on disk, and the next group commits normally."""
    path = tmp_path / "k.db"
    async with SQLiteDurability(path) as store:
        with sqlite3.connect(path) as conn:
            conn.executescript(
                """
                CREATE TABLE trap_parent (id INTEGER PRIMARY KEY);
                CREATE TABLE trap (
                    parent INTEGER REFERENCES trap_parent (id) DEFERRABLE INITIALLY DEFERRED
                );
                CREATE TRIGGER poison AFTER INSERT ON ik_turns WHEN NEW.thread_id = 'poison'
                BEGIN INSERT INTO trap VALUES (1); END;
                """
            )
        recorder: Any = store._recorder
        await recorder._worker.submit(lambda: recorder._conn.execute("PRAGMA foreign_keys = ON"))
        gate = _Gate(store)
        threads = ["a", "poison", "c", "d"]
        turns = [asyncio.ensure_future(store.with_turn(TurnScope(t, "1"), _slow)) for t in threads]
        await gate.wait_for_writes(len(threads))
        await gate.open()
        results = await asyncio.gather(*turns, return_exceptions=True)
        assert all(isinstance(r, StoreError) for r in results), results
        assert all("FOREIGN KEY" in str(r) for r in results)
        assert _turns(path) == set()
        await store.with_turn(TurnScope("a", "1"), _slow)  # the retry
    assert _turns(path) == {("a", "1")}


async def test_a_transaction_lost_under_a_write_fails_every_write_it_held(
    tmp_path: Path, group_fault: Callable[[Callable[[str, int], None]], None]
) -> None:
    """A full disk (a tiny ``max_page_count``) makes SQLite roll the whole transaction
    back under one write: the writes before it in the group lost their rows too, so
    they fail as well; the writes after it run in a new transaction."""
    path = tmp_path / "k.db"

    async def big(tx: TurnTransaction) -> TurnCommit:
        await asyncio.sleep(0.01)
        return commit_for(tx, [EventDraft("big", "x" * 3000)])  # a page of its own

    async with SQLiteDurability(path) as store:
        recorder: Any = store._recorder

        def nearly_full() -> None:  # room for about three such turns
            (pages,) = recorder._conn.execute("PRAGMA page_count").fetchone()
            recorder._conn.execute(f"PRAGMA max_page_count = {pages + 3}")

        await recorder._worker.submit(nearly_full)
        gate = _Gate(store)
        threads = [f"t{i}" for i in range(6)]
        turns = [asyncio.ensure_future(store.with_turn(TurnScope(t, "1"), big)) for t in threads]
        await gate.wait_for_writes(len(threads))
        await gate.open()
        results = await asyncio.gather(*turns, return_exceptions=True)
        failed = [t for t, r in zip(threads, results, strict=True) if isinstance(r, StoreError)]
        acknowledged = {(t, "1") for t in threads if t not in failed}
        assert all(isinstance(r, StoreError) or r.reply == "ok" for r in results), results
        assert any("full" in str(r) for r in results)
        # The writes that ran before the full one in its group failed with it (their
        # rows were gone), not only the one that hit the limit.
        assert len(failed) >= 2, results
        # Whatever was acknowledged is on disk, and nothing else is.
        assert _turns(path) == acknowledged


# -- one user of the writer's connection at a time -------------------------------------------


async def _with_events(tx: TurnTransaction) -> TurnCommit:
    await asyncio.sleep(0.01)
    return commit_for(tx, [EventDraft("e", {"n": n}) for n in range(20)])


async def test_outbox_marks_on_the_worker_hand_no_cursor_to_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay's marks, on the worker thread and in groups, leave no cursor for the
    event loop to free: freed there, an ``executemany`` cursor resets its statement
    while the worker may be running the same statement for the next mark, and SQLite
    answers ``bad parameter or other API misuse`` (a relay then publishes the batch
    again: the soak's duplicates). Which thread frees the cursor last is a race that
    a loaded machine loses; the next test holds what a write returns, to be sure."""
    problems = watch_connections(monkeypatch)
    path = tmp_path / "k.db"
    threads = [f"t{i}" for i in range(4)]
    async with SQLiteDurability(path, offload_writes=True) as store:
        for t in threads:
            await store.with_turn(TurnScope(t, "1"), _with_events)
        recorder = await store.recorder()
        for first in range(1, 21, 2):
            await asyncio.gather(
                *(recorder.mark_published(t, [first, first + 1], utcnow()) for t in threads)
            )
        assert await recorder.outbox_backlog(10) == OutboxBacklog(0, None, [])
    assert problems == []


async def test_what_a_write_hands_back_holds_no_statement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a body on the worker returns or raises reaches the event loop without a
    live statement: a cursor it returns is closed, and the frames of an error it
    raises (a partly read cursor in a local, say) are cleared on the worker."""
    problems = watch_connections(monkeypatch)
    async with _grouping(tmp_path / "k.db") as store:
        recorder: Any = store._recorder
        cursor = await recorder._run(
            lambda conn: conn.executemany("UPDATE ik_threads SET version = ?", [(1,), (2,)]),
            atomic=True,
        )
        with pytest.raises(sqlite3.ProgrammingError, match="closed cursor"):
            cursor.fetchall()
        del cursor

        def partly_read(conn: sqlite3.Connection) -> None:
            rows = conn.execute("SELECT value FROM json_each('[1, 2, 3]')")
            assert rows.fetchone() == (1,)  # the statement is still running
            raise LookupError("after a partial read")

        with pytest.raises(LookupError) as failed:
            await recorder._run(partly_read)
        del failed
    assert problems == []


async def test_with_offload_writes_false_no_write_runs_inline_beside_a_busy_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``offload_writes=False`` hands a write the database keeps busy to the worker,
    which waits for the lock; until it is done, the other turns' reads and writes stay
    off the writer's connection (they hop too, or read on the reader), instead of
    running statements on it from the event loop while the worker is inside one."""
    problems = watch_connections(monkeypatch)
    path = tmp_path / "k.db"
    async with SQLiteDurability(path, offload_writes=False) as store:
        recorder: Any = store._recorder
        await store.with_turn(TurnScope("a", "1"), _slow)
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process's write lock
            first = asyncio.ensure_future(store.with_turn(TurnScope("a", "2"), _slow))
            for _ in range(400):  # until its commit waits on the worker for the lock
                if not recorder._worker.idle:
                    break
                await asyncio.sleep(0.005)
            assert not recorder._worker.idle
            await asyncio.sleep(0.05)
            second = asyncio.ensure_future(store.with_turn(TurnScope("b", "1"), _slow))
            await asyncio.sleep(0.1)
            assert not first.done() and not second.done()
        finally:
            other.rollback()
            other.close()
        await asyncio.gather(first, second)
    assert problems == []
    assert _turns(path) == {("a", "1"), ("a", "2"), ("b", "1")}


async def test_a_read_never_rolls_back_a_transaction_it_did_not_begin(tmp_path: Path) -> None:
    """A read on the writer's connection rolls back only what it began. Were a group's
    transaction open there, a rollback would undo the group's writes without a word:
    its ``COMMIT`` would then fail, or (Python's ``commit()`` with no transaction open
    does nothing) succeed with nothing written, and acknowledged writes would be lost."""
    path = tmp_path / "k.db"
    async with SQLiteDurability(path) as store:
        await store.with_turn(TurnScope("a", "1"), _slow)
        recorder: Any = store._recorder
        conn = recorder._conn  # idle: the event loop may use it
        conn.execute("CREATE TABLE scratch (x)")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO scratch VALUES (1)")
        started = await recorder.begin_turn("a", "2", None)  # inline, on this connection
        assert started.thread is not None and started.thread.version == 1
        assert conn.in_transaction
        conn.commit()
    with sqlite3.connect(path) as check:
        assert check.execute("SELECT x FROM scratch").fetchall() == [(1,)]


async def test_a_write_that_breaks_its_savepoint_fails_its_group_and_the_worker_goes_on(
    tmp_path: Path,
) -> None:
    """A write whose savepoint is gone when it fails (a body that released it, against
    the rules) makes ``ROLLBACK TO`` fail: the whole group is rolled back and fails,
    nothing of it is on disk, and the worker thread runs the next writes. Without
    that, the error would end the worker thread, and every write after it would wait
    for ever."""
    path = tmp_path / "k.db"
    with sqlite3.connect(path) as setup:
        setup.execute("CREATE TABLE scratch (x)")
    async with _grouping(path) as store:
        recorder: Any = store._recorder

        def breaks(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO scratch VALUES ('broken')")
            conn.execute("RELEASE ik_write")
            raise LookupError("a body that broke the rules")

        def insert(value: str) -> Callable[[sqlite3.Connection], None]:
            return lambda conn: conn.execute("INSERT INTO scratch VALUES (?)", (value,)) and None

        gate = _Gate(store)
        writes = [
            asyncio.ensure_future(recorder._run(insert("before"))),
            asyncio.ensure_future(recorder._run(breaks, atomic=True)),
            asyncio.ensure_future(recorder._run(insert("after"))),
        ]
        await gate.wait_for_writes(len(writes))
        await gate.open()
        done = await asyncio.wait_for(asyncio.gather(*writes, return_exceptions=True), 10)
        assert all(isinstance(r, StoreError) for r in done), done
        assert all("no such savepoint" in str(r) for r in done[1:])
        await asyncio.wait_for(recorder._run(insert("next")), 10)  # the worker goes on
    with sqlite3.connect(path) as check:
        assert check.execute("SELECT x FROM scratch").fetchall() == [("next",)]
