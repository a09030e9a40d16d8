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
from intention_kernel.durability.abc import TurnRecord
from intention_kernel.durability.sqlite import SQLiteDurability, _group
from intention_kernel.errors import FencedCommitError, StoreError
from intention_kernel.testing.conformance import (
    DurabilityConformance,
    Inspector,
    Tamper,
    commit_for,
)
from intention_kernel.turns import EventDraft, TurnCommit, TurnScope
from proving_support import Store, StoreInspector
from test_sqlite import _SQLiteTamper


def _grouping(path: Path, **options: Any) -> SQLiteDurability:
    """An adapter whose every write on the worker thread runs the group way: in a
    transaction the writer opens, within a savepoint, acknowledged after ``COMMIT``."""
    store = SQLiteDurability(path, offload_writes=True, **options)
    store._recorder.group_alone = True  # type: ignore[attr-defined]
    return store


class TestSQLiteDurabilityWithGroupCommit(DurabilityConformance):
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
            if self._recorder._hops >= count:
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"{self._recorder._hops} writes queued, not {count}")

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
