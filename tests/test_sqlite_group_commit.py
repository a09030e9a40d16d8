"""Group commit on SQLite: overlapping turns share transactions, and still no write is
acknowledged before it is on disk, and a failing write fails alone."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from intention_kernel._effects import utcnow
from intention_kernel._turns import EventDraft, TurnCommit, TurnResult, TurnScope
from intention_kernel.durability import Durability, TurnTransaction
from intention_kernel.durability.abc import OutboxBacklog, TurnRecord
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.errors import FencedCommitError, KernelError, StoreError
from intention_kernel.testing.conformance import commit_for
from intention_kernel.testing.sqlite import (
    GroupPoint,
    WriterProbe,
    grouping_durability,
)
from sqlite_owner import watch_connections
from test_sqlite import SQLiteConformance


class TestSQLiteDurabilityWithGroupCommit(SQLiteConformance):
    """Every write runs as a member of a group (a savepoint in the writer's transaction)."""

    @staticmethod
    def adapter(path: Path, **options: Any) -> Durability:
        return grouping_durability(path, **options)


# -- helpers ---------------------------------------------------------------------------------


async def _slow(tx: TurnTransaction) -> TurnCommit:
    await asyncio.sleep(0.01)  # a model call: the other turns run meanwhile
    return commit_for(tx)


def _turns(path: Path) -> set[tuple[str, str]]:
    """The committed turns, as another connection sees them."""
    with sqlite3.connect(path) as conn:
        return {(r[0], r[1]) for r in conn.execute("SELECT thread_id, turn_id FROM ik_turns")}


# -- acknowledged only after COMMIT ----------------------------------------------------------


async def test_a_group_is_acknowledged_only_after_its_commit(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    held, release = threading.Event(), threading.Event()
    sizes: list[int] = []

    def hold(point: GroupPoint, size: int) -> None:  # on the worker thread
        if point == "before_commit":
            sizes.append(size)
            held.set()
            assert release.wait(10)

    threads = [f"t{i}" for i in range(8)]
    probe = WriterProbe()
    async with SQLiteDurability(path, seam=probe) as store:
        gate = await probe.hold()
        turns = [asyncio.ensure_future(store.with_turn(TurnScope(t, "1"), _slow)) for t in threads]
        await gate.wait_for_queued(len(threads))
        with probe.group_points(hold):
            await gate.release()
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
    probe = WriterProbe()
    async with SQLiteDurability(tmp_path / "k.db", seam=probe) as store:
        await asyncio.gather(*(store.with_turn(TurnScope(f"t{i}", "1"), _slow) for i in range(32)))
        writes = probe.groups
        grouped = probe.grouped
    assert grouped > 0
    assert writes < 32
    assert len(_turns(tmp_path / "k.db")) == 32


# -- a failing write fails alone -------------------------------------------------------------


async def test_a_fenced_turn_in_a_group_rolls_back_alone(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    probe = WriterProbe()
    async with SQLiteDurability(path, seam=probe) as store:
        for t in ("a", "b", "c"):
            await store.with_turn(TurnScope(t, "1"), _slow)
        gate = await probe.hold()
        turns = {t: asyncio.ensure_future(store.with_turn(TurnScope(t, "2"), _slow)) for t in "abc"}
        await gate.wait_for_queued(3)
        # Another writer moves thread b while its commit waits in the group.
        with sqlite3.connect(path) as other:
            other.execute("UPDATE ik_threads SET version = version + 1 WHERE thread_id = 'b'")
        await gate.release()
        await turns["a"]
        await turns["c"]
        with pytest.raises(FencedCommitError, match="version moved"):
            await turns["b"]
        assert probe.grouped >= 3
    assert _turns(path) == {("a", "1"), ("b", "1"), ("c", "1"), ("a", "2"), ("c", "2")}


async def test_a_duplicate_delivery_inside_one_group_commits_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two commits of one turn in one group (the thread lock bypassed, as two processes
    with a deleted lock file would): the turn-ID key fences the second, alone."""
    path = tmp_path / "k.db"
    outcomes: list[Any] = []
    probe = WriterProbe()
    async with SQLiteDurability(path, seam=probe) as store:
        recorder = await store.recorder()
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

        gate = await probe.hold()
        monkeypatch.setattr(recorder, "commit_turn", twice)
        other = asyncio.ensure_future(store.with_turn(TurnScope("b", "1"), _slow))
        turn = asyncio.ensure_future(store.with_turn(TurnScope("a", "1"), _slow))
        await gate.wait_for_queued(3)
        await gate.release()
        await asyncio.gather(turn, other)
        assert probe.grouped >= 3
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
    probe = WriterProbe()
    async with SQLiteDurability(path, seam=probe) as store:
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
        await probe.call(lambda conn: conn.execute("PRAGMA foreign_keys = ON"))
        gate = await probe.hold()
        threads = ["a", "poison", "c", "d"]
        turns = [asyncio.ensure_future(store.with_turn(TurnScope(t, "1"), _slow)) for t in threads]
        await gate.wait_for_queued(len(threads))
        await gate.release()
        results = await asyncio.gather(*turns, return_exceptions=True)
        assert all(isinstance(r, StoreError) for r in results), results
        assert all("FOREIGN KEY" in str(r) for r in results)
        assert _turns(path) == set()
        await store.with_turn(TurnScope("a", "1"), _slow)  # the retry
    assert _turns(path) == {("a", "1")}


async def test_a_transaction_lost_under_a_write_fails_every_write_it_held(tmp_path: Path) -> None:
    """A full disk (a tiny ``max_page_count``) makes SQLite roll the whole transaction
    back under one write. The writes before it in the group lost their rows too. So
    they fail as well. The writes after it run in a new transaction."""
    path = tmp_path / "k.db"

    async def big(tx: TurnTransaction) -> TurnCommit:
        await asyncio.sleep(0.01)
        return commit_for(tx, [EventDraft("big", "x" * 3000)])  # a page of its own

    probe = WriterProbe()
    async with SQLiteDurability(path, seam=probe) as store:

        def nearly_full(conn: sqlite3.Connection) -> None:  # room for about three such turns
            (pages,) = conn.execute("PRAGMA page_count").fetchone()
            conn.execute(f"PRAGMA max_page_count = {pages + 3}")

        await probe.call(nearly_full)
        gate = await probe.hold()
        threads = [f"t{i}" for i in range(6)]
        turns = [asyncio.ensure_future(store.with_turn(TurnScope(t, "1"), big)) for t in threads]
        await gate.wait_for_queued(len(threads))
        await gate.release()
        results = await asyncio.gather(*turns, return_exceptions=True)
        failed = [t for t, r in zip(threads, results, strict=True) if isinstance(r, StoreError)]
        acknowledged = {(t, "1") for t in threads if t not in failed}
        assert all(
            isinstance(r, StoreError) or (isinstance(r, TurnResult) and r.reply == "ok")
            for r in results
        ), results
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
    event loop to free. Freed there, an ``executemany`` cursor resets its statement.
    The worker may be running the same statement for the next mark meanwhile. SQLite
    then answers ``bad parameter or other API misuse``. A relay then publishes the
    batch again: the soak's duplicates. Which thread frees the cursor last is a race that
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
    live statement. A cursor it returns is closed. The frames of an error it raises
    are cleared on the worker; they may hold a partly read cursor in a local, say."""
    problems = watch_connections(monkeypatch)
    probe = WriterProbe(group_alone=True)
    async with grouping_durability(tmp_path / "k.db", probe=probe):
        cursor = await probe.write(
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
            await probe.write(partly_read)
        del failed
    assert problems == []


async def test_with_offload_writes_false_no_write_runs_inline_beside_a_busy_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``offload_writes=False`` hands a write the database keeps busy to the worker.
    The worker waits for the lock. Until it is done, the other turns' reads and writes
    stay off the writer's connection. They hop too, or read on the reader. They do not
    run statements on it from the event loop while the worker is inside one."""
    problems = watch_connections(monkeypatch)
    path = tmp_path / "k.db"
    probe = WriterProbe()
    async with SQLiteDurability(path, offload_writes=False, seam=probe) as store:
        await store.with_turn(TurnScope("a", "1"), _slow)
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process's write lock
            first = asyncio.ensure_future(store.with_turn(TurnScope("a", "2"), _slow))
            for _ in range(400):  # until its commit waits on the worker for the lock
                if not probe.idle:
                    break
                await asyncio.sleep(0.005)
            assert not probe.idle
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
    probe = WriterProbe()
    async with SQLiteDurability(path, seam=probe) as store:
        await store.with_turn(TurnScope("a", "1"), _slow)
        conn = probe.connection()  # idle: the event loop may use it
        conn.execute("CREATE TABLE scratch (x)")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO scratch VALUES (1)")
        recorder = await store.recorder()
        started = await recorder.begin_turn("a", "2", None)  # inline, on this connection
        assert started.thread is not None and started.thread.version == 1
        assert conn.in_transaction
        conn.commit()
    with sqlite3.connect(path) as check:
        assert check.execute("SELECT x FROM scratch").fetchall() == [(1,)]


async def test_a_write_that_breaks_its_savepoint_fails_its_group_and_the_worker_goes_on(
    tmp_path: Path,
) -> None:
    """A write whose savepoint is gone when it fails makes ``ROLLBACK TO`` fail. A body
    may have released it, against the rules. Then the whole group is rolled back and
    fails, and nothing of it is on disk. The worker thread runs the next writes. Without
    that, the error would end the worker thread, and every write after it would wait
    for ever. Savepoints come only in a group's careful run, after an atomic write
    failed: the breaking body runs there the second time, before the failed one."""
    path = tmp_path / "k.db"
    with sqlite3.connect(path) as setup:
        setup.execute("CREATE TABLE scratch (x)")
    probe = WriterProbe(group_alone=True)
    async with grouping_durability(path, probe=probe):
        runs = 0

        def breaks(conn: sqlite3.Connection) -> None:
            nonlocal runs
            runs += 1
            conn.execute("INSERT INTO scratch VALUES ('broken')")
            if runs == 2:  # the careful run, inside its savepoint
                conn.execute("RELEASE ik_write")
                raise LookupError("a body that broke the rules")

        def fails(conn: sqlite3.Connection) -> None:
            raise KeyError("an atomic write that fails")

        def insert(value: str) -> Callable[[sqlite3.Connection], None]:
            def run(conn: sqlite3.Connection) -> None:
                conn.execute("INSERT INTO scratch VALUES (?)", (value,))

            return run

        gate = await probe.hold()
        writes = [
            asyncio.ensure_future(probe.write(insert("before"))),
            asyncio.ensure_future(probe.write(breaks, atomic=True)),
            asyncio.ensure_future(probe.write(fails, atomic=True)),
            asyncio.ensure_future(probe.write(insert("after"))),
        ]
        await gate.wait_for_queued(len(writes))
        await gate.release()
        done = await asyncio.wait_for(asyncio.gather(*writes, return_exceptions=True), 10)
        assert isinstance(done[2], KeyError), done
        rest = [*done[:2], done[3]]
        assert all(isinstance(r, StoreError) for r in rest), done
        assert all("no such savepoint" in str(r) for r in rest)
        assert runs == 2
        await asyncio.wait_for(probe.write(insert("next")), 10)  # the worker goes on
    with sqlite3.connect(path) as check:
        assert check.execute("SELECT x FROM scratch").fetchall() == [("next",)]


# -- the seam (intention_kernel.testing.sqlite) -----------------------------------------------


async def test_a_grouping_durability_runs_even_a_lone_write_in_the_writers_transaction(
    tmp_path: Path,
) -> None:
    """What the conformance class above relies on: with the switch, a lone write that is
    not atomic runs inside a transaction the writer opens; without it, it autocommits."""
    seen: dict[str, list[str]] = {"grouping": [], "plain": []}

    def traced(name: str) -> Callable[[str, str], None]:
        def trace(role: str, sql: str) -> None:
            if role == "writer" and not sql.startswith("PRAGMA"):
                seen[name].append(sql)

        return trace

    def insert(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO scratch VALUES (1)")

    for name in seen:
        with sqlite3.connect(tmp_path / f"{name}.db") as setup:
            setup.execute("CREATE TABLE scratch (x)")
    probe = WriterProbe(group_alone=True)
    async with grouping_durability(tmp_path / "grouping.db", trace=traced("grouping"), probe=probe):
        seen["grouping"].clear()
        await probe.write(insert)
    plain = WriterProbe()
    async with SQLiteDurability(
        tmp_path / "plain.db", offload_writes=True, trace=traced("plain"), seam=plain
    ):
        seen["plain"].clear()
        await plain.write(insert)
    assert seen["grouping"] == ["BEGIN IMMEDIATE", "INSERT INTO scratch VALUES (1)", "COMMIT"]
    assert seen["plain"] == ["INSERT INTO scratch VALUES (1)"]


async def test_the_probe_hands_out_the_writers_connection_only_while_the_writer_is_idle(
    tmp_path: Path,
) -> None:
    probe = WriterProbe()
    async with SQLiteDurability(tmp_path / "k.db", seam=probe):
        assert probe.idle and probe.queued == 0
        gate = await probe.hold()
        assert not probe.idle and probe.queued == 1
        with pytest.raises(KernelError, match="busy"):
            probe.connection()
        await gate.release()
        assert probe.idle
        assert probe.connection().execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(KernelError, match="closed"):
        probe.groups  # noqa: B018 - the property is the call under test


async def test_a_gate_that_let_go_by_itself_says_so(tmp_path: Path) -> None:
    """A gate that timed out no longer held the writes queued behind it: a test that
    meant them to form one group must not pass on it."""
    probe = WriterProbe()
    async with SQLiteDurability(tmp_path / "k.db", seam=probe):
        gate = await probe.hold(let_go_after=0.01)
        await probe.call(lambda conn: None)  # runs after the gate let go
        with pytest.raises(AssertionError, match="timed out"):
            await gate.release()


async def test_group_points_run_only_inside_their_block(tmp_path: Path) -> None:
    reached: list[tuple[str, int]] = []
    inner: list[str] = []

    async def group_of_two(store: SQLiteDurability, turn: str) -> None:
        gate = await probe.hold()
        turns = [store.with_turn(TurnScope(t, turn), _slow) for t in "ab"]
        running = [asyncio.ensure_future(t) for t in turns]
        await gate.wait_for_queued(2)
        await gate.release()
        await asyncio.gather(*running)

    probe = WriterProbe()
    async with SQLiteDurability(tmp_path / "k.db", seam=probe) as store:
        with probe.group_points(lambda point, size: reached.append((point, size))):
            await group_of_two(store, "1")
            with probe.group_points(lambda point, size: inner.append(point)):
                await group_of_two(store, "2")
            assert reached == [("before_commit", 2), ("after_commit", 2)]
            await group_of_two(store, "3")  # the outer action is armed again
        await group_of_two(store, "4")  # and none after the block
    assert inner == ["before_commit", "after_commit"]
    assert reached == [("before_commit", 2), ("after_commit", 2)] * 2


async def test_group_points_run_only_for_their_own_adapter(tmp_path: Path) -> None:
    """A probe's points are its adapter's: another adapter of the process never runs them."""
    reached: list[str] = []
    probe, other = WriterProbe(points=lambda point, size: reached.append(point)), WriterProbe()
    async with (
        SQLiteDurability(tmp_path / "a.db", seam=probe) as mine,
        SQLiteDurability(tmp_path / "b.db", seam=other) as theirs,
    ):
        for store, seam, turn in ((theirs, other, "1"), (mine, probe, "2")):
            gate = await seam.hold()
            running = [
                asyncio.ensure_future(store.with_turn(TurnScope(t, turn), _slow)) for t in "ab"
            ]
            await gate.wait_for_queued(2)
            await gate.release()
            await asyncio.gather(*running)
            if store is theirs:
                assert other.grouped == 2
                assert reached == []  # the other adapter's group ran no point of this probe
    assert reached == ["before_commit", "after_commit"]


async def test_a_probe_refuses_calls_while_its_adapter_is_not_open(tmp_path: Path) -> None:
    """Before the adapter opens and after it closes, a call says so; reopened, the counts
    are the new writer thread's."""
    probe = WriterProbe()
    store = SQLiteDurability(tmp_path / "k.db", offload_writes=True, seam=probe)
    with pytest.raises(KernelError, match="closed"):
        _ = probe.groups
    async with store:
        await store.with_turn(TurnScope("a", "1"), _slow)
        assert probe.groups >= 1
        assert probe.idle
    with pytest.raises(KernelError, match="closed"):
        await probe.call(lambda conn: None)
    async with store:
        assert probe.groups == 0  # a new writer thread
        await probe.call(lambda conn: None)


def test_grouping_durability_refuses_a_probe_that_does_not_group_alone(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="group_alone=True"):
        grouping_durability(tmp_path / "k.db", probe=WriterProbe())
